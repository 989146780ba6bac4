// Teams through the e2b SDK and raw HTTP: every key belongs to a team, a
// non-admin key sees only its team's sandboxes, snapshots, templates,
// volumes and builds, and another team's answer exactly as ones that do not
// exist; names are per team; an admin publishes templates and sees every
// team; a team's quota of running sandboxes holds across creates, forks,
// resumes and auto-resumes.

import assert from 'node:assert/strict'
import crypto from 'node:crypto'
import { Sandbox, Template, Volume, NotFoundError, SandboxError, SandboxNotFoundError, VolumeNotFoundError, RateLimitError } from 'e2b'
import { useServer, randomTag, rawRequest, rejectsWith, waitFor } from './lib/server.mjs'

const srv = useServer({ tag: 'zqteam', cidr: '10.239.0.0/16', portHint: 18195 })
const RUN = randomTag(6)

// Keys by team, made through POST /keys with the server's (admin) key.
const keys = {}

srv.setup(async () => {
  process.env.E2B_VOLUME_API_URL = srv.url
  for (const team of ['alpha', 'beta']) {
    const res = await srv.api('POST', '/keys', { body: { name: `${team}-key`, team } })
    assert.equal(res.status, 201, res.text)
    assert.equal(res.json.team, team)
    assert.match(res.json.key, /^e2b_[0-9a-f]+$/)
    assert.equal(res.json.admin ?? false, false)
    keys[team] = res.json.key
  }
})

/** Raw API request as key. */
function as(key, method, reqPath, body) {
  return srv.api(method, reqPath, { key, body })
}

/** A random id of the same form as id: letters for letters, digits for digits. */
function randomLike(id) {
  const letters = 'abcdefghijklmnopqrstuvwxyz'
  return id.replace(/[a-z]/g, () => letters[crypto.randomInt(26)]).replace(/[0-9]/g, () => String(crypto.randomInt(10)))
}

/** The 10 hex digits a team's template ids end in. */
function teamTag(team) {
  return crypto.createHash('sha256').update(team).digest('hex').slice(0, 10)
}

/**
 * Asserts that call(...ids) (another team's objects) answers 404 exactly
 * as call(...randomLike ids) does: the same status and the same body but
 * for the ids themselves, so that nothing tells the two apart.
 */
async function assertHidden(what, call, ...ids) {
  const randoms = ids.map(randomLike)
  const want = await call(...randoms)
  const got = await call(...ids)
  assert.equal(want.status, 404, `${what} of nonexistent ${randoms.join(', ')}: ${want.status} ${want.text}`)
  assert.equal(got.status, 404, `${what} of another team's ${ids.join(', ')}: ${got.status} ${got.text}`)
  const norm = (text, list) => list.reduce((t, id, i) => t.replaceAll(id, `<id${i}>`), text)
  assert.equal(norm(got.text, ids), norm(want.text, randoms), `${what}: another team's answers otherwise than a nonexistent one`)
  assert.equal(got.headers['content-type'], want.headers['content-type'], `${what}: content types differ`)
}

/** Every sandbox id a key lists, through both list routes (and the SDK). */
async function listedBy(key, query = '') {
  const v1 = await as(key, 'GET', `/sandboxes${query}`)
  const v2 = await as(key, 'GET', `/v2/sandboxes${query}`)
  assert.equal(v1.status, 200, v1.text)
  assert.equal(v2.status, 200, v2.text)
  return { v1: v1.json.map((s) => s.sandboxID), v2: v2.json.map((s) => s.sandboxID), text: v1.text + v2.text }
}

srv.test("another team's sandbox answers as a nonexistent one on every sandbox route, and is left as it was", async () => {
  const a = await srv.create({ apiKey: keys.alpha, timeoutMs: 120_000 })
  const b = await srv.create({ apiKey: keys.beta, timeoutMs: 120_000 })
  try {
    await a.files.write('/home/user/mine', 'alpha')
    const before = (await as(keys.alpha, 'GET', `/sandboxes/${a.sandboxId}`)).json
    const routes = [
      ['GET', (id) => `/sandboxes/${id}`],
      ['POST', (id) => `/sandboxes/${id}/timeout`, { timeout: 3 }],
      ['POST', (id) => `/sandboxes/${id}/refreshes`, { duration: 3 }],
      ['POST', (id) => `/sandboxes/${id}/connect`, { timeout: 3 }],
      ['POST', (id) => `/v2/sandboxes/${id}/connect`, { timeout: 3 }],
      ['POST', (id) => `/sandboxes/${id}/resume`, { timeout: 3 }],
      ['PUT', (id) => `/sandboxes/${id}/network`, { denyOut: ['0.0.0.0/0'] }],
      ['GET', (id) => `/sandboxes/${id}/metrics`],
      ['GET', (id) => `/v2/sandboxes/${id}/logs`],
      ['POST', (id) => `/sandboxes/${id}/snapshots`, {}],
      ['POST', (id) => `/sandboxes/${id}/snapshots`, { name: `s-${RUN}` }],
      ['POST', (id) => `/sandboxes/${id}/fork`, { count: 1 }],
      ['POST', (id) => `/sandboxes/${id}/migrate`, {}],
      ['POST', (id) => `/sandboxes/${id}/pause`, {}],
      // Last: if it leaked, it would kill the sandbox.
      ['DELETE', (id) => `/sandboxes/${id}`],
    ]
    for (const [method, p, body] of routes) {
      await assertHidden(`beta ${method} ${p(':id')}`, (id) => as(keys.beta, method, p(id), body), a.sandboxId)
    }

    // The SDK reads the same answers as "not found".
    const beta = { apiKey: keys.beta }
    await rejectsWith(Sandbox.getInfo(a.sandboxId, beta), SandboxNotFoundError, 'getInfo')
    await rejectsWith(Sandbox.connect(a.sandboxId, beta), SandboxNotFoundError, 'connect')
    await rejectsWith(Sandbox.setTimeout(a.sandboxId, 3000, beta), SandboxNotFoundError, 'setTimeout')
    await rejectsWith(Sandbox.getMetrics(a.sandboxId, beta), SandboxNotFoundError, 'getMetrics')
    await rejectsWith(Sandbox.fork(a.sandboxId, beta), NotFoundError, 'fork')
    await rejectsWith(Sandbox.createSnapshot(a.sandboxId, beta), NotFoundError, 'createSnapshot')
    assert.equal(await Sandbox.kill(a.sandboxId, beta), false)

    // The many-ids metrics form leaves another team's sandbox out, as one
    // that ended; its own and an admin's see it.
    await waitFor(async () => {
      const m = (await as(keys.beta, 'GET', `/sandboxes/metrics?sandbox_ids=${b.sandboxId}`)).json
      return m?.sandboxes?.[b.sandboxId]
    }, { timeoutMs: 20_000, intervalMs: 500, what: "beta's sandbox's first metrics sample" })
    await waitFor(async () => {
      const m = (await as(keys.alpha, 'GET', `/sandboxes/metrics?sandbox_ids=${a.sandboxId}`)).json
      return m?.sandboxes?.[a.sandboxId]
    }, { timeoutMs: 20_000, intervalMs: 500, what: "alpha's sandbox's first metrics sample" })
    const many = await as(keys.beta, 'GET', `/sandboxes/metrics?sandbox_ids=${a.sandboxId},${b.sandboxId}`)
    assert.equal(many.status, 200, many.text)
    assert.deepEqual(Object.keys(many.json.sandboxes), [b.sandboxId])
    const admin = await srv.api('GET', `/sandboxes/metrics?sandbox_ids=${a.sandboxId},${b.sandboxId}`)
    assert.deepEqual(Object.keys(admin.json.sandboxes).sort(), [a.sandboxId, b.sandboxId].sort())

    // Nothing beta did reached the sandbox: same deadline, same network,
    // running, not forked, not snapshotted, its files there.
    const after = (await as(keys.alpha, 'GET', `/sandboxes/${a.sandboxId}`)).json
    assert.equal(after.state, 'running')
    assert.equal(after.endAt, before.endAt, 'beta moved the deadline')
    assert.deepEqual(after.network, before.network, 'beta changed the network rules')
    assert.equal(await a.files.read('/home/user/mine'), 'alpha')
    assert.deepEqual((await listedBy(keys.alpha)).v2.sort(), [a.sandboxId])
    assert.deepEqual((await as(keys.alpha, 'GET', '/snapshots')).json, [])

    // Paused, it is hidden all the same, and beta cannot resume it.
    assert.equal(await a.pause(), true)
    for (const [method, p, body] of [
      ['GET', (id) => `/sandboxes/${id}`],
      ['POST', (id) => `/sandboxes/${id}/connect`, { timeout: 30 }],
      ['POST', (id) => `/v2/sandboxes/${id}/connect`, { timeout: 30 }],
      ['POST', (id) => `/sandboxes/${id}/resume`, { timeout: 30 }],
      ['DELETE', (id) => `/sandboxes/${id}`],
    ]) {
      await assertHidden(`beta ${method} ${p(':id')} (paused)`, (id) => as(keys.beta, method, p(id), body), a.sandboxId)
    }
    assert.equal((await as(keys.alpha, 'GET', `/sandboxes/${a.sandboxId}`)).json.state, 'paused')

    // Gone, its logs and its end are its team's only.
    await srv.kill(a)
    const logs = await as(keys.alpha, 'GET', `/v2/sandboxes/${a.sandboxId}/logs`)
    assert.equal(logs.status, 200, logs.text)
    assert.ok(logs.json.logs.some((l) => l.message === 'sandbox created'), JSON.stringify(logs.json.logs))
    await assertHidden('beta GET logs (killed)', (id) => as(keys.beta, 'GET', `/v2/sandboxes/${id}/logs`), a.sandboxId)
    await assertHidden('beta GET (killed)', (id) => as(keys.beta, 'GET', `/sandboxes/${id}`), a.sandboxId)
    await assertHidden('beta metrics (killed)', (id) => as(keys.beta, 'GET', `/sandboxes/${id}/metrics`), a.sandboxId)
  } finally {
    await srv.kill(a)
    await srv.kill(b)
  }
})

srv.test("no list shows another team's sandboxes, tokens, volumes or snapshots; the admin's show every team's", async () => {
  const made = []
  let snapA, volA, volB
  try {
    // A private-traffic sandbox carries both tokens.
    const res = await as(keys.alpha, 'POST', '/v2/sandboxes', { templateID: 'base', timeout: 120, network: { allowPublicTraffic: false } })
    assert.equal(res.status, 201, res.text)
    srv.track(res.json.sandboxID)
    made.push(res.json.sandboxID)
    const a = res.json.sandboxID
    const own = (await as(keys.alpha, 'GET', `/sandboxes/${a}`)).json
    const tokens = [own.envdAccessToken, own.trafficAccessToken]
    for (const t of tokens) assert.ok(typeof t === 'string' && t.length >= 16, `alpha's own details lack a token: ${JSON.stringify(own)}`)
    const b = (await srv.create({ apiKey: keys.beta, timeoutMs: 120_000 })).sandboxId
    made.push(b)

    const snap = await as(keys.alpha, 'POST', `/sandboxes/${a}/snapshots`, { name: `list-${RUN}` })
    assert.equal(snap.status, 201, snap.text)
    snapA = snap.json.snapshotID
    const v = await as(keys.alpha, 'POST', '/volumes', { name: `list-${RUN}` })
    assert.equal(v.status, 201, v.text)
    volA = v.json
    // The same volume name in beta is beta's own.
    const vb = await as(keys.beta, 'POST', '/volumes', { name: `list-${RUN}` })
    assert.equal(vb.status, 201, vb.text)
    volB = vb.json
    assert.notEqual(volB.volumeID, volA.volumeID)

    const secrets = [a, ...tokens, snapA, volA.volumeID, volA.token]
    const leaks = (text) => secrets.filter((s) => text.includes(s))
    // ?team= is an admin's filter: a non-admin key lists its own team's whatever it asks.
    for (const query of ['', '?state=running', '?state=paused', '?state=running,paused', '?team=alpha', '?team=alpha,beta']) {
      const l = await listedBy(keys.beta, query)
      assert.deepEqual(leaks(l.text), [], `beta's list ${query || '(all)'} shows alpha's`)
      const want = query === '?state=paused' ? [] : [b]
      assert.deepEqual(l.v1, want, `beta's v1 list ${query}`)
      assert.deepEqual(l.v2, want, `beta's v2 list ${query}`)
    }
    const sdkList = await Sandbox.list({ apiKey: keys.beta }).nextItems()
    assert.deepEqual(sdkList.map((s) => s.sandboxId), [b])
    for (const p of ['/volumes', '/snapshots', `/snapshots?sandboxID=${a}`, `/snapshots?name=list-${RUN}`, '/teams', '/templates']) {
      const r = await as(keys.beta, 'GET', p)
      assert.equal(r.status, 200, `${p}: ${r.text}`)
      assert.deepEqual(leaks(r.text), [], `beta's GET ${p} shows alpha's`)
    }
    assert.deepEqual((await as(keys.beta, 'GET', '/volumes')).json.map((x) => x.volumeID), [volB.volumeID])
    assert.deepEqual((await as(keys.beta, 'GET', '/teams')).json.map((t) => t.id), ['beta'])
    const sdkVolumes = await Volume.list({ apiKey: keys.beta })
    assert.deepEqual(sdkVolumes.map((x) => x.volumeId), [volB.volumeID])

    // Teams: beta sees its own only, and can change nothing.
    await assertHidden('beta GET /teams/:id', (id) => as(keys.beta, 'GET', `/teams/${id}`), 'alpha')
    const betaTeam = await as(keys.beta, 'GET', '/teams/beta')
    assert.equal(betaTeam.status, 200, betaTeam.text)
    assert.equal(betaTeam.json.usage.running, 1)
    assert.equal(betaTeam.json.usage.volumes, 1)
    for (const [method, p, body] of [
      ['PATCH', '/teams/beta', { maxSandboxes: 100 }],
      ['POST', '/teams', { id: `t-${RUN}` }],
      ['POST', '/keys', { name: 'more', team: 'alpha' }],
      ['GET', '/keys'],
      ['PATCH', `/templates/base`, { public: true }],
    ]) {
      const r = await as(keys.beta, method, p, body)
      assert.equal(r.status, 403, `beta ${method} ${p}: ${r.status} ${r.text}`)
    }

    // The admin sees both teams' sandboxes, volumes and snapshots, and
    // filters by team.
    const all = await listedBy(srv.apiKey)
    for (const l of [all.v1, all.v2]) assert.deepEqual(l.filter((id) => made.includes(id)).sort(), [...made].sort())
    const onlyAlpha = await listedBy(srv.apiKey, '?team=alpha')
    assert.deepEqual(onlyAlpha.v2, [a])
    assert.deepEqual(onlyAlpha.v1, [a])
    const adminSdk = await Sandbox.list().nextItems()
    assert.deepEqual(adminSdk.map((s) => s.sandboxId).filter((id) => made.includes(id)).sort(), [...made].sort())
    const adminDetail = await srv.api('GET', `/sandboxes/${a}`)
    assert.equal(adminDetail.json.envdAccessToken, tokens[0])
    const vols = (await srv.api('GET', '/volumes')).json.map((x) => x.volumeID)
    assert.ok(vols.includes(volA.volumeID) && vols.includes(volB.volumeID), `admin's volumes: ${vols}`)
    assert.ok((await srv.api('GET', '/snapshots')).json.some((s) => s.snapshotID === snapA))
    const teams = (await srv.api('GET', '/teams')).json
    assert.ok(['alpha', 'beta'].every((t) => teams.some((x) => x.id === t)), `admin's teams: ${JSON.stringify(teams)}`)
    assert.equal(teams.find((x) => x.id === 'alpha').usage.running, 1)
  } finally {
    for (const id of made) await srv.kill(id)
    if (snapA) await as(keys.alpha, 'DELETE', `/templates/${snapA}`)
    if (volA) await as(keys.alpha, 'DELETE', `/volumes/${volA.volumeID}`)
    if (volB) await as(keys.beta, 'DELETE', `/volumes/${volB.volumeID}`)
  }
})

srv.test("one template name and one volume name in two teams: each team's sandbox gets its own; the other's is hidden", { timeout: 300_000 }, async () => {
  const name = `shared-${RUN}`
  const built = {}
  const vols = {}
  await Promise.all(['alpha', 'beta'].map(async (team) => {
    const tpl = Template().fromTemplate('base').runCmd(`echo ${team} > /home/user/whoami`)
    built[team] = await Template.build(tpl, name, { apiKey: keys[team] })
    vols[team] = await Volume.create(`vol-${RUN}`, { apiKey: keys[team] })
    await vols[team].writeFile('/who', `${team}'s volume`)
  }))
  for (const team of ['alpha', 'beta']) {
    assert.equal(built[team].templateId, `${name}.${teamTag(team)}`)
    const listed = (await as(keys[team], 'GET', '/templates')).json
    const mine = listed.find((t) => t.templateID === built[team].templateId)
    assert.ok(mine, `${team}'s GET /templates lacks its template: ${JSON.stringify(listed)}`)
    assert.deepEqual(mine.aliases, [name])
    assert.equal(mine.public, false)
    const other = built[team === 'alpha' ? 'beta' : 'alpha'].templateId
    assert.ok(!listed.some((t) => t.templateID === other), `${team} lists the other team's template`)
    const alias = await as(keys[team], 'GET', `/templates/aliases/${name}`)
    assert.equal(alias.json.templateID, built[team].templateId)
  }
  assert.notEqual(vols.alpha.volumeId, vols.beta.volumeId)

  const sbx = {}
  try {
    for (const team of ['alpha', 'beta']) {
      sbx[team] = await srv.create({ apiKey: keys[team], template: name, timeoutMs: 120_000, volumeMounts: { '/mnt/v': `vol-${RUN}` } })
      const r = await sbx[team].commands.run('cat /home/user/whoami /mnt/v/who')
      assert.equal(r.stdout, `${team}\n${team}'s volume`)
      assert.equal((await sbx[team].getInfo()).templateId, built[team].templateId)
    }

    const A = built.alpha
    // Beta reaches nothing of alpha's template by its id.
    await assertHidden('beta DELETE /templates/:id', (id) => as(keys.beta, 'DELETE', `/templates/${id}`), A.templateId)
    await assertHidden('beta GET alias', (id) => as(keys.beta, 'GET', `/templates/aliases/${id}`), A.templateId)
    await assertHidden('beta create from the id', (id) => as(keys.beta, 'POST', '/v2/sandboxes', { templateID: id, timeout: 30 }), A.templateId)
    await assertHidden('beta build status', (t, b) => as(keys.beta, 'GET', `/templates/${t}/builds/${b}/status`), A.templateId, A.buildId)
    await assertHidden('beta build start', (t, b) => as(keys.beta, 'POST', `/v2/templates/${t}/builds/${b}`, { fromTemplate: 'base' }), A.templateId, A.buildId)
    await assertHidden('beta build files', (t) => as(keys.beta, 'GET', `/templates/${t}/files/${'ab'.repeat(32)}`), A.templateId)
    const status = await as(keys.alpha, 'GET', `/templates/${A.templateId}/builds/${A.buildId}/status`)
    assert.equal(status.status, 200, status.text)
    assert.equal(status.json.status, 'ready')

    // Nor of alpha's volume: not by id, not as a mount, not through its
    // data plane without the token it cannot see.
    const va = vols.alpha
    await assertHidden('beta GET /volumes/:id', (id) => as(keys.beta, 'GET', `/volumes/${id}`), va.volumeId)
    await assertHidden('beta DELETE /volumes/:id', (id) => as(keys.beta, 'DELETE', `/volumes/${id}`), va.volumeId)
    await assertHidden('beta mount by id', (id) => as(keys.beta, 'POST', '/v2/sandboxes', { templateID: 'base', timeout: 30, volumeMounts: [{ name: id, path: '/mnt/x' }] }), va.volumeId)
    await rejectsWith(Volume.getInfo(va.volumeId, { apiKey: keys.beta }), VolumeNotFoundError, 'Volume.getInfo')
    assert.equal(await Volume.destroy(va.volumeId, { apiKey: keys.beta }), false)
    const plane = (token) => rawRequest({ port: srv.port, path: `/volumecontent/${va.volumeId}/file?path=/who`, headers: token ? { Authorization: `Bearer ${token}` } : {} })
    for (const token of [keys.beta, vols.beta.token, null]) {
      const r = await plane(token)
      assert.ok(r.status === 401 || r.status === 404, `alpha's volume's data plane with ${token === null ? 'no token' : 'a token of beta'}: ${r.status} ${r.text}`)
      assert.ok(!r.text.includes("alpha's volume"))
    }
    const ok = await plane(va.token)
    assert.equal(ok.status, 200, ok.text)
    assert.equal(ok.text, "alpha's volume")
    const info = await as(keys.alpha, 'GET', `/volumes/${va.volumeId}`)
    assert.equal(info.json.token, va.token)
  } finally {
    await srv.kill(sbx.alpha)
    await srv.kill(sbx.beta)
    for (const team of ['alpha', 'beta']) if (vols[team]) await Volume.destroy(vols[team].volumeId, { apiKey: keys[team] })
  }

  // Published by the admin, alpha's template is every team's to use,
  // read-only: a team with no template of that name gets it by name,
  // beta's own name still comes first.
  const g = await srv.api('POST', '/keys', { body: { name: 'gamma-key' } })
  assert.equal(g.status, 201, g.text)
  assert.ok(g.json.team && !['alpha', 'beta', 'server'].includes(g.json.team), `a key without team got team ${g.json.team}`)
  const gamma = g.json.key
  const A = built.alpha
  assert.equal((await as(gamma, 'GET', `/templates/aliases/${name}`)).status, 404)
  assert.equal((await as(keys.beta, 'PATCH', `/templates/${A.templateId}`, { public: true })).status, 403)
  const pub = await srv.api('PATCH', `/templates/${A.templateId}`, { body: { public: true } })
  assert.equal(pub.status, 200, pub.text)
  assert.equal(pub.json.public, true)
  const made = []
  try {
    for (const [key, ref, want] of [[gamma, name, 'alpha'], [keys.beta, name, 'beta'], [keys.beta, A.templateId, 'alpha'], [gamma, A.templateId, 'alpha']]) {
      const s = await srv.create({ apiKey: key, template: ref, timeoutMs: 60_000 })
      made.push(s)
      assert.equal((await s.commands.run('cat /home/user/whoami')).stdout, `${want}\n`, `a sandbox of ${ref}`)
    }
    const listed = (await as(gamma, 'GET', '/templates')).json.find((t) => t.templateID === A.templateId)
    assert.equal(listed?.public, true, 'gamma does not list the public template')
    assert.equal((await as(gamma, 'GET', `/templates/aliases/${name}`)).json.public, true)
    for (const [key, ref] of [[gamma, name], [gamma, A.templateId], [keys.beta, A.templateId]]) {
      const r = await as(key, 'DELETE', `/templates/${ref}`)
      assert.equal(r.status, 403, `DELETE /templates/${ref} by a team it is public to: ${r.status} ${r.text}`)
    }
  } finally {
    for (const s of made) await srv.kill(s)
  }
  assert.equal((await srv.api('PATCH', `/templates/${A.templateId}`, { body: { public: false } })).status, 200)
  assert.equal((await as(gamma, 'GET', `/templates/aliases/${name}`)).status, 404)
  assert.equal((await as(gamma, 'POST', '/v2/sandboxes', { templateID: A.templateId, timeout: 30 })).status, 404)
  // Each team deletes its own by name.
  for (const team of ['alpha', 'beta']) {
    const r = await as(keys[team], 'DELETE', `/templates/${name}`)
    assert.equal(r.status, 204, `${team} deleting its template: ${r.status} ${r.text}`)
  }
})

srv.test("another team's sandbox cannot be forked or snapshotted, nor its snapshot used or deleted", async () => {
  const a = await srv.create({ apiKey: keys.alpha, timeoutMs: 120_000 })
  const made = []
  const snaps = []
  const snapName = `snap-${RUN}`
  try {
    await a.files.write('/home/user/marker', 'alpha snap')
    const sa = await a.createSnapshot({ name: snapName })
    snaps.push([keys.alpha, sa.snapshotId])
    const beta = { apiKey: keys.beta }

    await assertHidden('beta fork', (id) => as(keys.beta, 'POST', `/sandboxes/${id}/fork`, { count: 2 }), a.sandboxId)
    await assertHidden('beta snapshot', (id) => as(keys.beta, 'POST', `/sandboxes/${id}/snapshots`, {}), a.sandboxId)
    await assertHidden('beta create from the snapshot id', (id) => as(keys.beta, 'POST', '/v2/sandboxes', { templateID: id, timeout: 30 }), sa.snapshotId)
    await assertHidden('beta create from the snapshot name', (id) => as(keys.beta, 'POST', '/v2/sandboxes', { templateID: id, timeout: 30 }), snapName)
    await assertHidden('beta GET /snapshots/:id', (id) => as(keys.beta, 'GET', `/snapshots/${id}`), sa.snapshotId)
    await assertHidden('beta GET /snapshots/:name', (id) => as(keys.beta, 'GET', `/snapshots/${id}`), snapName)
    await assertHidden('beta DELETE the snapshot', (id) => as(keys.beta, 'DELETE', `/templates/${id}`), sa.snapshotId)
    await assertHidden('beta DELETE the snapshot by name', (id) => as(keys.beta, 'DELETE', `/templates/${id}`), snapName)
    const e = await rejectsWith(Sandbox.create(sa.snapshotId, { ...beta, timeoutMs: 30_000 }), SandboxError, 'SDK create from the snapshot')
    assert.equal(e.statusCode, 404, e.message)
    assert.equal(await Sandbox.deleteSnapshot(sa.snapshotId, beta), false)
    assert.deepEqual((await as(keys.beta, 'GET', '/snapshots')).json, [])
    assert.deepEqual((await listedBy(keys.beta)).v2, [], 'a refused fork or create left beta a sandbox')
    assert.deepEqual((await listedBy(keys.alpha)).v2, [a.sandboxId], 'a refused fork left alpha a sandbox')

    // Alpha's snapshot is intact, and by its name alpha's; beta may have
    // a snapshot of the same name, its own.
    const got = await as(keys.alpha, 'GET', `/snapshots/${snapName}`)
    assert.equal(got.status, 200, got.text)
    assert.equal(got.json.snapshotID, sa.snapshotId)
    const b = await srv.create({ apiKey: keys.beta, timeoutMs: 60_000 })
    made.push(b)
    await b.files.write('/home/user/marker', 'beta snap')
    const sb = await b.createSnapshot({ name: snapName })
    snaps.push([keys.beta, sb.snapshotId])
    assert.notEqual(sb.snapshotId, sa.snapshotId)
    for (const [key, want] of [[keys.alpha, 'alpha snap'], [keys.beta, 'beta snap']]) {
      const s = await srv.create({ apiKey: key, template: snapName, timeoutMs: 60_000 })
      made.push(s)
      assert.equal(await s.files.read('/home/user/marker'), want)
    }
    // Alpha's own fork works.
    const kids = await Sandbox.fork(a.sandboxId, { apiKey: keys.alpha, count: 1, timeoutMs: 60_000 })
    assert.ok(!(kids[0] instanceof Error), `alpha's fork: ${kids[0]}`)
    srv.track(kids[0].sandboxId)
    made.push(kids[0])
    assert.equal((await Sandbox.getInfo(kids[0].sandboxId, { apiKey: keys.alpha })).sandboxId, kids[0].sandboxId)
    await rejectsWith(Sandbox.getInfo(kids[0].sandboxId, beta), SandboxNotFoundError, "beta's getInfo of alpha's fork child")
  } finally {
    for (const s of made) await srv.kill(s)
    await srv.kill(a)
    for (const [key, id] of snaps) await as(key, 'DELETE', `/templates/${id}`)
  }
})

srv.test("a create's Idempotency-Key is its key's: another team's same key makes its own sandbox", async () => {
  const idem = `idem-${RUN}`
  const made = []
  try {
    for (const key of [keys.alpha, keys.beta]) {
      const r = await srv.api('POST', '/v2/sandboxes', { key, body: { templateID: 'base', timeout: 60 }, headers: { 'Idempotency-Key': idem } })
      assert.equal(r.status, 201, r.text)
      srv.track(r.json.sandboxID)
      made.push(r.json)
    }
    assert.notEqual(made[0].sandboxID, made[1].sandboxID, "beta's create with alpha's Idempotency-Key got alpha's sandbox")
    assert.notEqual(made[1].envdAccessToken, made[0].envdAccessToken)
  } finally {
    for (const s of made) await srv.kill(s.sandboxID)
  }
})

srv.test('a team quota of 2 running sandboxes holds across creates, forks, resumes and auto-resumes; maxPaused bounds pauses', { timeout: 240_000 }, async () => {
  const t = await srv.api('POST', '/teams', { body: { id: 'capped', maxSandboxes: 2 } })
  assert.equal(t.status, 201, t.text)
  assert.equal(t.json.maxSandboxes, 2)
  const k = await srv.api('POST', '/keys', { body: { name: 'capped-key', team: 'capped' } })
  assert.equal(k.status, 201, k.text)
  const key = k.json.key
  const opts = { apiKey: key, timeoutMs: 120_000 }
  const usage = async () => (await as(key, 'GET', '/teams/capped')).json.usage
  /** Asserts that one more running sandbox of the team is refused, naming the limit and the count. */
  const full = async (what, res, count = 2) => {
    assert.equal(res.status, 429, `${what}: ${res.status} ${res.text}`)
    assert.equal(res.json.code, 429)
    assert.match(res.json.message, new RegExp(`\\b${count} of its 2\\b`), `${what}: the message names neither the count nor the limit`)
  }
  const create = () => as(key, 'POST', '/v2/sandboxes', { templateID: 'base', timeout: 60 })
  const made = []
  const track = (s) => {
    made.push(s)
    return s
  }
  try {
    const s1 = track(await srv.create(opts))
    const s2 = track(await srv.create(opts))
    await full('a 3rd create', await create())
    await rejectsWith(Sandbox.create(opts), RateLimitError, 'the SDK create past the quota')
    await full('a fork past the quota', await as(key, 'POST', `/sandboxes/${s1.sandboxId}/fork`, { count: 1 }))
    assert.deepEqual(await usage(), { running: 2, paused: 0, keys: 1, snapshotBytes: 0, volumes: 0, volumeBytes: 0 })

    // A paused sandbox frees its slot; a resume takes one back.
    assert.equal(await s2.pause(), true)
    const s3 = track(await srv.create(opts))
    for (const p of [`/sandboxes/${s2.sandboxId}/connect`, `/v2/sandboxes/${s2.sandboxId}/connect`, `/sandboxes/${s2.sandboxId}/resume`]) {
      await full(`POST ${p} past the quota`, await as(key, 'POST', p, { timeout: 60 }))
    }
    await rejectsWith(Sandbox.connect(s2.sandboxId, opts), RateLimitError, 'the SDK connect past the quota')
    assert.equal((await Sandbox.getInfo(s2.sandboxId, opts)).state, 'paused')
    assert.deepEqual(await usage(), { running: 2, paused: 1, keys: 1, snapshotBytes: 0, volumes: 0, volumeBytes: 0 })
    await srv.kill(s3)
    const back = await Sandbox.connect(s2.sandboxId, opts)
    assert.equal((await back.commands.run('echo back')).stdout, 'back\n')
    await full('a create after the resume', await create())

    // A fork takes as many slots as children.
    assert.equal(await s2.pause(), true)
    await full('a fork of 2 with one slot left', await as(key, 'POST', `/sandboxes/${s1.sandboxId}/fork`, { count: 2 }), 1)
    const kids = await Sandbox.fork(s1.sandboxId, { ...opts, count: 1 })
    assert.ok(!(kids[0] instanceof Error), `a fork into the last slot: ${kids[0]}`)
    srv.track(kids[0].sandboxId)
    track(kids[0])
    await full('a create after the fork', await create())
    await srv.kill(kids[0])

    // Auto-resume counts too: traffic to a paused sandbox does not resume
    // it past the quota.
    const s4 = track(await srv.create({ ...opts, timeoutMs: 4_000, lifecycle: { onTimeout: 'pause', autoResume: true } }))
    await s4.files.write('/home/user/kept', 'through the pause')
    await waitFor(async () => (await Sandbox.getInfo(s4.sandboxId, opts)).state === 'paused',
      { timeoutMs: 20_000, intervalMs: 250, what: 'the timed-out sandbox to be paused' })
    const s5 = track(await srv.create(opts))
    await assert.rejects(s4.commands.run('cat /home/user/kept', { requestTimeoutMs: 20_000 }), 'traffic resumed a sandbox past the quota')
    assert.equal((await Sandbox.getInfo(s4.sandboxId, opts)).state, 'paused')
    assert.equal((await usage()).running, 2)
    await srv.kill(s5)
    assert.equal((await s4.commands.run('cat /home/user/kept')).stdout, 'through the pause')
    await s4.setTimeout(120_000)
    assert.equal((await Sandbox.getInfo(s4.sandboxId, opts)).state, 'running')
    await full('a create after the auto-resume', await create())

    // maxPaused: a PATCH changes it alone.
    const p = await srv.api('PATCH', '/teams/capped', { body: { maxPaused: 1 } })
    assert.equal(p.status, 200, p.text)
    assert.equal(p.json.maxSandboxes, 2)
    assert.equal(p.json.maxPaused, 1)
    const refused = await as(key, 'POST', `/sandboxes/${s1.sandboxId}/pause`, {})
    assert.equal(refused.status, 429, refused.text)
    assert.match(refused.json.message, /\b1 of its 1 paused\b/)
    assert.equal((await Sandbox.getInfo(s1.sandboxId, opts)).state, 'running')
    assert.deepEqual(await usage(), { running: 2, paused: 1, keys: 1, snapshotBytes: 0, volumes: 0, volumeBytes: 0 })

    // Another team is not bound by capped's quota.
    const other = await srv.create({ apiKey: keys.alpha, timeoutMs: 60_000 })
    track(other)
  } finally {
    for (const s of made) await srv.kill(s)
  }
})

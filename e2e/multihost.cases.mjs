// Many hosts on one machine, through the e2b SDK, over TLS: a 3-member
// etcd (client and peer TLS), two API servers without local nodes serving
// HTTPS (the second joined with `aenv server --join`) and three node
// agents joined with `aenv cluster join-command`'s lines, each in its own
// network namespace. Sandboxes spread over the nodes and answer through
// either server; a node killed with -9 has its running sandboxes reported
// lost and its paused one resumed elsewhere; an etcd member or an API
// server going away changes nothing; a node restarted within its lease
// keeps its sandboxes. A cluster of the old kind (plain, the cluster
// token) still works beside it; and the capture of the whole run holds
// none of the TLS cluster's secrets. Run through multihost.test.mjs, which
// makes the CA this process trusts.

import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import path from 'node:path'
import { Sandbox, SandboxNotFoundError, Volume } from 'e2b'
import { useCluster, } from './lib/cluster.mjs'
import { waitFor, sleep, rejectsWith, rawRequest } from './lib/server.mjs'

const cl = useCluster({ tag: 'zqmh', subnet: '10.250.7' })

// A counter in the sandbox's memory and processes: it keeps counting only
// if the very process survives.
const COUNTER = 'nohup sh -c \'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done\' >/dev/null 2>&1 &'

async function count(sbx) {
  return Number((await sbx.commands.run('cat /tmp/count')).stdout.trim())
}

let sandboxes = []
const byNode = new Map()

cl.test('30 sandboxes spread over all three nodes and answer through either API server', async () => {
  for (let i = 0; i < 30; i++) sandboxes.push(await cl.create())
  for (const sbx of sandboxes) {
    const node = await cl.nodeOf(sbx.sandboxId)
    if (!byNode.has(node)) byNode.set(node, [])
    byNode.get(node).push(sbx)
  }
  assert.deepEqual([...byNode.keys()].sort(), ['zqmhn1', 'zqmhn2', 'zqmhn3'], `placement: ${[...byNode].map(([n, l]) => `${n}:${l.length}`)}`)
  const nodes = (await cl.api('GET', '/nodes')).json
  for (const n of nodes) {
    assert.equal(n.state, 'ready')
    assert.equal(n.sandboxes, byNode.get(n.id).length, `node ${n.id}'s sandbox count`)
    assert.match(n.address, /^10\.250\.7\.1[1-3]:8100$/)
  }
  for (const [j, sbx] of sandboxes.slice(0, 6).entries()) {
    const other = await Sandbox.connect(sbx.sandboxId, cl.via(j % 2))
    const r = await other.commands.run('echo hello from $(hostname)')
    assert.equal(r.stdout.trim(), `hello from ${sbx.sandboxId}`)
    await other.files.write('/home/user/note.txt', `written through server ${j % 2}`)
    const back = await Sandbox.connect(sbx.sandboxId, cl.via((j + 1) % 2))
    assert.equal(await back.files.read('/home/user/note.txt'), `written through server ${j % 2}`)
  }
  // Ten sandboxes are enough for the rest.
  const keep = new Set([...byNode.values()].flatMap((l) => l.slice(0, 3)).map((s) => s.sandboxId))
  for (const sbx of sandboxes) {
    if (!keep.has(sbx.sandboxId)) {
      await sbx.kill()
      cl.sandboxes.delete(sbx.sandboxId)
    }
  }
  for (const [n, l] of byNode) byNode.set(n, l.filter((s) => keep.has(s.sandboxId)))
})

cl.test('kill -9 of a node: its running sandboxes are lost within TTL + 5 s, its paused one resumes on another node', async () => {
  const [paused, ...running] = byNode.get('zqmhn1')
  await paused.commands.run(COUNTER)
  await paused.files.write('/home/user/kept.txt', 'kept across the node')
  await sleep(600)
  const before = await count(paused)
  assert.equal(await paused.pause(), true)

  const node = cl.nodes[0]
  const killedAt = performance.now()
  await node.kill('SIGKILL')
  await waitFor(async () => {
    const listed = (await Sandbox.list(cl.via(0)).nextItems()).map((s) => s.sandboxId)
    return running.every((s) => !listed.includes(s.sandboxId))
  }, { timeoutMs: 15_000, what: "the dead node's sandboxes to leave the list" })
  assert.ok(performance.now() - killedAt <= 15_000, `lost after ${performance.now() - killedAt} ms`)
  const res = await cl.api('GET', `/sandboxes/${running[0].sandboxId}`)
  assert.equal(res.status, 404)
  assert.match(res.json.message, /node zqmhn1 stopped answering/)
  await rejectsWith(Sandbox.connect(running[0].sandboxId, cl.via(1)), SandboxNotFoundError, 'connect to a lost sandbox')
  for (const s of running) cl.sandboxes.delete(s.sandboxId)
  assert.match((await cl.api('GET', '/nodes/zqmhn1')).json.state, /lost/)

  const resumed = await Sandbox.connect(paused.sandboxId, cl.via(1))
  const where = await cl.nodeOf(paused.sandboxId, cl.servers[1])
  assert.notEqual(where, 'zqmhn1')
  assert.equal(await resumed.files.read('/home/user/kept.txt'), 'kept across the node')
  const after = await count(resumed)
  assert.ok(after >= before, `the counter went from ${before} to ${after}: the process did not survive`)
  await sleep(600)
  assert.ok((await count(resumed)) > after, 'the counter stopped counting after the resume')
  byNode.set(where, [...byNode.get(where), resumed])
  byNode.delete('zqmhn1')

  // The node comes back: nothing it ran is anyone's any more.
  node.start()
  await cl.waitNodeUp(node)
  await cl.waitNodes(['zqmhn1'])
  await waitFor(() => /removing a sandbox its node runs without a record/.test(cl.servers.map((s) => s.tail(400)).join('\n')),
    { timeoutMs: 20_000, what: 'the returning node to have its old sandboxes removed' })
})

cl.test('an etcd member and an API server can go: the cluster keeps serving', async () => {
  await cl.etcd[2].kill('SIGKILL')
  const sbx = await cl.create()
  assert.equal((await sbx.commands.run('echo ok')).stdout.trim(), 'ok')

  // kill -9 of one API server in the middle of traffic through the other.
  const through1 = await Sandbox.connect(sbx.sandboxId, cl.via(1))
  let stop = false
  let served = 0
  const traffic = (async () => {
    while (!stop) {
      assert.equal((await through1.commands.run('echo tick')).stdout.trim(), 'tick')
      served++
    }
  })()
  await sleep(500)
  await cl.servers[0].kill('SIGKILL')
  const before = served
  await sleep(2000)
  assert.ok(served > before, 'the other API server stopped serving when one was killed')
  cl.servers[0].start()
  await cl.waitServer(cl.servers[0])
  // The restarted one serves at once, the sandbox included.
  const through0 = await Sandbox.connect(sbx.sandboxId, cl.via(0))
  assert.equal((await through0.commands.run('echo again')).stdout.trim(), 'again')
  stop = true
  await traffic
  await sbx.kill()
  cl.sandboxes.delete(sbx.sandboxId)
  cl.etcd[2].start()
})

cl.test('a node restarted within its lease keeps its sandboxes running', async () => {
  const [sbx] = byNode.get('zqmhn2')
  await sbx.commands.run(COUNTER)
  await sleep(600)
  const node = cl.nodes[1]
  await node.kill('SIGKILL')
  node.start()
  await cl.waitNodeUp(node)
  const before = await count(sbx)
  await sleep(600)
  assert.ok((await count(sbx)) > before, 'the counter stopped: the sandbox did not survive its node restarting')
  const info = await Sandbox.getInfo(sbx.sandboxId, cl.via(1))
  assert.equal(info.state, 'running')
})

cl.test('migrate: a sandbox with a running counter continues on another node, same id; drain --migrate empties a node', async () => {
  const [sbx, other] = byNode.get('zqmhn3')
  await sbx.commands.run(COUNTER)
  await sbx.files.write('/home/user/moved.txt', 'moved with me')
  await sleep(600)
  const before = await count(sbx)
  const res = await cl.api('POST', `/sandboxes/${sbx.sandboxId}/migrate`, { body: { nodeID: 'zqmhn2' } })
  assert.equal(res.status, 200, res.text)
  assert.equal(res.json.sandboxID, sbx.sandboxId)
  assert.equal(res.json.nodeID, 'zqmhn2')
  assert.equal(res.json.fromNodeID, 'zqmhn3')
  console.log(`# migration downtime: ${res.json.downtimeMs} ms`)
  // The same SDK object (same URL) goes on.
  const after = await count(sbx)
  assert.ok(after >= before, `counter ${before} -> ${after}: not the same process`)
  await sleep(600)
  assert.ok((await count(sbx)) > after, 'the counter stopped after the migration')
  assert.equal(await sbx.files.read('/home/user/moved.txt'), 'moved with me')
  assert.equal(await cl.nodeOf(sbx.sandboxId), 'zqmhn2')

  const bad = await cl.api('POST', `/sandboxes/${other.sandboxId}/migrate`, { body: { nodeID: 'nosuchnode' } })
  assert.equal(bad.status, 404, bad.text)
  assert.equal((await other.commands.run('echo still here')).stdout.trim(), 'still here')

  const out = execFileSync(path.join(process.env.AENV_BIN_DIR, 'aenv'), ['node', 'drain', 'zqmhn3', '--migrate',
    '--url', cl.server().url], { env: { ...process.env, AENV_API_KEY: cl.apiKey } }).toString()
  assert.match(out, new RegExp(`${other.sandboxId} -> zqmhn[12]`))
  const left = (await cl.api('GET', '/v2/sandboxes')).json.filter((s) => s.nodeID === 'zqmhn3')
  assert.deepEqual(left, [], 'sandboxes left on the drained node')
  assert.equal((await other.commands.run('echo moved')).stdout.trim(), 'moved')
  assert.equal((await cl.api('DELETE', '/nodes/zqmhn3/drain')).status, 200)
})

cl.test('a node stopping with --on-stop=drain: the cluster moves its sandboxes away, running', async () => {
  const idx = 2
  await cl.nodes[idx].kill('SIGKILL')
  const draining = cl.nodeProc(3, { onStop: 'drain' })
  cl.nodes[idx] = draining
  draining.start()
  await cl.waitNodeUp(draining)
  await cl.waitNodes(['zqmhn3'])
  for (const n of ['zqmhn1', 'zqmhn2']) assert.equal((await cl.api('POST', `/nodes/${n}/drain`)).status, 200)
  let moving
  try {
    moving = [await cl.create(), await cl.create()]
  } finally {
    for (const n of ['zqmhn1', 'zqmhn2']) await cl.api('DELETE', `/nodes/${n}/drain`)
  }
  for (const sbx of moving) assert.equal(await cl.nodeOf(sbx.sandboxId), 'zqmhn3')
  await moving[0].commands.run(COUNTER)
  await sleep(600)
  const before = await count(moving[0])

  await draining.kill('SIGTERM')
  assert.equal(draining.exit.code, 0, `the draining node exited with ${JSON.stringify(draining.exit)}:\n${draining.tail()}`)
  assert.match(draining.logSinceStart(), /drained: no sandbox runs here any more/)
  // The node is done once their states are saved; the restores elsewhere
  // may still be finishing.
  for (const sbx of moving) {
    await waitFor(async () => ['zqmhn1', 'zqmhn2'].includes(await cl.nodeOf(sbx.sandboxId)),
      { timeoutMs: 10_000, what: `${sbx.sandboxId} to run on another node` })
  }
  const after = await count(moving[0])
  assert.ok(after >= before, `counter ${before} -> ${after}: not the same process`)
  await sleep(600)
  assert.ok((await count(moving[0])) > after, 'the counter stopped after its node drained')
  for (const sbx of moving) {
    await sbx.kill()
    cl.sandboxes.delete(sbx.sandboxId)
  }
  // Back as it was, for the tests after this one.
  cl.nodes[idx] = cl.nodeProc(3)
  cl.nodes[idx].start()
  await cl.waitNodeUp(cl.nodes[idx])
  await cl.waitNodes(['zqmhn3'])
  assert.equal((await cl.api('GET', '/nodes/zqmhn3')).json.state, 'ready', 'the node is still marked draining after its restart')
})

cl.test('API keys live in the cluster: a key made on one server works on the other, and a revoked one on neither', async () => {
  const made = await cl.api('POST', '/keys', { body: { name: 'e2e', maxSandboxes: 1 }, server: cl.servers[0] })
  assert.equal(made.status, 201, made.text)
  const key = made.json.key
  cl.secret('the API key made', key)
  const asUser = (server) => cl.api('GET', '/v2/sandboxes', { server, headers: { 'X-API-KEY': key } })
  await waitFor(async () => (await asUser(cl.servers[1])).status === 200, { timeoutMs: 5000, what: 'the other server to accept the key' })
  const sbx = cl.track(await Sandbox.create({ ...cl.via(1), apiKey: key }))
  // Each server counts a key's sandboxes from its own copy of the records,
  // which follows the other servers' writes milliseconds later.
  await waitFor(async () => (await cl.api('GET', `/sandboxes/${sbx.sandboxId}`, { server: cl.servers[0] })).status === 200,
    { timeoutMs: 5000, what: 'the other server to see the sandbox' })
  const over = await cl.api('POST', '/sandboxes', { server: cl.servers[0], headers: { 'X-API-KEY': key }, body: { templateID: 'base' } })
  assert.equal(over.status, 429, `a create past the key's quota of 1: ${over.status} ${over.text}`)
  await sbx.kill()
  cl.sandboxes.delete(sbx.sandboxId)
  assert.equal((await cl.api('DELETE', `/keys/${made.json.id}`, { server: cl.servers[1] })).status, 204)
  await waitFor(async () => (await asUser(cl.servers[0])).status === 401, { timeoutMs: 5000, what: 'the revoked key to be refused' })
})

cl.test('a volume lives on one node: its sandboxes go there, and either server reaches its files', async () => {
  const vol = await Volume.create(`mh-${Date.now().toString(36)}`, cl.via(1))
  const info = (await cl.api('GET', `/volumes/${vol.volumeId}`, { server: cl.servers[1] })).json
  assert.equal(info.token, vol.token)
  await vol.writeFile('/seed.txt', 'seeded via server 0\n', { apiUrl: cl.servers[0].url })
  const made = []
  try {
    for (let i = 0; i < 3; i++) made.push(await cl.create({ volumeMounts: { '/v': vol } }))
    const nodes = new Set(await Promise.all(made.map((s) => cl.nodeOf(s.sandboxId))))
    assert.equal(nodes.size, 1, `sandboxes that mount one volume ran on ${[...nodes]}`)
    await made[0].commands.run('cat /v/seed.txt > /v/copy.txt')
    assert.equal((await made[2].commands.run('cat /v/copy.txt')).stdout, 'seeded via server 0\n')
    assert.equal(await vol.readFile('/copy.txt', { apiUrl: cl.servers[1].url }), 'seeded via server 0\n')
    const refused = await cl.api('POST', `/sandboxes/${made[0].sandboxId}/migrate`, { body: {} })
    assert.equal(refused.status, 400, refused.text)
    assert.match(refused.json.message, /mount too/)
    // Alone with its volume, a sandbox takes it along (through the store).
    for (const s of made.splice(1)) {
      await s.kill()
      cl.sandboxes.delete(s.sandboxId)
    }
    const before = await cl.nodeOf(made[0].sandboxId)
    const moved = await cl.api('POST', `/sandboxes/${made[0].sandboxId}/migrate`, { body: {} })
    assert.equal(moved.status, 200, moved.text)
    const after = await cl.nodeOf(made[0].sandboxId)
    assert.notEqual(after, before)
    assert.equal((await made[0].commands.run('cat /v/copy.txt && echo more >> /v/copy.txt')).stdout, 'seeded via server 0\n')
    assert.equal(await vol.readFile('/copy.txt', { apiUrl: cl.servers[1].url }), 'seeded via server 0\nmore\n')
    const next = await cl.create({ volumeMounts: { '/v': vol } })
    made.push(next)
    assert.equal(await cl.nodeOf(next.sandboxId), after, 'a new sandbox of the volume went to its old node')
  } finally {
    for (const s of made) {
      await s.kill()
      cl.sandboxes.delete(s.sandboxId)
    }
  }
  assert.equal(await Volume.destroy(vol.volumeId, cl.via(0)), true)
})

cl.test('bad input: an unknown node, a create no node can take', async () => {
  const unknown = await cl.api('GET', '/nodes/nosuchnode')
  assert.equal(unknown.status, 404)

  // Each node offers 8 GiB (--capacity-memory).
  const big = await cl.api('POST', '/sandboxes', { body: { templateID: 'base', memoryMB: 12288, cpuCount: 2 } })
  assert.equal(big.status, 400, `a sandbox larger than every node: ${big.status} ${big.text}`)
  assert.match(big.json.message, /larger than every node/)

  for (const n of ['zqmhn1', 'zqmhn2', 'zqmhn3']) assert.equal((await cl.api('POST', `/nodes/${n}/drain`)).status, 200)
  try {
    const full = await cl.api('POST', '/sandboxes', { body: { templateID: 'base' } })
    assert.equal(full.status, 503)
    assert.match(full.json.message, /draining/)
    assert.ok(full.headers['retry-after'], 'a 503 without Retry-After')
  } finally {
    for (const n of ['zqmhn1', 'zqmhn2', 'zqmhn3']) await cl.api('DELETE', `/nodes/${n}/drain`)
  }
})

cl.test('the old join with the cluster token (--insecure-cluster): a plain cluster beside works, and a wrong token is refused', async () => {
  const { server, node } = await cl.legacy()
  const plain = { apiUrl: server.url, sandboxUrl: server.url, apiKey: cl.legacyApiKey }
  const nodes = () => rawRequest({ host: server.host, port: server.port, path: '/nodes', headers: { 'X-API-KEY': cl.legacyApiKey } })
  await waitFor(async () => (await nodes()).json?.some((n) => n.id === node.id && n.state === 'ready'),
    { timeoutMs: 30_000, what: 'the node joined with the cluster token to be ready' })
  const sbx = await Sandbox.create({ ...plain, timeoutMs: 600_000 })
  try {
    assert.equal((await sbx.commands.run('echo plain')).stdout.trim(), 'plain')
  } finally {
    await sbx.kill()
  }
  assert.match(server.tail(400), /--insecure-cluster/, 'the plain cluster started without warning')

  const intruder = cl.legacyNode({ token: 'not-the-cluster-token-at-all', id: 'intruder' })
  intruder.start()
  const exit = await intruder.exited
  assert.notEqual(exit.code, 0)
  assert.match(intruder.tail(), /wrong or missing cluster token/)
  assert.match(server.tail(200), /refused a request with a wrong or missing cluster token/)
  await node.kill('SIGTERM')
  await server.kill('SIGTERM')
})

// Last: the capture covers every case before it.
cl.test('the capture of the run holds none of the TLS cluster\'s secrets, and the plain cluster\'s token', async () => {
  const { bytes, found } = await cl.capturedSecrets()
  const secrets = [...cl.secrets.keys()]
  assert.ok(bytes.length > 1 << 20, `only ${bytes.length} bytes were captured`)
  // The control: what crossed in the clear is found, so an absence means
  // something.
  assert.ok(bytes.includes(Buffer.from(cl.legacyToken)), 'the plain cluster\'s token, sent in the clear, is not in the capture')
  assert.ok(bytes.includes(Buffer.from(cl.legacyApiKey)), 'the plain cluster\'s API key, sent in the clear, is not in the capture')
  assert.ok(secrets.filter((w) => w.startsWith('join token')).length >= 4, `join tokens checked: ${secrets}`)
  assert.ok(secrets.filter((w) => w.startsWith('the envd access token')).length >= 30, `access tokens checked: ${secrets.length}`)
  assert.deepEqual(found, [], `secrets seen on the network in the clear (${cl.pcap})`)
})

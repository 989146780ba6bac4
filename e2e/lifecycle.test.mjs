// Sandbox lifecycle through the e2b SDK: create, info, list, timeout,
// connect, kill, not-found and authentication errors.

import assert from 'node:assert/strict'
import { Sandbox, SandboxNotFoundError, NotFoundError, AuthenticationError, SandboxError } from 'e2b'
import { useServer, randomTag, rejectsWith, waitFor } from './lib/server.mjs'

const srv = useServer({ tag: 'zqlife', cidr: '10.240.0.0/16', portHint: 18100 })
const RUN = randomTag()
// A well-formed key the server does not know.
const WRONG_KEY = 'e2b_' + '0123456789abcdef'.repeat(2)

/** Collects every page of a paginator. */
async function listAll(opts) {
  const paginator = Sandbox.list(opts)
  const out = []
  let pages = 0
  while (paginator.hasNext) {
    out.push(...(await paginator.nextItems()))
    if (++pages > 100) throw new Error('paginator does not end')
  }
  return { items: out, pages }
}

function near(actualMs, expectedMs, slackMs, what) {
  assert.ok(Math.abs(actualMs - expectedMs) <= slackMs, `${what}: ${new Date(actualMs).toISOString()} is not within ${slackMs} ms of ${new Date(expectedMs).toISOString()}`)
}

srv.test('create with metadata and envs; getInfo reports them', async () => {
  const metadata = { suite: 'lifecycle', run: RUN, role: 'info' }
  const before = Date.now()
  const sbx = await srv.create({ metadata, envs: { FOO: 'bar baz', OTHER: 'x=y' }, timeoutMs: 120_000 })
  const after = Date.now()
  try {
    assert.match(sbx.sandboxId, /^[a-z0-9]+$/)

    const r = await sbx.commands.run('echo "$FOO"; echo "$OTHER"')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'bar baz\nx=y\n')
    assert.equal(r.stderr, '')

    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.templateId, 'base')
    assert.deepEqual(info.metadata, metadata)
    assert.equal(info.state, 'running')
    assert.ok(info.startedAt instanceof Date && !Number.isNaN(info.startedAt.getTime()), `startedAt ${info.startedAt}`)
    assert.ok(info.endAt instanceof Date && !Number.isNaN(info.endAt.getTime()), `endAt ${info.endAt}`)
    assert.ok(info.startedAt.getTime() >= before - 2000 && info.startedAt.getTime() <= after + 2000,
      `startedAt ${info.startedAt.toISOString()} outside the create call [${new Date(before).toISOString()}, ${new Date(after).toISOString()}]`)
    near(info.endAt.getTime() - info.startedAt.getTime(), 120_000, 5000, 'endAt - startedAt')
    assert.ok(info.cpuCount > 0, `cpuCount ${info.cpuCount}`)
    assert.ok(info.memoryMB > 0, `memoryMB ${info.memoryMB}`)
    assert.match(info.envdVersion, /^\d+\.\d+\.\d+/)

    // The static form returns the same.
    const info2 = await Sandbox.getInfo(sbx.sandboxId)
    assert.equal(info2.sandboxId, sbx.sandboxId)
    assert.deepEqual(info2.metadata, metadata)
    assert.equal(info2.startedAt.getTime(), info.startedAt.getTime())

    assert.equal(await sbx.isRunning(), true)
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('Sandbox.list filters by metadata and pages', async () => {
  const grp = randomTag()
  const made = []
  try {
    made.push(...(await Promise.all([
      srv.create({ metadata: { run: RUN, grp, kind: 'x' }, timeoutMs: 120_000 }),
      srv.create({ metadata: { run: RUN, grp, kind: 'x' }, timeoutMs: 120_000 }),
      srv.create({ metadata: { run: RUN, grp, kind: 'y' }, timeoutMs: 120_000 }),
    ])))
    const ids = made.map((s) => s.sandboxId)
    const xs = ids.slice(0, 2).sort()

    const { items: onlyX } = await listAll({ query: { metadata: { grp, kind: 'x' } } })
    assert.deepEqual(onlyX.map((s) => s.sandboxId).sort(), xs)
    for (const s of onlyX) {
      assert.deepEqual(s.metadata, { run: RUN, grp, kind: 'x' })
      assert.equal(s.templateId, 'base')
      assert.equal(s.state, 'running')
      assert.ok(!Number.isNaN(s.startedAt.getTime()) && !Number.isNaN(s.endAt.getTime()))
    }

    const { items: all3 } = await listAll({ query: { metadata: { grp } } })
    assert.deepEqual(all3.map((s) => s.sandboxId).sort(), [...ids].sort())

    const { items: none } = await listAll({ query: { metadata: { grp, kind: 'z' } } })
    assert.deepEqual(none, [])

    const { items: running } = await listAll({ query: { metadata: { grp }, state: ['running'] } })
    assert.equal(running.length, 3)
    const { items: paused } = await listAll({ query: { metadata: { grp }, state: ['paused'] } })
    assert.deepEqual(paused, [])

    // One per page: three pages, every sandbox exactly once.
    const { items: paged, pages } = await listAll({ query: { metadata: { grp } }, limit: 1 })
    assert.deepEqual(paged.map((s) => s.sandboxId).sort(), [...ids].sort())
    assert.ok(pages >= 3 && pages <= 4, `pages ${pages}`)

    const { items: paged2 } = await listAll({ query: { metadata: { grp } }, limit: 2 })
    assert.deepEqual(paged2.map((s) => s.sandboxId).sort(), [...ids].sort())

    // After killing one, the list no longer shows it.
    await srv.kill(made[0])
    const { items: after } = await listAll({ query: { metadata: { grp } } })
    assert.deepEqual(after.map((s) => s.sandboxId).sort(), ids.slice(1).sort())
  } finally {
    await Promise.all(made.map((s) => srv.kill(s)))
  }
})

srv.test('metadata filter with characters that need escaping', async () => {
  // The SDK url-encodes keys and values, then url-encodes the whole
  // key=value string again as the `metadata` query parameter.
  const metadata = { 'note key': 'hello world & more=yes', path: '/a/b?c#d', run: RUN }
  const sbx = await srv.create({ metadata, timeoutMs: 120_000 })
  try {
    assert.deepEqual((await sbx.getInfo()).metadata, metadata)
    const { items } = await listAll({ query: { metadata: { 'note key': 'hello world & more=yes', path: '/a/b?c#d' } } })
    assert.deepEqual(items.map((s) => s.sandboxId), [sbx.sandboxId])
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('setTimeout moves endAt', async () => {
  const sbx = await srv.create({ timeoutMs: 60_000 })
  try {
    const info1 = await sbx.getInfo()
    near(info1.endAt.getTime() - info1.startedAt.getTime(), 60_000, 5000, 'initial endAt - startedAt')

    let t = Date.now()
    await sbx.setTimeout(600_000)
    const info2 = await sbx.getInfo()
    assert.ok(info2.endAt > info1.endAt, `endAt ${info2.endAt.toISOString()} not after ${info1.endAt.toISOString()}`)
    near(info2.endAt.getTime(), t + 600_000, 5000, 'endAt after setTimeout(600s)')
    assert.equal(info2.startedAt.getTime(), info1.startedAt.getTime(), 'startedAt must not change')

    // It can also shorten the timeout; the static form works too.
    t = Date.now()
    await Sandbox.setTimeout(sbx.sandboxId, 90_000)
    const info3 = await sbx.getInfo()
    near(info3.endAt.getTime(), t + 90_000, 5000, 'endAt after setTimeout(90s)')
    assert.equal(info3.state, 'running')
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('a sandbox is killed when its timeout expires', async () => {
  const sbx = await srv.create({ timeoutMs: 4000 })
  try {
    const info = await sbx.getInfo()
    near(info.endAt.getTime() - info.startedAt.getTime(), 4000, 1500, 'endAt - startedAt')
    await waitFor(async () => {
      try {
        await Sandbox.getInfo(sbx.sandboxId)
        return false
      } catch (err) {
        if (err instanceof SandboxNotFoundError) return true
        throw err
      }
    }, { timeoutMs: 20_000, intervalMs: 500, what: 'the expired sandbox to disappear' })
    assert.equal(await sbx.isRunning(), false)
    const { items } = await listAll()
    assert.ok(!items.some((s) => s.sandboxId === sbx.sandboxId), 'expired sandbox still listed')
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('Sandbox.connect to a running sandbox', async () => {
  const sbx = await srv.create({ timeoutMs: 60_000 })
  try {
    const marker = randomTag(16)
    await sbx.commands.run(`echo ${marker} > /tmp/marker`)

    const t = Date.now()
    const same = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
    assert.ok(same instanceof Sandbox)
    assert.equal(same.sandboxId, sbx.sandboxId)
    const r = await same.commands.run('cat /tmp/marker; hostname')
    assert.equal(r.stdout, `${marker}\n${sbx.sandboxId}\n`)

    // connect with a timeout extends the sandbox's life.
    const info = await same.getInfo()
    near(info.endAt.getTime(), t + 300_000, 5000, 'endAt after connect(timeoutMs: 300s)')

    // The instance method works as well.
    const again = await sbx.connect()
    assert.equal(again.sandboxId, sbx.sandboxId)
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('kill, then getInfo / connect / setTimeout report not found', async () => {
  const sbx = await srv.create({ timeoutMs: 60_000 })
  let killed = false
  try {
    assert.equal(await sbx.kill(), true)
    killed = true
    srv.sandboxes.delete(sbx.sandboxId)

    const e1 = await rejectsWith(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError, 'getInfo after kill')
    assert.ok(e1 instanceof NotFoundError && e1 instanceof SandboxError)
    await rejectsWith(sbx.getInfo(), SandboxNotFoundError, 'instance getInfo after kill')
    await rejectsWith(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError, 'connect after kill')
    await rejectsWith(sbx.setTimeout(60_000), SandboxNotFoundError, 'setTimeout after kill')

    // A second kill finds nothing.
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    // envd is gone: the proxy answers 502, which the SDK reads as "not running".
    assert.equal(await sbx.isRunning(), false)
    await assert.rejects(sbx.commands.run('true', { requestTimeoutMs: 10_000 }), SandboxError)

    const res = await srv.api('GET', `/sandboxes/${sbx.sandboxId}`)
    assert.equal(res.status, 404)
    assert.deepEqual(Object.keys(res.json).sort(), ['code', 'message'])
    assert.equal(res.json.code, 404)
  } finally {
    if (!killed) await srv.kill(sbx)
  }
})

srv.test('killing a sandbox ends a command in flight promptly', async () => {
  const sbx = await srv.create({ timeoutMs: 60_000 })
  try {
    let started = false
    const run = sbx.commands.run('echo started; sleep 60', { onStdout: () => { started = true } })
    run.catch(() => {}) // observed below
    await waitFor(() => started, { timeoutMs: 10_000, what: 'the command to start' })
    const t = performance.now()
    assert.equal(await sbx.kill(), true)
    srv.sandboxes.delete(sbx.sandboxId)
    await assert.rejects(run, SandboxError)
    assert.ok(performance.now() - t < 10_000, `the command's run() settled ${performance.now() - t} ms after the kill`)
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('unknown sandbox id: not found everywhere', async () => {
  const id = 'nosuch' + randomTag(14)
  await rejectsWith(Sandbox.getInfo(id), SandboxNotFoundError, 'getInfo')
  await rejectsWith(Sandbox.connect(id), SandboxNotFoundError, 'connect')
  await rejectsWith(Sandbox.setTimeout(id, 30_000), SandboxNotFoundError, 'setTimeout')
  await rejectsWith(Sandbox.getMetrics(id), SandboxNotFoundError, 'getMetrics')
  assert.equal(await Sandbox.kill(id), false)
})

srv.test('wrong API key: AuthenticationError, and nothing is created', async () => {
  const before = (await srv.api('GET', '/v2/sandboxes')).json.length
  await rejectsWith(Sandbox.create({ apiKey: WRONG_KEY, timeoutMs: 30_000 }), AuthenticationError, 'create')
  await rejectsWith(Sandbox.list({ apiKey: WRONG_KEY }).nextItems(), AuthenticationError, 'list')
  await rejectsWith(Sandbox.getInfo('whatever', { apiKey: WRONG_KEY }), AuthenticationError, 'getInfo')
  await rejectsWith(Sandbox.kill('whatever', { apiKey: WRONG_KEY }), AuthenticationError, 'kill')
  await rejectsWith(Sandbox.connect('whatever', { apiKey: WRONG_KEY }), AuthenticationError, 'connect')

  for (const key of [WRONG_KEY, null, '', srv.apiKey + '0', srv.apiKey.toUpperCase()]) {
    const res = await srv.api('POST', '/v2/sandboxes', { key, body: { templateID: 'base' } })
    assert.equal(res.status, 401, `key ${JSON.stringify(key)}: ${res.status} ${res.text}`)
    assert.equal(res.json?.code, 401)
    assert.equal(typeof res.json?.message, 'string')
  }
  assert.equal((await srv.api('GET', '/v2/sandboxes')).json.length, before)
})

srv.test('getMetrics of a running sandbox', async () => {
  const sbx = await srv.create({ timeoutMs: 60_000 })
  try {
    const metrics = await sbx.getMetrics()
    assert.ok(Array.isArray(metrics) && metrics.length >= 1, `metrics ${JSON.stringify(metrics)}`)
    const m = metrics.at(-1)
    console.error(`# metrics: ${JSON.stringify(m)}`)
    assert.ok(m.timestamp instanceof Date && !Number.isNaN(m.timestamp.getTime()))
    assert.ok(m.cpuCount > 0, `cpuCount ${m.cpuCount}`)
    assert.ok(m.memTotal > 0, `memTotal ${m.memTotal}`)
    assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal, `memUsed ${m.memUsed} of ${m.memTotal}`)
    // A percentage of the sandbox's CPUs, so 0-100 (the server divides by cpuCount).
    assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, `cpuUsedPct ${m.cpuUsedPct} (cpuCount ${m.cpuCount})`)
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('metrics history every 5 s and the log of lifecycle and process events, also after the kill', { timeout: 60_000 }, async () => {
  const sbx = await srv.create({ timeoutMs: 60_000 })
  let killed = false
  try {
    await sbx.commands.run('echo marker-$((6*7)) && dd if=/dev/urandom of=/home/user/blob bs=1M count=20 status=none')
    await sbx.commands.run('exit 3').catch(() => {})
    await new Promise((r) => setTimeout(r, 11_000))
    const metrics = await sbx.getMetrics()
    assert.ok(metrics.length >= 3, `${metrics.length} samples after 11 s: ${JSON.stringify(metrics)}`)
    for (let i = 1; i < metrics.length; i++) {
      const gap = metrics[i].timestamp - metrics[i - 1].timestamp
      assert.ok(gap > 0 && gap <= 6000, `samples ${i - 1} and ${i} are ${gap} ms apart`)
    }
    assert.ok(metrics.at(-1).diskUsed >= 20 << 20, `diskUsed ${metrics.at(-1).diskUsed} after writing 20 MiB`)
    const since = await sbx.getMetrics({ start: new Date(metrics.at(-1).timestamp.getTime() - 1000) })
    assert.ok(since.length >= 1 && since.length < metrics.length, `start= gave ${since.length} of ${metrics.length}`)
    const many = (await srv.api('GET', `/sandboxes/metrics?sandbox_ids=${sbx.sandboxId},nosuchsandbox`)).json
    assert.deepEqual(Object.keys(many.sandboxes), [sbx.sandboxId])

    await sbx.kill()
    killed = true
    srv.sandboxes.delete(sbx.sandboxId)
    const res = await srv.api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs`)
    assert.equal(res.status, 200, res.text)
    const logs = res.json.logs
    const messages = logs.map((l) => l.message)
    assert.ok(messages.includes('sandbox created') && messages.indexOf('sandbox created') < messages.indexOf('process started'), messages.join(', '))
    assert.equal(messages.at(-1), 'sandbox killed', messages.join(', '))
    const started = logs.filter((l) => l.message === 'process started')
    assert.ok(started.some((l) => l.fields.args.includes('marker-')), JSON.stringify(started))
    assert.ok(logs.some((l) => l.message === 'process ended' && l.fields.exit_code === '3'), JSON.stringify(logs))
    // As times, not strings: RFC 3339 drops trailing zeros of the fraction.
    for (let i = 1; i < logs.length; i++) assert.ok(Date.parse(logs[i].timestamp) >= Date.parse(logs[i - 1].timestamp), 'logs out of order')

    const found = (await srv.api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs?search=marker&limit=5`)).json.logs
    assert.equal(found.length, 1, JSON.stringify(found))
    const last = (await srv.api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs?direction=backward&limit=1`)).json.logs
    assert.equal(last[0].message, 'sandbox killed')
    const cursor = Date.parse(found[0].timestamp)
    const after = (await srv.api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs?cursor=${cursor}`)).json.logs
    assert.ok(after.length < logs.length && Date.parse(after[0].timestamp) >= Date.parse(found[0].timestamp))
    assert.equal((await srv.api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs?level=error`)).json.logs.length, 0)
    assert.equal((await srv.api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs?level=loud`)).status, 400)
    assert.equal((await srv.api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs?direction=sideways`)).status, 400)
    assert.equal((await srv.api('GET', '/v2/sandboxes/nosuchsandbox/logs')).status, 404)
  } finally {
    if (!killed) await srv.kill(sbx)
  }
})

srv.test("lifecycle onTimeout 'pause' with autoResume: the timeout pauses it, and traffic resumes it", async () => {
  const sbx = await srv.create({ timeoutMs: 4_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  try {
    let info = await Sandbox.getInfo(sbx.sandboxId)
    assert.deepEqual(info.lifecycle, { onTimeout: 'pause', autoResume: true })
    await sbx.files.write('/home/user/kept.txt', 'through the pause')
    await waitFor(async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused',
      { timeoutMs: 20_000, intervalMs: 250, what: 'the timed-out sandbox to be paused' })
    // Plain traffic, no connect: the sandbox resumes and answers.
    const r = await sbx.commands.run('cat /home/user/kept.txt')
    assert.equal(r.stdout, 'through the pause')
    info = await Sandbox.getInfo(sbx.sandboxId)
    assert.equal(info.state, 'running')
  } finally {
    await srv.kill(sbx)
  }
})

srv.test("onTimeout 'pause' without autoResume: traffic does not resume it", async () => {
  const sbx = await srv.create({ timeoutMs: 3_000, lifecycle: { onTimeout: 'pause' } })
  try {
    assert.deepEqual((await Sandbox.getInfo(sbx.sandboxId)).lifecycle, { onTimeout: 'pause', autoResume: false })
    await waitFor(async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused',
      { timeoutMs: 20_000, intervalMs: 250, what: 'the timed-out sandbox to be paused' })
    await assert.rejects(sbx.commands.run('true'), 'a paused sandbox answered without being resumed')
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
  } finally {
    await srv.kill(sbx)
  }
})

// Restarts of the server through the e2b SDK: a kill -9 or a SIGTERM of
// `aenv server` does not stop sandboxes. Commands keep running, a stream
// the restart cut ends with an error, commands.connect(pid) re-attaches,
// files and timeouts are as they were.

import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { useServer, waitFor, sleep } from './lib/server.mjs'

const srv = useServer({ tag: 'zqrst', cidr: '10.249.0.0/16', portHint: 18170, onStop: 'keep' })

function ticks(chunks) {
  return [...chunks.join('').matchAll(/tick(\d+)\n/g)].map((m) => Number(m[1]))
}

srv.test('a running command survives kill -9 and SIGTERM of the server; commands.connect re-attaches', async () => {
  const sbx = await srv.create({ timeoutMs: 600_000 })
  await sbx.files.write('/home/user/kept.txt', 'kept across restarts')
  const seen = []
  const h = await sbx.commands.run('for i in $(seq 1 3000); do echo tick$i; sleep 0.1; done', {
    background: true,
    timeoutMs: 0,
    onStdout: (d) => seen.push(d),
  })
  const pid = h.pid
  try {
    await waitFor(() => ticks(seen).length >= 3, { timeoutMs: 10_000, what: 'output before the restart' })
    const cut = h.wait().then(() => 'ended', (err) => err)

    await srv.restart('SIGKILL')
    const ended = await Promise.race([cut, sleep(15_000).then(() => 'still open')])
    assert.ok(ended instanceof Error, `the stream cut by the restart: ${ended}`)
    const lastBefore = Math.max(...ticks(seen))

    for (const signal of ['SIGKILL', 'SIGTERM']) {
      if (signal === 'SIGTERM') await srv.restart('SIGTERM')
      const again = []
      const h2 = await sbx.commands.connect(pid, { onStdout: (d) => again.push(d), timeoutMs: 0 })
      assert.equal(h2.pid, pid)
      await waitFor(() => ticks(again).length >= 2, { timeoutMs: 10_000, what: `output after the ${signal} restart` })
      // The same process, counting on: not a new one starting over.
      assert.ok(Math.min(...ticks(again)) > lastBefore, `ticks after ${signal}: ${ticks(again).slice(0, 3)} after ${lastBefore}`)
      await h2.disconnect()
    }

    assert.equal(await sbx.files.read('/home/user/kept.txt'), 'kept across restarts')
    const info = await Sandbox.getInfo(sbx.sandboxId)
    assert.equal(info.state, 'running')
    const listed = await Sandbox.list().nextItems()
    assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
  } finally {
    await sbx.commands.kill(pid).catch(() => {})
  }
})

srv.test('a sandbox that times out while the server is down is ended once it is back', async () => {
  const sbx = await srv.create({ timeoutMs: 3_000 })
  await srv.restart('SIGKILL', { downMs: 4_000 })
  await waitFor(async () => !(await Sandbox.list().nextItems()).some((s) => s.sandboxId === sbx.sandboxId), {
    timeoutMs: 15_000,
    what: 'the timed-out sandbox to be gone',
  })
})

// Snapshots, pause/resume and fork through the e2b SDK: a sandbox's whole
// state (files, processes, memory) survives a pause, and forks are
// independent copies.

import assert from 'node:assert/strict'
import fs from 'node:fs'
import { Sandbox } from 'e2b'
import { useServer, waitFor } from './lib/server.mjs'

const srv = useServer({ tag: 'zqsnap', cidr: '10.246.0.0/16', portHint: 18160 })

// A background process that counts in memory and publishes the count: a
// resume that lost memory would start again from 1.
const COUNTER = `nohup python3 -c '
import os, time
i = 0
while True:
    i += 1
    open("/tmp/c.tmp", "w").write(str(i))
    os.rename("/tmp/c.tmp", "/tmp/counter")
    time.sleep(0.05)
' >/dev/null 2>&1 &
sleep 0.5`

async function counter(sbx) {
  return Number((await sbx.commands.run('cat /tmp/counter')).stdout.trim())
}

/** Host processes whose command line names the sandbox. */
function hostProcesses(id) {
  let n = 0
  for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      if (fs.readFileSync(`/proc/${pid}/cmdline`).includes(id)) n++
    } catch {}
  }
  return n
}

srv.test('pause with keepMemory: false keeps the files (deletions too) and resumes by booting afresh', async () => {
  const sbx = await srv.create({ envs: { KEPT_ENV: 'from the create' } })
  try {
    await sbx.files.write('/home/user/notes.txt', 'kept across the reboot')
    await sbx.commands.run('sudo rm /etc/issue && mkdir -p /home/user/d/e && echo deep > /home/user/d/e/f')
    await sbx.commands.run('sleep 600', { background: true })
    await Sandbox.pause(sbx.sandboxId, { keepMemory: false })
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
    const back = await Sandbox.connect(sbx.sandboxId)
    assert.equal(await back.files.read('/home/user/notes.txt'), 'kept across the reboot')
    assert.equal((await back.commands.run('cat /home/user/d/e/f; stat -c %U /home/user/notes.txt')).stdout, 'deep\nuser\n')
    assert.equal((await back.commands.run('test -e /etc/issue').catch((e) => e)).exitCode, 1, 'a deleted file came back')
    assert.equal((await back.commands.run('pgrep -f "sleep 600"').catch((e) => e)).exitCode, 1, 'a process survived a pause without memory')
    assert.equal((await back.commands.run('echo "$KEPT_ENV"')).stdout, 'from the create\n')
    const logs = (await srv.api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs?search=afresh`)).json.logs
    assert.equal(logs.length, 1, JSON.stringify(logs))
  } finally {
    await srv.kill(sbx)
  }
})

srv.test("connect with onResume: 'reboot' boots a sandbox paused with its memory afresh, files kept", async () => {
  const sbx = await srv.create({ envs: { KEPT_ENV: 'rebooted' } })
  try {
    await sbx.files.write('/home/user/r.txt', 'written before the pause')
    await sbx.commands.run('sleep 600', { background: true })
    await sbx.pause()
    const back = await Sandbox.connect(sbx.sandboxId, { onResume: 'reboot' })
    assert.equal(await back.files.read('/home/user/r.txt'), 'written before the pause')
    assert.equal((await back.commands.run('pgrep -f "sleep 600"').catch((e) => e)).exitCode, 1, 'a process survived the reboot')
    assert.equal((await back.commands.run('echo "$KEPT_ENV"')).stdout, 'rebooted\n')
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('pause releases the sandbox; connect resumes it with files, processes and memory', async () => {
  const sbx = await srv.create()
  try {
    await sbx.files.write('/home/user/note.txt', 'before pause')
    await sbx.commands.run(COUNTER, { timeoutMs: 0 })
    const before = await counter(sbx)
    assert.ok(before > 0)

    assert.equal(await sbx.pause(), true)
    // The pause answers once the state is saved; what ran the sandbox is
    // released right after.
    await waitFor(() => hostProcesses(sbx.sandboxId) === 0, { timeoutMs: 5_000, intervalMs: 20, what: 'a paused sandbox to keep no host process' })
    const info = await Sandbox.getInfo(sbx.sandboxId)
    assert.equal(info.state, 'paused')
    const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
    assert.ok(paused.some((s) => s.sandboxId === sbx.sandboxId), 'listed among paused sandboxes')
    assert.equal(await Sandbox.pause(sbx.sandboxId), false, 'pausing a paused sandbox reports false (409)')

    const resumed = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
    assert.equal(await resumed.files.read('/home/user/note.txt'), 'before pause')
    const after = await counter(resumed)
    assert.ok(after >= before, `counter went from ${before} to ${after}: memory lost`)
    await waitFor(async () => (await counter(resumed)) > after, { what: 'counter to keep counting after resume' })
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('fork: children inherit state but are independent; the parent keeps running', async () => {
  const parent = await srv.create()
  const children = []
  try {
    await parent.files.write('/tmp/who', 'parent')
    await parent.commands.run(COUNTER, { timeoutMs: 0 })
    const atFork = await counter(parent)

    const results = await Sandbox.fork(parent.sandboxId, { count: 4, timeoutMs: 120_000 })
    assert.equal(results.length, 4)
    for (const r of results) {
      assert.ok(!(r instanceof Error), `a child failed: ${r}`)
      srv.track(r.sandboxId)
      children.push(r)
    }
    assert.equal(new Set(children.map((c) => c.sandboxId)).size, 4)

    await Promise.all(children.map((c) => c.files.write('/tmp/who', c.sandboxId)))
    for (const c of children) {
      assert.equal(await c.files.read('/tmp/who'), c.sandboxId)
      assert.ok((await counter(c)) >= atFork, 'child inherited the in-memory counter')
    }
    assert.equal(await parent.files.read('/tmp/who'), 'parent')
    assert.ok((await counter(parent)) >= atFork)
  } finally {
    for (const c of children) await srv.kill(c)
    await srv.kill(parent)
  }
})

srv.test('a snapshot is a template: create from its id', async () => {
  const sbx = await srv.create()
  let snapshotId
  try {
    await sbx.files.write('/home/user/marker', 'snap')
    const snap = await sbx.createSnapshot()
    snapshotId = snap.snapshotId
    assert.ok(snapshotId)
    // The source keeps running.
    assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')
    const child = await Sandbox.create(snapshotId, { timeoutMs: 120_000 })
    srv.track(child.sandboxId)
    try {
      assert.equal(await child.files.read('/home/user/marker'), 'snap')
    } finally {
      await srv.kill(child)
    }
  } finally {
    if (snapshotId) await srv.api('DELETE', `/templates/${snapshotId}`)
    await srv.kill(sbx)
  }
})

// Many sandboxes at once: created in parallel, each one its own machine
// (hostname, environment, filesystem), all listed, all killed.

import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { useServer, randomTag } from './lib/server.mjs'

const srv = useServer({ tag: 'zqpar', cidr: '10.245.0.0/16', portHint: 18180 })
const N = 10

async function listAll(query) {
  const p = Sandbox.list({ query })
  const out = []
  while (p.hasNext) out.push(...(await p.nextItems()))
  return out
}

srv.test(`${N} sandboxes created in parallel are each their own machine`, { timeout: 240_000 }, async () => {
  const batch = randomTag()
  const t0 = performance.now()
  const settled = await Promise.allSettled(Array.from({ length: N }, (_, i) =>
    srv.create({ metadata: { batch, idx: String(i) }, envs: { IDX: String(i) }, timeoutMs: 300_000 })))
  const sbxs = settled.filter((s) => s.status === 'fulfilled').map((s) => s.value)
  const createMs = performance.now() - t0
  try {
    const failures = settled.filter((s) => s.status === 'rejected').map((s) => s.reason?.message)
    assert.deepEqual(failures, [], `${failures.length} of ${N} creates failed`)
    console.error(`# created ${N} sandboxes in parallel in ${createMs} ms`)
    const ids = sbxs.map((s) => s.sandboxId)
    assert.equal(new Set(ids).size, N, 'sandbox ids are not unique')

    // Each sandbox: its own hostname and env, and its own /home/user.
    const outs = await Promise.all(sbxs.map((s, i) =>
      s.commands.run(`echo "$IDX $(hostname)"; echo ${s.sandboxId} > /home/user/who; sleep 0.5; cat /home/user/who; ls /home/user | grep -c '^who$'`)
        .then((r) => ({ i, r }))))
    for (const { i, r } of outs) {
      assert.equal(r.stdout, `${i} ${ids[i]}\n${ids[i]}\n1\n`, `sandbox ${i} (${ids[i]})`)
    }

    // Files written through the SDK stay in their own sandbox.
    await Promise.all(sbxs.map((s) => s.files.write('/tmp/own.txt', s.sandboxId)))
    const reads = await Promise.all(sbxs.map((s) => s.files.read('/tmp/own.txt')))
    assert.deepEqual(reads, ids)

    const listed = await listAll({ metadata: { batch } })
    assert.deepEqual(listed.map((s) => s.sandboxId).sort(), [...ids].sort())
    for (const s of listed) assert.equal(s.metadata.batch, batch)
    assert.deepEqual(listed.map((s) => Number(s.metadata.idx)).sort((a, b) => a - b), Array.from({ length: N }, (_, i) => i))

    const killed = await Promise.all(sbxs.map((s) => s.kill()))
    assert.deepEqual(killed, Array(N).fill(true))
    for (const s of sbxs) srv.sandboxes.delete(s.sandboxId)
    assert.deepEqual(await listAll({ metadata: { batch } }), [])
  } finally {
    await Promise.all(sbxs.map((s) => srv.kill(s)))
  }
})

srv.test('a new sandbox does not see files of an earlier one (no writes into the template)', async () => {
  const name = `leak-${randomTag(8)}`
  let a = await srv.create({ timeoutMs: 120_000 })
  let b
  try {
    await a.commands.run(`echo a > /home/user/${name}; echo a > /opt/${name}`, { user: 'root' })
    b = await srv.create({ timeoutMs: 120_000 })
    assert.equal(await b.files.exists(`/home/user/${name}`), false)
    assert.equal(await b.files.exists(`/opt/${name}`), false)
    await srv.kill(a)
    a = undefined
    const c = await srv.create({ timeoutMs: 120_000 })
    try {
      assert.equal(await c.files.exists(`/opt/${name}`), false)
    } finally {
      await srv.kill(c)
    }
  } finally {
    await srv.kill(a)
    await srv.kill(b)
  }
})

srv.test('parallel kills and creates interleave cleanly', { timeout: 180_000 }, async () => {
  const batch = randomTag()
  const first = await Promise.all(Array.from({ length: 4 }, () => srv.create({ metadata: { batch }, timeoutMs: 120_000 })))
  let second = []
  try {
    const [, created] = await Promise.all([
      Promise.all(first.map((s) => s.kill())),
      Promise.all(Array.from({ length: 4 }, () => srv.create({ metadata: { batch }, timeoutMs: 120_000 }))),
    ])
    second = created
    for (const s of first) srv.sandboxes.delete(s.sandboxId)
    const listed = await listAll({ metadata: { batch } })
    assert.deepEqual(listed.map((s) => s.sandboxId).sort(), second.map((s) => s.sandboxId).sort())
    const outs = await Promise.all(second.map((s) => s.commands.run('hostname')))
    assert.deepEqual(outs.map((r) => r.stdout.trim()), second.map((s) => s.sandboxId))
  } finally {
    await Promise.all([...first, ...second].map((s) => srv.kill(s)))
  }
})

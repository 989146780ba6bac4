// A team's quota across API servers: two servers on one etcd, each with its
// own cache of the cluster's sandboxes, racing for a team's last slot. The
// quota holds only if the servers agree through the store, not their
// caches: every round, creates fired at both at once give exactly one
// sandbox. The cases run in a child that trusts the cluster's CA
// (quotarace.test.mjs, lib/cluster-ca.mjs).

import assert from 'node:assert/strict'
import { useCluster } from './lib/cluster.mjs'
import { rawRequest, waitFor } from './lib/server.mjs'

const cl = useCluster({ tag: 'zqtq', subnet: '10.250.9', nodes: 1, servers: 2 })

const ROUNDS = 5
const PER_SERVER = 3

cl.test('two servers racing for the last slot of a quota of 1 give exactly one sandbox, round after round', async () => {
  const t = await cl.api('POST', '/teams', { body: { id: 'solo', maxSandboxes: 1 } })
  assert.equal(t.status, 201, t.text)
  const k = await cl.api('POST', '/keys', { body: { name: 'solo-key', team: 'solo' } })
  assert.equal(k.status, 201, k.text)
  const key = k.json.key
  const as = (s, method, path, body) => rawRequest({ host: s.host, port: s.port, method, path, headers: { 'X-API-KEY': key }, body, ca: cl.ca })

  // Both servers know the key and the quota (through their watches) before
  // the race starts.
  for (const s of cl.servers) {
    await waitFor(async () => {
      const r = await as(s, 'GET', '/teams/solo')
      return r.status === 200 && r.json.maxSandboxes === 1
    }, { timeoutMs: 10_000, what: `${s.name} to know team solo and its quota` })
  }

  for (let round = 1; round <= ROUNDS; round++) {
    const results = await Promise.all(cl.servers.flatMap((s) =>
      Array.from({ length: PER_SERVER }, () => as(s, 'POST', '/v2/sandboxes', { templateID: 'base', timeout: 120 }))))
    const won = results.filter((r) => r.status === 201)
    for (const r of won) cl.sandboxes.add(r.json.sandboxID)
    const summary = results.map((r) => `${r.status}${r.status === 201 ? '' : ` ${r.json?.message}`}`).join('; ')
    assert.equal(won.length, 1, `round ${round}: ${won.length} creates won the one slot (${summary})`)
    for (const r of results.filter((r) => r.status !== 201)) {
      assert.equal(r.status, 429, `round ${round}: ${summary}`)
      assert.match(r.json.message, /\bof its 1\b/, `round ${round}: the refusal does not name the limit: ${r.json.message}`)
    }
    const id = won[0].json.sandboxID
    const del = await cl.api('DELETE', `/sandboxes/${id}`)
    assert.equal(del.status, 204, del.text)
    cl.sandboxes.delete(id)
    // The slot is free again once both servers have seen the kill.
    for (const s of cl.servers) {
      await waitFor(async () => (await as(s, 'GET', '/teams/solo')).json?.usage?.running === 0,
        { timeoutMs: 10_000, what: `${s.name} to count team solo's sandbox gone` })
    }
  }
  // Nothing was left running by a refused create.
  const listed = (await cl.api('GET', '/v2/sandboxes?team=solo')).json
  assert.deepEqual(listed, [])
})

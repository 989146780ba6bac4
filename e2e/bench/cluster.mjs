// Cluster benchmark (outside `make test`): creates per second and create
// latency p50/p95 at concurrency 30 through the e2b SDK, on one node and
// on three, in one run, each node a node agent in its own network
// namespace behind one pure API server (see ../lib/cluster.mjs). On one
// 2-core machine this measures the cluster's correctness and overhead,
// not scaling: the three nodes share the same two cores.
//
//   cd e2e && AENV_BIN_DIR=$PWD/../bin AENV_BASE_ROOTFS=/var/cache/aenv/base-rootfs node bench/cluster.mjs [rounds]

import { Sandbox } from 'e2b'
import { TestCluster } from '../lib/cluster.mjs'

const CONCURRENCY = 30
const rounds = Number(process.argv[2] ?? 3)

function pct(xs, q) {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor(q * (s.length - 1)))]
}

async function measure(nodes) {
  const cl = new TestCluster({ tag: 'zqbh', subnet: '10.250.8', nodes, servers: 1 })
  await cl.start()
  try {
    for (let i = 0; i < 3; i++) await (await cl.create()).kill() // warm the page cache
    const lat = []
    let wall = 0
    const perNode = new Map()
    for (let r = 0; r < rounds; r++) {
      const t0 = performance.now()
      const made = await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
        const s = performance.now()
        const sbx = await Sandbox.create({ ...cl.via(0), timeoutMs: 300_000 })
        lat.push(performance.now() - s)
        return sbx
      }))
      wall += performance.now() - t0
      for (const sbx of made) {
        const n = await cl.nodeOf(sbx.sandboxId)
        perNode.set(n, (perNode.get(n) ?? 0) + 1)
      }
      await Promise.all(made.map((sbx) => sbx.kill()))
    }
    return { nodes, creates: lat.length, perSec: lat.length / (wall / 1000), p50: pct(lat, 0.5), p95: pct(lat, 0.95), perNode }
  } finally {
    await cl.cleanup()
  }
}

const results = []
for (const n of [1, 3]) results.push(await measure(n))
console.log(`creates at concurrency ${CONCURRENCY}, ${rounds} rounds each, through one API server`)
console.log('nodes  creates  creates/s  p50 ms  p95 ms  per node')
for (const r of results) {
  console.log(`${String(r.nodes).padStart(5)}  ${String(r.creates).padStart(7)}  ${r.perSec.toFixed(1).padStart(9)}  ${r.p50.toFixed(0).padStart(6)}  ${r.p95.toFixed(0).padStart(6)}  ${[...r.perNode].map(([k, v]) => `${k}:${v}`).join(' ')}`)
}
console.log(`ratio 3 nodes / 1 node: creates/s x${(results[1].perSec / results[0].perSec).toFixed(2)}, p50 x${(results[1].p50 / results[0].p50).toFixed(2)}`)

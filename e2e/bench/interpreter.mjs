// Code-interpreter benchmark (outside `make test`), through the unmodified
// @e2b/code-interpreter SDK against one local server:
//   - runCode('1+1') round trip beside commands.run('true'), same sandbox;
//   - create to first runCode result, from the warm pool of the template
//     and without a pool (a restore of the template's ready snapshot).
//
//   cd e2e && AENV_BIN_DIR=$PWD/../bin AENV_BASE_ROOTFS=/var/cache/aenv/base-rootfs \
//     AENV_CODE_INTERPRETER_ROOTFS=/var/cache/aenv/code-interpreter-rootfs node bench/interpreter.mjs [n]

import { Sandbox } from '@e2b/code-interpreter'
import { TestServer, sleep } from '../lib/server.mjs'

const n = Number(process.argv[2] ?? 30)
const rootfs = process.env.AENV_CODE_INTERPRETER_ROOTFS
if (!rootfs) throw new Error('AENV_CODE_INTERPRETER_ROOTFS is not set (make code-interpreter)')

function pct(xs, q) {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor(q * (s.length - 1)))]
}
const fmt = (xs) => `p50 ${pct(xs, 0.5).toFixed(1)} ms  p95 ${pct(xs, 0.95).toFixed(1)} ms  (n=${xs.length})`

async function firstResults(srv, rounds, settleMs) {
  const out = []
  for (let i = 0; i < rounds; i++) {
    await sleep(settleMs) // let the pool refill
    const t0 = performance.now()
    const sbx = await Sandbox.create({ timeoutMs: 120_000 })
    const r = await sbx.runCode('1+1')
    out.push(performance.now() - t0)
    if (r.text !== '2') throw new Error(`runCode('1+1') gave ${r.text}`)
    await sbx.kill()
  }
  return out
}

async function withServer(args, fn) {
  const srv = new TestServer({ tag: 'zqbci', cidr: '10.248.0.0/16', portHint: 18195, args: ['--code-interpreter-rootfs', rootfs, ...args] })
  await srv.start()
  try {
    // The first create makes the template's ready snapshot.
    await (await Sandbox.create({ timeoutMs: 120_000 })).kill()
    return await fn(srv)
  } finally {
    await srv.cleanup()
  }
}

const pooled = await withServer([], async () => {
  const sbx = await Sandbox.create({ timeoutMs: 300_000 })
  const run = [], cmd = []
  for (let i = 0; i < 5; i++) { await sbx.runCode('1+1'); await sbx.commands.run('true') } // warm up
  for (let i = 0; i < n; i++) {
    let t = performance.now(); await sbx.runCode('1+1'); run.push(performance.now() - t)
    t = performance.now(); await sbx.commands.run('true'); cmd.push(performance.now() - t)
  }
  await sbx.kill()
  return { run, cmd, first: await firstResults(undefined, Math.min(n, 15), 2500) }
})
const cold = await withServer(['--warm-pool', '0'], () => firstResults(undefined, Math.min(n, 10), 200))

console.log(`runCode('1+1') round trip:      ${fmt(pooled.run)}`)
console.log(`commands.run('true') round trip: ${fmt(pooled.cmd)}`)
console.log(`ratio runCode / commands.run (p50): x${(pct(pooled.run, 0.5) / pct(pooled.cmd, 0.5)).toFixed(2)}`)
console.log(`create to first runCode result, warm pool:              ${fmt(pooled.first)}`)
console.log(`create to first runCode result, no pool (ready restore): ${fmt(cold)}`)

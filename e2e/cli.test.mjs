// The official e2b CLI (@e2b/cli from npm, unmodified) against the server,
// through its non-interactive verbs: sandbox list, info, exec (with piped
// stdin and an exit code), logs, metrics, pause, resume and kill, and
// template list. The CLI finds the API in E2B_API_URL and the key in
// E2B_API_KEY (ensureAPIKey in its dist/index.js, before any
// ~/.e2b/config.json, which a scratch HOME keeps out of the way);
// NO_UPDATE_NOTIFIER keeps it from asking the npm registry for updates.

import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { Sandbox } from 'e2b'
import { after } from 'node:test'
import { useServer, waitFor } from './lib/server.mjs'

const srv = useServer({ tag: 'zqcli', cidr: '10.234.0.0/16', portHint: 18175 })
const cli = path.join(path.dirname(fileURLToPath(import.meta.url)), 'node_modules', '@e2b', 'cli', 'dist', 'index.js')
const home = fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-e2e-cli-home-'))
after(() => fs.rmSync(home, { recursive: true, force: true }))

/** Runs `e2b ...args` with stdin, and resolves to { code, stdout, stderr }. */
function e2b(args, { stdin = '', timeoutMs = 60_000 } = {}) {
  return new Promise((resolve, reject) => {
    const env = {
      PATH: process.env.PATH, HOME: home, NO_UPDATE_NOTIFIER: '1', NO_COLOR: '1', FORCE_COLOR: '0',
      E2B_API_URL: process.env.E2B_API_URL, E2B_SANDBOX_URL: process.env.E2B_SANDBOX_URL, E2B_API_KEY: process.env.E2B_API_KEY,
    }
    const p = spawn(process.execPath, [cli, ...args], { env, stdio: ['pipe', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    p.stdout.on('data', (d) => { stdout += d })
    p.stderr.on('data', (d) => { stderr += d })
    const timer = setTimeout(() => { p.kill('SIGKILL'); reject(new Error(`e2b ${args.join(' ')}: no exit within ${timeoutMs} ms; stderr: ${stderr}`)) }, timeoutMs)
    p.on('error', reject)
    p.on('close', (code) => { clearTimeout(timer); resolve({ code, stdout, stderr }) })
    p.stdin.end(stdin)
  })
}

/** e2b ...args, which must exit 0. */
async function ok(args, opts) {
  const r = await e2b(args, opts)
  assert.equal(r.code, 0, `e2b ${args.join(' ')} exited ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`)
  return r
}

/** The JSON lines of a --format json output. */
function jsonLines(out) {
  return out.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l))
}

srv.test('the e2b CLI drives sandboxes: list, info, exec, logs, metrics, pause, resume, kill', { timeout: 180_000 }, async () => {
  const sbx = await srv.create({ metadata: { via: 'cli' } })
  const id = sbx.sandboxId

  assert.match((await ok(['sandbox', 'list'])).stdout, new RegExp(id))
  const info = JSON.parse((await ok(['sandbox', 'info', id, '--format', 'json'])).stdout)
  assert.equal(info.sandboxId, id)
  assert.equal(info.templateId, 'base')
  assert.equal(info.state, 'running')

  const exec = await ok(['sandbox', 'exec', id, 'cat'], { stdin: 'piped into the sandbox\n' })
  assert.equal(exec.stdout, 'piped into the sandbox\n')
  const failed = await e2b(['sandbox', 'exec', id, '--', 'sh', '-c', 'echo to-stderr >&2; exit 3'])
  assert.equal(failed.code, 3, failed.stderr)
  assert.match(failed.stderr, /to-stderr/)

  // The CLI reads GET /sandboxes/{id}/logs and parses each line as JSON.
  const logs = jsonLines((await ok(['sandbox', 'logs', id, '--format', 'json', '--level', 'debug'])).stdout)
  assert.ok(logs.length > 0, 'no log lines')
  for (const l of logs) {
    assert.ok(!Number.isNaN(Date.parse(l.timestamp)), JSON.stringify(l))
    assert.match(l.level, /^(debug|info|warn|error)$/i, JSON.stringify(l))
    assert.equal(typeof l.message, 'string', JSON.stringify(l))
  }

  const metrics = await waitFor(async () => jsonLines((await ok(['sandbox', 'metrics', id, '--format', 'json'])).stdout),
    { timeoutMs: 30_000, intervalMs: 1000, what: 'a metrics line from the CLI' })
  assert.ok(metrics[0].cpuCount >= 1 && metrics[0].memTotal > 0, JSON.stringify(metrics[0]))

  assert.match((await ok(['sandbox', 'pause', id])).stdout, /has been paused/)
  assert.equal((await Sandbox.getInfo(id)).state, 'paused')
  assert.match((await ok(['sandbox', 'resume', id])).stdout, /has been resumed/)
  assert.equal((await Sandbox.getInfo(id)).state, 'running')

  assert.match((await ok(['sandbox', 'kill', id])).stdout, /has been killed/)
  srv.sandboxes.delete(id)
  await assert.rejects(Sandbox.getInfo(id), /not found/i)
  assert.match((await e2b(['sandbox', 'kill', id])).stderr, /wasn't found/)
})

srv.test('the e2b CLI lists templates with their names', async () => {
  const json = JSON.parse((await ok(['template', 'list', '--format', 'json'])).stdout)
  const base = json.find((t) => t.templateID === 'base')
  assert.ok(base, JSON.stringify(json))
  assert.deepEqual(base.aliases, ['base'])
  assert.deepEqual(base.names, ['base'])
  // The table's Template Name column comes from aliases.
  const table = (await ok(['template', 'list'])).stdout
  const row = table.split('\n').find((l) => /\bbase\b/.test(l) && /Public/.test(l))
  assert.ok(row && /base\s+base/.test(row), `no row naming base:\n${table}`)
})

// Test harness: one real `aenv server` per test file, driven through the
// unmodified e2b SDK and raw HTTP.
//
// Usage in a test file:
//
//   import { useServer } from './lib/server.mjs'
//   const srv = useServer({ tag: 'zqlife', cidr: '10.240.0.0/16' })
//   srv.test('does something', async () => { ... })
//
// useServer registers a `before` hook that starts the server (and points the
// SDK at it through E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY) and an
// `after` hook that kills every sandbox still tracked, checks that the server
// lists none, stops the server (SIGTERM; after 30 s SIGQUIT for a goroutine
// dump in the log, then SIGKILL) and checks that it exited with status 0 and
// left no process or mount behind.
//
// Required environment: AENV_BIN_DIR (holding aenv and envd) and
// AENV_BASE_ROOTFS (a built base root filesystem). Missing either is an
// error, never a skip. Optional: AENV_RUNSC, the runsc binary when it is not
// in PATH. Run as root:
//
//   cd e2e && AENV_BIN_DIR=$PWD/../bin AENV_BASE_ROOTFS=/var/cache/aenv/base-rootfs \
//     node --test --test-concurrency=1
//
// A failed test prints the tail of its server's log; the server's temporary
// directory (data, run dir, server.log) is kept when anything failed.

import { execFileSync, spawn } from 'node:child_process'
import fs from 'node:fs'
import http from 'node:http'
import https from 'node:https'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { before, after, test as nodeTest } from 'node:test'
import { Sandbox } from 'e2b'

export const PORT_MIN = 18100
export const PORT_MAX = 18199
const STOP_GRACE_MS = 30_000
const START_TIMEOUT_MS = 90_000

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}

/** A short random lower-case suffix, to tell this run's objects apart. */
export function randomTag(n = 8) {
  let s = ''
  while (s.length < n) s += Math.random().toString(36).slice(2)
  return s.slice(0, n)
}

/** Polls fn until it returns a truthy value or the time is up; what (a string or a function returning one) names it in the error. */
export async function waitFor(fn, { timeoutMs = 10_000, intervalMs = 100, what = 'condition' } = {}) {
  const deadline = performance.now() + timeoutMs
  let last
  for (;;) {
    try {
      const v = await fn()
      if (v) return v
    } catch (err) {
      last = err
    }
    if (performance.now() > deadline) {
      const desc = typeof what === 'function' ? what() : what
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${desc}${last ? `: last error: ${last.message}` : ''}`)
    }
    await sleep(intervalMs)
  }
}

function portIsFree(port) {
  return new Promise((resolve) => {
    const s = net.createServer()
    s.once('error', () => resolve(false))
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)))
  })
}

async function findFreePort(start) {
  const span = PORT_MAX - PORT_MIN + 1
  for (let i = 0; i < span; i++) {
    const port = PORT_MIN + ((start - PORT_MIN + i) % span)
    if (await portIsFree(port)) return port
  }
  throw new Error(`no free port in ${PORT_MIN}-${PORT_MAX}`)
}

/**
 * One raw HTTP/1.1 request with node:http, which sends the path verbatim
 * (no URL normalisation) and lets us set Host.
 * Returns { status, headers, body (Buffer), text, json (or undefined) }.
 */
export function rawRequest({ host = '127.0.0.1', port, method = 'GET', path: reqPath = '/', headers = {}, body, timeoutMs = 30_000, ca }) {
  return new Promise((resolve, reject) => {
    let responded = false
    const hdrs = { ...headers }
    let payload
    if (body !== undefined) {
      payload = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body))
      if (!Object.keys(hdrs).some((h) => h.toLowerCase() === 'content-type')) hdrs['Content-Type'] = 'application/json'
      hdrs['Content-Length'] = payload.length
    }
    // ca: the server speaks https, with a certificate of that CA.
    const req = (ca ? https : http).request(
      { host, port, method, path: reqPath, headers: hdrs, agent: false, setHost: !Object.keys(hdrs).some((h) => h.toLowerCase() === 'host'), ...(ca ? { ca } : {}) },
      (res) => {
        responded = true
        const chunks = []
        res.on('data', (c) => chunks.push(c))
        res.on('error', reject)
        res.on('end', () => {
          const buf = Buffer.concat(chunks)
          const text = buf.toString('utf8')
          let json
          try {
            json = JSON.parse(text)
          } catch {
            json = undefined
          }
          resolve({ status: res.statusCode, headers: res.headers, body: buf, text, json })
        })
      },
    )
    req.setTimeout(timeoutMs, () => req.destroy(new Error(`${method} ${reqPath}: no response within ${timeoutMs} ms`)))
    req.on('error', (err) => {
      // The server may answer (e.g. 413) and close before reading the whole
      // body; a write error after the response started is not the caller's
      // concern (a broken response body errors on res instead).
      if (!responded) reject(err)
    })
    if (payload) req.end(payload)
    else req.end()
  })
}

/** An error with its chain of causes, on one line. */
export function describeError(err) {
  const parts = []
  for (let e = err, i = 0; e && i < 5; e = e.cause, i++) {
    parts.push(`${e?.constructor?.name ?? typeof e}: ${e?.message ?? String(e)}${e?.code ? ` (${e.code})` : ''}`)
  }
  return parts.join(' <- ')
}

/**
 * Tail of a file, for failure reports. A Go goroutine dump (after SIGQUIT)
 * is cut off: it is long, and the file keeps it.
 */
export function tailFile(file, lines = 80) {
  try {
    let text = fs.readFileSync(file, 'utf8')
    const dump = text.indexOf('\nSIGQUIT: quit')
    if (dump >= 0) text = text.slice(0, dump) + `\n(goroutine dump after SIGQUIT: see ${file})`
    return text.split('\n').slice(-lines).join('\n')
  } catch (err) {
    return `(cannot read ${file}: ${err.message})`
  }
}

/** Mount points at or below dir. */
function mountsUnder(dir) {
  const out = []
  for (const line of fs.readFileSync('/proc/self/mounts', 'utf8').split('\n')) {
    const mp = line.split(' ')[1]
    if (mp && (mp === dir || mp.startsWith(dir + '/'))) out.push(mp.replace(/\\040/g, ' '))
  }
  return out
}

/** PIDs whose command line mentions needle (other than ours). */
function pidsMentioning(needle) {
  const out = []
  for (const ent of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(ent) || Number(ent) === process.pid) continue
    try {
      const cmd = fs.readFileSync(`/proc/${ent}/cmdline`, 'utf8').replace(/\0/g, ' ')
      if (cmd.includes(needle)) out.push(`${ent}: ${cmd.trim()}`)
    } catch {
      // gone
    }
  }
  return out
}

/**
 * Fails, saying what to do, unless the binaries, the base root filesystem
 * and root are there: a missing prerequisite is an error, never a skip.
 */
export function checkPrerequisites() {
  const binDir = process.env.AENV_BIN_DIR
  const baseRootfs = process.env.AENV_BASE_ROOTFS
  if (!binDir) throw new Error('AENV_BIN_DIR is not set (it must hold the aenv and envd binaries: `make build`)')
  if (!baseRootfs) throw new Error('AENV_BASE_ROOTFS is not set (it must point at the base root filesystem: `make base`)')
  const bin = path.join(binDir, 'aenv')
  try {
    fs.accessSync(bin, fs.constants.X_OK)
  } catch {
    throw new Error(`${bin} is missing or not executable (run \`make build\`)`)
  }
  if (!fs.existsSync(path.join(binDir, 'envd'))) throw new Error(`${path.join(binDir, 'envd')} is missing (run \`make build\`)`)
  if (!fs.existsSync(path.join(baseRootfs, 'bin', 'bash'))) {
    throw new Error(`base root filesystem ${baseRootfs} is missing or incomplete (no bin/bash; run \`make base\`)`)
  }
  if (process.getuid && process.getuid() !== 0) throw new Error('the e2e tests must run as root (sandboxes run under gVisor)')
}

export class TestServer {
  constructor({ tag, cidr, portHint, onStop = 'kill', args = [] }) {
    if (!/^[a-z]{1,10}$/.test(tag)) throw new Error(`netns tag ${tag} must be 1-10 lower-case letters`)
    this.tag = tag
    this.cidr = cidr
    this.portHint = portHint
    this.onStop = onStop
    this.extraArgs = args
    this.proc = undefined
    this.exit = undefined // { code, signal } once exited
    this.sandboxes = new Set()
    this.envdTokens = []
    this.failed = false
  }

  /** Starts the server once, however many hooks ask. */
  ensureStarted() {
    this.starting ??= this.start().catch((err) => {
      this.failed = true
      throw err
    })
    return this.starting
  }

  async start() {
    checkPrerequisites()
    this.tmp = fs.mkdtempSync(path.join(os.tmpdir(), `aenv-e2e-${this.tag}-`))
    this.dataDir = path.join(this.tmp, 'data')
    this.runDir = path.join(this.tmp, 'run')
    this.logPath = path.join(this.tmp, 'server.log')
    fs.mkdirSync(this.dataDir)
    this.port = await findFreePort(this.portHint ?? PORT_MIN)
    // --https: the server serves a certificate of its cluster's CA on
    // loopback too; this.ca is that CA once it started.
    this.https = this.extraArgs.includes('--https')
    this.url = `${this.https ? 'https' : 'http'}://127.0.0.1:${this.port}`
    await this.launch()
  }

  /**
   * Stops the server with signal (SIGKILL: a crash; SIGTERM: a restart)
   * and starts it again on the same port and directories, as an upgrade
   * or `systemctl restart` would, after downMs without a server.
   */
  async restart(signal = 'SIGKILL', { downMs = 0 } = {}) {
    this.proc.kill(signal)
    await this.exited
    if (signal === 'SIGTERM' && this.exit.code !== 0) {
      throw new Error(`aenv server exited with ${JSON.stringify(this.exit)} after SIGTERM (want code 0)`)
    }
    if (downMs) await sleep(downMs)
    this.exit = undefined
    await this.launch()
  }

  /** Spawns the server on this.port and waits until it answers. */
  async launch() {
    const bin = path.join(process.env.AENV_BIN_DIR, 'aenv')
    const baseRootfs = process.env.AENV_BASE_ROOTFS
    const args = [
      'server',
      '--listen', `127.0.0.1:${this.port}`,
      '--data-dir', this.dataDir,
      '--run-dir', this.runDir,
      '--base-rootfs', baseRootfs,
      '--netns-tag', this.tag,
      '--sandbox-cidr', this.cidr,
      '--log-level', 'debug',
      // Sandboxes outlive a stopped server by default; tests must not
      // leak, so they are killed unless the test restarts the server.
      '--on-stop', this.onStop,
      ...this.extraArgs,
    ]
    // runsc normally comes from PATH (scripts/install-deps.sh puts it in
    // /usr/local/bin); AENV_RUNSC names another one.
    if (process.env.AENV_RUNSC) args.push('--runsc', process.env.AENV_RUNSC)
    const logFd = fs.openSync(this.logPath, 'a')
    const env = { ...process.env }
    delete env.AENV_API_KEY
    // Only the files that ask for the code interpreter get it (args).
    delete env.AENV_CODE_INTERPRETER_ROOTFS
    this.proc = spawn(bin, args, { stdio: ['ignore', logFd, logFd], env })
    fs.closeSync(logFd)
    this.exited = new Promise((resolve) => {
      this.proc.once('exit', (code, signal) => {
        this.exit = { code, signal }
        resolve(this.exit)
      })
    })
    this.proc.once('error', (err) => {
      this.exit = { code: null, signal: null, error: err }
    })

    const deadline = performance.now() + START_TIMEOUT_MS
    for (;;) {
      if (this.exit) {
        throw new Error(`aenv server exited during start-up (${JSON.stringify(this.exit)}); log ${this.logPath}:\n${tailFile(this.logPath)}`)
      }
      try {
        if (this.https) this.ca = fs.readFileSync(path.join(this.dataDir, 'secrets', 'ca.crt'))
        const res = await rawRequest({ port: this.port, path: '/health', timeoutMs: 2000, ca: this.ca })
        if (res.status === 200) break
      } catch {
        // not listening yet
      }
      if (performance.now() > deadline) {
        await this.stop().catch(() => {})
        throw new Error(`aenv server did not answer GET /health with 200 within ${START_TIMEOUT_MS} ms; log ${this.logPath}:\n${tailFile(this.logPath)}`)
      }
      await sleep(200)
    }

    const keyPath = path.join(this.dataDir, 'secrets', 'api-key')
    this.apiKey = fs.readFileSync(keyPath, 'utf8').trim()
    if (!/^e2b_[0-9a-f]+$/.test(this.apiKey)) throw new Error(`${keyPath} holds ${JSON.stringify(this.apiKey)}, not an e2b_<hex> key`)
    process.env.E2B_API_URL = this.url
    process.env.E2B_SANDBOX_URL = this.url
    process.env.E2B_API_KEY = this.apiKey
    delete process.env.E2B_DEBUG
    delete process.env.E2B_DOMAIN
  }

  /** Raw request to the API (with the right key unless `key` is given; key: null sends none). */
  async api(method, reqPath, { body, headers = {}, key } = {}) {
    const h = { ...headers }
    const k = key === undefined ? this.apiKey : key
    if (k !== null) h['X-API-KEY'] = k
    return rawRequest({ port: this.port, method, path: reqPath, headers: h, body, ca: this.ca })
  }

  /** Sandbox.create, remembered so that `after` kills it if the test did not. */
  async create(opts = {}) {
    const sbx = await Sandbox.create({ timeoutMs: 300_000, ...opts })
    this.sandboxes.add(sbx.sandboxId)
    // The envd token must never reach the server's log (cleanup).
    if (sbx.envdAccessToken) this.envdTokens.push(sbx.envdAccessToken)
    return sbx
  }

  /** Remember a sandbox id created some other way. */
  track(id) {
    this.sandboxes.add(id)
  }

  /** Kill quietly (for finally blocks); forgets the id. */
  async kill(sbxOrId) {
    if (!sbxOrId) return
    const id = typeof sbxOrId === 'string' ? sbxOrId : sbxOrId.sandboxId
    this.sandboxes.delete(id)
    try {
      // This process's SDK does not trust an https server's CA
      // (NODE_EXTRA_CA_CERTS is read at start): raw requests do.
      if (this.https) await this.api('DELETE', `/sandboxes/${id}`)
      else await Sandbox.kill(id)
    } catch (err) {
      console.error(`# killing sandbox ${id}: ${err.message}`)
    }
  }

  /**
   * Registers a `before` hook that runs once the server has started
   * (node:test does not wait for an earlier root-level hook before starting
   * the next, and runs later hooks even when an earlier one failed).
   */
  setup(fn, { timeout = 90_000 } = {}) {
    before(async () => {
      try {
        await this.ensureStarted()
      } catch (err) {
        throw new Error(`server did not start: ${err.message}`)
      }
      try {
        await fn()
      } catch (err) {
        this.failed = true
        console.error(`# setup failed: ${describeError(err)}\n# server log ${this.logPath} (last lines):\n${this.logTail()}`)
        throw err
      }
    }, { timeout: timeout + START_TIMEOUT_MS })
  }

  logTail(lines = 80) {
    return tailFile(this.logPath, lines)
  }

  /** node:test `test` that prints the server log's tail when it fails. */
  test(name, opts, fn) {
    if (typeof opts === 'function') {
      fn = opts
      opts = {}
    }
    return nodeTest(name, { timeout: 120_000, ...opts }, async (t) => {
      try {
        await fn(t)
      } catch (err) {
        this.failed = true
        console.error(`# test "${name}" failed: ${describeError(err)}\n# server log ${this.logPath} (last lines):\n${this.logTail()}`)
        throw err
      }
    })
  }

  async cleanup() {
    const problems = []
    if (this.proc && !this.exit) {
      // Kill what the tests left behind, then check the server agrees that
      // nothing is running.
      await Promise.all([...this.sandboxes].map((id) => this.kill(id)))
      try {
        const res = await this.api('GET', '/v2/sandboxes')
        if (res.status !== 200) problems.push(`GET /v2/sandboxes after the tests: ${res.status} ${res.text}`)
        else if (res.json.length !== 0) {
          problems.push(`sandboxes still listed after the tests: ${res.json.map((s) => s.sandboxID).join(', ')}`)
          await Promise.all(res.json.map((s) => this.kill(s.sandboxID)))
        }
      } catch (err) {
        problems.push(`listing sandboxes after the tests: ${err.message}`)
      }
    }
    try {
      await this.stop()
    } catch (err) {
      problems.push(err.message)
    }
    problems.push(...this.secretsInLog())
    const mounts = this.tmp ? mountsUnder(this.tmp) : []
    if (mounts.length) {
      problems.push(`mounts left under ${this.tmp} after the server exited:\n${mounts.join('\n')}`)
      for (const m of mounts.reverse()) {
        try {
          execFileSync('umount', ['-l', m], { stdio: 'ignore' })
        } catch {
          // reported above
        }
      }
    }
    const left = this.runDir ? pidsMentioning(this.runDir) : []
    if (left.length) {
      problems.push(`processes still mention ${this.runDir} after the server exited:\n${left.join('\n')}`)
      for (const line of left) {
        try {
          process.kill(Number(line.split(':')[0]), 'SIGKILL')
        } catch {
          // gone
        }
      }
    }
    if (problems.length) {
      this.failed = true
      console.error(`# server log ${this.logPath} (last lines):\n${this.logTail(120)}`)
      throw new Error(problems.join('\n'))
    }
    if (!this.failed && this.tmp) {
      // Keep everything for a post-mortem when something failed.
      fs.rmSync(this.tmp, { recursive: true, force: true, maxRetries: 3 })
    } else if (this.tmp) {
      console.error(`# keeping ${this.tmp} for inspection`)
    }
  }

  /**
   * The secrets the server's log (at debug level) shows: its API key, the
   * cluster token, the data key, the CA's key and the envd tokens of the
   * sandboxes this harness created. Each must never be logged.
   */
  secretsInLog() {
    if (!this.logPath || !fs.existsSync(this.logPath)) return []
    const log = fs.readFileSync(this.logPath, 'utf8')
    const secrets = [['the API key', this.apiKey], ...this.envdTokens.map((t) => ['an envd token', t])]
    const secretsDir = path.join(this.dataDir, 'secrets')
    for (const [what, file] of [['the cluster token', 'cluster-token'], ['the data key', 'data-key'], ['the CA key', 'ca.key']]) {
      try {
        const text = fs.readFileSync(path.join(secretsDir, file), 'utf8')
        // A PEM key's body, or a key file's lines (a data key file may
        // hold several keys).
        for (const line of text.split('\n')) {
          const v = line.trim()
          if (v.length >= 16 && !v.startsWith('-----')) secrets.push([what, v])
        }
      } catch {
        // not made by this server
      }
    }
    return secrets.filter(([, v]) => v && v.length >= 16 && log.includes(v)).map(([what]) => `the server's log ${this.logPath} shows ${what}`)
  }

  async stop() {
    if (!this.proc || this.exit) return
    this.proc.kill('SIGTERM')
    let timer
    const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve('timeout'), STOP_GRACE_MS) })
    const res = await Promise.race([this.exited, timeout])
    clearTimeout(timer)
    if (res === 'timeout') {
      // SIGQUIT makes a Go program print every goroutine's stack to the log
      // (and exit): the record of where shutdown hung.
      this.proc.kill('SIGQUIT')
      const quit = await Promise.race([this.exited, sleep(3000).then(() => 'timeout')])
      if (quit === 'timeout') this.proc.kill('SIGKILL')
      await this.exited
      throw new Error(`aenv server did not exit within ${STOP_GRACE_MS / 1000}s of SIGTERM (sent SIGQUIT for a goroutine dump in ${this.logPath}, then killed it)`)
    }
    if (this.exit.code !== 0) {
      throw new Error(`aenv server exited with ${JSON.stringify(this.exit)} after SIGTERM (want code 0)`)
    }
  }
}

/**
 * Registers before/after hooks running one server for the calling file.
 * tag: 1-10 lower-case letters, unique per file (names nftables tables and
 * interfaces). cidr: a /16 unique per file. onStop: the server's
 * --on-stop ('kill' unless the file restarts the server with its
 * sandboxes running: 'keep'). args: more server flags.
 */
export function useServer({ tag, cidr, portHint, onStop, args }) {
  const srv = new TestServer({ tag, cidr, portHint, onStop, args })
  before(() => srv.ensureStarted(), { timeout: START_TIMEOUT_MS + 40_000 })
  after(async () => {
    await srv.cleanup()
  }, { timeout: 120_000 })
  return srv
}

/** Asserts that promise rejects with an instance of cls; returns the error. */
export async function rejectsWith(promise, cls, what = '') {
  let err
  try {
    await promise
  } catch (e) {
    err = e
  }
  if (!err) throw new Error(`${what || 'call'}: expected ${cls.name}, but it succeeded`)
  if (!(err instanceof cls)) {
    const e = new Error(`${what || 'call'}: expected ${cls.name}, got ${err?.constructor?.name}: ${err?.message}`)
    e.cause = err
    throw e
  }
  return err
}

// Test harness for many hosts on one machine: a real 3-member etcd cluster
// (`aenv etcd`), API servers without local nodes (`aenv server
// --local-node=false`) and node agents (`aenv node`), each node in its own
// network namespace with its own address on a bridge, all separate
// processes of the real binary. Tests drive it through the unmodified e2b
// SDK, pointing it at either API server.
//
//   const cl = useCluster({ tag: 'zqmh', subnet: '10.250.7' })
//   cl.test('...', async () => { const sbx = await cl.create(); ... })
//
// Addresses: the bridge is <subnet>.1 (etcd's client URLs and the API
// servers listen there, so that nodes reach them); node i is
// <subnet>.<10+i>, listening on :8100. Node i's sandboxes get 10.<200+i>.0.0/20.
// Root is required; a missing prerequisite fails, never skips.

import { execFileSync, spawn } from 'node:child_process'
import crypto from 'node:crypto'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { before, after, test as nodeTest } from 'node:test'
import { Sandbox } from 'e2b'
import { PORT_MIN, PORT_MAX, sleep, rawRequest, describeError, checkPrerequisites, tailFile } from './server.mjs'

const START_TIMEOUT_MS = 90_000
const NODE_PORT = 8100

function sh(cmd, args, { quiet = false } = {}) {
  try {
    return execFileSync(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] }).toString()
  } catch (err) {
    if (quiet) return ''
    throw new Error(`${cmd} ${args.join(' ')}: ${err.stderr?.toString().trim() || err.message}`)
  }
}

/** One process of the real binary, optionally in a network namespace. */
class Proc {
  constructor(name, args, logPath, { netns, env } = {}) {
    this.name = name
    this.args = args
    this.logPath = logPath
    this.netns = netns
    this.env = env
  }

  start() {
    const bin = path.join(process.env.AENV_BIN_DIR, 'aenv')
    // nsenter switches only the network namespace: the node shares the
    // host's mounts (its network-namespace files and runsc state stay
    // visible to its restarted self).
    const [cmd, args] = this.netns ? ['nsenter', [`--net=/run/netns/${this.netns}`, bin, ...this.args]] : [bin, this.args]
    const fd = fs.openSync(this.logPath, 'a')
    this.logStart = fs.fstatSync(fd).size
    this.exit = undefined
    const env = { ...process.env, ...this.env }
    delete env.AENV_CODE_INTERPRETER_ROOTFS // interpreter.test.mjs's alone
    this.proc = spawn(cmd, args, { stdio: ['ignore', fd, fd], env })
    fs.closeSync(fd)
    this.exited = new Promise((resolve) => {
      this.proc.once('exit', (code, signal) => {
        this.exit = { code, signal }
        resolve(this.exit)
      })
    })
  }

  async kill(signal = 'SIGKILL') {
    if (!this.proc || this.exit) return
    this.proc.kill(signal)
    await this.exited
  }

  running() {
    return this.proc && !this.exit
  }

  tail(lines) {
    return tailFile(this.logPath, lines)
  }

  /** What this run of the process has logged so far. */
  logSinceStart() {
    try {
      return fs.readFileSync(this.logPath).subarray(this.logStart ?? 0).toString()
    } catch {
      return ''
    }
  }
}

export class TestCluster {
  constructor({ tag, subnet, nodes = 3, servers = 2 }) {
    if (!/^[a-z]{2,6}$/.test(tag)) throw new Error(`cluster tag ${tag} must be 2-6 lower-case letters`)
    this.tag = tag
    this.subnet = subnet
    this.nodeCount = nodes
    this.serverCount = servers
    this.bridge = `${tag}br`
    this.token = `aenvct_${tag}_cluster_token_for_tests`
    // Every server seals with the same data key (nodes are handed it by the join).
    this.dataKey = 'aenvdk1_' + crypto.randomBytes(32).toString('base64url')
    this.apiKey = 'e2b_' + '0123456789abcdef'.repeat(2) + tag.split('').map((c) => c.charCodeAt(0).toString(16)).join('')
    this.failed = false
    this.sandboxes = new Set()
  }

  ensureStarted() {
    this.starting ??= this.start().catch((err) => {
      this.failed = true
      throw err
    })
    return this.starting
  }

  async start() {
    checkPrerequisites()
    for (const tool of ['ip', 'nsenter']) sh('sh', ['-c', `command -v ${tool}`])

    this.tmp = fs.mkdtempSync(path.join(os.tmpdir(), `aenv-e2e-${this.tag}-`))
    this.store = path.join(this.tmp, 'store')
    this.setupNetwork()

    // etcd: three members; clients on the bridge address, peers on loopback.
    const ports = this.ports(9)
    const peers = [0, 1, 2].map((i) => `e${i}=http://127.0.0.1:${ports[3 + i]}`).join(',')
    this.etcd = [0, 1, 2].map((i) => new Proc(`etcd e${i}`, ['etcd', '--name', `e${i}`,
      '--data-dir', path.join(this.tmp, `etcd${i}`),
      '--listen-client', `http://${this.subnet}.1:${ports[i]}`,
      '--listen-peer', `http://127.0.0.1:${ports[3 + i]}`,
      '--initial-cluster', peers, '--new', '--log-level', 'warn', '--insecure-cluster'], path.join(this.tmp, `etcd${i}.log`)))
    this.etcdEndpoints = [0, 1, 2].map((i) => `http://${this.subnet}.1:${ports[i]}`)
    for (const m of this.etcd) m.start()

    this.servers = []
    for (let j = 0; j < this.serverCount; j++) {
      const port = ports[6 + j]
      // Plain HTTP and etcd over http on the bridge: this suite runs
      // the cluster token's old join (https.test.mjs drives the SDK over TLS).
      const p = new Proc(`server ${j}`, ['server', '--local-node=false',
        '--listen', `0.0.0.0:${port}`, '--insecure-http', '--insecure-cluster',
        '--etcd-endpoints', this.etcdEndpoints.join(','), '--store', this.store,
        '--data-dir', path.join(this.tmp, `server${j}`), '--run-dir', path.join(this.tmp, `server${j}-run`),
        '--log-level', 'debug'], path.join(this.tmp, `server${j}.log`),
      { env: { AENV_CLUSTER_TOKEN: this.token, AENV_API_KEY: this.apiKey, AENV_DATA_KEY: this.dataKey } })
      p.port = port
      p.url = `http://127.0.0.1:${port}`
      this.servers.push(p)
    }
    // The first server records the cluster token; the others check it.
    this.servers[0].start()
    await this.waitServer(this.servers[0])
    for (const s of this.servers.slice(1)) s.start()
    for (const s of this.servers.slice(1)) await this.waitServer(s)

    this.nodes = []
    for (let i = 1; i <= this.nodeCount; i++) this.nodes.push(this.nodeProc(i, ['--join', `http://${this.subnet}.1:${this.servers[0].port}`]))
    for (const n of this.nodes) n.start()
    await this.waitNodes(this.nodes.map((n) => n.id))

    process.env.E2B_API_URL = this.servers[0].url
    process.env.E2B_SANDBOX_URL = this.servers[0].url
    process.env.E2B_API_KEY = this.apiKey
  }

  /** The node agent process of node i (1-based), not started. */
  nodeProc(i, extra = [], { token = this.token, onStop = 'kill' } = {}) {
    const id = `${this.tag}n${i}`
    const p = new Proc(`node ${id}`, ['node', ...extra,
      '--insecure-cluster', '--node-id', id,
      '--listen', `${this.subnet}.${10 + i}:${NODE_PORT}`,
      '--data-dir', path.join(this.tmp, `${id}`), '--run-dir', path.join(this.tmp, `${id}-run`),
      '--netns-tag', this.netnsTag(i), '--sandbox-cidr', `10.${200 + i}.0.0/20`,
      '--base-rootfs', process.env.AENV_BASE_ROOTFS, '--store', this.store,
      '--warm-pool', '0', '--on-stop', onStop, '--log-level', 'debug', '--capacity-memory', '8192',
      ...(process.env.AENV_RUNSC ? ['--runsc', process.env.AENV_RUNSC] : [])],
    path.join(this.tmp, `${id}.log`), { netns: this.netnsName(i), env: { AENV_CLUSTER_TOKEN: token } })
    p.id = id
    p.index = i
    return p
  }

  /** Node i's --netns-tag (letters only; it also names its cgroup). */
  netnsTag(i) {
    return `${this.tag}n${'abcdefgh'[i - 1]}`
  }

  netnsName(i) {
    return `${this.tag}-n${i}`
  }

  setupNetwork() {
    this.teardownNetwork()
    sh('ip', ['link', 'add', this.bridge, 'type', 'bridge'])
    sh('ip', ['addr', 'add', `${this.subnet}.1/24`, 'dev', this.bridge])
    sh('ip', ['link', 'set', this.bridge, 'up'])
    for (let i = 1; i <= this.nodeCount; i++) {
      const ns = this.netnsName(i)
      const host = `${this.tag}h${i}`
      sh('ip', ['netns', 'add', ns])
      sh('ip', ['link', 'add', host, 'type', 'veth', 'peer', 'name', `${this.tag}p${i}`])
      sh('ip', ['link', 'set', `${this.tag}p${i}`, 'netns', ns])
      sh('ip', ['link', 'set', host, 'master', this.bridge, 'up'])
      sh('ip', ['-n', ns, 'link', 'set', 'lo', 'up'])
      sh('ip', ['-n', ns, 'link', 'set', `${this.tag}p${i}`, 'name', 'eth0'])
      sh('ip', ['-n', ns, 'addr', 'add', `${this.subnet}.${10 + i}/24`, 'dev', 'eth0'])
      sh('ip', ['-n', ns, 'link', 'set', 'eth0', 'up'])
      sh('ip', ['-n', ns, 'route', 'add', 'default', 'via', `${this.subnet}.1`])
    }
  }

  teardownNetwork() {
    for (let i = 1; i <= this.nodeCount; i++) {
      sh('ip', ['netns', 'del', this.netnsName(i)], { quiet: true })
      // The kernel may destroy a namespace (and its end of the veth) some
      // time after the last reference goes; the host end goes now.
      sh('ip', ['link', 'del', `${this.tag}h${i}`], { quiet: true })
    }
    sh('ip', ['link', 'del', this.bridge], { quiet: true })
  }

  ports(n) {
    // Ports are taken from the harness's range, starting at a spot of this
    // tag's own so that concurrent files do not collide.
    const base = PORT_MIN + (this.tag.charCodeAt(2) % 8) * 10
    const out = []
    for (let i = 0; i < n; i++) out.push(base + 1 + i)
    if (out[n - 1] > PORT_MAX) throw new Error('port range exhausted')
    return out
  }

  async waitServer(s) {
    const deadline = Date.now() + START_TIMEOUT_MS
    for (;;) {
      if (s.exit) throw new Error(`${s.name} exited during start-up (${JSON.stringify(s.exit)}); log:\n${s.tail()}`)
      try {
        const res = await rawRequest({ port: s.port, path: '/health', timeoutMs: 2000 })
        if (res.status === 200) return
      } catch {
        // not yet
      }
      if (Date.now() > deadline) throw new Error(`${s.name} did not come up; log:\n${s.tail()}`)
      await sleep(200)
    }
  }

  /** Waits until every id is listed ready by the first running server. */
  async waitNodes(ids, { timeoutMs = START_TIMEOUT_MS } = {}) {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const res = await this.api('GET', '/nodes').catch(() => undefined)
      const ready = new Set((res?.json ?? []).filter((n) => n.state === 'ready').map((n) => n.id))
      if (ids.every((id) => ready.has(id))) return
      for (const n of this.nodes) {
        if (ids.includes(n.id) && n.exit) throw new Error(`${n.name} exited during start-up (${JSON.stringify(n.exit)}); log:\n${n.tail()}`)
      }
      if (Date.now() > deadline) throw new Error(`nodes ${ids.join(', ')} not ready (ready: ${[...ready].join(', ')})`)
      await sleep(250)
    }
  }

  /**
   * Waits until a (re)started node agent serves again: its registration
   * may still be the previous process's, live until its lease ends.
   */
  async waitNodeUp(n, { timeoutMs = 30_000 } = {}) {
    const deadline = Date.now() + timeoutMs
    while (!/aenv node ready/.test(n.logSinceStart())) {
      if (n.exit) throw new Error(`${n.name} exited during start-up (${JSON.stringify(n.exit)}); log:\n${n.tail()}`)
      if (Date.now() > deadline) throw new Error(`${n.name} did not come up; log:\n${n.tail()}`)
      await sleep(100)
    }
  }

  /** A running API server (the first one up). */
  server() {
    const s = this.servers.find((s) => s.running())
    if (!s) throw new Error('no API server is running')
    return s
  }

  /** SDK connection options for API server j. */
  via(j) {
    const s = this.servers[j]
    return { apiUrl: s.url, sandboxUrl: s.url, apiKey: this.apiKey }
  }

  async api(method, reqPath, { body, server } = {}) {
    const s = server ?? this.server()
    return rawRequest({ port: s.port, method, path: reqPath, headers: { 'X-API-KEY': this.apiKey }, body })
  }

  async create(opts = {}) {
    const sbx = await Sandbox.create({ timeoutMs: 600_000, ...this.via(this.servers.indexOf(this.server())), ...opts })
    this.sandboxes.add(sbx.sandboxId)
    return sbx
  }

  /**
   * The node a sandbox runs on, as API server `server` (default: the first
   * running one) reports it. Another server's change reaches a server's
   * cache through its watch, milliseconds later: ask the server that made
   * it to read it at once.
   */
  async nodeOf(id, server) {
    const res = await this.api('GET', `/sandboxes/${id}`, { server })
    if (res.status !== 200) throw new Error(`GET /sandboxes/${id}: ${res.status} ${res.text}`)
    return res.json.nodeID
  }

  logs(lines = 40) {
    const all = [...(this.servers ?? []), ...(this.nodes ?? []), ...(this.etcd ?? [])]
    return all.map((p) => `## ${p.name} (${p.logPath}):\n${p.tail(lines)}`).join('\n')
  }

  test(name, opts, fn) {
    if (typeof opts === 'function') {
      fn = opts
      opts = {}
    }
    return nodeTest(name, { timeout: 240_000, ...opts }, async (t) => {
      try {
        await fn(t)
      } catch (err) {
        this.failed = true
        console.error(`# test "${name}" failed: ${describeError(err)}\n${this.logs()}`)
        throw err
      }
    })
  }

  async cleanup() {
    const problems = []
    if (this.servers?.some((s) => s.running())) {
      await Promise.all([...this.sandboxes].map((id) => Sandbox.kill(id, this.via(this.servers.indexOf(this.server()))).catch(() => {})))
      const res = await this.api('GET', '/v2/sandboxes').catch((err) => ({ status: 0, text: err.message }))
      if (res.status !== 200) problems.push(`listing sandboxes after the tests: ${res.status} ${res.text}`)
      else if (res.json.length) problems.push(`sandboxes still listed after the tests: ${res.json.map((s) => s.sandboxID).join(', ')}`)
    }
    // Nodes stop with --on-stop=kill: their sandboxes go with them.
    for (const n of this.nodes ?? []) {
      await n.kill('SIGTERM')
      if (n.exit && n.exit.code !== 0 && n.exit.signal !== 'SIGKILL') problems.push(`${n.name} exited with ${JSON.stringify(n.exit)} after SIGTERM`)
    }
    for (const s of this.servers ?? []) await s.kill('SIGTERM')
    for (const m of this.etcd ?? []) await m.kill('SIGKILL')
    // Whatever a killed node left: its sandboxes and network slots.
    for (let i = 1; i <= this.nodeCount && this.tmp; i++) {
      const id = `${this.tag}n${i}`
      sh('nsenter', [`--net=/run/netns/${this.netnsName(i)}`, path.join(process.env.AENV_BIN_DIR, 'aenv'), 'server', '--cleanup',
        '--run-dir', path.join(this.tmp, `${id}-run`), '--netns-tag', this.netnsTag(i), '--sandbox-cidr', `10.${200 + i}.0.0/20`], { quiet: true })
    }
    this.teardownNetwork()
    if (problems.length) {
      this.failed = true
      console.error(this.logs(80))
      throw new Error(problems.join('\n'))
    }
    if (!this.failed && this.tmp) fs.rmSync(this.tmp, { recursive: true, force: true, maxRetries: 3 })
    else if (this.tmp) console.error(`# keeping ${this.tmp} for inspection`)
  }
}

/** Registers before/after hooks running one cluster for the calling file. */
export function useCluster(opts) {
  const cl = new TestCluster(opts)
  before(() => cl.ensureStarted(), { timeout: START_TIMEOUT_MS * 2 })
  after(() => cl.cleanup(), { timeout: 180_000 })
  return cl
}

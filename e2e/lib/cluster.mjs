// Test harness for many hosts on one machine, over TLS as the README sets
// them up: a real 3-member etcd cluster (`aenv etcd --ca-dir`: client and
// peer TLS with the cluster's CA), API servers without local nodes (`aenv
// server --local-node=false`, the second joined with `aenv server --join`)
// and node agents (`aenv node`, joined with the lines `aenv cluster
// join-command` prints), each node in its own network namespace with its
// own address on a bridge, all separate processes of the real binary.
// Tests drive it through the unmodified e2b SDK over HTTPS, pointing it at
// either API server; the process must trust the cluster's CA, made ahead
// (lib/cluster-ca.mjs). The traffic on the bridge and its veths is
// captured (tcpdump) for capturedSecrets.
//
//   const cl = useCluster({ tag: 'zqmh', subnet: '10.250.7' })
//   cl.test('...', async () => { const sbx = await cl.create(); ... })
//
// Addresses: the bridge is <subnet>.1 (etcd's client URLs, the API servers
// and their cluster listeners listen there, so that nodes reach them);
// node i is <subnet>.<10+i>, listening on :8100. Node i's sandboxes get
// 10.<200+i>.0.0/20. One more namespace, <subnet>.<11+nodes>, is for a
// node of a cluster of the old, plain kind (legacy()).
// Root is required; a missing prerequisite fails, never skips.

import { execFileSync, spawn } from 'node:child_process'
import crypto from 'node:crypto'
import dgram from 'node:dgram'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { before, after, test as nodeTest } from 'node:test'
import { Sandbox } from 'e2b'
import { PORT_MIN, PORT_MAX, sleep, rawRequest, describeError, checkPrerequisites, tailFile } from './server.mjs'
import { CLUSTER_CA_ENV } from './cluster-ca.mjs'

const START_TIMEOUT_MS = 90_000
const NODE_PORT = 8100

function sh(cmd, args, { quiet = false, env = process.env } = {}) {
  try {
    return execFileSync(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], env }).toString()
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
    // The plain cluster's (legacy()): a token that crosses the network in
    // the clear, which the capture must find.
    this.legacyToken = `aenvct_${tag}_plain_legacy_token_seen`
    this.legacyApiKey = 'e2b_' + 'fedcba9876543210'.repeat(2) + tag.split('').map((c) => c.charCodeAt(0).toString(16)).join('')
    // Every server seals with the same data key (nodes are handed it by the join).
    this.dataKey = 'aenvdk1_' + crypto.randomBytes(32).toString('base64url')
    this.apiKey = 'e2b_' + '0123456789abcdef'.repeat(2) + tag.split('').map((c) => c.charCodeAt(0).toString(16)).join('')
    this.failed = false
    this.sandboxes = new Set()
    // What must never cross the network in the clear (capturedSecrets).
    this.secrets = new Map([['the API key', this.apiKey], ['the cluster token', this.token], ['the data key', this.dataKey]])
  }

  /** Adds a secret capturedSecrets looks for. */
  secret(what, value) {
    if (value) this.secrets.set(what, value)
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
    for (const tool of ['ip', 'nsenter', 'tcpdump']) {
      if (!sh('sh', ['-c', `command -v ${tool}`], { quiet: true })) throw new Error(`${tool} is missing (scripts/install-deps.sh installs it)`)
    }
    const caDir = process.env[CLUSTER_CA_ENV]
    if (!caDir || !fs.existsSync(path.join(caDir, 'ca.key'))) {
      throw new Error(`$${CLUSTER_CA_ENV} names no cluster CA: run the cases through runWithClusterCA (lib/cluster-ca.mjs)`)
    }
    this.caFile = path.join(caDir, 'ca.crt')
    this.ca = fs.readFileSync(this.caFile)
    // A line of the key's PEM: verbatim in a PEM file and in JSON alike.
    this.secret('the CA key', fs.readFileSync(path.join(caDir, 'ca.key'), 'utf8').split('\n').find((l) => l && !l.startsWith('-----')))

    this.tmp = fs.mkdtempSync(path.join(os.tmpdir(), `aenv-e2e-${this.tag}-`))
    this.store = path.join(this.tmp, 'store')
    this.setupNetwork()
    await this.startCapture()

    // etcd: three members over TLS with the cluster's CA, each given a
    // copy of it; clients on the bridge address, peers on loopback.
    const ports = this.ports(14)
    const peers = [0, 1, 2].map((i) => `e${i}=https://127.0.0.1:${ports[3 + i]}`).join(',')
    this.etcd = [0, 1, 2].map((i) => {
      const dir = path.join(this.tmp, `etcd${i}-ca`)
      copyCA(caDir, dir)
      return new Proc(`etcd e${i}`, ['etcd', '--name', `e${i}`,
        '--data-dir', path.join(this.tmp, `etcd${i}`), '--ca-dir', dir,
        '--listen-client', `https://${this.subnet}.1:${ports[i]}`,
        '--listen-peer', `https://127.0.0.1:${ports[3 + i]}`,
        '--initial-cluster', peers, '--new', '--log-level', 'warn'], path.join(this.tmp, `etcd${i}.log`))
    })
    this.etcdEndpoints = [0, 1, 2].map((i) => `https://${this.subnet}.1:${ports[i]}`)
    for (const m of this.etcd) m.start()
    this.legacyPorts = { api: ports[10], etcd: ports[11] }

    // The API servers listen on the bridge address, beyond loopback: HTTPS
    // with a certificate of the cluster's CA. The first is given the CA
    // (as the README says: a copy in <data-dir>/secrets); the second
    // joins it with a token of the server role and is handed the CA, the
    // data key and the cluster token.
    this.servers = []
    for (let j = 0; j < this.serverCount; j++) {
      const port = ports[6 + j]
      const clusterPort = ports[8 + j]
      const dataDir = path.join(this.tmp, `server${j}`)
      const p = new Proc(`server ${j}`, ['server', '--local-node=false',
        '--listen', `${this.subnet}.1:${port}`, '--cluster-listen', `${this.subnet}.1:${clusterPort}`,
        '--store', this.store, '--data-dir', dataDir, '--run-dir', path.join(this.tmp, `server${j}-run`),
        '--log-level', 'debug'], path.join(this.tmp, `server${j}.log`), { env: { AENV_API_KEY: this.apiKey } })
      p.port = port
      p.host = `${this.subnet}.1`
      p.url = `https://${p.host}:${port}`
      p.dataDir = dataDir
      this.servers.push(p)
    }
    const first = this.servers[0]
    first.args.push('--etcd-endpoints', this.etcdEndpoints.join(','))
    first.env = { ...first.env, AENV_CLUSTER_TOKEN: this.token, AENV_DATA_KEY: this.dataKey }
    copyCA(caDir, path.join(first.dataDir, 'secrets'))
    first.start()
    await this.waitServer(first)
    for (const s of this.servers.slice(1)) {
      const { url, token, caHash } = this.joinCommand(['--server'], 'aenv server')
      const tokenFile = path.join(this.tmp, `${s.name.replace(' ', '')}.token`)
      fs.writeFileSync(tokenFile, token + '\n', { mode: 0o600 })
      s.args.push('--join', url, '--token-file', tokenFile, '--ca-hash', caHash)
      s.start()
      await this.waitServer(s)
      // A restart needs no token: it joined before.
      fs.rmSync(tokenFile)
      s.args.splice(s.args.indexOf('--token-file'), 2)
    }

    this.nodes = []
    this.nodeJoins = new Map()
    for (let i = 1; i <= this.nodeCount; i++) this.nodes.push(this.nodeProc(i))
    for (const n of this.nodes) n.start()
    await this.waitNodes(this.nodes.map((n) => n.id))

    process.env.E2B_API_URL = first.url
    process.env.E2B_SANDBOX_URL = first.url
    process.env.E2B_API_KEY = this.apiKey
  }

  /**
   * Runs `aenv cluster join-command` (with extra flags) against the first
   * running server and returns what its line holds; the token is a secret
   * of the cluster's from then on.
   */
  joinCommand(extra = [], command = 'aenv node') {
    const s = this.server()
    const out = sh(path.join(process.env.AENV_BIN_DIR, 'aenv'), ['cluster', 'join-command', ...extra, '--url', s.url, '--description', 'e2e'],
      { env: { ...process.env, AENV_API_KEY: this.apiKey, AENV_CA_FILE: this.caFile } }).trim()
    const m = out.match(/^(aenv \w+) --join (https:\/\/\S+) --token (\S+) --ca-hash (sha256:[0-9a-f]{64})$/)
    if (!m || m[1] !== command) throw new Error(`join-command printed ${JSON.stringify(out)}, not a line of ${command}`)
    this.secret(`join token ${m[3].split('.')[0]}`, m[3])
    return { url: m[2], token: m[3], caHash: m[4] }
  }

  /** Starts tcpdump on the bridge's subnet, waiting until it listens. */
  async startCapture() {
    this.pcap = path.join(this.tmp, 'capture.pcap')
    // -i any: the bridge and the veths, where nodes' traffic goes, and lo,
    // where the servers' traffic to etcd and each other at the bridge's
    // address goes (a local address is reached through lo).
    this.capture = new Proc('tcpdump', [], path.join(this.tmp, 'tcpdump.log'))
    this.capture.start = function () {
      const fd = fs.openSync(this.logPath, 'a')
      this.proc = spawn('tcpdump', ['-i', 'any', '-U', '-B', '16384', '-s', '0', '-n', '-w', this.pcapPath, 'net', this.net], { stdio: ['ignore', fd, fd] })
      fs.closeSync(fd)
      this.exited = new Promise((resolve) => this.proc.once('exit', (code, signal) => resolve((this.exit = { code, signal }))))
    }
    this.capture.pcapPath = this.pcap
    this.capture.net = `${this.subnet}.0/24`
    this.capture.start()
    const deadline = performance.now() + 10_000
    while (!/listening on/.test(this.capture.tail(5))) {
      if (this.capture.exit) throw new Error(`tcpdump exited (${JSON.stringify(this.capture.exit)}): ${this.capture.tail()}`)
      if (performance.now() > deadline) throw new Error(`tcpdump did not start: ${this.capture.tail()}`)
      await sleep(50)
    }
  }

  /**
   * Stops the capture and returns its bytes, and which of the secrets
   * recorded appear in them. tcpdump may lag behind the traffic, and
   * stopping it drops what it has not written yet: a marker datagram is
   * sent, and it is stopped once the marker is in the file, so that all
   * before it is. The raw file is searched: over plain HTTP/1.1 a
   * header's value appears verbatim (a secret split across two segments
   * could be missed, which the control of legacy() would show as
   * flakiness, not hide). Packets the kernel dropped fail the capture.
   */
  async capturedSecrets() {
    const marker = Buffer.from(`aenv-capture-marker-${crypto.randomBytes(8).toString('hex')}`)
    const sock = dgram.createSocket('udp4')
    await new Promise((resolve, reject) => sock.send(marker, 9, `${this.subnet}.1`, (err) => (err ? reject(err) : resolve())))
    sock.close()
    const deadline = performance.now() + 60_000
    while (!fs.readFileSync(this.pcap).includes(marker)) {
      if (this.capture.exit) throw new Error(`tcpdump exited during the run (${JSON.stringify(this.capture.exit)}): ${this.capture.tail()}`)
      if (performance.now() > deadline) throw new Error(`tcpdump did not write the marker within 60 s: ${this.capture.tail()}`)
      await sleep(100)
    }
    await this.capture.kill('SIGINT')
    const dropped = this.capture.tail(5).match(/(\d+) packets? dropped by kernel/)
    if (!dropped) throw new Error(`tcpdump did not tell what it dropped: ${this.capture.tail()}`)
    if (Number(dropped[1]) !== 0) throw new Error(`tcpdump: the kernel dropped ${dropped[1]} packets, which may have held a secret`)
    const bytes = fs.readFileSync(this.pcap)
    const found = []
    for (const [what, value] of this.secrets) if (bytes.includes(Buffer.from(value))) found.push(what)
    return { bytes, found }
  }

  /**
   * Starts a cluster of the old, plain kind beside this one: a server
   * whose embedded etcd and API serve plain HTTP on the bridge, and a node
   * (in the extra namespace) joined with the cluster token, all with
   * --insecure-cluster. Its cluster token crosses the network in the
   * clear: the capture's control.
   */
  async legacy() {
    const server = new Proc('legacy server', ['server', '--local-node=false', '--insecure-http', '--insecure-cluster',
      '--listen', `${this.subnet}.1:${this.legacyPorts.api}`, '--cluster-listen', '',
      '--etcd-listen', `http://${this.subnet}.1:${this.legacyPorts.etcd}`,
      '--store', path.join(this.tmp, 'legacy-store'), '--data-dir', path.join(this.tmp, 'legacy-server'),
      '--run-dir', path.join(this.tmp, 'legacy-server-run'), '--log-level', 'debug'], path.join(this.tmp, 'legacy-server.log'),
    { env: { AENV_CLUSTER_TOKEN: this.legacyToken, AENV_API_KEY: this.legacyApiKey } })
    server.port = this.legacyPorts.api
    server.host = `${this.subnet}.1`
    server.url = `http://${server.host}:${server.port}`
    this.legacyServer = server
    server.start()
    await this.waitServer(server, { ca: null })
    const node = this.legacyNode()
    this.legacyNodeProc = node
    node.start()
    await this.waitNodeUp(node)
    return { server, node }
  }

  /** The legacy cluster's node agent, not started (token: its cluster token). */
  legacyNode({ token = this.legacyToken, id } = {}) {
    const i = this.nodeCount + 1
    // Its own store: each cluster's elected server collects what nothing
    // of its state refers to in the store it is given.
    const p = this.nodeProc(i, { join: ['--join', `http://${this.subnet}.1:${this.legacyPorts.api}`, '--insecure-cluster'],
      env: { AENV_CLUSTER_TOKEN: token }, store: path.join(this.tmp, 'legacy-store') })
    if (id) {
      p.id = id
      p.args[p.args.indexOf('--node-id') + 1] = id
    }
    p.name = `legacy node ${p.id}`
    return p
  }

  /**
   * The node agent process of node i (1-based), not started: joined with
   * the line of a `join-command` of its own (its token in $AENV_JOIN_TOKEN,
   * not on the command line), unless join says otherwise.
   */
  nodeProc(i, { join, env, onStop = 'kill', store = this.store } = {}) {
    const id = `${this.tag}n${i}`
    if (!join) {
      if (!this.nodeJoins.has(i)) this.nodeJoins.set(i, this.joinCommand())
      const { url, token, caHash } = this.nodeJoins.get(i)
      join = ['--join', url, '--ca-hash', caHash]
      env = { AENV_JOIN_TOKEN: token, ...env }
    }
    const p = new Proc(`node ${id}`, ['node', ...join, '--node-id', id,
      '--listen', `${this.subnet}.${10 + i}:${NODE_PORT}`,
      '--data-dir', path.join(this.tmp, `${id}`), '--run-dir', path.join(this.tmp, `${id}-run`),
      '--netns-tag', this.netnsTag(i), '--sandbox-cidr', `10.${200 + i}.0.0/20`,
      '--base-rootfs', process.env.AENV_BASE_ROOTFS, '--store', store,
      '--warm-pool', '0', '--on-stop', onStop, '--log-level', 'debug', '--capacity-memory', '8192',
      ...(process.env.AENV_RUNSC ? ['--runsc', process.env.AENV_RUNSC] : [])],
    path.join(this.tmp, `${id}.log`), { netns: this.netnsName(i), env })
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
    for (let i = 1; i <= this.nodeCount + 1; i++) {
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
    for (let i = 1; i <= this.nodeCount + 1; i++) {
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

  async waitServer(s, { ca = this.ca } = {}) {
    const deadline = performance.now() + START_TIMEOUT_MS
    for (;;) {
      if (s.exit) throw new Error(`${s.name} exited during start-up (${JSON.stringify(s.exit)}); log:\n${s.tail()}`)
      try {
        const res = await rawRequest({ host: s.host, port: s.port, path: '/health', timeoutMs: 2000, ca })
        if (res.status === 200) return
      } catch {
        // not yet
      }
      if (performance.now() > deadline) throw new Error(`${s.name} did not come up; log:\n${s.tail()}`)
      await sleep(200)
    }
  }

  /** Waits until every id is listed ready by the first running server. */
  async waitNodes(ids, { timeoutMs = START_TIMEOUT_MS } = {}) {
    const deadline = performance.now() + timeoutMs
    for (;;) {
      const res = await this.api('GET', '/nodes').catch(() => undefined)
      const ready = new Set((res?.json ?? []).filter((n) => n.state === 'ready').map((n) => n.id))
      if (ids.every((id) => ready.has(id))) return
      for (const n of this.nodes) {
        if (ids.includes(n.id) && n.exit) throw new Error(`${n.name} exited during start-up (${JSON.stringify(n.exit)}); log:\n${n.tail()}`)
      }
      if (performance.now() > deadline) throw new Error(`nodes ${ids.join(', ')} not ready (ready: ${[...ready].join(', ')})`)
      await sleep(250)
    }
  }

  /**
   * Waits until a (re)started node agent serves again: its registration
   * may still be the previous process's, live until its lease ends.
   */
  async waitNodeUp(n, { timeoutMs = 30_000 } = {}) {
    const deadline = performance.now() + timeoutMs
    while (!/aenv node ready/.test(n.logSinceStart())) {
      if (n.exit) throw new Error(`${n.name} exited during start-up (${JSON.stringify(n.exit)}); log:\n${n.tail()}`)
      if (performance.now() > deadline) throw new Error(`${n.name} did not come up; log:\n${n.tail()}`)
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

  /** One request to an API server (default: the first running one) over HTTPS. */
  async api(method, reqPath, { body, server, headers = { 'X-API-KEY': this.apiKey } } = {}) {
    const s = server ?? this.server()
    return rawRequest({ host: s.host, port: s.port, method, path: reqPath, headers, body, ca: this.ca })
  }

  async create(opts = {}) {
    return this.track(await Sandbox.create({ timeoutMs: 600_000, ...this.via(this.servers.indexOf(this.server())), ...opts }))
  }

  /** Records a sandbox made through the SDK: killed at cleanup, its access token a secret. */
  track(sbx) {
    this.sandboxes.add(sbx.sandboxId)
    this.secret(`the envd access token of ${sbx.sandboxId}`, sbx.envdAccessToken)
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
    const all = [...(this.servers ?? []), ...(this.nodes ?? []), ...(this.etcd ?? []),
      ...[this.legacyServer, this.legacyNodeProc].filter(Boolean)]
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
    if (this.legacyNodeProc) await this.legacyNodeProc.kill('SIGTERM')
    for (const s of [...(this.servers ?? []), this.legacyServer].filter(Boolean)) await s.kill('SIGTERM')
    for (const m of this.etcd ?? []) await m.kill('SIGKILL')
    if (this.capture) await this.capture.kill('SIGINT')
    // Whatever a killed node left: its sandboxes and network slots.
    for (let i = 1; i <= this.nodeCount + 1 && this.tmp; i++) {
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

/** Copies the CA of dir (ca.crt, ca.key) into to, as an operator would. */
function copyCA(dir, to) {
  fs.mkdirSync(to, { recursive: true, mode: 0o700 })
  for (const f of ['ca.crt', 'ca.key']) fs.copyFileSync(path.join(dir, f), path.join(to, f))
  fs.chmodSync(path.join(to, 'ca.key'), 0o600)
}

/** Registers before/after hooks running one cluster for the calling file. */
export function useCluster(opts) {
  const cl = new TestCluster(opts)
  before(() => cl.ensureStarted(), { timeout: START_TIMEOUT_MS * 2 })
  after(() => cl.cleanup(), { timeout: 180_000 })
  return cl
}

// A fake internet for the egress tests: a network namespace joined to the
// host by a veth, with addresses in TEST-NET-2 (198.51.100.0/24), serving
// HTTP, HTTPS (a self-signed certificate for the test names) and DNS for
// test domains (see internet-server.mjs). The server under test runs with
// --dns <DNS> and --egress-allow <RANGE>, so its sandboxes resolve the
// test names and may reach the range, as far as their own rules allow.

import { execFileSync, spawn } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

export const RANGE = '198.51.100.0/24'
export const HOST = '198.51.100.1'
export const A = '198.51.100.2' // the DNS server too
export const B = '198.51.100.3'
export const DNS = A
export const ZONE = {
  'allowed.test': A,
  'api.allowed.test': A,
  'deep.api.allowed.test': A,
  'other.test': B,
}

function run(cmd, ...args) {
  return execFileSync(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] }).toString()
}

export class Internet {
  constructor(tag) {
    this.ns = `${tag}inet`
    this.veth = `${tag}i0`
  }

  async start() {
    this.stopQuietly()
    this.tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-internet-'))
    const cert = path.join(this.tmp, 'cert.pem')
    const key = path.join(this.tmp, 'key.pem')
    const san = Object.keys(ZONE).map((n) => `DNS:${n}`).join(',')
    run('openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=allowed.test',
      '-addext', `subjectAltName=${san}`, '-keyout', key, '-out', cert)
    run('ip', 'netns', 'add', this.ns)
    run('ip', 'link', 'add', this.veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', this.ns)
    run('ip', 'addr', 'add', `${HOST}/24`, 'dev', this.veth)
    run('ip', 'link', 'set', this.veth, 'up')
    for (const a of [A, B]) run('ip', '-n', this.ns, 'addr', 'add', `${a}/24`, 'dev', 'eth0')
    run('ip', '-n', this.ns, 'link', 'set', 'eth0', 'up')
    run('ip', '-n', this.ns, 'link', 'set', 'lo', 'up')
    const server = fileURLToPath(new URL('./internet-server.mjs', import.meta.url))
    this.log = path.join(this.tmp, 'internet.log')
    const fd = fs.openSync(this.log, 'a')
    this.proc = spawn('ip', ['netns', 'exec', this.ns, process.execPath, server, cert, key, JSON.stringify(ZONE)],
      { stdio: ['ignore', fd, fd] })
    fs.closeSync(fd)
    const deadline = performance.now() + 15_000
    while (!fs.readFileSync(this.log, 'utf8').includes('internet ready')) {
      if (performance.now() > deadline || this.proc.exitCode !== null) {
        throw new Error(`the fake internet did not start: ${fs.readFileSync(this.log, 'utf8')}`)
      }
      await new Promise((r) => setTimeout(r, 50))
    }
  }

  stopQuietly() {
    try { this.proc?.kill('SIGKILL') } catch {}
    try { run('ip', 'netns', 'pids', this.ns).split('\n').filter(Boolean).forEach((p) => process.kill(Number(p), 'SIGKILL')) } catch {}
    try { run('ip', 'link', 'del', this.veth) } catch {}
    try { run('ip', 'netns', 'del', this.ns) } catch {}
  }

  stop() {
    this.stopQuietly()
    if (this.tmp) fs.rmSync(this.tmp, { recursive: true, force: true })
  }
}

// The sandbox proxy: getHost(port) names reach a program listening inside
// the sandbox; unknown sandboxes and closed ports give 502; envd's access
// token is enforced for secure sandboxes.

import assert from 'node:assert/strict'
import crypto from 'node:crypto'
import net from 'node:net'
import os from 'node:os'
import { Sandbox } from 'e2b'
import { useServer, randomTag, rawRequest, waitFor } from './lib/server.mjs'

const srv = useServer({ tag: 'zqnet', cidr: '10.243.0.0/16', portHint: 18160 })

/** @type {import('e2b').Sandbox} */
let sbx
const wwwDir = `/home/user/www-${randomTag(6)}`
const marker = `marker-${randomTag(10)}.txt`
const bigData = crypto.randomBytes(3 << 20)

srv.setup(async () => {
  sbx = await srv.create({ timeoutMs: 600_000, metadata: { suite: 'network' } })
  await sbx.files.write(`${wwwDir}/${marker}`, 'marker content\n')
  await sbx.files.write(`${wwwDir}/big.bin`, bigData)
  await sbx.commands.run('python3 -m http.server 8080', { background: true, cwd: wwwDir, timeoutMs: 0 })
}, { timeout: 90_000 })

/** GET through the proxy with Host set to a getHost() value, retrying until the program answers. */
async function getViaHost(host, reqPath = '/', { retryUntilOk = true } = {}) {
  let last
  await waitFor(async () => {
    last = await rawRequest({ port: srv.port, path: reqPath, headers: { Host: host } })
    return !retryUntilOk || last.status === 200
  }, { timeoutMs: 20_000, intervalMs: 250, what: () => `GET http://${host}${reqPath} to answer 200 (last: ${last?.status} ${last?.text?.slice(0, 200)})` })
  return last
}

srv.test('getHost(port) reaches python3 -m http.server in the sandbox', async () => {
  const host = sbx.getHost(8080)
  assert.equal(host, `8080-${sbx.sandboxId}.localhost:${srv.port}`)

  const res = await getViaHost(host, '/')
  assert.equal(res.status, 200)
  assert.match(res.headers['content-type'] ?? '', /text\/html/)
  assert.match(res.text, /Directory listing for \//)
  assert.ok(res.text.includes(marker), `listing lacks ${marker}:\n${res.text}`)
  assert.ok(res.text.includes('big.bin'))

  const file = await getViaHost(host, `/${marker}`)
  assert.equal(file.text, 'marker content\n')

  // A 404 from the program passes through as it is.
  const missing = await rawRequest({ port: srv.port, path: '/nope.txt', headers: { Host: host } })
  assert.equal(missing.status, 404)
})

srv.test('a 3 MiB download through the proxy is byte-exact', async () => {
  const res = await getViaHost(sbx.getHost(8080), '/big.bin')
  assert.equal(res.status, 200)
  assert.equal(res.body.length, bigData.length)
  assert.ok(Buffer.compare(res.body, bigData) === 0, 'downloaded bytes differ')
})

srv.test('the E2b-Sandbox-Id / E2b-Sandbox-Port headers route the same way', async () => {
  const res = await rawRequest({
    port: srv.port,
    path: '/',
    headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8080' },
  })
  assert.equal(res.status, 200)
  assert.ok(res.text.includes(marker))
})

srv.test('envd is reachable by host name on port 49983', async () => {
  const res = await rawRequest({ port: srv.port, path: '/health', headers: { Host: `49983-${sbx.sandboxId}.localhost:${srv.port}` } })
  assert.equal(res.status, 204)
})

srv.test('a port nobody listens on gives 502 with a JSON error', async () => {
  const res = await rawRequest({ port: srv.port, path: '/', headers: { Host: sbx.getHost(8081) } })
  assert.equal(res.status, 502)
  assert.equal(res.json?.code, 502)
  assert.equal(typeof res.json?.message, 'string')
})

srv.test('an unknown sandbox gives 502 through the proxy', async () => {
  for (const headers of [
    { Host: `8080-nosuch${randomTag(10)}.localhost:${srv.port}` },
    { 'E2b-Sandbox-Id': `nosuch${randomTag(10)}`, 'E2b-Sandbox-Port': '49983' },
  ]) {
    const res = await rawRequest({ port: srv.port, path: '/health', headers })
    assert.equal(res.status, 502, JSON.stringify(headers))
    assert.equal(res.json?.code, 502)
  }
})

srv.test('bad proxy targets are refused with 4xx, never 5xx', async () => {
  for (const headers of [
    { 'E2b-Sandbox-Id': '../../etc', 'E2b-Sandbox-Port': '49983' },
    { 'E2b-Sandbox-Id': sbx.sandboxId.toUpperCase(), 'E2b-Sandbox-Port': '49983' },
    { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '0' },
    { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '65536' },
    { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': 'abc' },
    { Host: `99999-${sbx.sandboxId}.localhost:${srv.port}` },
  ]) {
    const res = await rawRequest({ port: srv.port, path: '/health', headers })
    assert.ok(res.status >= 400 && res.status < 500, `${JSON.stringify(headers)}: ${res.status} ${res.text}`)
    assert.equal(res.json?.code, res.status, `${JSON.stringify(headers)}: body ${res.text}`)
  }
})

srv.test('allowPublicTraffic: false: the sandbox\'s ports need its traffic access token', async () => {
  const priv = await srv.create({ network: { allowPublicTraffic: false } })
  try {
    assert.ok(priv.trafficAccessToken, 'create returned no traffic access token')
    await priv.commands.run('python3 -m http.server 8080', { background: true, cwd: '/tmp', timeoutMs: 0 })
    const host = priv.getHost(8080)
    const ok = await waitFor(async () => {
      const r = await rawRequest({ port: srv.port, path: '/', headers: { Host: host, 'e2b-traffic-access-token': priv.trafficAccessToken } })
      return r.status === 200 && r
    }, { timeoutMs: 20_000, intervalMs: 250, what: 'the private port to answer with the token' })
    assert.match(ok.text, /Directory listing/)
    for (const headers of [{ Host: host }, { Host: host, 'e2b-traffic-access-token': 'wrong' }]) {
      const res = await rawRequest({ port: srv.port, path: '/', headers })
      assert.equal(res.status, 403, `without the right token: ${res.status}`)
      assert.match(res.json.message, /traffic access token/)
    }
    // envd keeps its own token; the SDK goes on working.
    assert.equal((await priv.commands.run('echo envd')).stdout, 'envd\n')
    // A public sandbox's ports need nothing.
    assert.equal(sbx.trafficAccessToken, undefined)
  } finally {
    await srv.kill(priv)
  }
})

srv.test('a sandbox reaches its own program on localhost', async () => {
  const r = await sbx.commands.run(`python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080/${marker}').read().decode(), end='')"`)
  assert.equal(r.stdout, 'marker content\n')
})

srv.test('secure sandbox: envd demands its access token', async () => {
  const res = await srv.api('POST', '/v2/sandboxes', { body: { templateID: 'base', timeout: 120, secure: true } })
  assert.equal(res.status, 201, res.text)
  const id = res.json.sandboxID
  srv.track(id)
  try {
    const token = res.json.envdAccessToken
    assert.equal(typeof token, 'string')
    assert.ok(token.length >= 16, `token ${token}`)

    const route = { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': '49983' }
    const path = '/files?path=%2Fetc%2Fhosts&username=user'
    const noToken = await rawRequest({ port: srv.port, path, headers: route })
    assert.equal(noToken.status, 401, `no token: ${noToken.status} ${noToken.text}`)
    const badToken = await rawRequest({ port: srv.port, path, headers: { ...route, 'X-Access-Token': token + 'x' } })
    assert.equal(badToken.status, 401, `bad token: ${badToken.status} ${badToken.text}`)
    const good = await rawRequest({ port: srv.port, path, headers: { ...route, 'X-Access-Token': token } })
    assert.equal(good.status, 200, `good token: ${good.status} ${good.text}`)
    assert.ok(good.text.includes(id), `/etc/hosts lacks the sandbox id:\n${good.text}`)

    // The SDK gets the token from connect and uses it.
    const conn = await Sandbox.connect(id)
    const r = await conn.commands.run('echo secure-ok; env | grep -c AENV_ENVD_ACCESS_TOKEN || true')
    assert.equal(r.stdout, 'secure-ok\n0\n', 'the access token must not leak into process environments')
  } finally {
    await srv.kill(id)
  }
})

/**
 * Runs a TCP connect probe inside sbx against every [host, port]; returns
 * the targets that accepted a connection.
 */
async function reachableFrom(box, targets) {
  const script = `
import socket, sys, threading
res = {}
def probe(h, p):
    try:
        socket.create_connection((h, p), timeout=3).close()
        res[(h, p)] = 'open'
    except Exception as e:
        res[(h, p)] = 'closed'
ts = [threading.Thread(target=probe, args=(h, int(p))) for h, p in (a.split(':') for a in sys.argv[1:])]
[t.start() for t in ts]
[t.join() for t in ts]
print(' '.join(f'{h}:{p}' for (h, p), v in res.items() if v == 'open'))
`
  await box.files.write('/tmp/probe.py', script)
  const r = await box.commands.run(`python3 /tmp/probe.py ${targets.map(([h, p]) => `${h}:${p}`).join(' ')}`, { timeoutMs: 30_000 })
  return r.stdout.trim().split(/\s+/).filter(Boolean)
}

srv.test('sandboxes reach neither each other nor the host', { timeout: 120_000 }, async () => {
  // sbx's address as the host sees it: envd's peer inside sbx is the host
  // end of sbx's /30, and sbx is the next address.
  const ss = await sbx.commands.run('ss -tn', { user: 'root' })
  const m = ss.stdout.match(/:49983\s+\[?(?:::ffff:)?(\d+\.\d+\.\d+\.\d+)\]?:\d+/)
  assert.ok(m, `cannot find envd's peer in:\n${ss.stdout}`)
  const hostEnd = m[1].split('.').map(Number)
  const aAddr = [...hostEnd.slice(0, 3), hostEnd[3] + 1].join('.')
  // Sanity: the host reaches sbx's program at that address.
  const direct = await new Promise((resolve) => {
    const c = net.connect({ host: aAddr, port: 8080, timeout: 3000 }, () => { c.destroy(); resolve(true) })
    c.on('error', () => resolve(false))
    c.on('timeout', () => { c.destroy(); resolve(false) })
  })
  assert.equal(direct, true, `the host cannot reach ${aAddr}:8080, so the address derivation is wrong`)

  // A service on the host, listening on every address.
  const listener = net.createServer((c) => c.destroy())
  await new Promise((resolve) => listener.listen(0, '0.0.0.0', resolve))
  const hostPort = listener.address().port
  const hostAddrs = Object.values(os.networkInterfaces()).flat()
    .filter((a) => a.family === 'IPv4' && !a.internal).map((a) => a.address)

  const b = await srv.create({ timeoutMs: 120_000 })
  try {
    const targets = [
      ['127.0.0.1', 49983], // b's own envd: proves the probe works
      [aAddr, 8080], [aAddr, 49983], // another sandbox
      ...hostAddrs.map((h) => [h, hostPort]), // the host
    ]
    const open = await reachableFrom(b, targets)
    assert.deepEqual(open, ['127.0.0.1:49983'], `sandbox ${b.sandboxId} reached: ${open.join(', ')} (of ${targets.length} probed)`)
  } finally {
    await srv.kill(b)
    listener.close()
  }
})

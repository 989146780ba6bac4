// Outbound network rules through the SDK, against a fake internet of the
// test's own (lib/internet.mjs): allowOut by domain over HTTPS (SNI) and
// HTTP (Host), wildcards, denyOut by CIDR, updateNetwork at runtime,
// refusals that fail at once and show in the sandbox's log, the platform's
// block list that allowOut cannot open, and maskRequestHost.

import assert from 'node:assert/strict'
import { after } from 'node:test'
import { Sandbox } from 'e2b'
import { useServer, rawRequest, waitFor } from './lib/server.mjs'
import { Internet, RANGE, DNS, A, B } from './lib/internet.mjs'

const net = new Internet('zqeg')
const srv = useServer({ tag: 'zqegr', cidr: '10.236.0.0/16', portHint: 18190, args: ['--dns', DNS, '--egress-allow', RANGE] })
srv.setup(() => net.start())
after(() => net.stop())

/** Runs curl in the sandbox; returns {ok, out, code, ms}. */
async function curl(sbx, args) {
  const start = performance.now()
  try {
    const r = await sbx.commands.run(`curl -sS --max-time 8 ${args}`)
    return { ok: true, out: r.stdout, code: 0, ms: performance.now() - start }
  } catch (err) {
    return { ok: false, out: `${err.stdout ?? ''}${err.stderr ?? ''}`, code: err.exitCode, ms: performance.now() - start }
  }
}

function refusedAtOnce(r, what) {
  assert.equal(r.ok, false, `${what} went through: ${r.out}`)
  assert.ok(r.ms < 3000, `${what} took ${r.ms} ms to fail (${r.out}): refusals must not time out`)
  assert.notEqual(r.code, 28, `${what} timed out instead of being refused: ${r.out}`)
}

srv.test('allowOut by domain: the allowed name answers over HTTPS and HTTP; other names and addresses are refused at once', async () => {
  const sbx = await srv.create({ network: { allowOut: ['api.allowed.test'], denyOut: ['0.0.0.0/0'] } })
  try {
    let r = await curl(sbx, '-k https://api.allowed.test/')
    assert.equal(r.out, `hello from ${A} for api.allowed.test\n`, JSON.stringify(r))
    r = await curl(sbx, 'http://api.allowed.test/')
    assert.equal(r.out, `hello from ${A} for api.allowed.test\n`, JSON.stringify(r))
    refusedAtOnce(await curl(sbx, '-k https://other.test/'), 'an HTTPS name not allowed')
    refusedAtOnce(await curl(sbx, 'http://allowed.test/'), 'the apex of an allowed subdomain')
    refusedAtOnce(await curl(sbx, `http://${A}:8080/`), 'an address on another port')
    // An allowed name sent to an address it does not resolve to.
    refusedAtOnce(await curl(sbx, `-k --resolve api.allowed.test:443:${B} https://api.allowed.test/`), 'an allowed SNI to another address')
    const info = await Sandbox.getInfo(sbx.sandboxId)
    assert.deepEqual(info.network?.allowOut ?? (await srv.api('GET', `/sandboxes/${sbx.sandboxId}`)).json.network.allowOut, ['api.allowed.test'])

    const logs = await waitFor(async () => {
      const l = (await srv.api('GET', `/v2/sandboxes/${sbx.sandboxId}/logs?search=egress`)).json.logs
      return l.some((e) => e.fields.domain === 'other.test') && l.some((e) => e.message === 'egress refused by address') && l
    }, { timeoutMs: 12_000, what: 'the refusals in the sandbox log' })
    assert.ok(logs.every((e) => e.level === 'warn'))
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('a wildcard allows subdomains, not the name itself', async () => {
  const sbx = await srv.create({ network: { allowOut: ['*.allowed.test'], denyOut: ['0.0.0.0/0'] } })
  try {
    assert.match((await curl(sbx, '-k https://deep.api.allowed.test/')).out, /hello from/)
    assert.match((await curl(sbx, 'http://api.allowed.test/')).out, /hello from/)
    refusedAtOnce(await curl(sbx, '-k https://allowed.test/'), 'the wildcard apex')
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('denyOut by CIDR with the internet open; updateNetwork replaces the rules at runtime', async () => {
  const sbx = await srv.create({ network: { denyOut: [`${B}/32`] } })
  try {
    assert.match((await curl(sbx, `http://${A}/`)).out, /hello from/)
    refusedAtOnce(await curl(sbx, `http://${B}/`), 'a denied address')
    refusedAtOnce(await curl(sbx, `http://${B}:8080/`), 'a denied address on another port')

    await Sandbox.updateNetwork(sbx.sandboxId, {})
    assert.match((await curl(sbx, `http://${B}:8080/`)).out, /hello from/, 'cleared rules still refuse')
    await Sandbox.updateNetwork(sbx.sandboxId, { allowOut: ['other.test'], denyOut: ['0.0.0.0/0'] })
    assert.match((await curl(sbx, 'http://other.test/')).out, new RegExp(`hello from ${B}`))
    refusedAtOnce(await curl(sbx, `http://${A}/`), 'an address denied by the update')
    assert.deepEqual((await srv.api('GET', `/sandboxes/${sbx.sandboxId}`)).json.network.denyOut, ['0.0.0.0/0'])
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('allowOut cannot open the platform block list; bad rules are 400', async () => {
  const sbx = await srv.create({ network: { allowOut: ['169.254.0.0/16', '10.0.0.0/8'] } })
  try {
    refusedAtOnce(await curl(sbx, 'http://169.254.169.254/'), 'the metadata address')
  } finally {
    await srv.kill(sbx)
  }
  for (const network of [{ allowOut: ['not a domain'] }, { denyOut: ['example.com'] }, { allowOut: ['*'] }, { allowOut: ['::1'] }]) {
    const res = await srv.api('POST', '/sandboxes', { body: { templateID: 'base', network } })
    assert.equal(res.status, 400, `${JSON.stringify(network)}: ${res.text}`)
  }
})

srv.test('maskRequestHost sets the Host that requests to the sandbox\'s ports arrive with', async () => {
  const sbx = await srv.create({ network: { maskRequestHost: 'localhost:${PORT}' } })
  try {
    await sbx.commands.run(`python3 -c '
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(self.headers["Host"].encode())
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()' >/dev/null 2>&1 &`)
    const host = sbx.getHost(8000)
    const res = await waitFor(async () => {
      const r = await rawRequest({ port: srv.port, path: '/', headers: { Host: host } })
      return r.status === 200 && r
    }, { timeoutMs: 10_000, what: 'the echo server' })
    assert.equal(res.text, 'localhost:8000')
  } finally {
    await srv.kill(sbx)
  }
})

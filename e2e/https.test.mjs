// The API over TLS with a certificate of the cluster's CA: the unmodified
// E2B SDKs (JavaScript with NODE_EXTRA_CA_CERTS, Python with SSL_CERT_FILE)
// and the aenv CLI (--ca-file, `aenv auth` storing the CA) trust it as the
// README says, and refuse it without that CA. The server runs with --https
// on loopback, which serves what it serves beyond loopback by default.
//
// NODE_EXTRA_CA_CERTS is read only when node starts, so the SDK runs in a
// child process per case.

import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { rawRequest, useServer } from './lib/server.mjs'

const srv = useServer({ tag: 'zqtls', cidr: '10.235.0.0/16', portHint: 18185, args: ['--https'] })
const here = path.dirname(fileURLToPath(import.meta.url))
const aenv = () => path.join(process.env.AENV_BIN_DIR, 'aenv')

/** The CA as `aenv cluster ca` prints it, in a file. */
function caFile() {
  const file = path.join(srv.tmp, 'aenv-ca.crt')
  fs.writeFileSync(file, execFileSync(aenv(), ['cluster', 'ca', '--data-dir', srv.dataDir]))
  return file
}

/** Runs the e2b JS SDK in a child node with env; returns its result. */
function runSDK(env) {
  const script = `
    import { Sandbox } from 'e2b'
    const sbx = await Sandbox.create('base')
    try {
      const r = await sbx.commands.run('echo over-tls')
      await sbx.files.write('/tmp/t.txt', 'tls file')
      console.log(JSON.stringify({ id: sbx.sandboxId, stdout: r.stdout, file: await sbx.files.read('/tmp/t.txt') }))
    } finally {
      await sbx.kill()
    }`
  return spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    cwd: here,
    env: { ...process.env, E2B_API_URL: srv.url, E2B_SANDBOX_URL: srv.url, E2B_API_KEY: srv.apiKey, ...env },
    encoding: 'utf8',
    timeout: 120_000,
  })
}

srv.test('the server serves a certificate of its CA for its names, which `aenv cluster ca` prints', async () => {
  assert.ok(srv.url.startsWith('https://'), srv.url)
  const pem = fs.readFileSync(caFile(), 'utf8')
  assert.match(pem, /^-----BEGIN CERTIFICATE-----/)
  assert.doesNotMatch(pem, /PRIVATE KEY/, 'the CA key was printed')
  const hash = execFileSync(aenv(), ['cluster', 'ca', '--hash', '--data-dir', srv.dataDir]).toString().trim()
  assert.match(hash, /^sha256:[0-9a-f]{64}$/)
  // Plain HTTP to the TLS port gets nothing from the API.
  const plain = await rawRequest({ port: srv.port, path: '/sandboxes', headers: { 'X-API-KEY': srv.apiKey } })
  assert.equal(plain.status, 400, plain.text)
  assert.doesNotMatch(plain.text, /sandboxID/)
})

srv.test('the JS SDK over https with NODE_EXTRA_CA_CERTS, and refused without it', async () => {
  const ok = runSDK({ NODE_EXTRA_CA_CERTS: caFile() })
  assert.equal(ok.status, 0, `SDK with the CA: ${ok.stderr}`)
  const out = JSON.parse(ok.stdout.trim().split('\n').pop())
  assert.equal(out.stdout, 'over-tls\n')
  assert.equal(out.file, 'tls file')

  const refused = runSDK({ NODE_EXTRA_CA_CERTS: '' })
  assert.notEqual(refused.status, 0, 'the SDK trusted a certificate of a CA it was not given')
  assert.match(refused.stderr, /certificate|self.signed|UNABLE_TO_VERIFY|fetch failed/i, refused.stderr)
})

srv.test('the Python SDK over https with SSL_CERT_FILE', async () => {
  const where = process.env.AENV_PYTHON_E2B || path.join(here, '..', '..', 'shared', 'python-e2b')
  const lib = path.join(where, 'lib')
  assert.ok(fs.existsSync(path.join(lib, 'e2b')), `the E2B Python SDK is not at ${lib} (AENV_PYTHON_E2B names it)`)
  const script = [
    'import sys', `sys.path.insert(0, ${JSON.stringify(lib)})`,
    'from e2b import Sandbox',
    "s = Sandbox.create('base')",
    'try:',
    "    print(s.commands.run('echo py-tls').stdout.strip())",
    'finally:',
    '    s.kill()',
  ].join('\n')
  const env = { ...process.env, E2B_API_URL: srv.url, E2B_SANDBOX_URL: srv.url, E2B_API_KEY: srv.apiKey, SSL_CERT_FILE: caFile() }
  const r = spawnSync('/usr/bin/python3', ['-c', script], { env, encoding: 'utf8', timeout: 120_000 })
  assert.equal(r.status, 0, r.stderr)
  assert.equal(r.stdout.trim(), 'py-tls')
  delete env.SSL_CERT_FILE
  const refused = spawnSync('/usr/bin/python3', ['-c', script], { env, encoding: 'utf8', timeout: 120_000 })
  assert.notEqual(refused.status, 0, 'the Python SDK trusted a certificate of a CA it was not given')
  assert.match(refused.stderr, /CERTIFICATE_VERIFY_FAILED|certificate/i, refused.stderr)
})

srv.test('the aenv CLI: --ca-file, and `aenv auth` stores the CA with the URL', async () => {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-tls-home-'))
  try {
    const keyFile = path.join(home, 'key')
    fs.writeFileSync(keyFile, srv.apiKey, { mode: 0o600 })
    const env = { ...process.env, HOME: home, XDG_CONFIG_HOME: '', AENV_API_KEY: '', E2B_API_KEY: '', AENV_API_URL: '', E2B_API_URL: '' }
    delete env.XDG_CONFIG_HOME
    const cli = (args) => spawnSync(aenv(), args, { env, encoding: 'utf8', timeout: 60_000 })

    const noCA = cli(['ls', '--url', srv.url, '--key-file', keyFile])
    assert.notEqual(noCA.status, 0, 'the CLI trusted the server without its CA')
    assert.match(noCA.stderr, /certificate/, noCA.stderr)

    const ls = cli(['ls', '--url', srv.url, '--key-file', keyFile, '--ca-file', caFile()])
    assert.equal(ls.status, 0, ls.stderr)

    const auth = cli(['auth', '--url', srv.url, '--key-file', keyFile, '--ca-file', caFile()])
    assert.equal(auth.status, 0, auth.stderr)
    const stored = JSON.parse(fs.readFileSync(path.join(home, '.config', 'aenv', 'credentials'), 'utf8'))
    assert.equal(stored.url, srv.url)
    assert.match(stored.ca, /BEGIN CERTIFICATE/)
    // From now on the stored URL, key and CA are enough.
    const created = cli(['create', 'base'])
    assert.equal(created.status, 0, created.stderr)
    const id = created.stdout.trim()
    srv.track(id)
    const ran = cli(['exec', id, '--', 'echo', 'cli-tls'])
    assert.equal(ran.status, 0, ran.stderr)
    assert.equal(ran.stdout.trim(), 'cli-tls')
    await srv.kill(id)
  } finally {
    fs.rmSync(home, { recursive: true, force: true })
  }
})

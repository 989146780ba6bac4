// Bad input to the control-plane API over raw HTTP (with the right key):
// every refusal is a 4xx with an E2B error body {code, message}, never a 5xx,
// and no refused request leaves a sandbox behind.

import assert from 'node:assert/strict'
import { useServer, randomTag } from './lib/server.mjs'

const srv = useServer({ tag: 'zqerr', cidr: '10.244.0.0/16', portHint: 18170 })

/** Asserts an E2B error body whose code equals the status. */
function assertError(res, status, what) {
  const statuses = Array.isArray(status) ? status : [status]
  assert.ok(statuses.includes(res.status), `${what}: status ${res.status} (want ${statuses.join(' or ')}); body ${res.text}`)
  assert.match(res.headers['content-type'] ?? '', /application\/json/, `${what}: content-type`)
  assert.ok(res.json && typeof res.json === 'object', `${what}: body is not JSON: ${res.text}`)
  assert.equal(res.json.code, res.status, `${what}: code in body`)
  assert.equal(typeof res.json.message, 'string', `${what}: message`)
  assert.ok(res.json.message.length > 0, `${what}: empty message`)
}

function assert4xx(res, what) {
  assert.ok(res.status >= 400 && res.status < 500, `${what}: status ${res.status}, want 4xx; body ${res.text}`)
  assertError(res, res.status, what)
}

const CREATE_ROUTES = ['/v2/sandboxes', '/sandboxes']

/**
 * POST a create. A sandbox the server creates is killed at once unless
 * keep is set: the callers expect refusals, and their assertions report the
 * wrong status, so a wrongly created sandbox must not also trip the final
 * "nothing left behind" check.
 */
async function create(body, route = '/v2/sandboxes', { keep = false } = {}) {
  const res = await srv.api('POST', route, { body })
  if (res.status === 201 && res.json?.sandboxID) {
    srv.track(res.json.sandboxID)
    if (!keep) await srv.kill(res.json.sandboxID)
  }
  return res
}

srv.test('malformed JSON is 400', async () => {
  for (const route of CREATE_ROUTES) {
    for (const body of ['{"templateID":', 'not json', '{"templateID":"base"} trailing', '[1,2', '{"timeout": 10,}']) {
      assertError(await create(body, route), 400, `POST ${route} ${body}`)
    }
  }
})

srv.test('wrongly typed fields are 400', async () => {
  for (const body of [
    '[]',
    '"base"',
    '{"templateID": 5}',
    '{"timeout": "300"}',
    '{"timeout": 1.5}',
    '{"metadata": "x"}',
    '{"metadata": {"k": 1}}',
    '{"envVars": ["A=1"]}',
  ]) {
    assertError(await create(body), 400, `create with ${body}`)
  }
})

srv.test('unknown templateID is 404 (or 400)', async () => {
  for (const templateID of ['nosuchtemplate' + randomTag(4), 'base2']) {
    assertError(await create({ templateID }), [404, 400], `templateID ${templateID}`)
  }
  for (const templateID of ['../base', 'Base', 'a/b', '.hidden', 'x'.repeat(300), '%2e%2e']) {
    assertError(await create({ templateID }), [400, 404], `templateID ${JSON.stringify(templateID)}`)
  }
})

srv.test('out-of-range timeouts are 400', async () => {
  for (const route of CREATE_ROUTES) {
    for (const timeout of [-1, -3600, 1e9, 86_401, 2 ** 53]) {
      assertError(await create({ templateID: 'base', timeout }, route), 400, `POST ${route} timeout ${timeout}`)
    }
  }
})

srv.test('a body over 1 MiB is 413', async () => {
  const body = JSON.stringify({ templateID: 'base', metadata: { big: 'x'.repeat((1 << 20) + 10) } })
  assertError(await create(body), 413, 'create with a 1 MiB+ body')
  // Also when the excess is in an unknown field.
  const body2 = JSON.stringify({ templateID: 'base', junk: 'y'.repeat(2 << 20) })
  assertError(await create(body2), 413, 'create with 2 MiB of junk')
})

srv.test('invalid metadata and envVars are refused', async () => {
  const tooMany = Object.fromEntries(Array.from({ length: 1000 }, (_, i) => [`k${i}`, 'v']))
  assert4xx(await create({ templateID: 'base', metadata: tooMany }), '1000 metadata keys')
  assert4xx(await create({ templateID: 'base', envVars: { 'BAD=NAME': 'x' } }), 'env name with =')
  assert4xx(await create({ templateID: 'base', envVars: { 'NUL\u0000': 'x' } }), 'env name with NUL')
})

srv.test('bad resource requests are refused', async () => {
  for (const extra of [{ cpuCount: -1 }, { cpuCount: 10_000 }, { memoryMB: -5 }, { memoryMB: 1 << 30 }]) {
    assert4xx(await create({ templateID: 'base', ...extra }), `create with ${JSON.stringify(extra)}`)
  }
})

const BAD_IDS = ['..%2F..%2Fetc', 'abc%2F..', '%2e%2e', '..%2f', '%2F', 'ABC', 'Abc123', 'a%00b', 'a.b', 'a-b', '%20', 'x'.repeat(300)]

srv.test('sandbox ids with path traversal or bad characters are 4xx on every route', async () => {
  for (const id of BAD_IDS) {
    const routes = [
      ['GET', `/sandboxes/${id}`],
      ['DELETE', `/sandboxes/${id}`],
      ['POST', `/sandboxes/${id}/timeout`, { timeout: 30 }],
      ['POST', `/sandboxes/${id}/refreshes`, { duration: 30 }],
      ['POST', `/sandboxes/${id}/connect`, { timeout: 30 }],
      ['POST', `/v2/sandboxes/${id}/connect`, { timeout: 30 }],
      ['POST', `/sandboxes/${id}/pause`],
      ['GET', `/sandboxes/${id}/metrics`],
    ]
    for (const [method, path, body] of routes) {
      const res = await srv.api(method, path, { body })
      assert4xx(res, `${method} ${path}`)
    }
  }
})

srv.test('list parameters are validated', async () => {
  for (const q of ['limit=0', 'limit=101', 'limit=abc', 'limit=-1', 'nextToken=!!!', 'nextToken=bm90LWEtdG9rZW4', 'state=bogus', 'state=running,bogus', 'metadata=%25zz']) {
    assertError(await srv.api('GET', `/v2/sandboxes?${q}`), 400, `GET /v2/sandboxes?${q}`)
  }
  const ok = await srv.api('GET', '/v2/sandboxes?limit=100&state=running,paused')
  assert.equal(ok.status, 200, ok.text)
  assert.ok(Array.isArray(ok.json))
})

srv.test('missing or wrong API key is 401 on every API route; /health needs none', async () => {
  for (const [method, path] of [
    ['GET', '/v2/sandboxes'],
    ['GET', '/sandboxes'],
    ['POST', '/v2/sandboxes'],
    ['GET', '/sandboxes/abc'],
    ['DELETE', '/sandboxes/abc'],
    ['POST', '/sandboxes/abc/timeout'],
    ['GET', '/templates'],
  ]) {
    assertError(await srv.api(method, path, { key: null, body: method === 'POST' ? {} : undefined }), 401, `${method} ${path} without key`)
    assertError(await srv.api(method, path, { key: 'e2b_deadbeef', body: method === 'POST' ? {} : undefined }), 401, `${method} ${path} with a wrong key`)
  }
  const health = await srv.api('GET', '/health', { key: null })
  assert.equal(health.status, 200)
})

srv.test('unknown routes and methods are 4xx JSON', async () => {
  assert4xx(await srv.api('GET', '/no/such/route'), 'GET /no/such/route')
  assert4xx(await srv.api('PUT', '/v2/sandboxes'), 'PUT /v2/sandboxes')
  assert4xx(await srv.api('PATCH', '/sandboxes/abc'), 'PATCH /sandboxes/abc')
})

srv.test('timeout / connect bodies on a real sandbox are validated', async () => {
  const res = await create({ templateID: 'base', timeout: 120, metadata: { suite: 'errors' } }, '/v2/sandboxes', { keep: true })
  assert.equal(res.status, 201, res.text)
  const id = res.json.sandboxID
  srv.track(id)
  try {
    assert.match(id, /^[a-z0-9]+$/)
    assert.equal(res.json.templateID, 'base')
    assert.match(res.json.envdVersion, /^\d+\.\d+\.\d+$/)
    assert.ok(typeof res.json.clientID === 'string')

    for (const body of ['{}', '{"timeout": 0}', '{"timeout": -1}', '{"timeout": 1e9}', '{"timeout": "60"}', '{"timeout":', 'null']) {
      assertError(await srv.api('POST', `/sandboxes/${id}/timeout`, { body }), 400, `timeout ${body}`)
    }
    for (const body of ['{"timeout": -1}', '{"timeout": 1e9}', '{"timeout":']) {
      assertError(await srv.api('POST', `/v2/sandboxes/${id}/connect`, { body }), 400, `connect ${body}`)
    }
    for (const body of ['{"duration": -1}', '{"duration": 1e9}', '{"duration":']) {
      assertError(await srv.api('POST', `/sandboxes/${id}/refreshes`, { body }), 400, `refreshes ${body}`)
    }
    // The sandbox is untouched by all that.
    const info = await srv.api('GET', `/sandboxes/${id}`)
    assert.equal(info.status, 200)
    assert.equal(info.json.state, 'running')
    assert.deepEqual(info.json.metadata, { suite: 'errors' })

    const ok = await srv.api('POST', `/sandboxes/${id}/timeout`, { body: { timeout: 60 } })
    assert.equal(ok.status, 204, ok.text)
    const conn = await srv.api('POST', `/v2/sandboxes/${id}/connect`, { body: { timeout: 60 } })
    assert.equal(conn.status, 200, conn.text)
    assert.equal(conn.json.sandboxID, id)

    const del = await srv.api('DELETE', `/sandboxes/${id}`)
    assert.equal(del.status, 204, del.text)
    assertError(await srv.api('DELETE', `/sandboxes/${id}`), 404, 'second DELETE')
    assertError(await srv.api('GET', `/sandboxes/${id}`), 404, 'GET after DELETE')
    assertError(await srv.api('POST', `/v2/sandboxes/${id}/connect`, { body: { timeout: 60 } }), 404, 'connect after DELETE')
    assertError(await srv.api('POST', `/sandboxes/${id}/timeout`, { body: { timeout: 60 } }), 404, 'timeout after DELETE')
  } finally {
    await srv.kill(id)
  }
})

srv.test('no refused request left a sandbox behind', async () => {
  for (const path of ['/v2/sandboxes', '/sandboxes', '/v2/sandboxes?state=running,paused']) {
    const res = await srv.api('GET', path)
    assert.equal(res.status, 200, res.text)
    assert.deepEqual(res.json, [], `${path} lists ${res.text}`)
  }
})

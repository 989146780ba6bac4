// The SDK's template builder (Template().fromTemplate(...)...; Template.build)
// against the server: steps, build logs streamed to onBuildLogs, and a start
// command that runs during the build, gated by its ready check, so that a
// sandbox of the template serves on its port from the first request.

import assert from 'node:assert/strict'
import { Template, waitForPort } from 'e2b'
import { useServer, randomTag, rawRequest } from './lib/server.mjs'

const srv = useServer({ tag: 'zqtpl', cidr: '10.238.0.0/16', portHint: 18130 })

srv.test('a template built with the SDK starts with its service up: getHost answers on the first try', { timeout: 300_000 }, async () => {
  const name = `site-${randomTag(6)}`
  const tpl = Template()
    .fromTemplate('base')
    .runCmd('mkdir -p /home/user/site && echo "built at $(date +%s)" > /home/user/site/index.html')
    .setEnvs({ SITE_GREETING: 'hello from the build' })
    .setWorkdir('/home/user/site')
    .setStartCmd('echo "$SITE_GREETING" > greeting.txt && python3 -m http.server 8080', waitForPort(8080))
  const logs = []
  await Template.build(tpl, name, { onBuildLogs: (e) => logs.push(e.message) })
  const all = logs.join('\n')
  assert.match(all, /Starting the service/, all)
  assert.match(all, /Service ready and snapshotted/, all)

  const sbx = await srv.create({ template: name })
  try {
    // No retry: the service was up before the sandbox existed.
    const res = await rawRequest({ port: srv.port, path: '/index.html', headers: { Host: sbx.getHost(8080) } })
    assert.equal(res.status, 200, res.text)
    assert.match(res.text, /^built at \d+/)
    const greeting = await rawRequest({ port: srv.port, path: '/greeting.txt', headers: { Host: sbx.getHost(8080) } })
    assert.equal(greeting.text, 'hello from the build\n')
    // The service runs as a process of the sandbox, started before it.
    const ps = await sbx.commands.run('pgrep -f "http.server 8080"')
    assert.equal(ps.exitCode, 0)
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('build steps have network: aptInstall fetches from the Debian mirror', { timeout: 300_000 }, async () => {
  const name = `apt-${randomTag(6)}`
  const tpl = Template().fromTemplate('base').aptInstall(['jq'])
  const logs = []
  await Template.build(tpl, name, { onBuildLogs: (e) => logs.push(e.message) })
  const sbx = await srv.create({ template: name })
  try {
    const r = await sbx.commands.run(`echo '{"a": 41}' | jq '.a + 1'`)
    assert.equal(r.stdout, '42\n')
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('a start command whose ready check never passes fails the build with the reason', { timeout: 300_000 }, async () => {
  const name = `broken-${randomTag(6)}`
  const tpl = Template().fromTemplate('base').setStartCmd('exit 3', waitForPort(9999))
  const logs = []
  await assert.rejects(Template.build(tpl, name, { onBuildLogs: (e) => logs.push(e.message) }), (err) => {
    assert.match(err.message, /start command/, err.message)
    assert.match(err.message, /exited with 3/, err.message)
    return true
  })
})

// Volumes through the unmodified SDK: Volume.create/list/getInfo/destroy,
// volumeMounts on create, the Volume data plane (E2B_VOLUME_API_URL set to
// the server, as self-hosted users do), sharing between sandboxes and
// outliving them.

import assert from 'node:assert/strict'
import { Sandbox, Volume, VolumeNotFoundError } from 'e2b'
import { useServer, randomTag, rawRequest } from './lib/server.mjs'

const srv = useServer({ tag: 'zqvol', cidr: '10.237.0.0/16', portHint: 18110 })
srv.setup(async () => {
  process.env.E2B_VOLUME_API_URL = srv.url
})

srv.test('a volume written by one sandbox is read by another after the first is killed; the SDK reads and writes it too', async () => {
  const vol = await Volume.create(`data-${randomTag(6)}`)
  assert.match(vol.volumeId, /^[a-z0-9]+$/)
  await vol.writeFile('/notes/from-sdk.txt', 'written through the data plane\n', { force: true })

  const a = await srv.create({ volumeMounts: { '/mnt/data': vol } })
  let b
  try {
    assert.equal((await a.commands.run('cat /mnt/data/notes/from-sdk.txt')).stdout, 'written through the data plane\n')
    await a.commands.run('echo "from sandbox a" > /mnt/data/from-a.txt && mkdir -p /mnt/data/dir && echo x > /mnt/data/dir/x')
    // Not in the pool's way: the mount is this sandbox's alone.
    const other = await srv.create()
    assert.notEqual((await other.commands.run('test -e /mnt/data/from-a.txt').catch((e) => e)).exitCode, 0)
    await srv.kill(other)
    await srv.kill(a)

    b = await srv.create({ volumeMounts: { '/work': vol.name } })
    assert.equal((await b.commands.run('cat /work/from-a.txt')).stdout, 'from sandbox a\n')
    assert.equal((await b.commands.run('stat -c %U /work/from-a.txt')).stdout.trim(), 'user')

    assert.equal(await vol.readFile('/from-a.txt'), 'from sandbox a\n')
    const listed = (await vol.list('/', { depth: 2 })).map((e) => `${e.type}:${e.path}`).sort()
    assert.deepEqual(listed, ['directory:/dir', 'directory:/notes', 'file:/dir/x', 'file:/from-a.txt', 'file:/notes/from-sdk.txt'])
    const info = await vol.getInfo('/from-a.txt')
    assert.equal(info.size, 'from sandbox a\n'.length)
    assert.ok(info.mtime instanceof Date)
    await vol.remove('/dir')
    assert.equal(await vol.exists('/dir'), false)
    assert.equal((await b.commands.run('test -e /work/dir').catch((e) => e)).exitCode, 1, 'the sandbox still sees a removed directory')

    // A mounted volume is not deleted from under its sandbox.
    await assert.rejects(Volume.destroy(vol.volumeId), /mounted/)
  } finally {
    await srv.kill(a)
    await srv.kill(b)
  }
  assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId && v.name === vol.name))
  assert.equal(await Volume.destroy(vol.volumeId), true)
  await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
  assert.equal(await Volume.destroy(vol.volumeId), false)
})

srv.test('a paused sandbox resumes with its volume mounted; bad mounts and bad tokens are refused', async () => {
  const vol = await Volume.create(`keep-${randomTag(6)}`)
  const sbx = await srv.create({ volumeMounts: { '/mnt/v': vol } })
  try {
    await sbx.commands.run('echo before > /mnt/v/f')
    await sbx.pause()
    const back = await Sandbox.connect(sbx.sandboxId)
    await back.commands.run('echo after >> /mnt/v/f')
    assert.equal(await vol.readFile('/f'), 'before\nafter\n')
  } finally {
    await srv.kill(sbx)
  }

  const unknown = await srv.api('POST', '/sandboxes', { body: { templateID: 'base', volumeMounts: [{ name: 'no-such-volume', path: '/mnt/x' }] } })
  assert.equal(unknown.status, 404, unknown.text)
  const relative = await srv.api('POST', '/sandboxes', { body: { templateID: 'base', volumeMounts: [{ name: vol.name, path: 'mnt' }] } })
  assert.equal(relative.status, 400, relative.text)
  const twice = await srv.api('POST', '/volumes', { body: { name: vol.name } })
  assert.equal(twice.status, 409, twice.text)
  const badName = await srv.api('POST', '/volumes', { body: { name: '../etc' } })
  assert.equal(badName.status, 400, badName.text)

  const wrong = await rawRequest({ port: srv.port, path: `/volumecontent/${vol.volumeId}/file?path=/f`, headers: { Authorization: 'Bearer nope' } })
  assert.equal(wrong.status, 401, wrong.text)
  const none = await rawRequest({ port: srv.port, path: `/volumecontent/${vol.volumeId}/file?path=/f` })
  assert.equal(none.status, 401, none.text)
  const escape = await rawRequest({ port: srv.port, path: `/volumecontent/${vol.volumeId}/file?path=../../../etc/passwd`, headers: { Authorization: `Bearer ${vol.token}` } })
  assert.equal(escape.status, 404, escape.text)
  assert.equal(await Volume.destroy(vol.volumeId), true)
})

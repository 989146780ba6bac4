// Files through the e2b SDK: read/write (text, binary, several at once),
// list, getInfo, exists, makeDir, rename, remove, watchDir.

import assert from 'node:assert/strict'
import crypto from 'node:crypto'
import { FileNotFoundError, NotFoundError, SandboxError, FileType } from 'e2b'
import { useServer, randomTag, rejectsWith, waitFor } from './lib/server.mjs'

const srv = useServer({ tag: 'zqfile', cidr: '10.242.0.0/16', portHint: 18140 })

/** @type {import('e2b').Sandbox} */
let sbx
let base // a fresh directory per test run
srv.setup(async () => {
  sbx = await srv.create({ timeoutMs: 600_000, metadata: { suite: 'files' } })
  base = `/home/user/e2e-${randomTag(6)}`
}, { timeout: 60_000 })

const sha256 = (buf) => crypto.createHash('sha256').update(buf).digest('hex')

srv.test('write and read text', async () => {
  const p = `${base}/hello.txt`
  const text = 'h\u00e9llo w\u00f6rld \u4e2d\u6587\nsecond line\n'
  const info = await sbx.files.write(p, text)
  assert.equal(info.name, 'hello.txt')
  assert.equal(info.path, p)
  assert.equal(info.type, FileType.FILE)

  assert.equal(await sbx.files.read(p), text)
  assert.equal(await sbx.files.read(p, { format: 'text' }), text)
  assert.equal(Buffer.from(await sbx.files.read(p, { format: 'bytes' })).toString('utf8'), text)
  const blob = await sbx.files.read(p, { format: 'blob' })
  assert.equal(await blob.text(), text)

  // Overwriting with something shorter truncates.
  await sbx.files.write(p, 'short')
  assert.equal(await sbx.files.read(p), 'short')

  // An empty file reads back empty.
  await sbx.files.write(`${base}/empty`, '')
  assert.equal(await sbx.files.read(`${base}/empty`), '')
  assert.equal((await sbx.files.read(`${base}/empty`, { format: 'bytes' })).length, 0)

  // The file belongs to the default user and commands see the same bytes.
  const r = await sbx.commands.run(`stat -c '%U %G %s' ${p}; cat ${p}`)
  assert.equal(r.stdout, 'user user 5\nshort')

  // Missing file.
  const err = await rejectsWith(sbx.files.read(`${base}/missing.txt`), FileNotFoundError, 'read of a missing file')
  assert.ok(err instanceof NotFoundError && err instanceof SandboxError)
})

srv.test('1 MiB of random bytes round-trips (multipart and octet-stream)', async () => {
  const data = crypto.randomBytes(1 << 20)
  for (const [name, opts] of [['multipart', {}], ['octet', { useOctetStream: true }]]) {
    const p = `${base}/bin/${name}.bin`
    const info = await sbx.files.write(p, data, opts)
    assert.equal(info.path, p, name)
    const back = await sbx.files.read(p, { format: 'bytes' })
    assert.ok(back instanceof Uint8Array, name)
    assert.equal(back.length, data.length, name)
    assert.ok(Buffer.compare(Buffer.from(back), data) === 0, `${name}: bytes differ`)
    const r = await sbx.commands.run(`sha256sum ${p} | cut -d' ' -f1; stat -c %s ${p}`)
    assert.equal(r.stdout, `${sha256(data)}\n${data.length}\n`, name)
  }

  // A Blob and an ArrayBuffer are accepted too.
  const small = crypto.randomBytes(4096)
  await sbx.files.write(`${base}/bin/blob.bin`, new Blob([small]))
  await sbx.files.write(`${base}/bin/ab.bin`, small.buffer.slice(small.byteOffset, small.byteOffset + small.length))
  for (const f of ['blob.bin', 'ab.bin']) {
    const back = await sbx.files.read(`${base}/bin/${f}`, { format: 'bytes' })
    assert.ok(Buffer.compare(Buffer.from(back), small) === 0, f)
  }
})

srv.test('streams: read as a stream, write from a stream, gzip', async () => {
  const data = crypto.randomBytes(512 * 1024)
  const p = `${base}/stream/in.bin`
  // Upload from a ReadableStream (the SDK sends it as one octet-stream body).
  const src = new ReadableStream({
    start(controller) {
      for (let off = 0; off < data.length; off += 64 * 1024) controller.enqueue(new Uint8Array(data.subarray(off, off + 64 * 1024)))
      controller.close()
    },
  })
  const info = await sbx.files.write(p, src)
  assert.equal(info.path, p)

  const stream = await sbx.files.read(p, { format: 'stream' })
  const chunks = []
  for await (const c of stream) chunks.push(Buffer.from(c))
  assert.ok(Buffer.compare(Buffer.concat(chunks), data) === 0, 'streamed read differs')

  // gzip both ways.
  const gp = `${base}/stream/gz.txt`
  const text = 'compress me '.repeat(10_000)
  await sbx.files.write(gp, text, { gzip: true })
  assert.equal(await sbx.files.read(gp, { gzip: true }), text)
  assert.equal(await sbx.files.read(gp), text)
})

srv.test('writing over a directory or reading a directory is an error', async () => {
  await sbx.files.makeDir(`${base}/isdir`)
  await assert.rejects(sbx.files.write(`${base}/isdir`, 'x'), SandboxError)
  await assert.rejects(sbx.files.read(`${base}/isdir`), SandboxError)
  assert.equal((await sbx.files.getInfo(`${base}/isdir`)).type, FileType.DIR)
})

srv.test('write several files at once', async () => {
  const dir = `${base}/multi`
  const bytes = crypto.randomBytes(10_000)
  const entries = [
    { path: `${dir}/a.txt`, data: 'A' },
    { path: `${dir}/sub/deeper/b.txt`, data: 'BB' },
    { path: `${dir}/c.bin`, data: bytes },
  ]
  const infos = await sbx.files.write(entries)
  assert.ok(Array.isArray(infos), 'array form must return an array')
  assert.deepEqual(infos.map((i) => i.path).sort(), entries.map((e) => e.path).sort())
  for (const i of infos) {
    assert.equal(i.type, FileType.FILE)
    assert.equal(i.name, i.path.split('/').at(-1))
  }
  assert.equal(await sbx.files.read(`${dir}/a.txt`), 'A')
  assert.equal(await sbx.files.read(`${dir}/sub/deeper/b.txt`), 'BB')
  assert.ok(Buffer.compare(Buffer.from(await sbx.files.read(`${dir}/c.bin`, { format: 'bytes' })), bytes) === 0)

  // writeFiles is the same call; with octet-stream every file is its own upload.
  const infos2 = await sbx.files.writeFiles([
    { path: `${dir}/d.txt`, data: 'D' },
    { path: `${dir}/e.txt`, data: 'E' },
  ], { useOctetStream: true })
  assert.deepEqual(infos2.map((i) => i.path).sort(), [`${dir}/d.txt`, `${dir}/e.txt`])
  assert.equal(await sbx.files.read(`${dir}/e.txt`), 'E')

  // An empty array writes nothing.
  assert.deepEqual(await sbx.files.write([]), [])
})

srv.test('list a directory', async () => {
  const dir = `${base}/ls`
  await sbx.files.makeDir(`${dir}/sub`)
  await sbx.files.write(`${dir}/f.txt`, '12345')
  await sbx.files.write(`${dir}/sub/inner.txt`, 'x')
  await sbx.commands.run(`ln -s f.txt ${dir}/link`)

  const entries = await sbx.files.list(dir)
  const byName = Object.fromEntries(entries.map((e) => [e.name, e]))
  assert.deepEqual(Object.keys(byName).sort(), ['f.txt', 'link', 'sub'])
  assert.equal(byName['f.txt'].type, FileType.FILE)
  assert.equal(byName['f.txt'].path, `${dir}/f.txt`)
  assert.equal(byName['f.txt'].size, 5)
  assert.equal(byName.sub.type, FileType.DIR)
  assert.equal(byName.sub.path, `${dir}/sub`)
  assert.equal(byName.link.type, FileType.SYMLINK)
  assert.match(byName.link.symlinkTarget ?? '', /(^|\/)f\.txt$/, `symlinkTarget ${byName.link.symlinkTarget}`)

  // depth 2 includes the nested file.
  const deep = await sbx.files.list(dir, { depth: 2 })
  assert.deepEqual(deep.map((e) => e.path).sort(), [`${dir}/f.txt`, `${dir}/link`, `${dir}/sub`, `${dir}/sub/inner.txt`])

  await rejectsWith(sbx.files.list(`${base}/no-such-dir`), FileNotFoundError, 'list of a missing directory')
})

srv.test('getInfo of files and directories', async () => {
  const p = `${base}/info/file.txt`
  const t = Date.now()
  await sbx.files.write(p, 'abcdef')
  const fi = await sbx.files.getInfo(p)
  assert.equal(fi.name, 'file.txt')
  assert.equal(fi.path, p)
  assert.equal(fi.type, FileType.FILE)
  assert.equal(fi.size, 6)
  assert.equal(fi.owner, 'user')
  assert.equal(fi.group, 'user')
  assert.match(fi.permissions, /^-rw-/)
  assert.equal(fi.mode & 0o777, parseInt(fi.permissions.slice(1).replace(/./g, (c) => (c === '-' ? '0' : '1')), 2))
  assert.ok(fi.modifiedTime instanceof Date, `modifiedTime ${fi.modifiedTime}`)
  assert.ok(Math.abs(fi.modifiedTime.getTime() - t) < 60_000, `modifiedTime ${fi.modifiedTime.toISOString()} far from now`)

  const di = await sbx.files.getInfo(`${base}/info`)
  assert.equal(di.type, FileType.DIR)
  assert.equal(di.name, 'info')
  assert.match(di.permissions, /^drwx/)

  await rejectsWith(sbx.files.getInfo(`${base}/info/missing`), FileNotFoundError, 'getInfo of a missing path')
})

srv.test('exists', async () => {
  await sbx.files.write(`${base}/ex/yes.txt`, 'y')
  assert.equal(await sbx.files.exists(`${base}/ex/yes.txt`), true)
  assert.equal(await sbx.files.exists(`${base}/ex`), true)
  assert.equal(await sbx.files.exists(`${base}/ex/no.txt`), false)
  assert.equal(await sbx.files.exists(`${base}/nope/deeper/no.txt`), false)
})

srv.test('makeDir creates parents and reports existing directories', async () => {
  const d = `${base}/mk/a/b/c`
  assert.equal(await sbx.files.makeDir(d), true)
  assert.equal((await sbx.files.getInfo(d)).type, FileType.DIR)
  assert.equal((await sbx.files.getInfo(`${base}/mk/a/b`)).type, FileType.DIR)
  assert.equal(await sbx.files.makeDir(d), false, 'makeDir of an existing directory must return false')
  const r = await sbx.commands.run(`stat -c %U ${d}`)
  assert.equal(r.stdout, 'user\n')
})

srv.test('rename files and directories', async () => {
  const dir = `${base}/mv`
  await sbx.files.write(`${dir}/old.txt`, 'content')
  const e = await sbx.files.rename(`${dir}/old.txt`, `${dir}/new.txt`)
  assert.equal(e.name, 'new.txt')
  assert.equal(e.path, `${dir}/new.txt`)
  assert.equal(e.type, FileType.FILE)
  assert.equal(await sbx.files.exists(`${dir}/old.txt`), false)
  assert.equal(await sbx.files.read(`${dir}/new.txt`), 'content')

  // Directories move with their contents.
  await sbx.files.write(`${dir}/d1/x.txt`, 'x')
  const d = await sbx.files.rename(`${dir}/d1`, `${dir}/d2`)
  assert.equal(d.type, FileType.DIR)
  assert.equal(await sbx.files.read(`${dir}/d2/x.txt`), 'x')
  assert.equal(await sbx.files.exists(`${dir}/d1`), false)

  await rejectsWith(sbx.files.rename(`${dir}/missing`, `${dir}/other`), FileNotFoundError, 'rename of a missing path')
})

srv.test('remove files and directories', async () => {
  const dir = `${base}/rm`
  await sbx.files.write(`${dir}/f.txt`, 'f')
  await sbx.files.write(`${dir}/tree/a/b.txt`, 'b')
  await sbx.files.remove(`${dir}/f.txt`)
  assert.equal(await sbx.files.exists(`${dir}/f.txt`), false)
  await sbx.files.remove(`${dir}/tree`)
  assert.equal(await sbx.files.exists(`${dir}/tree`), false)
  assert.deepEqual(await sbx.files.list(dir), [])
})

srv.test('the user option: files written as root belong to root', async () => {
  // As in E2B, envd acts for the named user when creating files (ownership,
  // home directory); it is not a permission boundary inside the sandbox.
  const p = `/root/secret-${randomTag(6)}.txt`
  const info = await sbx.files.write(p, 'top secret', { user: 'root' })
  assert.equal(info.path, p)
  const r = await sbx.commands.run(`stat -c %U:%G ${p}`, { user: 'root' })
  assert.equal(r.stdout, 'root:root\n')
  assert.equal(await sbx.files.read(p, { user: 'root' }), 'top secret')
  assert.equal((await sbx.files.getInfo(p, { user: 'root' })).owner, 'root')

  // A relative path is relative to that user's home.
  const name = `rootrel-${randomTag(6)}.txt`
  await sbx.files.write(name, 'r', { user: 'root' })
  assert.equal(await sbx.files.read(`/root/${name}`, { user: 'root' }), 'r')
  assert.equal(await sbx.files.exists(`/home/user/${name}`), false)

  // Parent directories created for the default user belong to it.
  const d = `${base}/owned/x/y`
  await sbx.files.write(`${d}/f.txt`, 'f')
  const o = await sbx.commands.run(`stat -c %U ${base}/owned ${base}/owned/x ${d} ${d}/f.txt`)
  assert.equal(o.stdout, 'user\nuser\nuser\nuser\n')
})

srv.test('relative paths resolve against the user home', async () => {
  const name = `rel-${randomTag(6)}.txt`
  await sbx.files.write(name, 'relative')
  assert.equal(await sbx.files.read(`/home/user/${name}`), 'relative')
  assert.equal(await sbx.files.read(name), 'relative')
  await sbx.files.remove(name)
})

srv.test('watchDir reports files created and written afterwards', async () => {
  const dir = `${base}/watch`
  await sbx.files.makeDir(dir)
  const events = []
  let exit = 'still running'
  const handle = await sbx.files.watchDir(dir, (ev) => events.push(ev), {
    timeoutMs: 60_000,
    onExit: (err) => { exit = err ? `ended with ${err.constructor.name}: ${err.message}` : 'ended' },
  })
  try {
    await sbx.files.write(`${dir}/new.txt`, 'hello')
    await waitFor(() => {
      const types = new Set(events.filter((e) => e.name === 'new.txt').map((e) => e.type))
      return types.has('create') && types.has('write')
    }, { timeoutMs: 10_000, what: () => `create and write events for new.txt (got ${JSON.stringify(events)}; watch stream ${exit})` })

    // Changes made by a command are seen too.
    await sbx.commands.run(`echo x > ${dir}/by-cmd.txt`)
    await waitFor(() => events.some((e) => e.name === 'by-cmd.txt' && e.type === 'create'),
      { timeoutMs: 10_000, what: () => `a create event for by-cmd.txt (got ${JSON.stringify(events)}; watch stream ${exit})` })

    await sbx.files.remove(`${dir}/new.txt`)
    await waitFor(() => events.some((e) => e.name === 'new.txt' && e.type === 'remove'),
      { timeoutMs: 10_000, what: () => `a remove event for new.txt (got ${JSON.stringify(events)}; watch stream ${exit})` })

    // Without recursive, events in subdirectories are not reported.
    await sbx.files.makeDir(`${dir}/sub`)
    await sbx.files.write(`${dir}/sub/inner.txt`, 'i')
    await sbx.files.write(`${dir}/after.txt`, 'a')
    await waitFor(() => events.some((e) => e.name === 'after.txt'), { timeoutMs: 10_000, what: () => `events for after.txt (got ${JSON.stringify(events)}; watch stream ${exit})` })
    assert.ok(!events.some((e) => e.name.includes('inner.txt')), `non-recursive watch reported ${JSON.stringify(events)}`)
  } finally {
    await handle.stop()
  }

  // After stop no more events arrive.
  const n = events.length
  await sbx.files.write(`${dir}/late.txt`, 'late')
  await new Promise((r) => setTimeout(r, 1000))
  assert.equal(events.length, n, 'events arrived after stop()')

  await rejectsWith(sbx.files.watchDir(`${base}/no-such-dir`, () => {}), FileNotFoundError, 'watchDir of a missing directory')
})

srv.test('recursive watchDir reports events in subdirectories', async () => {
  const dir = `${base}/rwatch`
  await sbx.files.makeDir(`${dir}/sub`)
  const events = []
  let exit = 'still running'
  const handle = await sbx.files.watchDir(dir, (ev) => events.push(ev), {
    recursive: true,
    timeoutMs: 60_000,
    onExit: (err) => { exit = err ? `ended with ${err.constructor.name}: ${err.message}` : 'ended' },
  })
  try {
    await sbx.files.write(`${dir}/sub/inner.txt`, 'i')
    await waitFor(() => events.some((e) => e.name === 'sub/inner.txt' && e.type === 'create'),
      { timeoutMs: 10_000, what: () => `a create event named sub/inner.txt (got ${JSON.stringify(events)}; watch stream ${exit})` })
  } finally {
    await handle.stop()
  }
})

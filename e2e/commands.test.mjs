// Commands through the e2b SDK: output, exit codes, streaming callbacks,
// envs/cwd/user, background commands, stdin, timeouts.

import assert from 'node:assert/strict'
import { CommandExitError, SandboxError, TimeoutError } from 'e2b'
import { useServer, randomTag, rejectsWith, waitFor, sleep } from './lib/server.mjs'

const srv = useServer({ tag: 'zqcmd', cidr: '10.241.0.0/16', portHint: 18120 })

/** @type {import('e2b').Sandbox} */
let sbx
srv.setup(async () => {
  sbx = await srv.create({ timeoutMs: 600_000, metadata: { suite: 'commands' } })
}, { timeout: 60_000 })

async function pidsRunning() {
  return (await sbx.commands.list()).map((p) => p.pid)
}

srv.test('the default user has passwordless sudo, as on E2B', async () => {
  const r = await sbx.commands.run('sudo -n id -u && sudo -n sh -c "echo root-wrote > /etc/aenv-sudo-test" && cat /etc/aenv-sudo-test && id -un')
  assert.equal(r.stdout, '0\nroot-wrote\nuser\n')
})

srv.test('stdout and stderr are captured separately', async () => {
  const r = await sbx.commands.run('echo out; echo err >&2; printf "no newline"')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'out\nno newline')
  assert.equal(r.stderr, 'err\n')
  assert.ok(!r.error, `error ${r.error}`)
})

srv.test('non-zero exit throws CommandExitError with exitCode, stdout, stderr', async () => {
  const err = await rejectsWith(sbx.commands.run('echo partial; echo bad >&2; exit 3'), CommandExitError)
  assert.ok(err instanceof SandboxError)
  assert.equal(err.exitCode, 3)
  assert.equal(err.stdout, 'partial\n')
  assert.equal(err.stderr, 'bad\n')

  const err2 = await rejectsWith(sbx.commands.run('no-such-command-xyz'), CommandExitError)
  assert.equal(err2.exitCode, 127)
  assert.match(err2.stderr, /no-such-command-xyz: command not found/)

  // A background handle's wait() throws the same way.
  const h = await sbx.commands.run('exit 42', { background: true })
  const err3 = await rejectsWith(h.wait(), CommandExitError)
  assert.equal(err3.exitCode, 42)
  assert.equal(h.exitCode, 42)
})

srv.test('onStdout / onStderr arrive while the command runs', async () => {
  const events = []
  const t0 = performance.now()
  const r = await sbx.commands.run('echo a; echo x >&2; sleep 2; echo b; echo y >&2', {
    onStdout: (d) => events.push({ stream: 'out', d, t: performance.now() - t0 }),
    onStderr: (d) => events.push({ stream: 'err', d, t: performance.now() - t0 }),
  })
  const tEnd = performance.now() - t0
  assert.equal(r.stdout, 'a\nb\n')
  assert.equal(r.stderr, 'x\ny\n')
  const out = events.filter((e) => e.stream === 'out')
  const err = events.filter((e) => e.stream === 'err')
  assert.equal(out.map((e) => e.d).join(''), 'a\nb\n')
  assert.equal(err.map((e) => e.d).join(''), 'x\ny\n')
  const tA = out.find((e) => e.d.includes('a')).t
  const tX = err.find((e) => e.d.includes('x')).t
  const tB = out.find((e) => e.d.includes('b')).t
  // "a" and "x" must be delivered about 2 s before the command ends.
  assert.ok(tEnd - tA >= 1500, `"a" arrived at ${tA} ms, command ended at ${tEnd} ms: output is not streamed (${JSON.stringify(events)})`)
  assert.ok(tEnd - tX >= 1500, `"x" arrived at ${tX} ms, command ended at ${tEnd} ms: stderr is not streamed`)
  assert.ok(tB - tA >= 1500, `"b" at ${tB} ms only ${tB - tA} ms after "a"`)
})

srv.test('large output arrives complete and in order', async () => {
  const r = await sbx.commands.run('seq 1 100000')
  const want = Array.from({ length: 100000 }, (_, i) => `${i + 1}\n`).join('')
  assert.equal(r.stdout.length, want.length)
  assert.ok(r.stdout === want, 'seq output differs')

  // Binary-ish output with multi-byte UTF-8 split across chunks.
  const r2 = await sbx.commands.run(`python3 -c 'import sys; sys.stdout.write("\u00e9\u4e2d" * 50000)'`)
  assert.equal(r2.stdout, '\u00e9\u4e2d'.repeat(50000))
})

srv.test('envs and cwd options', async () => {
  const r = await sbx.commands.run('echo "$A|$B|$C"; pwd', {
    envs: { A: '1', B: 'two words', C: 'quote"s $dollar' },
    cwd: '/tmp',
  })
  assert.equal(r.stdout, '1|two words|quote"s $dollar\n/tmp\n')

  // Request envs do not leak into the next command.
  const r2 = await sbx.commands.run('echo "[$A]"')
  assert.equal(r2.stdout, '[]\n')

  // The default working directory is the user's home.
  const r3 = await sbx.commands.run('pwd')
  assert.equal(r3.stdout, '/home/user\n')

  // A cwd that does not exist is an error, not a silent fallback.
  await assert.rejects(sbx.commands.run('pwd', { cwd: '/does/not/exist' }), SandboxError)
})

srv.test('user option: default user is "user", root on request', async () => {
  const def = await sbx.commands.run('whoami; id -u; echo "$HOME"')
  assert.equal(def.stdout, 'user\n1000\n/home/user\n')

  const root = await sbx.commands.run('whoami; id -u; echo "$HOME"; pwd', { user: 'root' })
  assert.equal(root.stdout, 'root\n0\n/root\n/root\n')

  const user = await sbx.commands.run('whoami', { user: 'user' })
  assert.equal(user.stdout, 'user\n')

  // Root can do what the user cannot.
  await rejectsWith(sbx.commands.run('touch /etc/e2e-denied'), CommandExitError, 'user writing /etc')
  await sbx.commands.run('touch /etc/e2e-allowed && rm /etc/e2e-allowed', { user: 'root' })

  // An unknown user is refused.
  await assert.rejects(sbx.commands.run('whoami', { user: 'nosuchuser' + randomTag(4) }))
})

srv.test('background command: list shows it, kill ends it and its children', async () => {
  const secs = `300.${Math.floor(Math.random() * 1e6)}`
  const h = await sbx.commands.run(`sleep ${secs}; echo after`, { background: true, timeoutMs: 0 })
  try {
    assert.ok(Number.isInteger(h.pid) && h.pid > 0, `pid ${h.pid}`)
    assert.equal(h.exitCode, undefined)

    const listed = (await sbx.commands.list()).find((p) => p.pid === h.pid)
    assert.ok(listed, `pid ${h.pid} not in commands.list()`)
    assert.equal(listed.cmd, '/bin/bash')
    assert.deepEqual(listed.args, ['-l', '-c', `sleep ${secs}; echo after`])
    assert.equal(listed.cwd, '/home/user')

    assert.equal(await sbx.commands.kill(h.pid), true)
    const t = performance.now()
    const err = await rejectsWith(h.wait(), CommandExitError, 'wait on a killed command')
    assert.notEqual(err.exitCode, 0)
    assert.ok(performance.now() - t < 5000, 'killed command took too long to end')
    await waitFor(async () => !(await pidsRunning()).includes(h.pid), { timeoutMs: 5000, what: 'killed pid to leave the list' })
    assert.equal(await sbx.commands.kill(h.pid), false, 'killing a finished command must report false')
    const ps = await sbx.commands.run(`ps -eo args | grep -c '^sleep ${secs}' || true`)
    assert.equal(ps.stdout.trim(), '0', `the killed command's child "sleep ${secs}" survived`)
  } finally {
    await sbx.commands.kill(h.pid).catch(() => {})
  }
})

srv.test('stdin: sendStdin and closeStdin to cat', async () => {
  const chunks = []
  const h = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => chunks.push(d) })
  try {
    await h.sendStdin('hello\n')
    await waitFor(() => chunks.join('') === 'hello\n', { timeoutMs: 5000, what: 'cat to echo the first line' })
    await sbx.commands.sendStdin(h.pid, 'world\n')
    await waitFor(() => chunks.join('') === 'hello\nworld\n', { timeoutMs: 5000, what: 'cat to echo the second line' })
    await h.sendStdin(new Uint8Array([0xc3, 0xa9, 0x0a]))
    await h.closeStdin()
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello\nworld\n\u00e9\n')
  } finally {
    await h.kill().catch(() => {})
  }
})

srv.test('without stdin: true, a command reading stdin sees EOF at once', async () => {
  const t = performance.now()
  const r = await sbx.commands.run('cat; echo "rc=$?"', { timeoutMs: 15_000 })
  assert.equal(r.stdout, 'rc=0\n')
  assert.ok(performance.now() - t < 10_000)
})

srv.test('timeoutMs bounds a command: error quickly, process and children killed', async () => {
  // A unique sleep length names the child in ps; "; echo" keeps bash from
  // exec-ing sleep, so sleep is a child of the command's shell.
  const secs = `30.${Math.floor(Math.random() * 1e6)}`
  const t = performance.now()
  const err = await rejectsWith(sbx.commands.run(`sleep ${secs}; echo after`, { timeoutMs: 1500 }), TimeoutError, 'run with timeoutMs')
  const took = performance.now() - t
  assert.ok(took < 8000, `timeout error after ${took} ms`)
  assert.ok(err instanceof SandboxError)
  await waitFor(async () => !(await sbx.commands.list()).some((p) => p.args.join(' ').includes(secs)),
    { timeoutMs: 5000, what: 'the timed-out command to leave commands.list()' })
  await waitFor(async () => (await sbx.commands.run(`ps -eo args | grep -c '^sleep ${secs}' || true`)).stdout.trim() === '0',
    { timeoutMs: 5000, what: () => `the timed-out command's child "sleep ${secs}" to be killed` })
})

srv.test('a background command outlives its request and can be reconnected', async () => {
  const dir = `/tmp/bg-${randomTag(6)}`
  const h = await sbx.commands.run(`mkdir -p ${dir}; sleep 1; echo done > ${dir}/done; for i in $(seq 1 600); do echo tick$i; sleep 0.1; done`, {
    background: true,
    timeoutMs: 0,
  })
  const pid = h.pid
  try {
    // Drop the stream; the command keeps going.
    await h.disconnect()
    await sleep(2500)
    assert.ok((await pidsRunning()).includes(pid), 'background command died after disconnect')
    const done = await sbx.commands.run(`cat ${dir}/done`)
    assert.equal(done.stdout, 'done\n')

    // Reconnect and receive output produced from now on.
    const got = []
    const h2 = await sbx.commands.connect(pid, { onStdout: (d) => got.push(d), timeoutMs: 0 })
    assert.equal(h2.pid, pid)
    await waitFor(() => /tick\d+\n/.test(got.join('')), { timeoutMs: 5000, what: 'output after reconnecting' })
    assert.equal(await h2.kill(), true)
    await rejectsWith(h2.wait(), CommandExitError, 'wait after kill')
    await waitFor(async () => !(await pidsRunning()).includes(pid), { timeoutMs: 5000, what: 'pid to end' })
  } finally {
    await sbx.commands.kill(pid).catch(() => {})
  }
})

srv.test('commands run concurrently in one sandbox', async () => {
  const t = performance.now()
  const results = await Promise.all(Array.from({ length: 8 }, (_, i) => sbx.commands.run(`sleep 1; echo ${i}`)))
  assert.deepEqual(results.map((r) => r.stdout), Array.from({ length: 8 }, (_, i) => `${i}\n`))
  assert.ok(performance.now() - t < 6000, `8 concurrent 1-second commands took ${performance.now() - t} ms`)
})

srv.test('the sandbox environment: hostname, login shell PATH, network tools', async () => {
  const r = await sbx.commands.run('hostname; command -v python3; echo "$PATH"')
  const [host, py, path] = r.stdout.trim().split('\n')
  assert.equal(host, sbx.sandboxId)
  assert.match(py, /python3$/)
  assert.ok(path.split(':').includes('/usr/bin'), `PATH ${path}`)
})

srv.test('pty: interactive shell with size, input, resize and exit', async () => {
  let out = ''
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) }, timeoutMs: 60_000 })
  try {
    assert.ok(term.pid > 0)
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; tty; echo pty-$((6*7))\n'))
    await waitFor(() => /pty-42/.test(out) && /24 80/.test(out), { timeoutMs: 10_000, what: () => `pty output (got ${JSON.stringify(out.slice(-300))})` })
    assert.match(out, /\/dev\/pts\/\d+/)

    await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
    await waitFor(() => /30 100/.test(out), { timeoutMs: 10_000, what: () => `the new pty size (got ${JSON.stringify(out.slice(-300))})` })

    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('exit 0\n'))
    const r = await term.wait()
    assert.equal(r.exitCode, 0)
  } finally {
    await sbx.pty.kill(term.pid).catch(() => {})
  }
})

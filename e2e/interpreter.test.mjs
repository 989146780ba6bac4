// The code interpreter through the unmodified @e2b/code-interpreter SDK:
// its default template (code-interpreter-v1), runCode with state, streaming,
// rich results, errors, contexts, languages, environment and timeouts.
//
// Needs AENV_CODE_INTERPRETER_ROOTFS (`make code-interpreter`); missing, it
// is an error, never a skip.

import assert from 'node:assert/strict'
import fs from 'node:fs'
import path from 'node:path'
import { Sandbox, TimeoutError } from '@e2b/code-interpreter'
import { useServer } from './lib/server.mjs'

const rootfs = process.env.AENV_CODE_INTERPRETER_ROOTFS
if (!rootfs || !fs.existsSync(path.join(rootfs, 'usr/lib/python3/dist-packages/ipykernel'))) {
  throw new Error(`AENV_CODE_INTERPRETER_ROOTFS (${rootfs}) is not a built code-interpreter root filesystem: run \`make code-interpreter\``)
}
const srv = useServer({ tag: 'zqcode', cidr: '10.247.0.0/16', portHint: 18150, args: ['--code-interpreter-rootfs', rootfs] })

/** A code-interpreter sandbox, tracked for cleanup. */
async function create(opts = {}) {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, ...opts })
  srv.track(sbx.sandboxId)
  return sbx
}

srv.test('the default template runs Python with state kept between runCode calls', async () => {
  const sbx = await create()
  try {
    const info = await sbx.getInfo()
    assert.equal(info.templateId, 'code-interpreter-v1')
    const first = await sbx.runCode('x = 20\nx + 1')
    assert.equal(first.text, '21')
    assert.equal(first.error, undefined)
    const second = await sbx.runCode('x * 2')
    assert.equal(second.text, '40')
    assert.ok(second.executionCount > first.executionCount, `execution counts ${first.executionCount} then ${second.executionCount}`)
    // The alias names the same template.
    const other = await create({ template: 'code-interpreter' })
    try {
      assert.equal((await other.runCode('x = 1\nx')).text, '1')
      assert.equal((await sbx.runCode('x')).text, '20', 'two sandboxes share a kernel')
    } finally {
      await srv.kill(other)
    }
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('stdout streams to onStdout before the execution ends', async () => {
  const sbx = await create()
  try {
    const seen = []
    const start = performance.now()
    const exec = await sbx.runCode('import time\nprint("one", flush=True)\ntime.sleep(2)\nprint("two")', {
      onStdout: (m) => seen.push({ line: m.line, at: performance.now() - start }),
    })
    const end = performance.now() - start
    assert.deepEqual(exec.logs.stdout, ['one\n', 'two\n'])
    assert.equal(seen[0].line, 'one\n')
    assert.ok(end - seen[0].at >= 1500, `the first line came at ${seen[0].at} ms and the end at ${end} ms: not streamed`)
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('a matplotlib figure comes back as a PNG with its chart; a DataFrame as HTML', async () => {
  const sbx = await create()
  try {
    const exec = await sbx.runCode([
      'import matplotlib.pyplot as plt',
      'plt.plot([1, 2, 3], [2, 4, 8], label="doubling")',
      'plt.title("growth")',
      'plt.xlabel("step")',
      'plt.show()',
    ].join('\n'))
    assert.equal(exec.error, undefined, JSON.stringify(exec.error))
    assert.equal(exec.results.length, 1)
    const png = Buffer.from(exec.results[0].png, 'base64')
    assert.equal(png.subarray(0, 4).toString('latin1'), '\x89PNG')
    const chart = exec.results[0].chart
    assert.equal(chart.type, 'line')
    assert.equal(chart.title, 'growth')
    assert.equal(chart.x_label, 'step')
    assert.equal(chart.elements[0].label, 'doubling')
    assert.deepEqual(chart.elements[0].points, [[1, 2], [2, 4], [3, 8]])

    const df = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": [3, 4]})')
    assert.match(df.results[0].html, /<table/)
    assert.match(df.text, /a\s+b/)
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('an exception reports its name, value and traceback; the kernel goes on', async () => {
  const sbx = await create()
  try {
    const exec = await sbx.runCode('def f(d):\n    return d["missing"]\nf({})')
    assert.equal(exec.error.name, 'KeyError')
    assert.equal(exec.error.value, "'missing'")
    assert.match(exec.error.traceback, /return d\["missing"\]/)
    assert.doesNotMatch(exec.error.traceback, /\x1b\[/, 'the traceback has terminal colours')
    assert.equal((await sbx.runCode('2 + 2')).text, '4')
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('contexts: create with a directory, list, restart (state gone), remove', async () => {
  const sbx = await create()
  try {
    await sbx.files.makeDir('/home/user/work')
    const ctx = await sbx.createCodeContext({ cwd: '/home/user/work' })
    assert.equal(ctx.language, 'python')
    assert.equal(ctx.cwd, '/home/user/work')
    assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: ctx })).text, "'/home/user/work'")
    await sbx.runCode('kept = "yes"', { context: ctx })
    assert.equal((await sbx.runCode('kept', { context: ctx })).text, "'yes'")
    assert.equal((await sbx.runCode('kept')).error?.name, 'NameError', 'the default context sees another context')
    const listed = await sbx.listCodeContexts()
    assert.ok(listed.some((c) => c.id === ctx.id), JSON.stringify(listed))

    await sbx.restartCodeContext(ctx)
    assert.equal((await sbx.runCode('kept', { context: ctx })).error?.name, 'NameError', 'state survived a restart')

    await sbx.removeCodeContext(ctx.id)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('bash keeps its shell between calls; another language is UnsupportedLanguage', async () => {
  const sbx = await create()
  try {
    await sbx.runCode('cd /tmp && export ANSWER=42', { language: 'bash' })
    const exec = await sbx.runCode('echo "$ANSWER in $PWD as $(whoami)"', { language: 'bash' })
    assert.deepEqual(exec.logs.stdout, ['42 in /tmp as user\n'])
    const failed = await sbx.runCode('ls /nonexistent', { language: 'bash' })
    assert.equal(failed.error.name, 'CommandExitError')
    assert.match(failed.logs.stderr.join(''), /No such file/)

    const ruby = await sbx.runCode('puts 1', { language: 'ruby' })
    assert.equal(ruby.error.name, 'UnsupportedLanguage')
    assert.match(ruby.error.value, /ruby/)
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('envs apply to one execution; an execution timeout interrupts the kernel and keeps its state', async () => {
  const sbx = await create({ envs: { CREATE_ENV: 'from the create' } })
  try {
    // The kernel started before this sandbox existed (in the template's
    // snapshot), yet sees the create's environment.
    assert.equal((await sbx.runCode('import os\nos.environ.get("CREATE_ENV")')).text, "'from the create'")
    assert.deepEqual((await sbx.runCode('echo "$CREATE_ENV"', { language: 'bash' })).logs.stdout, ['from the create\n'])
    const withEnv = await sbx.runCode('import os\nos.environ["GREETING"]', { envs: { GREETING: 'hello' } })
    assert.equal(withEnv.text, "'hello'")
    assert.equal((await sbx.runCode('import os\nos.environ.get("GREETING", "unset")')).text, "'unset'")

    await sbx.runCode('state = "kept"')
    const start = performance.now()
    await assert.rejects(sbx.runCode('import time\nwhile True: time.sleep(0.05)', { timeoutMs: 1500 }), TimeoutError)
    assert.ok(performance.now() - start < 10_000)
    // The kernel was interrupted, not left looping: the next call runs.
    const after = await sbx.runCode('state', { timeoutMs: 15_000 })
    assert.equal(after.text, "'kept'")
  } finally {
    await srv.kill(sbx)
  }
})

srv.test('a paused code-interpreter sandbox resumes with its kernel state', async () => {
  const sbx = await create()
  try {
    await sbx.runCode('import numpy as np\narr = np.arange(10)')
    await sbx.pause()
    const back = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await back.runCode('int(arr.sum())')).text, '45')
  } finally {
    await srv.kill(sbx)
  }
})

srv.test("the service runs code only with the sandbox's own access token: none or another sandbox's gets 401", async () => {
  const sbx = await create()
  const other = await create()
  try {
    assert.ok(sbx.envdAccessToken && other.envdAccessToken && sbx.envdAccessToken !== other.envdAccessToken)
    // As runCode sends it, but with the token chosen here.
    const execute = (token) => fetch(sbx.jupyterUrl + '/execute', {
      method: 'POST',
      headers: {
        'Content-Type': 'application/json',
        'E2b-Sandbox-Id': sbx.sandboxId,
        'E2b-Sandbox-Port': '49999',
        ...(token ? { 'X-Access-Token': token } : {}),
      },
      body: JSON.stringify({ code: 'print("ran")' }),
    })
    for (const [what, token] of [['no token', undefined], ["another sandbox's token", other.envdAccessToken]]) {
      const res = await execute(token)
      const body = await res.text()
      assert.equal(res.status, 401, `${what}: ${body}`)
      const err = JSON.parse(body)
      assert.equal(err.code, 401, what)
      assert.ok(err.message, what)
    }
    const res = await execute(sbx.envdAccessToken)
    assert.equal(res.status, 200)
    assert.match(await res.text(), /"text":"ran\\n"/)
  } finally {
    await srv.kill(other)
    await srv.kill(sbx)
  }
})

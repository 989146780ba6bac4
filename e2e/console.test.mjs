// The web console (/console) in a real browser: Debian's chromium,
// headless, driven by puppeteer-core, against a real server with real
// sandboxes made through the e2b SDK. It signs in with an API key (which
// the page must not keep), watches a new sandbox appear in the table,
// types in a sandbox's terminal, reads its CPU chart, uploads a file,
// pauses and resumes it, signs in as another team's non-admin key, and
// sends a change without the CSRF token. Any page error, console error,
// CSP violation or unexpected HTTP error fails the test it happened in.
//
// Screenshots of every page visited go to $AENV_E2E_ARTIFACTS (default
// e2e/artifacts/console). Chromium is required: without it (or at
// AENV_CHROMIUM) the suite fails, it does not skip.

import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { after, before } from 'node:test'
import puppeteer from 'puppeteer-core'
import { useServer, randomTag, waitFor } from './lib/server.mjs'

const srv = useServer({ tag: 'zqcon', cidr: '10.232.0.0/16', portHint: 18125 })
const RUN = randomTag(6)
const CHROMIUM = process.env.AENV_CHROMIUM || '/usr/bin/chromium'
const ARTIFACTS = path.resolve(process.env.AENV_E2E_ARTIFACTS || path.join(import.meta.dirname, 'artifacts', 'console'))
const VIEWPORT = { width: 1280, height: 800 }

let browser
// The admin's page, and the sandbox the tests share.
let page
let sbx

before(async () => {
  try {
    fs.accessSync(CHROMIUM, fs.constants.X_OK)
  } catch {
    throw new Error(`no chromium at ${CHROMIUM}: the console suite needs it (scripts/install-deps.sh installs Debian's chromium; AENV_CHROMIUM names another)`)
  }
  fs.mkdirSync(ARTIFACTS, { recursive: true })
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    // Root (as the e2e suites run) cannot use chromium's sandbox.
    args: ['--no-sandbox', '--no-proxy-server', '--disable-dev-shm-usage'],
    defaultViewport: VIEWPORT,
  })
})

after(async () => {
  await browser?.close()
})

/**
 * A page that records what must not happen: page errors, console errors,
 * CSP violations and HTTP answers of 400 and above but for those the test
 * said it expects (expect(status, pathRegexp)). check() fails with them.
 */
async function watchedPage(context) {
  const p = await context.newPage()
  const problems = []
  const expected = []
  p.on('pageerror', (err) => problems.push(`page error: ${err.message}`))
  p.on('console', (msg) => {
    // Failed loads are judged by their answers below.
    if (msg.type() === 'error' && !msg.text().startsWith('Failed to load resource')) {
      problems.push(`console error: ${msg.text()} (${msg.location()?.url ?? '?'})`)
    }
  })
  p.on('requestfailed', (req) => {
    // Aborted: the page went on (a poll cut by a new route, a closed page).
    if (req.failure()?.errorText !== 'net::ERR_ABORTED') problems.push(`${req.method()} ${new URL(req.url()).pathname} failed: ${req.failure()?.errorText}`)
  })
  p.on('response', (res) => {
    const status = res.status()
    if (status < 400) return
    const u = new URL(res.url())
    if (!expected.some((e) => e.status === status && e.path.test(u.pathname))) {
      problems.push(`HTTP ${status} for ${res.request().method()} ${u.pathname}`)
    }
  })
  // The browser tells the page of every CSP violation (the console shows
  // most of them too, but not all, and not in words a test can rely on).
  await p.exposeFunction('aenvReportViolation', (v) => problems.push(`CSP violation: ${v}`))
  await p.evaluateOnNewDocument(() => {
    document.addEventListener('securitypolicyviolation', (e) => {
      window.aenvReportViolation(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'} (${e.sourceFile || 'page'}:${e.lineNumber}) ${e.sample || ''}`)
    })
  })
  return {
    page: p,
    expect(status, pathRe) {
      expected.push({ status, path: pathRe })
    },
    check(what) {
      const counts = new Map()
      for (const m of problems.splice(0)) counts.set(m, (counts.get(m) ?? 0) + 1)
      const out = [...counts].map(([m, n]) => (n > 1 ? `${m} (${n} times)` : m))
      assert.deepEqual(out, [], `${what}: the page reported problems`)
    },
  }
}

async function screenshot(p, name) {
  await p.screenshot({ path: path.join(ARTIFACTS, `${name}.png`) })
}

/** Signs in on the console's page with key; the session it answered. who names its screenshot. */
async function signIn(w, key, who) {
  const p = w.page
  // Before signing in, the page asks who is signed in: nobody (401).
  w.expect(401, /^\/console\/session$/)
  await p.goto(`${srv.url}/console/`, { waitUntil: 'domcontentloaded' })
  try {
    await p.waitForSelector('#apikey', { visible: true })
  } catch (err) {
    // Once in a full run (never alone) the sign-in form did not show:
    // keep what the page showed instead, for the next one to read.
    await screenshot(p, `${who}-signin-missing`).catch(() => {})
    const html = await p.content().catch((e) => `(no content: ${e})`)
    throw new Error(`the sign-in form did not show; the page held: ${html.slice(0, 2000)}`, { cause: err })
  }
  await screenshot(p, `${who}-signin`)
  await p.type('#apikey', key)
  const [res] = await Promise.all([
    p.waitForResponse((r) => new URL(r.url()).pathname === '/console/session' && r.request().method() === 'POST'),
    p.click('form.signin button[type=submit]'),
  ])
  assert.equal(res.status(), 200, await res.text())
  await p.waitForSelector('#top:not([hidden])')
  await p.waitForSelector('#sb-status')
  return res.json()
}

/** The text of the terminal's rows (xterm.js's DOM renderer), one string per row. */
function terminalRows(p) {
  return p.$$eval('.term .xterm-rows > div', (rows) => rows.map((r) => r.textContent.replace(/\u00a0/g, ' ').trimEnd()))
}

/** The sandbox's state as the API tells it. */
async function apiState(id) {
  const res = await srv.api('GET', `/sandboxes/${id}`)
  assert.equal(res.status, 200, res.text)
  return res.json.state
}

let admin

srv.test('signing in with an API key leaves an HttpOnly SameSite=Strict session cookie and the key nowhere in the page', async () => {
  // An admin key of the suite's own (the server's first key is named
  // after its data directory, which the screenshots would show).
  const made = await srv.api('POST', '/keys', { body: { name: 'console-admin', team: 'ops', admin: true } })
  assert.equal(made.status, 201, made.text)
  const key = made.json.key
  admin = await watchedPage(browser.defaultBrowserContext())
  page = admin.page
  const s = await signIn(admin, key, 'admin')
  assert.equal(s.key.admin, true)
  assert.equal(s.key.name, 'console-admin')
  assert.match(s.csrfToken, /^[A-Za-z0-9_-]{16,}$/)

  const cookies = await browser.defaultBrowserContext().cookies()
  const session = cookies.find((c) => c.name === 'aenv_console')
  assert.ok(session, `no session cookie among ${cookies.map((c) => c.name).join(', ')}`)
  assert.equal(session.httpOnly, true)
  assert.equal(session.sameSite, 'Strict')
  assert.equal(session.path, '/')
  assert.ok(!session.value.includes(key), 'the cookie holds the key')

  const kept = await page.evaluate(() => ({
    local: JSON.stringify({ ...localStorage }),
    session: JSON.stringify({ ...sessionStorage }),
    cookie: document.cookie,
    html: document.documentElement.outerHTML,
  }))
  assert.ok(!kept.local.includes(key), 'the key is in localStorage')
  assert.ok(!kept.session.includes(key), 'the key is in sessionStorage')
  assert.ok(!kept.html.includes(key), 'the key is in the page')
  assert.ok(!kept.cookie.includes('aenv_console'), 'scripts can read the session cookie')
  admin.check('sign-in')
})

srv.test('a sandbox created through the SDK appears in the table within 2 s, without a reload', async () => {
  await page.waitForFunction(() => document.querySelector('#sb-status')?.textContent.includes('updated') || document.querySelector('#sb-status')?.textContent.startsWith('No sandboxes'))
  await page.evaluate(() => { window.aenvSamePage = true })
  sbx = await srv.create({ metadata: { suite: 'console', run: RUN } })
  const created = Date.now()
  await page.waitForSelector(`a[href="#/sandboxes/${sbx.sandboxId}"]`, { timeout: 2000 })
  const took = Date.now() - created
  assert.equal(await page.evaluate(() => window.aenvSamePage), true, 'the page was reloaded')
  const row = await page.$eval(`a[href="#/sandboxes/${sbx.sandboxId}"]`, (a) => a.closest('tr').textContent)
  assert.match(row, /running/)
  assert.match(row, new RegExp(`run=${RUN}`))
  console.log(`# the sandbox appeared in the table ${took} ms after its create answered`)
  await screenshot(page, 'sandboxes')
  admin.check('sandboxes table')
})

srv.test("a sandbox's terminal runs what is typed in it", async () => {
  await page.click(`a[href="#/sandboxes/${sbx.sandboxId}"]`)
  await page.waitForSelector('#sb-term-h')
  await page.waitForFunction(() => document.querySelector('.badge[data-state]')?.textContent === 'running')
  const open = await page.waitForSelector('#sb-term-h ~ .buttons button.primary:not([disabled])')
  await open.click()
  await page.waitForFunction(() => /^Connected/.test(document.querySelector('#sb-term-h ~ .status')?.textContent ?? ''), { timeout: 10_000 })
  await page.waitForSelector('.term .xterm-helper-textarea')
  await page.focus('.term .xterm-helper-textarea')
  await page.keyboard.type('echo hi')
  await page.keyboard.press('Enter')
  await waitFor(async () => (await terminalRows(page)).includes('hi'), {
    timeoutMs: 10_000,
    what: '"hi" on a row of its own',
  }).catch(async (err) => {
    throw new Error(`${err.message}; the terminal shows:\n${(await terminalRows(page)).join('\n')}`)
  })
  const rows = await terminalRows(page)
  assert.ok(rows.some((r) => r.endsWith('echo hi')), `no row with the command: ${rows.join(' | ')}`)
  await page.evaluate(() => window.scrollTo(0, 0))
  await screenshot(page, 'sandbox')
  await page.$eval('#sb-term-h', (el) => el.closest('section').scrollIntoView({ block: 'start' }))
  await screenshot(page, 'sandbox-terminal')
  admin.check('terminal')
})

srv.test('the CPU chart draws the metrics history, at least 3 samples', async () => {
  // The node samples every 5 s (and once at the start): 3 samples are at
  // most 10 s after the create; the page reads them every 3 s.
  const summary = await page.waitForFunction(() => {
    const fig = document.querySelector('#chart-cpu-t')?.closest('figure')
    const text = fig?.querySelector('[data-summary]')?.textContent ?? ''
    const n = Number(text.match(/^(\d+) samples/)?.[1] ?? 0)
    return n >= 3 && fig.querySelector('.chart-body canvas') ? text : false
  }, { timeout: 20_000, polling: 250 })
  const text = await summary.jsonValue()
  const res = await srv.api('GET', `/sandboxes/${sbx.sandboxId}/metrics`)
  assert.equal(res.status, 200, res.text)
  assert.ok(res.json.length >= Number(text.match(/^(\d+)/)[1]), `the chart shows more samples (${text}) than the API has (${res.json.length})`)
  await page.$eval('#sb-charts-h', (el) => el.scrollIntoView({ block: 'start' }))
  await screenshot(page, 'sandbox-charts')
  admin.check('CPU chart')
})

srv.test("a file uploaded through the page's file browser is in the sandbox", async () => {
  const name = `upload-${RUN}.txt`
  const content = `uploaded from the console ${RUN}\n`
  const local = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-console-')), name)
  fs.writeFileSync(local, content)
  try {
    await page.waitForFunction(() => /entries in \//.test(document.querySelector('#sb-files-h ~ .status')?.textContent ?? ''))
    const input = await page.$('#fs-upload')
    await input.uploadFile(local)
    const [res] = await Promise.all([
      page.waitForResponse((r) => new URL(r.url()).pathname.endsWith('/files/content') && r.request().method() === 'POST'),
      page.click('form:has(#fs-upload) button[type=submit]'),
    ])
    assert.equal(res.status(), 204)
    await page.waitForFunction((n) => [...document.querySelectorAll('.files a[download]')].some((a) => a.textContent === n), {}, name)
    assert.equal(await sbx.files.read(`/home/user/${name}`), content)
    await page.$eval('#sb-files-h', (el) => el.scrollIntoView({ block: 'start' }))
    await screenshot(page, 'sandbox-files')
    admin.check('upload')
  } finally {
    fs.rmSync(path.dirname(local), { recursive: true, force: true })
  }
})

/** Clicks the sandbox page's action button labelled label. */
async function action(label) {
  const buttons = await page.$$('.card .buttons button[data-when]')
  for (const b of buttons) {
    if ((await b.evaluate((el) => el.textContent)) === label) {
      await page.waitForFunction((el) => !el.disabled, {}, b)
      await b.click()
      return
    }
  }
  throw new Error(`no ${label} button`)
}

srv.test('pause and resume from the page', async () => {
  await action('Pause')
  await waitFor(async () => (await apiState(sbx.sandboxId)) === 'paused', { timeoutMs: 20_000, what: 'the API to tell the sandbox paused' })
  await page.waitForFunction(() => document.querySelector('.badge[data-state]')?.textContent === 'paused', { timeout: 10_000 })
  await action('Resume')
  await waitFor(async () => (await apiState(sbx.sandboxId)) === 'running', { timeoutMs: 20_000, what: 'the API to tell the sandbox running' })
  await page.waitForFunction(() => document.querySelector('.badge[data-state]')?.textContent === 'running', { timeout: 10_000 })
  // Resumed as it was: the file uploaded before is still there.
  assert.match(await sbx.files.read(`/home/user/upload-${RUN}.txt`), /uploaded from the console/)
  admin.check('pause and resume')
})

srv.test('a change without the CSRF token is refused with 403 and a JSON error, and changes nothing', async () => {
  const id = sbx.sandboxId
  const endAt = async () => (await srv.api('GET', `/sandboxes/${id}`)).json.endAt
  const before = await endAt()
  admin.expect(403, new RegExp(`^/sandboxes/${id}/timeout$`))
  admin.expect(403, new RegExp(`^/console/api/sandboxes/${id}/files/content$`))
  // From the page itself: same origin, the session cookie sent, only the
  // header missing.
  const refused = await page.evaluate(async (id) => {
    const call = async (url, init) => {
      const r = await fetch(url, { credentials: 'same-origin', ...init })
      return { status: r.status, type: r.headers.get('Content-Type'), body: await r.text() }
    }
    return {
      timeout: await call(`/sandboxes/${id}/timeout`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ timeout: 120 }) }),
      upload: await call(`/console/api/sandboxes/${id}/files/content?path=/home/user/csrf`, { method: 'POST', body: 'x' }),
    }
  }, id)
  for (const [what, r] of Object.entries(refused)) {
    assert.equal(r.status, 403, `${what}: ${r.status} ${r.body}`)
    assert.match(r.type, /^application\/json/)
    const body = JSON.parse(r.body)
    assert.deepEqual(Object.keys(body).sort(), ['code', 'message'])
    assert.equal(body.code, 403)
    assert.match(body.message, /CSRF/)
  }
  assert.equal(await endAt(), before, 'the refused timeout moved the end')
  await assert.rejects(sbx.files.read('/home/user/csrf'), 'the refused upload made the file')

  // The same change with the token is the API's to answer.
  const status = await page.evaluate(async (id) => {
    const csrf = (await (await fetch('/console/session')).json()).csrfToken
    const r = await fetch(`/sandboxes/${id}/timeout`, { method: 'POST', headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': csrf }, body: JSON.stringify({ timeout: 120 }) })
    return r.status
  }, id)
  assert.equal(status, 204)
  assert.notEqual(await endAt(), before, 'the timeout with the token did not move the end')
  admin.check('CSRF')
})

srv.test("a non-admin key of another team sees no keys page and not the other team's sandbox", async () => {
  const made = await srv.api('POST', '/keys', { body: { name: `console-beta-${RUN}`, team: `beta${RUN}` } })
  assert.equal(made.status, 201, made.text)
  const betaKey = made.json.key
  const allKeys = await srv.api('GET', '/keys')
  assert.equal(allKeys.status, 200, allKeys.text)
  const mine = await srv.create({ apiKey: betaKey, metadata: { suite: 'console', run: RUN, team: 'beta' } })

  const context = await browser.createBrowserContext()
  try {
    const beta = await watchedPage(context)
    const p = beta.page
    const s = await signIn(beta, betaKey, 'nonadmin')
    assert.equal(s.key.admin, false)
    assert.equal(s.key.team, `beta${RUN}`)

    // Its own sandbox shows; the admin's team's does not.
    await p.waitForSelector(`a[href="#/sandboxes/${mine.sandboxId}"]`, { timeout: 5000 })
    assert.equal(await p.$(`a[href="#/sandboxes/${sbx.sandboxId}"]`), null, "the other team's sandbox is listed")
    assert.ok(!(await p.$eval('#main', (m) => m.textContent)).includes(sbx.sandboxId))
    await screenshot(p, 'nonadmin-sandboxes')

    // No admin entries in the navigation, and the keys route shows none.
    const nav = await p.$$eval('#nav a', (as) => as.filter((a) => a.offsetParent !== null).map((a) => a.getAttribute('href')))
    assert.ok(nav.includes('#/sandboxes'), nav.join(', '))
    for (const route of ['#/keys', '#/teams', '#/nodes', '#/cluster']) assert.ok(!nav.includes(route), `the navigation shows ${route}: ${nav.join(', ')}`)
    await p.evaluate(() => { location.hash = '#/keys' })
    await p.waitForFunction(() => document.querySelector('#main h1')?.textContent === 'Not available')
    const text = await p.$eval('#main', (m) => m.textContent)
    assert.equal(await p.$('#main table'), null, 'the keys route shows a table')
    for (const k of allKeys.json) {
      assert.ok(!text.includes(k.id) && !text.includes(k.name), `the keys route shows key ${k.id} (${k.name})`)
    }
    await screenshot(p, 'nonadmin-keys')

    // The other team's sandbox by its address: gone, as one that never was.
    for (const route of ['/sandboxes/ID', '/sandboxes/ID/metrics', '/v2/sandboxes/ID/logs']) beta.expect(404, new RegExp(`^${route.replace('ID', sbx.sandboxId)}$`))
    await p.evaluate((id) => { location.hash = `#/sandboxes/${id}` }, sbx.sandboxId)
    await p.waitForFunction(() => document.querySelector('#sb-info-h')?.textContent === 'Gone')
    await screenshot(p, 'nonadmin-other-sandbox')
    beta.check('non-admin')
  } finally {
    await context.close()
    await srv.kill(mine)
  }
})

srv.test('the admin sees the keys page', async () => {
  await page.evaluate(() => { location.hash = '#/keys' })
  await page.waitForFunction(() => document.querySelector('#main h1')?.textContent === 'API keys' && document.querySelector('#main table'))
  const text = await page.$eval('#main table', (t) => t.textContent)
  assert.match(text, new RegExp(`console-beta-${RUN}`))
  await screenshot(page, 'keys')
  admin.check('keys page')
  await srv.kill(sbx)
})

// The web console (/console) in a real browser: Debian's chromium,
// headless, driven by puppeteer-core, against a real server with real
// sandboxes made through the e2b SDK. It signs in with an API key (which
// the page must not keep), watches a new sandbox appear in the table,
// types in a sandbox's terminal, reads its CPU chart, uploads a file,
// pauses and resumes it, signs in as another team's non-admin key, and
// sends a change without the CSRF token. From the keyboard alone it signs
// in, reaches every control of the sandboxes and sandbox pages with Tab
// (each showing its focus, uncovered, with an accessible name), opens a
// sandbox with Enter, works the actions, files, charts and log with Enter
// and Space, and leaves the terminal with Shift+Escape. At 1280x800 and
// on a phone's 390x844 every page has no sideways scrolling, no text
// under 12 px, its controls shown and uncovered and its tables in scroll
// boxes of their own. Any page error, console error, CSP violation or
// unexpected HTTP error fails the test it happened in.
//
// Screenshots of every page visited go to $AENV_E2E_ARTIFACTS (default
// e2e/artifacts/console), layout-<page>-<size>.png those of the layout's test. Chromium is required: without it (or at
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
  // What the page asked for and said, for a failure's report.
  const trail = []
  let networkChanges = 0
  const t0 = performance.now()
  const note = (m) => trail.push(`+${Math.round(performance.now() - t0)}ms ${m}`)
  p.on('request', (r) => note(`> ${r.method()} ${r.url()}`))
  p.on('requestfinished', (r) => note(`< ${r.response()?.status()} ${r.url()}`))
  p.on('requestfailed', (r) => note(`x ${r.url()} ${r.failure()?.errorText}`))
  p.on('console', (m) => note(`console.${m.type()}: ${m.text()}`))
  p.on('pageerror', (e) => note(`pageerror: ${e.message}`))
  p.on('pageerror', (err) => problems.push(`page error: ${err.message}`))
  p.on('console', (msg) => {
    // Failed loads are judged by their answers below.
    if (msg.type() === 'error' && !msg.text().startsWith('Failed to load resource')) {
      problems.push(`console error: ${msg.text()} (${msg.location()?.url ?? '?'})`)
    }
  })
  p.on('requestfailed', (req) => {
    const err = req.failure()?.errorText
    // Aborted: the page went on (a poll cut by a new route, a closed
    // page). Network changed: the server started or ended a sandbox,
    // whose interfaces changed the host's network, and Chromium failed
    // what was in flight (loopback's requests too); the page must get
    // over it (its polls go on, its scripts load again), which the
    // tests see in what it shows.
    if (err === 'net::ERR_NETWORK_CHANGED') networkChanges++
    else if (err !== 'net::ERR_ABORTED') problems.push(`${req.method()} ${new URL(req.url()).pathname} failed: ${err}`)
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
    trail,
    expect(status, pathRe) {
      expected.push({ status, path: pathRe })
    },
    check(what) {
      if (networkChanges) console.log(`# ${what}: ${networkChanges} requests failed as the host's network changed (net::ERR_NETWORK_CHANGED)`)
      networkChanges = 0
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
    throw new Error(`the sign-in form did not show; the page held: ${html.slice(0, 2000)}\nits requests and messages:\n${w.trail.join('\n')}`, { cause: err })
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

/**
 * What has the keyboard's focus: desc (tag, id and name, for messages),
 * its accessible name (Chromium's accessibility tree), whether its focus
 * shows (an outline of 2 px or more, or a box shadow, on :focus-visible;
 * for the terminal, on its box) and whether it is on screen and not
 * under something else (the sticky header). body: nothing has it.
 */
async function focused(p) {
  const handle = await p.evaluateHandle(() => document.activeElement)
  const f = await handle.evaluate((el) => {
    if (!el || el === document.body || el === document.documentElement) return { body: true, desc: 'body' }
    // xterm.js takes keys in a hidden textarea: the terminal's box shows the focus.
    const shown = el.closest('.term') ?? el
    const cs = getComputedStyle(shown)
    const r = shown.getBoundingClientRect()
    const cx = Math.min(Math.max(r.left + r.width / 2, 0), innerWidth - 1)
    const cy = Math.min(Math.max(r.top + Math.min(r.height / 2, 12), 0), innerHeight - 1)
    const hit = document.elementFromPoint(cx, cy)
    const text = (el.getAttribute('aria-label') || el.textContent || el.value || '').trim().replace(/\s+/g, ' ')
    return {
      body: false,
      tag: el.tagName.toLowerCase(),
      id: el.id,
      text,
      href: el.getAttribute('href'),
      terminal: shown !== el,
      disabled: !!el.disabled,
      desc: `${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''} "${text.slice(0, 40)}"`,
      focusVisible: el.matches(':focus-visible') || (shown !== el && shown.matches(':focus-within')),
      ring: (cs.outlineStyle !== 'none' && parseFloat(cs.outlineWidth) >= 2) || cs.boxShadow !== 'none',
      onScreen: r.width > 0 && r.height > 0 && r.bottom > 0 && r.top < innerHeight && r.right > 0 && r.left < innerWidth,
      coveredBy: hit && (shown.contains(hit) || hit === shown) ? null : (hit ? `${hit.tagName.toLowerCase()}${hit.id ? '#' + hit.id : ''}.${hit.className}` : 'nothing'),
    }
  })
  if (!f.body) {
    const ax = await p.accessibility.snapshot({ root: handle, interestingOnly: false }).catch(() => null)
    f.name = ax?.name ?? ''
    f.role = ax?.role ?? ''
  }
  await handle.dispose()
  return f
}

/**
 * Presses Tab (Shift+Tab with back) until the focused element satisfies
 * want, at most max times; the elements focus went through, in order
 * (want's last). Focus wraps from the end of the page to its start, as
 * a keyboard's does.
 */
async function tabUntil(p, want, what, { max = 120, back = false } = {}) {
  const seen = []
  for (let i = 0; i < max; i++) {
    if (back) {
      await p.keyboard.down('Shift')
      await p.keyboard.press('Tab')
      await p.keyboard.up('Shift')
    } else {
      await p.keyboard.press('Tab')
    }
    const f = await focused(p)
    seen.push(f)
    if (want(f)) return seen
  }
  throw new Error(`${max} presses of Tab did not reach ${what}; focus went through: ${seen.map((f) => f.desc).join(', ')}`)
}

/** Every element of seen shows its focus, is on screen, uncovered, and has an accessible name. */
function assertFocusable(seen, where) {
  const bad = []
  for (const f of seen) {
    if (f.body) continue
    const why = []
    if (!f.focusVisible || !f.ring) why.push('its focus does not show')
    if (!f.onScreen) why.push('it is off screen')
    if (f.coveredBy) why.push(`it is under ${f.coveredBy}`)
    if (!f.name) why.push('it has no accessible name')
    if (why.length) bad.push(`${f.desc} (${f.role}): ${why.join(', ')}`)
  }
  assert.deepEqual(bad, [], `${where}: elements the keyboard reaches`)
}

/** The sandbox's state as the API tells it. */
async function apiState(id) {
  const res = await srv.api('GET', `/sandboxes/${id}`)
  assert.equal(res.status, 200, res.text)
  return res.json.state
}

let admin
// The admin's key, for the keyboard's and the layout's own sign-ins.
let adminKey
// A browser context of its own signed in from the keyboard, and its page
// (on the shared sandbox's page once the sandboxes' test opened it).
let kbContext
let kb

srv.test('signing in with an API key leaves an HttpOnly SameSite=Strict session cookie and the key nowhere in the page', async () => {
  // An admin key of the suite's own (the server's first key is named
  // after its data directory, which the screenshots would show).
  const made = await srv.api('POST', '/keys', { body: { name: 'console-admin', team: 'ops', admin: true } })
  assert.equal(made.status, 201, made.text)
  const key = made.json.key
  adminKey = key
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
  const created = performance.now()
  await page.waitForSelector(`a[href="#/sandboxes/${sbx.sandboxId}"]`, { timeout: 2000 })
  const took = performance.now() - created
  assert.equal(await page.evaluate(() => window.aenvSamePage), true, 'the page was reloaded')
  const row = await page.$eval(`a[href="#/sandboxes/${sbx.sandboxId}"]`, (a) => a.closest('tr').textContent)
  assert.match(row, /running/)
  assert.match(row, new RegExp(`run=${RUN}`))
  console.log(`# the sandbox appeared in the table ${took} ms after its create answered`)
  await screenshot(page, 'sandboxes')
  admin.check('sandboxes table')
})

srv.test('from the keyboard: Tab reaches the sign-in form and Enter signs in; on the sandboxes page Tab reaches the skip link, the navigation, the filters and each row, and Enter opens a sandbox', async () => {
  kbContext = await browser.createBrowserContext()
  kb = await watchedPage(kbContext)
  const p = kb.page
  kb.expect(401, /^\/console\/session$/)
  await p.goto(`${srv.url}/console/`, { waitUntil: 'domcontentloaded' })
  await p.waitForSelector('#apikey', { visible: true })
  // From wherever focus is (the page puts it in the key's field): away, then Tab.
  await p.evaluate(() => document.activeElement?.blur())
  const toKey = await tabUntil(p, (f) => f.id === 'apikey', 'the API key field', { max: 10 })
  await p.keyboard.type(adminKey)
  const toButton = await tabUntil(p, (f) => f.tag === 'button' && f.text === 'Sign in', 'the sign-in button', { max: 3 })
  assertFocusable([...toKey, ...toButton], 'the sign-in page')
  const [res] = await Promise.all([
    p.waitForResponse((r) => new URL(r.url()).pathname === '/console/session' && r.request().method() === 'POST'),
    p.keyboard.press('Enter'),
  ])
  assert.equal(res.status(), 200)
  const row = `a[href="#/sandboxes/${sbx.sandboxId}"]`
  await p.waitForSelector(row)

  // The page starts in the main area (it has focus after a route):
  // forward to the page's end, then round to its start and the rows.
  const toEnd = await tabUntil(p, (f) => f.body, 'the end of the page')
  const toRow = await tabUntil(p, (f) => f.href === `#/sandboxes/${sbx.sandboxId}`, "the sandbox's row")
  const seen = [...toEnd, ...toRow]
  assertFocusable(seen, 'the sandboxes page')
  const reached = new Set(seen.map((f) => f.href ?? f.id))
  const nav = await p.$$eval('#nav a', (as) => as.filter((a) => a.offsetParent !== null).map((a) => a.getAttribute('href')))
  for (const want of [...nav, '#main', 'sb-search', 'sb-metadata', 'sb-state', 'signout']) {
    assert.ok(reached.has(want), `Tab did not reach ${want}; it went through ${seen.map((f) => f.desc).join(', ')}`)
  }
  assert.ok(seen.some((f) => f.role === 'region' && f.name === 'Sandboxes'), 'the table\'s scroll box is not reached (a table wider than the screen scrolls from the keyboard)')

  // The skip link goes to the main area and stays on the page.
  await tabUntil(p, (f) => f.href === '#main', 'the skip link')
  await p.keyboard.press('Enter')
  await p.waitForFunction(() => document.activeElement?.id === 'main')
  assert.equal(await p.evaluate(() => location.hash), '#/sandboxes')
  assert.ok(await p.$(row), 'the skip link left the sandboxes page')

  // The search field filters as it is typed in.
  await tabUntil(p, (f) => f.id === 'sb-search', 'the search field')
  await p.keyboard.type(`no-such-${RUN}`)
  await p.waitForFunction((sel) => !document.querySelector(sel)?.offsetParent, {}, row)
  for (let i = 0; i < `no-such-${RUN}`.length; i++) await p.keyboard.press('Backspace')
  await p.waitForFunction((sel) => document.querySelector(sel)?.offsetParent, {}, row)

  await tabUntil(p, (f) => f.href === `#/sandboxes/${sbx.sandboxId}`, "the sandbox's row")
  await p.keyboard.press('Enter')
  await p.waitForSelector('#sb-term-h')
  assert.equal(await p.evaluate(() => location.hash), `#/sandboxes/${sbx.sandboxId}`)
  kb.check('keyboard: sign-in and sandboxes')
})

srv.test("a sandbox's terminal runs what is typed in it", async () => {
  await page.click(`a[href="#/sandboxes/${sbx.sandboxId}"]`)
  await page.waitForSelector('#sb-term-h')
  await page.waitForFunction(() => document.querySelector('.badge[data-state]')?.textContent === 'running')
  await page.waitForSelector('#sb-term-h ~ .buttons button.primary:not([disabled])')
  // From the keyboard: Tab to the button, Enter; the shell then has focus.
  const toOpen = await tabUntil(page, (f) => f.text === 'Open terminal', 'the Open terminal button')
  assertFocusable(toOpen, 'the sandbox page, on the way to the terminal')
  await page.keyboard.press('Enter')
  await page.waitForFunction(() => /^Connected/.test(document.querySelector('#sb-term-h ~ .status')?.textContent ?? ''), { timeout: 10_000 })
  await page.waitForSelector('.term .xterm-helper-textarea')
  await page.waitForFunction(() => document.activeElement?.classList.contains('xterm-helper-textarea'))
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
  // Tab is the shell's (completion), so the terminal holds focus until
  // Shift+Escape, which the card says, moves it past the terminal, to
  // that very line; Tab goes on from there to the files.
  await page.keyboard.press('Tab')
  const inside = await focused(page)
  assert.ok(inside.terminal, `Tab left the terminal for ${inside.desc}`)
  assertFocusable([inside], 'the terminal')
  assert.match(await page.$eval('#sb-term-h', (h) => h.closest('section').textContent), /Shift\+Esc/)
  await page.keyboard.down('Shift')
  await page.keyboard.press('Escape')
  await page.keyboard.up('Shift')
  const out = await focused(page)
  assert.match(out.text, /press Shift\+Esc to move focus out/, `Shift+Escape moved focus to ${out.desc}`)
  assert.ok(out.focusVisible && out.ring && out.onScreen && !out.coveredBy, `where Shift+Escape put focus does not show it: ${JSON.stringify(out)}`)
  const next = await tabUntil(page, (f) => !f.terminal, 'out of the terminal', { max: 1 })
  assert.equal(next[0].id, 'fs-dir', `Tab after Shift+Escape went to ${next[0].desc}`)
  assertFocusable(next, 'after the terminal')
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

srv.test("from the keyboard: the sandbox page's actions, files, charts and log are reached with Tab and work with Enter and Space, and Tab gets past the page's end", async () => {
  const p = kb.page
  await p.waitForFunction(() => document.querySelector('.badge[data-state]')?.textContent === 'running')
  await p.waitForFunction(() => /entries in \//.test(document.querySelector('#sb-files-h ~ .status')?.textContent ?? ''))
  await p.waitForFunction(() => document.querySelectorAll('.u-legend .u-series th[tabindex]').length >= 5)
  await p.evaluate(() => document.getElementById('main').focus())
  const seen = await tabUntil(p, (f) => f.body, 'the end of the page')
  assertFocusable(seen, 'the sandbox page')
  const all = seen.map((f) => f.desc).join(', ')
  for (const label of ['Sandboxes', 'Pause', 'Fork', 'Migrate', 'Kill', 'Set timeout', 'Take snapshot', 'Open terminal', 'List', 'Upload', 'Search']) {
    assert.ok(seen.some((f) => f.text === label), `Tab did not reach "${label}"; it went through ${all}`)
  }
  for (const id of ['sb-timeout', 'sb-snapname', 'fs-dir', 'fs-upload', 'log-search', 'log-level', 'log-follow']) {
    assert.ok(seen.some((f) => f.id === id), `Tab did not reach #${id}; it went through ${all}`)
  }
  for (const name of ['CPU: CPU used', 'Memory: Used', 'Memory: Total', 'Disk: Used', 'Disk: Total']) {
    assert.ok(seen.some((f) => f.name === name), `Tab did not reach the chart legend's "${name}"; it went through ${all}`)
  }
  assert.ok(seen.some((f) => f.name === 'Log entries'), `Tab did not reach the log; it went through ${all}`)
  assert.ok(seen.some((f) => /^Files in \//.test(f.name)), `Tab did not reach the files' table; it went through ${all}`)

  // Files: Enter in the directory's field lists it; Space on a directory opens it.
  const filesStatus = () => p.$eval('#sb-files-h ~ .status', (el) => el.textContent)
  await tabUntil(p, (f) => f.id === 'fs-dir', 'the directory field')
  await p.keyboard.down('Control')
  await p.keyboard.press('KeyA')
  await p.keyboard.up('Control')
  await p.keyboard.type('/')
  await p.keyboard.press('Enter')
  await p.waitForFunction(() => /^\d+ entries in \/$/.test(document.querySelector('#sb-files-h ~ .status')?.textContent ?? ''))
  await tabUntil(p, (f) => f.tag === 'button' && f.text === 'home/', 'the home/ directory')
  await p.keyboard.press('Space')
  await p.waitForFunction(() => /entries in \/home$/.test(document.querySelector('#sb-files-h ~ .status')?.textContent ?? ''), { timeout: 5000 })
    .catch(async (err) => { throw new Error(`${err.message}; the files say: ${await filesStatus()}`) })

  // Charts: Space and Enter hide and show a series.
  const series = () => p.$eval('th[aria-label="CPU: CPU used"]', (th) => ({ off: th.closest('tr').classList.contains('u-off'), pressed: th.getAttribute('aria-pressed') }))
  await tabUntil(p, (f) => f.name === 'CPU: CPU used', "the CPU chart's series")
  assert.deepEqual(await series(), { off: false, pressed: 'true' })
  await p.keyboard.press('Space')
  assert.deepEqual(await series(), { off: true, pressed: 'false' })
  await p.keyboard.press('Enter')
  assert.deepEqual(await series(), { off: false, pressed: 'true' })

  // Log: Space stops and starts following.
  await tabUntil(p, (f) => f.id === 'log-follow', 'Follow')
  await p.keyboard.press('Space')
  assert.equal(await p.$eval('#log-follow', (c) => c.checked), false)
  await p.keyboard.press('Space')
  assert.equal(await p.$eval('#log-follow', (c) => c.checked), true)
  kb.check('keyboard: the sandbox page')
})

/** Presses key (Enter or Space) on the sandbox page's action button labelled label, reached with Tab once it is enabled. */
async function action(label, key) {
  const buttons = await page.$$('.card .buttons button[data-when]')
  for (const b of buttons) {
    if ((await b.evaluate((el) => el.textContent)) === label) {
      await page.waitForFunction((el) => !el.disabled, {}, b)
      assertFocusable(await tabUntil(page, (f) => f.tag === 'button' && f.text === label, `the ${label} button`), `the way to ${label}`)
      await page.keyboard.press(key)
      return
    }
  }
  throw new Error(`no ${label} button`)
}

srv.test('pause (Enter) and resume (Space) from the page\'s buttons, reached with Tab', async () => {
  await action('Pause', 'Enter')
  await waitFor(async () => (await apiState(sbx.sandboxId)) === 'paused', { timeoutMs: 20_000, what: 'the API to tell the sandbox paused' })
  await page.waitForFunction(() => document.querySelector('.badge[data-state]')?.textContent === 'paused', { timeout: 10_000 })
  await action('Resume', 'Space')
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

const PHONE = { width: 390, height: 844, deviceScaleFactor: 2, isMobile: true, hasTouch: true }

/**
 * The layout's faults on p at a viewport width wide: the document wider
 * than the screen (and what sticks out), text under 12 px, controls
 * (selectors, each must match) hidden or under something else at their
 * centres, tables not in a scroll box of their own or sticking out.
 */
function layoutFaults(p, wide, controls) {
  return p.evaluate(async (wide, controls) => {
    const faults = []
    const desc = (el) => el ? `${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''}${el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\s+/).join('.') : ''}` : 'nothing'
    const scroller = (el) => { for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) { if (getComputedStyle(a).overflowX !== 'visible') return a } return null }
    if (innerWidth !== wide) faults.push(`the window is ${innerWidth} px wide, not ${wide}`)
    const sw = document.scrollingElement.scrollWidth
    if (sw > wide) {
      const out = [...document.querySelectorAll('body *')].filter((el) => el.getBoundingClientRect().right > wide + 0.5 && !scroller(el)).slice(0, 5).map(desc)
      faults.push(`the document is ${sw} px wide at ${wide}: ${out.join(', ')}`)
    }
    const small = new Map()
    for (const el of document.querySelectorAll('body *')) {
      const texty = ['INPUT', 'SELECT', 'BUTTON', 'TEXTAREA'].includes(el.tagName) || [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())
      if (!texty || el.closest('.visually-hidden, .xterm, [hidden]') || !el.getClientRects().length) continue
      const cs = getComputedStyle(el)
      if (cs.visibility !== 'visible' || parseFloat(cs.fontSize) >= 12) continue
      small.set(`${desc(el)} ${cs.fontSize}`, (el.textContent || el.value || '').trim().slice(0, 20))
    }
    for (const [k, v] of small) faults.push(`text under 12 px: ${k} "${v}"`)
    for (const sel of controls) {
      const els = document.querySelectorAll(sel)
      if (!els.length) faults.push(`no ${sel}`)
      for (const el of els) {
        el.scrollIntoView({ block: 'center', inline: 'nearest' })
        const r = el.getBoundingClientRect()
        const cx = r.left + r.width / 2
        const cy = r.top + r.height / 2
        if (!r.width || !r.height) { faults.push(`${sel} (${desc(el)}) is not shown`); continue }
        if (cx < 0 || cx > innerWidth || cy < 0 || cy > innerHeight) { faults.push(`${sel} (${desc(el)}) is off screen`); continue }
        const hit = document.elementFromPoint(cx, cy)
        if (!hit || !(el === hit || el.contains(hit) || (hit.tagName === 'LABEL' && hit.control === el))) faults.push(`${sel} (${desc(el)}) is under ${desc(hit)}`)
      }
    }
    for (const t of document.querySelectorAll('#main table')) {
      if (t.closest('.uplot')) continue // a chart's legend, inside the chart's box
      const wrap = t.closest('.table-wrap')
      if (!wrap || !['auto', 'scroll'].includes(getComputedStyle(wrap).overflowX)) { faults.push(`table "${t.caption?.textContent}" is not in a scroll box of its own`); continue }
      const r = wrap.getBoundingClientRect()
      if (r.left < -0.5 || r.right > wide + 0.5) faults.push(`table "${t.caption?.textContent}"'s scroll box runs from ${r.left} to ${r.right} px`)
    }
    scrollTo(0, 0)
    return faults
  }, wide, controls)
}

srv.test('readable at 1280x800 and on a phone (390x844): no sideways scrolling, no text under 12 px, the controls shown and uncovered, tables scrolling in their own box', async () => {
  const sizes = [['1280x800', VIEWPORT], ['390x844', PHONE]]
  // The sign-in page, before signing in.
  const outside = await browser.createBrowserContext()
  try {
    const w = await watchedPage(outside)
    w.expect(401, /^\/console\/session$/)
    for (const [name, size] of sizes) {
      await w.page.setViewport(size)
      await w.page.goto(`${srv.url}/console/`, { waitUntil: 'domcontentloaded' })
      await w.page.waitForSelector('#apikey', { visible: true })
      assert.deepEqual(await layoutFaults(w.page, size.width, ['#apikey', 'form.signin button[type=submit]']), [], `the sign-in page at ${name}`)
      await w.page.screenshot({ path: path.join(ARTIFACTS, `layout-signin-${name}.png`), fullPage: true })
    }
    w.check('layout: sign-in')
  } finally {
    await outside.close()
  }

  const p = kb.page
  const id = sbx.sandboxId
  const pages = [
    ['sandboxes', '#/sandboxes', `a[href="#/sandboxes/${id}"]`, ['#nav a[href="#/sandboxes"]', '#signout', '#sb-search', '#sb-state', `a[href="#/sandboxes/${id}"]`]],
    ['sandbox', `#/sandboxes/${id}`, '.u-legend .u-series th[tabindex]', ['.card .buttons button[data-when]', '#sb-term-h ~ .buttons button', '#fs-dir', '#fs-upload', '#log-search', '#log-follow']],
    ['templates', '#/templates', '#main table', ['#main .page-head button', '#main table']],
    ['nodes', '#/nodes', '.node button[data-node]', ['.node button[data-node]', '.meter-track']],
    ['keys', '#/keys', '#main table', ['#key-name', '#key-admin', 'form.grid-form button[type=submit]', 'button[aria-label^="Revoke key"]']],
  ]
  for (const [name, size] of sizes) {
    await p.setViewport(size)
    for (const [page, hash, ready, controls] of pages) {
      await p.evaluate((h) => { location.hash = h }, hash)
      await p.waitForSelector(ready)
      if (page === 'sandbox') await p.waitForFunction(() => /entries in \//.test(document.querySelector('#sb-files-h ~ .status')?.textContent ?? '') && /entries/.test(document.querySelector('#sb-logs-h ~ .status')?.textContent ?? ''))
      assert.deepEqual(await layoutFaults(p, size.width, controls), [], `the ${page} page at ${name}`)
      await p.screenshot({ path: path.join(ARTIFACTS, `layout-${page}-${name}.png`), fullPage: true })
    }
  }
  await p.setViewport(VIEWPORT)
  kb.check('layout')
  await kbContext.close()
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

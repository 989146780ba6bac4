// The console's shell: sign-in, navigation and the page router (hash
// routes, so that the server serves one page and the back button works).

import { currentSession, signIn, signOut, whenSignedOut } from './api.js';
import { h, replace, toast } from './ui.js';
import * as sandboxes from './pages/sandboxes.js';
import * as sandbox from './pages/sandbox.js';
import * as templates from './pages/templates.js';
import * as snapshots from './pages/snapshots.js';
import * as volumes from './pages/volumes.js';
import * as nodes from './pages/nodes.js';
import * as cluster from './pages/cluster.js';
import * as keys from './pages/keys.js';
import * as teams from './pages/teams.js';

const main = document.getElementById('main');
const top = document.getElementById('top');

// Route patterns: [regexp over the hash's path, page, admin only].
const routes = [
  [/^\/sandboxes$/, sandboxes, false],
  [/^\/sandboxes\/([a-z0-9]+)$/, sandbox, false],
  [/^\/templates$/, templates, false],
  [/^\/snapshots$/, snapshots, false],
  [/^\/volumes$/, volumes, false],
  [/^\/nodes$/, nodes, true],
  [/^\/cluster$/, cluster, true],
  [/^\/keys$/, keys, true],
  [/^\/teams$/, teams, true],
];

let session = null;
let stopPage = null;

function showSignIn(message) {
  session = null;
  if (stopPage) { stopPage(); stopPage = null; }
  top.hidden = true;
  const input = h('input', { id: 'apikey', name: 'apiKey', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false', placeholder: 'e2b_…' });
  const error = h('p', { class: 'error', role: 'alert' }, message || '');
  const form = h('form', { class: 'signin', method: 'post', action: 'session' },
    h('h1', {}, 'Sign in to aenv'),
    h('p', {}, 'Sign in with an API key. It is exchanged for a session cookie and is not kept in this page.'),
    h('label', { for: 'apikey' }, 'API key'),
    input,
    h('button', { type: 'submit', class: 'primary' }, 'Sign in'),
    error);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const button = form.querySelector('button');
    button.disabled = true;
    error.textContent = '';
    try {
      const s = await signIn(input.value.trim());
      input.value = '';
      started(s);
    } catch (e) {
      error.textContent = e.status === 401 ? 'That API key is not valid.' : e.message;
      input.focus();
    } finally {
      button.disabled = false;
    }
  });
  replace(main, form);
  input.focus();
}

function started(s) {
  session = s;
  top.hidden = false;
  document.getElementById('who').textContent = `${s.key.name || s.key.id} · team ${s.key.team}${s.key.admin ? ' · admin' : ''}`;
  for (const li of document.querySelectorAll('[data-admin]')) li.hidden = !s.key.admin;
  if (!location.hash || location.hash === '#' || location.hash === '#/') location.hash = '#/sandboxes';
  else route();
}

function route() {
  if (!session) return;
  if (stopPage) { stopPage(); stopPage = null; }
  const path = (location.hash.replace(/^#/, '') || '/sandboxes').split('?')[0];
  for (const a of document.querySelectorAll('#nav a')) {
    const here = path === a.getAttribute('href').slice(1) || path.startsWith(a.getAttribute('href').slice(1) + '/');
    if (here) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  for (const [re, page, adminOnly] of routes) {
    const m = path.match(re);
    if (!m) continue;
    main.replaceChildren();
    if (adminOnly && !session.key.admin) {
      replace(main, h('h1', {}, 'Not available'), h('p', {}, 'This page needs an admin API key.'));
      return;
    }
    stopPage = page.render(main, { session }, ...m.slice(1)) || null;
    main.focus({ preventScroll: true });
    return;
  }
  replace(main, h('h1', {}, 'Not found'), h('p', {}, h('a', { href: '#/sandboxes' }, 'Back to the sandboxes')));
}

document.getElementById('signout').addEventListener('click', async () => {
  try { await signOut(); } catch (e) { toast(e.message, 'error'); return; }
  showSignIn('Signed out.');
});

// The skip link moves focus to the main area: followed as a link, its
// #main would be taken for a route.
document.querySelector('a.skip').addEventListener('click', (ev) => {
  ev.preventDefault();
  main.focus();
});

whenSignedOut(() => { if (session) showSignIn('Your session ended: sign in again.'); });
window.addEventListener('hashchange', route);

const s = await currentSession().catch((e) => { toast(e.message, 'error'); return null; });
if (s) started(s); else showSignIn();

// Small DOM helpers. Everything the API says is set as text, never as
// HTML, so that no sandbox's metadata or log line can run as script.

/** Makes an element: h('a', {href: '#'}, 'text', child, ...). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces el's children. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/** Bytes in binary units: 1.5 GiB. */
export function fmtBytes(n) {
  if (n === undefined || n === null || Number.isNaN(n)) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i === 0 ? n : n.toFixed(n < 10 ? 1 : 0)} ${units[i]}`;
}

/** How long ago t was: 3m, 2h 5m, 4d. */
export function fmtAge(t) {
  if (!t) return '–';
  let s = Math.max(0, Math.floor((Date.now() - new Date(t).getTime()) / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m`;
  const hr = Math.floor(m / 60);
  if (hr < 24) return `${hr}h ${m % 60}m`;
  return `${Math.floor(hr / 24)}d ${hr % 24}h`;
}

/** A time as the browser's locale writes it. */
export function fmtTime(t) {
  return t ? new Date(t).toLocaleString() : '–';
}

/** A percentage with one decimal. */
export function fmtPct(p) {
  return p === undefined || p === null ? '–' : `${p.toFixed(1)}%`;
}

let toastTimer;
/** Tells the user something, in the live region screen readers announce. */
export function toast(message, kind = 'info') {
  const el = document.getElementById('toast');
  el.textContent = message;
  el.dataset.kind = kind;
  el.classList.add('shown');
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => el.classList.remove('shown'), kind === 'error' ? 8000 : 4000);
}

/** Runs an action from a button: disabled meanwhile, errors told. */
export async function run(button, fn, done) {
  button.disabled = true;
  try {
    const out = await fn();
    if (done) toast(done);
    return out;
  } catch (e) {
    toast(e.message || String(e), 'error');
    return undefined;
  } finally {
    button.disabled = false;
  }
}

/** A page heading with optional actions beside it. */
export function heading(text, ...actions) {
  return h('div', { class: 'page-head' }, h('h1', {}, text), actions.length ? h('div', { class: 'actions' }, actions) : null);
}

/** A table: columns [{label, cell: row => node|string, class}], in a scroll box. */
export function table(caption, columns, rows, empty = 'Nothing here yet.') {
  if (!rows.length) return h('p', { class: 'empty' }, empty);
  return h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': caption },
    h('table', {},
      h('caption', { class: 'visually-hidden' }, caption),
      h('thead', {}, h('tr', {}, columns.map(c => h('th', { scope: 'col', class: c.class }, c.label)))),
      h('tbody', {}, rows.map(r => h('tr', {}, columns.map(c => h('td', { class: c.class }, c.cell(r))))))));
}

/** A bar showing used against total. */
export function meter(label, used, total, fmt = String) {
  const pct = total > 0 ? Math.min(100, (used / total) * 100) : 0;
  return h('div', { class: 'meter' },
    h('div', { class: 'meter-label' }, `${label}: ${fmt(used)} / ${fmt(total)}`),
    h('div', { class: 'meter-track', role: 'meter', 'aria-label': label, 'aria-valuemin': '0', 'aria-valuemax': String(total || 0), 'aria-valuenow': String(used || 0) },
      h('div', { class: 'meter-fill' + (pct > 90 ? ' hot' : ''), style: null, 'data-pct': pct.toFixed(0) })));
}

/** Sizes the meters' fills (CSP forbids style attributes in markup). */
export function sizeMeters(root) {
  for (const f of root.querySelectorAll('.meter-fill')) f.style.width = `${f.dataset.pct}%`;
}

/** Polls fn every ms while the page shows, and at once; returns a stop. */
export function poll(fn, ms) {
  let stopped = false;
  let timer;
  const tick = async () => {
    if (stopped) return;
    if (!document.hidden) {
      try { await fn(); } catch (e) { if (!stopped) toast(e.message || String(e), 'error'); }
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => { stopped = true; clearTimeout(timer); };
}

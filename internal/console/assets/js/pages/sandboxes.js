// The sandboxes: a table updated every second from GET /v2/sandboxes and
// the latest metrics (GET /sandboxes/metrics), filtered by metadata (on
// the server) and by a search over what the table shows (here). A
// sandbox an SDK creates shows within 2 s (the browser suite holds the
// page to that); the two reads a second are cheap for the server.

import { api, apiWithHeaders } from '../api.js';
import { h, heading, fmtAge, fmtBytes, fmtPct } from '../ui.js';

const every = 1000;

export function render(main) {
  const search = h('input', { id: 'sb-search', type: 'search', placeholder: 'id, template, node, metadata…' });
  const metadata = h('input', { id: 'sb-metadata', type: 'text', placeholder: 'key=value, key2=value2', spellcheck: 'false' });
  const state = h('select', { id: 'sb-state' },
    h('option', { value: 'running,paused' }, 'running and paused'),
    h('option', { value: 'running' }, 'running'),
    h('option', { value: 'paused' }, 'paused'));
  const status = h('p', { class: 'status', id: 'sb-status' }, 'Loading…');
  const tbody = h('tbody', {});
  const tableBox = h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': 'Sandboxes' },
    h('table', { class: 'sandboxes' },
      h('caption', { class: 'visually-hidden' }, 'Sandboxes'),
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'Sandbox'),
        h('th', { scope: 'col' }, 'State'),
        h('th', { scope: 'col' }, 'Template'),
        h('th', { scope: 'col', class: 'opt' }, 'Node'),
        h('th', { scope: 'col' }, 'Age'),
        h('th', { scope: 'col', class: 'num' }, 'CPU'),
        h('th', { scope: 'col', class: 'num opt' }, 'Memory'),
        h('th', { scope: 'col', class: 'opt' }, 'Metadata'))),
      tbody));
  main.append(
    heading('Sandboxes'),
    h('form', { class: 'filters', role: 'search', onsubmit: (e) => { e.preventDefault(); refresh(); } },
      h('div', { class: 'field' }, h('label', { for: 'sb-search' }, 'Search'), search),
      h('div', { class: 'field' }, h('label', { for: 'sb-metadata' }, 'Metadata'), metadata),
      h('div', { class: 'field' }, h('label', { for: 'sb-state' }, 'State'), state),
      h('button', { type: 'submit' }, 'Apply')),
    status, tableBox);

  const rows = new Map(); // sandboxID -> {tr, cells}
  let last = [];
  let lastMetrics = {};
  let stopped = false;
  let timer;

  function metadataQuery() {
    const pairs = metadata.value.split(',').map(s => s.trim()).filter(Boolean);
    const q = new URLSearchParams();
    for (const p of pairs) {
      const [k, ...v] = p.split('=');
      if (k) q.append(k.trim(), v.join('=').trim());
    }
    return q.toString();
  }

  async function fetchAll() {
    const q = new URLSearchParams({ state: state.value, limit: '100' });
    const md = metadataQuery();
    if (md) q.set('metadata', md);
    let out = [];
    let next = '';
    // Pages of 100, up to 1000 sandboxes: past that, the filters say more.
    for (let i = 0; i < 10; i++) {
      if (next) q.set('nextToken', next);
      const { data, headers } = await apiWithHeaders('GET', `/v2/sandboxes?${q}`);
      out = out.concat(data);
      next = headers.get('X-Next-Token') || '';
      if (!next) break;
    }
    return out;
  }

  async function fetchMetrics(list) {
    const ids = list.filter(s => s.state === 'running').map(s => s.sandboxID);
    const out = {};
    for (let i = 0; i < ids.length; i += 100) {
      const res = await api('GET', `/sandboxes/metrics?sandbox_ids=${ids.slice(i, i + 100).join(',')}`);
      Object.assign(out, res.sandboxes || {});
    }
    return out;
  }

  function matches(sb) {
    const q = search.value.trim().toLowerCase();
    if (!q) return true;
    const text = [sb.sandboxID, sb.templateID, sb.alias, sb.nodeID, sb.state,
      ...Object.entries(sb.metadata || {}).map(([k, v]) => `${k}=${v}`)].join(' ').toLowerCase();
    return q.split(/\s+/).every(w => text.includes(w));
  }

  function row(sb) {
    let r = rows.get(sb.sandboxID);
    if (!r) {
      const cells = {
        id: h('td', {}, h('a', { href: `#/sandboxes/${sb.sandboxID}` }, sb.sandboxID)),
        state: h('td', {}, h('span', { class: 'badge' })),
        template: h('td', {}),
        node: h('td', { class: 'opt' }),
        age: h('td', {}),
        cpu: h('td', { class: 'num' }),
        mem: h('td', { class: 'num opt' }),
        md: h('td', { class: 'opt md' }),
      };
      r = { tr: h('tr', {}, Object.values(cells)), cells };
      rows.set(sb.sandboxID, r);
    }
    const m = lastMetrics[sb.sandboxID];
    const c = r.cells;
    const badge = c.state.firstChild;
    // A sandbox the platform paused for being idle resumes on its next
    // request: say so, it is not the owner's pause.
    const label = sb.idlePaused ? `${sb.state} (idle)` : sb.state;
    if (badge.textContent !== label) { badge.textContent = label; badge.dataset.state = sb.state; }
    setText(c.template, sb.alias || sb.templateID);
    setText(c.node, sb.nodeID || '–');
    setText(c.age, fmtAge(sb.startedAt));
    setText(c.cpu, m ? fmtPct(m.cpuUsedPct) : '–');
    setText(c.mem, m ? `${fmtBytes(m.memUsed)} / ${fmtBytes(m.memTotal)}` : `${sb.memoryMB} MiB`);
    setText(c.md, Object.entries(sb.metadata || {}).map(([k, v]) => `${k}=${v}`).join(', '));
    return r.tr;
  }

  function draw() {
    const shown = last.filter(matches).sort((a, b) => (b.startedAt || '').localeCompare(a.startedAt || '') || a.sandboxID.localeCompare(b.sandboxID));
    const keep = new Set(shown.map(s => s.sandboxID));
    for (const [id, r] of rows) if (!keep.has(id)) { r.tr.remove(); rows.delete(id); }
    // Rows are moved only when out of place, so that focus in the table
    // survives the updates.
    let at = tbody.firstChild;
    for (const sb of shown) {
      const tr = row(sb);
      if (tr !== at) tbody.insertBefore(tr, at); else at = at.nextSibling;
    }
    tableBox.hidden = shown.length === 0;
    status.textContent = `${shown.length} of ${last.length} sandboxes · updated ${new Date().toLocaleTimeString()}`;
    if (!last.length) status.textContent = `No sandboxes${metadata.value.trim() ? ' with that metadata' : ''}. Create one with an SDK or \`aenv sandbox create\`.`;
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      if (!document.hidden) {
        last = await fetchAll();
        lastMetrics = await fetchMetrics(last).catch(() => lastMetrics);
        if (!stopped) draw();
      }
    } catch (e) {
      if (!stopped) status.textContent = `Could not list the sandboxes: ${e.message}`;
    }
    if (!stopped) timer = setTimeout(refresh, every);
  }

  search.addEventListener('input', draw);
  state.addEventListener('change', refresh);
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}

function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

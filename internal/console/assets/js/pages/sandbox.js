// One sandbox: what it is, its CPU, memory and disk over its life (GET
// /sandboxes/{id}/metrics), its log with follow and search (GET
// /v2/sandboxes/{id}/logs), the actions on it, a terminal in it
// (terminal.js) and its files (files.js).

import uPlot from '../../vendor/uplot/uPlot.esm.js';
import { api, APIError } from '../api.js';
import { h, replace, heading, fmtAge, fmtBytes, fmtTime, run, toast } from '../ui.js';
import { terminalCard } from './terminal.js';
import { filesCard } from './files.js';

const every = 3000;
const MiB = 1024 * 1024;

export function render(main, _ctx, id) {
  const info = h('section', { class: 'card', 'aria-labelledby': 'sb-info-h' });
  const actions = h('section', { class: 'card', 'aria-labelledby': 'sb-actions-h' });
  const charts = h('section', { class: 'card', 'aria-labelledby': 'sb-charts-h' },
    h('h2', { id: 'sb-charts-h' }, 'Usage'));
  const logs = h('section', { class: 'card', 'aria-labelledby': 'sb-logs-h' });
  const term = terminalCard(id);
  const files = filesCard(id);
  main.append(
    h('p', { class: 'crumbs' }, h('a', { href: '#/sandboxes' }, 'Sandboxes'), ' / ', id),
    heading(`Sandbox ${id}`), info, actions, term.section, files.section, charts, logs);

  let stopped = false;
  let sb = null;
  let infoTimer;
  let metricsTimer;

  // --- what it is -------------------------------------------------------
  // fetchInfo reads and shows the sandbox; false once it is gone.
  async function fetchInfo() {
    try {
      sb = await api('GET', `/sandboxes/${id}`);
      if (!stopped) drawInfo();
    } catch (e) {
      if (e instanceof APIError && e.status === 404) {
        sb = null;
        replace(info, h('h2', { id: 'sb-info-h' }, 'Gone'), h('p', {}, 'This sandbox has ended (or your key may not see it).'));
        actions.hidden = true;
        term.setState('gone');
        files.setState('gone');
        return false;
      }
      toast(e.message, 'error');
    }
    return true;
  }

  async function infoLoop() {
    if (await fetchInfo() && !stopped) infoTimer = setTimeout(infoLoop, every);
  }

  function drawInfo() {
    const md = Object.entries(sb.metadata || {});
    replace(info,
      h('h2', { id: 'sb-info-h' }, 'Details'),
      h('dl', { class: 'facts' },
        fact('State', h('span', { class: 'badge', 'data-state': sb.state }, sb.idlePaused ? `${sb.state} (idle)` : sb.state)),
        fact('Template', sb.alias ? `${sb.alias} (${sb.templateID})` : sb.templateID),
        fact('Node', sb.nodeID || '–'),
        fact('Started', `${fmtTime(sb.startedAt)} (${fmtAge(sb.startedAt)} ago)`),
        fact('Ends', sb.endAt ? fmtTime(sb.endAt) : '–'),
        fact('CPU', `${sb.cpuCount} vCPU`),
        fact('Memory', `${sb.memoryMB} MiB`),
        fact('Disk', sb.diskSizeMB ? `${sb.diskSizeMB} MiB` : '–'),
        fact('On timeout', sb.lifecycle ? `${sb.lifecycle.onTimeout}${sb.lifecycle.autoResume ? ', resumes on traffic' : ''}` : '–'),
        fact('Metadata', md.length ? md.map(([k, v]) => `${k}=${v}`).join(', ') : '–')));
    for (const b of actions.querySelectorAll('[data-when]')) {
      b.disabled = !b.dataset.when.split(' ').includes(sb.state);
    }
    term.setState(sb.state);
    files.setState(sb.state);
  }

  // --- actions ----------------------------------------------------------
  const timeout = h('input', { id: 'sb-timeout', type: 'number', min: '1', step: '1', value: '300', inputmode: 'numeric' });
  const snapName = h('input', { id: 'sb-snapname', type: 'text', placeholder: 'optional', spellcheck: 'false' });
  const act = (label, when, fn, done, cls) => {
    const b = h('button', { type: 'button', 'data-when': when, class: cls });
    b.textContent = label;
    b.addEventListener('click', async () => { await run(b, fn, done); if (!stopped) fetchInfo(); });
    return b;
  };
  replace(actions,
    h('h2', { id: 'sb-actions-h' }, 'Actions'),
    h('div', { class: 'buttons' },
      act('Pause', 'running', () => api('POST', `/sandboxes/${id}/pause`, {}), 'Paused.'),
      act('Resume', 'paused', () => api('POST', `/sandboxes/${id}/resume`, { timeout: Number(timeout.value) || 300 }), 'Resumed.'),
      act('Fork', 'running paused', async () => {
        const out = await api('POST', `/sandboxes/${id}/fork`, { count: 1 });
        const child = out && out[0];
        if (child && child.error) throw new Error(child.error.message);
        if (child && child.sandbox) toast(`Forked: ${child.sandbox.sandboxID}`);
      }),
      act('Migrate', 'running', () => api('POST', `/sandboxes/${id}/migrate`, {}), 'Migrated.'),
      act('Kill', 'running paused', async () => {
        if (!window.confirm(`Kill sandbox ${id}? Its files and memory are lost.`)) return;
        await api('DELETE', `/sandboxes/${id}`);
        toast('Killed.');
        location.hash = '#/sandboxes';
      }, undefined, 'danger')),
    h('div', { class: 'inline-forms' },
      h('form', { class: 'inline', onsubmit: (e) => { e.preventDefault(); run(e.submitter || e.target.querySelector('button'), () => api('POST', `/sandboxes/${id}/timeout`, { timeout: Number(timeout.value) }), 'Timeout set.'); } },
        h('label', { for: 'sb-timeout' }, 'Timeout from now (s)'), timeout,
        h('button', { type: 'submit', 'data-when': 'running' }, 'Set timeout')),
      h('form', { class: 'inline', onsubmit: (e) => {
        e.preventDefault();
        run(e.submitter || e.target.querySelector('button'), async () => {
          const body = snapName.value.trim() ? { name: snapName.value.trim() } : {};
          const snap = await api('POST', `/sandboxes/${id}/snapshots`, body);
          toast(`Snapshot ${snap.snapshotID || ''} taken.`);
        });
      } },
        h('label', { for: 'sb-snapname' }, 'Snapshot name'), snapName,
        h('button', { type: 'submit', 'data-when': 'running paused' }, 'Take snapshot'))));

  // --- charts -----------------------------------------------------------
  const chartDefs = [
    { key: 'cpu', title: 'CPU', unit: '%', series: [{ label: 'CPU used', value: m => m.cpuUsedPct }], max: () => 100 },
    { key: 'mem', title: 'Memory', unit: 'MiB', series: [{ label: 'Used', value: m => m.memUsed / MiB }, { label: 'Total', value: m => m.memTotal / MiB }] },
    { key: 'disk', title: 'Disk', unit: 'MiB', series: [{ label: 'Used', value: m => m.diskUsed / MiB }, { label: 'Total', value: m => m.diskTotal / MiB }] },
  ];
  const colors = ['#2f6fde', '#9a9a9a'];
  const chartBoxes = chartDefs.map(d => {
    const box = h('figure', { class: 'chart', 'aria-labelledby': `chart-${d.key}-t` },
      h('figcaption', { id: `chart-${d.key}-t` }, `${d.title} (${d.unit})`),
      h('div', { class: 'chart-body' }),
      h('p', { class: 'visually-hidden', 'aria-live': 'off', 'data-summary': '' }));
    charts.append(box);
    return box;
  });
  const noData = h('p', { class: 'empty' }, 'No samples yet: envd reports every few seconds while the sandbox runs.');
  charts.append(noData);
  const plots = [];

  function chartWidth(box) { return Math.max(260, box.clientWidth - 8); }

  function drawCharts(samples) {
    noData.hidden = samples.length > 0;
    const xs = samples.map(m => m.timestampUnix || Math.floor(new Date(m.timestamp).getTime() / 1000));
    chartDefs.forEach((d, i) => {
      const data = [xs, ...d.series.map(s => samples.map(s.value))];
      const box = chartBoxes[i];
      const last = samples[samples.length - 1];
      box.querySelector('[data-summary]').textContent = last
        ? `${samples.length} samples; latest ${d.series.map(s => `${s.label} ${s.value(last).toFixed(1)} ${d.unit}`).join(', ')}`
        : 'no samples';
      if (!plots[i]) {
        plots[i] = new uPlot({
          width: chartWidth(box), height: 180,
          scales: { x: { time: true }, y: d.max ? { range: [0, d.max()] } : { range: (u, lo, hi) => [0, Math.max(1, hi * 1.1)] } },
          axes: [{}, { size: 60 }],
          series: [{}, ...d.series.map((s, j) => ({ label: s.label, stroke: colors[j], width: 2, fill: j === 0 ? 'rgba(47,111,222,0.12)' : undefined }))],
          legend: { live: true },
          hooks: { setSeries: [(u, si) => pressed(u, si)] },
        }, data, box.querySelector('.chart-body'));
        legendKeys(plots[i], d);
      } else {
        plots[i].setData(data);
      }
    });
  }

  async function loadMetrics() {
    try {
      const samples = await api('GET', `/sandboxes/${id}/metrics`);
      if (!stopped) drawCharts(samples || []);
    } catch (e) {
      if (!(e instanceof APIError && e.status === 404)) toast(`Metrics: ${e.message}`, 'error');
      if (e.status === 404) return;
    }
    if (!stopped) metricsTimer = setTimeout(loadMetrics, sb && sb.state !== 'running' ? every * 4 : every);
  }

  const resize = new ResizeObserver(() => plots.forEach((p, i) => p && p.setSize({ width: chartWidth(chartBoxes[i]), height: 180 })));
  resize.observe(charts);

  // --- log --------------------------------------------------------------
  const logSearch = h('input', { id: 'log-search', type: 'search', placeholder: 'text in a message or field' });
  const logLevel = h('select', { id: 'log-level' },
    ...['debug', 'info', 'warn', 'error'].map(l => h('option', { value: l }, l)));
  const follow = h('input', { id: 'log-follow', type: 'checkbox', checked: true });
  const logList = h('ol', { class: 'log', tabindex: '0', 'aria-label': 'Log entries' });
  const logStatus = h('p', { class: 'status' });
  replace(logs,
    h('h2', { id: 'sb-logs-h' }, 'Log'),
    h('form', { class: 'filters', role: 'search', onsubmit: (e) => { e.preventDefault(); reloadLogs(); } },
      h('div', { class: 'field' }, h('label', { for: 'log-search' }, 'Search'), logSearch),
      h('div', { class: 'field' }, h('label', { for: 'log-level' }, 'Level'), logLevel),
      h('div', { class: 'field check' }, follow, h('label', { for: 'log-follow' }, 'Follow')),
      h('button', { type: 'submit' }, 'Search')),
    logStatus, logList);

  let cursor = 0;
  let seen = new Set();
  let logTimer;
  let logGen = 0;

  function logLine(e) {
    const fields = Object.entries(e.fields || {}).map(([k, v]) => `${k}=${v}`).join(' ');
    return h('li', { 'data-level': e.level },
      h('time', { datetime: e.timestamp }, new Date(e.timestamp).toLocaleTimeString()), ' ',
      h('span', { class: 'level' }, e.level), ' ',
      h('span', { class: 'msg' }, e.message),
      fields ? h('span', { class: 'fields' }, ' ', fields) : null);
  }

  async function loadLogs(gen) {
    try {
      const q = new URLSearchParams({ limit: '1000', level: logLevel.value });
      if (logSearch.value.trim()) q.set('search', logSearch.value.trim());
      if (cursor) q.set('cursor', String(cursor));
      const res = await api('GET', `/v2/sandboxes/${id}/logs?${q}`);
      if (gen !== logGen || stopped) return;
      const atBottom = logList.scrollHeight - logList.scrollTop - logList.clientHeight < 40;
      for (const e of res.logs || []) {
        const k = `${e.timestamp}|${e.level}|${e.message}|${JSON.stringify(e.fields)}`;
        if (seen.has(k)) continue;
        seen.add(k);
        logList.append(logLine(e));
        cursor = Math.max(cursor, new Date(e.timestamp).getTime());
      }
      logStatus.textContent = `${logList.children.length} entries${follow.checked ? ' · following' : ''}`;
      if (follow.checked && atBottom) logList.scrollTop = logList.scrollHeight;
    } catch (e) {
      if (gen !== logGen) return;
      logStatus.textContent = `Could not read the log: ${e.message}`;
      if (e.status === 404) return;
    }
    if (follow.checked && !stopped) logTimer = setTimeout(() => loadLogs(gen), 2000);
  }

  function reloadLogs() {
    clearTimeout(logTimer);
    logGen++;
    cursor = 0;
    seen = new Set();
    logList.replaceChildren();
    loadLogs(logGen);
  }
  follow.addEventListener('change', () => { clearTimeout(logTimer); if (follow.checked) loadLogs(logGen); });
  logLevel.addEventListener('change', reloadLogs);

  infoLoop();
  loadMetrics();
  reloadLogs();
  return () => {
    stopped = true;
    clearTimeout(infoTimer);
    clearTimeout(metricsTimer);
    clearTimeout(logTimer);
    resize.disconnect();
    plots.forEach(p => p && p.destroy());
    term.stop();
  };
}

// legendKeys makes the legend's series, which uPlot hides and shows on
// a click, buttons the keyboard reaches and presses (Enter or Space).
function legendKeys(u, d) {
  u.root.querySelectorAll('.u-legend tr.u-series').forEach((tr, si) => {
    if (si === 0) return; // the time, not a series
    const th = tr.querySelector('th');
    th.tabIndex = 0;
    th.setAttribute('role', 'button');
    th.setAttribute('aria-label', `${d.title}: ${u.series[si].label}`);
    th.addEventListener('keydown', (ev) => {
      if (ev.key !== 'Enter' && ev.key !== ' ') return;
      ev.preventDefault();
      th.click();
    });
    pressed(u, si);
  });
}

// pressed tells assistive technology whether series si is shown.
function pressed(u, si) {
  const th = u.root.querySelectorAll('.u-legend tr.u-series')[si]?.querySelector('th');
  if (th && si > 0) th.setAttribute('aria-pressed', String(u.series[si].show));
}

function fact(label, value) {
  return h('div', {}, h('dt', {}, label), h('dd', {}, value));
}

// The templates the key may start sandboxes from, with their sizes: the
// template's own, and, for block images, the image and what it alone
// holds in the store (its deduplicated bytes); and each one's last build
// with its log, followed while the build runs.

import { api } from '../api.js';
import { h, replace, heading, table, fmtBytes, fmtTime } from '../ui.js';

export function render(main) {
  const body = h('div', {}, h('p', { class: 'status' }, 'Loading…'));
  const reload = h('button', { type: 'button', onclick: load }, 'Refresh');
  const buildLog = h('section', { 'aria-labelledby': 'tpl-build-h', hidden: true });
  main.append(heading('Templates', reload), body, buildLog);
  let stopped = false;
  let following = 0; // the build log shown: a later one stops the earlier's polling

  async function load() {
    try {
      const list = await api('GET', '/templates');
      if (stopped) return;
      list.sort((a, b) => name(a).localeCompare(name(b)));
      replace(body, table('Templates', [
        { label: 'Template', cell: t => h('span', {}, h('strong', {}, name(t)), name(t) !== t.templateID ? h('span', { class: 'sub' }, ` ${t.templateID}`) : null) },
        { label: 'Resources', class: 'opt', cell: t => `${t.cpuCount} vCPU · ${t.memoryMB} MiB · disk ${t.diskSizeMB} MiB` },
        { label: 'Size', class: 'num', cell: t => fmtBytes(t.sizeBytes) },
        { label: 'Image', class: 'num opt', cell: t => t.imageBytes ? fmtBytes(t.imageBytes) : '–' },
        { label: 'Unique bytes', class: 'num opt', cell: t => t.uniqueBytes ? fmtBytes(t.uniqueBytes) : '–' },
        { label: 'Public', cell: t => t.public ? 'yes' : 'no' },
        { label: 'Build', cell: t => buildCell(t) },
        { label: 'Sandboxes started', class: 'num opt', cell: t => String(t.spawnCount ?? 0) },
        { label: 'Updated', class: 'opt', cell: t => fmtTime(t.updatedAt || t.createdAt) },
      ], list, 'No templates yet: build one with `aenv build` or pull one with `aenv pull`.'));
    } catch (e) {
      replace(body, h('p', { class: 'error' }, `Could not list the templates: ${e.message}`));
    }
  }

  function buildCell(t) {
    if (!t.buildID) return t.buildStatus || '–';
    const b = h('button', { type: 'button', 'aria-label': `Show the log of ${name(t)}'s build` }, `${t.buildStatus || 'build'}: log`);
    b.addEventListener('click', () => showBuild(t));
    return b;
  }

  // showBuild shows a build's log, and follows it while the build runs
  // (E2B's status route, from logsOffset on).
  async function showBuild(t) {
    const mine = ++following;
    const status = h('p', { class: 'sub', role: 'status' }, 'Loading…');
    const lines = h('ol', { class: 'log', tabindex: '0', 'aria-label': `Log of build ${t.buildID}` });
    buildLog.hidden = false;
    replace(buildLog, h('h2', { id: 'tpl-build-h' }, `Build ${t.buildID} of ${name(t)}`), status, lines);
    lines.focus();
    let offset = 0;
    while (!stopped && mine === following) {
      let st;
      try {
        st = await api('GET', `/templates/${encodeURIComponent(t.templateID)}/builds/${encodeURIComponent(t.buildID)}/status?logsOffset=${offset}`);
      } catch (e) {
        status.textContent = `Could not read the build: ${e.message}`;
        return;
      }
      if (mine !== following) return;
      for (const e of st.logEntries || []) {
        lines.append(h('li', { 'data-level': e.level },
          h('time', { datetime: e.timestamp }, fmtTime(e.timestamp)), ' ',
          h('span', { class: 'level' }, e.level), ' ', e.message));
      }
      offset += (st.logEntries || []).length;
      const reason = st.reason && st.reason.message ? `: ${st.reason.message}` : '';
      status.textContent = `${st.status}${reason} · ${offset} log lines`;
      if (st.status !== 'building' && st.status !== 'waiting') return;
      await new Promise(r => setTimeout(r, 1000));
    }
  }

  load();
  return () => { stopped = true; };
}

function name(t) {
  return (t.aliases && t.aliases[0]) || (t.names && t.names[0]) || t.templateID;
}

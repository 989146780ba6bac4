// The snapshots the key's team owns (an admin's: every team's).

import { api } from '../api.js';
import { h, replace, heading, table, fmtBytes, fmtTime } from '../ui.js';

export function render(main) {
  const body = h('div', {}, h('p', { class: 'status' }, 'Loading…'));
  const reload = h('button', { type: 'button', onclick: load }, 'Refresh');
  main.append(heading('Snapshots', reload), body);
  let stopped = false;

  async function load() {
    try {
      const list = await api('GET', '/snapshots');
      if (stopped) return;
      list.sort((a, b) => (b.createdAt || '').localeCompare(a.createdAt || ''));
      replace(body, table('Snapshots', [
        { label: 'Snapshot', cell: s => h('span', {}, h('strong', {}, (s.names && s.names[0]) || s.snapshotID), s.names && s.names.length ? h('span', { class: 'sub' }, ` ${s.snapshotID}`) : null) },
        { label: 'From sandbox', cell: s => s.sandboxID ? h('a', { href: `#/sandboxes/${s.sandboxID}` }, s.sandboxID) : '–' },
        { label: 'Template', class: 'opt', cell: s => s.templateID || '–' },
        { label: 'Resources', class: 'opt', cell: s => s.cpuCount ? `${s.cpuCount} vCPU · ${s.memoryMB} MiB` : '–' },
        { label: 'Size', class: 'num', cell: s => fmtBytes(s.sizeBytes) },
        { label: 'Taken', class: 'opt', cell: s => fmtTime(s.createdAt) },
      ], list, 'No snapshots yet: take one from a sandbox’s page.'));
    } catch (e) {
      replace(body, h('p', { class: 'error' }, `Could not list the snapshots: ${e.message}`));
    }
  }

  load();
  return () => { stopped = true; };
}

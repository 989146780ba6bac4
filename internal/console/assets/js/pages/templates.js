// The templates the key may start sandboxes from, with their sizes: the
// template's own, and, for block images, the image and what it alone
// holds in the store (its deduplicated bytes).

import { api } from '../api.js';
import { h, replace, heading, table, fmtBytes, fmtTime } from '../ui.js';

export function render(main) {
  const body = h('div', {}, h('p', { class: 'status' }, 'Loading…'));
  const reload = h('button', { type: 'button', onclick: load }, 'Refresh');
  main.append(heading('Templates', reload), body);
  let stopped = false;

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
        { label: 'Build', class: 'opt', cell: t => t.buildStatus || '–' },
        { label: 'Sandboxes started', class: 'num opt', cell: t => String(t.spawnCount ?? 0) },
        { label: 'Updated', class: 'opt', cell: t => fmtTime(t.updatedAt || t.createdAt) },
      ], list, 'No templates yet: build one with `aenv build` or pull one with `aenv pull`.'));
    } catch (e) {
      replace(body, h('p', { class: 'error' }, `Could not list the templates: ${e.message}`));
    }
  }

  load();
  return () => { stopped = true; };
}

function name(t) {
  return (t.aliases && t.aliases[0]) || (t.names && t.names[0]) || t.templateID;
}

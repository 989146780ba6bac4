// The cluster's teams (admin keys only): their quotas against what they
// use, and new teams.

import { api } from '../api.js';
import { h, replace, heading, table, fmtBytes, run, toast } from '../ui.js';

const quotaFields = [
  ['maxSandboxes', 'Running sandboxes', 'running', String],
  ['maxPaused', 'Paused sandboxes', 'paused', String],
  ['maxBuilds', 'Builds at once', null, String],
  ['maxSnapshotBytes', 'Snapshot bytes', 'snapshotBytes', fmtBytes],
  ['maxVolumeBytes', 'Volume bytes', 'volumeBytes', fmtBytes],
];

export function render(main) {
  const list = h('div', {}, h('p', { class: 'status' }, 'Loading…'));
  const id = h('input', { id: 'team-id', required: true, spellcheck: 'false' });
  const max = h('input', { id: 'team-max', type: 'number', min: '0', value: '0', inputmode: 'numeric' });
  const form = h('form', { class: 'card grid-form', 'aria-labelledby': 'team-new-h' },
    h('h2', { id: 'team-new-h' }, 'New team'),
    h('div', { class: 'field' }, h('label', { for: 'team-id' }, 'Team id'), id),
    h('div', { class: 'field' }, h('label', { for: 'team-max' }, 'Max running sandboxes (0: no bound)'), max),
    h('button', { type: 'submit', class: 'primary' }, 'Create team'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    run(form.querySelector('button'), async () => {
      const body = { id: id.value.trim() };
      if (Number(max.value) > 0) body.maxSandboxes = Number(max.value);
      await api('POST', '/teams', body);
      toast(`Team ${body.id} created.`);
      id.value = '';
      await load();
    });
  });
  main.append(heading('Teams'), form, list);

  async function load() {
    const teams = await api('GET', '/teams');
    teams.sort((a, b) => a.id.localeCompare(b.id));
    replace(list, table('Teams', [
      { label: 'Team', cell: t => h('strong', {}, t.id) },
      { label: 'Keys', class: 'num', cell: t => String(t.usage?.keys ?? 0) },
      ...quotaFields.map(([field, label, used, fmt]) => ({
        label, class: field.endsWith('Bytes') ? 'num opt' : 'num',
        cell: t => `${used ? fmt(t.usage?.[used] ?? 0) : '–'} / ${t[field] ? fmt(t[field]) : '∞'}`,
      })),
      { label: 'Quota', cell: t => editButton(t) },
    ], teams));
  }

  function editButton(t) {
    const b = h('button', { type: 'button', 'aria-label': `Change team ${t.id}'s running-sandbox quota` }, 'Set quota');
    b.addEventListener('click', () => run(b, async () => {
      const v = window.prompt(`Max running sandboxes for team ${t.id} (0: no bound)`, String(t.maxSandboxes || 0));
      if (v === null) return;
      const n = Number(v);
      if (!Number.isInteger(n) || n < 0) throw new Error('A quota is a whole number, 0 or more.');
      await api('PATCH', `/teams/${encodeURIComponent(t.id)}`, { maxSandboxes: n });
      toast(`Team ${t.id}: at most ${n || '∞'} running sandboxes.`);
      await load();
    }));
    return b;
  }

  load().catch(e => replace(list, h('p', { class: 'error' }, `Could not list the teams: ${e.message}`)));
  return null;
}

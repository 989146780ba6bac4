// The cluster's API keys (admin keys only): list, create (the new key is
// shown this once), revoke.

import { api } from '../api.js';
import { h, replace, heading, table, fmtTime, run, toast } from '../ui.js';

export function render(main, ctx) {
  const list = h('div', {}, h('p', { class: 'status' }, 'Loading…'));
  const created = h('div', { class: 'created', 'aria-live': 'polite' });
  const name = h('input', { id: 'key-name', required: true, maxlength: '128' });
  const team = h('input', { id: 'key-team', placeholder: 'a team of its own', spellcheck: 'false' });
  const maxSb = h('input', { id: 'key-max', type: 'number', min: '0', value: '0', inputmode: 'numeric' });
  const admin = h('input', { id: 'key-admin', type: 'checkbox' });
  const form = h('form', { class: 'card grid-form', 'aria-labelledby': 'key-new-h' },
    h('h2', { id: 'key-new-h' }, 'New key'),
    h('div', { class: 'field' }, h('label', { for: 'key-name' }, 'Name'), name),
    h('div', { class: 'field' }, h('label', { for: 'key-team' }, 'Team'), team),
    h('div', { class: 'field' }, h('label', { for: 'key-max' }, 'Max running sandboxes (0: no bound)'), maxSb),
    h('div', { class: 'field check' }, admin, h('label', { for: 'key-admin' }, 'Admin')),
    h('button', { type: 'submit', class: 'primary' }, 'Create key'),
    created);
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    run(form.querySelector('button[type=submit]'), async () => {
      const k = await api('POST', '/keys', { name: name.value.trim(), team: team.value.trim(), maxSandboxes: Number(maxSb.value) || 0, admin: admin.checked });
      const out = h('input', { id: 'key-secret', readonly: true, value: k.key, spellcheck: 'false' });
      replace(created,
        h('label', { for: 'key-secret' }, `Key ${k.id}: copy it now, it is not shown again`), out);
      out.focus();
      out.select();
      name.value = '';
      await load();
    });
  });
  main.append(heading('API keys'), form, list);

  async function load() {
    const keys = await api('GET', '/keys');
    replace(list, table('API keys', [
      { label: 'Key', cell: k => h('span', {}, h('strong', {}, k.name), h('span', { class: 'sub' }, ` ${k.id} · ${k.hint}`)) },
      { label: 'Team', cell: k => k.team },
      { label: 'Admin', cell: k => k.admin ? 'yes' : 'no' },
      { label: 'Max sandboxes', class: 'num opt', cell: k => k.maxSandboxes ? String(k.maxSandboxes) : '–' },
      { label: 'Created', class: 'opt', cell: k => fmtTime(k.createdAt) },
      { label: 'Actions', cell: k => revokeButton(k) },
    ], keys));
  }

  function revokeButton(k) {
    const self = k.id === ctx.session.key.id;
    const b = h('button', { type: 'button', class: 'danger', 'aria-label': `Revoke key ${k.name} (${k.id})` }, 'Revoke');
    b.addEventListener('click', () => run(b, async () => {
      const warn = self ? ' This is the key you signed in with: your session ends.' : '';
      if (!window.confirm(`Revoke key ${k.name} (${k.id})? No server accepts it afterwards.${warn}`)) return;
      await api('DELETE', `/keys/${encodeURIComponent(k.id)}`);
      toast(`Key ${k.id} revoked.`);
      await load();
    }));
    return b;
  }

  load().catch(e => replace(list, h('p', { class: 'error' }, `Could not list the keys: ${e.message}`)));
  return null;
}

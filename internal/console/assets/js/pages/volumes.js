// The volumes the key's team owns (an admin's: every team's): list,
// create (its token, for the volume's files from outside a sandbox, is
// shown this once) and delete.

import { api } from '../api.js';
import { h, replace, heading, table, run, toast } from '../ui.js';

export function render(main) {
  const list = h('div', {}, h('p', { class: 'status' }, 'Loading…'));
  const created = h('div', { class: 'created', 'aria-live': 'polite' });
  const name = h('input', { id: 'vol-name', required: true, maxlength: '128', spellcheck: 'false', autocomplete: 'off' });
  const size = h('input', { id: 'vol-size', type: 'number', min: '0', step: '1', value: '', placeholder: 'the node’s default', inputmode: 'numeric' });
  const form = h('form', { class: 'card grid-form', 'aria-labelledby': 'vol-new-h' },
    h('h2', { id: 'vol-new-h' }, 'New volume'),
    h('div', { class: 'field' }, h('label', { for: 'vol-name' }, 'Name'), name),
    h('div', { class: 'field' }, h('label', { for: 'vol-size' }, 'Size (MiB)'), size),
    h('button', { type: 'submit', class: 'primary' }, 'Create volume'),
    created);
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    run(form.querySelector('button[type=submit]'), async () => {
      const body = { name: name.value.trim() };
      if (Number(size.value) > 0) body.sizeMB = Number(size.value);
      const v = await api('POST', '/volumes', body);
      const out = h('input', { id: 'vol-token', readonly: true, value: v.token || '', spellcheck: 'false' });
      replace(created,
        h('label', { for: 'vol-token' }, `Volume ${v.name} (${v.volumeID}): its token reaches its files from outside a sandbox; copy it now, it is not listed`), out);
      out.focus();
      out.select();
      name.value = '';
      await load();
    });
  });
  const reload = h('button', { type: 'button', onclick: () => load().catch(shown) }, 'Refresh');
  main.append(heading('Volumes', reload), form, list);
  let stopped = false;

  function shown(e) {
    replace(list, h('p', { class: 'error' }, `Could not list the volumes: ${e.message}`));
  }

  async function load() {
    const vols = await api('GET', '/volumes');
    if (stopped) return;
    vols.sort((a, b) => a.name.localeCompare(b.name));
    replace(list, table('Volumes', [
      { label: 'Volume', cell: v => h('span', {}, h('strong', {}, v.name), h('span', { class: 'sub' }, ` ${v.volumeID}`)) },
      { label: 'Size', class: 'num', cell: v => v.sizeMB ? `${v.sizeMB} MiB` : '–' },
      { label: 'Actions', cell: deleteButton },
    ], vols, 'No volumes yet: create one above, then mount it in a sandbox (volumeMounts).'));
  }

  function deleteButton(v) {
    const b = h('button', { type: 'button', class: 'danger', 'aria-label': `Delete volume ${v.name}` }, 'Delete');
    b.addEventListener('click', () => run(b, async () => {
      if (!window.confirm(`Delete volume ${v.name} (${v.volumeID})? Its files are lost.`)) return;
      await api('DELETE', `/volumes/${encodeURIComponent(v.volumeID)}`);
      toast(`Volume ${v.name} deleted.`);
      await load();
    }));
    return b;
  }

  load().catch(shown);
  return () => { stopped = true; };
}

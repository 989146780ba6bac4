// A sandbox's files: a directory's listing, each file's download, and
// uploads into the directory shown, through the console's files routes
// (which reach envd as the session's key; the page never holds the
// sandbox's envd token).

import { api, sendBytes } from '../api.js';
import { h, replace, table, fmtBytes, fmtTime, run, toast } from '../ui.js';

const dirname = (p) => (p.replace(/\/+$/, '').replace(/\/[^/]*$/, '') || '/');
const join = (dir, name) => (dir.endsWith('/') ? dir + name : `${dir}/${name}`);

/** The files card for sandbox id: {section, setState(state)}. */
export function filesCard(id) {
  const base = `/console/api/sandboxes/${encodeURIComponent(id)}`;
  const dirInput = h('input', { id: 'fs-dir', type: 'text', value: '~', spellcheck: 'false', autocomplete: 'off' });
  const upButton = h('button', { type: 'button', title: 'The directory above' }, 'Up');
  const listButton = h('button', { type: 'submit' }, 'List');
  const fileInput = h('input', { id: 'fs-upload', type: 'file', multiple: true });
  const uploadButton = h('button', { type: 'submit' }, 'Upload');
  const listing = h('div', { class: 'files' });
  const status = h('p', { class: 'status', role: 'status' });
  const section = h('section', { class: 'card', 'aria-labelledby': 'sb-files-h' },
    h('h2', { id: 'sb-files-h' }, 'Files'),
    h('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); list(dirInput.value.trim() || '~'); } },
      h('div', { class: 'field' }, h('label', { for: 'fs-dir' }, 'Directory'), dirInput),
      listButton, upButton),
    h('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); upload(); } },
      h('div', { class: 'field' }, h('label', { for: 'fs-upload' }, 'Upload into this directory'), fileInput),
      uploadButton),
    status, listing);

  // cwd is the directory listed: absolute once envd has said where "~" is.
  let cwd = '~';
  let running = true;
  let listed = false;

  async function list(dir) {
    status.textContent = `Listing ${dir}…`;
    try {
      const res = await api('GET', `${base}/files?${new URLSearchParams({ path: dir })}`);
      const entries = res.entries || [];
      cwd = dir.startsWith('/') ? dir : (entries.length ? dirname(entries[0].path) : dir);
      dirInput.value = cwd;
      listed = true;
      entries.sort((a, b) => (a.type === 'dir') !== (b.type === 'dir') ? (a.type === 'dir' ? -1 : 1) : a.name.localeCompare(b.name));
      replace(listing, table(`Files in ${cwd}`, [
        { label: 'Name', cell: nameCell },
        { label: 'Size', class: 'num', cell: e => e.type === 'dir' ? '–' : fmtBytes(e.size) },
        { label: 'Modified', class: 'opt', cell: e => fmtTime(e.modifiedTime) },
        { label: 'Permissions', class: 'opt', cell: e => h('code', {}, e.permissions || '') },
        { label: 'Owner', class: 'opt', cell: e => e.owner || '–' },
      ], entries, 'This directory is empty.'));
      status.textContent = `${entries.length} entries in ${cwd}`;
    } catch (e) {
      status.textContent = `Could not list ${dir}: ${e.message}`;
    }
    upButton.disabled = !cwd.startsWith('/') || cwd === '/';
  }

  function nameCell(e) {
    if (e.type === 'dir') {
      return h('button', { type: 'button', class: 'link', onclick: () => list(e.path) }, `${e.name}/`);
    }
    const href = `${base}/files/content?${new URLSearchParams({ path: e.path })}`;
    return h('span', {},
      h('a', { href, download: e.name, title: `Download ${e.path}` }, e.name),
      e.type === 'symlink' ? h('span', { class: 'sub' }, ` → ${e.symlinkTarget || '?'} `,
        h('button', { type: 'button', class: 'link', onclick: () => list(e.path) }, 'open as a directory')) : null);
  }

  async function upload() {
    const files = [...fileInput.files];
    if (!files.length) { toast('Choose a file to upload first.'); fileInput.focus(); return; }
    if (!cwd.startsWith('/')) await list(cwd);
    await run(uploadButton, async () => {
      for (const f of files) {
        status.textContent = `Uploading ${f.name} (${fmtBytes(f.size)})…`;
        await sendBytes('POST', `${base}/files/content?${new URLSearchParams({ path: join(cwd, f.name) })}`, f);
      }
      fileInput.value = '';
      await list(cwd);
    }, files.length === 1 ? `Uploaded ${files[0].name}.` : `Uploaded ${files.length} files.`);
  }

  upButton.addEventListener('click', () => list(dirname(cwd)));

  return {
    section,
    /** Follows the sandbox's state: files are reached in a running one. */
    setState(state) {
      running = state === 'running';
      for (const el of [listButton, uploadButton, fileInput]) el.disabled = !running;
      upButton.disabled = !running || !cwd.startsWith('/') || cwd === '/';
      if (running && !listed) list(cwd);
    },
  };
}

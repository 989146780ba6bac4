// The cluster's nodes (admin keys only): capacity against use (vCPUs and
// memory committed, disk, image cache), the sandboxes their warm pools
// hold prestarted, and drain and undrain.

import { api } from '../api.js';
import { h, replace, heading, meter, sizeMeters, fmtAge, fmtBytes, run, poll } from '../ui.js';

export function render(main) {
  const body = h('div', { class: 'nodes' }, h('p', { class: 'status' }, 'Loading…'));
  main.append(heading('Nodes'), body);
  let drawn = '';

  async function load() {
    const list = await api('GET', '/nodes');
    list.sort((a, b) => a.id.localeCompare(b.id));
    // Redrawn only when something changed, so that focus stays put.
    const sig = JSON.stringify(list.map(n => [n.id, n.state, n.capacity, n.usage, n.sandboxes, n.version, n.pooled, n.pool, n.imageCache]));
    if (sig === drawn && body.querySelector('.node')) return;
    drawn = sig;
    const focused = document.activeElement && document.activeElement.dataset.node;
    if (!list.length) { replace(body, h('p', { class: 'empty' }, 'No nodes have joined.')); return; }
    replace(body, ...list.map(card));
    sizeMeters(body);
    if (focused) body.querySelector(`[data-node="${CSS.escape(focused)}"]`)?.focus();
  }

  function card(n) {
    const draining = n.state === 'draining';
    const b = h('button', { type: 'button', 'data-node': n.id, disabled: n.state === 'lost' }, draining ? 'Undrain' : 'Drain');
    b.addEventListener('click', () => run(b, async () => {
      if (!draining && !window.confirm(`Drain node ${n.id}? It takes no new sandboxes; its running ones keep running.`)) return;
      await api(draining ? 'DELETE' : 'POST', `/nodes/${encodeURIComponent(n.id)}/drain`);
      drawn = '';
      await load();
    }, draining ? `Node ${n.id} is ready again.` : `Node ${n.id} drains.`));
    const cap = n.capacity || {};
    const use = n.usage || {};
    return h('article', { class: 'card node', 'aria-labelledby': `node-${n.id}` },
      h('div', { class: 'node-head' },
        h('h2', { id: `node-${n.id}` }, n.id),
        h('span', { class: 'badge', 'data-state': n.state }, n.state),
        b),
      h('p', { class: 'sub' }, [n.address || 'in-process', `${n.runtime}${n.runtimeVersion ? ' ' + n.runtimeVersion : ''}`, n.version ? `aenv ${n.version}` : null,
        `${n.sandboxes} sandboxes`, `${n.pooled || 0} pooled`, `reported ${fmtAge(n.updatedAt)} ago`].filter(Boolean).join(' · ')),
      meter('CPU', use.cpuCount || 0, cap.cpuCount || 0, v => `${v} vCPU`),
      meter('Memory', use.memoryMB || 0, cap.memoryMB || 0, v => `${v} MiB`),
      cap.diskMB ? meter('Disk', use.diskMB || 0, cap.diskMB, v => `${v} MiB`) : null,
      n.imageCache ? meter('Image cache', n.imageCache.bytes, n.imageCache.maxBytes, fmtBytes) : null,
      poolList(n));
  }

  // poolList is what the node's warm pool holds, by template or snapshot.
  function poolList(n) {
    const pool = (n.pool || []).filter(p => p.ready || p.target);
    if (!pool.length) return h('p', { class: 'sub' }, 'Warm pool: empty.');
    return h('div', {},
      h('h3', { class: 'pool-h' }, 'Warm pool'),
      h('ul', { class: 'pool' }, pool.map(p => h('li', {},
        p.snapshotID ? `snapshot ${p.snapshotID}` : `template ${p.templateID}`,
        `: ${p.ready} ready of ${p.target} wanted`))));
  }

  return poll(load, 5000);
}

// The cluster's health (admin keys only): the members of its etcd and
// which leads, the API servers running, and the nodes' state at a glance,
// with each node's block image cache as its last report had it.

import { api } from '../api.js';
import { h, replace, heading, table, fmtAge, fmtBytes, fmtPct, poll } from '../ui.js';

export function render(main) {
  const etcd = h('section', { 'aria-labelledby': 'cl-etcd-h' }, h('h2', { id: 'cl-etcd-h' }, 'etcd members'), h('p', { class: 'status' }, 'Loading…'));
  const servers = h('section', { 'aria-labelledby': 'cl-srv-h' }, h('h2', { id: 'cl-srv-h' }, 'API servers'), h('p', { class: 'status' }, 'Loading…'));
  const nodes = h('section', { 'aria-labelledby': 'cl-nodes-h' }, h('h2', { id: 'cl-nodes-h' }, 'Nodes'), h('p', { class: 'status' }, 'Loading…'));
  main.append(heading('Cluster'), etcd, servers, nodes);

  // Each part answers on its own, so that an etcd without a quorum still
  // shows what the rest can say.
  async function part(section, load) {
    let body;
    try {
      body = await load();
    } catch (e) {
      body = h('p', { class: 'error' }, e.message);
    }
    replace(section, section.firstChild, body);
  }

  // A node's image cache: bytes held of its bound, images mounted, and
  // the share of chunk reads it served since its image server started.
  // A node without one (templates as directories, or an image server
  // that did not answer its last report) shows a dash.
  function cacheUse(n) {
    const c = n.imageCache;
    if (!c) return '–';
    const pct = c.maxBytes > 0 ? ` (${fmtPct((100 * c.bytes) / c.maxBytes)})` : '';
    return `${fmtBytes(c.bytes)} of ${fmtBytes(c.maxBytes)}${pct}`;
  }

  function hitRatio(n) {
    const c = n.imageCache;
    const reads = c ? c.hits + c.misses : 0;
    return reads > 0 ? fmtPct((100 * c.hits) / reads) : '–';
  }

  function state(m) {
    if (!m.started) return 'not started';
    return m.learner ? 'learner' : 'voter';
  }

  async function load() {
    await Promise.all([
      part(etcd, async () => {
        const ms = await api('GET', '/cluster/etcd');
        const voters = ms.filter(m => m.started && !m.learner).length;
        const quorum = Math.floor(voters / 2) + 1;
        return h('div', {},
          h('p', { class: 'sub' }, `${ms.length} members, ${voters} voting: a quorum is ${quorum}, so ${voters - quorum} may be down.${ms.some(m => m.leader) ? '' : ' No leader answered.'}`),
          table('etcd members', [
            { label: 'Name', cell: m => h('strong', {}, m.name || '–') },
            { label: 'ID', class: 'opt', cell: m => m.id },
            { label: 'State', cell: m => h('span', { class: 'badge', 'data-state': state(m) }, state(m)) },
            { label: 'Leader', cell: m => (m.leader ? 'leader' : '') },
            { label: 'Peer URLs', class: 'opt', cell: m => (m.peerURLs || []).join(', ') },
            { label: 'Client URLs', cell: m => (m.clientURLs || []).join(', ') },
          ], ms));
      }),
      part(servers, async () => {
        const list = await api('GET', '/cluster/servers');
        return table('API servers', [
          { label: 'Name', cell: s => h('strong', {}, s.name) },
          { label: 'Addresses', cell: s => (s.addresses || []).join(', ') || '–' },
        ], list, 'No server is registered.');
      }),
      part(nodes, async () => {
        const list = await api('GET', '/nodes');
        list.sort((a, b) => a.id.localeCompare(b.id));
        return table('Nodes', [
          { label: 'Node', cell: n => h('a', { href: '#/nodes' }, n.id) },
          { label: 'State', cell: n => h('span', { class: 'badge', 'data-state': n.state }, n.state) },
          { label: 'Sandboxes', class: 'num', cell: n => String(n.sandboxes ?? 0) },
          { label: 'Pooled', class: 'num', cell: n => String(n.pooled ?? 0) },
          { label: 'Image cache', cell: cacheUse },
          { label: 'Images mounted', class: 'num', cell: n => (n.imageCache ? String(n.imageCache.mounted) : '–') },
          { label: 'Cache hit ratio', class: 'num', cell: hitRatio },
          { label: 'Reported', class: 'opt', cell: n => `${fmtAge(n.updatedAt)} ago` },
        ], list, 'No nodes have joined.');
      }),
    ]);
  }

  return poll(load, 5000);
}

// herald dashboard: the cluster panel's words and colours from `GET /v1/cluster` (API.md).
// Pure: no DOM, no clock; app.js fetches the view with the overview's beat and draws it.
'use strict';

((H) => {
  // Owner colours (app.css `.owner-0` … `.owner-7`); a ninth node reuses the first.
  const PALETTE = 8;

  const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;

  // `holds 3 of 8 shards` (`shards`: S, the contract's field; `shards_total` says the same).
  function held(c) {
    const total = Number.isInteger(c.shards) ? c.shards : c.shards_total;
    return `holds ${c.shards_owned} of ${plural(total, 'shard', 'shards')}`;
  }

  // The clock offset against the database in words: `+12 ms`, `−250 ms`, or `not measured yet`.
  function offset(ms) {
    if (ms === null || ms === undefined || !Number.isFinite(Number(ms))) return 'not measured yet';
    const n = Math.round(Number(ms));
    if (n === 0) return '0 ms';
    return `${n > 0 ? '+' : '−'}${Math.abs(n).toLocaleString('en-US')} ms`;
  }

  // node id -> colour index, by the node ids in order (stable across refreshes and nodes).
  function colours(c) {
    const ids = new Set((c.nodes || []).map((n) => n.node_id));
    for (const s of c.leases || []) if (s.owner_node) ids.add(s.owner_node);
    const m = new Map();
    [...ids].sort().forEach((id, i) => m.set(id, i % PALETTE));
    return m;
  }

  // Each node as the panel lists it, this node first, then by id.
  function nodes(c) {
    const col = colours(c);
    return [...(c.nodes || [])]
      .sort((a, b) => (b.node_id === c.node_id) - (a.node_id === c.node_id) || (a.node_id < b.node_id ? -1 : a.node_id > b.node_id ? 1 : 0))
      .map((n) => ({
        id: n.node_id,
        self: n.node_id === c.node_id,
        live: !!n.live,
        state: n.live ? 'live' : 'not live',
        shards: plural(Array.isArray(n.shards) ? n.shards.length : n.shards_owned, 'shard', 'shards'),
        heartbeat: n.heartbeat_at || null,
        offset: offset(n.clock_offset_ms),
        advertise: n.advertise || '—',
        cls: `owner-${col.get(n.node_id)}`,
      }));
  }

  // One cell per shard (`leases`), in shard order: its class (`owner-N`, or `free`), a short
  // label (the shard number) and its title (owner, epoch, lease expiry). `at` formats an instant.
  function cells(c, at) {
    const col = colours(c);
    const when = at || ((iso) => iso);
    return [...(c.leases || [])]
      .sort((a, b) => a.shard - b.shard)
      .map((s) => {
        const owned = !s.free && s.owner_node;
        const parts = [`shard ${s.shard}`, owned ? `owner ${s.owner_node}` : 'free', `epoch ${s.epoch}`];
        if (s.lease_expires) parts.push(`${owned ? 'lease until' : 'lease expired'} ${when(s.lease_expires)}`);
        else parts.push('no lease');
        return {
          shard: s.shard,
          owner: owned ? s.owner_node : null,
          cls: owned ? `owner-${col.get(s.owner_node)}` : 'free',
          title: parts.join(' · '),
        };
      });
  }

  H.cluster = { held, offset, colours, nodes, cells, PALETTE };
})(window.Herald = window.Herald || {});

// herald dashboard: a task's timeline (API.md "Trace and timeline") in words. Pure: no DOM,
// no clock; app.js reads the pages and draws the list, newest first.
'use strict';

((H) => {
  // What each kind means, for the line of an event.
  const KIND = {
    created: 'created', patched: 'changed', paused: 'paused', resumed: 'resumed',
    triggered: 'triggered', cancelled: 'cancelled', fired: 'fired', skipped: 'fire skipped',
    expired: 'fire expired', attempt: 'attempt', retry_scheduled: 'retry scheduled',
    delivered: 'delivered', failed: 'to the failure list', failure_retried: 'failure retried',
    failure_dismissed: 'failure dismissed', held: 'held', resumed_after_restart: 'sent again after a restart',
  };

  // `run 2 · message 0 · attempt 3` (the parts the event has).
  function where(e) {
    const parts = [];
    if (e.run !== null && e.run !== undefined) parts.push(`run ${e.run}`);
    if (e.msg !== null && e.msg !== undefined) parts.push(`message ${e.msg}`);
    if (e.attempt !== null && e.attempt !== undefined) parts.push(`attempt ${e.attempt}`);
    return parts.join(' · ');
  }

  // The short words of an event's detail: an attempt's answer, a retry's reason, a hold's why.
  function summary(e) {
    const d = e.detail || {};
    const bits = [KIND[e.kind] || e.kind];
    if (e.kind === 'attempt') {
      if (d.status !== undefined && d.status !== null) bits.push(`HTTP ${d.status}`);
      if (d.platform_code !== undefined && d.platform_code !== null) bits.push(`platform code ${d.platform_code}`);
      if (d.outcome) bits.push(d.outcome);
      if (d.duration_ms !== undefined && d.duration_ms !== null) bits.push(`${d.duration_ms} ms`);
    } else if (e.kind === 'retry_scheduled' || e.kind === 'held') {
      if (d.reason || d.why) bits.push(d.reason || d.why);
    }
    return bits.join(' · ');
  }

  // Every field of the detail as `key: value` (for an expanded attempt).
  function pairs(e) {
    return Object.entries(e.detail || {})
      .filter(([, v]) => v !== null && v !== undefined)
      .map(([k, v]) => [k, typeof v === 'string' ? v : JSON.stringify(v)]);
  }

  // Newest first.
  function newestFirst(events) {
    return [...events].sort((a, b) => b.seq - a.seq);
  }

  H.timeline = { summary, where, pairs, newestFirst };
})(window.Herald = window.Herald || {});

// herald dashboard: the overview's numbers, worked out from herald's own `/metrics`
// (Prometheus text) sampled every few seconds. Pure: text and sample times in, numbers out;
// the page does the fetching and keeps the samples.
//
// Counters only grow while herald runs, so a rate is the difference of two samples over the
// time between them; a counter that went down means herald restarted, and that interval is
// left out rather than drawn as a negative rate. Lateness quantiles come from the difference
// of the histogram's cumulative buckets, interpolated within a bucket the way Prometheus'
// `histogram_quantile` does.
'use strict';

((H) => {
  // One `name{labels} value` line, or null for comments, blanks and anything malformed.
  function parseLine(line) {
    if (!line || line[0] === '#') return null;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(line);
    if (!m) return null;
    let i = m[0].length;
    const labels = {};
    if (line[i] === '{') {
      i += 1;
      for (;;) {
        while (line[i] === ' ' || line[i] === ',') i += 1;
        if (line[i] === '}') {
          i += 1;
          break;
        }
        const k = /^[a-zA-Z_][a-zA-Z0-9_]*/.exec(line.slice(i));
        if (!k || line[i + k[0].length] !== '=' || line[i + k[0].length + 1] !== '"') return null;
        i += k[0].length + 2;
        let v = '';
        for (;;) {
          const c = line[i];
          if (c === undefined) return null;
          i += 1;
          if (c === '"') break;
          if (c === '\\') {
            const e = line[i];
            i += 1;
            v += e === 'n' ? '\n' : e;
          } else {
            v += c;
          }
        }
        labels[k[0]] = v;
      }
    }
    const rest = line.slice(i).trim().split(/\s+/);
    const value = parseValue(rest[0]);
    if (value === null) return null;
    return { name: m[1], labels, value };
  }

  function parseValue(s) {
    if (s === '+Inf' || s === 'Inf') return Infinity;
    if (s === '-Inf') return -Infinity;
    const v = Number(s);
    return s !== undefined && s !== '' && !Number.isNaN(v) ? v : null;
  }

  // Every sample line of a scrape, grouped by metric name.
  function parse(text) {
    const out = new Map();
    for (const line of String(text).split('\n')) {
      const s = parseLine(line.trim());
      if (!s) continue;
      if (!out.has(s.name)) out.set(s.name, []);
      out.get(s.name).push({ labels: s.labels, value: s.value });
    }
    return out;
  }

  // What the overview keeps of one scrape taken at `atMs`.
  function sample(text, atMs) {
    const m = parse(text);
    const rows = (name) => m.get(name) || [];
    const attempts = {};
    for (const r of rows('herald_channel_attempts_total')) {
      const c = r.labels.channel;
      if (c === undefined) continue;
      const a = attempts[c] || (attempts[c] = { sent: 0, failed: 0 });
      if (r.labels.outcome === 'sent') a.sent += r.value;
      else if (r.labels.outcome === 'retryable' || r.labels.outcome === 'permanent') a.failed += r.value;
    }
    const buckets = rows('herald_send_lateness_seconds_bucket')
      .map((r) => ({ le: parseValue(r.labels.le), n: r.value }))
      .filter((b) => b.le !== null)
      .sort((a, b) => a.le - b.le);
    let tasks = null;
    for (const r of rows('herald_tasks')) {
      tasks = tasks || {};
      tasks[r.labels.state] = r.value;
    }
    const f = rows('herald_failures')[0];
    return {
      at: atMs,
      attempts,
      lateness: { bounds: buckets.map((b) => b.le), cum: buckets.map((b) => b.n) },
      tasks,
      failures: f ? f.value : null,
    };
  }

  // The `q` quantile (0..1) of a histogram given as upper bounds (ascending, last +Inf) and
  // cumulative counts; null when it holds nothing.
  function quantile(q, bounds, cum) {
    const n = cum.length ? cum[cum.length - 1] : 0;
    if (!(n > 0)) return null;
    const rank = q * n;
    let i = cum.findIndex((c) => c >= rank);
    if (i < 0) i = cum.length - 1;
    if (bounds[i] === Infinity) return i > 0 ? bounds[i - 1] : null;
    const upper = bounds[i];
    const lower = i > 0 ? bounds[i - 1] : Math.min(0, upper);
    const below = i > 0 ? cum[i - 1] : 0;
    const inBucket = cum[i] - below;
    if (inBucket <= 0 || upper <= lower) return upper;
    return lower + ((upper - lower) * (rank - below)) / inBucket;
  }

  const total = (attempts, key) => Object.values(attempts).reduce((s, a) => s + a[key], 0);

  // The histogram of what was observed between two samples (same buckets), or null.
  function latenessBetween(a, b) {
    const x = a.lateness, y = b.lateness;
    if (x.bounds.length !== y.bounds.length || !y.bounds.length) return null;
    const cum = y.cum.map((c, i) => c - x.cum[i]);
    if (cum.some((c) => c < 0)) return null;
    return { bounds: y.bounds, cum };
  }

  // Chart series from consecutive samples: one point per interval, at its end.
  function series(samples) {
    const out = { sends: [], failures: [], p50: [], p99: [] };
    for (let i = 1; i < samples.length; i += 1) {
      const a = samples[i - 1], b = samples[i];
      const dt = (b.at - a.at) / 1000;
      if (!(dt > 0)) continue;
      const sent = total(b.attempts, 'sent') - total(a.attempts, 'sent');
      const failed = total(b.attempts, 'failed') - total(a.attempts, 'failed');
      if (sent >= 0 && failed >= 0) {
        out.sends.push({ t: b.at, v: sent / dt });
        out.failures.push({ t: b.at, v: failed / dt });
      }
      const h = latenessBetween(a, b);
      const p50 = h && quantile(0.5, h.bounds, h.cum);
      if (p50 !== null) {
        out.p50.push({ t: b.at, v: p50 });
        out.p99.push({ t: b.at, v: quantile(0.99, h.bounds, h.cum) });
      }
    }
    return out;
  }

  // The oldest sample within `spanMs` of the newest, and the newest: the two a windowed
  // figure is taken between (null with fewer than two samples).
  function windowOf(samples, spanMs) {
    if (samples.length < 2) return null;
    const last = samples[samples.length - 1];
    const first = samples.find((s) => s.at >= last.at - spanMs);
    return first && first !== last ? [first, last] : null;
  }

  // Over the last `spanMs` (or as much of it as was sampled): per channel its attempts, the
  // share of them that succeeded and its sends per second; plus the window's real span and the
  // lateness quantiles of everything sent in it.
  function summary(samples, spanMs) {
    const w = windowOf(samples, spanMs);
    if (!w) return null;
    const [a, b] = w;
    const dt = (b.at - a.at) / 1000;
    const channels = {};
    for (const [name, y] of Object.entries(b.attempts)) {
      const x = a.attempts[name] || { sent: 0, failed: 0 };
      const sent = y.sent - x.sent, failed = y.failed - x.failed;
      if (sent < 0 || failed < 0) continue;
      const attempts = sent + failed;
      channels[name] = { attempts, sent, failed, ratio: attempts ? sent / attempts : null, rate: sent / dt };
    }
    const h = latenessBetween(a, b);
    return {
      spanMs: b.at - a.at,
      channels,
      p50: h && quantile(0.5, h.bounds, h.cum),
      p99: h && quantile(0.99, h.bounds, h.cum),
    };
  }

  H.metrics = { parse, parseLine, sample, quantile, series, summary };
})(window.Herald = window.Herald || {});

// herald dashboard: text for instants, durations, pacing and retry. Pure: no DOM, no clock
// (`now` is passed in), so the same input always reads the same.
'use strict';

((H) => {
  // One date format everywhere: the viewer's locale, a given zone, and that zone's label
  // (`Dec 1, 2026, 09:00:00 EST`). Formatters are cached per zone: building one is slow.
  const formatters = new Map();
  const FIELDS = { year: 'numeric', month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit', timeZoneName: 'short' };

  function viewerZone() {
    try {
      return Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC';
    } catch (_) {
      return 'UTC';
    }
  }

  function formatter(tz) {
    let f = formatters.get(tz);
    if (!f) {
      try {
        f = new Intl.DateTimeFormat(undefined, { ...FIELDS, timeZone: tz });
      } catch (_) {
        // A zone this browser does not know: UTC, which the label then says.
        f = new Intl.DateTimeFormat(undefined, { ...FIELDS, timeZone: 'UTC' });
      }
      formatters.set(tz, f);
    }
    return f;
  }

  // `iso` (RFC 3339) in zone `tz` (IANA; the viewer's when absent), or '—'.
  function at(iso, tz) {
    if (!iso) return '—';
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return formatter(tz || viewerZone()).format(d);
  }

  // ---- wall-clock times in a zone, as herald's schedule descriptions print them

  const wallFormatters = new Map();
  // The wall-clock fields of instant `ms` in `tz`, as if they were UTC (ms, whole seconds).
  function wallOf(ms, tz) {
    let f = wallFormatters.get(tz);
    if (!f) {
      f = new Intl.DateTimeFormat('en-US', { timeZone: tz, hourCycle: 'h23', year: 'numeric', month: 'numeric', day: 'numeric', hour: 'numeric', minute: 'numeric', second: 'numeric' });
      wallFormatters.set(tz, f);
    }
    const p = Object.fromEntries(f.formatToParts(new Date(ms)).map((x) => [x.type, x.value]));
    return Date.UTC(+p.year, +p.month - 1, +p.day, +p.hour % 24, +p.minute, +p.second);
  }

  // The instant whose wall clock in `tz` reads `wall` (fields as if UTC). In a repeated hour
  // two do: `hint` when it is one of them (the task's next fire), else the earlier.
  function instantOf(wall, tz, hint) {
    if (hint !== undefined && hint !== null && wallOf(hint, tz) === wall) return hint;
    const a = wall - (wallOf(wall, tz) - wall);
    const b = wall - (wallOf(a, tz) - a);
    const ok = [a, b].filter((t) => wallOf(t, tz) === wall);
    return ok.length ? Math.min(...ok) : a;
  }

  // herald's description of a schedule (`once at 2026-12-01 09:00 (Asia/Shanghai)`) with its
  // date-time in this page's one format (`once at Dec 1, 2026, 09:00:00 AM GMT+8`).
  // `hintIso`: an instant the text may show (the next fire), to settle a repeated hour.
  function describe(text, hintIso) {
    const hint = hintIso ? new Date(hintIso).getTime() : null;
    return String(text || '').replace(/(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d)(?::(\d\d))? \(([^)\s]+)\)/g, (all, y, mo, d, h, mi, sec, tz) => {
      try {
        const wall = Date.UTC(+y, +mo - 1, +d, +h, +mi, +(sec || 0));
        return at(new Date(instantOf(wall, tz, hint)).toISOString(), tz);
      } catch (_) {
        return all; // a zone this browser does not know: herald's text as it is
      }
    });
  }

  // The zone a task's times are shown in: its schedule's, else the viewer's (an `after` or an
  // `at` with an offset names none, and a zone this browser does not know is no help).
  function zoneOf(task) {
    const s = (task && task.schedule) || {};
    const tz = s.tz || (s.reminders && s.reminders.tz);
    return tz && known(tz) ? tz : viewerZone();
  }

  // Whether this browser knows IANA zone `tz` (not, say, a per-recipient placeholder).
  function known(tz) {
    try {
      new Intl.DateTimeFormat('en-US', { timeZone: tz });
      return true;
    } catch (_) {
      return false;
    }
  }

  // `in 3m20s` / `5s ago`, from `iso` to `nowMs`.
  function relative(iso, nowMs) {
    const s = Math.round((new Date(iso).getTime() - nowMs) / 1000);
    if (!Number.isFinite(s)) return '';
    const a = Math.abs(s);
    if (a < 1) return 'now';
    const d = Math.floor(a / 86400), h = Math.floor((a % 86400) / 3600), m = Math.floor((a % 3600) / 60), sec = a % 60;
    const txt = d ? `${d}d${h ? h + 'h' : ''}` : h ? `${h}h${m ? m + 'm' : ''}` : m ? `${m}m${sec && m < 10 ? sec + 's' : ''}` : `${sec}s`;
    return s > 0 ? `in ${txt}` : `${txt} ago`;
  }

  const UNITS = { d: 'd', h: 'h', m: 'min', s: 's', ms: 'ms' };

  // herald's duration strings (`1h30m`, `300ms`) with spaced units: `1 h 30 min`, `300 ms`.
  function duration(text) {
    const parts = String(text || '').match(/\d+(ms|d|h|m|s)/g);
    if (!parts) return String(text || '');
    return parts.map((p) => {
      const [, n, u] = p.match(/^(\d+)(ms|d|h|m|s)$/);
      return `${n} ${UNITS[u]}`;
    }).join(' ');
  }

  const zero = (d) => !d || /^0(ms|s)?$/.test(String(d));

  // A task's pacing in words.
  function pacing(p) {
    if (!p) return '—';
    const every = zero(p.interval) ? 'all at once' : `one message every ${duration(p.interval)}`;
    if (!p.batch_size) return every;
    return `in batches of ${p.batch_size}, ${every} within a batch, ${duration(p.batch_pause)} between batches`;
  }

  // A retry policy in words.
  function retry(r) {
    if (!r) return '—';
    const n = r.max_attempts;
    if (n <= 1) return 'no retry: a failed message goes to the failure list at once';
    const wait = r.backoff === 'fixed'
      ? `${duration(r.initial)} between attempts`
      : `waiting ${duration(r.initial)} at first, doubling up to ${duration(r.max)} (with jitter)`;
    return `up to ${n} attempts, ${wait}; then the failure list`;
  }

  // A share as a whole percentage, never rounding a partial share to 0 % or 100 %.
  function percent(part, whole) {
    if (!whole) return '—';
    const p = (part * 100) / whole;
    if (p > 0 && p < 1) return '<1 %';
    if (p > 99 && p < 100) return '>99 %';
    return `${Math.round(p)} %`;
  }

  // Seconds as a short duration: `850 µs`, `12 ms`, `1.4 s`.
  function seconds(s) {
    if (s === null || s === undefined || !Number.isFinite(s)) return '—';
    if (s === 0) return '0 ms';
    if (s < 0.001) return `${Math.round(s * 1e6)} µs`;
    if (s < 1) return `${+(s * 1000).toPrecision(2)} ms`;
    return `${+s.toPrecision(2)} s`;
  }

  // A rate per second: `0`, `0.4`, `12`, `1 250`.
  function rate(r) {
    if (r === null || r === undefined || !Number.isFinite(r)) return '—';
    if (r === 0) return '0';
    if (r < 10) return r.toFixed(1);
    return Math.round(r).toLocaleString();
  }

  // A span of milliseconds in words: `45 s`, `5 min`.
  function span(ms) {
    const s = Math.round(ms / 1000);
    if (s < 90) return `${s} s`;
    return `${Math.round(s / 60)} min`;
  }

  H.fmt = { at, describe, viewerZone, zoneOf, relative, duration, pacing, retry, percent, seconds, rate, span };
})(window.Herald = window.Herald || {});

// herald dashboard: a small SVG line chart (no library, no build step). It draws into an
// existing <svg>, replacing what was there; the page's CSS colours the series by class.
'use strict';

((H) => {
  const NS = 'http://www.w3.org/2000/svg';
  const W = 360, HT = 120;
  const PAD = { left: 44, right: 8, top: 8, bottom: 18 };

  function node(tag, attrs, text) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // A round upper bound for the y axis (1, 2 or 5 times a power of ten) at or above `v`.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  // opts: { from, to (ms), step (ms between samples: a longer gap breaks the line),
  //         series: [{ key, cls, points: [{t, v}] }], format: (v) => text, floor: min y max }
  function draw(svg, opts) {
    svg.setAttribute('viewBox', `0 0 ${W} ${HT}`);
    const all = opts.series.flatMap((s) => s.points);
    const top = niceMax(Math.max(opts.floor || 0, ...all.map((p) => p.v)));
    const x0 = PAD.left, x1 = W - PAD.right, y0 = HT - PAD.bottom, y1 = PAD.top;
    const span = Math.max(opts.to - opts.from, 1);
    const x = (t) => x0 + ((t - opts.from) / span) * (x1 - x0);
    const y = (v) => y0 - (Math.min(v, top) / top) * (y0 - y1);
    const parts = [
      node('line', { class: 'grid', x1: x0, x2: x1, y1: y1, y2: y1 }),
      node('line', { class: 'axis', x1: x0, x2: x1, y1: y0, y2: y0 }),
      node('text', { class: 'tick', x: x0 - 4, y: y1 + 4, 'text-anchor': 'end' }, opts.format(top)),
      node('text', { class: 'tick', x: x0 - 4, y: y0, 'text-anchor': 'end' }, opts.format(0)),
      node('text', { class: 'tick', x: x0, y: HT - 4 }, `−${H.fmt.span(span)}`),
      node('text', { class: 'tick', x: x1, y: HT - 4, 'text-anchor': 'end' }, 'now'),
    ];
    let drawn = 0;
    for (const s of opts.series) {
      const pts = s.points.filter((p) => p.t >= opts.from && p.t <= opts.to);
      // Consecutive points further apart than a few sample steps are not joined: the page
      // was hidden or herald did not answer, and a line would invent what happened.
      let run = [];
      const flush = () => {
        if (run.length === 1) {
          parts.push(node('circle', { class: `dot ${s.cls}`, cx: x(run[0].t), cy: y(run[0].v), r: 2 }));
        } else if (run.length > 1) {
          parts.push(node('polyline', { class: `line ${s.cls}`, points: run.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' ') }));
        }
        run = [];
      };
      for (const p of pts) {
        if (run.length && p.t - run[run.length - 1].t > 3 * opts.step) flush();
        run.push(p);
      }
      flush();
      drawn += pts.length;
      svg.setAttribute(`data-points-${s.key}`, String(pts.length));
    }
    svg.dataset.points = String(drawn);
    svg.replaceChildren(...parts);
  }

  H.chart = { draw, niceMax };
})(window.Herald = window.Herald || {});

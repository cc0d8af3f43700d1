// herald dashboard: plain JS on herald's own /v1 API, no framework, no build step.
//
// - The token (when herald wants one) is asked once and kept in sessionStorage for this tab.
// - Live updates come from GET /v1/events read with fetch() (EventSource cannot send the
//   Authorization header). Every (re)connection starts with a `ready` event, after which what
//   is shown is reloaded, so nothing between a load and the stream is missed. Events move
//   the list and the open detail (`task`, `progress`), drop a deleted task's row and detail
//   (`deleted`), read the open detail's new timeline events (`timeline`) and the failure list
//   (`failure`). Reads they cause are debounced with a maximum wait (`debounce`): a busy
//   server never leaves the page behind, and never makes it read once per event.
// - Lists are paged (tasks by id with `after`, failures likewise): the page never loads all.
// - Everything the server sends is put in the page as text (textContent), never as HTML.
// - The overview at the top samples /metrics every 2 s and keeps 5 minutes of samples
//   (metrics.js works out the figures, chart.js draws them); the channels' success ratio and
//   sends/s come from the same samples.
// - Times: one format (format.js), in the viewer's locale and the task's zone, with its label.
'use strict';

((H) => {
  const TOKEN_KEY = 'herald.token';
  const $ = (sel) => document.querySelector(sel);
  const ui = {
    filter: { state: '', channel: '', limit: 50 },
    after: null,        // `after` of the page shown (null = first page)
    back: [],           // `after` values of the pages before it
    next: null,         // `next` of the page shown
    rows: new Map(),    // task id -> task view, for the tasks on the page
    detail: null,       // id of the task shown in detail
    detailTask: null,   // its view, moved by progress events
    detailRuns: new Map(), // run number -> run view (the newest 50), moved likewise
    latest: new Map(),  // `${task}\0${run}` -> newest progress event (see `freshest`)
    gone: new Map(),    // task id -> when (ms) its `deleted` event came (see `dropTask`)
    // The detail's timeline as drawn, oldest first, and the task it is of: its id and its
    // `created_at` (a task deleted and made again with the same id starts its seqs anew).
    timeline: { id: null, created: null, events: [] },
    failuresAfter: null,
    failureCount: null, // length of the failure list when it fits one page (else the census)
    samples: [],        // /metrics samples of the last SAMPLES_KEPT_MS (metrics.js `sample`)
    channels: [],       // the last GET /v1/channels
  };
  const SAMPLE_EVERY_MS = 2000;
  const SAMPLES_KEPT_MS = 5 * 60 * 1000;
  // Window of the channels' success ratio and sends/s (stated in the page).
  const CHANNEL_WINDOW_MS = 5 * 60 * 1000;

  // ---- small helpers ------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  // `fn` once calls stop coming for `ms`, and at least every `maxMs` while they keep coming:
  // a busy server sends events less than `ms` apart for as long as it is busy, and a
  // trailing-only debounce would then never call. One `fn` at a time: a call asked for while
  // `fn` (async) is still running is made once it is done (no pile-up on a slow server, no
  // older answer drawn over a newer one).
  function debounce(fn, ms, maxMs = 500) {
    let timer = null;
    let since = 0;        // when the oldest call not yet served was asked for (0: none)
    let running = false;
    let again = false;    // asked for while running
    const run = async () => {
      timer = null;
      if (running) {
        again = true;
        return;
      }
      since = 0;
      running = true;
      try {
        await fn();
      } finally {
        running = false;
        if (again) {
          again = false;
          schedule();
        }
      }
    };
    const schedule = () => {
      const now = Date.now();
      if (!since) since = now;
      clearTimeout(timer);
      timer = setTimeout(run, Math.max(0, Math.min(ms, since + maxMs - now)));
    };
    return schedule;
  }

  function notice(text, ok) {
    const n = $('#notice');
    n.textContent = text || '';
    n.classList.toggle('ok', !!ok);
  }

  function setLive(mode, text) {
    const l = $('#live');
    l.classList.toggle('on', mode === 'on');
    l.classList.toggle('off', mode === 'off');
    $('#live-text').textContent = text;
  }

  // ---- time ---------------------------------------------------------------------------------

  // A time cell: the instant in `tz` (the viewer's when absent) with its zone label; the
  // viewer's own time as a tooltip when the zone differs; how far from now.
  function whenCell(iso, tz) {
    if (!iso) return el('td', { class: 'when' }, '—');
    const mine = H.fmt.viewerZone();
    const title = tz && tz !== mine ? `${H.fmt.at(iso, mine)} (your time)` : null;
    return el('td', { class: 'when' },
      el('time', { datetime: iso, title, text: H.fmt.at(iso, tz) }),
      el('small', { class: 'rel', 'data-at': iso, text: H.fmt.relative(iso, Date.now()) }));
  }

  // ---- API ----------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  }

  function headers(extra) {
    const h = { Accept: 'application/json', ...(extra || {}) };
    const t = token();
    if (t) h.Authorization = 'Bearer ' + t;
    return h;
  }

  let asking = null;
  // Asks for the token (once for everyone waiting); resolves when one was given. `refused`:
  // herald answered 401 to the token this tab had, so the dialog says so (and the page too,
  // should the dialog be closed) instead of asking again as if nothing had happened.
  function askToken(refused) {
    const dlg = $('#token-dialog');
    const err = $('#token-error');
    if (refused) {
      const text = 'herald refused this token (401 Unauthorized). Enter the token herald was started with (HERALD_TOKEN, or token in its config file).';
      err.textContent = text;
      err.hidden = false;
      $('#token-why').hidden = true;
      notice(text);
      setLive('off', 'token refused');
    }
    if (asking) return asking;
    asking = new Promise((resolve) => {
      const done = () => {
        const v = $('#token-input').value.trim();
        if (!v) {
          dlg.showModal();
          return;
        }
        sessionStorage.setItem(TOKEN_KEY, v);
        dlg.removeEventListener('close', done);
        err.hidden = true;
        $('#token-why').hidden = false;
        notice('');
        asking = null;
        resolve();
        restartStream();
      };
      dlg.addEventListener('close', done);
      $('#token-input').value = '';
      if (!dlg.open) dlg.showModal();
    });
    return asking;
  }

  // herald said 401: to a token this tab sent (refused: forget it and say so), or to none.
  function unauthorized(sent) {
    if (sent) {
      if (token() === sent) sessionStorage.removeItem(TOKEN_KEY);
      return askToken(true);
    }
    // Another request may have been answered with a fresh token meanwhile: use it.
    return token() ? Promise.resolve() : askToken(false);
  }

  async function api(method, path, body) {
    for (;;) {
      const init = { method, headers: headers(body !== undefined ? { 'Content-Type': 'application/json' } : {}) };
      if (body !== undefined) init.body = typeof body === 'string' ? body : JSON.stringify(body);
      const sent = token();
      let r;
      try {
        r = await fetch(path, init);
      } catch (e) {
        throw new ApiError(0, 'cannot reach herald: ' + e.message);
      }
      if (r.status === 401) {
        await unauthorized(sent);
        continue;
      }
      const text = await r.text();
      if (!r.ok) {
        let data = null;
        try {
          data = text ? JSON.parse(text) : null;
        } catch (_) {
          data = null;
        }
        throw new ApiError(r.status, (data && data.detail) || `${r.status} ${r.statusText}`);
      }
      // /metrics is text; everything under /v1 is JSON (or empty: 204).
      const type = r.headers.get('content-type') || '';
      if (!type || type.includes('json')) {
        try {
          return text ? JSON.parse(text) : null;
        } catch (e) {
          throw new ApiError(r.status, `not JSON: ${e.message}`);
        }
      }
      return text;
    }
  }

  // ---- tasks --------------------------------------------------------------------------------

  const ACTIONS = {
    pause: { label: 'Pause', question: (id) => `Pause task ${id}? Nothing of it is sent until it is resumed.` },
    resume: { label: 'Resume', question: (id) => `Resume task ${id}? A paused sequence continues where it stopped.` },
    trigger: { label: 'Trigger', question: (id) => `Trigger task ${id} now? A run starts at once.` },
    cancel: { label: 'Cancel', question: (id) => `Cancel task ${id}? No message of it is sent afterwards. This cannot be undone.`, danger: true },
  };

  function actionsFor(t) {
    switch (t.state) {
      case 'pending': return ['pause', 'trigger', 'cancel'];
      case 'running': return t.overlap === 'allow' ? ['pause', 'trigger', 'cancel'] : ['pause', 'cancel'];
      case 'paused': return ['resume', 'cancel'];
      // Expired: nothing was sent; send it now, or set a new time (the detail's time picker).
      case 'expired': return ['trigger'];
      default: return [];
    }
  }

  function confirmDialog(question, yesLabel, danger) {
    const dlg = $('#confirm-dialog');
    $('#confirm-text').textContent = question;
    const yes = $('#confirm-yes');
    yes.textContent = yesLabel;
    yes.className = danger ? 'danger' : '';
    return new Promise((resolve) => {
      dlg.addEventListener('close', () => resolve(dlg.returnValue === 'yes'), { once: true });
      dlg.returnValue = '';
      dlg.showModal();
      $('#confirm-no').focus();
    });
  }

  async function control(id, action) {
    const a = ACTIONS[action];
    if (!(await confirmDialog(a.question(id), `${a.label} task`, a.danger))) return;
    try {
      const v = await api('POST', `/v1/tasks/${encodeURIComponent(id)}/${action}`);
      updateTask(v);
      notice(`${a.label}: task ${id} is now ${v.state}.`, true);
      if (ui.detail === id) showDetail(id);
    } catch (e) {
      notice(`${a.label} ${id}: ${e.message}`);
    }
  }

  function stateBadge(state) {
    return el('span', { class: `state ${state}`, text: state });
  }

  // A run's progress as one bar of three shares, sent, failed and still to send, with the
  // counts in words under it.
  function progress(p, label) {
    const total = p.total || 0, sent = p.sent || 0, failed = p.failed || 0;
    const pending = Math.max(total - sent - failed, 0);
    const bar = el('div', {
      class: 'bar', role: 'img', 'aria-label': `${label}: ${sent} sent, ${failed} failed, ${pending} to send, of ${total}`,
      'data-sent': sent, 'data-failed': failed, 'data-pending': pending, 'data-total': total,
    });
    for (const [cls, n] of [['sent', sent], ['failed', failed], ['pending', pending]]) {
      if (!n) continue;
      const seg = el('span', { class: `seg ${cls}` });
      // Set through the CSSOM: the page's CSP refuses style attributes, not this.
      seg.style.flexGrow = String(n);
      bar.append(seg);
    }
    return el('div', { class: 'progress' }, bar,
      el('div', { class: 'text' },
        `run ${p.run}: ${sent} sent`,
        failed ? el('span', { class: 'failed', text: ` · ${failed} failed` }) : null,
        pending ? ` · ${pending} to send` : '',
        p.in_flight ? ' · sending' : ''));
  }

  function progressCell(t) {
    const p = t.progress;
    return el('td', { class: 'progress-cell' }, p ? progress(p, `Task ${t.id}, run ${p.run}`) : '—');
  }

  function actionsCell(t) {
    return el('td', {},
      el('div', { class: 'actions' }, actionsFor(t).map((a) =>
        el('button', {
          type: 'button', class: ACTIONS[a].danger ? 'danger' : 'quiet', 'data-action': a,
          'aria-label': `${ACTIONS[a].label} task ${t.id}`, text: ACTIONS[a].label,
          onclick: () => control(t.id, a),
        }))));
  }

  function taskRow(t) {
    return el('tr', { 'data-task': t.id, 'data-state': t.state },
      el('td', {},
        el('button', { type: 'button', class: 'link', 'aria-label': `Show task ${t.id}`, text: t.id, onclick: () => showDetail(t.id) }),
        t.name ? el('small', { class: 'muted', text: t.name }) : null),
      el('td', { class: 'state-cell' }, stateBadge(t.state)),
      el('td', { text: t.channel }),
      el('td', { text: H.fmt.describe(t.description, t.next_fire_at) }),
      whenCell(t.next_fire_at, H.fmt.zoneOf(t)),
      progressCell(t),
      actionsCell(t));
  }

  function rowOf(id) {
    return document.querySelector(`#task-rows tr[data-task="${CSS.escape(id)}"]`);
  }

  // Redraws one task's row in place (the actions only when they change, to keep focus).
  function updateTask(view) {
    if (!ui.rows.has(view.id)) return;
    const t = { ...view, progress: freshest(view.id, view.progress) };
    const old = ui.rows.get(t.id);
    ui.rows.set(t.id, t);
    const tr = rowOf(t.id);
    if (!tr) return;
    const fresh = taskRow(t);
    const keepActions = old.state === t.state && old.overlap === t.overlap;
    [...fresh.children].forEach((td, i) => {
      if (i === 6 && keepActions) return;
      tr.children[i].replaceWith(td);
    });
    tr.dataset.state = t.state;
  }

  async function loadTasks() {
    const started = Date.now();
    const q = new URLSearchParams({ limit: String(ui.filter.limit) });
    if (ui.filter.state) q.set('state', ui.filter.state);
    if (ui.filter.channel) q.set('channel', ui.filter.channel);
    if (ui.after) q.set('after', ui.after);
    let page;
    try {
      page = await api('GET', `/v1/tasks?${q}`);
    } catch (e) {
      notice(`Loading tasks: ${e.message}`);
      return;
    }
    ui.next = page.next;
    // A task deleted after this listing was asked for may be in it: it is not drawn back.
    const tasks = page.tasks
      .filter((t) => !(ui.gone.get(t.id) >= started))
      .map((t) => ({ ...t, progress: freshest(t.id, t.progress) }));
    ui.rows = new Map(tasks.map((t) => [t.id, t]));
    $('#task-rows').replaceChildren(...tasks.map(taskRow));
    $('#next-page').disabled = !ui.next;
    $('#prev-page').disabled = ui.back.length === 0;
    $('#first-page').disabled = !ui.after;
    drawPageInfo();
  }

  // The page's count, and the empty list's line.
  function drawPageInfo() {
    const n = ui.rows.size;
    const body = $('#task-rows');
    if (!n && !body.querySelector('td.empty')) body.append(el('tr', {}, el('td', { colspan: 7, class: 'empty', text: 'No tasks here.' })));
    $('#page-info').textContent = `page ${ui.back.length + 1} · ${n} task${n === 1 ? '' : 's'}`;
  }

  // `deleted`: a finished task was deleted (retention, or DELETE): its row goes, and its
  // detail closes. Remembered for a minute (at most GONE_MAX ids), so that a listing asked
  // for before the deletion and answered after it does not draw the row back.
  const GONE_MAX = 1000;
  function dropTask(id) {
    const now = Date.now();
    ui.gone.delete(id);
    ui.gone.set(id, now);
    for (const [k, at] of ui.gone) {
      if (ui.gone.size <= GONE_MAX && at >= now - 60 * 1000) break;
      ui.gone.delete(k);
    }
    refreshTask.forget(id);
    if (ui.timeline.id === id) ui.timeline = { id: null, created: null, events: [] };
    if (ui.rows.delete(id)) {
      const tr = rowOf(id);
      if (tr) tr.remove();
      drawPageInfo();
      // The page is one short: the next task moves up into it.
      if (ui.next) reloadTasks();
    }
    if (ui.detail === id) {
      ui.detail = null;
      ui.detailTask = null;
      $('#detail').hidden = true;
      notice(`Task ${id} was deleted.`, true);
    }
    // Its failure-list entries went with it.
    reloadFailures();
  }
  const reloadTasks = debounce(loadTasks, 250);

  // A task changed: redraw it if it is on the page or in the detail; any other (a new task,
  // say) may belong to the page when it is the last one. Only the ids of tasks shown wait for
  // the flush, and every flush takes them all: what waits is bounded by the page (and
  // PENDING_MAX besides: past it the page is read again whole).
  const PENDING_MAX = 1000;
  const refreshTask = (() => {
    const pending = new Set();
    let others = false;   // a task not shown changed
    let overflow = false; // more than PENDING_MAX ids came between two flushes
    const flush = debounce(async () => {
      const ids = [...pending];
      pending.clear();
      const list = others, whole = overflow;
      others = false;
      overflow = false;
      if (whole) {
        await loadTasks();
        if (ui.detail) await showDetail(ui.detail);
        return;
      }
      if (list && !ui.next) reloadTasks();
      await Promise.all(ids.map(async (id) => {
        if (ui.rows.has(id)) {
          try {
            updateTask(await api('GET', `/v1/tasks/${encodeURIComponent(id)}`));
          } catch (_) { /* gone or unreachable: the next reload tells */ }
        }
        if (ui.detail === id) await showDetail(id);
      }));
    }, 100);
    const refresh = (id) => {
      if (!ui.rows.has(id) && ui.detail !== id) others = true;
      else if (pending.size >= PENDING_MAX) overflow = true;
      else pending.add(id);
      flush();
    };
    // A deleted task: nothing of it to read again.
    refresh.forget = (id) => pending.delete(id);
    return refresh;
  })();

  // The newest progress event of each run seen since the last full load, so that an answer
  // read before an event cannot draw a run back (a cursor only moves forward).
  function remember(ev) {
    if (ui.latest.size > 10000) ui.latest.clear();
    ui.latest.set(`${ev.task}\u0000${ev.run}`, ev);
  }

  // `p` (a task's progress or a run view) with the counts of a newer event of its run, if any.
  function freshest(task, p) {
    if (!p) return p;
    const ev = ui.latest.get(`${task}\u0000${p.run}`);
    if (!ev) return p;
    const a = ev.sent + ev.failed, b = (p.sent || 0) + (p.failed || 0);
    if (a < b || (a === b && (ev.state === 'running' || p.state !== 'running'))) return p;
    const counts = { total: ev.total, sent: ev.sent, failed: ev.failed };
    // A run view has a state (and its own kind of in_flight); a task's progress has neither.
    return p.state === undefined ? { ...p, ...counts, in_flight: ev.in_flight } : { ...p, ...counts, state: ev.state };
  }

  function applyProgress(ev) {
    remember(ev);
    if (ui.detail === ev.task) applyDetailProgress(ev);
    const t = ui.rows.get(ev.task);
    if (!t) return;
    const stateChanged = t.state !== ev.task_state;
    // An event of an older run than the one shown does not replace the row's bar.
    if (!t.progress || ev.run >= t.progress.run) {
      updateTask({
        ...t,
        state: ev.task_state,
        progress: { ...(t.progress || {}), run: ev.run, total: ev.total, sent: ev.sent, failed: ev.failed, in_flight: ev.in_flight },
      });
    }
    if (stateChanged || ev.state !== 'running') refreshTask(ev.task);
  }

  // ---- detail -------------------------------------------------------------------------------

  const MISFIRE = { fire_now: 'fires missed while herald was down or the task paused run once, at once', skip: 'fires missed while herald was down or the task paused are skipped', fire_all: 'every fire missed while herald was down or the task paused runs' };
  const OVERLAP = { skip: 'a fire while a run is still sending is skipped', queue: 'a fire while a run is still sending waits for it', allow: 'a fire while a run is still sending runs beside it' };

  async function showDetail(id) {
    ui.detail = id;
    let t, runs;
    try {
      t = await api('GET', `/v1/tasks/${encodeURIComponent(id)}`);
      // Runs are paged oldest first: ask for the page that ends at the newest run.
      const last = Math.max(t.runs || 0, (t.progress && t.progress.run) || 0);
      runs = await api('GET', `/v1/tasks/${encodeURIComponent(id)}/runs?limit=50&after=${Math.max(0, last - 50)}`);
    } catch (e) {
      notice(`Task ${id}: ${e.message}`);
      return;
    }
    if (ui.detail !== id) return;
    ui.detailTask = { ...t, progress: freshest(id, t.progress) };
    ui.detailRuns = new Map(runs.runs.map((r) => [r.run, freshest(id, r)]));
    drawDetail();
    // The timeline of the task already shown: only what is new (a refresh runs on every
    // `task` and `failure` event of it; a full read each time was up to 10 000 events every
    // 500 ms for one open tab on a busy sequence). `loadTimeline` reads it whole when it is
    // another task's, or another task's of this id.
    loadTimeline(id, true);
    const sec = $('#detail');
    const wasHidden = sec.hidden;
    sec.hidden = false;
    if (wasHidden) sec.scrollIntoView({ block: 'nearest' });
  }
  const refetchDetail = debounce(() => (ui.detail ? showDetail(ui.detail) : null), 150);

  // A progress event of the task shown in detail: its bar and its run's row move at once; a
  // run not shown yet, or one that finished, is read again (for its times and reason).
  function applyDetailProgress(ev) {
    const t = ui.detailTask;
    if (!t || t.id !== ev.task) return;
    t.state = ev.task_state;
    if (!t.progress || ev.run >= t.progress.run) {
      t.progress = { ...(t.progress || {}), run: ev.run, total: ev.total, sent: ev.sent, failed: ev.failed, in_flight: ev.in_flight };
    }
    const r = ui.detailRuns.get(ev.run);
    if (r) ui.detailRuns.set(ev.run, { ...r, state: ev.state, total: ev.total, sent: ev.sent, failed: ev.failed });
    drawDetailSoon();
    if (!r || ev.state !== 'running') refetchDetail();
  }

  function metadataText(m) {
    const e = Object.entries(m || {});
    return e.length ? e.map(([k, v]) => `${k} = ${v}`).join(', ') : 'none';
  }

  // At most one redraw per 50 ms: a fast sequence sends hundreds of events a second, and
  // each redraw builds up to 50 run rows.
  let detailDrawPending = false;
  function drawDetailSoon() {
    if (detailDrawPending) return;
    detailDrawPending = true;
    setTimeout(() => {
      detailDrawPending = false;
      drawDetail();
    }, 50);
  }

  function drawDetail() {
    const t = ui.detailTask;
    if (!t) return;
    const tz = H.fmt.zoneOf(t);
    const now = Date.now();
    const at = (iso) => (iso ? el('span', {}, el('time', { datetime: iso, text: H.fmt.at(iso, tz) }), ' · ', el('span', { class: 'rel', 'data-at': iso, text: H.fmt.relative(iso, now) })) : '—');
    $('#detail-id').textContent = t.id;
    const fields = [
      ['Name', t.name || '—'], ['State', stateBadge(t.state)], ['Channel', t.channel], ['Schedule', H.fmt.describe(t.description, t.next_fire_at)],
      ['Next fire', at(t.next_fire_at)],
      ['Progress', t.progress ? progress(t.progress, `Task ${t.id}, run ${t.progress.run}`) : 'no run yet'],
      ['Messages', `${t.messages} per run`], ['Runs started', t.runs],
      ['Pacing', H.fmt.pacing(t.pacing)], ['Retry', H.fmt.retry(t.retry)],
      ['Misfire', `${MISFIRE[t.misfire] || t.misfire}; a fire missed by more than ${H.fmt.duration(t.misfire_grace)} expires (recorded, not sent)`],
      ['Overlap', OVERLAP[t.overlap] || t.overlap],
      ['Metadata', metadataText(t.metadata)], ['Created', at(t.created_at)], ['Updated', at(t.updated_at)],
    ];
    if (t.failed_reason) fields.splice(2, 0, ['Failed because', t.failed_reason]);
    if (t.state === 'expired') fields.splice(2, 0, ['Expired', rearmForm(t, tz)]);
    $('#detail-fields').replaceChildren(...fields.flatMap(([k, v]) => [
      el('dt', { text: k }), el('dd', { 'data-field': k.toLowerCase().replace(/ /g, '-') }, v)]));
    const shown = [...ui.detailRuns.values()].sort((a, b) => b.run - a.run);
    const body = $('#run-rows');
    body.replaceChildren(...shown.map((r) => el('tr', { 'data-run': r.run, 'data-state': r.state },
      el('td', { text: r.run }), el('td', {}, stateBadge(r.state)), whenCell(r.scheduled_at, tz),
      el('td', { class: 'progress-cell' }, progress(r, `Run ${r.run}`)),
      el('td', { class: 'sent', text: r.sent }), el('td', { class: 'failed', text: r.failed }), el('td', { text: r.total }),
      whenCell(r.finished_at, tz), el('td', { text: r.reason || '' }))));
    drawMissed(t, shown);
    if (!shown.length) body.append(el('tr', {}, el('td', { colspan: 9, class: 'empty', text: 'No runs yet.' })));
    if (t.runs > shown.length) body.append(el('tr', {}, el('td', { colspan: 9, class: 'empty', text: `Showing the newest ${shown.length} of ${t.runs} runs.` })));
  }

  // Missed runs (skipped or expired fires) among those shown, with a backfill of their range:
  // herald sends one run for each slot in it that has no completed run, in slot order.
  function drawMissed(t, shown) {
    const missed = shown.filter((r) => r.state === 'skipped' || r.state === 'expired');
    const box = $('#missed');
    const live = ['pending', 'running', 'paused'].includes(t.state);
    box.hidden = !missed.length || !live;
    if (box.hidden) return;
    const times = missed.map((r) => r.scheduled_at).sort();
    const from = times[0], to = times[times.length - 1];
    $('#missed-text').textContent = `${missed.length} missed run${missed.length === 1 ? '' : 's'} (${H.fmt.at(from, H.fmt.zoneOf(t))} – ${H.fmt.at(to, H.fmt.zoneOf(t))}).`;
    $('#backfill').onclick = async () => {
      const q = `Backfill task ${t.id}? One run is sent for each slot from ${from} to ${to} without a completed run, in order.`;
      if (!(await confirmDialog(q, 'Backfill', false))) return;
      try {
        const v = await api('POST', `/v1/tasks/${encodeURIComponent(t.id)}/backfill`, { from, to });
        notice(`Backfill of ${t.id}: ${v.runs.length} run${v.runs.length === 1 ? '' : 's'} started (${v.runs.join(', ') || 'none needed'}).`, true);
        showDetail(t.id);
      } catch (e) {
        notice(`Backfill ${t.id}: ${e.message}`);
      }
    };
  }

  // An expired task's offer (issue 28): "this message expired — set a new time?", with a
  // time picker in the task's zone (the browser's when it has none). The new time is a PATCH
  // of the schedule, which re-arms the task (expired → pending).
  function rearmForm(t, tz) {
    const zone = tz || Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC';
    const input = el('input', { type: 'datetime-local', id: 'rearm-at', 'aria-label': `New time for task ${t.id} (${zone})`, required: '' });
    const form = el('form', { class: 'rearm', id: 'rearm-form' },
      el('span', { text: 'This message expired — set a new time?' }), input,
      el('small', { class: 'muted', text: zone }),
      el('button', { type: 'submit', text: 'Set new time' }));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      if (!input.value) return;
      // datetime-local gives minutes ("2026-12-02T09:00"); the API takes seconds too.
      const at = input.value.length === 16 ? `${input.value}:00` : input.value;
      try {
        const v = await api('PATCH', `/v1/tasks/${encodeURIComponent(t.id)}`, { schedule: { at, tz: zone } });
        updateTask(v);
        notice(`Task ${t.id} set for ${H.fmt.at(v.next_fire_at, zone)}: it is ${v.state} again.`, true);
        showDetail(t.id);
      } catch (e) {
        notice(`New time for ${t.id}: ${e.message}`);
      }
    });
    return form;
  }

  // ---- timeline -----------------------------------------------------------------------------

  // The timeline is paged oldest first: read pages of 1 000 to the end (a task keeps
  // `timeline_max` events, 10 000 by default; at most TIMELINE_PAGES pages) and show the newest
  // 200, newest first. `more`: only what came after the events drawn (a `timeline` event of
  // the task shown, a refresh of it), read after the last seq shown.
  const TIMELINE_SHOWN = 200;
  const TIMELINE_PAGES = 1000;
  async function loadTimeline(id, more) {
    const created = ui.detailTask && ui.detailTask.id === id ? ui.detailTask.created_at : null;
    const same = () => ui.timeline.id === id && ui.timeline.created === created;
    more = more && same();
    const had = more ? ui.timeline.events : null;
    let events = had ? had.slice() : [];
    let after = had && had.length ? String(had[had.length - 1].seq) : null;
    try {
      for (let i = 0; i < TIMELINE_PAGES; i++) {
        const q = new URLSearchParams({ limit: '1000' });
        if (after) q.set('after', after);
        const page = await api('GET', `/v1/tasks/${encodeURIComponent(id)}/timeline?${q}`);
        events = events.concat(page.events).slice(-TIMELINE_SHOWN);
        if (!page.next) break;
        after = page.next;
      }
    } catch (e) {
      // Deleted meanwhile: its `deleted` event closes the detail; nothing to say here.
      if (ui.detail === id) notice(`Timeline of ${id}: ${e.message}`);
      return;
    }
    if (ui.detail !== id) return;
    // Another read of this timeline may have finished meanwhile: what is new is added to
    // what it drew (a full read draws what it read).
    if (more && same()) {
      const seen = new Set();
      events = ui.timeline.events.concat(events).filter((e) => {
        const k = `${e.seq}\u0000${e.kind}`;
        if (seen.has(k)) return false;
        seen.add(k);
        return true;
      }).sort((a, b) => a.seq - b.seq).slice(-TIMELINE_SHOWN);
    }
    ui.timeline = { id, created, events };
    drawTimeline(events, H.fmt.zoneOf(ui.detailTask || {}));
  }
  // A `timeline` event of the task shown: read what is new (at most every 500 ms while they
  // keep coming; a fast sequence writes several a second).
  const refetchTimeline = debounce(() => (ui.detail ? loadTimeline(ui.detail, true) : null), 150);
  function drawTimeline(events, tz) {
    const list = $('#timeline');
    const T = H.timeline;
    // Redrawn as events come: an attempt opened stays open (in the same task's timeline).
    const same = list.dataset.task === ui.timeline.id;
    const open = new Set(same ? [...list.querySelectorAll('li[data-seq] details[open]')].map((d) => d.closest('li').dataset.seq) : []);
    list.dataset.task = ui.timeline.id;
    const items = T.newestFirst(events).map((e) => {
      const when = el('time', { datetime: e.at, text: H.fmt.at(e.at, tz) });
      const line = el('span', { class: 'what', text: T.summary(e) });
      const where = el('span', { class: 'where muted', text: T.where(e) });
      if (e.kind !== 'attempt' && e.kind !== 'failed' && e.kind !== 'retry_scheduled') {
        return el('li', { 'data-kind': e.kind, 'data-seq': e.seq }, when, ' ', line, ' ', where);
      }
      // Attempts (and what followed them) open to their whole detail.
      const dl = el('dl', { class: 'fields' }, ...T.pairs(e).flatMap(([k, v]) => [el('dt', { text: k }), el('dd', { text: v })]));
      return el('li', { 'data-kind': e.kind, 'data-seq': e.seq },
        el('details', { open: open.has(String(e.seq)) }, el('summary', {}, when, ' ', line, ' ', where), dl));
    });
    if (!items.length) items.push(el('li', { class: 'empty', text: 'No events yet.' }));
    list.replaceChildren(...items);
  }

  // ---- failures -----------------------------------------------------------------------------

  async function loadFailures() {
    const q = new URLSearchParams({ limit: '50' });
    if (ui.failuresAfter) q.set('after', ui.failuresAfter);
    let page;
    try {
      page = await api('GET', `/v1/failures?${q}`);
    } catch (e) {
      notice(`Loading failures: ${e.message}`);
      return;
    }
    const body = $('#failure-rows');
    body.replaceChildren(...page.failures.map((f) => el('tr', { 'data-failure': f.id },
      el('td', {}, el('button', { type: 'button', class: 'link', 'aria-label': `Show task ${f.task_id}`, text: f.id, onclick: () => showDetail(f.task_id) })),
      el('td', { text: f.to }),
      el('td', { text: f.attempts }),
      whenCell(f.failed_at, null),
      el('td', { text: f.last_error }),
      el('td', {}, el('div', { class: 'actions' },
        el('button', { type: 'button', class: 'quiet', 'data-action': 'timeline', 'aria-label': `Timeline of task ${f.task_id}`, text: 'Timeline', onclick: () => showTimelineOf(f.task_id) }),
        el('button', { type: 'button', class: 'quiet', 'data-action': 'retry', 'aria-label': `Retry message ${f.id}`, disabled: f.retrying, text: f.retrying ? 'Retrying…' : 'Retry', onclick: () => retryFailure(f.id) }),
        el('button', { type: 'button', class: 'danger', 'data-action': 'dismiss', 'aria-label': `Dismiss message ${f.id}`, text: 'Dismiss', onclick: () => dismissFailure(f.id) }))))));
    if (!page.failures.length) body.append(el('tr', {}, el('td', { colspan: 6, class: 'empty', text: 'No failures.' })));
    // The whole list on one page: its length is the count, exact and live (the census behind
    // /metrics can be 10 s old).
    ui.failureCount = !page.next && !ui.failuresAfter ? page.failures.length : null;
    if (ui.failureCount !== null) setCount('#count-failures', ui.failureCount);
    const more = $('#failures-more');
    more.hidden = !page.next && !ui.failuresAfter;
    more.textContent = page.next ? 'Next page' : 'First page';
    more.onclick = () => {
      ui.failuresAfter = page.next || null;
      loadFailures();
    };
  }
  const reloadFailures = debounce(loadFailures, 200);

  // A failure's link to its task's timeline: the task's detail, scrolled to the timeline.
  async function showTimelineOf(taskId) {
    await showDetail(taskId);
    const h = $('#timeline-h');
    if (h && !$('#detail').hidden) h.scrollIntoView({ block: 'start' });
  }

  async function retryFailure(id) {
    try {
      await api('POST', `/v1/failures/${encodeURIComponent(id)}/retry`);
      notice(`Retrying ${id}.`, true);
    } catch (e) {
      notice(`Retry ${id}: ${e.message}`);
    }
    reloadFailures();
  }

  async function dismissFailure(id) {
    if (!(await confirmDialog(`Dismiss ${id}? It leaves the failure list and is not sent again.`, 'Dismiss', true))) return;
    try {
      await api('DELETE', `/v1/failures/${encodeURIComponent(id)}`);
      notice(`Dismissed ${id}.`, true);
    } catch (e) {
      notice(`Dismiss ${id}: ${e.message}`);
    }
    reloadFailures();
  }

  // ---- channels ----------------------------------------------------------------------------

  async function loadChannels() {
    try {
      ui.channels = (await api('GET', '/v1/channels')).channels;
    } catch (e) {
      return;
    }
    const sel = $('#f-channel');
    const known = new Set([...sel.options].map((o) => o.value));
    for (const c of ui.channels) if (!known.has(c.name)) sel.append(el('option', { value: c.name, text: c.name }));
    drawChannels();
  }

  // The channels table: configuration and counters from /v1/channels, success ratio and
  // sends/s over the last CHANNEL_WINDOW_MS of /metrics samples (the window is stated: right
  // after the page opened it is shorter).
  function drawChannels() {
    const sum = H.metrics.summary(ui.samples, CHANNEL_WINDOW_MS);
    const span = sum ? H.fmt.span(sum.spanMs) : null;
    $('#channels-note').textContent = sum
      ? `success ratio and sends/s over the last ${span} (${H.fmt.span(CHANNEL_WINDOW_MS)} once the page has been open that long), from /metrics`
      : 'success ratio and sends/s: measuring (from /metrics samples every 2 s)…';
    $('#channel-rows').replaceChildren(...ui.channels.map((c) => {
      const b = c.breaker;
      const w = sum && sum.channels[c.name];
      let ratio = '…', ratioTitle = null;
      if (w) {
        ratio = w.attempts ? `${H.fmt.percent(w.sent, w.attempts)} of ${w.attempts} attempt${w.attempts === 1 ? '' : 's'}` : `no attempts in ${span}`;
        ratioTitle = `over the last ${span}: ${w.sent} sent, ${w.failed} failed attempts`;
      }
      const breaker = b
        ? el('span', {}, stateBadge(b.state),
          b.success_ratio !== null && b.success_ratio !== undefined ? el('small', { class: 'muted', text: `${H.fmt.percent(b.success_ratio, 1)} in its window` }) : null)
        : el('span', { class: 'muted', text: 'none' });
      return el('tr', { 'data-channel': c.name },
        el('td', { text: c.name }), el('td', { text: c.kind }),
        el('td', {}, breaker),
        el('td', { class: 'ratio', title: ratioTitle, 'data-attempts': w ? w.attempts : null, 'data-ratio': w && w.ratio !== null ? w.ratio : null, text: ratio }),
        el('td', { class: 'rate', text: w ? H.fmt.rate(w.rate) : '…' }),
        el('td', { text: c.rate ? c.rate.limit : 'none' }),
        el('td', { text: `${c.in_flight}/${c.concurrency}` }),
        el('td', { text: c.sent }),
        el('td', { text: c.retryable_failures + c.permanent_failures }));
    }));
  }

  // ---- cluster ------------------------------------------------------------------------------

  // GET /v1/cluster with the overview's beat: the panel shows on 200, hides on 404 (not in
  // cluster mode, no error), keeps its last view with a note on any other failure.
  async function loadCluster() {
    let c;
    try {
      c = await api('GET', '/v1/cluster');
    } catch (e) {
      if (e.status === 404) {
        $('#cluster').hidden = true;
      } else if (!$('#cluster').hidden) {
        $('#cluster-note').textContent = `/v1/cluster: ${e.message}`;
      }
      return;
    }
    if (!c || typeof c !== 'object') return;
    const C = H.cluster;
    const tz = H.fmt.viewerZone();
    $('#cluster-node').textContent = c.node_id;
    $('#cluster-held').textContent = C.held(c);
    $('#cluster-offset').textContent = C.offset(c.clock_offset_ms);
    $('#cluster-note').textContent = c.read_at ? `from GET /v1/cluster, as this node last read it (${H.fmt.at(c.read_at, tz)})` : 'from GET /v1/cluster';
    // Each node's last heartbeat and clock offset (the contract's fields) in its row's title.
    const beat = (n) => `last heartbeat ${n.heartbeat ? H.fmt.at(n.heartbeat, tz) : '—'} · clock offset ${n.offset}`;
    $('#cluster-nodes').replaceChildren(...C.nodes(c).map((n) => el('tr', { 'data-node': n.id, 'data-live': n.live ? 'true' : 'false', title: beat(n) },
      el('td', {}, el('span', { class: `swatch ${n.cls}`, 'aria-hidden': 'true' }), n.id, n.self ? ' (this node)' : ''),
      el('td', {}, stateBadge(n.live ? 'live' : 'down')),
      el('td', { text: n.shards }),
      el('td', { text: n.advertise }))));
    $('#cluster-shards').replaceChildren(...C.cells(c, (iso) => H.fmt.at(iso, tz)).map((x) => el('span', {
      class: `shard ${x.cls}`, role: 'listitem', title: x.title, 'aria-label': x.title, 'data-shard': x.shard, 'data-owner': x.owner, text: x.shard,
    })));
    $('#cluster').hidden = false;
  }

  // ---- overview -----------------------------------------------------------------------------

  function setCount(id, v) {
    $(id).textContent = v === null || v === undefined ? '—' : Number(v).toLocaleString();
  }

  let sampling = false;
  async function sampleMetrics() {
    if (sampling) return;
    sampling = true;
    try {
      const text = await api('GET', '/metrics');
      const now = Date.now();
      ui.samples.push(H.metrics.sample(text, now));
      while (ui.samples.length && ui.samples[0].at < now - SAMPLES_KEPT_MS - SAMPLE_EVERY_MS) ui.samples.shift();
      drawOverview(now);
      // The channels' counters with the same beat, so that their totals and their window agree.
      await loadChannels();
      await loadCluster();
    } catch (e) {
      $('#overview-note').textContent = `/metrics: ${e.message}`;
    } finally {
      sampling = false;
    }
  }

  function drawOverview(now) {
    const last = ui.samples[ui.samples.length - 1];
    if (last) {
      const t = last.tasks || {};
      setCount('#count-pending', t.pending);
      setCount('#count-running', t.running);
      setCount('#count-paused', t.paused);
      setCount('#count-failures', ui.failureCount !== null ? ui.failureCount : last.failures);
    }
    const s = H.metrics.series(ui.samples);
    // The charts span what was sampled (at least a minute, at most SAMPLES_KEPT_MS), so that a
    // page just opened does not squeeze its first points into the right edge.
    const first = ui.samples.length ? ui.samples[0].at : now;
    const from = Math.max(now - SAMPLES_KEPT_MS, Math.min(first, now - 60 * 1000));
    const tail = (pts) => (pts.length ? pts[pts.length - 1].v : null);
    H.chart.draw($('#chart-sends'), {
      from, to: now, step: SAMPLE_EVERY_MS, floor: 1, format: H.fmt.rate,
      series: [{ key: 'sends', cls: 'sends', points: s.sends }, { key: 'failures', cls: 'failures', points: s.failures }],
    });
    H.chart.draw($('#chart-lateness'), {
      from, to: now, step: SAMPLE_EVERY_MS, floor: 0.001, format: H.fmt.seconds,
      series: [{ key: 'p50', cls: 'p50', points: s.p50 }, { key: 'p99', cls: 'p99', points: s.p99 }],
    });
    $('#now-sends').textContent = `${H.fmt.rate(tail(s.sends))}/s`;
    $('#now-failures').textContent = `${H.fmt.rate(tail(s.failures))}/s`;
    // Lateness over the last minute: one interval alone often holds a handful of sends.
    const m = H.metrics.summary(ui.samples, 60 * 1000);
    $('#now-p50').textContent = m ? H.fmt.seconds(m.p50) : '—';
    $('#now-p99').textContent = m ? H.fmt.seconds(m.p99) : '—';
    $('#overview-note').textContent = `from herald's /metrics, sampled every ${SAMPLE_EVERY_MS / 1000} s; charts: the last ${H.fmt.span(now - from)} (up to ${H.fmt.span(SAMPLES_KEPT_MS)}); lateness figures: the last minute; task counts: herald's census (up to 10 s old)`;
  }

  // ---- live events --------------------------------------------------------------------------

  let streamAbort = null;
  function restartStream() {
    if (streamAbort) streamAbort.abort();
  }

  function onEvent(name, data) {
    switch (name) {
      case 'ready':
        loadAll();
        break;
      case 'resync':
        // The stream fell behind and dropped events: read everything again, at most every
        // 500 ms while resyncs keep coming (a slow tab on a busy herald).
        loadAllSoon();
        break;
      case 'progress':
        applyProgress(data);
        break;
      case 'task':
        refreshTask(data.id);
        break;
      case 'deleted':
        dropTask(data.id);
        break;
      case 'timeline':
        // Steps without a task or progress event of their own (`held`, say) show too.
        if (ui.detail === data.task) refetchTimeline();
        break;
      case 'failure':
        reloadFailures();
        if (ui.detail === data.task) refetchDetail();
        break;
      default:
    }
  }

  function onBlock(block) {
    let name = 'message';
    const data = [];
    for (const line of block.split('\n')) {
      if (line.startsWith('event:')) name = line.slice(6).trim();
      else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
    }
    if (!data.length) return;
    let v = null;
    try {
      v = JSON.parse(data.join('\n'));
    } catch (_) {
      return;
    }
    onEvent(name, v);
  }

  async function stream() {
    let wait = 500;
    for (;;) {
      const ctrl = new AbortController();
      streamAbort = ctrl;
      const sent = token();
      try {
        const r = await fetch('/v1/events', { headers: headers({ Accept: 'text/event-stream' }), cache: 'no-store', signal: ctrl.signal });
        if (r.status === 401) {
          setLive('off', sent ? 'token refused' : 'needs a token');
          await unauthorized(sent);
          continue;
        }
        if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}`);
        setLive('on', 'live');
        wait = 500;
        const reader = r.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            onBlock(block);
          }
        }
        setLive('off', 'reconnecting…');
      } catch (e) {
        if (ctrl.signal.aborted) continue;
        setLive('off', 'offline, retrying…');
      }
      await sleep(wait);
      wait = Math.min(wait * 2, 10000);
    }
  }

  function loadAll() {
    loadTasks();
    loadFailures();
    loadChannels();
    if (ui.detail) showDetail(ui.detail);
  }
  const loadAllSoon = debounce(() => loadAll(), 150);

  // ---- create and preview -------------------------------------------------------------------

  function parseRequest() {
    try {
      return JSON.parse($('#create-body').value);
    } catch (e) {
      $('#create-result').textContent = `Not JSON: ${e.message}`;
      return null;
    }
  }

  async function createTask(ev) {
    ev.preventDefault();
    // A preview shown before belongs to the text as it was: it goes, whatever the outcome.
    $('#preview-list').replaceChildren();
    const req = parseRequest();
    if (!req) return;
    try {
      const t = await api('POST', '/v1/tasks', req);
      $('#create-result').textContent = `Created task ${t.id}: ${H.fmt.describe(t.description, t.next_fire_at)}.`;
      if (!ui.next) loadTasks();
      showDetail(t.id);
    } catch (e) {
      $('#create-result').textContent = `Not created: ${e.message}`;
    }
  }

  async function previewSchedule() {
    const list = $('#preview-list');
    list.replaceChildren();
    const req = parseRequest();
    if (!req) return;
    try {
      const p = await api('POST', '/v1/schedules/preview', { schedule: req.schedule, n: 5 });
      $('#create-result').textContent = `Schedule: ${H.fmt.describe(p.description, p.fires.length ? p.fires[0].at : null)}`;
      const tz = H.fmt.zoneOf({ schedule: req.schedule });
      const now = Date.now();
      list.replaceChildren(...p.fires.map((f) => el('li', {},
        el('time', { datetime: f.at, text: H.fmt.at(f.at, tz) }), ` · ${H.fmt.relative(f.at, now)}`)));
    } catch (e) {
      list.replaceChildren();
      $('#create-result').textContent = `Schedule: ${e.message}`;
    }
  }

  // ---- wiring -------------------------------------------------------------------------------

  function readFilters() {
    ui.filter = { state: $('#f-state').value, channel: $('#f-channel').value, limit: Number($('#f-limit').value) || 50 };
    ui.after = null;
    ui.back = [];
    loadTasks();
  }

  // What the overview was drawn from, for a look from the browser's console (and the test).
  H.overview = { samples: () => ui.samples.slice() };

  document.addEventListener('DOMContentLoaded', () => {
    for (const id of ['#f-state', '#f-channel', '#f-limit']) $(id).addEventListener('change', readFilters);
    $('#filters').addEventListener('submit', (e) => {
      e.preventDefault();
      readFilters();
    });
    $('#reload').addEventListener('click', loadAll);
    $('#next-page').addEventListener('click', () => {
      if (!ui.next) return;
      ui.back.push(ui.after);
      ui.after = ui.next;
      loadTasks();
    });
    $('#prev-page').addEventListener('click', () => {
      if (!ui.back.length) return;
      ui.after = ui.back.pop();
      loadTasks();
    });
    $('#first-page').addEventListener('click', () => {
      ui.after = null;
      ui.back = [];
      loadTasks();
    });
    $('#detail-close').addEventListener('click', () => {
      ui.detail = null;
      $('#detail').hidden = true;
    });
    $('#token-button').addEventListener('click', () => {
      askToken().then(loadAll);
    });
    $('#create-form').addEventListener('submit', createTask);
    $('#preview-button').addEventListener('click', previewSchedule);
    // "in 3m" and "5s ago" move on by themselves.
    setInterval(() => {
      if (document.hidden) return;
      const now = Date.now();
      for (const e of document.querySelectorAll('.rel[data-at]')) e.textContent = H.fmt.relative(e.dataset.at, now);
    }, 5000);
    // Hidden, the page does not sample; the charts show the gap rather than join across it.
    setInterval(() => {
      if (!document.hidden) sampleMetrics();
    }, SAMPLE_EVERY_MS);
    sampleMetrics();
    stream();
  });
})(window.Herald);

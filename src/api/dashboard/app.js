// herald dashboard: plain JS on herald's own /v1 API, no framework, no build step.
//
// - The token (when herald wants one) is asked once and kept in sessionStorage for this tab.
// - Live updates come from GET /v1/events read with fetch() (EventSource cannot send the
//   Authorization header). Every (re)connection starts with a `ready` event, after which what
//   is shown is reloaded, so nothing between a load and the stream is missed.
// - Lists are paged (tasks by id with `after`, failures likewise): the page never loads all.
// - Everything the server sends is put in the page as text (textContent), never as HTML.
'use strict';

(() => {
  const TOKEN_KEY = 'herald.token';
  const $ = (sel) => document.querySelector(sel);
  const ui = {
    filter: { state: '', channel: '', limit: 50 },
    after: null,        // `after` of the page shown (null = first page)
    back: [],           // `after` values of the pages before it
    next: null,         // `next` of the page shown
    rows: new Map(),    // task id -> task view, for the tasks on the page
    detail: null,       // id of the task shown in detail
    failuresAfter: null,
    channelsPrev: null, // {at, sent: {name: n}} for sends/s
  };

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

  function debounce(fn, ms) {
    let t = null;
    return () => {
      clearTimeout(t);
      t = setTimeout(fn, ms);
    };
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

  const DATE_OPTS = { year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', minute: '2-digit', second: '2-digit' };

  function fmtLocal(iso) {
    return new Date(iso).toLocaleString(undefined, DATE_OPTS);
  }

  function fmtZone(iso, tz) {
    try {
      return new Date(iso).toLocaleString(undefined, { ...DATE_OPTS, timeZone: tz, timeZoneName: 'short' }) + ' ' + tz;
    } catch (_) {
      return '';
    }
  }

  function relative(iso) {
    const s = Math.round((new Date(iso).getTime() - Date.now()) / 1000);
    const a = Math.abs(s);
    if (a < 1) return 'now';
    const d = Math.floor(a / 86400), h = Math.floor((a % 86400) / 3600), m = Math.floor((a % 3600) / 60), sec = a % 60;
    const txt = d ? `${d}d${h ? h + 'h' : ''}` : h ? `${h}h${m ? m + 'm' : ''}` : m ? `${m}m${sec && m < 10 ? sec + 's' : ''}` : `${sec}s`;
    return s > 0 ? `in ${txt}` : `${txt} ago`;
  }

  function taskZone(t) {
    const s = t.schedule || {};
    return s.tz || (s.reminders && s.reminders.tz) || 'UTC';
  }

  function whenCell(iso, tz) {
    if (!iso) return el('td', { class: 'when' }, '—');
    return el('td', { class: 'when' },
      el('time', { datetime: iso, text: fmtLocal(iso) }),
      tz ? el('small', { text: fmtZone(iso, tz) }) : null,
      el('small', { text: relative(iso) }));
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
  // Asks for the token (once for everyone waiting); resolves when one was given.
  function askToken() {
    if (asking) return asking;
    const dlg = $('#token-dialog');
    asking = new Promise((resolve) => {
      const done = () => {
        const v = $('#token-input').value.trim();
        if (!v) {
          dlg.showModal();
          return;
        }
        sessionStorage.setItem(TOKEN_KEY, v);
        dlg.removeEventListener('close', done);
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

  async function api(method, path, body) {
    for (;;) {
      const init = { method, headers: headers(body !== undefined ? { 'Content-Type': 'application/json' } : {}) };
      if (body !== undefined) init.body = typeof body === 'string' ? body : JSON.stringify(body);
      let r;
      try {
        r = await fetch(path, init);
      } catch (e) {
        throw new ApiError(0, 'cannot reach herald: ' + e.message);
      }
      if (r.status === 401) {
        await askToken();
        continue;
      }
      const text = await r.text();
      let data = null;
      try {
        data = text ? JSON.parse(text) : null;
      } catch (_) {
        data = null;
      }
      if (!r.ok) throw new ApiError(r.status, (data && data.detail) || `${r.status} ${r.statusText}`);
      return data;
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

  function progressCell(t) {
    const p = t.progress;
    if (!p) return el('td', { class: 'progress' }, '—');
    const done = (p.sent || 0) + (p.failed || 0);
    const total = p.total || 0;
    return el('td', { class: 'progress' },
      el('progress', { max: Math.max(total, 1), value: total ? done : 0, 'aria-label': `Progress of task ${t.id}, run ${p.run}: ${done} of ${total}`, 'data-done': done, 'data-total': total }),
      el('div', { class: 'text' },
        `run ${p.run}: ${done}/${total}`,
        p.failed ? el('span', { class: 'failed', text: ` · ${p.failed} failed` }) : null,
        p.in_flight ? ' · sending' : ''));
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
      el('td', { text: t.description }),
      whenCell(t.next_fire_at, taskZone(t)),
      progressCell(t),
      actionsCell(t));
  }

  function rowOf(id) {
    return document.querySelector(`#task-rows tr[data-task="${CSS.escape(id)}"]`);
  }

  // Redraws one task's row in place (the actions only when they change, to keep focus).
  function updateTask(t) {
    if (!ui.rows.has(t.id)) return;
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
    ui.rows = new Map(page.tasks.map((t) => [t.id, t]));
    const body = $('#task-rows');
    body.replaceChildren(...page.tasks.map(taskRow));
    if (!page.tasks.length) body.append(el('tr', {}, el('td', { colspan: 7, class: 'empty', text: 'No tasks here.' })));
    $('#next-page').disabled = !ui.next;
    $('#prev-page').disabled = ui.back.length === 0;
    $('#first-page').disabled = !ui.after;
    $('#page-info').textContent = `page ${ui.back.length + 1} · ${page.tasks.length} task${page.tasks.length === 1 ? '' : 's'}`;
  }
  const reloadTasks = debounce(loadTasks, 250);

  // A task changed: redraw it if it is on the page; a new task may belong to the last page.
  const refreshTask = (() => {
    const pending = new Set();
    const flush = debounce(async () => {
      const ids = [...pending];
      pending.clear();
      for (const id of ids) {
        if (ui.rows.has(id)) {
          try {
            updateTask(await api('GET', `/v1/tasks/${encodeURIComponent(id)}`));
          } catch (_) { /* gone or unreachable: the next reload tells */ }
        } else if (!ui.next) {
          reloadTasks();
        }
        if (ui.detail === id) showDetail(id);
      }
    }, 100);
    return (id) => {
      pending.add(id);
      flush();
    };
  })();

  function applyProgress(ev) {
    const t = ui.rows.get(ev.task);
    if (!t) return;
    const stateChanged = t.state !== ev.task_state;
    updateTask({
      ...t,
      state: ev.task_state,
      progress: { ...(t.progress || {}), run: ev.run, total: ev.total, sent: ev.sent, failed: ev.failed, in_flight: ev.in_flight },
    });
    if (stateChanged || ev.state !== 'running') refreshTask(ev.task);
  }

  // ---- detail -------------------------------------------------------------------------------

  async function showDetail(id) {
    ui.detail = id;
    let t, runs, last;
    try {
      t = await api('GET', `/v1/tasks/${encodeURIComponent(id)}`);
      // Runs are paged oldest first: ask for the page that ends at the newest run.
      last = (t.progress && t.progress.run) || 0;
      runs = await api('GET', `/v1/tasks/${encodeURIComponent(id)}/runs?limit=50&after=${Math.max(0, last - 50)}`);
    } catch (e) {
      notice(`Task ${id}: ${e.message}`);
      return;
    }
    if (ui.detail !== id) return;
    $('#detail-id').textContent = id;
    const tz = taskZone(t);
    const fields = [
      ['Name', t.name || '—'], ['State', t.state], ['Channel', t.channel], ['Schedule', t.description],
      ['Next fire', t.next_fire_at ? `${fmtLocal(t.next_fire_at)} (your time) · ${fmtZone(t.next_fire_at, tz)} · ${relative(t.next_fire_at)}` : '—'],
      ['Messages', t.messages], ['Runs started', t.runs],
      ['Pacing', JSON.stringify(t.pacing)], ['Retry', JSON.stringify(t.retry)],
      ['Misfire', `${t.misfire} (grace ${t.misfire_grace})`], ['Overlap', t.overlap],
      ['Metadata', JSON.stringify(t.metadata)], ['Created', fmtLocal(t.created_at)], ['Updated', fmtLocal(t.updated_at)],
    ];
    $('#detail-fields').replaceChildren(...fields.flatMap(([k, v]) => [el('dt', { text: k }), el('dd', { text: String(v) })]));
    const shown = runs.runs.slice().reverse();
    const body = $('#run-rows');
    body.replaceChildren(...shown.map((r) => el('tr', { 'data-run': r.run },
      el('td', { text: r.run }), el('td', {}, stateBadge(r.state)), whenCell(r.scheduled_at, null),
      el('td', { text: r.sent }), el('td', { text: r.failed }), el('td', { text: r.total }),
      whenCell(r.finished_at, null), el('td', { text: r.reason || '' }))));
    if (!shown.length) body.append(el('tr', {}, el('td', { colspan: 8, class: 'empty', text: 'No runs yet.' })));
    if (last > shown.length) body.append(el('tr', {}, el('td', { colspan: 8, class: 'empty', text: `Showing the newest ${shown.length} of ${last} runs.` })));
    const sec = $('#detail');
    const wasHidden = sec.hidden;
    sec.hidden = false;
    if (wasHidden) sec.scrollIntoView({ block: 'nearest' });
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
        el('button', { type: 'button', class: 'quiet', 'data-action': 'retry', 'aria-label': `Retry message ${f.id}`, disabled: f.retrying, text: f.retrying ? 'Retrying…' : 'Retry', onclick: () => retryFailure(f.id) }),
        el('button', { type: 'button', class: 'danger', 'data-action': 'dismiss', 'aria-label': `Dismiss message ${f.id}`, text: 'Dismiss', onclick: () => dismissFailure(f.id) }))))));
    if (!page.failures.length) body.append(el('tr', {}, el('td', { colspan: 6, class: 'empty', text: 'No failures.' })));
    const more = $('#failures-more');
    more.hidden = !page.next && !ui.failuresAfter;
    more.textContent = page.next ? 'Next page' : 'First page';
    more.onclick = () => {
      ui.failuresAfter = page.next || null;
      loadFailures();
    };
  }
  const reloadFailures = debounce(loadFailures, 200);

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

  // ---- channels -----------------------------------------------------------------------------

  async function loadChannels() {
    let v;
    try {
      v = await api('GET', '/v1/channels');
    } catch (e) {
      return;
    }
    const now = Date.now();
    const prev = ui.channelsPrev;
    const sel = $('#f-channel');
    const known = new Set([...sel.options].map((o) => o.value));
    const body = $('#channel-rows');
    body.replaceChildren(...v.channels.map((c) => {
      if (!known.has(c.name)) sel.append(el('option', { value: c.name, text: c.name }));
      const b = c.breaker;
      const rate = prev && prev.sent[c.name] !== undefined ? ((c.sent - prev.sent[c.name]) * 1000) / Math.max(now - prev.at, 1) : null;
      return el('tr', { 'data-channel': c.name },
        el('td', { text: c.name }), el('td', { text: c.kind }),
        el('td', {}, b ? stateBadge(b.state === 'closed' ? 'closed' : b.state) : '—'),
        el('td', { text: b && b.success_ratio !== null && b.success_ratio !== undefined ? `${Math.round(b.success_ratio * 100)}%` : '—' }),
        el('td', { text: c.rate ? c.rate.limit : 'none' }),
        el('td', { text: rate === null ? '…' : rate.toFixed(1) }),
        el('td', { text: `${c.in_flight}/${c.concurrency}` }),
        el('td', { text: c.sent }),
        el('td', { text: c.retryable_failures + c.permanent_failures }));
    }));
    ui.channelsPrev = { at: now, sent: Object.fromEntries(v.channels.map((c) => [c.name, c.sent])) };
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
        loadAll();
        break;
      case 'progress':
        applyProgress(data);
        break;
      case 'task':
        refreshTask(data.id);
        break;
      case 'failure':
        reloadFailures();
        if (ui.detail === data.task) refreshTask(data.task);
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
      try {
        const r = await fetch('/v1/events', { headers: headers({ Accept: 'text/event-stream' }), cache: 'no-store', signal: ctrl.signal });
        if (r.status === 401) {
          setLive('off', 'needs a token');
          await askToken();
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
    const req = parseRequest();
    if (!req) return;
    try {
      const t = await api('POST', '/v1/tasks', req);
      $('#create-result').textContent = `Created task ${t.id}: ${t.description}.`;
      if (!ui.next) loadTasks();
      showDetail(t.id);
    } catch (e) {
      $('#create-result').textContent = `Not created: ${e.message}`;
    }
  }

  async function previewSchedule() {
    const req = parseRequest();
    if (!req) return;
    const list = $('#preview-list');
    try {
      const p = await api('POST', '/v1/schedules/preview', { schedule: req.schedule, n: 5 });
      $('#create-result').textContent = `Schedule: ${p.description}`;
      list.replaceChildren(...p.fires.map((f) => el('li', { text: `${f.local} (${p.tz}) · ${fmtLocal(f.at)} your time · ${relative(f.at)}` })));
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
    setInterval(() => {
      if (!document.hidden) loadChannels();
    }, 5000);
    stream();
  });
})();

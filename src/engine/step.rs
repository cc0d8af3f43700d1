//! One key's step, the one-key path: a task's fire, a run's arm or its send and settle, a
//! failure-list retry. Each decision comes from `plan.rs` as a [`Change`](super::change::Change)
//! and is carried out by `commit.rs`; this module reads, sends, and routes errors.
//!
//! A run's step is two phases:
//! 1. **arm** ([`ARM_LEAD_MS`] before the message is due, under the task lock): check the task
//!    may send, mark the attempt in flight and make that durable;
//! 2. **send** (at the due instant): check again under the lock (pause and cancel win here),
//!    read the message, send outside the lock, then **settle** under the lock with
//!    [`plan::settle`]: cursor / retry / failure list, durable, and only then the run's next
//!    step.
//!
//! Failure rules:
//! - A send starts only after the durable write of its *own* in-flight mark succeeded.
//! - A failed write changes nothing in memory, or (when the send already happened) unloads the
//!   task so that it is read back from what is on disk; the step is tried again later. On disk
//!   the message is still in flight, so it goes again with the next attempt number and the same
//!   idempotency key: the only duplicate herald allows.
//! - A bug (an invalid transition, a cursor past the messages) or a record that cannot be read
//!   parks the task `failed` with the reason and an alert; it is never retried forever.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::arm::{fire_step_at, lead_max_ms, ARM_LEAD_MS};
use super::cells::Locked;
use super::change::{Change, WheelOp};
use super::commit::{self, STORAGE_RETRY_MS};
use super::plan::{self, Attempt};
use super::timer::{Key, RunKey, StepGuard};
use super::{alerts, offload, retry, EngineError, Inner};
use crate::deliver::webhook::{gated, Gate};
use crate::deliver::{backoff, Admission, Delivery};
use crate::logsafe::Escaped;
use crate::model::timeline::HeldWhy;
use crate::model::{Outcome, TaskSpec, TaskState};
use crate::schedule::format_utc;

/// A due key's step, as the dispatcher routes it.
pub(crate) enum Step {
    /// A fire step, with its permit of the dispatcher's bound on fires at once.
    Fire(Arc<str>, tokio::sync::OwnedSemaphorePermit),
    Run(RunKey),
    Retry(Arc<str>),
}

/// Runs one due key's step in a task of its own.
pub(super) fn spawn(inner: &Arc<Inner>, step: Step, guard: StepGuard) {
    let inner = inner.clone();
    tokio::spawn(async move {
        let _guard = guard;
        match step {
            Step::Fire(task, permit) => {
                let _permit = permit;
                if let Err(e) = fire(&inner, &task).await {
                    step_error(&inner, Key::Fire(task), &e);
                }
            }
            Step::Retry(id) => {
                if let Err(e) = retry::failure_retry(&inner, &id).await {
                    tracing::error!(failure = %id, error = %e,
                        "failure retry step failed; trying again in {STORAGE_RETRY_MS} ms");
                    inner
                        .timer
                        .at(Key::Retry(id), inner.clock.now_ms() + STORAGE_RETRY_MS);
                }
            }
            Step::Run(key) => {
                if let Err(e) = run_step(&inner, &key).await {
                    step_error(&inner, key.key(), &e);
                }
            }
        }
    });
}

/// After a step failed: storage errors are tried again later; anything else was parked (or
/// the task is gone), logged and alerted where it happened.
pub(super) fn step_error(inner: &Inner, key: Key, e: &EngineError) {
    if is_retryable(e) {
        tracing::debug!(task = %key.id(), error = %e,
            "step failed; trying again in {STORAGE_RETRY_MS} ms");
        inner.timer.at(key, inner.clock.now_ms() + STORAGE_RETRY_MS);
    }
}

/// How long a step that found its shard's send window closed waits before it looks again.
pub(super) const WINDOW_RETRY_MS: u64 = 250;

/// A step that found its shard's send window closed comes back [`WINDOW_RETRY_MS`] later:
/// with the trust renewed it sends then; with the shard dropped meanwhile its wheel entry
/// goes with the shard's (or is skipped as not owned), and the next owner sends it.
pub(super) fn window_closed(inner: &Inner, key: Key) {
    tracing::debug!(task = %key.id(), "the shard's send window is closed; back in {WINDOW_RETRY_MS} ms");
    inner.timer.at(key, inner.clock.now_ms() + WINDOW_RETRY_MS);
}

pub(super) fn draining(inner: &Inner) -> bool {
    inner.draining.load(std::sync::atomic::Ordering::Acquire)
}

/// Counts a send from its start until its outcome is settled (or the step gave up).
pub(super) struct SendInFlight<'a>(&'a Inner);

impl<'a> SendInFlight<'a> {
    pub(super) fn new(inner: &'a Inner) -> Self {
        inner
            .sends_in_flight
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        SendInFlight(inner)
    }
}

impl Drop for SendInFlight<'_> {
    fn drop(&mut self) {
        self.0
            .sends_in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A send's hold on its task's gate (`cells::LiveMap::gate`, `deliver::webhook::Gate`): taken
/// under the task's lock while the task runs, so a cancel or pause from then on (under the
/// same lock) closes it before its write; given back when the send is over.
pub(super) struct SendGate<'a> {
    inner: &'a Inner,
    id: Arc<str>,
    gate: Option<Arc<Gate>>,
}

impl<'a> SendGate<'a> {
    /// The gate of task `id`; the caller holds the task's lock and has seen it running (or,
    /// for a failure retry, has seen it finished: no command reaches it then).
    pub(super) fn new(inner: &'a Inner, id: &Arc<str>) -> Self {
        let gate = inner.live.lock().gate(id);
        SendGate {
            inner,
            id: id.clone(),
            gate: Some(gate),
        }
    }

    pub(super) fn gate(&self) -> Arc<Gate> {
        self.gate.clone().unwrap_or_default()
    }
}

impl Drop for SendGate<'_> {
    fn drop(&mut self) {
        if let Some(g) = self.gate.take() {
            self.inner.live.lock().gate_done(&self.id, g);
        }
    }
}

/// Storage errors (and a full queue) pass, and so does a task's cell that kept changing hands
/// (`cells::lock`); a step that failed on them is tried again.
pub(super) fn is_retryable(e: &EngineError) -> bool {
    match e {
        EngineError::Store(s) => {
            s.is_storage()
                || matches!(
                    s,
                    crate::store::StoreError::Busy | crate::store::StoreError::OwnershipLost { .. }
                )
        }
        EngineError::Storage(_) | EngineError::Busy(_) => true,
        _ => false,
    }
}

/// Handles the due fire(s) of a task's schedule.
async fn fire(inner: &Arc<Inner>, task: &Arc<str>) -> Result<(), EngineError> {
    let Some(mut l) = commit::lock(inner, task).await? else {
        return Ok(()); // finished or cancelled: nothing to do
    };
    match fire_locked(inner, &mut l).await {
        Ok(()) => {
            l.release(inner);
            Ok(())
        }
        Err(e) => step_failed(inner, l, e).await,
    }
}

/// The fire step on a task already locked (also `control.rs`'s resume and backfill, which
/// judge a fire already due at once).
pub(super) async fn fire_locked(inner: &Arc<Inner>, l: &mut Locked) -> Result<(), EngineError> {
    let releasing = inner.releasing(&l.id);
    let st = l.st();
    if !matches!(st.progress.state, TaskState::Pending | TaskState::Running) {
        return Ok(()); // paused or finished: a stale wheel entry
    }
    if draining(inner) {
        return Ok(()); // the next boot fires it
    }
    if releasing {
        // Cluster mode, the task's shard is being handed over: a run started here would be
        // armed (its first attempt in the fire's write) with no send to follow, and its next
        // owner would wait that mark out as a send of ours. The key comes back (as a run
        // step's does) until the shard is released; then it is dropped and the next owner fires.
        window_closed(inner, Key::Fire(l.id.clone()));
        return Ok(());
    }
    let now = inner.clock.now_ms();
    let Some(due) = st.progress.next_fire_at_ms else {
        return Ok(());
    };
    let one_shot = st.spec.schedule.is_one_shot();
    if due > now + lead_max_ms(one_shot) {
        inner
            .timer
            .at(Key::Fire(l.id.clone()), fire_step_at(inner, due, one_shot));
        return Ok(());
    }
    let watched = watched_since(inner, st);
    let trace_id = st.spec.trace();
    // Issue 26, a wall jump forward (clock.rs) is judged like an outage that took no real
    // time: fires due before the jump's end were jumped over, so the misfire policy decides
    // (default: one coalesced run, never a burst of catch-up runs); their lateness against
    // misfire_grace leaves the jumped span out (the jump adds its size to the grace here,
    // and the task keeps its own grace).
    let jump = inner.clock.wall_jumps();
    let p = if due < jump.end_ms && jump.end_ms > watched {
        let grace = jump.grace_ms(due, st.spec.misfire_grace_ms);
        let (spec, progress, active) = (&st.spec, &st.progress, st.runs.len());
        let p = plan::fire_with_grace(spec, progress, active, due, now, jump.end_ms, grace)?;
        tracing::warn!(task = %st.spec.id, missed = p.missed, policy = ?st.spec.misfire, jump_ms = jump.size_ms,
            "fires were jumped over by the wall clock; judged by the misfire policy");
        p
    } else {
        let p = plan::fire(&st.spec, &st.progress, st.runs.len(), due, now, watched)?;
        if p.missed > 0 {
            tracing::warn!(task = %st.spec.id, missed = p.missed, policy = ?st.spec.misfire,
                "fires were missed (herald down or task paused); judged by the misfire policy");
        }
        p
    };
    for r in &p.not_started {
        tracing::info!(task = %l.id, run = r.run, state = ?r.state,
            reason = %crate::logsafe::Opt(r.reason.as_deref()), "fire not started");
    }
    for r in &p.started {
        tracing::info!(task = %l.id, run = r.run, late_ms = now.saturating_sub(r.scheduled_at_ms),
            trace_id = %crate::model::timeline::hex(&trace_id), "run started");
    }
    let fire_spans: Vec<_> = p
        .started
        .iter()
        .map(|r| (r.run, r.scheduled_at_ms))
        .collect();
    let started_ns = crate::trace::otlp::now_unix_ns();
    // Armed ahead: its message is read after the write, while the instant is still to come
    // (a read that fails is left to the send, which reads again).
    let prefetch = p
        .started
        .iter()
        .filter(|r| r.next_at_ms.is_some_and(|at| at > now))
        .find_map(|r| r.in_flight.map(|seq| (r.run, seq)));
    let change = p.change(inner.config.runs_max);
    commit::apply(inner, l, change).await?;
    export_fire_spans(inner, &l.id, trace_id, &fire_spans, started_ns, now);
    if let Some((run, seq)) = prefetch {
        read_ahead(inner, l, run, seq).await;
    }
    Ok(())
}

/// Since when the task's fires were watched: fires before this process started were nobody's
/// to watch (an outage), unless the task did not exist then. One created since is watched from
/// its own `watched_since_ms` (an `at` just past, within the grace, fires at once even at a
/// start).
fn watched_since(inner: &Inner, st: &super::LiveState) -> u64 {
    if st.spec.created_at_ms >= inner.boot_ms {
        st.progress.watched_since_ms
    } else {
        st.progress.watched_since_ms.max(inner.boot_ms)
    }
}

/// Reads run `run`'s message `seq` ahead of its send, unless `prefetch.rs` read it with the
/// task (off the workers when the store's reads can block). A read that fails is left to the
/// send, which reads again.
async fn read_ahead(inner: &Arc<Inner>, l: &mut Locked, run: u32, seq: u32) {
    let read = matches!(&l.st().prefetched, Some((r, s, _)) if (*r, *s) == (run, seq));
    if read {
        return;
    }
    let id = l.id.clone();
    let got = offload::read(inner, move |i| Ok(i.store.get_message(&id, seq)?)).await;
    if let Ok(Some(m)) = got {
        l.st().prefetched = Some((run, seq, m));
    }
}

/// The span of each run a fire started (only with `[telemetry] otlp_endpoint`): task, run,
/// how late the fire was handled.
fn export_fire_spans(
    inner: &Inner,
    task: &str,
    trace_id: [u8; 16],
    runs: &[(u32, u64)],
    started_ns: u64,
    now: u64,
) {
    let Some(t) = inner.channels.tracing().telemetry() else {
        return;
    };
    for (run, scheduled) in runs {
        let span = crate::trace::otlp::Span {
            trace_id,
            span_id: crate::trace::new_span_id(),
            parent: None,
            name: "fire".into(),
            kind: crate::trace::otlp::SpanKind::Internal,
            start_unix_ns: started_ns,
            end_unix_ns: crate::trace::otlp::now_unix_ns(),
            attrs: Vec::new(),
            error: None,
            links: Vec::new(),
        }
        .attr("herald.task.id", task)
        .attr("herald.run", *run)
        .attr("herald.scheduled_at", format_utc(*scheduled))
        .attr("herald.late_ms", now.saturating_sub(*scheduled));
        t.export(span);
    }
}

/// One step of run `key.run`: arm, or send and settle.
async fn run_step(inner: &Arc<Inner>, key: &RunKey) -> Result<(), EngineError> {
    let Some(l) = commit::lock(inner, &key.task).await? else {
        return Ok(()); // finished or cancelled: nothing to do
    };
    run_step_locked(inner, key, l).await
}

/// Runs [`run_step`] in a task of its own for a key whose cell the caller has locked already
/// (a chunk that cannot send it, `chunk.rs`). The cell was found at the chunk's start: if it
/// has left the live map since (cluster mode: its shard let go, and perhaps held again with a
/// new cell), it is let go and the step looks the task up anew, as [`run_step`] does; acted on,
/// its memory could be older than the disk, and a second cell could write the same task.
pub(super) fn spawn_locked(inner: &Arc<Inner>, key: RunKey, guard: StepGuard, l: Locked) {
    let inner = inner.clone();
    tokio::spawn(async move {
        let _guard = guard;
        let current = super::cells::is_current(&inner.live.lock(), &l);
        let done = if current {
            run_step_locked(&inner, &key, l).await
        } else {
            drop(l);
            run_step(&inner, &key).await
        };
        if let Err(e) = done {
            step_error(&inner, key.key(), &e);
        }
    });
}

async fn run_step_locked(
    inner: &Arc<Inner>,
    key: &RunKey,
    mut l: Locked,
) -> Result<(), EngineError> {
    // Each turn is one step; a settle whose next attempt is due at once goes round again with
    // the lock still held (`Next::Now`) instead of through the timer.
    loop {
        match run_step_once(inner, key, l).await? {
            Some(next) => l = next,
            None => return Ok(()),
        }
    }
}

/// One step of [`run_step_locked`]; `Some`: the run's next attempt is armed and due now, and
/// the lock is handed back to send it.
async fn run_step_once(
    inner: &Arc<Inner>,
    key: &RunKey,
    mut l: Locked,
) -> Result<Option<Locked>, EngineError> {
    if inner.releasing(&key.task) {
        // Cluster mode, the task's shard is being handed over: nothing is armed or sent here
        // now (an armed mark would be waited out by the next owner as a send in flight; one
        // armed before the handover began is taken back). The key comes back; once the shard
        // is released it is dropped here, and the next owner sends the message at its time.
        stand_down(inner, &mut l, key.run).await;
        l.release(inner);
        window_closed(inner, key.key());
        return Ok(None);
    }
    let prepared = match prepare(inner, &mut l, key).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            l.release(inner);
            return Ok(None);
        }
        Err(e) => return step_failed(inner, l, e).await.map(|()| None),
    };
    // ---- send, outside the lock: a slow receiver never blocks cancel or pause. The cell
    // stays loaded meanwhile (a sending run is never idle), and a cancel keeps the sending run
    // so its outcome is settled here even if the task left the live map.
    let window = match inner.send_window(&key.task) {
        super::cluster::Window::Closed => {
            // Cluster mode, too little of the shard's trust is left to send: the attempt
            // stays in flight on disk. If the trust runs out, the shard is dropped and its
            // next owner (this node again, or another) loads it and sends it (`cluster.rs`).
            // But a renewal answered late may extend the trust before it runs out: the shard
            // is never dropped then, nor loaded again, so the step must come back by itself.
            if let Some(c) = &prepared.channel {
                c.unsent(prepared.probe);
            }
            l.unload(key.run);
            l.release(inner);
            window_closed(inner, key.key());
            return Ok(None);
        }
        // Its end is read again once the send has a slot of the channel (`trust_end`).
        super::cluster::Window::Within(_, guard, epoch) => Some((guard, epoch)),
        super::cluster::Window::Unbounded => None,
    };
    // Taken under the lock, the task running: a cancel or pause from now on closes it before
    // its write, and no request of this send is written after that.
    let gate = SendGate::new(inner, &key.task);
    let cell = l.cell();
    // Until after the settle; taken before the lock goes, so a cancel answered meanwhile
    // never leaves a moment with no mark for a delete to slip into.
    let _out = inner.sends_out.mark(&key.task);
    l.release(inner);
    let _in_flight = SendInFlight::new(inner);
    let mut prepared = prepared;
    // Cluster mode: the send counts on its shard until its outcome is settled (or the step
    // ends without it), so that a handover waits for the settle before the shard's writes
    // stop being fenced at its epoch (`cluster/node.rs`, `hand_over`).
    let (_sending, epoch) = match window {
        None => (None, None),
        Some((sending, epoch)) => (Some(sending), Some(epoch)),
    };
    prepared.delivery.epoch = epoch;
    let (outcome, report) = send(inner, &prepared, &cell, key.run, gate.gate()).await;
    drop(gate);
    prepared.report = report;
    let mut l = match super::cells::relock(inner, &key.task, cell, key.run).await? {
        super::cells::Got::Ready(l) => l,
        super::cells::Got::Gone => return Ok(None),
        super::cells::Got::Park(l, reason) => {
            return Err(commit::park_loaded(inner, l, reason).await)
        }
    };
    match settle(inner, &mut l, key, prepared, outcome).await {
        Ok(Next::Now) => Ok(Some(l)),
        Ok(Next::Wheel) => {
            l.release(inner);
            Ok(None)
        }
        Err(e) => step_failed(inner, l, e).await.map(|()| None),
    }
}

/// A send, cut off where its trust ends (cluster mode: `trust`, the shard held at the send's
/// epoch). The end followed is the trust as renewals keep extending it, not the one the send
/// saw when it began: when the end comes, the shard's trust is read again for the same epoch
/// and the send goes on if it was extended (a receiver answering in 8.5 s at the default
/// 9 s window was cut off, and sent again with the same key by the same owner, although the
/// shard was held all along: a duplicate with no owner change). It is cut off only when the
/// trust really ended, or the shard was let go or held at another epoch (looked at each time
/// a shard is let go: by the lease loop as it drops or releases one, `node.rs::Loop::report`
/// and `Ownership::fenced`, not only when the engine unloads it). Trust is never longer
/// than the lease row the database holds (`cluster/lease.rs`), so a send that goes on never
/// overlaps a next owner's.
///
/// The end is looked at before the send is first polled (`biased`): a process paused between
/// the window check and here (SIGSTOP, a VM freeze) wakes with the window gone and sends
/// nothing, instead of sending once before the timeout fires. Cut off, nobody knows whether
/// it arrived, so it is retried (by this node if it still holds the shard, else by the next
/// owner, with the same idempotency key).
pub(super) async fn cut_off_at(
    trust: Option<Trust<'_>>,
    send: impl std::future::Future<Output = (Outcome, crate::deliver::AttemptReport)>,
) -> (Outcome, crate::deliver::AttemptReport) {
    let Some(mut trust) = trust else {
        return send.await;
    };
    let mut send = std::pin::pin!(send);
    loop {
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(trust.end) => {}
            () = let_go(&mut trust.let_go) => {}
            r = &mut send => return r,
        }
        if !trust.read_again() {
            let error = "cut off: this node's trust in the task's shard ended".into();
            let o = Outcome::Retry {
                error,
                not_before_ms: None,
            };
            return (o, Default::default());
        }
    }
}

/// Cluster mode: the trust a send that has its slot goes under ([`trust_end`]), followed
/// while it is under way ([`cut_off_at`]).
pub(super) struct Trust<'a> {
    inner: &'a Inner,
    task: &'a str,
    epoch: u64,
    /// Where the trust ends, as last read.
    end: tokio::time::Instant,
    /// Changes each time a shard is let go; taken before the window was read, so a drop
    /// after that read is never missed. `None`: nothing to watch any more.
    let_go: Option<tokio::sync::watch::Receiver<u64>>,
}

impl Trust<'_> {
    /// Reads the trust again: `true` if the shard is still held at the send's epoch with
    /// trust left (its end moved to where that trust ends now).
    fn read_again(&mut self) -> bool {
        match self.inner.trust_left(self.task, self.epoch) {
            Some(left) => {
                self.end = tokio::time::Instant::now() + left;
                true
            }
            None => false,
        }
    }
}

/// Ready when a shard is let go; pending for ever once nothing can be let go any more (the
/// lease loop's `Ownership` gone).
async fn let_go(rx: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(r) = rx.as_mut() {
        if r.changed().await.is_ok() {
            return;
        }
    }
    *rx = None;
    std::future::pending::<()>().await;
}

/// A step's error: storage errors pass (the step is tried again), anything else parks the task.
pub(super) async fn step_failed(
    inner: &Arc<Inner>,
    mut l: Locked,
    e: EngineError,
) -> Result<(), EngineError> {
    if is_retryable(&e) || !l.is_loaded() {
        l.release(inner);
        return Err(e);
    }
    let reason = e.to_string();
    let parked = commit::park(inner, &mut l, &reason).await;
    l.release(inner);
    parked?;
    Err(EngineError::Internal(reason))
}

/// What the send phase needs once the lock is released.
pub(super) struct Prepared {
    pub delivery: Delivery,
    pub channel: Option<Arc<crate::deliver::Channel>>,
    channel_name: String,
    policy: crate::model::RetryPolicy,
    pacing: crate::model::Pacing,
    pub probe: bool,
    /// Where the channel's rate limiter logged the admission's slot (`Admission::Go`).
    pub rate_tick: Option<u64>,
    /// What the send learnt for its timeline event (status, duration); set once it returns.
    pub report: crate::deliver::AttemptReport,
    /// The message's own zone (`Message::tz`, recipient time): a notification of its failure
    /// names its due time in it (`notify.rs`), and quiet hours read in it are asked again
    /// after a wait for a slot of the channel ([`quiet_after_wait`]).
    pub(super) tz: Option<String>,
    /// The task as the send was prepared: its quiet hours, asked again after a wait for a
    /// slot of the channel ([`quiet_after_wait`]). Shared, not copied.
    pub(super) spec: Arc<TaskSpec>,
    /// The monotonic reading taken with the run's pacing anchor (`last_attempt_at_ms`, a wall
    /// reading) when the send starts, moved with it after a wait for the channel's slot. The
    /// settle counts the gap from it ([`pacing_anchor`]): a wall jump during the send never
    /// shortens the gap. Read just after the wall: read late, it only lengthens the gap.
    /// Atomic: the wait (`slot`) has the `Prepared` shared.
    started_mono: AtomicU64,
}

impl Prepared {
    /// The send starts (again) at monotonic instant `mono`, read just after the wall's.
    pub(super) fn started_at(&mut self, mono: u64) {
        *self.started_mono.get_mut() = mono;
    }
}

/// Issue 26: the run's pacing anchor for a settle at (`now`, `mono_now`) of a send that started
/// at monotonic `started_mono`: the start moved into the current wall's frame, `now` less the
/// monotonic time since. Without a jump it is the wall reading taken at the start (to the
/// millisecond both clocks drift apart by); after a forward jump during the send, the stored
/// reading is from the old frame and would put the next send `jump` earlier than its gap
/// (at once when the jump outgrew the gap, the settle arming it due already).
pub(super) fn pacing_anchor(now: u64, mono_now: u64, started_mono: u64) -> u64 {
    now.saturating_sub(mono_now.saturating_sub(started_mono))
}

/// Arms the attempt (durably) if it is not armed yet, and prepares the send if it is due.
pub(super) async fn prepare(
    inner: &Arc<Inner>,
    l: &mut Locked,
    key: &RunKey,
) -> Result<Option<Prepared>, EngineError> {
    let st = l.st();
    if st.progress.state != TaskState::Running || st.sending.contains(&key.run) {
        return Ok(None); // paused, finished, or this run is sending right now
    }
    if draining(inner) {
        stand_down(inner, l, key.run).await;
        return Ok(None);
    }
    let Some(mut run) = st.runs.get(&key.run).cloned() else {
        return Ok(None);
    };
    let now = inner.clock.now_ms();
    if let Some(c) = plan::expire_after_event(&st.spec, &st.progress, &run, &st.runs, now)? {
        tracing::info!(task = %l.id, run = key.run, "reminder expired: its event began before it could go");
        commit::apply(inner, l, c).await?;
        return Ok(None);
    }
    let due = run.next_at_ms.unwrap_or(now);
    let arming = run.in_flight.is_none();
    if arming && !arm(inner, l, key, &mut run, due, now).await? {
        return Ok(None);
    }
    let (now, started_mono) = (inner.clock.now_ms(), inner.clock.mono_ms());
    // Issue 26: a due stored before a forward wall jump looks long past now, but it was one
    // pacing/backoff duration ahead on the monotonic clock; the wheel (timer.rs, its
    // continuity rule) keeps the send ARM_LEAD_MS after the arm just made, instead of sending
    // at once. (Once the wheel hands it back, the run is armed already: it is sent.)
    if due > now || (arming && due < inner.clock.wall_jumps().end_ms) {
        inner.timer.at(key.key(), due);
        return Ok(None);
    }
    if draining(inner) {
        // Armed just now, and a drain began: not sent, the mark taken back.
        stand_down(inner, l, key.run).await;
        return Ok(None);
    }
    let Some(seq) = run.in_flight else {
        return Ok(None);
    };
    let d = DueSend { key, seq, now };
    let msg = message_of(inner, l, &d).await?;
    let t = l.st().spec.clone();
    let channel = inner.channels.get(&t.channel).cloned();
    let Some(msg) = hold_for_time(inner, l, &d, &run, msg, channel.as_ref()).await? else {
        return Ok(None);
    };
    let Some((probe, rate_tick)) = admit(inner, l, &d, &run, channel.as_ref()).await else {
        // Held (rate limit, breaker): kept, so its look again at the hold's end reads no
        // store (`message_of`); a patch of the task's messages drops it (`commit.rs`).
        l.st().prefetched = Some((key.run, seq, msg));
        return Ok(None);
    };
    let tz = msg.tz.clone();
    let delivery = render(inner, &t, &d, &run, msg, due);
    let retry = t.retry.or(channel.as_ref().map(|c| c.retry));
    run.last_attempt_at_ms = Some(now);
    let prepared = Prepared {
        delivery,
        channel,
        channel_name: t.channel.clone(),
        policy: retry.unwrap_or_default(),
        pacing: t.pacing,
        probe,
        rate_tick,
        report: Default::default(),
        tz,
        spec: t,
        started_mono: AtomicU64::new(started_mono),
    };
    let st = l.st();
    st.runs.insert(key.run, run);
    st.sending.insert(key.run);
    Ok(Some(prepared))
}

/// The send being prepared: which run and message, and when.
struct DueSend<'a> {
    key: &'a RunKey,
    seq: u32,
    now: u64,
}

/// Arms the run's next attempt: its in-flight mark is durable before anything is sent.
/// `false`: not now (due later than the lead, on the wheel again; or nothing to attempt).
async fn arm(
    inner: &Arc<Inner>,
    l: &mut Locked,
    key: &RunKey,
    run: &mut crate::model::Run,
    due: u64,
    now: u64,
) -> Result<bool, EngineError> {
    if due > now + ARM_LEAD_MS {
        inner.timer.at(key.key(), due - ARM_LEAD_MS);
        return Ok(false);
    }
    if run.begin_attempt(now).is_none() {
        return Ok(false);
    }
    // Memory changes only once the mark is durable: a failed write sends nothing.
    let mut arm = Change {
        runs: vec![run.clone()],
        ..Change::default()
    };
    let resent = l.st().resent.contains(&key.run);
    if let (true, Some(seq)) = (resent, run.in_flight) {
        // Its message was in flight when the task was last read from disk: it goes again.
        arm.timeline
            .push(crate::model::TimelineEvent::resumed_after_restart(
                now,
                key.run,
                seq,
                run.attempts,
            ));
    }
    commit::apply(inner, l, arm).await?;
    if resent {
        l.st().resent.remove(&key.run);
    }
    Ok(true)
}

/// The attempt's message: the one read when the run was armed ahead if it is this attempt's,
/// else from the store. A cursor past the messages is a bug (the task is parked).
async fn message_of(
    inner: &Arc<Inner>,
    l: &mut Locked,
    d: &DueSend<'_>,
) -> Result<crate::model::Message, EngineError> {
    let (run, seq) = (d.key.run, d.seq);
    let st = l.st();
    let prefetched = match &st.prefetched {
        Some((r, s, _)) if *r == run && *s == seq => st.prefetched.take().map(|p| p.2),
        _ => None,
    };
    let msg = match prefetched {
        Some(m) => Some(m),
        None => {
            // Off the workers on PostgreSQL (`offload.rs`).
            let id = l.id.clone();
            offload::read(inner, move |i| Ok(i.store.get_message(&id, seq)?)).await?
        }
    };
    let st = l.st();
    match msg {
        Some(m) if seq < st.spec.message_count => Ok(m),
        _ => Err(EngineError::Internal(format!(
            "run {run} has cursor {seq} but the task has {} messages",
            st.spec.message_count
        ))),
    }
}

/// Issue 28: recipient time and quiet hours hold the send (still armed, nothing burned),
/// before the rate limit is asked, so a held send takes none of the channel's rate. Gives the
/// message back if it may go now; `None`: held (the message kept for when it may).
async fn hold_for_time(
    inner: &Arc<Inner>,
    l: &mut Locked,
    d: &DueSend<'_>,
    run: &crate::model::Run,
    msg: crate::model::Message,
    channel: Option<&Arc<crate::deliver::Channel>>,
) -> Result<Option<crate::model::Message>, EngineError> {
    let (key, seq, now) = (d.key, d.seq, d.now);
    let quiet = channel.and_then(|c| c.quiet_hours.as_ref());
    let st = l.st();
    match plan::hold(
        &st.spec,
        &msg,
        (run.scheduled_at_ms, run.slot_wall_ms),
        quiet,
        now,
    ) {
        Some(plan::Hold::Recipient(at)) => {
            // Waits for its own instant: memory only (a reload holds it again). A wall instant
            // (the recipient's 09:00), unguarded: a wall step moves it with the wall.
            st.prefetched = Some((key.run, seq, msg));
            inner.timer.at_wall(key.key(), at);
            Ok(None)
        }
        Some(plan::Hold::Quiet(until)) => {
            tracing::debug!(task = %st.spec.id, run = key.run, seq, until = %format_utc(until), "send held for quiet hours");
            // Written (still armed), so the run's eta counts from the window's end and a
            // restart in the night gives the attempt back instead of sending it.
            let mut held = run.clone();
            held.next_at_ms = Some(until);
            // On the timeline as API.md says ("a `held` event says until when"), in the same
            // write. Written once per hold: the run's `next_at` is the window's end, so the
            // step comes back only then (`prepare`), not at each early wake.
            let why = crate::model::timeline::HeldWhy::QuietHours;
            let c = Change {
                runs: vec![held],
                wheel: vec![WheelOp::Step(key.run)],
                timeline: vec![crate::model::TimelineEvent::held(
                    now, key.run, seq, until, why,
                )],
                ..Change::default()
            };
            commit::apply(inner, l, c).await?;
            // The window's end is a wall instant: armed again, unguarded (`Timer::at_wall`).
            inner.timer.at_wall(key.key(), until);
            l.st().prefetched = Some((key.run, seq, msg));
            Ok(None)
        }
        None => Ok(Some(msg)),
    }
}

/// Rate limit and breaker: a send that may not go now waits on the wheel, still armed;
/// nothing is failed and no attempt is burned. `Some((probe, rate_tick))`: it goes (as the
/// breaker's probe or not; its rate slot logged at `rate_tick`); `None`: held.
async fn admit(
    inner: &Arc<Inner>,
    l: &mut Locked,
    d: &DueSend<'_>,
    run: &crate::model::Run,
    channel: Option<&Arc<crate::deliver::Channel>>,
) -> Option<(bool, Option<u64>)> {
    let (key, seq, now) = (d.key, d.seq, d.now);
    match channel.map(|c| c.admit(now)) {
        Some(Admission::Hold { until_ms, breaker }) => {
            tracing::debug!(task = %l.id, run = key.run, seq, until = %format_utc(until_ms), breaker, "send held");
            let wake = spread_wake(inner, &format!("{}:{}:{seq}", l.id, key.run), now, until_ms);
            inner.timer.at(key.key(), wake);
            // The hold on the timeline: its own write (nothing else is written for it), and
            // a failure of it changes nothing (memory is untouched; the send goes at until).
            let why = if breaker {
                crate::model::timeline::HeldWhy::Breaker
            } else {
                crate::model::timeline::HeldWhy::RateLimit
            };
            let attempt = run.attempts;
            if l.st().held_noted.get(&key.run) != Some(&(seq, attempt)) {
                let held = Change {
                    timeline: vec![crate::model::TimelineEvent::held(
                        now, key.run, seq, until_ms, why,
                    )],
                    ..Change::default()
                };
                match commit::apply(inner, l, held).await {
                    Ok(()) => {
                        l.st().held_noted.insert(key.run, (seq, attempt));
                    }
                    Err(e) => {
                        tracing::debug!(task = %l.id, error = %e, "the hold's timeline event was not written")
                    }
                }
            }
            None
        }
        Some(Admission::Go { probe, rate_tick }) => Some((probe, rate_tick)),
        None => Some((false, None)),
    }
}

/// The attempt as the channel sends it; observes how late it goes.
fn render(
    inner: &Arc<Inner>,
    t: &TaskSpec,
    d: &DueSend<'_>,
    run: &crate::model::Run,
    msg: crate::model::Message,
    due: u64,
) -> Delivery {
    // The schedule's instant for the run's first message, however late herald got to it;
    // for the rest, the instant pacing (or a retry) planned it for. In recipient time a
    // message is due no earlier than its own instant, which the run's plan does not carry
    // (it waited for it, `plan::hold`): counted from the run's, a later zone's message read
    // hours late.
    let planned = if d.seq == 0 { run.scheduled_at_ms } else { due };
    let fire = (run.scheduled_at_ms, run.slot_wall_ms);
    let scheduled = plan::due_no_earlier_than_own(t, msg.tz.as_deref(), fire, planned);
    inner
        .lateness
        .observe(d.now.saturating_sub(scheduled) as f64 / 1000.0);
    super::render::delivery(
        t,
        msg,
        &super::render::Attempt {
            run: d.key.run,
            seq: d.seq,
            attempt: run.attempts,
            due_ms: scheduled,
            run_at_ms: run.scheduled_at_ms,
            now_ms: d.now,
        },
    )
}

async fn send(
    inner: &Arc<Inner>,
    p: &Prepared,
    cell: &super::LiveTask,
    run: u32,
    gate: Arc<Gate>,
) -> (Outcome, crate::deliver::AttemptReport) {
    let d = &p.delivery;
    tracing::debug!(task = %d.task_id, run = d.run, seq = d.seq, attempt = d.attempt, "attempt");
    let Some(c) = &p.channel else {
        let o = Outcome::Permanent {
            error: format!("channel {:?} is no longer configured", p.channel_name),
        };
        return (o, Default::default());
    };
    let slot = match slot(inner, c, p, cell, run).await {
        Ok(s) => s,
        Err(o) => {
            c.unsent(p.probe);
            return (o, Default::default());
        }
    };
    send_in_slot(inner, c, d, slot, p.probe, gate).await
}

/// A send that has its slot of the channel (`waited`: it had to wait for it), a run's or a
/// failure-list retry's: cluster mode's trust is read again now (`trust_end`), the task's
/// `gate` looked at, and the send, cut off where the trust ends, is recorded on the channel.
/// A send that does not go (no trust, its gate closed) or is cut off is not recorded and
/// gives back the breaker's probe it carried.
pub(super) async fn send_in_slot<'c>(
    inner: &Arc<Inner>,
    c: &'c crate::deliver::Channel,
    d: &Delivery,
    (permit, waited): (tokio::sync::SemaphorePermit<'c>, bool),
    probe: bool,
    gate: Arc<Gate>,
) -> (Outcome, crate::deliver::AttemptReport) {
    let trust = match trust_end(inner, &d.task_id, d.epoch) {
        Ok(trust) => trust,
        Err(o) => {
            c.unsent(probe);
            return (o, Default::default());
        }
    };
    if gate.is_closed() {
        c.unsent(probe);
        return (Gate::stopped(inner.clock.now_ms()), Default::default());
    }
    let send = async {
        // Cut off where the cluster's trust ends (`cut_off_at`), this future is dropped
        // before it records: `unrecorded` gives back a breaker probe it carried then.
        let mut unrecorded = Unrecorded(c, probe);
        let (o, report) = c
            .send_with(d, permit, waited, || inner.clock.now_ms())
            .await;
        if matches!(
            o,
            Outcome::Held {
                why: HeldWhy::Stopped,
                ..
            }
        ) {
            // Its gate closed before a request was written: nothing went (nor is counted).
            return (o, Default::default());
        }
        unrecorded.1 = false;
        // With its report: a permanent failure that never reached the receiver (a template
        // or encoding error) tells the breaker nothing.
        if let Some(tr) = c.record_attempt(inner.clock.now_ms(), &o, &report, probe) {
            alerts::breaker(inner, &c.name, tr);
        }
        (o, report)
    };
    cut_off_at(trust, gated(gate, send)).await
}

/// Cluster mode (`epoch`: the send goes under the shard's epoch), the trust a send that has
/// its slot may use: the window is read again here, after any wait for the slot, so a send
/// starts only with enough trust left (HA.md: at least `safety`) on the shard still held at
/// that epoch, and its wait is not cut off. From here on the trust is followed as renewals
/// extend it ([`cut_off_at`]). `Err`: it does not start; held (no attempt counted), back
/// when the window may be open again.
pub(super) fn trust_end<'a>(
    inner: &'a Inner,
    task: &'a str,
    epoch: Option<u64>,
) -> Result<Option<Trust<'a>>, Outcome> {
    let Some(epoch) = epoch else {
        return Ok(None);
    };
    // Before the window is read: a shard let go after the read wakes the send.
    let let_go = inner.watch_let_go();
    // The guard counting the send on its shard is the caller's, taken with the first read.
    match inner.send_window(task) {
        super::cluster::Window::Within(d, _, e) if e == epoch => Ok(Some(Trust {
            inner,
            task,
            epoch,
            end: tokio::time::Instant::now() + d,
            let_go,
        })),
        _ => Err(Outcome::Held {
            error: "not sent: too little of this node's trust in the task's shard was left once the send had a slot of the channel".into(),
            until_ms: inner.clock.now_ms().saturating_add(WINDOW_RETRY_MS),
            why: HeldWhy::Stopped,
        }),
    }
}

/// An admitted send not recorded on its channel, and whether it carries the breaker's probe.
struct Unrecorded<'c>(&'c crate::deliver::Channel, bool);

impl Drop for Unrecorded<'_> {
    fn drop(&mut self) {
        self.0.unsent(self.1);
    }
}

/// A slot of the channel's concurrency for run `run`'s send (`true`: it had to wait for it).
///
/// The send was admitted before any wait, and the cell's lock was let go: a cancel or a pause
/// may have been answered meanwhile (nothing may go after that), the breaker may have opened,
/// and the pacing and the rate limit reckoned from the admission. So after a wait the task is
/// looked at again, the breaker asked again (a send admitted before it opened does not go to
/// the dead receiver, unless it is the probe), the rate slot is taken again and the run's
/// pacing anchor moves to now: the interval and the rate count from when sends start, not
/// from when a busy channel let them in. Never waits for the task's lock while it holds a
/// slot: a chunk holds its tasks' locks while it waits for slots of the same channel
/// (`chunk.rs`), and each would wait for the other for good.
/// `Err`: not sent, held with the same attempt number (a cancelled run ends with it, a paused
/// one sends on resume, a rate-limited or breaker-held one at the instant named).
async fn slot<'c>(
    inner: &Arc<Inner>,
    c: &'c crate::deliver::Channel,
    p: &Prepared,
    cell: &super::LiveTask,
    run: u32,
) -> Result<(tokio::sync::SemaphorePermit<'c>, bool), Outcome> {
    let closed = || crate::deliver::Channel::closed().0;
    let (mut permit, waited) = c.permit().await.ok_or_else(closed)?;
    if !waited {
        return Ok((permit, false));
    }
    loop {
        if draining(inner) {
            return Err(drain_held(inner));
        }
        let Ok(mut g) = cell.try_lock() else {
            drop(permit);
            if !wants_send(&mut *cell.lock().await, run, None) {
                return Err(stopped(inner));
            }
            permit = c.permit().await.ok_or_else(closed)?.0;
            continue;
        };
        let (now, mono) = (inner.clock.now_ms(), inner.clock.mono_ms());
        if !wants_send(&mut g, run, Some(now)) {
            return Err(stopped(inner));
        }
        // The anchor moved to `now`: its monotonic twin with it.
        p.started_mono.store(mono, Ordering::Relaxed);
        let admitted = (p.probe, p.rate_tick, p.delivery.idempotency_key.as_str());
        let quiet = (&*p.spec, p.tz.as_deref());
        return readmit(inner, c, admitted, quiet, now).map(|()| (permit, true));
    }
}

/// A send that waited for a free slot of its channel while a drain began: no send starts
/// after the drain began. Held: its settle arms nothing during a drain (and takes back a mark
/// armed as the drain began, `stand_down`), so the next boot sends it as planned, not as a
/// send cut short.
pub(super) fn drain_held(inner: &Inner) -> Outcome {
    Outcome::Held {
        error: "not sent: herald began to shut down while the send waited for a free slot of the channel".into(),
        until_ms: inner.clock.now_ms(),
        why: HeldWhy::Stopped,
    }
}

/// A send admitted earlier ([`admit`]) that waited for a free slot of channel `c`, asked
/// again at `now`: quiet hours ([`quiet_after_wait`]: a window begun during the wait holds it
/// to the window's end), the breaker (a send admitted before it opened does not go to the dead
/// receiver, unless it is the probe) and the rate limit (its slot taken again, counted from
/// when the send starts). `Err`: held, no attempt burned, back at the window's end, or at an
/// instant spread a little past the one named ([`spread_wake`]: the sends held together by a
/// breaker or a rate limit do not all come back at once).
/// `(probe, rate_tick, key)`: the admission's ([`Prepared`]) and the send's idempotency key;
/// `quiet`: the task and the message's zone ([`Prepared`]).
pub(super) fn readmit(
    inner: &Inner,
    c: &crate::deliver::Channel,
    (probe, rate_tick, key): (bool, Option<u64>, &str),
    quiet: (&TaskSpec, Option<&str>),
    now: u64,
) -> Result<(), Outcome> {
    quiet_after_wait(c, rate_tick, quiet, now)?;
    if let Err(until_ms) = c.recheck(now, probe) {
        return Err(breaker_held(spread_wake(inner, key, now, until_ms)));
    }
    c.retake_rate(rate_tick, now)
        .map_err(|until_ms| Outcome::Held {
            error: "not sent yet: the channel's rate limit, counted when the send could start"
                .into(),
            until_ms: spread_wake(inner, key, now, until_ms),
            why: HeldWhy::RateLimit,
        })
}

/// Quiet hours asked again at `now` for a send that was admitted outside them and then waited
/// for a free slot of channel `c` (its task `spec`, its message's zone `tz`): the window may
/// have begun during the wait (admitted at 21:59:59, a slot at 22:00:05). Inside it, the send
/// is held to the window's end as one found inside it before its admission is
/// (`hold_for_time`, the same decision: `plan::quiet_until`): no attempt burned, a `held`
/// event (why `quiet_hours`) written by its settle, its step back at that wall instant
/// ([`WheelOp::StepAtWall`]); the rate slot its admission took (`rate_tick`) is given back, as
/// nothing went. Asked first, before the breaker and the rate limit, as before an admission.
pub(super) fn quiet_after_wait(
    c: &crate::deliver::Channel,
    rate_tick: Option<u64>,
    (spec, tz): (&TaskSpec, Option<&str>),
    now: u64,
) -> Result<(), Outcome> {
    let Some(until_ms) = plan::quiet_until(spec, tz, c.quiet_hours.as_ref(), now) else {
        return Ok(());
    };
    c.give_back_rate(rate_tick);
    Err(Outcome::Held {
        error:
            "not sent yet: quiet hours began while the send waited for a free slot of the channel"
                .into(),
        until_ms,
        why: HeldWhy::QuietHours,
    })
}

/// When a send held at `now` until `until_ms` (a breaker, a rate limit) looks again: a little
/// after `until_ms`, by a jitter of its own (`key`) within a quarter of the hold and at most
/// [`backoff::HOLD_SPREAD_MAX_MS`]. Sends held by one breaker or one rate limit are held to
/// one instant: without the jitter they all wake together, each to lock its task and be held
/// again but one.
pub(super) fn spread_wake(inner: &Inner, key: &str, now: u64, until_ms: u64) -> u64 {
    backoff::hold_wake_ms(now, until_ms, inner.config.jitter_seed, key)
}

/// A send that waited for its slot while the channel's breaker opened (it was admitted
/// before): held until the breaker may let sends through again, no attempt burned.
pub(super) fn breaker_held(until_ms: u64) -> Outcome {
    Outcome::Held {
        error: "not sent yet: the channel's breaker opened while the send waited for a free slot"
            .into(),
        until_ms,
        why: HeldWhy::Breaker,
    }
}

fn stopped(inner: &Inner) -> Outcome {
    Outcome::Held {
        error: "not sent: the task was cancelled or paused while its send waited for a free slot of the channel".into(),
        until_ms: inner.clock.now_ms(),
        why: crate::model::timeline::HeldWhy::Stopped,
    }
}

/// Whether run `run` of the task in `slot` still wants its send: the task running and the run
/// not cancelled. A cell unloaded meanwhile (a failed write) cannot tell; the send goes, as it
/// would have without the wait, and the settle reads the store. `start`: the send starts now,
/// the run's pacing anchor moves there.
fn wants_send(slot: &mut super::Slot, run: u32, start: Option<u64>) -> bool {
    let st = match slot {
        super::Slot::Loaded(st) => st,
        super::Slot::Unloaded(_) => return true,
    };
    let wants = st.progress.state == TaskState::Running
        && st
            .runs
            .get(&run)
            .is_some_and(|r| r.state == crate::model::RunState::Running);
    if let (true, Some(at), Some(r)) = (wants, start, st.runs.get_mut(&run)) {
        r.last_attempt_at_ms = Some(at);
    }
    wants
}

/// Counts an admitted send's outcome on its channel (and its breaker, alerting on a change).
pub(super) fn record(inner: &Arc<Inner>, c: &crate::deliver::Channel, o: &Outcome, probe: bool) {
    if let Some(tr) = c.record(inner.clock.now_ms(), o, probe) {
        alerts::breaker(inner, &c.name, tr);
    }
}

/// Where a run goes after its settle.
enum Next {
    /// Its next step (if any) is on the wheel.
    Wheel,
    /// Its next attempt is armed by the settle's own write and due already: the caller sends
    /// it at once, the lock still held. An unpaced sequence then goes message after message
    /// without a round trip through the timer thread (two thread hand-offs and a task spawn
    /// per message).
    Now,
}

/// Settles the attempt under the lock: plan, then `commit` (write, memory, wheel).
async fn settle(
    inner: &Arc<Inner>,
    l: &mut Locked,
    key: &RunKey,
    p: Prepared,
    outcome: Outcome,
) -> Result<Next, EngineError> {
    let Some(mut change) = settle_plan(inner, l, key, &p, &outcome)? else {
        return Ok(Next::Wheel);
    };
    let next = take_step_due_now(&mut change, l, key.run, inner.clock.now_ms());
    if let Err(e) = commit::apply(inner, l, change).await {
        commit::lost(inner, l, key, &e);
        return Err(e.into());
    }
    if standing_down(inner, &l.id) {
        // The drain or the handover began while this settle was planned or written: an
        // attempt it armed is not sent. Taken back here, while the send still counts on its
        // shard (so a handover waits for this write too).
        stand_down(inner, l, key.run).await;
        if matches!(next, Next::Now) {
            // Its step was taken off the change: it comes back, and finds the drain or the
            // handover.
            window_closed(inner, key.key());
            return Ok(Next::Wheel);
        }
    }
    Ok(next)
}

/// No send starts on the task here now: the process drains, or the task's shard is being
/// handed over.
fn standing_down(inner: &Inner, task: &str) -> bool {
    draining(inner) || inner.releasing(task)
}

/// [`standing_down`]: run `run`'s attempt, if it is armed here and not sending (by a settle
/// written as the drain or the handover began, or ahead of its instant), is not sent now. Its
/// mark is taken back in a write of its own, so that the next boot, or the next owner, finds
/// the message pending and sends it at its time as its next attempt. Left armed, it reads as a
/// send cut short: sent as one attempt more with `resumed_after_restart`, or (cluster mode)
/// waited out as a send of ours still under way, for the channel's send timeout and twice the
/// clock offset. A failed write leaves the mark, with those consequences only.
async fn stand_down(inner: &Arc<Inner>, l: &mut Locked, run: u32) {
    let st = l.st();
    if st.sending.contains(&run) {
        return;
    }
    let Some(mut r) = st.runs.get(&run).filter(|r| r.in_flight.is_some()).cloned() else {
        return;
    };
    r.disarm();
    let c = Change {
        runs: vec![r],
        ..Change::default()
    };
    if let Err(e) = commit::apply(inner, l, c).await {
        tracing::debug!(task = %l.id, run, error = %e, "an armed attempt not sent was not taken back");
    }
}

/// Tasks whose armed attempts one write of [`stand_down_all`] takes back.
const STAND_DOWN_GROUP: usize = 256;

/// A drain, once the steps under way are over (or its time is up), or a graceful handover of
/// shards in cluster mode, once their sends settled and before their rows are freed: every
/// attempt armed here whose send has not started — armed ahead of its instant (100 ms before
/// a send, 2 s or more before a one-shot's) before the drain or the handover began, whose
/// step is now dropped or stood down — is taken back ([`stand_down`]'s reason), durably, in
/// writes of up to [`STAND_DOWN_GROUP`] tasks, before the process exits or the shard's row is
/// freed. Left armed, the next boot (past the instant) or the next owner of the shard would
/// read it as a send cut short. A cell not free before `until`
/// (its step still under way), one unloaded, a send out, and a failed write keep their marks,
/// with those consequences only. Returns how many tasks had marks taken back.
///
/// Every free cell is taken first; the busy ones are waited for after, one at a time, with
/// nothing collected held meanwhile (the pending write goes first), and one still busy at
/// `until` is passed over, not the ones after it (`timeout_at` polls the lock first, so a
/// free cell is taken even past `until`).
///
/// Only the tasks `which` picks (the drain: every one; a graceful handover in cluster mode:
/// those of the shards handed over, `cluster.rs::stand_down_on_release`).
pub(super) async fn stand_down_all(
    inner: &Arc<Inner>,
    until: tokio::time::Instant,
    which: impl Fn(&str) -> bool,
) -> usize {
    let mut cells = inner.live.lock().cells();
    cells.retain(|(id, _)| which(id));
    // In shard order (cluster mode), so that each write holds one shard's tasks.
    cells.sort_by_cached_key(|(id, _)| inner.shard_of(id).map(|(_, s)| s));
    let mut writes = StandDown {
        inner,
        group: Vec::new(),
        shard: None,
        taken: 0,
    };
    let mut busy = Vec::new();
    for (id, cell) in cells {
        match cell.clone().try_lock_owned() {
            Ok(guard) => writes.add(Locked { id, guard }).await,
            Err(_) => busy.push((id, cell)),
        }
    }
    for (id, cell) in busy {
        let guard = match cell.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                writes.flush().await;
                let Ok(guard) = tokio::time::timeout_at(until, cell.lock_owned()).await else {
                    continue;
                };
                guard
            }
        };
        writes.add(Locked { id, guard }).await;
    }
    writes.flush().await;
    writes.taken
}

/// The writes of [`stand_down_all`]: the tasks collected (their cells locked) for the next.
struct StandDown<'a> {
    inner: &'a Arc<Inner>,
    group: Vec<(Locked, RunKey, Change)>,
    /// The shard of the group's tasks (`None` outside cluster mode).
    shard: Option<u32>,
    taken: usize,
}

impl StandDown<'_> {
    /// Adds `l`'s armed attempts not sending, if it has any, to the group; writes the group
    /// first if `l` cannot join it ([`starts_new_group`]), and after if it is full.
    async fn add(&mut self, mut l: Locked) {
        let current = super::cells::is_current(&self.inner.live.lock(), &l);
        let Some((key, change)) = current.then(|| armed_not_sending(&mut l)).flatten() else {
            return;
        };
        let shard = self.inner.shard_of(&l.id).map(|(_, s)| s);
        if starts_new_group(self.group.len(), self.shard, shard) {
            self.flush().await;
        }
        self.shard = shard;
        self.group.push((l, key, change));
        if self.group.len() >= STAND_DOWN_GROUP {
            self.flush().await;
        }
    }

    /// Writes the group collected, if any, and frees its cells.
    async fn flush(&mut self) {
        if self.group.is_empty() {
            return;
        }
        self.taken += self.group.len();
        commit::apply_chunk(self.inner, std::mem::take(&mut self.group), None).await;
    }
}

/// Whether a task of `shard` must go in a new write after a group of `len` tasks of
/// `group_shard`: the group is full, or (cluster mode) of another shard. One write is one job
/// fenced at every shard it touches (`job_fence`): mixed, one shard that lost trust had the
/// whole write refused, and every task in it kept its mark.
fn starts_new_group(len: usize, group_shard: Option<u32>, shard: Option<u32>) -> bool {
    len > 0 && (len >= STAND_DOWN_GROUP || group_shard != shard)
}

/// The change that takes back the armed attempts of `l`'s runs that are not sending (`None`:
/// it has none, or it is not loaded).
fn armed_not_sending(l: &mut Locked) -> Option<(RunKey, Change)> {
    if !l.is_loaded() {
        return None;
    }
    let st = l.st();
    let runs: Vec<crate::model::Run> = st
        .runs
        .values()
        .filter(|r| r.in_flight.is_some() && !st.sending.contains(&r.run))
        .map(|r| {
            let mut r = r.clone();
            r.disarm();
            r
        })
        .collect();
    let key = RunKey {
        task: l.id.clone(),
        run: runs.first()?.run,
    };
    let c = Change {
        runs,
        ..Change::default()
    };
    Some((key, c))
}

/// [`Next::Now`] if `c` keeps run `run` running with an attempt armed and due by `now`: its
/// wheel step is taken out of `c` (the caller takes the step itself, so the run is never both
/// on the wheel and sending). Anything else stays as planned.
fn take_step_due_now(c: &mut Change, l: &mut Locked, run: u32, now: u64) -> Next {
    let running = c.progress.as_ref().unwrap_or(&l.st().progress).state == TaskState::Running;
    let due_now = c.runs.iter().any(|r| {
        r.run == run
            && r.state == crate::model::RunState::Running
            && !r.is_done()
            && r.in_flight.is_some()
            && r.next_at_ms.is_some_and(|at| at <= now)
    });
    let step = c.wheel.iter().position(|op| *op == WheelOp::Step(run));
    match step {
        Some(i) if running && due_now => {
            c.wheel.remove(i);
            Next::Now
        }
        _ => Next::Wheel,
    }
}

/// The settle's decision as a change; memory is untouched but for the run no longer sending.
/// `None`: the run is gone (nothing to settle).
pub(super) fn settle_plan(
    inner: &Arc<Inner>,
    l: &mut Locked,
    key: &RunKey,
    p: &Prepared,
    outcome: &Outcome,
) -> Result<Option<Change>, EngineError> {
    let st = l.st();
    st.sending.remove(&key.run);
    let (now, mono_now) = (inner.clock.now_ms(), inner.clock.mono_ms());
    let Some(mut run) = st.runs.get(&key.run).cloned() else {
        return Ok(None);
    };
    let stored_anchor = run.last_attempt_at_ms;
    // Paced from the start as the monotonic clock measured it (issue 26), not from a wall
    // reading a jump during the send left in another frame.
    run.last_attempt_at_ms = Some(pacing_anchor(
        now,
        mono_now,
        p.started_mono.load(Ordering::Relaxed),
    ));
    let delay = backoff::retry_delay_ms(
        &p.policy,
        run.attempts,
        inner.config.jitter_seed,
        &p.delivery.idempotency_key,
    );
    // Draining or handing the shard over, no send starts here: the next attempt is left
    // pending, not armed (`plan::settle`). A drain or handover that begins after this look
    // finds it armed by this write, and takes it back ([`stand_down`]).
    let arm = !standing_down(inner, &l.id);
    let st = l.st();
    let mut plan = plan::settle(
        &st.spec,
        &st.progress,
        &run,
        plan::earliest_slot(st.runs.values().filter(|r| r.run != run.run)),
        Attempt {
            outcome: outcome.clone(),
            max_attempts: p.policy.max_attempts,
            retry_delay_ms: delay,
            pacing: p.pacing,
            to: &p.delivery.to,
            channel: &p.channel_name,
        },
        now,
        arm.then_some(ARM_LEAD_MS),
    )?;
    if plan.run.in_flight.is_none() {
        // No next attempt armed (that would have set its own): the stored anchor stays the
        // wall reading the send started at, as the delivery's timestamp and the views had it.
        plan.run.last_attempt_at_ms = stored_anchor;
    }
    log_outcome(&p.delivery, outcome, &plan);
    if plan.finished {
        tracing::info!(task = %l.id, run = key.run, sent = plan.run.sent, failed = plan.run.failed,
            "run finished");
    }
    if let Some(r) = &plan.next_run {
        tracing::info!(task = %l.id, run = r.run, "queued run started");
    }
    let mut timeline = plan::settle_events(
        &plan,
        p.delivery.seq,
        p.delivery.attempt,
        outcome,
        p.report.status,
        p.report.duration_ms,
        now,
    );
    if let Some(r) = &plan.next_run {
        timeline.extend(plan::fire_events(&[], std::slice::from_ref(r)));
    }
    let mut change = quiet_step_at_wall(plan.change(), key.run, outcome);
    change.timeline = timeline;
    list_failure(inner, &mut change, p);
    Ok(Some(change))
}

/// The message a settle gave up on is listed if the failure list has room, with what its
/// notification names (`notify.rs`): its zone, and the instant its attempt was planned for,
/// as its delivery said (`render`: the run's instant for its first message, the pacing's
/// for a later one).
fn list_failure(inner: &Arc<Inner>, change: &mut Change, p: &Prepared) {
    if let Some(f) = &change.failure {
        if !commit::failure_list_has_room(inner, f) {
            change.failure = None;
        }
    }
    if change.failure.is_some() {
        change.failure_tz = p.tz.clone();
        change.failure_due_ms = Some(p.delivery.scheduled_at_ms);
    }
}

/// A send held for quiet hours after its wait for a slot ([`quiet_after_wait`]) comes back at
/// the window's end, a wall instant: its step is held to the wall alone, as `hold_for_time`
/// arms a hold found before the admission (a wall step in the night keeps 08:00 at 08:00).
fn quiet_step_at_wall(mut change: Change, run: u32, outcome: &Outcome) -> Change {
    if let Outcome::Held {
        why: HeldWhy::QuietHours,
        ..
    } = outcome
    {
        for op in &mut change.wheel {
            if *op == WheelOp::Step(run) {
                *op = WheelOp::StepAtWall(run);
            }
        }
    }
    change
}

fn log_outcome(d: &Delivery, outcome: &Outcome, plan: &plan::SettlePlan) {
    // The delivery's own: a task made before traces derives its id with a SHA-256, once, at
    // render.
    let trace_id = crate::model::timeline::Hex(&d.trace_id);
    match outcome {
        Outcome::Sent => {
            tracing::info!(task = %d.task_id, run = d.run, seq = d.seq, attempt = d.attempt, %trace_id, "sent")
        }
        // `Held` (local resource shortage) settles like a retry that burned no attempt.
        Outcome::Retry { error, .. }
        | Outcome::Permanent { error }
        | Outcome::Held { error, .. } => {
            if let Some(f) = &plan.failure {
                tracing::warn!(task = %d.task_id, run = d.run, seq = d.seq, attempts = f.attempts,
                    error = %Escaped(error), failure = %d.idempotency_key, %trace_id, "gave up: message moved to the failure list");
            } else {
                tracing::info!(task = %d.task_id, run = d.run, seq = d.seq, attempt = d.attempt,
                    error = %Escaped(error), next_at = %crate::schedule::format_opt(plan.run.next_at_ms), %trace_id, "attempt failed; will retry");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacing_anchor_is_the_start_in_the_wall_frame_of_the_settle() {
        // Sent at wall 1 000 (monotonic 500), settled 300 ms later: no jump, the same reading.
        assert_eq!(pacing_anchor(1_300, 800, 500), 1_000);
        // The wall jumped 10 s forward during the send: the start moves with the wall, so the
        // gap counted from it is the monotonic one.
        assert_eq!(pacing_anchor(11_300, 800, 500), 11_000);
        // Readings out of order never underflow.
        assert_eq!(pacing_anchor(100, 400, 900), 100);
        assert_eq!(pacing_anchor(100, 9_000, 0), 0);
    }

    #[test]
    fn a_stand_down_write_holds_one_shard_and_at_most_a_group() {
        // The first task starts the first group, whatever its shard.
        assert!(!starts_new_group(0, None, Some(3)));
        assert!(!starts_new_group(0, Some(1), Some(3)));
        // Same shard (or no shards: not in cluster mode): joins until the group is full.
        assert!(!starts_new_group(1, Some(3), Some(3)));
        assert!(!starts_new_group(STAND_DOWN_GROUP - 1, None, None));
        assert!(starts_new_group(STAND_DOWN_GROUP, None, None));
        assert!(starts_new_group(STAND_DOWN_GROUP, Some(3), Some(3)));
        // Another shard: a write of its own, so one shard that lost trust has only its own
        // tasks' write refused by the fence.
        assert!(starts_new_group(1, Some(3), Some(4)));
        assert!(starts_new_group(1, Some(3), None));
    }

    /// Whether a cell holds an attempt armed and not sending.
    fn armed(slot: &super::super::Slot) -> bool {
        match slot {
            super::super::Slot::Loaded(st) => st.runs.values().any(|r| r.in_flight.is_some()),
            super::super::Slot::Unloaded(_) => false,
        }
    }

    /// A real engine (manual clock, sled in `dir`, a file channel) with `n` one-shots due at
    /// `t0 + 10 s`, run to `t0 + 9 s`: each one's fire has armed its attempt, 2 s ahead.
    async fn armed_one_shots(dir: &std::path::Path, t0: u64, n: usize) -> super::super::Engine {
        let config = crate::config::Config::from_toml(
            &format!(
                "[channels.out]\nkind = \"file\"\npath = \"{}\"\n",
                dir.join("out.jsonl").display()
            ),
            crate::config::Overrides {
                listen: Some("127.0.0.1:0".into()),
                data_dir: Some(dir.join("data")),
                token: None,
            },
        )
        .unwrap();
        let clock = Arc::new(crate::clock::ManualClock::new(t0));
        let engine = super::super::Engine::start(
            crate::store::Store::open(&dir.join("data")).unwrap(),
            crate::server::build_channels(&config).unwrap(),
            clock.clone(),
            super::super::EngineConfig::default(),
        )
        .await
        .unwrap();
        let at = format_utc(t0 + 10_000);
        for i in 0..n {
            let req = serde_json::from_value(serde_json::json!({"id": format!("t{i}"),
                "channel": "out", "schedule": {"at": at}, "to": ["a"], "body": "x"}))
            .unwrap();
            engine.create(req, None).await.unwrap();
        }
        while let Some(d) = engine.idle().await.filter(|d| *d <= t0 + 9_000) {
            clock.set(d);
            engine.wake();
        }
        engine
    }

    /// Review gap: a cell busy at the stand-down is passed over, not the ones after it. The
    /// first cell in the stand-down's order is held past `until` (left armed); the last is busy
    /// in the first pass and freed while the second pass waits for the first: it is taken back
    /// once freed, as every free one between them is. A `break` at a busy cell (in either pass)
    /// leaves the last one armed.
    #[tokio::test]
    async fn a_busy_cell_is_passed_over_and_the_ones_after_it_are_stood_down() {
        const T0: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z
        const N: usize = 6;
        let dir = tempfile::tempdir().unwrap();
        let engine = armed_one_shots(dir.path(), T0, N).await;
        let inner = engine.inner.clone();
        // The stand-down's order outside cluster mode: the map's, as `cells` gives it.
        let cells = inner.live.lock().cells();
        assert_eq!(cells.len(), N);
        for (id, cell) in &cells {
            assert!(
                armed(&*cell.lock().await),
                "{id} armed ahead of its instant"
            );
        }
        let (first, last) = (cells.first().unwrap(), cells.last().unwrap());
        let held = first.1.clone().lock_owned().await;
        let freed_later = last.1.clone().lock_owned().await;
        let release = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            drop(freed_later);
        });
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
        let taken = stand_down_all(&inner, until, |_| true).await;
        release.await.unwrap();
        assert!(armed(&held), "the cell held past `until` keeps its mark");
        drop(held);
        for (id, cell) in &cells[1..] {
            assert!(
                !armed(&*cell.lock().await),
                "{id} still armed after the stand-down"
            );
        }
        assert_eq!(taken, N - 1, "every cell but the one held throughout");
    }
}

//! The one place that writes a task: it carries a [`Change`] out (or a chunk of them) in a
//! fixed order, and nothing else in the engine calls the store's write methods.
//!
//! 1. **Write**: the change's records go into one batch (a chunk: one batch for all of its
//!    changes), with the notifications it calls for (`notify.rs`, new tasks in the same
//!    write), and the store makes it durable (`Store::write`). A step writes the progress
//!    only (the spec shared, never copied); a patch the whole task.
//! 2. **Memory** follows only a durable write: the task's progress (and its spec after a
//!    patch: a new `Arc`), its active runs.
//! 3. **Wheel**: the change's [`WheelOp`]s, then the task's fire entry brought in line with
//!    its next fire (`arm.rs` turns runs into instants).
//! 4. **Events and alerts**: a `task` event when the task changed, a `progress` event per
//!    written run, the failure list's `added` and its alert, a parked task's alert.
//!
//! A failed write changes nothing in memory (the caller tries the step again), except after a
//! send ([`lost`]): then the task is unloaded so that it is read back from what is on disk.
//! This is also where cluster mode's fence and the timeline's writes go (issues 24, 25): one
//! place for every write of a task.
//!
//! Layers (no circles): dispatch → chunk → step → commit → cells → arm → timer; `plan.rs`
//! and `change.rs` are pure, beside them.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::arm;
use super::cells::{self, Got, Locked, TryGot};
use super::change::{Change, WheelOp};
use super::timer::{Key, RunKey};
use super::{alerts, plan, EngineError, Inner, LiveState, LiveTask, Slot};
use crate::model::{Failure, Message, RunState, Task, TaskSpec};
use crate::store::purge::Footprint;
use crate::store::{Batch, Inserted, Op, StoreError};

/// How long before a step is tried again after a storage error.
pub(crate) const STORAGE_RETRY_MS: u64 = 1_000;

/// Carries one change of a locked task out: durable first, then memory, wheel, events.
pub(crate) async fn apply(inner: &Arc<Inner>, l: &mut Locked, c: Change) -> Result<(), StoreError> {
    let mut batch = Batch::new();
    let mut born = Vec::new();
    if !c.writes_nothing() {
        batch_into(l.st(), &c, &mut batch);
        let spec = c.spec.clone().unwrap_or_else(|| l.st().spec.clone());
        born = notifications(inner, &spec, &c, &mut batch);
        // Numbered: the bus publishes the events with the seqs the store gave them.
        if let Err(e) = inner.store.write_numbered(&mut batch).await {
            unborn(inner, born);
            return Err(e);
        }
    }
    after(inner, l, c);
    created(inner, born);
    publish_timeline(inner, &batch);
    Ok(())
}

/// The timeline events of a durable batch, on the event bus (issue 25).
fn publish_timeline(inner: &Inner, batch: &Batch) {
    for op in &batch.ops {
        if let Op::Timeline { task_id, events } = op {
            inner.events.timeline(task_id, events); // events (issue 11)
        }
    }
}

/// Items of a chunk's CPU-heavy loop (its plans, its memory after the write) between two
/// yields to the runtime: a poll is then ~32 tasks' worth (well under a ms), not ~256 (a
/// few ms), so a step due meanwhile waits behind short polls.
pub(crate) const SLICE: usize = 32;

/// Lets the runtime run other tasks every [`SLICE`] items of a chunk's loop (`i` counts them).
pub(crate) async fn breathe(i: usize) {
    if i > 0 && i.is_multiple_of(SLICE) {
        tokio::task::yield_now().await;
    }
}

/// Carries a chunk of changes out with one durable write (`chunk.rs`). On success each task
/// follows its change; on failure every task of the chunk is unloaded ([`lost`]). The locks
/// are released either way.
///
/// `turn` is the settle's turn to plan (`chunk.rs`, [`super::chunk::settles_at_once`]): held
/// while the changes go into the batch, given back before the write (its encoding and its wait
/// to be durable); memory then takes a turn of its own (one chunk's `after` is ~256 tasks'
/// worth of CPU). Both loops yield every [`SLICE`] tasks ([`breathe`]).
pub(crate) async fn apply_chunk(
    inner: &Arc<Inner>,
    items: Vec<(Locked, RunKey, Change)>,
    turn: Option<tokio::sync::SemaphorePermit<'_>>,
) {
    let mut batch = Batch::new();
    let mut items = items;
    let mut born = Vec::new();
    for (i, (l, _, c)) in items.iter_mut().enumerate() {
        breathe(i).await;
        batch_into(l.st(), c, &mut batch);
        let spec = c.spec.clone().unwrap_or_else(|| l.st().spec.clone());
        born.extend(notifications(inner, &spec, c, &mut batch));
    }
    drop(turn);
    match inner.store.write_numbered(&mut batch).await {
        Ok(()) => {
            let _turn = inner.settle_after_turns.acquire().await.ok();
            let mut done = Vec::with_capacity(items.len());
            for (i, (mut l, _, c)) in items.into_iter().enumerate() {
                breathe(i).await;
                after(inner, &mut l, c);
                done.push(l);
            }
            cells::release_all(inner, done);
            created(inner, born);
            publish_timeline(inner, &batch);
        }
        Err(e) => {
            unborn(inner, born);
            for (mut l, key, _) in items {
                lost(inner, &mut l, &key, &e);
                l.release(inner);
            }
        }
    }
}

/// The records of `c` (for the task `st` holds now), appended to `batch`.
fn batch_into(st: &LiveState, c: &Change, batch: &mut Batch) {
    let id = &st.spec.id;
    if let Some(epoch) = st.loaded_at {
        // The store's fence refuses the write unless the shard is held at this epoch still.
        batch.ops.push(Op::LoadedAt(id.clone(), epoch));
    }
    if let Some(f) = &c.failure {
        batch.failure(f.clone());
    }
    for r in &c.runs {
        batch.run(id, r);
    }
    if let Some(below) = c.trim_runs_below {
        batch.trim_runs(id, below);
    }
    // The step's timeline events, in the same durable write as the step (issue 25).
    batch.timeline(id, c.timeline.clone());
    let progress = c.progress.as_ref().unwrap_or(&st.progress);
    if let Some(spec) = &c.spec {
        if let Some(m) = &c.messages {
            batch.ops.push(Op::Messages {
                task_id: spec.id.clone(),
                old_count: st.spec.message_count,
                messages: m.clone(),
            });
        }
        // A patch: the whole record (its wire shape, copied once per patch).
        batch.task(&Task::join(spec, progress));
    } else if c.progress.is_some() {
        batch.progress_of(&st.spec, progress, &st.progress);
    }
}

/// After the durable write: memory, the wheel, events and alerts.
fn after(inner: &Arc<Inner>, l: &mut Locked, c: Change) {
    let st = l.st();
    let dropped: Vec<u32> = if c.wheel.contains(&WheelOp::DropSteps) {
        st.runs.keys().copied().collect()
    } else {
        Vec::new()
    };
    let task_changed = c.progress.is_some() || c.spec.is_some();
    if c.messages.is_some() {
        // A message read ahead (`prefetch.rs`, before the task has a run) is stale now.
        st.prefetched = None;
    }
    if let Some(spec) = c.spec {
        st.spec = spec;
    }
    if let Some(p) = c.progress {
        st.progress = p;
    }
    for r in &c.runs {
        inner.events.progress(&st.spec.id, st.progress.state, r); // events (issue 11)
    }
    for r in c.runs {
        if (r.state == RunState::Running && !r.is_done()) || st.sending.contains(&r.run) {
            st.runs.insert(r.run, r);
        } else {
            st.runs.remove(&r.run);
        }
    }
    let id = st.spec.id.clone();
    let running = st.progress.state == crate::model::TaskState::Running;
    for op in &c.wheel {
        match *op {
            WheelOp::Step(n) | WheelOp::StepAtWall(n) => match st.runs.get(&n) {
                Some(r) if running && !st.sending.contains(&n) => {
                    arm::step(inner, &id, r, matches!(op, WheelOp::StepAtWall(_)))
                }
                Some(_) if running => {} // sending: its settle puts its next step on
                _ => inner.timer.cancel(Key::run(&id, n)),
            },
            WheelOp::Steps if running => {
                for r in st.runs.values().filter(|r| !st.sending.contains(&r.run)) {
                    arm::step(inner, &id, r, false);
                }
            }
            WheelOp::Steps | WheelOp::DropSteps => {
                for n in dropped.iter().chain(st.runs.keys()) {
                    inner.timer.cancel(Key::run(&id, *n));
                }
            }
        }
    }
    arm::sync_fire(inner, &st.spec, &st.progress);
    if task_changed {
        inner.events.task(&st.spec, &st.progress); // events (issue 11)
    }
    if let Some(f) = &c.failure {
        inner.failures.fetch_add(1, Ordering::Relaxed);
        alerts::failure(inner, f, "failure");
        inner.events.failure(f, "added"); // events (issue 11)
    }
    if let Some(reason) = &c.parked {
        let channel = st.spec.channel.clone();
        alerts::parked(inner, &id, &channel, reason);
    }
}

/// A notification made a new task inside a change's write (issue 28): its cell was claimed in
/// the live map, locked, before the write, as a create claims its own, so that a create or a
/// command of the same id waits for the write instead of racing it.
pub(crate) struct Born {
    task: Task,
    locked: Locked,
    cell: Arc<LiveTask>,
}

/// The notifications `c` calls for (`notify.rs`), for `task` as it is after the change, made
/// new tasks whose records go into `batch`: the change's own write. The event and its
/// notification are durable together, so a crash never keeps one without the other.
/// One whose id exists already (the same event seen again, e.g. a step done again after a
/// restart) is left out; one that cannot be made (invalid: its channel was deleted; no room
/// among the live tasks) is logged and counted (`herald_notifications_refused`), and the
/// change goes on without it.
fn notifications(inner: &Arc<Inner>, task: &TaskSpec, c: &Change, batch: &mut Batch) -> Vec<Born> {
    super::notify::requests(task, c)
        .into_iter()
        .filter_map(|req| match born(inner, req, batch) {
            Ok(b) => b,
            Err(e) => {
                inner.notify_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(task = %task.id, error = %e,
                    "a notification could not be made; the change goes on without it");
                None
            }
        })
        .collect()
}

/// One notification's records into `batch`, its cell claimed; `Ok(None)` if its id exists.
fn born(
    inner: &Arc<Inner>,
    req: crate::request::TaskRequest,
    batch: &mut Batch,
) -> Result<Option<Born>, EngineError> {
    let (task, messages) = inner.task_of(req)?;
    // A finished one is only on disk; a live one is in the map (checked below, under its
    // lock, where a create claims its id too).
    // Within a step (sync code): off the worker while it reads, when a read can block.
    if inner
        .store
        .read_in_place(|| inner.store.task_exists(&task.id))?
    {
        return Ok(None);
    }
    let id: Arc<str> = Arc::from(task.id.as_str());
    let cell: Arc<LiveTask> = Arc::new(tokio::sync::Mutex::new(Slot::Loaded(Box::new(
        LiveState::new(task.clone(), BTreeMap::new()).at(inner.load_epoch(&task.id)),
    ))));
    let Ok(guard) = cell.clone().try_lock_owned() else {
        return Ok(None); // a new mutex is never locked: unreachable
    };
    {
        let mut live = inner.live.lock();
        if live.contains_key(&id) {
            return Ok(None);
        }
        let max = inner.config.limits.live_tasks_max;
        if live.len() >= max {
            return Err(EngineError::Limit(format!(
                "herald already holds {max} unfinished tasks (limits.live_tasks_max)"
            )));
        }
        live.claim(id.clone(), Some(cell.clone()));
    }
    // What `insert` writes, without its precondition (the id was checked above: a taken id
    // must not fail the change's whole write).
    batch.ops.push(Op::Born(task.id.clone()));
    batch.task(&task);
    if !messages.is_empty() {
        batch.ops.push(Op::Messages {
            task_id: task.id.clone(),
            old_count: 0,
            messages,
        });
    }
    batch.timeline(&task.id, created_events(&task).to_vec());
    Ok(Some(Born {
        task,
        locked: Locked { id, guard },
        cell,
    }))
}

/// The notifications of a durable write: on the wheel, heard of, their cells let go.
fn created(inner: &Arc<Inner>, born: Vec<Born>) {
    for b in born {
        tracing::info!(task = %b.task.id, channel = %b.task.channel, "notification created");
        inner.events.created(&b.task); // events (issue 11)
        if !inner.owns(&b.task.id) {
            // Cluster mode: another node's shard, told through the inbox (`cluster.rs`). Let
            // go before its lock is: a command waiting for it then finds no live task.
            super::cluster::let_go(inner, &b.task.id);
            drop(b.locked);
            drop(b.cell);
            continue;
        }
        arm::sync_fire_new(inner, &b.locked.id, &b.task);

        // Only the map and the guard may hold the cell for it to be unloaded.
        drop(b.cell);
        b.locked.release(inner);
    }
}

/// The notifications of a write that failed: not made (the step, tried again, makes them).
fn unborn(inner: &Inner, born: Vec<Born>) {
    for b in born {
        // Out of the map before its lock is let go: a command waiting for the lock then finds
        // the cell gone (`cells::lock`), not a task never stored.
        {
            let mut live = inner.live.lock();
            if live
                .cell(&b.task.id)
                .is_some_and(|c| Arc::ptr_eq(c, &b.cell))
            {
                live.remove(&b.task.id);
            }
        }
        drop(b.locked);
    }
}

/// A settle's write failed: the send happened (or not) but its outcome is not on disk.
/// Memory is forgotten and read back from what is there (the message in flight), so nothing
/// runs ahead of the disk; the step is tried again.
pub(crate) fn lost(inner: &Inner, l: &mut Locked, key: &RunKey, e: &StoreError) {
    tracing::warn!(task = %l.id, run = key.run, error = %e,
        "could not record the outcome; the task is reloaded from disk and its in-flight message goes again");
    l.unload(key.run);
    inner
        .timer
        .at(key.key(), inner.clock.now_ms() + STORAGE_RETRY_MS);
}

/// Start-up put this running task back (`recovery.rs`): its runs go on the wheel and a
/// subscriber hears that they are active again. Nothing is written unless `c` writes.
pub(crate) async fn resumed(
    inner: &Arc<Inner>,
    l: &mut Locked,
    mut c: Change,
) -> Result<(), StoreError> {
    c.wheel.push(WheelOp::Steps);
    let written: Vec<u32> = c.runs.iter().map(|r| r.run).collect();
    apply(inner, l, c).await?;
    let st = l.st();
    for r in st.runs.values().filter(|r| !written.contains(&r.run)) {
        inner.events.progress(&st.spec.id, st.progress.state, r); // events (issue 11)
    }
    Ok(())
}

/// Parks a task `failed` with `reason` (a bug or a corrupt record): its runs stop, nothing of
/// it is sent again, an alert is raised. Durable before it returns.
pub(crate) async fn park(
    inner: &Arc<Inner>,
    l: &mut Locked,
    reason: &str,
) -> Result<(), EngineError> {
    let now = inner.clock.now_ms();
    let st = l.st();
    let Some(c) = plan::park(&st.spec, &st.progress, &st.runs, &st.sending, reason, now) else {
        return Ok(());
    };
    apply(inner, l, c).await?;
    tracing::error!(task = %l.id, reason, "task parked as failed");
    Ok(())
}

/// A task's cell, locked and loaded (see `cells::lock`); a task whose runs cannot be read is
/// parked here, and the caller gets the error.
pub(crate) async fn lock(inner: &Arc<Inner>, id: &str) -> Result<Option<Locked>, EngineError> {
    match cells::lock(inner, id).await? {
        Got::Ready(l) => Ok(Some(l)),
        Got::Gone => Ok(None),
        Got::Park(l, reason) => Err(park_loaded(inner, l, reason).await),
    }
}

/// An `expired` task locked to be re-armed (`cells::lock_expired`); `None` if it is gone or
/// finished otherwise.
pub(crate) async fn lock_expired(
    inner: &Arc<Inner>,
    id: &str,
) -> Result<Option<Locked>, EngineError> {
    match cells::lock_expired(inner, id).await? {
        Got::Ready(l) => Ok(Some(l)),
        Got::Gone => Ok(None),
        Got::Park(l, reason) => Err(park_loaded(inner, l, reason).await),
    }
}

/// What [`try_lock_cell`] found.
pub(crate) enum TryLocked {
    Locked(Locked),
    /// Someone else holds the cell now.
    Busy,
    /// The task is not live (or it finished).
    Gone,
}

/// Like [`lock`], of a cell found already (`cells::cells_of`), but never waits for it
/// (`cells::try_lock_cell`).
pub(crate) async fn try_lock_cell(
    inner: &Arc<Inner>,
    found: Option<cells::Found>,
) -> Result<TryLocked, EngineError> {
    try_locked(inner, cells::try_lock_cell(inner, found)?).await
}

async fn try_locked(inner: &Arc<Inner>, got: TryGot) -> Result<TryLocked, EngineError> {
    match got {
        TryGot::Ready(l) => Ok(TryLocked::Locked(l)),
        TryGot::Busy => Ok(TryLocked::Busy),
        TryGot::Gone => Ok(TryLocked::Gone),
        TryGot::Park(l, reason) => Err(park_loaded(inner, l, reason).await),
    }
}

pub(crate) async fn park_loaded(inner: &Arc<Inner>, mut l: Locked, reason: String) -> EngineError {
    let r = park(inner, &mut l, &reason).await;
    l.release(inner);
    match r {
        Ok(()) => EngineError::Internal(reason),
        Err(e) => e,
    }
}

/// Writes a new task (with its messages and idempotency key, preconditions checked by the
/// store); when it is created, its fire goes on the wheel and subscribers hear of it.
pub(crate) async fn insert(
    inner: &Arc<Inner>,
    id: &Arc<str>,
    task: &Task,
    messages: &[Message],
    idem: Option<(&str, [u8; 32])>,
) -> Result<Inserted, StoreError> {
    let created = created_events(task);
    let r = inner
        .store
        .insert_new_task_with(task, messages, idem, &created)
        .await?;
    if let Inserted::Created = r {
        arm::sync_fire_new(inner, id, task);
        inner.events.created(task); // events (issue 11)
        let mut numbered = created;
        numbered[0].seq = 1;
        if inner.store.timeline_max() > 0 {
            inner.events.timeline(&task.id, &numbered); // events (issue 11)
        }
    }
    Ok(r)
}

/// A new task's first timeline events (`created`: the store derives it from the task
/// instead of storing it, `store/timeline.rs`; the write only starts the task's counter).
fn created_events(task: &Task) -> [crate::model::TimelineEvent; 1] {
    [crate::model::TimelineEvent::created(task)]
}

/// Deletes idempotency keys whose tasks are gone (retention, or a create reusing the key).
pub(crate) async fn delete_idem_keys(
    inner: &Inner,
    keys: Vec<(String, String)>,
) -> Result<usize, StoreError> {
    inner.store.delete_idem_keys(keys).await
}

/// Deletes finished tasks whole (messages, runs, failure entries, keys): their failure
/// retries leave the wheel, and subscribers hear `deleted`. Each with the epoch its shard was
/// held at before its footprint was read (cluster mode): the write is refused unless the
/// shard is held at it still (`Op::LoadedAt`), since a shard let go and held again in between
/// may have had the task brought back by another owner, its new records not in the footprint.
pub(crate) async fn delete_tasks(
    inner: &Inner,
    fps: Vec<(Footprint, Option<u64>)>,
) -> Result<(), StoreError> {
    if fps.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = fps.iter().map(|(fp, _)| fp.id.clone()).collect();
    let mut listed = 0u64;
    for (fp, _) in &fps {
        listed += fp.failures.len() as u64;
        for f in &fp.failures {
            inner.timer.cancel(Key::retry(f));
        }
    }
    inner.store.write(&delete_batch(fps)).await?;
    forget_failures(inner, listed);
    for id in ids {
        inner.events.deleted(&id); // events (issue 11)
    }
    Ok(())
}

/// [`delete_tasks`]'s write: each task's footprint, after the epoch it was read under.
fn delete_batch(fps: Vec<(Footprint, Option<u64>)>) -> Batch {
    let mut b = Batch::new();
    for (fp, epoch) in fps {
        if let Some(epoch) = epoch {
            b.ops.push(Op::LoadedAt(fp.id.clone(), epoch));
        }
        b.ops.push(Op::DeleteTask(fp));
    }
    b
}

/// What a change to a failure-list entry does on the wheel.
pub(crate) enum RetryWheel {
    /// Nothing.
    Keep,
    /// Its retry step at this instant.
    At(u64),
}

/// Saves a failure-list entry; then its retry step, its event (`action`) and alert. `steps`:
/// the timeline events of the retry attempt that led here (issue 25), written first, in the
/// same write.
pub(crate) async fn failure_saved(
    inner: &Arc<Inner>,
    f: &Failure,
    wheel: RetryWheel,
    action: Option<&'static str>,
    alert: Option<&'static str>,
    steps: Vec<crate::model::TimelineEvent>,
) -> Result<(), StoreError> {
    let mut b = Batch::new();
    b.failure(f.clone());
    let now = inner.clock.now_ms();
    let event = match action {
        Some("retrying") => Some(
            crate::model::TimelineEvent::run(
                crate::model::timeline::TimelineKind::FailureRetried,
                now,
                f.run,
                Some(f.seq),
            )
            .with_detail(serde_json::json!({ "failure": f.id, "retries": f.retries })),
        ),
        Some("failed") => Some(crate::model::TimelineEvent::failed(
            now,
            f.run,
            f.seq,
            f.attempts,
            &f.last_error,
        )),
        _ => None,
    };
    let mut events = steps;
    events.extend(event);
    b.timeline(&f.task_id, events);
    inner.store.write_numbered(&mut b).await?;
    publish_timeline(inner, &b);
    if let RetryWheel::At(at) = wheel {
        inner.timer.at(Key::retry(&f.id), at);
    }
    if let Some(a) = alert {
        alerts::failure(inner, f, a);
    }
    if let Some(a) = action {
        inner.events.failure(f, a); // events (issue 11)
    }
    Ok(())
}

/// Removes a failure-list entry (resolved by a retry, or dismissed); its retry step leaves
/// the wheel and subscribers hear `action`. `steps`: as for [`failure_saved`].
pub(crate) async fn failure_removed(
    inner: &Inner,
    f: &Failure,
    action: &'static str,
    steps: Vec<crate::model::TimelineEvent>,
) -> Result<(), StoreError> {
    let mut b = Batch::new();
    b.ops.push(Op::DeleteFailure(f.id.clone()));
    let now = inner.clock.now_ms();
    let event = match action {
        "dismissed" => crate::model::TimelineEvent::run(
            crate::model::timeline::TimelineKind::FailureDismissed,
            now,
            f.run,
            Some(f.seq),
        )
        .with_detail(serde_json::json!({ "failure": f.id })),
        // Resolved: a retry delivered it.
        _ => crate::model::TimelineEvent::delivered(now, f.run, f.seq, f.attempts),
    };
    let mut events = steps;
    events.push(event);
    b.timeline(&f.task_id, events);
    inner.store.write_numbered(&mut b).await?;
    publish_timeline(inner, &b);
    forget_failures(inner, 1);
    inner.timer.cancel(Key::retry(&f.id));
    inner.events.failure(f, action); // events (issue 11)
    Ok(())
}

fn forget_failures(inner: &Inner, n: u64) {
    // Saturating: a count read at start-up that missed an unreadable entry never wraps.
    let _ = inner
        .failures
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
            Some(c.saturating_sub(n))
        });
    if n > 0 {
        inner.failures_full.store(false, Ordering::Relaxed);
    }
}

/// Whether the failure list has room for one more entry (`[store] failures_max`). A full
/// list does not take it: the message is still counted failed on its run; the first one
/// refused after room was seen raises the alert.
pub(crate) fn failure_list_has_room(inner: &Arc<Inner>, f: &Failure) -> bool {
    let Some(max) = inner.config.failures_max else {
        return true;
    };
    if inner.failures.load(Ordering::Relaxed) < max {
        return true;
    }
    inner.failures_unlisted.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(failure = %f.id, task = %f.task_id, max,
        "the failure list is full ([store] failures_max): this message is not listed; its run counts it failed");
    // One alert per time the list fills up (it has room again once an entry leaves).
    if !inner.failures_full.swap(true, Ordering::Relaxed) {
        alerts::failure(inner, f, "failure_list_full");
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review finding (cluster mode): a delete was fenced at the epoch held when it was
    /// written, not the one its footprint was read under: a shard let go and held again in
    /// between (another owner may have brought the task back) did not refuse it.
    #[test]
    fn a_delete_is_fenced_at_the_epoch_its_footprint_was_read_under() {
        let fp = |id: &str| Footprint {
            id: id.into(),
            messages: 1,
            runs: vec![1],
            failures: vec![],
            settling: false,
        };
        let b = delete_batch(vec![(fp("a"), Some(7)), (fp("b"), None)]);
        let ops: Vec<String> = b
            .ops
            .iter()
            .map(|op| match op {
                Op::LoadedAt(id, e) => format!("loaded_at {id} {e}"),
                Op::DeleteTask(f) => format!("delete {}", f.id),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(ops, ["loaded_at a 7", "delete a", "delete b"]);
    }
}

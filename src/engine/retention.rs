//! Retention: finished tasks (completed, cancelled, failed) are deleted with their messages,
//! runs, failure-list entries and idempotency keys once `[store] retention` has passed since
//! they finished, and `DELETE /v1/tasks/{id}` deletes one finished task at once.
//!
//! The decisions are pure ([`expired`], [`batches`], [`stale_keys`]); [`Engine::sweep_retention`]
//! walks the store page by page (off the runtime's workers) and deletes through the group
//! commit in bounded batches, so a sweep never holds the commit thread for long and never
//! makes one huge transaction. Finished tasks are not in the live map, so nothing in memory
//! changes. Two races with the engine: a cancelled task's last send settling (a run still
//! `running` on disk), skipped until it has settled; and an `expired` task brought back by a
//! PATCH or a trigger, which a delete holds off by claiming the task in the live map before it
//! reads what it deletes and until it has written ([`hold_off`]): the task is judged again
//! (finished, past retention, nothing settling) from what is read while it is held. A sweep
//! claims, reads and deletes [`GROUP`] tasks at a time, so a command on one waits for one
//! group at most. In cluster mode each delete is fenced at the epoch its shard was held at
//! before its read (`Op::LoadedAt`): the read stands for what is deleted only if nobody else
//! owned the shard in between.

use std::sync::Arc;

use super::{commit, offload};
use super::{Engine, EngineError, Inner, LiveTask, Slot, TaskView};
use crate::model::TaskState;
use crate::store::purge::Footprint;
use crate::store::records::{LiveEntry, ProgressRecord};
use crate::store::{IdemRecord, StoreError};

/// Records read per page of a sweep.
const PAGE: usize = 1_000;
/// Most backend writes in one sweep batch (a task larger than this is a batch of its own).
const BATCH_OPS_MAX: usize = 10_000;
/// Tasks a sweep claims, reads again and deletes at a time. A claimed task's commands (cancel,
/// pause, trigger, PATCH, a create reusing its id) wait for its delete: at most one group's
/// reads (four statements a task on PostgreSQL) and its write, not a whole page's.
pub const GROUP: usize = 64;

/// A finished task is deleted once `retention_ms` has passed since its last change (for a
/// finished task, when it finished).
pub fn expired(p: &ProgressRecord, now_ms: u64, retention_ms: u64) -> bool {
    p.state.is_terminal() && p.updated_at_ms.saturating_add(retention_ms) <= now_ms
}

/// Groups deletes into batches of at most `max_ops` backend writes (`ops` of each), in order.
/// A task whose delete alone is larger goes in a batch of its own: a task is always deleted
/// whole.
pub fn batches<T>(items: Vec<T>, ops: impl Fn(&T) -> usize, max_ops: usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    let mut total = 0;
    for item in items {
        let n = ops(&item);
        match out.last_mut() {
            Some(b) if total + n <= max_ops => b.push(item),
            _ => {
                out.push(vec![item]);
                total = 0;
            }
        }
        total += n;
    }
    out
}

/// Idempotency keys whose task no longer exists.
pub fn stale_keys(
    page: &[(String, IdemRecord)],
    exists: impl Fn(&str) -> bool,
) -> Vec<(String, String)> {
    page.iter()
        .filter(|(_, r)| !exists(&r.task_id))
        .map(|(k, r)| (k.clone(), r.task_id.clone()))
        .collect()
}

/// What one sweep deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub tasks: usize,
    pub keys: usize,
}

/// How often the background sweep runs: a 24th of the retention, between a minute and an hour.
pub fn sweep_every_ms(retention_ms: u64) -> u64 {
    (retention_ms / 24).clamp(60_000, 3_600_000)
}

/// Test knob, not configuration: the sweep's period in milliseconds instead of
/// [`sweep_every_ms`] (`tests/cluster_retention.rs`). Read once when the sweeper starts.
pub const SWEEP_EVERY_ENV: &str = "HERALD_TEST_RETENTION_SWEEP_MS";
/// Test knob: how long the sweep waits, a group of tasks claimed and read again, before the
/// group's delete is written ([`SweepHolds::before_write`]; `tests/cluster_retention.rs` stops
/// the node inside that wait, so the delete comes from an owner whose shards were taken over
/// meanwhile, and is refused by the fence at the epoch it read under). Read once when the
/// sweeper starts.
pub const HOLD_ENV: &str = "HERALD_TEST_RETENTION_HOLD_MS";

/// Test knobs: where a sweep waits (`tests/retention.rs`, `tests/expired.rs` in process; the
/// sweeper reads [`HOLD_ENV`]).
#[doc(hidden)]
#[derive(Clone, Default)]
pub struct SweepHolds {
    /// Once, after the first page with tasks past retention is read and before any of them
    /// is claimed: a command may bring one back meanwhile.
    pub after_page: Option<Arc<PageHold>>,
    /// With a group claimed and read again, before its delete is written.
    pub before_write: Option<std::time::Duration>,
}

/// [`SweepHolds::after_page`]: the sweep raises `reached` (a test polls it) and waits for
/// `go` (`Notify::notify_one`, which keeps a permit when nobody waits yet).
#[doc(hidden)]
#[derive(Default)]
pub struct PageHold {
    pub reached: std::sync::atomic::AtomicBool,
    pub go: tokio::sync::Notify,
}

impl PageHold {
    /// Waits for `go` the first time only: later pages go on.
    async fn wait(&self, ids: &[String]) {
        if !self.reached.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tracing::warn!(tasks = ?ids, "test knob: the retention sweep waits after its page's read");
            self.go.notified().await;
        }
    }
}

/// A test knob's milliseconds (`None`: unset, zero or unreadable).
fn knob_ms(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
}

/// Runs `f` on the store off the runtime's workers.
async fn blocking<T: Send + 'static>(
    inner: &Arc<Inner>,
    f: impl FnOnce(&Inner) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, EngineError> {
    let inner = inner.clone();
    tokio::task::spawn_blocking(move || f(&inner))
        .await
        .map_err(|e| EngineError::Internal(format!("store read failed: {e}")))?
        .map_err(EngineError::from)
}

impl Engine {
    /// Deletes finished tasks past retention and idempotency keys whose task is gone; one
    /// whole pass over the store. Does nothing when retention is off.
    pub async fn sweep_retention(&self) -> Result<Swept, EngineError> {
        self.sweep_retention_holding(SweepHolds::default()).await
    }

    /// [`Engine::sweep_retention`], waiting where `holds` says (test knobs).
    #[doc(hidden)]
    pub async fn sweep_retention_holding(&self, holds: SweepHolds) -> Result<Swept, EngineError> {
        let Some(retention_ms) = self.inner.config.retention_ms else {
            return Ok(Swept::default());
        };
        let inner = &self.inner;
        let now = inner.clock.now_ms();
        let mut swept = Swept::default();
        let mut after: Option<String> = None;
        loop {
            let a = after.take();
            let (page, next) =
                blocking(inner, move |i| i.store.progress_page(a.as_deref(), PAGE)).await?;
            // In cluster mode the pages hold every node's tasks: each owner deletes its own
            // (fenced like every write: a delete after its shard was taken over is refused).
            let ids: Vec<String> = page
                .into_iter()
                .filter(|(id, p)| expired(p, now, retention_ms) && inner.owns(id))
                .map(|(id, _)| id)
                .collect();
            if !ids.is_empty() {
                if let Some(h) = &holds.after_page {
                    h.wait(&ids).await;
                }
                let past = move |p: &ProgressRecord| expired(p, now, retention_ms);
                swept.tasks += self.delete_finished(ids, past, holds.before_write).await?;
            }
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        loop {
            let a = after.take();
            let stale = blocking(inner, move |i| {
                let (page, next) = i.store.idem_page(a.as_deref(), PAGE)?;
                // Cluster mode: a key's row is in the shard of the task its record names, and
                // its delete is fenced there (`RawOp::IdemOf`): that shard's owner sweeps it.
                // Alone, every key.
                let page: Vec<_> = page
                    .into_iter()
                    .filter(|(_, r)| i.owns(&r.task_id))
                    .collect();
                let mut exists = std::collections::HashMap::new();
                for (_, r) in &page {
                    if !exists.contains_key(&r.task_id) {
                        exists.insert(r.task_id.clone(), i.store.task_exists(&r.task_id)?);
                    }
                }
                Ok((stale_keys(&page, |t| exists.get(t) == Some(&true)), next))
            })
            .await?;
            let (keys, next) = stale;
            swept.keys += commit::delete_idem_keys(inner, keys).await?;
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        if swept != Swept::default() {
            tracing::info!(
                tasks = swept.tasks,
                idempotency_keys = swept.keys,
                "retention sweep deleted finished tasks"
            );
        }
        Ok(swept)
    }

    /// Deletes these tasks whole if, read again once they are claimed, they are still `past`
    /// retention and no send of theirs is settling; returns how many. Ordered with
    /// failure-list commands, so a failure retry never writes an entry back after its task is
    /// gone.
    ///
    /// Claimed first, read after: the page said the task was past retention, but a trigger or
    /// a PATCH may have brought it back since (`cells::lock_expired`), written a new run, sent
    /// and finished it, and left the map again. Held off, nothing here writes the task any
    /// more (a command waits for the held cell), nor, in cluster mode, another node unless the
    /// shard moved, which the delete's fence at the epoch of its read refuses. So what is read
    /// now is what the delete removes: a
    /// task finished again meanwhile is kept (its retention starts over), and no run or
    /// failure entry written since is left behind without its task.
    ///
    /// In groups of [`GROUP`], each claimed only for its own reads and write: a command on a
    /// task of the page waits for one group at most.
    async fn delete_finished(
        &self,
        ids: Vec<String>,
        past: impl Fn(&ProgressRecord) -> bool,
        hold: Option<std::time::Duration>,
    ) -> Result<usize, EngineError> {
        let mut deleted = 0;
        for group in ids.chunks(GROUP) {
            deleted += self.delete_group(group, &past, hold).await?;
        }
        Ok(deleted)
    }

    /// [`Engine::delete_finished`] of one group: claimed, read again, deleted, let go (a task
    /// found unfinished on disk back to the live tasks: [`Held::release`]). `hold`: the test
    /// knob [`HOLD_ENV`]'s wait before the write.
    async fn delete_group(
        &self,
        ids: &[String],
        past: &impl Fn(&ProgressRecord) -> bool,
        hold: Option<std::time::Duration>,
    ) -> Result<usize, EngineError> {
        let inner = &self.inner;
        let _g = inner.failures_lock.lock().await;
        let held: Vec<Held> = ids
            .iter()
            .filter_map(|id| hold_off(inner, id).ok())
            .collect();
        let cluster = inner.config.cluster.is_some();
        // Not out now, never out before the release: a send starts only from the task's cell
        // in the map, and a failure retry under the failures lock, both held here. Cluster
        // mode: with the epoch its shard is held at, asked once the task is claimed and before
        // it is read (`None`: not held now, not this node's to delete).
        let to_read: Vec<(String, Option<u64>)> = held
            .iter()
            .filter(|h| !inner.sends_out.contains(&h.id))
            .map(|h| (h.id.to_string(), inner.load_epoch(&h.id)))
            .filter(|(_, epoch)| !cluster || epoch.is_some())
            .collect();
        let read = blocking(inner, move |i| {
            to_read
                .into_iter()
                .map(|(id, epoch)| reread(i, id, epoch))
                .collect::<Result<Vec<_>, StoreError>>()
        })
        .await;
        let mut back = std::collections::HashMap::new();
        let done = match read {
            Ok(read) => {
                let mut doomed = Vec::new();
                for r in read {
                    match r {
                        Reread::Finished(p, fp, epoch) if past(&p) && !fp.settling => {
                            doomed.push((fp, epoch));
                        }
                        Reread::Finished(..) | Reread::Gone => {}
                        Reread::Unfinished(id, entry) => {
                            back.insert(id, entry);
                        }
                    }
                }
                if let (Some(hold), false) = (hold, doomed.is_empty()) {
                    let tasks: Vec<&str> = doomed.iter().map(|(f, _)| f.id.as_str()).collect();
                    tracing::warn!(
                        hold_ms = hold.as_millis() as u64,
                        ?tasks,
                        "test knob {HOLD_ENV}: the retention delete is held"
                    );
                    tokio::time::sleep(hold).await;
                }
                delete_in_batches(inner, doomed).await
            }
            Err(e) => Err(e),
        };
        for h in held {
            let entry = back.remove(&*h.id);
            h.release(inner, entry);
        }
        done
    }

    /// `DELETE /v1/tasks/{id}`: deletes a finished task now (with its messages, runs, failure
    /// entries and idempotency keys). An unfinished task is a conflict: cancel it first.
    pub async fn delete(&self, id: &str) -> Result<TaskView, EngineError> {
        self.check_storage()?;
        let engine = self.clone();
        let key = id.to_string();
        let view = offload::read(&self.inner, move |_| engine.get(&key)).await?;
        let Some(view) = view else {
            return Err(EngineError::NotFound(format!("task {id:?}")));
        };
        let state = view.task.state;
        if !state.is_terminal() {
            return Err(EngineError::Conflict(format!(
                "task {id:?} is {state}: only a finished task can be deleted; cancel it first (POST /v1/tasks/{id}/cancel)"
            )));
        }
        let _g = self.inner.failures_lock.lock().await;
        let held = match hold_off(&self.inner, id) {
            Ok(held) => held,
            Err(NotHeld::InMap) => {
                return Err(EngineError::Conflict(format!(
                    "task {id:?} was brought back meanwhile (a new schedule or a trigger): it is no longer finished"
                )))
            }
            Err(NotHeld::NotOwned) => {
                return Err(EngineError::Busy(format!(
                    "task {id:?}'s shard is changing hands; try again"
                )))
            }
        };
        // Claimed first, read after (see `delete_finished`): a trigger may have brought the
        // task back, run and finished it since the read above.
        let (deleted, back) = self.delete_held(id).await;
        held.release(&self.inner, back);
        let view = deleted?;
        tracing::info!(task = %id, "task deleted");
        Ok(view)
    }

    /// [`Engine::delete`]'s read and write, the task held off: the task as it is now (the
    /// answer), and its footprint, then the delete fenced at the epoch its shard was held at
    /// before the read (cluster mode). Second value: the task's live entry when it is
    /// unfinished on disk (its release puts it back among the live tasks).
    async fn delete_held(&self, id: &str) -> (Result<TaskView, EngineError>, Option<LiveEntry>) {
        // On disk a cancelled task's sending run reads cancelled: the send it still has out
        // is known in memory only. Not out now, it is never out before the release.
        let out = self.inner.sends_out.contains(id);
        let epoch = self.inner.load_epoch(id);
        let engine = self.clone();
        let key = id.to_string();
        let read = offload::read(&self.inner, move |i| {
            let view = engine.get(&key)?;
            let finished = view.as_ref().is_none_or(|v| v.task.state.is_terminal());
            let (fp, back) = if finished {
                (Some(i.store.footprint(&key)?), None)
            } else {
                (None, i.store.live_entry(&key)?)
            };
            Ok((view, fp, back))
        })
        .await;
        let (view, fp, back) = match read {
            Ok(r) => r,
            Err(e) => return (Err(e), None),
        };
        let Some(view) = view else {
            return (Err(EngineError::NotFound(format!("task {id:?}"))), None);
        };
        let state = view.task.state;
        let Some(fp) = fp else {
            return (
                Err(EngineError::Conflict(format!(
                    "task {id:?} is {state}: only a finished task can be deleted; cancel it first (POST /v1/tasks/{id}/cancel)"
                ))),
                back,
            );
        };
        if fp.settling || out {
            let e = EngineError::Conflict(format!(
                "task {id:?} is {state} but a send of it is still settling; try again shortly"
            ));
            return (Err(e), None);
        }
        match commit::delete_tasks(&self.inner, vec![(fp, epoch)]).await {
            Ok(()) => (Ok(view), None),
            Err(e) => (Err(e.into()), None),
        }
    }
}

/// A claimed task as read again.
enum Reread {
    /// Finished on disk: its progress, its footprint, and the epoch its shard was held at
    /// before the read (cluster mode).
    Finished(Box<ProgressRecord>, Footprint, Option<u64>),
    /// Unfinished on disk (cluster mode: another owner brought it back while this node did
    /// not hold its shard), with its live entry.
    Unfinished(String, LiveEntry),
    Gone,
}

/// Reads claimed task `id` again ([`Reread`]): its progress, then its footprint if it is
/// finished, or its live entry if not.
fn reread(i: &Inner, id: String, epoch: Option<u64>) -> Result<Reread, StoreError> {
    match i.store.stored_progress(&id)? {
        Some(p) if p.state.is_terminal() => {
            let fp = i.store.footprint(&id)?;
            Ok(Reread::Finished(Box::new(p), fp, epoch))
        }
        // Unfinished, or no progress record (gone, or unfinished with its progress still
        // derived from its spec): the live entry tells.
        _ => Ok(match i.store.live_entry(&id)? {
            Some(entry) => Reread::Unfinished(id, entry),
            None => Reread::Gone,
        }),
    }
}

/// Deletes these footprints in bounded batches, in order, each fenced at the epoch it was read
/// under; how many, or the first error.
async fn delete_in_batches(
    inner: &Inner,
    doomed: Vec<(Footprint, Option<u64>)>,
) -> Result<usize, EngineError> {
    let n = doomed.len();
    for group in batches(doomed, |(fp, _)| fp.ops(), BATCH_OPS_MAX) {
        commit::delete_tasks(inner, group).await?;
    }
    Ok(n)
}

/// A finished task held in the live map, with a locked cell of its own, while its delete is
/// written ([`hold_off`]).
struct Held {
    id: Arc<str>,
    cell: Arc<LiveTask>,
    _guard: tokio::sync::OwnedMutexGuard<Slot>,
}

/// Why [`hold_off`] did not claim a task.
enum NotHeld {
    /// In the live map: brought back meanwhile, not to be deleted.
    InMap,
    /// Cluster mode: its shard is not held now.
    NotOwned,
}

/// Claims `id` in the live map for the time its delete is written. An `expired` task is the
/// one finished task a command may bring back (a PATCH with a new schedule, a trigger:
/// `cells::lock_expired`, which claims it there): such a command then waits for the delete
/// and finds the task gone, instead of having its answered change undone by it.
///
/// Cluster mode: only while its shard is held, asked under the map's lock. A shard is let go
/// before its tasks leave the map (under that lock), so a claim that stands is either taken out
/// by that unload, or made while the shard is held; a grant's load meanwhile skips the claimed
/// task, which [`Held::release`] then puts back if it is unfinished on disk.
fn hold_off(inner: &Inner, id: &str) -> Result<Held, NotHeld> {
    let cell: Arc<LiveTask> = Arc::new(tokio::sync::Mutex::new(Slot::unloaded()));
    // A new mutex is never locked.
    let guard = cell.clone().try_lock_owned().map_err(|_| NotHeld::InMap)?;
    let key: Arc<str> = Arc::from(id);
    let mut live = inner.live.lock();
    if !inner.owns(id) {
        return Err(NotHeld::NotOwned);
    }
    // Held, not live: not counted against `live_tasks_max` nor in `herald_tasks_live`.
    if !live.hold(key.clone(), cell.clone()) {
        return Err(NotHeld::InMap);
    }
    Ok(Held {
        id: key,
        cell,
        _guard: guard,
    })
}

impl Held {
    /// Out of the map again, then the cell's lock goes: a command that waited for it finds the
    /// task gone (or, if the delete failed, finished on disk as before).
    ///
    /// `back`: the task is unfinished on disk (cluster mode: another owner brought it back,
    /// and this node's load of its shard, granted again while the task was held, skipped it).
    /// It stays in the map as a live task, unloaded, and goes on the wheel as that load would
    /// have put it (a running one is resumed), or it would sit pending with no fire until a
    /// command or the next move of its shard.
    fn release(self, inner: &Arc<Inner>, back: Option<LiveEntry>) {
        let mut resume = false;
        {
            let mut live = inner.live.lock();
            if live
                .cell(&self.id)
                .is_some_and(|c| Arc::ptr_eq(c, &self.cell))
            {
                match back {
                    Some(entry) if inner.holds(&self.id) => {
                        tracing::warn!(task = %self.id, state = %entry.state,
                            "a task the retention delete held is unfinished on disk; it is live again");
                        live.unhold(&self.id);
                        super::arm::arm_entry(inner, &self.id, &entry);
                        resume = entry.state == TaskState::Running;
                    }
                    _ => live.remove(&self.id),
                }
            }
        }
        let id = self.id.clone();
        drop(self);
        if resume {
            let inner = inner.clone();
            tokio::spawn(async move {
                let now = inner.clock.now_ms();
                if let Err(e) =
                    super::recovery::resume_running(&inner, vec![id.clone()], now, 0).await
                {
                    tracing::warn!(task = %id, error = %e, "a running task the retention delete held is not resumed yet; it goes on when it is next loaded");
                }
            });
        }
    }
}

/// Runs the sweep every [`sweep_every_ms`] of real time while the engine lives. Not on a manual
/// clock: tests call [`Engine::sweep_retention`] when they choose.
pub(crate) async fn sweeper(inner: std::sync::Weak<Inner>, retention_ms: u64) {
    let every = std::time::Duration::from_millis(
        knob_ms(SWEEP_EVERY_ENV).unwrap_or_else(|| sweep_every_ms(retention_ms)),
    );
    let holds = SweepHolds {
        after_page: None,
        before_write: knob_ms(HOLD_ENV).map(std::time::Duration::from_millis),
    };
    if knob_ms(SWEEP_EVERY_ENV).is_some() {
        tracing::warn!(
            every_ms = every.as_millis() as u64,
            "test knob {SWEEP_EVERY_ENV}: the retention sweep's period is not its own"
        );
    }
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let engine = Engine { inner };
        if let Err(e) = engine.sweep_retention_holding(holds.clone()).await {
            tracing::warn!(error = %e, "retention sweep stopped; it runs again later");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TaskState;

    fn progress(state: TaskState, updated_at_ms: u64) -> ProgressRecord {
        ProgressRecord {
            state,
            updated_at_ms,
            next_fire_at_ms: None,
            runs: 1,
            fires: 1,
            last_fire_ms: None,
            last_slot_wall_ms: None,
            done_offsets_ms: vec![],
            queued: vec![],
            skipped: 0,
            expired: 0,
            watched_since_ms: 0,
            failed_reason: None,
            one_shot: false,
        }
    }

    fn fp(id: &str, messages: u32) -> Footprint {
        Footprint {
            id: id.into(),
            messages,
            runs: vec![1],
            failures: vec![],
            settling: false,
        }
    }

    #[test]
    fn only_finished_tasks_past_retention_expire() {
        let day = 86_400_000;
        for s in [
            TaskState::Completed,
            TaskState::Cancelled,
            TaskState::Failed,
        ] {
            assert!(!expired(&progress(s, 10 * day), 17 * day - 1, 7 * day));
            assert!(expired(&progress(s, 10 * day), 17 * day, 7 * day));
        }
        for s in [TaskState::Pending, TaskState::Running, TaskState::Paused] {
            assert!(!expired(&progress(s, 0), u64::MAX, 7 * day), "{s}");
        }
        assert!(!expired(
            &progress(TaskState::Completed, u64::MAX),
            u64::MAX - 1,
            1
        ));
    }

    #[test]
    fn batches_are_bounded_and_keep_tasks_whole() {
        // ops per task: 3 + messages + 1 run.
        let fps = vec![fp("a", 6), fp("b", 6), fp("c", 100), fp("d", 1)];
        let b = batches(fps, Footprint::ops, 20);
        let ids: Vec<Vec<&str>> = b
            .iter()
            .map(|g| g.iter().map(|f| f.id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["a", "b"], vec!["c"], vec!["d"]]);
        assert!(batches(Vec::<Footprint>::new(), Footprint::ops, 10).is_empty());
    }

    #[test]
    fn keys_of_missing_tasks_are_stale() {
        let rec = |t: &str| IdemRecord {
            task_id: t.into(),
            body_sha256: [0; 32],
        };
        let page = vec![("k1".into(), rec("gone")), ("k2".into(), rec("here"))];
        assert_eq!(
            stale_keys(&page, |t| t == "here"),
            vec![("k1".to_string(), "gone".to_string())],
            "each with the task it names: its delete is fenced in that task's shard"
        );
    }

    #[test]
    fn sweeps_run_often_enough_but_not_constantly() {
        assert_eq!(sweep_every_ms(7 * 86_400_000), 3_600_000);
        assert_eq!(sweep_every_ms(1_000), 60_000);
        assert_eq!(sweep_every_ms(24 * 600_000), 600_000);
    }
}

#[cfg(test)]
mod engine_tests {
    use std::sync::Arc;

    use crate::clock::{Clock, ManualClock};
    use crate::engine::timer::Key;
    use crate::engine::{Engine, EngineConfig};

    async fn engine(dir: &std::path::Path, t0: u64) -> (Engine, Arc<ManualClock>) {
        let store = crate::store::Store::open(&dir.join("data")).unwrap();
        engine_on(dir, t0, store).await
    }

    async fn engine_on(
        dir: &std::path::Path,
        t0: u64,
        store: crate::store::Store,
    ) -> (Engine, Arc<ManualClock>) {
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
        let clock = Arc::new(ManualClock::new(t0));
        let engine = Engine::start(
            store,
            crate::server::build_channels(&config).unwrap(),
            clock.clone(),
            EngineConfig::default(),
        )
        .await
        .unwrap();
        (engine, clock)
    }

    /// Review finding (cluster mode): a shard granted again while the delete held one of its
    /// tasks loaded the shard without it (the id was in the map), and the delete, finding the
    /// task unfinished on disk (another owner had brought it back), kept it but took it out
    /// of the map: pending, with no fire, until a command or the next move of its shard. The
    /// release now puts it among the live tasks and on the wheel, as the load would have.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_task_found_unfinished_on_disk_is_live_and_armed_again() {
        const T0: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z
        let dir = tempfile::tempdir().unwrap();
        let (engine, clock) = engine(dir.path(), T0).await;
        let at = crate::model::instant::format_utc(T0 + 60_000);
        let req = serde_json::from_value(serde_json::json!({"id": "p", "channel": "out",
            "schedule": {"at": at}, "to": ["a"], "body": "x"}))
        .unwrap();
        engine.create(req, None).await.unwrap();
        let inner = engine.inner.clone();
        // As a shard's load that skipped it leaves it: not in the map, nothing on the wheel.
        inner.live.lock().remove("p");
        inner.timer.cancel(Key::fire("p"));
        let kept = engine
            .delete_finished(vec!["p".into()], |_| true, None)
            .await
            .unwrap();
        assert_eq!(kept, 0, "an unfinished task is not deleted");
        {
            let live = inner.live.lock();
            assert!(live.contains_key("p"), "live again");
            assert_eq!(live.len(), 1, "counted live");
            assert!(live.cell("p").is_none(), "unloaded: its next user loads it");
        }
        while let Some(d) = engine.idle().await.filter(|d| *d <= T0 + 61_000) {
            clock.set(d);
            engine.wake();
        }
        clock.set(T0 + 61_000);
        engine.wake();
        engine.idle().await;
        let sent = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap_or_default();
        assert_eq!(sent.lines().count(), 1, "sent at its time: {sent}");
        let state = engine.get("p").unwrap().unwrap().task.state;
        assert_eq!(state, crate::model::TaskState::Completed);
        assert!(clock.now_ms() >= T0 + 60_000);
    }

    /// Review finding: a command on an `expired` task read it before claiming it in the live
    /// map, so a whole delete (claim, read, write, release) could run in between, and the
    /// command then claimed a cell built from the deleted task (a trigger wrote progress and a
    /// run with no spec; a PATCH brought back a task answered as deleted). It claims first
    /// now, as a delete does, and reads the task under the claim: while its read is under way
    /// the task is in the map already, so a delete cannot claim it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_command_on_an_expired_task_claims_it_before_reading_it() {
        use crate::store::fault::{Faults, FaultyBackend};
        use std::sync::atomic::Ordering;
        const T0: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z
        let dir = tempfile::tempdir().unwrap();
        let faults = Arc::new(Faults::default());
        let backend = FaultyBackend {
            inner: Arc::new(
                crate::store::embedded::SledBackend::open(&dir.path().join("data"), 8 << 20)
                    .unwrap(),
            ),
            faults: faults.clone(),
        };
        let store = crate::store::Store::with_backend(Arc::new(backend)).unwrap();
        let (engine, _clock) = engine_on(dir.path(), T0, store).await;
        let at = crate::model::instant::format_utc(T0 + 60_000);
        let req = serde_json::from_value(serde_json::json!({"id": "e", "channel": "out",
            "schedule": {"at": at}, "to": ["a"], "body": "x"}))
        .unwrap();
        engine.create(req, None).await.unwrap();
        let inner = engine.inner.clone();
        // Expired, as a start-up after an outage over its instant leaves it.
        let mut task = engine.store().get_task("e").unwrap().unwrap();
        task.state = crate::model::TaskState::Expired;
        let mut b = crate::store::Batch::new();
        b.task(&task);
        engine.store().write(&b).await.unwrap();
        inner.live.lock().remove("e");
        inner.timer.cancel(Key::fire("e"));

        let before = faults.reads_delayed.load(Ordering::SeqCst);
        faults.read_delay_us.store(500_000, Ordering::SeqCst);
        let i = inner.clone();
        let command = tokio::spawn(async move {
            matches!(
                crate::engine::cells::lock_expired(&i, "e").await,
                Ok(crate::engine::cells::Got::Ready(_))
            )
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while faults.reads_delayed.load(Ordering::SeqCst) == before {
            assert!(std::time::Instant::now() < deadline, "the command reads");
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert!(
            inner.live.lock().contains_key("e"),
            "claimed in the map before it is read"
        );
        assert!(
            super::hold_off(&inner, "e").is_err(),
            "a delete cannot claim it meanwhile"
        );
        faults.read_delay_us.store(0, Ordering::SeqCst);
        assert!(command.await.unwrap(), "locked, loaded from its record");
    }
}

//! Start-up: put every live task back where it was, reading only the live index (one small
//! record per unfinished task; finished tasks are never read), in two phases.
//!
//! 1. Before ready: the running tasks, and the pending ones due within [`READY_HORIZON_MS`],
//!    in due order (the `due` index, `store/records.rs`). Ready then: the API serves and those
//!    fires are on the wheel.
//! 2. In the background: the rest of the index, in due order, in chunks. It stays far ahead
//!    of the clock (it reads hundreds of thousands of entries a second; the horizon is a
//!    minute). A command or create that names a task it has not reached yet takes the task
//!    over from its entry on disk (`cells::adopt`), and the loader leaves it alone.
//!
//! What each state needs:
//! - `pending`: its next fire goes back on the wheel; the task stays unloaded until it fires.
//!   Fires whose time passed while herald was down are missed (they were due before this
//!   process started watching) and are judged by the misfire policy when that entry fires.
//! - `running`: loaded; each active run resumes at its cursor, at the instant its next step
//!   was due (or now). A message that was in flight at the crash is sent again — with the same
//!   idempotency key and the next attempt number — because nobody knows whether the channel
//!   got it (`cells::load`).
//! - `paused`: nothing goes on the wheel; the runs keep their cursors for the resume.
//!
//! A record that cannot be read is reported with its key and skipped (a task whose runs cannot
//! be read is parked `failed`); a read error of the index itself ends the scan, loudly.
use std::sync::{Arc, Weak};

use super::arm::entry_fire;
use super::commit;
use super::timer::Key;
use super::{EngineError, Inner};
use crate::model::{RunState, TaskState};
use crate::store::records::{LiveEntry, DUE_PENDING, DUE_RUNNING};
use crate::store::StoreError;

/// Pending tasks due within this much of start-up are on the wheel before herald reports
/// ready; later ones are loaded in the background.
pub const READY_HORIZON_MS: u64 = 60_000;
/// Entries the background load reads, then inserts under one lock of the live map.
const LOAD_CHUNK: usize = 4096;
/// Entries phase 1 reads, then inserts under one lock of the live map: smaller than the
/// background's, since fire steps due now wait for that lock (a hold is well under 1 ms).
const READY_CHUNK: usize = 1024;
/// How long the index load waits before reading a chunk again after the store failed.
const LOAD_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Is this due-index key past what phase 1 reads (pending due after `until`, or paused)?
fn beyond(key: &[u8], until: u64) -> bool {
    match key.first() {
        Some(&DUE_RUNNING) => false,
        Some(&DUE_PENDING) => key
            .get(1..9)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .is_none_or(|b| u64::from_be_bytes(b) > until),
        _ => true,
    }
}

pub(crate) async fn recover(inner: &Arc<Inner>) -> Result<(), EngineError> {
    let now = inner.clock.now_ms();
    if inner.config.cluster.is_some() {
        // Cluster mode: no shard is held yet; each is loaded when it is granted, its
        // failure-list retries under way with it (`cluster.rs`). Armed now, the dispatcher
        // would drop them all (no shard held) and they would stay `retrying` for good.
        let (listed, unreadable) = resume_failure_retries(inner, now, false)?;
        tracing::info!(
            retrying = listed,
            corrupt = unreadable,
            "cluster mode: ready; shards load as they are granted"
        );
        return Ok(());
    }
    // Read before this process's first stamp, which it replaces.
    let alive_ms = super::alive::before(inner).await;
    let started = std::time::Instant::now();
    let scan = scan_index(inner, now.saturating_add(READY_HORIZON_MS))?;
    let index_ms = started.elapsed().as_millis() as u64;
    let running = scan.running_ids.len();
    let mut corrupt = scan.corrupt;
    corrupt += resume_running(inner, scan.running_ids, now, alive_ms).await?;
    let (retries, unreadable) = resume_failure_retries(inner, now, true)?;
    corrupt += unreadable;
    // Only now: a start-up that fails before here (or dies in it) watched nothing, and its
    // stamp would make the next start judge the outage from it (review finding).
    super::alive::start(inner);
    tracing::info!(
        pending = scan.pending,
        running,
        paused = scan.paused,
        retries,
        corrupt,
        index_ms,
        took_ms = started.elapsed().as_millis() as u64,
        loading_in_background = scan.rest_from.is_some(),
        "recovery done: ready"
    );
    if let Some(from) = scan.rest_from {
        let weak = Arc::downgrade(inner);
        std::thread::Builder::new()
            .name("herald-load".into())
            .spawn(move || load_rest(weak, from))
            .map_err(|e| EngineError::Internal(format!("cannot start the index loader: {e}")))?;
    }
    Ok(())
}

/// What phase 1 found in the live index.
struct IndexScan {
    pending: usize,
    paused: usize,
    /// Tasks that were sending when herald stopped: resumed before ready.
    running_ids: Vec<Arc<str>>,
    /// Records that could not be read (reported and skipped).
    corrupt: usize,
    /// The first due key past the horizon: phase 2 loads from there (`None`: all loaded).
    rest_from: Option<Vec<u8>>,
}

/// Phase 1: the live index up to `until` (running tasks, then pending ones due by then) onto
/// the wheel. A record that does not decode is counted and skipped; a store that cannot be
/// read fails it.
///
/// The index is read without the live map's lock and put in the map a chunk of
/// [`READY_CHUNK`] entries per hold of it, as the background load does: held across the
/// whole scan (100 000 overdue tasks after an outage: seconds), it kept every worker that
/// took it (fire steps of the entries armed so far, `/metrics`) off the runtime, and
/// `/healthz` with them. Between two holds a fire step of a task already armed may change
/// it, and so move its entry to a key the scan has not reached: an id read a second time is
/// skipped (memory already knows better than that entry; and the task may have finished and
/// left the map meanwhile, which `load` could not tell from a task never seen). Nothing
/// else changes a task before ready (no command is served; `loading` is set from the first
/// hold on, so a claim is remembered as in phase 2).
fn scan_index(inner: &Arc<Inner>, until: u64) -> Result<IndexScan, EngineError> {
    let mut scan = IndexScan {
        pending: 0,
        paused: 0,
        running_ids: Vec::new(),
        corrupt: 0,
        rest_from: None,
    };
    inner.live.lock().loading = Some(Default::default());
    let mut seen = super::cells::IdSet::default();
    let mut chunk: Vec<(Arc<str>, LiveEntry)> = Vec::with_capacity(READY_CHUNK);
    for item in inner.store.due_entries(&[]) {
        let (key, id, entry) = match item {
            Ok(e) => e,
            Err(e @ StoreError::Corrupt { .. }) => {
                scan.corrupt += 1;
                tracing::error!(error = %e, "live index: a record could not be read");
                continue;
            }
            // The store itself failed: the entries after this one are still on disk, and
            // ready must not come without them (the running ones are resumed from this
            // scan alone). Start-up fails, as `resume_running`'s does.
            Err(e) => return Err(e.into()),
        };
        if beyond(&key, until) {
            scan.rest_from = Some(key);
            break;
        }
        let id: Arc<str> = Arc::from(id);
        if seen.contains(&id) {
            continue;
        }
        match entry.state {
            TaskState::Pending => scan.pending += 1,
            TaskState::Paused => scan.paused += 1,
            TaskState::Running => scan.running_ids.push(id.clone()),
            // A finished task has no live entry; one that says so is stale: skip it.
            _ => continue,
        }
        seen.insert(id.clone());
        chunk.push((id, entry));
        if chunk.len() == READY_CHUNK {
            put_chunk(inner, &mut chunk, false);
        }
    }
    put_chunk(inner, &mut chunk, scan.rest_from.is_none());
    Ok(scan)
}

/// Phase 1's entries read so far into the live map and onto the wheel, under one hold of the
/// map's lock (`last`: the whole index is loaded, nothing is left for the background).
fn put_chunk(inner: &Arc<Inner>, chunk: &mut Vec<(Arc<str>, LiveEntry)>, last: bool) {
    let mut live = inner.live.lock();
    let mut arm = Vec::with_capacity(chunk.len());
    for (id, entry) in chunk.drain(..) {
        if live.load(&id) {
            arm.extend(entry_fire(inner, &id, &entry));
        }
    }
    // Sent under the lock, as the background load's: a task claimed after this chunk is
    // applied moves its wheel entry after this one.
    inner.timer.at_many(arm);
    if last {
        live.loading = None;
    }
}

/// Resumes the tasks that were sending (`plan::recover`); returns how many could not be read.
/// An error that a later try may not meet (the store unavailable or busy: `step::is_retryable`)
/// ends it: the task is not taken for unreadable, and the caller tries them all again
/// (start-up fails; a granted shard is let go and loaded anew, `cluster::load_shard`).
/// `alive_ms`: the last process's life sign (`alive.rs`; 0 for none, and in cluster mode).
pub(crate) async fn resume_running(
    inner: &Arc<Inner>,
    running_ids: Vec<Arc<str>>,
    now: u64,
    alive_ms: u64,
) -> Result<usize, EngineError> {
    let mut corrupt = 0;
    for id in running_ids {
        let mut l = match commit::lock(inner, &id).await {
            Ok(Some(l)) => l,
            Ok(None) => continue,
            Err(e) if super::step::is_retryable(&e) => return Err(e),
            Err(e) => {
                corrupt += 1;
                tracing::error!(task = %id, error = %e, "task could not be recovered");
                continue;
            }
        };
        let st = l.st();
        // Issue 28: a run armed before the outage whose first message never left is judged
        // on when that send would start now (its grace), on its record as it is on disk.
        let raw: Vec<_> = match inner.store.active_runs_of(&id) {
            Ok(runs) => runs
                .into_iter()
                .filter(|r| st.runs.contains_key(&r.run))
                .collect(),
            Err(e) => {
                tracing::warn!(task = %id, error = %e, "runs not judged for misfire_grace: cannot be read again");
                Vec::new()
            }
        };
        let change = super::plan::recover(
            &st.spec,
            &st.progress,
            &raw,
            &st.runs,
            now,
            inner.boot_ms,
            alive_ms,
        )?;
        for r in change.runs.iter().filter(|r| r.state == RunState::Expired) {
            tracing::warn!(task = %id, run = r.run, reason = %crate::logsafe::Opt(r.reason.as_deref()),
                "run armed before the outage expired: its first message would start later than misfire_grace");
        }
        commit::resumed(inner, &mut l, change).await?;
        l.release(inner);
    }
    Ok(corrupt)
}

/// Failure-list retries that were under way go on (`arm`; in cluster mode they go on with
/// their shards instead, `cluster.rs`); counts the list. Returns (retries under way, records
/// that could not be read).
fn resume_failure_retries(
    inner: &Arc<Inner>,
    now: u64,
    arm: bool,
) -> Result<(usize, usize), EngineError> {
    let (mut retries, mut corrupt) = (0usize, 0usize);
    let mut listed = 0u64;
    for item in inner.store.all_failures() {
        if item.is_ok() {
            listed += 1;
        }
        match item {
            Ok(f) if f.retrying => {
                retries += 1;
                if arm {
                    inner.timer.at(Key::retry(&f.id), now);
                }
            }
            Ok(_) => {}
            Err(e @ StoreError::Corrupt { .. }) => {
                corrupt += 1;
                tracing::error!(error = %e, "skipping a failure record that cannot be read");
            }
            // The store itself failed: the retries after this record would never be armed.
            // Start-up fails instead, as the index scan's does.
            Err(e) => return Err(e.into()),
        }
    }
    inner
        .failures
        .store(listed, std::sync::atomic::Ordering::Relaxed);
    Ok((retries, corrupt))
}

/// Phase 2: the rest of the live index from due key `from` on, in due order, a chunk at a
/// time (the live map is locked per chunk, never across a read). Stops early if the engine
/// is dropped.
fn load_rest(inner: Weak<Inner>, from: Vec<u8>) {
    let started = std::time::Instant::now();
    let (mut loaded, mut corrupt, mut retries) = (0usize, 0usize, 0u64);
    let mut start = from;
    loop {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if let Some(hold) = &inner.config.hold_index_load {
            if hold.load(std::sync::atomic::Ordering::Acquire) {
                drop(inner);
                std::thread::sleep(std::time::Duration::from_millis(2));
                continue;
            }
        }
        let mut chunk: Vec<(Arc<str>, LiveEntry)> = Vec::with_capacity(LOAD_CHUNK);
        let mut next = None;
        let mut unreadable = None;
        for item in inner.store.due_entries(&start) {
            match item {
                Ok((key, id, entry)) => {
                    if chunk.len() == LOAD_CHUNK {
                        next = Some(key);
                        break;
                    }
                    chunk.push((Arc::from(id), entry));
                }
                Err(e @ StoreError::Corrupt { .. }) => {
                    corrupt += 1;
                    tracing::error!(error = %e, "live index: a record could not be read");
                }
                // The store itself failed (a reopen of sled after an I/O error, a full
                // disk's heal): the scan ends here, but the entries after it are still on
                // disk. Read this chunk again once the store answers; ending the load here
                // would leave every task after `start` off the wheel until a restart.
                Err(e) => {
                    unreadable = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = unreadable {
            if retries % 50 == 0 {
                tracing::warn!(error = %e, retries, "live index: the store cannot be read; the load tries again");
            }
            retries += 1;
            drop(inner);
            std::thread::sleep(LOAD_RETRY);
            continue;
        }
        {
            let mut live = inner.live.lock();
            let mut arm = Vec::with_capacity(chunk.len());
            for (id, entry) in &chunk {
                // Running tasks were all read before ready; finished ones have no entry.
                if matches!(entry.state, TaskState::Pending | TaskState::Paused) && live.load(id) {
                    arm.extend(entry_fire(&inner, id, entry));
                    loaded += 1;
                }
            }
            // Sent under the lock: a command that adopts a task after this chunk is applied
            // moves its wheel entry after this one.
            inner.timer.at_many(arm);
            if next.is_none() {
                live.loading = None;
            }
        }
        match next {
            Some(k) => start = k,
            None => break,
        }
    }
    tracing::info!(
        loaded,
        corrupt,
        took_ms = started.elapsed().as_millis() as u64,
        "live index loaded"
    );
}

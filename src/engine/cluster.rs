//! Cluster mode in the engine (HA.md, issue 24): this process acts only on the tasks of the
//! shards it holds. The lease loop (`cluster/node.rs`) reports each shard gained or lost;
//! here a gained shard's live tasks are loaded (as start-up does, for that shard alone) and a
//! lost one's are let go.
//!
//! Safety does not rest on the unload being quick. Three checks stand in the way of acting on
//! a shard not held, each on the monotonic trust window (`cluster/lease.rs`):
//! - the dispatcher drops a wheel key whose task's shard is not held ([`Inner::owns`]), so a
//!   stale entry left on the wheel does nothing;
//! - a send starts only with at least `safety` of trust left, and is cut off when the window
//!   ends ([`Inner::send_window`]); its in-flight mark is on disk, so the next owner sends it
//!   again with the same idempotency key, after this attempt's deadline has passed (the new
//!   owner is granted the row only after the lease ran out, which is after this node's trust
//!   ended). A step that finds the window closed comes back shortly (`step::window_closed`):
//!   a renewal answered late can extend the trust before it ends, and then the shard is
//!   neither dropped nor loaded again;
//! - every write is fenced in the store (`store/pg/fence.rs`): one to a shard taken over is
//!   refused with `OwnershipLost` and changes nothing.
//!
//! Tasks created on a node that does not hold their shard are written with an inbox row
//! (`fence.rs`); the owner takes them out of the inbox and loads them when the `LISTEN`
//! connection hears the group's `NOTIFY` (`cluster/listen.rs`), and at least every
//! [`INBOX_EVERY`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use super::arm::arm_entry;
use super::timer::Key;
use super::Inner;
use crate::cluster::node::{Event, Ownership};
use crate::model::TaskState;
use crate::store::backend::TreeId;
use crate::store::pg::fence::shard_of_task;
use crate::store::pg::shard::task_id_of;

/// The inbox's floor: it is read at least this often (HA.md: at least every 500 ms), and at
/// once on each `NOTIFY herald_inbox` (`cluster/listen.rs`).
pub const INBOX_EVERY: Duration = Duration::from_millis(500);
/// Test knob, not configuration: the inbox floor in milliseconds instead of
/// [`INBOX_EVERY`] (`tests/cluster_inbox.rs` makes it a minute, so that only the
/// notification can deliver a create through the inbox in time). Read once at start.
pub const INBOX_FLOOR_ENV: &str = "HERALD_TEST_INBOX_FLOOR_MS";

/// Test knob, not configuration: a file's path; while that file exists, every send window
/// reads closed, as when a renewal answered late leaves too little trust to send but the
/// shards stay held (`tests/cluster_send_window.rs`). Read once at start.
pub const WINDOW_GATE_ENV: &str = "HERALD_TEST_WINDOW_GATE";

/// The file of [`WINDOW_GATE_ENV`], if set.
fn window_gate() -> Option<&'static Path> {
    static GATE: OnceLock<Option<PathBuf>> = OnceLock::new();
    knob_file(&GATE, WINDOW_GATE_ENV, "send windows read closed")
}

/// A test knob's file, read from `env` once and logged (with `what` it does) when set.
fn knob_file(
    cell: &'static OnceLock<Option<PathBuf>>,
    env: &str,
    what: &str,
) -> Option<&'static Path> {
    cell.get_or_init(|| {
        let file = std::env::var_os(env).map(PathBuf::from);
        if let Some(f) = &file {
            tracing::warn!(file = %f.display(), "test knob {env}: {what} while this file exists");
        }
        file
    })
    .as_deref()
}

/// Test knob: while the file this names exists, the engine reads every shard as held but
/// not trusted (`Inner::owns` false, `Inner::holds` true), as in the moment between a
/// shard's trust running out and a renewal answered late extending it. The store's fence and
/// the lease loop are not affected. For `tests/cluster_trust_gap.rs`; logged when set.
pub const TRUST_GAP_ENV: &str = "HERALD_TEST_TRUST_GAP";

/// The file of [`TRUST_GAP_ENV`], if set.
fn trust_gap() -> Option<&'static Path> {
    static GAP: OnceLock<Option<PathBuf>> = OnceLock::new();
    knob_file(&GAP, TRUST_GAP_ENV, "shards read held but not trusted")
}

/// This process's part of a cluster, as the engine sees it.
#[derive(Clone)]
pub struct ClusterHooks {
    /// `[cluster] node_id`.
    pub node_id: String,
    pub ownership: Arc<Ownership>,
    /// S, as the database has it.
    pub shards: u32,
    /// `[cluster] max_clock_offset`: how far any node's clock may be from the database's
    /// (an inherited in-flight mark waits twice this on top of its send timeout).
    pub max_clock_offset_ms: u64,
    /// Woken by the `LISTEN` connection on each `NOTIFY herald_inbox` (`cluster/listen.rs`):
    /// the inbox is drained at once instead of at the next floor tick.
    pub inbox_wake: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for ClusterHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterHooks")
            .field("shards", &self.shards)
            .field("owned", &self.ownership.count())
            .finish()
    }
}

/// How long a send may take, as the cluster allows it.
pub(crate) enum Window<'a> {
    /// Not in cluster mode.
    Unbounded,
    /// Not held, or too little trust left: the send does not start.
    Closed,
    /// It must be over within this; the guard counts it as under way on its shard; the
    /// shard's epoch goes out with it (`herald-epoch`).
    Within(Duration, crate::cluster::node::Sending<'a>, u64),
}

impl Inner {
    fn shard_of(&self, task: &str) -> Option<(&ClusterHooks, u32)> {
        let c = self.config.cluster.as_ref()?;
        Some((c, shard_of_task(task, c.shards)))
    }

    /// Whether this process may act on `task` now (always, outside cluster mode).
    pub(crate) fn owns(&self, task: &str) -> bool {
        match self.shard_of(task) {
            None => true,
            Some(_) if trust_gap().is_some_and(Path::exists) => false,
            Some((c, s)) => c.ownership.epoch(s).is_some(),
        }
    }

    /// Whether the task's shard is being handed over ([`crate::cluster::node::Ownership::releasing`]).
    pub(crate) fn releasing(&self, task: &str) -> bool {
        match self.shard_of(task) {
            None => false,
            Some((c, s)) => c.ownership.releasing(s),
        }
    }

    /// Whether the task's shard is held by this process, trusted now or not
    /// ([`crate::cluster::node::Ownership::holds`]). A key or an inbox row of a shard held
    /// but not trusted for a moment is kept for later, not dropped: were the trust renewed,
    /// nothing would bring it back (nemesis seed 2912079: a one-shot due in such a moment
    /// stayed pending on a shard its node held to the end).
    pub(crate) fn holds(&self, task: &str) -> bool {
        match self.shard_of(task) {
            None => true,
            Some((c, s)) => c.ownership.holds(s),
        }
    }

    /// Whether the wheel key's task's shard is held ([`Inner::holds`]).
    pub(crate) fn holds_key(&self, key: &Key) -> bool {
        self.holds(&key_task(key))
    }

    /// Whether this process may act on the wheel key now.
    pub(crate) fn owns_key(&self, key: &Key) -> bool {
        self.owns(&key_task(key))
    }

    /// See [`Window`].
    pub(crate) fn send_window(&self, task: &str) -> Window<'_> {
        match self.shard_of(task) {
            None => Window::Unbounded,
            Some(_) if window_gate().is_some_and(Path::exists) => Window::Closed,
            Some((c, s)) => {
                // Counted before the window is read: a handover that begins in between
                // either sees this send or the send sees the shard gone.
                let guard = c.ownership.sending(s);
                match (c.ownership.send_window_ms(s), c.ownership.epoch(s)) {
                    (Some(ms), Some(epoch)) => {
                        Window::Within(Duration::from_millis(ms), guard, epoch)
                    }
                    _ => Window::Closed,
                }
            }
        }
    }
}

/// The task a wheel key acts on.
fn key_task(key: &Key) -> std::borrow::Cow<'_, str> {
    match key {
        Key::Fire(t) | Key::Run(t, _) => std::borrow::Cow::Borrowed(t),
        Key::Retry(f) => {
            let task = task_id_of(TreeId::Failures, f.as_bytes(), None);
            std::borrow::Cow::Owned(String::from_utf8_lossy(&task).into_owned())
        }
    }
}

/// Carries the lease loop's events out until it ends.
pub(crate) async fn follow(inner: Weak<Inner>, mut events: UnboundedReceiver<Event>) {
    while let Some(ev) = events.recv().await {
        let Some(inner) = inner.upgrade() else { return };
        match ev {
            Event::Granted(g) => load_shard(&inner, g.shard).await,
            Event::Dropped { shard, .. } | Event::Released(shard) => unload_shard(&inner, shard),
        }
    }
}

/// A granted shard: its live tasks onto the wheel, its running ones resumed (start-up's
/// phases for one shard: `recovery.rs`).
async fn load_shard(inner: &Arc<Inner>, shard: u32) {
    let started = std::time::Instant::now();
    let i = inner.clone();
    let read = tokio::task::spawn_blocking(move || i.store.shard_due_entries(shard)).await;
    let entries = match read {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => {
            // Not loaded: nothing of it is acted on here. The lease runs out unrenewed?
            // No: it is renewed, so drop it for another round to load it again.
            tracing::error!(shard, error = %e, "a granted shard could not be read; it is let go");
            if let Some(c) = &inner.config.cluster {
                crate::store::pg::fence::Fence::lost(c.ownership.as_ref(), shard);
            }
            return;
        }
        Err(_) => return,
    };
    let mut running = Vec::new();
    let (mut pending, mut corrupt) = (0usize, 0usize);
    {
        let mut live = inner.live.lock();
        for item in entries {
            let (_, id, entry) = match item {
                Ok(e) => e,
                Err(e) => {
                    corrupt += 1;
                    tracing::error!(shard, error = %e, "live index: a record could not be read");
                    continue;
                }
            };
            if entry.state.is_terminal() {
                continue;
            }
            let id: Arc<str> = Arc::from(id);
            inner.store.forget_timeline_seq(&id);
            if live.load(&id) {
                arm_entry(inner, &id, &entry);
                pending += 1;
                if entry.state == TaskState::Running {
                    running.push(id);
                }
            }
        }
    }
    let resumed = running.len();
    let now = inner.clock.now_ms();
    match super::recovery::resume_running(inner, running, now).await {
        Ok(c) => corrupt += c,
        Err(e) => {
            // Those not resumed would sit in the live map with nothing on the wheel until the
            // shard next moved: let it go, as one that could not be read, to be loaded anew.
            tracing::error!(shard, error = %e, "running tasks of a granted shard not resumed; it is let go");
            if let Some(c) = &inner.config.cluster {
                crate::store::pg::fence::Fence::lost(c.ownership.as_ref(), shard);
            }
        }
    }
    tracing::info!(
        shard,
        tasks = pending,
        running = resumed,
        corrupt,
        took_ms = started.elapsed().as_millis() as u64,
        "shard loaded"
    );
}

/// A shard lost or handed over: its tasks leave the live map and their fires the wheel.
/// Their run keys may stay on the wheel; the dispatcher drops them ([`Inner::owns_key`]).
fn unload_shard(inner: &Arc<Inner>, shard: u32) {
    let Some(c) = &inner.config.cluster else {
        return;
    };
    let shards = c.shards;
    let mut live = inner.live.lock();
    let ids = live.ids_where(|id| shard_of_task(id, shards) == shard);
    for id in &ids {
        live.remove(id);
        inner.timer.cancel(Key::Fire(id.clone()));
    }
    drop(live);
    tracing::info!(shard, tasks = ids.len(), "shard unloaded");
}

/// A task this process created for a shard it does not hold: out of the live map and off the
/// wheel (the owner loads it from the inbox; were it kept here, a later grant of the shard
/// would find it "loaded" and never arm it).
pub(crate) fn let_go(inner: &Inner, id: &str) {
    inner.live.lock().remove(id);
    inner.timer.cancel(Key::fire(id));
}

/// A create is durable: its cell is let go, and out of the live map if another node owns
/// its shard (written with an inbox row: that node loads it).
///
/// The shard may have been dropped and granted again while the create's write waited (a
/// renewal answered past the trust window: nemesis seed 2912079). The drop took the task out
/// of the live map and its fire off the wheel; the grant's load read the shard before the
/// write was in it; the write then went in under the new epoch, with no inbox row, since
/// the shard was held. So a task of a shard held now that is not in the live map is put back
/// and armed here: else its fire would find no live task and the task would wait, pending,
/// until the shard next moved.
pub(crate) fn created(
    inner: &Inner,
    l: super::cells::Locked,
    cell: Arc<super::LiveTask>,
    task: &crate::model::Task,
) {
    if inner.holds(&l.id) {
        if inner.config.cluster.is_some() {
            // Before the guard is let go: a cancel waiting for it then finds the task live.
            // Under the map's lock, as the inbox's drain does: an unload comes before or after.
            let mut live = inner.live.lock();
            if inner.holds(&l.id) && live.load(&l.id) {
                tracing::warn!(task = %l.id, "a create's shard was let go and held again while it was written; its task is loaded again");
                super::arm::sync_fire_new(inner, &l.id, task);
            }
        }
        // Only the map and the guard may hold the cell for it to be unloaded.
        drop(cell);
        l.release(inner);
    } else {
        // Let go before the lock is: a command waiting for it then finds no live task.
        let_go(inner, &l.id);
        drop(l);
    }
}

/// The inbox's floor: the test knob [`INBOX_FLOOR_ENV`] if set (milliseconds), else
/// [`INBOX_EVERY`]. Read once, when the drain starts.
fn inbox_floor() -> Duration {
    std::env::var(INBOX_FLOOR_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(INBOX_EVERY, Duration::from_millis)
}

/// Takes tasks created on other nodes out of the inbox and loads them, on each wake-up of
/// the `LISTEN` connection (`cluster/listen.rs`) and at least every [`INBOX_EVERY`], until
/// the engine is gone.
pub(crate) async fn drain_inbox(inner: Weak<Inner>) {
    let floor = inbox_floor();
    if floor != INBOX_EVERY {
        tracing::warn!(
            floor_ms = floor.as_millis() as u64,
            "test knob {INBOX_FLOOR_ENV}: the inbox timer is not HA.md's"
        );
    }
    let Some(wake) = inner
        .upgrade()
        .and_then(|i| i.config.cluster.as_ref().map(|c| c.inbox_wake.clone()))
    else {
        return;
    };
    loop {
        let woken = tokio::select! {
            _ = tokio::time::sleep(floor) => false,
            _ = wake.notified() => true,
        };
        let Some(inner) = inner.upgrade() else { return };
        let i = inner.clone();
        // The reads block on the store's runtime: off the tokio workers.
        let read = tokio::task::spawn_blocking(move || -> Result<_, crate::store::StoreError> {
            let mut out = Vec::new();
            for id in i.store.take_inbox()? {
                if !i.holds(&id) {
                    continue; // lost meanwhile: the next owner loads it with its shard
                }
                match i.store.live_entry(&id) {
                    Ok(Some(e)) if !e.state.is_terminal() => out.push((id, e)),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(task = %id, error = %e, "a task from the inbox cannot be read")
                    }
                }
            }
            Ok(out)
        });
        let entries = match read.await {
            Ok(Ok(e)) => e,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "the inbox could not be read; trying again");
                continue;
            }
            Err(_) => continue,
        };
        if !entries.is_empty() {
            tracing::debug!(tasks = entries.len(), woken, "tasks taken from the inbox");
        }
        let mut live = inner.live.lock();
        for (id, entry) in entries {
            // Again under the map's lock: a shard lost since the read is unloaded after this
            // (its unload takes the lock), or was already and must not get the task back.
            // Held but not trusted this moment is still ours: its row is gone from the inbox.
            if !inner.holds(&id) {
                continue;
            }
            let id: Arc<str> = Arc::from(id);
            if live.load(&id) {
                arm_entry(&inner, &id, &entry);
            }
        }
    }
}

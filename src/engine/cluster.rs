//! Cluster mode in the engine (HA.md, issue 24): this process acts only on the tasks of the
//! shards it holds. The lease loop (`cluster/node.rs`) reports each shard gained or lost;
//! here a gained shard's live tasks are loaded (as start-up does, for that shard alone) and a
//! lost one's are let go.
//!
//! Safety does not rest on the unload being quick. Three checks stand in the way of acting on
//! a shard not held, each on the monotonic trust window (`cluster/lease.rs`):
//! - the dispatcher drops a wheel key whose task's shard is not held ([`Inner::owns`]), so a
//!   stale entry left on the wheel does nothing;
//! - a send starts only with at least `safety` of trust left ([`Inner::send_window`]), and is
//!   cut off when the trust ends, as renewals keep extending it, or when its shard is let go
//!   or held at another epoch ([`Inner::trust_left`], `step::cut_off_at`); its in-flight
//!   mark is on disk, so the next owner sends it again with the same idempotency key, after
//!   this attempt's deadline has passed (the new
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
use crate::cluster::rows::Grant;
use crate::model::TaskState;
use crate::store::backend::TreeId;
use crate::store::pg::fence::shard_of_task;
use crate::store::pg::shard::task_id_of;
use crate::store::records::LiveEntry;

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

/// Test knob, not configuration: a file's path; a shard's load that finds that file deletes
/// it and panics, so exactly one load fails that way (`tests/cluster_load_fail.rs`: the shard
/// is let go and loaded again at its next grant). Read once at start; logged when set.
pub const LOAD_PANIC_ENV: &str = "HERALD_TEST_LOAD_PANIC";

/// Test knob, not configuration: a file's path; while that file exists, a shard's load waits
/// before it reads the shard, holding up the engine's event loop behind it as a slow load
/// does during a failover (`tests/cluster_send_window.rs`: a drop queued behind it must still
/// cut its sends at once). Read once at start; logged when set.
pub const LOAD_HOLD_ENV: &str = "HERALD_TEST_LOAD_HOLD";

/// Waits while the file of [`LOAD_HOLD_ENV`] exists (not at all when it is not set).
async fn load_held(shard: u32) {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    let Some(file) = knob_file(&FILE, LOAD_HOLD_ENV, "shard loads wait") else {
        return;
    };
    if file.exists() {
        tracing::warn!(shard, "test knob {LOAD_HOLD_ENV}: this shard's load waits");
    }
    while file.exists() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether this load is the one [`LOAD_PANIC_ENV`] makes panic (its file removed: only the
/// load that removes it does).
fn load_panics() -> bool {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    knob_file(&FILE, LOAD_PANIC_ENV, "the next shard load panics")
        .is_some_and(|f| std::fs::remove_file(f).is_ok())
}

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
    pub(super) fn shard_of(&self, task: &str) -> Option<(&ClusterHooks, u32)> {
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

    /// The epoch `task`'s shard is held and trusted at now: what a cell about to be read from
    /// the store (or made by a create) is stamped with (`LiveState::loaded_at`). `None`
    /// outside cluster mode, and while the shard is not trusted (a read then is fenced at the
    /// epoch held at its writes, as every write was before).
    pub(crate) fn load_epoch(&self, task: &str) -> Option<u64> {
        let (c, s) = self.shard_of(task)?;
        c.ownership.epoch(s)
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

impl Inner {
    /// The trust left now on `task`'s shard held at `epoch`, for a send already under way on
    /// it (`step::cut_off_at`): renewals extend it; `None` once the shard is no longer held
    /// at that epoch or its trust has ended (and outside cluster mode).
    pub(super) fn trust_left(&self, task: &str, epoch: u64) -> Option<Duration> {
        let (c, s) = self.shard_of(task)?;
        c.ownership
            .trust_left_ms(s, epoch)
            .map(Duration::from_millis)
    }

    /// What changes each time a shard is let go (by the lease loop as it drops or releases
    /// it, and again by [`unload_shard`]); `None` outside cluster mode.
    pub(super) fn watch_let_go(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.config.cluster.as_ref()?.ownership.watch_let_go())
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

/// Carries the lease loop's events out until it ends. The grants of one balancing round
/// come together: each shard is loaded, then their failure-list retries are read in one scan.
pub(crate) async fn follow(inner: Weak<Inner>, mut events: UnboundedReceiver<Event>) {
    let mut next = None;
    loop {
        let ev = match next.take() {
            Some(ev) => ev,
            None => match events.recv().await {
                Some(ev) => ev,
                None => return,
            },
        };
        let Some(inner) = inner.upgrade() else { return };
        match ev {
            Event::Granted(g) => {
                let mut grants = vec![g];
                while let Ok(ev) = events.try_recv() {
                    match ev {
                        Event::Granted(g) => grants.push(g),
                        // Kept in order: handled after these grants.
                        other => {
                            next = Some(other);
                            break;
                        }
                    }
                }
                for g in &grants {
                    // A task of its own: a panic in a load (a bug) ends that task, not this
                    // loop, and lets the shard go like any failed load.
                    if tokio::spawn(load_shard(inner.clone(), *g)).await.is_err() {
                        tracing::error!(
                            shard = g.shard,
                            "loading a granted shard panicked; it is let go"
                        );
                        let_shard_go(&inner, *g);
                    }
                }
                arm_failure_retries(&inner, &grants).await;
            }
            Event::Dropped { shard, .. } | Event::Released(shard) => unload_shard(&inner, shard),
        }
    }
}

/// A shard granted at an epoch could not be loaded (a store error, or a panic): let go (if
/// still held at that epoch), for another round to grant and load it again, here or on
/// another node. Not retried in place: a load cut short may have put part of the shard in the
/// live map, and the drop's unload takes all of it out, so the next grant loads it whole at a
/// new epoch, from what the database holds then (HA.md: a shard is acted on only as loaded
/// under the epoch it is held at; an ambiguous state drops it, to be acquired again). A shard
/// held but never loaded would be renewed with nothing of it ever sent.
fn let_shard_go(inner: &Inner, g: Grant) {
    if let Some(c) = &inner.config.cluster {
        c.ownership.load_failed_at(g.shard, g.epoch);
    }
}

/// Gives the lease loop what a graceful handover (a balancing round's, or a leave's) runs
/// before it frees a shard's row (`cluster/node.rs`, `Ownership::before_release`): the
/// attempts armed ahead on the shard's loaded tasks (a one-shot's 2 s before its instant, a
/// sequence's 100 ms before its send) are taken back durably, under the epoch still held, as
/// a drain does for every task (`step::stand_down_all`). Left armed, the next owner loads
/// each mark as a send of ours that may still be under way: it waits it out (the channel's
/// send timeout and twice `max_clock_offset` past the instant) and sends a second attempt
/// with `resumed_after_restart`, for a message that never left. No step sends on a shard
/// being handed over, so none is armed again before the row is freed (`step.rs`,
/// `run_step_once`, `fire_locked`). Not on a shard lost (its trust ended or a write was
/// fenced: nothing can be written to it). The hook holds the engine weakly: it is held by the
/// engine's own `Ownership`.
pub(crate) fn stand_down_on_release(inner: &Arc<Inner>) {
    let Some(c) = &inner.config.cluster else {
        return;
    };
    let (weak, count) = (Arc::downgrade(inner), c.shards);
    c.ownership
        .set_before_release(Arc::new(move |shards: &[u32], until| {
            let (weak, shards) = (weak.clone(), shards.to_vec());
            tokio::spawn(async move {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let of = |id: &str| shards.contains(&shard_of_task(id, count));
                let taken = super::step::stand_down_all(&inner, until, of).await;
                if taken > 0 {
                    tracing::info!(
                        ?shards,
                        tasks = taken,
                        "handover: attempts armed ahead of their instant taken back"
                    );
                }
            })
        }));
}

/// A granted shard's due entries, read on a blocking thread; `None` (logged) when the read
/// failed or panicked. Not loaded, nothing of the shard is acted on here; but its lease is
/// renewed, so the caller lets it go for another round to load it again.
async fn read_shard(inner: &Arc<Inner>, shard: u32) -> Option<Vec<crate::store::DueItem>> {
    let i = inner.clone();
    let read = tokio::task::spawn_blocking(move || {
        if load_panics() {
            #[allow(clippy::panic, reason = "the test knob's whole point")]
            {
                panic!("test knob {LOAD_PANIC_ENV}: shard {shard}'s load panics");
            }
        }
        i.store.shard_due_entries(shard)
    })
    .await;
    match read {
        Ok(Ok(e)) => Some(e),
        Ok(Err(e)) => {
            tracing::error!(shard, error = %e, "a granted shard could not be read; it is let go");
            None
        }
        // A panic (a bug), as a read that failed (review finding: the shard stayed held,
        // renewed, and never loaded).
        Err(e) => {
            tracing::error!(shard, error = %e, "reading a granted shard panicked; it is let go");
            None
        }
    }
}

/// A granted shard: its live tasks onto the wheel, its running ones resumed (start-up's
/// phases for one shard: `recovery.rs`).
async fn load_shard(inner: Arc<Inner>, g: Grant) {
    let inner = &inner;
    let shard = g.shard;
    let started = std::time::Instant::now();
    load_held(shard).await;
    let Some(entries) = read_shard(inner, shard).await else {
        let_shard_go(inner, g);
        return;
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
    match super::recovery::resume_running(inner, running, now, 0).await {
        Ok(c) => corrupt += c,
        Err(e) => {
            // Those not resumed would sit in the live map with nothing on the wheel until the
            // shard next moved: let it go, as one that could not be read, to be loaded anew.
            tracing::error!(shard, error = %e, "running tasks of a granted shard not resumed; it is let go");
            let_shard_go(inner, g);
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

/// The failure-list retries under way (`retrying`) of tasks in the shards just granted, onto
/// the wheel: start-up arms none in cluster mode (no shard is held then; the dispatcher would
/// drop them), and a retry asked for on another owner goes on here after a takeover. One scan
/// of the list for a round's grants. A store error lets those shards go, to be granted and
/// loaded again.
async fn arm_failure_retries(inner: &Arc<Inner>, grants: &[Grant]) {
    let Some(c) = &inner.config.cluster else {
        return;
    };
    let (shards, granted): (u32, Vec<u32>) = (c.shards, grants.iter().map(|g| g.shard).collect());
    let i = inner.clone();
    let read = tokio::task::spawn_blocking(move || {
        let mut ids = Vec::new();
        for item in i.store.all_failures() {
            match item {
                Ok(f) if f.retrying && granted.contains(&shard_of_task(&f.task_id, shards)) => {
                    ids.push(f.id);
                }
                Ok(_) => {}
                // Start-up counted and logged it; nothing to arm.
                Err(crate::store::StoreError::Corrupt { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ids)
    })
    .await;
    match read {
        Ok(Ok(ids)) => {
            let now = inner.clock.now_ms();
            for id in &ids {
                inner.timer.at(Key::retry(id), now);
            }
            if !ids.is_empty() {
                tracing::info!(
                    retries = ids.len(),
                    "failure-list retries of granted shards resumed"
                );
            }
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "the failure list could not be read for granted shards; they are let go");
            for g in grants {
                let_shard_go(inner, *g);
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "reading the failure list for granted shards panicked; they are let go");
            for g in grants {
                let_shard_go(inner, *g);
            }
        }
    }
}

/// A shard lost or handed over: its tasks leave the live map and their fires the wheel.
/// Their run keys may stay on the wheel; the dispatcher drops them ([`Inner::owns_key`]).
/// Its sends under way were cut off when the lease loop let it go (`node.rs`, `Loop::report`:
/// each looks at its shard again, `step::cut_off_at`), not here: this runs only once the
/// loads queued ahead of the event are done. Let go again here, which is harmless (a send
/// woken reads its shard again and goes on if it is held).
fn unload_shard(inner: &Arc<Inner>, shard: u32) {
    let Some(c) = &inner.config.cluster else {
        return;
    };
    c.ownership.shard_let_go();
    let shards = c.shards;
    let mut live = inner.live.lock();
    let ids = live.ids_where(|id| shard_of_task(id, shards) == shard);
    for id in &ids {
        live.remove(id);
        inner.timer.cancel(Key::Fire(id.clone()));
    }
    drop(live);
    // Another node writes these tasks' events from now on (finished ones' too: their failure
    // entries are retried and dismissed by the shard's owner): a counter kept here would give
    // seqs that node already used, when the shard comes back (review finding).
    inner
        .store
        .forget_timeline_seqs_where(|id| shard_of_task(id, shards) == shard);
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

/// The first wait before ids whose task could not be read are read again; it doubles on
/// each failed round, up to [`KEPT_WAIT_MAX`].
const KEPT_WAIT_FIRST: Duration = Duration::from_millis(250);
/// The longest wait between two reads of ids kept from the inbox.
const KEPT_WAIT_MAX: Duration = Duration::from_secs(5);

/// Ids taken out of the inbox whose task could not be read yet (a connection reset, a
/// database restart, the store's backoff after a connection failure, which refuses every
/// later read of the round at once). Their inbox rows are gone: an id forgotten here left a
/// create answered 201 unarmed on its owner until the shard next moved. So each is kept until
/// its task is loaded, found finished or gone, or its shard is no longer held here (its next
/// owner loads it with the shard), and read again after a doubling wait.
#[derive(Debug, Default)]
struct Kept {
    ids: Vec<String>,
    /// When they are read again (`None`: nothing kept).
    at: Option<tokio::time::Instant>,
    wait: Duration,
}

impl Kept {
    /// The ids to read again now (all of them, once their time came), taken out.
    fn due(&mut self, now: tokio::time::Instant) -> Vec<String> {
        if self.at.is_some_and(|at| at <= now) {
            self.at = None;
            std::mem::take(&mut self.ids)
        } else {
            Vec::new()
        }
    }

    /// A round's reads are over: `failed` are kept (with a longer wait than the last); none
    /// failing and none kept resets the wait.
    fn failed(&mut self, failed: Vec<String>, now: tokio::time::Instant) {
        if failed.is_empty() {
            if self.ids.is_empty() {
                *self = Kept::default();
            }
            return;
        }
        self.ids.extend(failed);
        self.wait = (self.wait * 2).clamp(KEPT_WAIT_FIRST, KEPT_WAIT_MAX);
        self.at = Some(now + self.wait);
    }

    /// How long the drain may sleep: its floor, or less when kept ids are due sooner.
    fn nap(&self, floor: Duration, now: tokio::time::Instant) -> Duration {
        self.at
            .map_or(floor, |at| at.saturating_duration_since(now).min(floor))
    }
}

/// One round of the drain, on a blocking thread (the reads block on the store's runtime):
/// the ids of `kept` and those taken out of the inbox now, each task's live entry read.
/// Answers the entries to load and the ids to keep for later: each whose read failed, and
/// every one after the first failure, unread (the store's backoff would refuse them anyway).
fn read_round(i: &Inner, kept: Vec<String>) -> (Vec<(String, LiveEntry)>, Vec<String>) {
    let mut ids = kept;
    match i.store.take_inbox() {
        Ok(taken) => ids.extend(taken),
        // The backend keeps what a failed call may have taken out (`PgBackend::take_inbox`).
        Err(e) => tracing::debug!(error = %e, "the inbox could not be read; trying again"),
    }
    ids.sort_unstable();
    ids.dedup();
    let (mut out, mut keep) = (Vec::new(), Vec::new());
    for id in ids {
        if !i.holds(&id) {
            continue; // lost meanwhile: the next owner loads it with its shard
        }
        if !keep.is_empty() {
            keep.push(id);
            continue;
        }
        match i.store.live_entry(&id) {
            Ok(Some(e)) if !e.state.is_terminal() => out.push((id, e)),
            Ok(_) => {}
            Err(e @ crate::store::StoreError::Corrupt { .. }) => {
                tracing::error!(task = %id, error = %e, "a task from the inbox cannot be read: skipped");
            }
            Err(e) => {
                tracing::warn!(task = %id, error = %e, "a task from the inbox cannot be read now; it is read again later");
                keep.push(id);
            }
        }
    }
    (out, keep)
}

/// Takes tasks created on other nodes out of the inbox and loads them, on each wake-up of
/// the `LISTEN` connection (`cluster/listen.rs`) and at least every [`INBOX_EVERY`], until
/// the engine is gone. An id whose task could not be read is kept and read again ([`Kept`]).
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
    let mut kept = Kept::default();
    loop {
        let nap = kept.nap(floor, tokio::time::Instant::now());
        let woken = tokio::select! {
            _ = tokio::time::sleep(nap) => false,
            _ = wake.notified() => true,
        };
        let Some(inner) = inner.upgrade() else { return };
        let again = kept.due(tokio::time::Instant::now());
        let i = inner.clone();
        let read = tokio::task::spawn_blocking(move || read_round(&i, again)).await;
        let Ok((entries, failed)) = read else {
            continue;
        };
        kept.failed(failed, tokio::time::Instant::now());
        if !entries.is_empty() {
            tracing::debug!(tasks = entries.len(), woken, "tasks taken from the inbox");
        }
        load_taken(&inner, entries);
    }
}

/// Tasks read from the inbox into the live map and onto the wheel.
fn load_taken(inner: &Arc<Inner>, entries: Vec<(String, LiveEntry)>) {
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
            arm_entry(inner, &id, &entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_kept_from_the_inbox_are_read_again_after_a_doubling_wait() {
        let t0 = tokio::time::Instant::now();
        let floor = Duration::from_secs(120);
        let mut k = Kept::default();
        assert_eq!(k.nap(floor, t0), floor, "nothing kept: the floor");
        assert!(k.due(t0).is_empty());
        k.failed(vec!["a".into(), "b".into()], t0);
        assert_eq!(k.nap(floor, t0), KEPT_WAIT_FIRST);
        assert!(k.due(t0).is_empty(), "not yet");
        let t1 = t0 + KEPT_WAIT_FIRST;
        assert_eq!(k.due(t1), ["a", "b"]);
        // Read again and failed again: kept, the wait doubled.
        k.failed(vec!["a".into()], t1);
        assert_eq!(k.nap(floor, t1), KEPT_WAIT_FIRST * 2);
        // A round that read nothing kept does not forget them.
        k.failed(Vec::new(), t1);
        assert_eq!(k.ids, ["a"]);
        let t2 = t1 + KEPT_WAIT_FIRST * 2;
        assert_eq!(k.due(t2), ["a"]);
        k.failed(Vec::new(), t2);
        assert_eq!(k.nap(floor, t2), floor, "all read: the wait starts over");
        for _ in 0..10 {
            k.failed(vec!["c".into()], t2);
        }
        assert_eq!(k.wait, KEPT_WAIT_MAX);
    }
}

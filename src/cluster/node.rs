//! One process's lease loop (HA.md "Lease rows", "Trust window", "Balancing"): a task on its
//! own PostgreSQL connection that renews the shards it holds, says it is alive, takes free or
//! expired shards toward `ceil(S / live nodes)` and hands surplus over, and reports every
//! shard it gains or loses as an [`Event`]. The decisions are the pure modules' (`lease.rs`:
//! trust, `balance.rs`: which shards); this file only carries them out against the rows
//! (`rows.rs`).
//!
//! Safety rests on two things here:
//! - Trust is counted on this process's monotonic clock from when a statement was *sent*
//!   and ends `safety` before the row's lease can, so a paused or partitioned process stops
//!   trusting a shard before anyone else can be granted it (checked by
//!   `tests/cluster_node.rs` on one machine's clock).
//! - Every statement has a deadline, on this side and on the server's (`statement_timeout`,
//!   `lock_timeout`: [`session_timeouts`]); a renewal that does not answer in time is
//!   ambiguous and drops every shard it covered, and the connection is made afresh.
//! - A renewal is sent when it is due, beside whatever else the loop is waiting for on the
//!   connection (a clock probe, a balancing round: `Loop::beside_renewals`), never after it.
//! - While the connection is down, trust still ends on time: the wait between connection
//!   attempts (a doubling, jittered backoff: [`reconnect_wait_ms`]) and an attempt itself end
//!   at the next shard's trust end, whose drop is reported then.
//!
//! [`Ownership`] is what the rest of the process asks: which shards it may act on, at which
//! epoch (the fence of a commit group), and whether a send may start.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_postgres::{Client, NoTls};

use super::balance;
use super::lease::{Dropped, Leases, Timing};
use super::rows::{self, Grant};

/// Who this process is in the cluster.
#[derive(Clone, Debug)]
pub struct Identity {
    /// `[cluster] node_id` (several processes may share one, e.g. a restart).
    pub node_id: String,
    /// Random per process: what the rows are owned by.
    pub incarnation: String,
    /// `[cluster] advertise`: where other nodes forward requests to.
    pub advertise: Option<String>,
}

/// What changed about this process's shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Acquired at this epoch: load its tasks, arm its wheel.
    Granted(Grant),
    /// No longer to be acted on: stop its sends, drop its wheel entries, unload it.
    Dropped { shard: u32, why: Dropped },
    /// Handed over on purpose (balancing or leaving): as `Dropped`, then the row was freed.
    Released(u32),
}

/// What a graceful handover asks of the engine before it frees the rows of `shards`: take
/// back the attempts armed ahead on them (`engine/cluster.rs::stand_down_on_release`), by
/// `until` if it can. The task it answers ends when that is done.
pub type BeforeRelease =
    Arc<dyn Fn(&[u32], tokio::time::Instant) -> tokio::task::JoinHandle<()> + Send + Sync>;

/// The shards this process holds, as the rest of the process asks about them.
pub struct Ownership {
    leases: Mutex<Leases>,
    base: Instant,
    /// Shards the store's fence dropped, for the loop to report (it owns the event channel).
    lost: Mutex<Vec<Event>>,
    /// The last clock offset measured against the database (`offset.rs`), and whether it
    /// was within `max_clock_offset` (`None`: not measured yet).
    clock: Mutex<Option<(super::offset::Offset, bool)>>,
    /// The offset the engine's clock adds to its inner clock's MONOTONIC reading to read
    /// database time (`clock::OffsetClock`): database minus `node_clock`'s `mono_ms` at a
    /// probe's midpoint, from the last acceptable measurement (a node beyond the bound owns
    /// nothing to fire); `clock::NOT_MEASURED` until then.
    db_offset: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// The clock the engine's `OffsetClock` wraps ([`Ownership::set_node_clock`]): probes read
    /// its monotonic clock for `db_offset`, and its wall jumps make the loop measure again at
    /// once. None (the loop alone, in tests): no `db_offset` is measured.
    node_clock: Mutex<Option<Arc<dyn crate::clock::Clock>>>,
    /// The engine's `OffsetClock`'s highest reading (it never goes back), and how far it was
    /// held ahead of database time at the last measurement (`clock::held_ahead_ms`; 0: not).
    engine_reading: std::sync::Arc<std::sync::atomic::AtomicU64>,
    held_ahead_ms: std::sync::atomic::AtomicU64,
    /// What the last balancing round read: the shard rows, the nodes, and where each live
    /// owner can be reached (forwarding, `GET /v1/cluster`).
    view: Mutex<View>,
    /// Fenced writes the fence refused, each dropping its shard (`herald_fence_rejected`).
    /// Not a shard let go because its load failed (`shard_load_failed`), nor one dropped
    /// because a group's outcome is unknown (nothing was refused; logged).
    pub fence_rejected: std::sync::atomic::AtomicU64,
    /// Granted shards let go because their load failed (a store error or a panic), to be
    /// granted and loaded again (`herald_shard_load_failed`).
    pub shard_load_failed: std::sync::atomic::AtomicU64,
    /// Messages found in flight when a task was loaded, sent again (`herald_inflight_inherited`).
    pub inflight_inherited: std::sync::atomic::AtomicU64,
    /// How long renewals took to answer (`herald_lease_renew_seconds`).
    pub renew_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Per shard this node took over from an owner whose lease ran out: how long after it ran
    /// out (database time) the takeover came (`herald_failover_seconds`).
    pub failover_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Sends under way per shard ([`Ownership::sending`]): a handover waits for them.
    sends: Mutex<std::collections::HashMap<u32, usize>>,
    /// Set by the engine ([`Ownership::set_before_release`]); none: nothing to wait for.
    before_release: Mutex<Option<BeforeRelease>>,
    /// Moved on each time a shard is let go ([`Ownership::shard_let_go`]): every send under
    /// way looks at its own shard again and is cut off if it is no longer held at its epoch
    /// (`engine/step.rs`, `cut_off_at`). Moved where the held set loses the shard (the loop's
    /// [`Loop::report`], [`Ownership::fenced`]), after it lost it, so a send woken reads it
    /// gone; and again when the engine unloads the shard. One for all shards: drops are rare,
    /// and a send woken for another shard's (or twice for one) finds its own still held and
    /// goes on.
    let_go: watch::Sender<u64>,
}

/// A send under way on a shard, from its start to its end (dropped).
pub struct Sending<'a> {
    own: &'a Ownership,
    shard: u32,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        let mut m = self.own.sends.lock();
        if let Some(n) = m.get_mut(&self.shard) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.shard);
            }
        }
    }
}

/// Bounds of `herald_failover_seconds`.
const FAILOVER_BOUNDS_S: [f64; 9] = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];

/// Bounds of `herald_lease_renew_seconds`.
const RENEW_BOUNDS_S: [f64; 10] = [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

/// The cluster as this process last read it (at most one balancing round old).
#[derive(Clone, Debug, Default)]
pub struct View {
    pub shards: Vec<rows::ShardRow>,
    pub nodes: Vec<rows::NodeRow>,
    pub owners: std::collections::HashMap<u32, String>,
    /// When it was read, Unix ms on this node's clock (`None`: not yet).
    pub read_at_ms: Option<u64>,
}

impl Ownership {
    /// Nothing held yet; [`start`] fills it.
    pub fn new(timing: Timing) -> Ownership {
        Ownership {
            leases: Mutex::new(Leases::new(timing)),
            base: Instant::now(),
            lost: Mutex::new(Vec::new()),
            clock: Mutex::new(None),
            db_offset: std::sync::Arc::new(std::sync::atomic::AtomicI64::new(
                crate::clock::NOT_MEASURED,
            )),
            node_clock: Mutex::new(None),
            engine_reading: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0)),
            held_ahead_ms: std::sync::atomic::AtomicU64::new(0),
            view: Mutex::new(View::default()),
            fence_rejected: std::sync::atomic::AtomicU64::new(0),
            shard_load_failed: std::sync::atomic::AtomicU64::new(0),
            inflight_inherited: std::sync::atomic::AtomicU64::new(0),
            renew_seconds: prometheus_client::metrics::histogram::Histogram::new(RENEW_BOUNDS_S),
            failover_seconds: prometheus_client::metrics::histogram::Histogram::new(
                FAILOVER_BOUNDS_S,
            ),
            sends: Mutex::new(std::collections::HashMap::new()),
            before_release: Mutex::new(None),
            let_go: watch::channel(0).0,
        }
    }

    /// What a graceful handover runs before it frees its shards' rows ([`BeforeRelease`]).
    pub fn set_before_release(&self, hook: BeforeRelease) {
        *self.before_release.lock() = Some(hook);
    }

    /// Runs the [`BeforeRelease`] hook for `shards` (still held, being handed over) and waits
    /// for it at most `within`: a slow database must not hold the release. What it has not
    /// done by then is left to the next owner (an armed mark it waits out, as after a crash);
    /// a write of it still on its way is fenced: refused once the shard is released here, or
    /// committed before the next owner's grant (whose `FOR UPDATE SKIP LOCKED` passes the row by
    /// while the write holds it).
    async fn before_release(&self, shards: &[u32], within: Duration) {
        let hook = self.before_release.lock().clone();
        if let Some(hook) = hook.filter(|_| !shards.is_empty()) {
            let until = tokio::time::Instant::now() + within;
            if tokio::time::timeout_at(until, hook(shards, until))
                .await
                .is_err()
            {
                // Not an error: the next owner waits the marks left armed out, as after a
                // crash. But it explains an inherited in-flight mark after a graceful move.
                tracing::warn!(
                    ?shards,
                    within_ms = within.as_millis() as u64,
                    "handover: taking back the attempts armed ahead did not finish in time; the next owner waits out the marks left"
                );
            }
        }
    }

    /// Monotonic ms since this process's loop began.
    fn mono_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Every shard held and trusted now, with its epoch: what a commit group fences on.
    pub fn grants(&self) -> Vec<Grant> {
        let now = self.mono_ms();
        self.leases
            .lock()
            .held()
            .filter(|(_, h)| now < h.trusted_until_ms)
            .map(|(shard, h)| Grant {
                shard,
                epoch: h.epoch,
            })
            .collect()
    }

    /// The epoch `shard` is held at, if it is held and trusted now.
    pub fn epoch(&self, shard: u32) -> Option<u64> {
        let now = self.mono_ms();
        self.leases
            .lock()
            .owns(shard)
            .filter(|h| now < h.trusted_until_ms)
            .map(|h| h.epoch)
    }

    /// Whether `shard` is being handed over: held, its writes still fenced at its epoch, but
    /// nothing new is armed or sent on it.
    pub fn releasing(&self, shard: u32) -> bool {
        self.leases.lock().releasing(shard)
    }

    /// Whether `shard` is held, trusted now or not: between the end of its trust and the
    /// loop's next look (`Leases::expire`) a renewal answered late can still extend the
    /// trust, and then the shard is never dropped and never loaded again.
    pub fn holds(&self, shard: u32) -> bool {
        self.leases.lock().owns(shard).is_some()
    }

    /// Whether a send on `shard` with a request deadline of `timeout_ms` may start now.
    pub fn may_send(&self, shard: u32, timeout_ms: u64) -> bool {
        let now = self.mono_ms();
        self.leases.lock().may_send(shard, now, timeout_ms)
    }

    /// How long a send on `shard` starting now may take: the trust left, if at least
    /// `safety` is (HA.md "The send itself"); `None`: it may not start.
    pub fn send_window_ms(&self, shard: u32) -> Option<u64> {
        let now = self.mono_ms();
        let l = self.leases.lock();
        if !l.may_send(shard, now, 0) {
            return None;
        }
        l.owns(shard)
            .map(|h| h.trusted_until_ms.saturating_sub(now))
    }

    /// How much trust is left now on `shard` held at `epoch`, renewals included (`None`: no
    /// longer held at that epoch, or its trust has ended). Unlike [`Ownership::send_window_ms`]
    /// it asks for no `safety` margin and counts a shard being handed over: it is what a send
    /// already under way may still use (HA.md: a send's request ends inside the window; the
    /// window is the one renewals keep extending, never the one the send saw when it began).
    pub fn trust_left_ms(&self, shard: u32, epoch: u64) -> Option<u64> {
        let now = self.mono_ms();
        self.leases
            .lock()
            .owns(shard)
            .filter(|h| h.epoch == epoch && now < h.trusted_until_ms)
            .map(|h| h.trusted_until_ms - now)
    }

    /// A shard was let go: the sends under way look at their shards again
    /// ([`Ownership::watch_let_go`]). Called by the lease loop as it drops or releases a shard
    /// ([`Loop::report`]), not only when the engine handles the event: the engine's event loop
    /// loads granted shards inline (seconds each during a failover), and a `Dropped` queued
    /// behind those loads left a send on the dropped shard running to the end of the trust it
    /// last read. Calling it more than once for one drop only wakes the sends once more.
    pub fn shard_let_go(&self) {
        self.let_go.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes each time a shard is let go ([`Ownership::shard_let_go`]).
    pub fn watch_let_go(&self) -> watch::Receiver<u64> {
        self.let_go.subscribe()
    }

    /// A fenced write on `shard` at `epoch` was refused or its outcome is unknown: the shard
    /// is dropped (re-acquired, at a new epoch, before anything is written to it again), if
    /// it is still held at that epoch.
    /// The sends under way on it are cut off now ([`Ownership::shard_let_go`]), not when the
    /// loop's next round reports the drop.
    pub fn fenced(&self, shard: u32, epoch: u64) -> Option<Event> {
        let dropped = self.leases.lock().fenced(shard, epoch);
        dropped.map(|(shard, why)| {
            self.shard_let_go();
            Event::Dropped { shard, why }
        })
    }

    /// The store's fence refused a write on `shard` at `epoch` (counted in
    /// `herald_fence_rejected`): [`Ownership::let_go_at`].
    pub fn lost_at(&self, shard: u32, epoch: u64) {
        self.fence_rejected
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.let_go_at(shard, epoch);
    }

    /// `shard`, granted at `epoch`, could not be loaded (counted in
    /// `herald_shard_load_failed`, not as a fenced write: nothing was refused):
    /// [`Ownership::let_go_at`].
    pub fn load_failed_at(&self, shard: u32, epoch: u64) {
        self.shard_load_failed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.let_go_at(shard, epoch);
    }

    /// [`Ownership::fenced`], its `Dropped` event sent by the loop's next round: `shard` is
    /// let go if it is still held at `epoch` (a grant made since stands).
    fn let_go_at(&self, shard: u32, epoch: u64) {
        if let Some(ev) = self.fenced(shard, epoch) {
            self.lost.lock().push(ev);
        }
    }

    pub fn count(&self) -> usize {
        self.leases.lock().count()
    }

    /// `[cluster] lease`, `renew` and `safety`.
    pub fn timing(&self) -> Timing {
        self.leases.lock().timing()
    }

    /// Counts a send on `shard` until the guard is dropped, so that handing the shard over
    /// waits for it (HA.md "Balancing": drain its sends, then release the row; a new owner
    /// re-sends an inherited in-flight message, which must not overlap this attempt).
    pub fn sending(&self, shard: u32) -> Sending<'_> {
        *self.sends.lock().entry(shard).or_default() += 1;
        Sending { own: self, shard }
    }

    fn sends_on(&self, shards: &[u32]) -> usize {
        let m = self.sends.lock();
        shards.iter().filter_map(|s| m.get(s)).sum()
    }

    /// The address of the process holding `shard`, as last read (`None`: unknown, or it
    /// advertises none).
    pub fn owner_address(&self, shard: u32) -> Option<String> {
        self.view.lock().owners.get(&shard).cloned()
    }

    /// The cluster as last read.
    pub fn view(&self) -> View {
        self.view.lock().clone()
    }

    /// The database's clock minus this node's, as last measured (`None`: not yet; positive:
    /// this node is behind).
    pub fn clock_offset_ms(&self) -> Option<i64> {
        self.clock.lock().map(|(o, _)| o.offset_ms)
    }

    /// Why this node takes no shards because of its clock (`None`: it may, or it has not
    /// measured yet and says so elsewhere), for `/healthz`.
    pub fn clock_refusal(&self, max_ms: u64) -> Option<String> {
        let held = self
            .held_ahead_ms
            .load(std::sync::atomic::Ordering::Acquire);
        match *self.clock.lock() {
            Some((o, false)) if held > max_ms && super::offset::acceptable(o, max_ms) => Some(format!(
                "this node's clock reads {held} ms ahead of the database's (it started ahead and its wall was stepped back; it never goes back): this node owns no shards until database time catches up"
            )),
            Some((o, false)) => Some(format!(
                "clock offset to the database {} ms (±{} ms) is beyond cluster.max_clock_offset {} ms: this node owns no shards until its clock is corrected",
                o.offset_ms, o.error_ms, max_ms
            )),
            Some((_, true)) => None,
            None => Some("clock offset to the database not measured yet: no shards taken".into()),
        }
    }

    /// The offset shared with the engine's clock (`clock::OffsetClock`): database minus the
    /// monotonic reading of the clock given to [`Ownership::set_node_clock`].
    pub fn db_offset(&self) -> std::sync::Arc<std::sync::atomic::AtomicI64> {
        self.db_offset.clone()
    }

    /// How far the engine's clock is held ahead of database time now, by the monotonic
    /// offset `mono_offset_ms` just measured (0 without a node clock: the loop alone, tests).
    fn held_ahead(&self, mono_offset_ms: i64) -> u64 {
        let Some(clock) = self.node_clock.lock().clone() else {
            return 0;
        };
        let last = self
            .engine_reading
            .load(std::sync::atomic::Ordering::Acquire);
        crate::clock::held_ahead_ms(last, clock.mono_ms(), mono_offset_ms)
    }

    /// The engine's `OffsetClock`'s highest reading, shared (`OffsetClock::sharing`).
    pub fn engine_reading(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.engine_reading.clone()
    }

    /// The clock the engine's `OffsetClock` wraps, before the loop starts.
    pub fn set_node_clock(&self, clock: Arc<dyn crate::clock::Clock>) {
        *self.node_clock.lock() = Some(clock);
    }

    fn node_clock(&self) -> Option<Arc<dyn crate::clock::Clock>> {
        self.node_clock.lock().clone()
    }
}

/// The store's fence asks these (`store/pg/fence.rs`). A shard found taken over is dropped
/// here, and its `Dropped` event is sent by the loop's next round (`lost` below).
impl crate::store::pg::fence::Fence for Ownership {
    fn epoch(&self, shard: u32) -> Option<u64> {
        Ownership::epoch(self, shard)
    }

    fn lost(&self, shard: u32, epoch: u64) {
        self.lost_at(shard, epoch);
    }

    fn outcome_unknown(&self, shard: u32, epoch: u64) {
        self.let_go_at(shard, epoch);
    }

    fn held(&self) -> Vec<(u32, u64)> {
        self.grants()
            .into_iter()
            .map(|g| (g.shard, g.epoch))
            .collect()
    }
}

/// What the loop needs to know.
#[derive(Clone, Debug)]
pub struct Settings {
    pub url: String,
    /// Used when the URL carries none (`PGPASSWORD` / `HERALD_STORE_PASSWORD`).
    pub password: Option<String>,
    pub me: Identity,
    pub timing: Timing,
    /// S, as stored in `herald_meta`.
    pub shards: u32,
    /// `[cluster] max_clock_offset`: beyond it this node owns nothing (HA.md "Time").
    pub max_clock_offset_ms: u64,
}

/// How often the clock offset to the database is measured (HA.md "Time").
const OFFSET_EVERY_MS: u64 = 30_000;

/// HA.md's orphan scan: expired rows are looked for at least this often.
const ORPHAN_SCAN_MS: u64 = 1_000;

/// How often a balancing round (heartbeat, the cluster read, acquisitions) runs: every
/// `renew`, but at least every [`ORPHAN_SCAN_MS`]. HA.md's failover bound (lease + orphan scan
/// 1 s + load ≈ 12 s) counts on a scan each second: at `renew` (2 s by default) a takeover came
/// up to a second later than that. Pure.
pub fn balance_every_ms(t: Timing) -> u64 {
    t.renew_ms.clamp(1, ORPHAN_SCAN_MS)
}
/// Probes per measurement; the shortest round trip is believed (`offset.rs`).
const OFFSET_PROBES: usize = 3;

/// One measurement's probes: the same database readings against the node's wall clock and
/// against the node clock's monotonic clock ([`Loop::measure`]).
#[derive(Debug, Default)]
struct Probes {
    wall: Vec<super::offset::Probe>,
    mono: Vec<super::offset::Probe>,
}

/// `application_name` of the lease connection, to find it in `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "herald lease loop";

/// A statement's deadline on the lease connection: half the trust window, at least `renew`.
/// A late answer is still safe (trust counts from the send), so the deadline only bounds how
/// long a hung connection keeps the loop from its next round; at `renew` itself one slow
/// round trip on a busy machine dropped every shard (seen in `tests/cluster_failover.rs`).
pub fn statement_deadline(t: Timing) -> Duration {
    Duration::from_millis(
        t.renew_ms
            .max(t.ttl_ms.saturating_sub(t.safety_ms) / 2)
            .max(1),
    )
}

/// The lease connection's `statement_timeout` and `lock_timeout`, in ms (server side).
///
/// Without them a statement this side gave up on (its deadline passed, the connection
/// dropped) ran on in the server: a renewal queued behind a lock held elsewhere stayed in the
/// lock queue with its backend, one more per reconnect, and ran when the lock went, renewing
/// rows this process had already dropped, which kept them from everyone until they ran out.
/// - `statement_timeout` = [`statement_deadline`] (4.5 s at the defaults): the server ends
///   a statement when this side stops waiting for it.
/// - `lock_timeout` = `renew` (2 s at the defaults): none of the loop's statements waits for
///   a lock in normal operation (renewals never queue behind fenced writes, acquisitions skip
///   locked rows), so a wait of a whole renew interval means another session holds the lease
///   rows or a table (DDL, a stuck session): the statement fails then, a renewal's shards are
///   dropped (as after any failed renewal: they would not have been trusted for long), and the
///   loop reconnects instead of leaving a backend behind in the lock queue.
pub fn session_timeouts(t: Timing) -> (u64, u64) {
    let statement_ms = u64::try_from(statement_deadline(t).as_millis()).unwrap_or(u64::MAX);
    (statement_ms, t.renew_ms.clamp(1, statement_ms))
}

/// How long the loop waits before its next connection attempt after `fails` failed attempts
/// or rounds in a row: the store's doubling delay (`store/pg/backoff.rs`: 50 ms doubling up
/// to 2 s), at most `renew` (a node is back within one renew interval of the database), with
/// equal jitter from `random` (between half of it and all of it), so that nodes that lost the
/// database together do not all come back at the same instant. Pure.
pub fn reconnect_wait_ms(fails: u32, renew_ms: u64, random: u64) -> u64 {
    let full = u64::try_from(crate::store::pg::backoff::Backoff::delay(fails).as_millis())
        .unwrap_or(u64::MAX)
        .min(renew_ms)
        .max(1);
    let half = full / 2;
    (half + random % (full - half + 1)).max(1)
}

/// The running loop: [`Handle::leave`] hands every shard over and ends it; dropping the
/// handle without it is a crash as far as the rows know (leases run out by themselves).
pub struct Handle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    pub ownership: Arc<Ownership>,
}

impl Handle {
    /// Releases every shard, leaves the node table and ends the loop.
    pub async fn leave(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }

    /// Ends the loop at once without releasing anything (a crash, for tests: the rows keep
    /// their leases until they run out).
    pub fn abort(self) {
        self.task.abort();
    }
}

/// Starts the loop on the current runtime with a fresh [`Ownership`]; its events go to
/// `events`.
pub fn start(settings: Settings, events: mpsc::UnboundedSender<Event>) -> Handle {
    let ownership = Arc::new(Ownership::new(settings.timing));
    start_with(settings, ownership, events)
}

/// [`start`] on an [`Ownership`] made before (the store's fence holds it too).
pub fn start_with(
    settings: Settings,
    ownership: Arc<Ownership>,
    events: mpsc::UnboundedSender<Event>,
) -> Handle {
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(run(settings, ownership.clone(), events, stopped));
    Handle {
        stop,
        task,
        ownership,
    }
}

struct Loop {
    s: Settings,
    own: Arc<Ownership>,
    events: mpsc::UnboundedSender<Event>,
    /// The node's own point on the ring, so nodes starting together do not race for shard 0.
    start: u32,
    next_balance_ms: u64,
    next_offset_ms: u64,
    /// The node clock's (forward jumps, steps back) at the last look ([`Loop::wall_stepped`]).
    steps_seen: (u64, u64),
    /// The last measurement was within `max_clock_offset` (false until one is made).
    clock_ok: bool,
    /// Connection attempts or rounds failed in a row (0 after a round that went through).
    fails: u32,
    /// No connection attempt before this (monotonic ms).
    retry_at_ms: u64,
}

impl Loop {
    /// Every event the loop sends goes out here, after the held set took it in. A shard
    /// dropped or released is let go at once ([`Ownership::shard_let_go`]): its sends under
    /// way are cut off now, not once the engine's event loop, which may be busy loading other
    /// shards, reaches the event.
    fn report(&self, ev: Event) {
        if !matches!(ev, Event::Granted(_)) {
            self.own.shard_let_go();
        }
        let _ = self.events.send(ev);
    }

    fn emit(&self, dropped: Vec<(u32, Dropped)>) {
        for (shard, why) in dropped {
            tracing::warn!(shard, ?why, "shard dropped");
            self.report(Event::Dropped { shard, why });
        }
    }

    /// A statement's deadline ([`statement_deadline`]).
    fn deadline(&self) -> Duration {
        statement_deadline(self.s.timing)
    }

    /// Renews what is held, if a renewal is due. Err: the connection is not to be trusted.
    async fn renew(&self, c: &Client) -> Result<(), ()> {
        let now = self.own.mono_ms();
        let covers = {
            let mut l = self.own.leases.lock();
            if !l.renew_due(now) {
                return Ok(());
            }
            l.renew_sent(now)
        };
        let held: Vec<Grant> = covers
            .iter()
            .map(|&(shard, epoch)| Grant { shard, epoch })
            .collect();
        let me = &self.s.me;
        let asked = Instant::now();
        let answer = tokio::time::timeout(
            self.deadline(),
            rows::renew(c, &me.incarnation, self.s.timing.ttl_ms, &held),
        )
        .await;
        self.own
            .renew_seconds
            .observe(asked.elapsed().as_secs_f64());
        match answer {
            Ok(Ok(renewed)) => {
                let lost = self.own.leases.lock().renew_answered(&renewed);
                self.emit(lost);
                Ok(())
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "lease renewal failed: its shards are dropped");
                let gone = self.own.leases.lock().renew_ambiguous();
                self.emit(gone);
                Err(())
            }
            Err(_) => {
                tracing::warn!("lease renewal timed out: its shards are dropped");
                let gone = self.own.leases.lock().renew_ambiguous();
                self.emit(gone);
                Err(())
            }
        }
    }

    /// Measures the clock offset to the database: `OFFSET_PROBES` probes, each read against
    /// the node's wall clock (what `max_clock_offset` judges) and against the node clock's
    /// monotonic clock (what database time is read from: `clock::OffsetClock`; none without a
    /// node clock). Err: the connection failed.
    async fn measure(&self, c: &Client) -> Result<Probes, ()> {
        let wall = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        };
        let clock = self.own.node_clock();
        let mono = || clock.as_ref().map(|c| c.mono_ms());
        let mut probes = Probes::default();
        for _ in 0..OFFSET_PROBES {
            let (sent_ms, sent_mono) = (wall(), mono());
            let Ok(Ok(db_ms)) = tokio::time::timeout(self.deadline(), rows::db_now_ms(c)).await
            else {
                return Err(());
            };
            let (received_ms, received_mono) = (wall(), mono());
            probes.wall.push(super::offset::Probe {
                sent_ms,
                db_ms,
                received_ms,
            });
            if let (Some(sent_ms), Some(received_ms)) = (sent_mono, received_mono) {
                probes.mono.push(super::offset::Probe {
                    sent_ms,
                    db_ms,
                    received_ms,
                });
            }
        }
        Ok(probes)
    }

    /// Takes a measurement's estimate: within `max_clock_offset` or not (HA.md "Time").
    fn judge_clock(&mut self, probes: &Probes) {
        let Some(o) = super::offset::estimate(&probes.wall) else {
            return;
        };
        let mut ok = super::offset::acceptable(o, self.s.max_clock_offset_ms);
        if let Some(m) = super::offset::estimate(&probes.mono).filter(|_| ok) {
            // From now on the wheel fires at database time (HA.md "Time"), read off the
            // monotonic clock: a later step of the node's wall does not move it.
            self.own
                .db_offset
                .store(m.offset_ms, std::sync::atomic::Ordering::Release);
            // But a clock that read ahead before (a node started with its wall ahead, then
            // stepped back) is held there until database time catches up: no shards till then.
            let held = self.own.held_ahead(m.offset_ms);
            self.own
                .held_ahead_ms
                .store(held, std::sync::atomic::Ordering::Release);
            ok = held <= self.s.max_clock_offset_ms;
        }
        *self.own.clock.lock() = Some((o, ok));
        if ok != self.clock_ok {
            if ok {
                tracing::info!(
                    offset_ms = o.offset_ms,
                    error_ms = o.error_ms,
                    "clock within max_clock_offset of the database's: taking shards"
                );
            } else {
                let held_ms = self
                    .own
                    .held_ahead_ms
                    .load(std::sync::atomic::Ordering::Acquire);
                tracing::error!(offset_ms = o.offset_ms, error_ms = o.error_ms, held_ms,
                    max_ms = self.s.max_clock_offset_ms,
                    "this node's clock is too far from the database's: it owns no shards until it is within cluster.max_clock_offset");
            }
        }
        self.clock_ok = ok;
    }

    /// Runs `work` (clock probes, a balancing round) on the lease connection with each renewal
    /// that comes due meanwhile sent at once beside it, not after it: tokio-postgres pipelines
    /// the statements of one connection, so the renewal leaves on time (its trust counts from
    /// then) and waits at most for the statement the server is running. Behind three probes on
    /// a slow database a due renewal waited up to three statement deadlines, past the trust
    /// window. A renewal under way is never cut off (its answer decides the trust of every
    /// shard it covered): when `work` ends first, the renewal is awaited. Err: a renewal
    /// failed (`work` is dropped), or `work` did.
    async fn beside_renewals<T>(
        &self,
        c: &Client,
        work: impl std::future::Future<Output = Result<T, ()>>,
    ) -> Result<T, ()> {
        tokio::pin!(work);
        loop {
            // Bounded even while no renewal is due (one in flight, e.g. `hand_over`'s own):
            // `work` may go on long after its answer (`Leases::renew_wake_in`).
            let due_in = {
                let now = self.own.mono_ms();
                Some(self.own.leases.lock().renew_wake_in(now))
            };
            tokio::select! {
                biased;
                () = after_ms(due_in) => {
                    let renewal = self.renew(c);
                    tokio::pin!(renewal);
                    tokio::select! {
                        biased;
                        r = &mut renewal => r?,
                        r = &mut work => {
                            renewal.await?;
                            return r;
                        }
                    }
                }
                r = &mut work => return r,
            }
        }
    }

    /// Whether the node's wall clock jumped or stepped back since the last look. Reads the
    /// node clock's `now_ms` first: the system clock notices a step only when it is read.
    fn wall_stepped(&mut self) -> bool {
        let Some(clock) = self.own.node_clock() else {
            return false;
        };
        clock.now_ms();
        let j = clock.wall_jumps();
        let seen = (j.count, j.back_count);
        let stepped = seen != self.steps_seen;
        self.steps_seen = seen;
        stepped
    }

    /// One round on a connection: a due renewal first, then the clock probes and the
    /// balancing round when they are due, each with later renewals beside it. Err: the
    /// connection is not to be trusted.
    async fn round(&mut self, c: &Client) -> Result<(), ()> {
        self.renew(c).await?;
        if self.wall_stepped() {
            // The wall offset changed by the step: measured and judged now, not in up to
            // 30 s, and a refusal hands the shards back in this round (database time itself
            // did not move: `clock::OffsetClock`).
            tracing::warn!(
                "the node's wall clock stepped: measuring its offset to the database again now"
            );
            self.next_offset_ms = 0;
            self.next_balance_ms = 0;
        }
        if self.own.mono_ms() >= self.next_offset_ms {
            let probes = self.beside_renewals(c, self.measure(c)).await?;
            self.next_offset_ms = self.own.mono_ms() + OFFSET_EVERY_MS;
            self.judge_clock(&probes);
        }
        let now = self.own.mono_ms();
        if now >= self.next_balance_ms {
            self.next_balance_ms = now + balance_every_ms(self.s.timing);
            self.beside_renewals(c, self.balance(c)).await?;
        }
        Ok(())
    }

    /// Heartbeat, then the cluster as it is now: how many nodes live, the shard rows (kept
    /// with the nodes and owners' addresses as the process's [`View`]). A node whose clock is
    /// refused does not heartbeat: counted live, it would make the others aim at
    /// `ceil(S / nodes)` with itself among the nodes, and the shards it refuses would stay
    /// free (`tests/cluster_clock.rs`); its row runs out after a lease.
    async fn read_cluster(&self, c: &Client) -> Result<(usize, Vec<rows::ShardRow>), ()> {
        let me = &self.s.me;
        let read = async {
            if self.clock_ok {
                rows::heartbeat(
                    c,
                    &me.node_id,
                    &me.incarnation,
                    me.advertise.as_deref(),
                    self.s.timing.ttl_ms,
                    self.own.clock_offset_ms(),
                )
                .await?;
            }
            // Every live process heartbeats once per balancing round (at least every `renew`,
            // shared by the cluster's processes: [`balance_every_ms`]), so one whose last
            // heartbeat is half a `renew` more than a `renew` older than another
            // incarnation's of its node id has stopped: a crashed
            // process, restarted. A restart faster than that no longer leaves its old row
            // counted until then: the new incarnation's first heartbeat ends the older rows
            // of its node id (`rows::heartbeat`). Taking a live one for stopped only makes the
            // others aim at a larger share for a while (until its next heartbeat).
            let superseded_ms = self.s.timing.renew_ms.saturating_mul(3) / 2;
            let live = rows::live_nodes(c, superseded_ms).await?;
            let table = rows::rows(c).await?;
            let owners = rows::owners(c).await?;
            let nodes = rows::nodes(c).await?;
            Ok::<_, tokio_postgres::Error>((live, table, owners, nodes))
        };
        let Ok(Ok((live, table, owners, nodes))) =
            tokio::time::timeout(self.deadline(), read).await
        else {
            return Err(());
        };
        *self.own.view.lock() = View {
            shards: table.clone(),
            nodes,
            owners: owners.into_iter().collect(),
            read_at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()
                .and_then(|d| u64::try_from(d.as_millis()).ok()),
        };
        Ok((live, table))
    }

    /// Heartbeat, then one balancing round: acquire toward the target or hand one over.
    async fn balance(&self, c: &Client) -> Result<(), ()> {
        let me = self.s.me.clone();
        let d = self.deadline();
        let ttl = self.s.timing.ttl_ms;
        let (live, table) = self.read_cluster(c).await?;
        let mine: Vec<u32> = self.own.grants().iter().map(|g| g.shard).collect();
        let takeable: Vec<u32> = table
            .iter()
            .filter(|r| r.takeable)
            .map(|r| r.shard)
            .collect();
        if !self.clock_ok {
            // Refuses to own shards (HA.md "Time"): everything held goes back.
            if !mine.is_empty() {
                self.hand_over(c, &mine).await?;
            }
            return Ok(());
        }
        let round = balance::round(self.s.shards, live, &mine, &takeable, self.start);
        if !round.acquire.is_empty() {
            let sent = self.own.mono_ms();
            let got = tokio::time::timeout(
                d,
                rows::acquire_timed(c, &me.node_id, &me.incarnation, ttl, &round.acquire),
            )
            .await;
            // An unanswered acquisition may have granted rows nobody here knows of: they
            // run out by themselves, and nobody else gets them before that.
            let Ok(Ok(grants)) = got else {
                return Err(());
            };
            let mut l = self.own.leases.lock();
            for (g, late) in grants {
                if let Some(s) = late {
                    self.own.failover_seconds.observe(s.max(0.0));
                }
                // Still held at an older epoch: dropped first, so the engine unloads it and
                // the grant loads it anew (its tasks are not taken for loaded already).
                if let Some((shard, why)) = l.granted(g.shard, g.epoch, sent) {
                    tracing::warn!(shard, ?why, "shard dropped: granted again at a new epoch");
                    self.report(Event::Dropped { shard, why });
                }
                tracing::info!(shard = g.shard, epoch = g.epoch, "shard acquired");
                self.report(Event::Granted(g));
            }
        }
        if let Some(shard) = round.release {
            self.hand_over(c, &[shard]).await?;
        }
        Ok(())
    }

    /// Stops starting sends on `shards`, waits for the sends under way to settle (their
    /// writes still fenced at the shards' epochs), then stops acting on the shards and frees
    /// their rows (HA.md "Balancing": drain its sends, settle, release the row). Dropping
    /// the shards first refused those settles, and the next owner sent their messages again.
    /// A shard whose sends are still counted when the wait ends is dropped without freeing
    /// its row: a settle that comes later is refused by the fence, and the next owner is
    /// granted the row only once its lease ran out, as after a crash, never at once while an
    /// attempt of this process may still be out ([`Loop::settle_or_lapse`]).
    async fn hand_over(&self, c: &Client, shards: &[u32]) -> Result<(), ()> {
        let mut grants = Vec::new();
        {
            let mut l = self.own.leases.lock();
            for &s in shards {
                if let Some(h) = l.owns(s) {
                    l.begin_release(s);
                    grants.push(Grant {
                        shard: s,
                        epoch: h.epoch,
                    });
                }
            }
        }
        // No new send starts on them now; the ones under way follow the trust, which the
        // renewals below keep extending (`engine/step.rs`, `cut_off_at`), so this wait is
        // bounded by `until`: a send still counted then is cut off when its shard is let go
        // (`Dropped::Unsettled`, [`Loop::settle_or_lapse`]).
        let shards: Vec<u32> = grants.iter().map(|g| g.shard).collect();
        let until = Instant::now() + Duration::from_millis(self.s.timing.ttl_ms);
        while self.own.sends_on(&shards) > 0 && Instant::now() < until {
            // Renewed meanwhile, as the loop would: a slow send on a shard handed over must
            // not run out the trust of every other shard (and of these, whose settles it
            // fences). A failed renewal drops the shards it covered; the release goes on.
            if self.renew(c).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Attempts armed ahead on them (a one-shot's, 2 s before its instant) are taken back
        // while the rows are held at their epochs: left armed, the next owner waits each out
        // as a send of ours cut short, then sends it as a second attempt. At most a renewal's
        // interval, so the other shards' renewals keep their pace.
        let within = Duration::from_millis(self.s.timing.renew_ms);
        self.own.before_release(&shards, within).await;
        let free = self.settle_or_lapse(&grants);
        if free.is_empty() {
            return Ok(());
        }
        let inc = &self.s.me.incarnation;
        match tokio::time::timeout(self.deadline(), rows::release(c, inc, &free)).await {
            Ok(Ok(_)) => Ok(()),
            // Not freed: the leases run out by themselves.
            _ => Err(()),
        }
    }

    /// The end of a handover's wait: each shard still held at its epoch stops being acted
    /// on. One with no send counted any more is `Released`, to be freed (returned); one
    /// with a send still counted (a send slower than the wait, cut off by this drop; or one
    /// whose settle is not written yet: a slow database) is `Dropped` and left to lapse: freed at once, the next owner
    /// would take it and send that message again while this settle was still on its way.
    fn settle_or_lapse(&self, grants: &[Grant]) -> Vec<Grant> {
        let unsettled: Vec<u32> = grants
            .iter()
            .map(|g| g.shard)
            .filter(|s| self.own.sends_on(&[*s]) > 0)
            .collect();
        let mut free = Vec::new();
        let mut l = self.own.leases.lock();
        for g in grants {
            // Dropped meanwhile (trust ran out, a write fenced): its event went out then.
            if l.owns(g.shard).is_none_or(|h| h.epoch != g.epoch) {
                continue;
            }
            l.released(g.shard);
            if unsettled.contains(&g.shard) {
                tracing::warn!(
                    shard = g.shard,
                    epoch = g.epoch,
                    "handover: a send is still unsettled; the row is not freed, its lease runs out"
                );
                let why = Dropped::Unsettled;
                self.report(Event::Dropped {
                    shard: g.shard,
                    why,
                });
            } else {
                free.push(*g);
                self.report(Event::Released(g.shard));
            }
        }
        free
    }

    /// How long to sleep: until the next renewal, trust ending, or balancing round.
    fn idle(&self) -> Duration {
        let now = self.own.mono_ms();
        let next = self
            .own
            .leases
            .lock()
            .next_deadline()
            .unwrap_or(u64::MAX)
            .min(self.next_balance_ms);
        Duration::from_millis(next.saturating_sub(now).clamp(1, 1_000))
    }

    /// Reports the shards whose trust has ended, and those a fenced write (or a failed load,
    /// `engine/cluster.rs`) dropped.
    fn expire_now(&self) {
        let expired = {
            let now = self.own.mono_ms();
            self.own.leases.lock().expire(now)
        };
        self.emit(expired);
        let fenced: Vec<Event> = std::mem::take(&mut *self.own.lost.lock());
        for ev in fenced {
            tracing::warn!(?ev, "shard dropped: a write was fenced, or its load failed");
            self.report(ev);
        }
    }

    /// Ms until the first held shard's trust ends (`None`: nothing held).
    fn trust_ends_in(&self) -> Option<u64> {
        let now = self.own.mono_ms();
        self.own
            .leases
            .lock()
            .trust_ends_at()
            .map(|t| t.saturating_sub(now))
    }

    /// A connection attempt or a round failed: the next attempt waits ([`reconnect_wait_ms`]).
    fn failed(&mut self) {
        self.fails = self.fails.saturating_add(1);
        let random = crate::trace::random_u64();
        let wait = reconnect_wait_ms(self.fails, self.s.timing.renew_ms, random);
        self.retry_at_ms = self.own.mono_ms().saturating_add(wait);
    }

    /// How long to sleep while disconnected: until the next connection attempt, or a held
    /// shard's trust ending if that comes first, so its drop is reported when the trust ends
    /// rather than after the backoff. (While disconnected no renewal is under way: one that
    /// failed was answered ambiguous, so nothing can extend a trust that ended.)
    fn idle_disconnected(&self) -> Duration {
        let now = self.own.mono_ms();
        let until_retry = self.retry_at_ms.saturating_sub(now);
        let wait = self
            .trust_ends_in()
            .map_or(until_retry, |t| t.min(until_retry));
        Duration::from_millis(wait.max(1))
    }

    /// A connection attempt (bounded by the statement deadline: a blackholed server holds it
    /// that long) during which each shard whose trust ends is reported as it ends.
    async fn connect_watching(&self) -> Option<Client> {
        let attempt = connect(&self.s, self.deadline());
        tokio::pin!(attempt);
        loop {
            tokio::select! {
                biased;
                c = &mut attempt => return c,
                () = after_ms(self.trust_ends_in()) => self.expire_now(),
            }
        }
    }
}

/// Sleeps `ms` (`None`: for ever; for a branch of `select!` that has nothing to wait for).
async fn after_ms(ms: Option<u64>) {
    match ms {
        Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        None => std::future::pending().await,
    }
}

async fn connect(s: &Settings, within: Duration) -> Option<Client> {
    let mut cfg = match s.url.parse::<tokio_postgres::Config>() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "lease connection: the store URL does not parse");
            return None;
        }
    };
    if let (None, Some(p)) = (cfg.get_password(), &s.password) {
        cfg.password(p.as_bytes());
    }
    let (statement_ms, lock_ms) = session_timeouts(s.timing);
    cfg.application_name(APPLICATION_NAME).options(format!(
        "-c statement_timeout={statement_ms} -c lock_timeout={lock_ms}"
    ));
    match tokio::time::timeout(within, cfg.connect(NoTls)).await {
        Ok(Ok((client, conn))) => {
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "lease connection ended");
                }
            });
            Some(client)
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "lease connection failed");
            None
        }
        Err(_) => None,
    }
}

async fn run(
    s: Settings,
    own: Arc<Ownership>,
    events: mpsc::UnboundedSender<Event>,
    mut stopped: watch::Receiver<bool>,
) {
    let shards = s.shards.max(1);
    let start = u32::try_from(
        crate::store::pg::shard::fnv1a64(s.me.node_id.as_bytes()) % u64::from(shards),
    )
    .unwrap_or(0);
    let mut lp = Loop {
        s,
        own,
        events,
        start,
        next_balance_ms: 0,
        next_offset_ms: 0,
        steps_seen: (0, 0),
        clock_ok: false,
        fails: 0,
        retry_at_ms: 0,
    };
    let mut client: Option<Client> = None;
    loop {
        if *stopped.borrow() {
            break;
        }
        lp.expire_now();
        if client.is_none() && lp.own.mono_ms() >= lp.retry_at_ms {
            client = lp.connect_watching().await;
            if client.is_none() {
                lp.failed();
            }
        }
        if let Some(c) = &client {
            if lp.round(c).await.is_ok() {
                lp.fails = 0;
            } else {
                client = None; // a fresh connection for a later round, after the backoff
                lp.failed();
            }
        }
        let wait = if client.is_some() {
            lp.idle()
        } else {
            lp.idle_disconnected()
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopped.changed() => {}
        }
    }
    // Leaving: hand every shard over and leave the node table (best effort: what is not
    // freed runs out by itself).
    let held: Vec<u32> = lp.own.grants().iter().map(|g| g.shard).collect();
    if client.is_none() {
        client = connect(&lp.s, lp.deadline()).await;
    }
    if let Some(c) = &client {
        // Renewals go on beside it, as in a balancing round's handover: its wait for the
        // sends, its stand-down and its release may outlast a renewal interval.
        let _ = lp.beside_renewals(c, lp.hand_over(c, &held)).await;
        let _ = tokio::time::timeout(lp.deadline(), rows::leave(c, &lp.s.me.incarnation)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a send under way reads again (`engine/step.rs`, `cut_off_at`): the trust left at
    /// its epoch, as renewals extend it, kept while the shard is handed over, gone once the
    /// shard is dropped or held at another epoch; and a let-go is seen by the watchers.
    #[test]
    fn trust_left_follows_renewals_at_its_epoch_and_let_gos_are_watched() {
        let own = Ownership::new(Timing::default());
        let watch = own.watch_let_go();
        own.leases.lock().granted(0, 3, 0);
        let left = own.trust_left_ms(0, 3).unwrap();
        assert!((8_000..=9_000).contains(&left), "{left}");
        assert_eq!(own.trust_left_ms(0, 2), None, "another epoch");
        assert_eq!(own.trust_left_ms(1, 3), None, "another shard");
        {
            let mut l = own.leases.lock();
            l.renew_sent(5_000);
            l.renew_answered(&[0]);
        }
        let left = own.trust_left_ms(0, 3).unwrap();
        assert!(left > 13_000, "a renewal extends it: {left}");
        own.leases.lock().begin_release(0);
        assert!(own.trust_left_ms(0, 3).is_some(), "kept while handed over");
        assert!(own.leases.lock().fenced(0, 3).is_some());
        assert_eq!(own.trust_left_ms(0, 3), None, "dropped");
        assert!(!watch.has_changed().unwrap());
        own.shard_let_go();
        assert!(watch.has_changed().unwrap());
    }

    /// A loop with no connection, and the engine's end of its events.
    fn test_loop(timing: Timing) -> (Loop, mpsc::UnboundedReceiver<Event>) {
        let (events, rx) = mpsc::unbounded_channel();
        let s = Settings {
            url: String::new(),
            password: None,
            me: Identity {
                node_id: "n".into(),
                incarnation: "i".into(),
                advertise: None,
            },
            timing,
            shards: 8,
            max_clock_offset_ms: 500,
        };
        let own = Arc::new(Ownership::new(timing));
        let lp = Loop {
            s,
            own,
            events,
            start: 0,
            next_balance_ms: 0,
            next_offset_ms: 0,
            steps_seen: (0, 0),
            clock_ok: true,
            fails: 0,
            retry_at_ms: 0,
        };
        (lp, rx)
    }

    /// Every way the lease loop loses a shard moves the let-go watch as it happens, after
    /// the shard left the held set (a send woken reads it gone), and before the engine sees
    /// the event: the engine's event loop may be busy loading other shards for seconds, and a
    /// send on the lost shard must not run on meanwhile (`engine/step.rs`, `cut_off_at`).
    /// Before, only the engine's unload moved it. A grant does not move it.
    #[test]
    fn each_shard_the_loop_loses_is_let_go_before_the_engine_hears_of_it() {
        let (lp, mut rx) = test_loop(Timing::default());
        let mut watch = lp.own.watch_let_go();
        let let_go_once = |watch: &mut watch::Receiver<u64>, what: &str| {
            assert!(watch.has_changed().unwrap(), "{what}: not let go");
            watch.borrow_and_update();
        };
        for s in 0..6 {
            lp.own.leases.lock().granted(s, 1, 0);
        }
        lp.report(Event::Granted(Grant { shard: 7, epoch: 1 }));
        assert!(!watch.has_changed().unwrap(), "a grant lets nothing go");

        // A fenced write (or a failed load): at once, before the loop's next round reports it.
        lp.own.lost_at(0, 1);
        assert_eq!(lp.own.trust_left_ms(0, 1), None);
        let_go_once(&mut watch, "fenced");
        lp.expire_now();
        assert!(matches!(rx.try_recv(), Ok(Event::Granted(_))));
        assert!(matches!(rx.try_recv(), Ok(Event::Dropped { shard: 0, .. })));
        // Reported again by the round: harmless, a send woken reads its shard again.
        watch.borrow_and_update();

        // A renewal that came back without it, or whose outcome is unknown (`Loop::renew`).
        let lost = lp.own.leases.lock().renew_answered(&[]);
        assert!(lost.is_empty(), "no renewal was sent");
        lp.own.leases.lock().renew_sent(0);
        let lost = lp.own.leases.lock().renew_answered(&[2, 3, 4, 5]);
        assert_eq!(lost.len(), 1);
        lp.emit(lost);
        assert_eq!(lp.own.trust_left_ms(1, 1), None);
        let_go_once(&mut watch, "lost by a renewal");
        lp.own.leases.lock().renew_sent(0);
        let gone = lp.own.leases.lock().renew_ambiguous();
        lp.emit(gone);
        let_go_once(&mut watch, "an ambiguous renewal");

        // A handover's end: released, or left to lapse with a send still counted.
        lp.own.leases.lock().granted(2, 2, 0);
        lp.own.leases.lock().granted(3, 2, 0);
        let sending = lp.own.sending(3);
        let grants = [Grant { shard: 2, epoch: 2 }, Grant { shard: 3, epoch: 2 }];
        for g in &grants {
            lp.own.leases.lock().begin_release(g.shard);
        }
        let free = lp.settle_or_lapse(&grants);
        assert_eq!(free, vec![grants[0]], "the unsettled one is left to lapse");
        assert_eq!(lp.own.trust_left_ms(3, 2), None);
        let_go_once(&mut watch, "handed over");
        drop(sending);
        while rx.try_recv().is_ok() {}

        // Trust ran out (`Loop::expire_now`): a window of nothing ends at once.
        let (lp, mut rx) = test_loop(Timing {
            ttl_ms: 1_000,
            renew_ms: 100,
            safety_ms: 1_000,
        });
        let mut watch = lp.own.watch_let_go();
        lp.own.leases.lock().granted(4, 1, 0);
        lp.expire_now();
        assert!(matches!(
            rx.try_recv(),
            Ok(Event::Dropped {
                shard: 4,
                why: Dropped::Expired
            })
        ));
        assert!(watch.has_changed().unwrap(), "expired: not let go");
        watch.borrow_and_update();
    }

    /// HA.md's failover bound counts on an orphan scan each second: the balancing round runs
    /// every `renew`, but at least every second.
    #[test]
    fn balancing_rounds_come_at_least_every_second() {
        assert_eq!(balance_every_ms(Timing::default()), 1_000, "renew 2 s");
        let fast = Timing {
            ttl_ms: 2_000,
            renew_ms: 400,
            safety_ms: 500,
        };
        assert_eq!(balance_every_ms(fast), 400, "renew under a second");
        let zero = Timing {
            renew_ms: 0,
            ..fast
        };
        assert_eq!(balance_every_ms(zero), 1, "never a busy loop");
    }

    #[test]
    fn the_lease_sessions_timeouts_follow_the_lease_timing() {
        // Defaults: half the 9 s window, and one renew interval.
        assert_eq!(session_timeouts(Timing::default()), (4_500, 2_000));
        // `renew` at its longest (half the window): both at it.
        let t = Timing {
            ttl_ms: 10_000,
            renew_ms: 4_500,
            safety_ms: 1_000,
        };
        assert_eq!(session_timeouts(t), (4_500, 4_500));
        // The statement timeout is this side's deadline, so the server ends what this side
        // gave up on.
        let short = Timing {
            ttl_ms: 1_500,
            renew_ms: 300,
            safety_ms: 300,
        };
        assert_eq!(
            session_timeouts(short).0,
            u64::try_from(statement_deadline(short).as_millis()).unwrap()
        );
        assert_eq!(session_timeouts(short), (600, 300));
    }

    #[test]
    fn reconnects_back_off_doubling_up_to_the_renew_interval_with_jitter() {
        // Equal jitter: between half the delay (random 0) and all of it.
        assert_eq!(reconnect_wait_ms(1, 2_000, 0), 25);
        assert_eq!(reconnect_wait_ms(1, 2_000, 25), 50);
        assert_eq!(reconnect_wait_ms(2, 2_000, 0), 50);
        assert_eq!(reconnect_wait_ms(3, 2_000, 0), 100);
        for fails in 1..40 {
            let full = (50u64 << (fails - 1).min(16)).min(2_000);
            for random in [0, 1, 7, 999, 123_456_789, u64::MAX] {
                let w = reconnect_wait_ms(fails, 2_000, random);
                assert!(
                    (full / 2..=full).contains(&w),
                    "{fails} fails, random {random}: {w} not in {}..={full}",
                    full / 2
                );
            }
        }
        // Capped at the renew interval: back within one of the database's return.
        for random in 0..1_000 {
            let w = reconnect_wait_ms(30, 300, random);
            assert!((150..=300).contains(&w), "{w}");
        }
        // The jitter spreads nodes that failed together.
        let spread: std::collections::BTreeSet<u64> = (0..1_000)
            .map(|r| reconnect_wait_ms(30, 2_000, r * 7_919))
            .collect();
        assert!(spread.len() > 100, "{}", spread.len());
        // Never a busy loop, whatever the timing.
        assert_eq!(reconnect_wait_ms(1, 0, 0), 1);
    }
}

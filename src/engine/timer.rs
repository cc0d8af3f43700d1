//! The timer thread: the only owner of the [`Wheel`].
//!
//! It receives `At`/`Cancel` commands through its [`Inbox`], sleeps until the wheel's next
//! deadline (or until a command needs it sooner; it never spins when idle), advances the wheel
//! to the clock's current tick and hands the due [`Key`]s to the dispatcher over a tokio
//! channel,
//! in batches of at most [`HAND_OVER_MAX`] (everything due in one round, in deadline order):
//! sends due together then reach the dispatcher together and go in chunks (`chunk.rs`).
//!
//! Commands are coalesced: a command that cannot change what is due before the thread wakes
//! by itself does not wake it (see [`Inbox`]). Invariant: every command queued before a round
//! is applied before that round's keys are handed over, so a cancel always wins over the
//! entry it cancels.
//!
//! Invariant: at most one wheel entry per key. Scheduling a key that has an entry moves it
//! (the old entry is cancelled in O(1)), so a run can never be stepped twice for one deadline.
//!
//! **Run steps keep to the monotonic clock too** ([`Guards`]). The wheel runs on the wall
//! clock, because a schedule names wall instants. But a run step's deadline is a duration
//! from when it was set (a pacing gap, a backoff, a rate-limit or breaker hold, an arm's lead
//! time), so it is handed over only once both clocks reached it: the wall at its deadline,
//! and the monotonic clock as far past the moment it was set. A wall jump forward therefore
//! never shortens a gap (the step is put back on the wheel for what is left), a wall step
//! back only waits (nothing early).
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tokio::sync::mpsc::UnboundedSender;

use crate::clock::Clock;
use crate::wheel::{Handle, Wheel};

/// A wheel entry, by kind: a task's next fire, a run's next step, a failure-list retry.
/// A closed enum (no sentinel run numbers): each kind is routed by the dispatcher on its own.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// The schedule's next fire of this task.
    Fire(Arc<str>),
    /// The next step (arm, or send) of run `n` (`n >= 1`) of this task.
    Run(Arc<str>, u32),
    /// A failure-list retry of this failure id.
    Retry(Arc<str>),
}

impl Key {
    pub fn fire(task: &str) -> Key {
        Key::Fire(Arc::from(task))
    }

    pub fn run(task: &str, run: u32) -> Key {
        Key::Run(Arc::from(task), run)
    }

    pub fn retry(failure: &str) -> Key {
        Key::Retry(Arc::from(failure))
    }

    /// The task id (or, for a retry, the failure id).
    pub fn id(&self) -> &Arc<str> {
        match self {
            Key::Fire(t) | Key::Run(t, _) | Key::Retry(t) => t,
        }
    }

    fn is_fire(&self) -> bool {
        matches!(self, Key::Fire(_))
    }
}

/// A run's step key, as the step code handles it (`Key::Run` taken apart).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RunKey {
    pub task: Arc<str>,
    pub run: u32,
}

impl RunKey {
    pub fn key(&self) -> Key {
        Key::Run(self.task.clone(), self.run)
    }
}

enum Cmd {
    At(Key, u64),
    /// [`Timer::at_wall`]: no monotonic guard.
    AtWall(Key, u64),
    /// Many `At`s in one command (start-up's load: one channel message per chunk).
    AtMany(Vec<(Key, u64)>),
    Cancel(Key),
    /// Re-read the clock (a manual clock moved).
    Wake,
    /// Answer with the wheel's next deadline, and how many keys this round handed over, once
    /// every key due now has been handed over.
    Sync(std::sync::mpsc::Sender<(Option<u64>, usize)>),
}

/// The commands waiting for the timer thread, and when the thread must be woken for them.
///
/// Waking the thread for every create (a futex wake on the worker, a context switch on the
/// timer) cost ~2–8 µs of CPU per create at 25 000 creates/s, more than the wheel itself.
/// Now a sender wakes the sleeping thread only when its command could be due before the
/// thread wakes by itself (`notify_below`), for a `Wake`/`Sync`, or when the queue is long.
/// After a round that had commands the thread sleeps at most [`COALESCE_MS`] ("busy"), so
/// far-off `At`s queued meanwhile wait at most that long to reach the wheel; after a quiet
/// round it may sleep long, and then every `At` wakes it (`notify_below == u64::MAX`).
/// A `Cancel` never wakes it: the round that would hand its key over applies it first.
struct Inbox {
    q: Mutex<Queue>,
    cv: Condvar,
}

#[derive(Default)]
struct Queue {
    cmds: Vec<Cmd>,
    /// While the thread sleeps: an `At` due before this wakes it (`u64::MAX`: every `At`).
    /// 0 while it is awake (it looks at the queue before it sleeps again).
    notify_below: u64,
    closed: bool,
}

/// Longest sleep after a round that had commands: how long a far-off `At` may wait in the
/// queue before it is on the wheel.
const COALESCE_MS: u64 = 10;
/// Queue length at which a sender wakes the thread regardless (bounds the queue's memory).
const WAKE_LEN: usize = 4_096;

impl Inbox {
    fn push(&self, cmd: Cmd) {
        let mut q = self.q.lock();
        if q.closed {
            // Shutting down: nothing needs to fire any more.
            return;
        }
        let wake = q.notify_below != 0
            && (q.cmds.len() + 1 >= WAKE_LEN
                || match &cmd {
                    Cmd::At(_, at) | Cmd::AtWall(_, at) => *at < q.notify_below,
                    Cmd::AtMany(keys) => keys.iter().any(|(_, at)| *at < q.notify_below),
                    Cmd::Cancel(_) => false,
                    Cmd::Wake | Cmd::Sync(_) => true,
                });
        q.cmds.push(cmd);
        if wake {
            q.notify_below = 0;
            self.cv.notify_one();
        }
    }
}

pub struct Timer {
    inbox: Arc<Inbox>,
    thread: Option<JoinHandle<()>>,
    /// Keys handed to the dispatcher whose step has not finished.
    pub outstanding: Arc<AtomicUsize>,
    /// Steps finished since start (for `Engine::idle`).
    pub completed: Arc<std::sync::atomic::AtomicU64>,
    /// Entries on the wheel, as of the thread's last round (for `/metrics`).
    pub entries: Arc<AtomicUsize>,
}

/// Marks the end of one dispatched step when dropped.
pub struct StepGuard {
    outstanding: Arc<AtomicUsize>,
    completed: Arc<std::sync::atomic::AtomicU64>,
}

impl Drop for StepGuard {
    fn drop(&mut self) {
        // Completed first: an observer that sees `outstanding` drop also sees the completion.
        self.completed.fetch_add(1, Ordering::AcqRel);
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Most keys handed to the dispatcher in one message; a bigger round goes in several, so the
/// first of a herd is on its way while the wheel is still handing over the rest.
pub const HAND_OVER_MAX: usize = 256;

/// Longest single sleep when the wheel is empty; commands wake the thread anyway.
const IDLE_SLEEP: Duration = Duration::from_secs(3600);

/// Longest single sleep on a real clock. The sleep is counted on the monotonic clock (the
/// condvar's timeout; suspend stops it too), the deadline is a wall instant: a step of the wall
/// clock or a resume from suspend while asleep would go unseen until the sleep ends, an hour
/// at most, and every fire due meanwhile would be that late. Waking once a second to look
/// again bounds that to a second, for a look at an empty inbox.
const WALL_SLEEP_MAX: Duration = Duration::from_secs(1);

impl Timer {
    pub fn start(clock: Arc<dyn Clock>, due: UnboundedSender<Vec<Key>>) -> std::io::Result<Timer> {
        let inbox = Arc::new(Inbox {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        });
        let rx = inbox.clone();
        let outstanding = Arc::new(AtomicUsize::new(0));
        let count = outstanding.clone();
        let entries = Arc::new(AtomicUsize::new(0));
        let size = entries.clone();
        let thread = std::thread::Builder::new()
            .name("herald-timer".into())
            .spawn(move || run(clock, rx, due, count, size))?;
        Ok(Timer {
            inbox,
            thread: Some(thread),
            outstanding,
            entries,
            completed: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        })
    }

    fn send(&self, cmd: Cmd) {
        self.inbox.push(cmd);
    }

    /// Puts `key` on the wheel at `at_ms` (replacing its previous deadline, if any).
    pub fn at(&self, key: Key, at_ms: u64) {
        self.send(Cmd::At(key, at_ms));
    }

    /// Like [`Timer::at`], for an instant a person named (a recipient's local time, the end of
    /// a quiet window): held to the wall clock alone, without the monotonic guard of a run key.
    /// A wall step or a resume from suspend moves it with the wall (a 08:00 stays 08:00), where
    /// a guarded key would wait the step's length on the monotonic clock.
    pub fn at_wall(&self, key: Key, at_ms: u64) {
        self.send(Cmd::AtWall(key, at_ms));
    }

    /// Like [`Timer::at`] for many keys at once.
    pub fn at_many(&self, keys: Vec<(Key, u64)>) {
        if !keys.is_empty() {
            self.send(Cmd::AtMany(keys));
        }
    }

    /// Removes `key` from the wheel; a no-op if it is not there.
    pub fn cancel(&self, key: Key) {
        self.send(Cmd::Cancel(key));
    }

    /// Makes the thread re-read the clock (for manual clocks in tests).
    pub fn wake(&self) {
        self.send(Cmd::Wake);
    }

    /// Waits (blocking) until the thread has processed every command sent before and handed
    /// over every key due at the clock's current time; returns the wheel's next deadline and
    /// the number of keys handed over in that round. For deterministic manual-clock tests.
    pub fn sync(&self) -> (Option<u64>, usize) {
        let (tx, rx) = std::sync::mpsc::channel();
        self.send(Cmd::Sync(tx));
        rx.recv().unwrap_or((None, 0))
    }

    /// Called by the dispatcher for each key it receives; the guard ends the step.
    pub fn step_guard(&self) -> StepGuard {
        StepGuard {
            outstanding: self.outstanding.clone(),
            completed: self.completed.clone(),
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.inbox.q.lock().closed = true;
        self.inbox.cv.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The wheel handle of each key. Fire keys (one per pending task, a million of them at
/// scale) are a table of handles alone, 8 bytes a slot: the id is found in the wheel entry a
/// handle names, so it is not kept twice (a map from the id took 24 bytes a slot, ~32 MB more
/// at a million pending; issue 29). The run and retry keys are few and keep a map.
///
/// Invariant: every handle in `fires` names a live wheel entry holding `Key::Fire` of the id
/// it was hashed by, and no two name the same id. Kept by removing a handle from `fires`
/// before (or as) its entry leaves the wheel: `take_fired` in `advance`'s callback, `remove`
/// before `cancel`.
#[derive(Default)]
struct Handles {
    fires: hashbrown::HashTable<Handle>,
    hasher: foldhash::fast::RandomState,
    steps: HashMap<Key, Handle, foldhash::fast::RandomState>,
}

impl Handles {
    fn hash(&self, id: &str) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(id)
    }

    /// The fire key's id in the wheel entry `h` names (`None` only if the invariant broke).
    fn fire_id(wheel: &Wheel<Key>, h: Handle) -> Option<&str> {
        match wheel.get(h) {
            Some(Key::Fire(id)) => Some(id),
            _ => None,
        }
    }

    /// Puts `h` (just inserted in `wheel` under `key`) in the table; the key must have no
    /// handle (`remove` it first).
    fn insert(&mut self, wheel: &Wheel<Key>, key: &Key, h: Handle) {
        match key {
            Key::Fire(t) => {
                let hasher = &self.hasher;
                let rehash = |s: &Handle| {
                    use std::hash::BuildHasher;
                    hasher.hash_one(Self::fire_id(wheel, *s).unwrap_or_default())
                };
                self.fires.insert_unique(self.hash(t), h, rehash);
            }
            _ => {
                self.steps.insert(key.clone(), h);
            }
        }
    }

    fn remove(&mut self, wheel: &Wheel<Key>, key: &Key) -> Option<Handle> {
        match key {
            Key::Fire(t) => {
                let same = |s: &Handle| Self::fire_id(wheel, *s) == Some(t);
                let found = self.fires.find_entry(self.hash(t), same).ok()?;
                Some(found.remove().0)
            }
            _ => self.steps.remove(key),
        }
    }

    /// `advance` fired `key` from the entry `h` named (already out of the wheel): true, and
    /// forgotten, if `h` is the key's handle here.
    fn take_fired(&mut self, key: &Key, h: Handle) -> bool {
        match key {
            Key::Fire(t) => match self.fires.find_entry(self.hash(t), |s| *s == h) {
                Ok(found) => {
                    found.remove();
                    true
                }
                Err(_) => false,
            },
            _ => {
                if self.steps.get(key) == Some(&h) {
                    self.steps.remove(key);
                    true
                } else {
                    false
                }
            }
        }
    }
}

/// Two deadlines of the same run key this close together (a send after its arm, 100 ms to a
/// few seconds in a herd) are one duration apart, set on one clock reading: the later one
/// keeps its monotonic distance from the earlier even if the wall jumped in between.
const CONTINUITY_MS: u64 = 10_000;

/// The monotonic side of run-step deadlines (module docs).
///
/// Invariant: each pair `(at, due)` names one moment on both clocks. `due - at` is the two
/// clocks' offset (monotonic minus wall) as it was when the deadline was set, also for a
/// deadline already past when it was set; only [`CONTINUITY_MS`] raises `due` beyond it, and
/// only by how far the wall moved apart from the monotonic clock since the earlier step (a
/// jump), never by how late a step ran. Clamping a past deadline's monotonic instant to "now"
/// broke this: the pair then carried the step's lateness as if it were a clock offset, and the
/// continuity rule added that lateness again to every later step of the key, although each
/// next deadline is counted from when its step really ran (a pacing anchor is the attempt's
/// start). A paced run resumed after a restart or a cluster takeover (its stored deadline
/// seconds past) was sent one outage later than its interval, at every message to the end.
#[derive(Default)]
struct Guards {
    /// Per run key on the wheel: its wall deadline and the monotonic instant of that moment
    /// (in the past for a deadline that was past when set: the key is handed over at once).
    due: HashMap<Key, (u64, u64), foldhash::fast::RandomState>,
    /// Per run key handed over recently (for [`CONTINUITY_MS`]): its pair, and the pair of
    /// clock readings it was handed over at.
    fired: HashMap<Key, Fired, foldhash::fast::RandomState>,
    swept_mono: u64,
}

/// A run key handed over: its deadline's pair, and the wall and monotonic readings at the
/// hand-over.
#[derive(Clone, Copy)]
struct Fired {
    at: u64,
    due: u64,
    wall: u64,
    mono: u64,
}

impl Fired {
    /// The monotonic instant continuity asks of a next deadline `at` of the same key, if any.
    /// A deadline at or after the hand-over's wall reading was worked out in the wall's frame
    /// of then or later (from the step's own reading): counted from the hand-over, it keeps a
    /// jump during the step out, and one before the hand-over too (counted from the earlier
    /// deadline, that jump was carried into every later gap of a paced run). One before it
    /// was stored in an older frame (a send at the deadline stored before a jump): counted
    /// from the earlier deadline.
    fn next_due(&self, at: u64) -> Option<u64> {
        if at >= self.wall {
            (at - self.wall <= CONTINUITY_MS).then(|| self.mono.saturating_add(at - self.wall))
        } else if at >= self.at && at - self.at <= CONTINUITY_MS {
            Some(self.due.saturating_add(at - self.at))
        } else {
            None
        }
    }
}

impl Guards {
    /// `key` is set to wall deadline `at`, read at (`wall`, `mono`).
    fn set(&mut self, key: &Key, at: u64, wall: u64, mono: u64) {
        // The same moment on the monotonic clock, at the offset the clocks have now; not
        // clamped to `mono` for a deadline already past (see the invariant above).
        let mut due = if at >= wall {
            mono.saturating_add(at - wall)
        } else {
            mono.saturating_sub(wall - at)
        };
        if let Some(next) = self.fired.remove(key).and_then(|f| f.next_due(at)) {
            due = due.max(next);
        }
        self.due.insert(key.clone(), (at, due));
    }

    fn cancel(&mut self, key: &Key) {
        self.due.remove(key);
        self.fired.remove(key);
    }

    /// A run key the wall wheel handed over at (`wall`, `mono`): `Some(wall instant)` to put it
    /// back at when the monotonic clock has not reached its due yet, `None` to hand it over.
    fn check(&mut self, key: &Key, wall: u64, mono: u64) -> Option<u64> {
        let (at, due) = self.due.remove(key)?;
        if mono < due {
            self.due.insert(key.clone(), (at, due));
            return Some(crate::clock::Durations::wall_at(wall, mono, due));
        }
        let fired = Fired {
            at,
            due,
            wall,
            mono,
        };
        self.fired.insert(key.clone(), fired);
        None
    }

    /// Forgets handed-over keys too old to matter, at most once a second.
    fn sweep(&mut self, mono: u64) {
        if mono.saturating_sub(self.swept_mono) >= 1_000 {
            self.swept_mono = mono;
            self.fired
                .retain(|_, f| mono.saturating_sub(f.mono) <= CONTINUITY_MS);
        }
    }
}

fn run(
    clock: Arc<dyn Clock>,
    inbox: Arc<Inbox>,
    due: UnboundedSender<Vec<Key>>,
    outstanding: Arc<AtomicUsize>,
    entries: Arc<AtomicUsize>,
) {
    let mut wheel: Wheel<Key> = Wheel::new(clock.now_ms());
    let mut handles = Handles::default();
    let mut guards = Guards::default();
    // Whether the last round had commands: then the next sleep is at most COALESCE_MS.
    let mut busy = false;
    loop {
        let Some(cmds) = next_commands(&*clock, &inbox, &wheel, busy) else {
            return;
        };
        busy = !cmds.is_empty();
        let (wall, mono) = (clock.now_ms(), clock.mono_ms());
        let syncs = apply(cmds, &mut wheel, &mut handles, &mut guards, wall, mono);
        let mut fired = 0usize;
        // Counted before they are handed over, so a sync never sees a key in transit as idle.
        // The dispatcher is gone only at shutdown.
        let hand_over = |batch: Vec<Key>| {
            let n = batch.len();
            outstanding.fetch_add(n, Ordering::AcqRel);
            if due.send(batch).is_err() {
                outstanding.fetch_sub(n, Ordering::AcqRel);
            }
        };
        let mut batch = Vec::new();
        let mut put_back = Vec::new();
        let (wall, mono) = (clock.now_ms(), clock.mono_ms());
        wheel.advance(wall, &mut |h, key: Key| {
            if handles.take_fired(&key, h) {
                // The wall reached it, the monotonic clock not yet: the wall jumped forward.
                if !key.is_fire() {
                    if let Some(at) = guards.check(&key, wall, mono) {
                        put_back.push((key, at));
                        return;
                    }
                }
            }
            fired += 1;
            batch.push(key);
            if batch.len() == HAND_OVER_MAX {
                hand_over(std::mem::take(&mut batch));
            }
        });
        if !batch.is_empty() {
            hand_over(batch);
        }
        for (key, at) in put_back {
            let h = wheel.insert(at, key.clone());
            handles.insert(&wheel, &key, h);
        }
        guards.sweep(mono);
        entries.store(wheel.len(), Ordering::Relaxed);
        for reply in syncs {
            let _ = reply.send((wheel.next_deadline(), fired));
        }
        if due.is_closed() {
            return;
        }
    }
}

/// Waits until a command arrives or the next deadline is near (at most `COALESCE_MS` after a
/// busy round), then takes the commands; `None` once the inbox is closed.
fn next_commands(
    clock: &dyn Clock,
    inbox: &Inbox,
    wheel: &Wheel<Key>,
    busy: bool,
) -> Option<Vec<Cmd>> {
    let mut q = inbox.q.lock();
    if q.cmds.is_empty() && !q.closed {
        let now = clock.now_ms();
        let (wait, notify_below) = match wheel.next_deadline() {
            Some(d) if d <= now => (Duration::ZERO, 0),
            // A manual clock does not move by itself: wait for a command (Wake).
            _ if clock.is_manual() => (IDLE_SLEEP, u64::MAX),
            next => {
                let mut until = next.unwrap_or(u64::MAX);
                if busy {
                    until = until.min(now + COALESCE_MS);
                }
                let wait = Duration::from_millis(until - now).min(WALL_SLEEP_MAX);
                (wait, if busy { until } else { u64::MAX })
            }
        };
        if !wait.is_zero() {
            q.notify_below = notify_below;
            inbox.cv.wait_for(&mut q, wait);
            q.notify_below = 0;
        }
    }
    if q.closed {
        return None;
    }
    Some(std::mem::take(&mut q.cmds))
}

/// Applies a round's commands to the wheel; returns the syncs to answer after it advanced.
fn apply(
    cmds: Vec<Cmd>,
    wheel: &mut Wheel<Key>,
    handles: &mut Handles,
    guards: &mut Guards,
    wall: u64,
    mono: u64,
) -> Vec<std::sync::mpsc::Sender<(Option<u64>, usize)>> {
    let mut syncs = Vec::new();
    for cmd in cmds {
        let mut put = |key: Key, at: u64| {
            if let Some(old) = handles.remove(wheel, &key) {
                wheel.cancel(old);
            }
            if !key.is_fire() {
                guards.set(&key, at, wall, mono);
            }
            let h = wheel.insert(at, key.clone());
            handles.insert(wheel, &key, h);
        };
        match cmd {
            Cmd::At(key, at) => put(key, at),
            Cmd::AtWall(key, at) => {
                put(key.clone(), at);
                guards.cancel(&key);
            }
            Cmd::AtMany(keys) => {
                for (key, at) in keys {
                    put(key, at);
                }
            }
            Cmd::Cancel(key) => {
                if let Some(old) = handles.remove(wheel, &key) {
                    wheel.cancel(old);
                }
                if !key.is_fire() {
                    guards.cancel(&key);
                }
            }
            Cmd::Wake => {}
            Cmd::Sync(reply) => syncs.push(reply),
        }
    }
    syncs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[tokio::test]
    async fn fires_in_deadline_order_and_honours_cancel_and_move() {
        let clock = Arc::new(ManualClock::new(1_000));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let timer = Timer::start(clock.clone(), tx).unwrap();
        timer.at(Key::run("b", 1), 1_020);
        timer.at(Key::run("a", 1), 1_010);
        timer.at(Key::run("c", 1), 1_030);
        timer.cancel(Key::run("c", 1));
        timer.at(Key::run("d", 1), 1_005);
        timer.at(Key::run("d", 1), 1_040); // moved: must fire once, at 1_040
        timer.sync(); // all applied before the clock moves (else d could fire at 1_005)
        clock.set(1_025);
        timer.wake();
        // Due in one round: handed over together, in deadline order.
        let ab = rx.recv().await.unwrap();
        let names: Vec<&str> = ab.iter().map(|k| &**k.id()).collect();
        assert_eq!(names, ["a", "b"]);
        clock.set(1_100);
        timer.wake();
        let d = rx.recv().await.unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(&**d[0].id(), "d");
        // Nothing else is due: c was cancelled, d fired once.
        timer.wake();
        let extra = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await;
        assert!(extra.is_err(), "unexpected fire: {extra:?}");
    }

    /// A real wall clock that a test can step forward, with a monotonic clock that does not
    /// move with it (an NTP step, a resume from suspend).
    struct SteppedClock {
        origin: std::time::Instant,
        wall0: u64,
        step: std::sync::atomic::AtomicU64,
    }

    impl crate::clock::Clock for SteppedClock {
        fn now_ms(&self) -> u64 {
            self.mono_ms() + self.step.load(std::sync::atomic::Ordering::SeqCst)
        }
        fn mono_ms(&self) -> u64 {
            self.wall0 + self.origin.elapsed().as_millis() as u64
        }
    }

    /// A fire 50 minutes away, and the wall clock steps an hour forward while the timer sleeps:
    /// the fire is handed over within a second or so, not when the sleep counted on the
    /// monotonic clock would have ended (50 minutes late).
    #[tokio::test]
    async fn a_wall_step_while_the_timer_sleeps_is_seen_within_a_second() {
        let clock = Arc::new(SteppedClock {
            origin: std::time::Instant::now(),
            wall0: 1_000_000_000,
            step: std::sync::atomic::AtomicU64::new(0),
        });
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let timer = Timer::start(clock.clone(), tx).unwrap();
        timer.at(Key::fire("a"), clock.now_ms() + 3_000_000);
        timer.sync();
        // The scenario: the timer goes to sleep on its far deadline, then the wall steps.
        std::thread::sleep(Duration::from_millis(100));
        clock
            .step
            .store(3_600_000, std::sync::atomic::Ordering::SeqCst);
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        let keys = got.expect("handed over after the step").unwrap();
        assert_eq!(&**keys[0].id(), "a");
    }

    /// Fire keys are found by the id in their wheel entry (`Handles`): thousands of them,
    /// through the table's growth, each moved with a key made afresh (another `Arc` of the
    /// same id) and a third cancelled, fire exactly once each, at the moved instant; and a
    /// fired key set again fires again.
    #[tokio::test]
    async fn many_fire_keys_move_cancel_and_fire_once_through_the_tables_growth() {
        let clock = Arc::new(ManualClock::new(1_000));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let timer = Timer::start(clock.clone(), tx).unwrap();
        let n = 5_000u64;
        for i in 0..n {
            timer.at(Key::fire(&format!("t{i}")), 1_100 + i % 7);
        }
        for i in 0..n {
            timer.at(Key::fire(&format!("t{i}")), 2_000 + i % 11); // moved
        }
        for i in (0..n).step_by(3) {
            timer.cancel(Key::fire(&format!("t{i}")));
        }
        // Every command applied before the clock moves: the thread may still be draining
        // them, and one pass that read 1 500 ms before a key's move would fire it early.
        timer.sync();
        clock.set(1_500);
        timer.wake();
        let early = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await;
        if let Ok(Some(keys)) = &early {
            panic!(
                "{} keys fired at their old instant, first {:?}",
                keys.len(),
                keys[0]
            );
        }
        assert!(early.is_err(), "the timer's channel closed: {early:?}");
        clock.set(3_000);
        timer.wake();
        let mut fired = std::collections::HashMap::<String, u32>::new();
        let want = (0..n).filter(|i| i % 3 != 0).count();
        while fired.values().sum::<u32>() < want as u32 {
            let batch = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("the fires came")
                .unwrap();
            for k in batch {
                assert!(matches!(k, Key::Fire(_)));
                *fired.entry(k.id().to_string()).or_default() += 1;
            }
        }
        timer.wake();
        let extra = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await;
        assert!(
            extra.is_err(),
            "a key fired twice or a cancelled one fired: {extra:?}"
        );
        assert_eq!(fired.len(), want);
        assert!(fired.values().all(|&c| c == 1));
        assert!((0..n)
            .step_by(3)
            .all(|i| !fired.contains_key(&format!("t{i}"))));
        // Fired keys left the table: setting one again fires it again.
        timer.at(Key::fire("t1"), 3_010);
        clock.set(3_020);
        timer.wake();
        let again = rx.recv().await.unwrap();
        assert_eq!(again.iter().map(|k| &**k.id()).collect::<Vec<_>>(), ["t1"]);
    }

    /// A wall jump forward hands over a fire key (a schedule's wall instant) at once, but a run
    /// step only when its duration has passed on the monotonic clock too; a send re-set right
    /// after its arm keeps its distance from the arm although its deadline was set before the
    /// jump.
    #[tokio::test]
    async fn a_forward_wall_jump_never_shortens_a_run_step() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let timer = Timer::start(clock.clone(), tx).unwrap();
        timer.at(Key::fire("cron"), 1_060_000);
        timer.at(Key::run("paced", 1), 1_002_900); // arm, 100 ms before its 3 s send
        timer.sync();
        clock.advance(1_000);
        clock.jump_wall(3_600_000);
        timer.wake();
        let k = rx.recv().await.unwrap();
        assert_eq!(
            k,
            vec![Key::fire("cron")],
            "the schedule's instant was jumped over"
        );
        let (next, n) = timer.sync();
        assert_eq!(n, 0, "the step is not due yet");
        assert_eq!(
            next,
            Some(clock.now_ms() + 1_900),
            "put back for what is left"
        );
        clock.advance(1_899);
        timer.wake();
        assert_eq!(timer.sync().1, 0);
        clock.advance(1);
        timer.wake();
        assert_eq!(rx.recv().await.unwrap(), vec![Key::run("paced", 1)]);
        // The send, at the deadline stored before the jump (1 h in the wall's past now).
        timer.at(Key::run("paced", 1), 1_003_000);
        let (next, n) = timer.sync();
        assert_eq!(
            (next, n),
            (Some(clock.now_ms() + 100), 0),
            "100 ms after its arm"
        );
        clock.advance(100);
        timer.wake();
        assert_eq!(rx.recv().await.unwrap(), vec![Key::run("paced", 1)]);
    }

    /// A wall step before a paced run's step is handed over (the timer holds the key to the
    /// monotonic clock, then hands it over with the wall ahead): every later step, set a
    /// pacing interval after its hand-over, is due that interval later on the monotonic clock.
    /// Counted from the earlier deadline, the step's size was carried into every later gap.
    #[tokio::test]
    async fn a_wall_step_before_a_hand_over_is_not_carried_into_later_gaps() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let timer = Timer::start(clock.clone(), tx).unwrap();
        let key = Key::run("paced", 1);
        timer.at(key.clone(), 1_002_900);
        timer.sync();
        clock.advance(1_000);
        clock.jump_wall(5_000);
        timer.wake();
        assert_eq!(timer.sync().1, 0, "held to the monotonic clock");
        clock.advance(1_900);
        timer.wake();
        assert_eq!(rx.recv().await.unwrap(), vec![key.clone()]);
        for step in 0..3 {
            clock.advance(5);
            timer.at(key.clone(), clock.now_ms() + 2_900);
            timer.sync();
            clock.advance(2_900);
            timer.wake();
            timer.sync();
            assert_eq!(
                rx.try_recv().ok(),
                Some(vec![key.clone()]),
                "step {step}: handed over 2 900 ms after it was set"
            );
        }
    }

    /// A run step set at a deadline already past (a paced run resumed after a restart or a
    /// takeover: its stored deadline is the outage's length old) goes at once, and the next
    /// step, set a pacing interval after it ran, is due after that interval: the lateness of
    /// the first is not added to it (nor to any later one) by the continuity rule.
    #[tokio::test]
    async fn a_step_that_ran_late_does_not_delay_the_next_ones() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let timer = Timer::start(clock.clone(), tx).unwrap();
        let key = Key::run("paced", 1);
        timer.at(key.clone(), clock.now_ms() - 1_400); // stored before a 1.4 s outage
        timer.sync();
        assert_eq!(rx.recv().await.unwrap(), vec![key.clone()], "past: at once");
        for _ in 0..5 {
            clock.advance(5); // the send and its settle
            let next = clock.now_ms() + 400;
            timer.at(key.clone(), next);
            assert_eq!(timer.sync(), (Some(next), 0));
            clock.advance(399);
            timer.wake();
            timer.sync();
            assert!(rx.try_recv().is_err(), "not before the interval");
            clock.advance(1);
            timer.wake();
            // A sync answers once every key due now has been handed over.
            timer.sync();
            assert_eq!(
                rx.try_recv().ok(),
                Some(vec![key.clone()]),
                "due one interval after the step that ran late, not later"
            );
        }
    }

    #[tokio::test]
    async fn a_big_round_is_handed_over_in_batches_in_deadline_order() {
        let clock = Arc::new(ManualClock::new(1_000));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let timer = Timer::start(clock.clone(), tx).unwrap();
        let n = HAND_OVER_MAX * 2 + 10;
        timer.at_many(
            (0..n)
                .map(|i| (Key::run(&format!("t{i:04}"), 1), 1_001 + i as u64))
                .collect(),
        );
        clock.set(5_000);
        timer.wake();
        let mut got = Vec::new();
        while got.len() < n {
            let b = rx.recv().await.unwrap();
            assert!(b.len() <= HAND_OVER_MAX);
            got.extend(b.into_iter().map(|k| k.id().to_string()));
        }
        let want: Vec<String> = (0..n).map(|i| format!("t{i:04}")).collect();
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn real_clock_fires_on_time_not_early() {
        let clock: Arc<dyn Clock> = Arc::new(crate::clock::SystemClock::new());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let timer = Timer::start(clock.clone(), tx).unwrap();
        let due = clock.now_ms() + 30;
        timer.at(Key::run("x", 1), due);
        let k = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("fired within the deadline")
            .unwrap();
        let fired_at = clock.now_ms();
        assert_eq!(k.len(), 1);
        assert_eq!(&**k[0].id(), "x");
        assert!(fired_at >= due, "fired {} ms early", due - fired_at);
    }

    /// Coalescing on a real clock: far-off `At`s queued while the thread sleeps reach the wheel
    /// within `COALESCE_MS` of a busy round, a near `At` wakes it at once and fires on time,
    /// and a `Cancel` that woke nothing still wins over its entry.
    #[tokio::test]
    async fn coalesced_commands_reach_the_wheel_and_cancels_win() {
        let clock: Arc<dyn Clock> = Arc::new(crate::clock::SystemClock::new());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let timer = Timer::start(clock.clone(), tx).unwrap();
        let far = clock.now_ms() + 3_600_000;
        // A quiet thread is woken by the first `At`; the thread is then busy and sleeps at
        // most COALESCE_MS, so the rest reach the wheel without each waking it.
        for i in 0..100 {
            timer.at(Key::fire(&format!("far{i}")), far + i);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while timer.entries.load(Ordering::Relaxed) < 100 {
            assert!(
                std::time::Instant::now() < deadline,
                "queued far-off commands never reached the wheel: {} of 100",
                timer.entries.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // An entry due soon, cancelled by a command that wakes nothing: it never fires.
        let soon = clock.now_ms() + 40;
        timer.at(Key::run("cancelled", 1), soon);
        timer.cancel(Key::run("cancelled", 1));
        // A near one while the thread sleeps long (the far entries are its next deadline).
        // Setup, not a wait for a result: a busy thread turns quiet after one empty round.
        tokio::time::sleep(Duration::from_millis(3 * COALESCE_MS)).await;
        let due = clock.now_ms() + 20;
        timer.at(Key::run("near", 1), due);
        let k = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the near entry fired within the deadline")
            .unwrap();
        let fired_at = clock.now_ms();
        let names: Vec<&str> = k.iter().map(|k| &**k.id()).collect();
        assert_eq!(names, ["near"]);
        assert!(fired_at >= due, "fired {} ms early", due - fired_at);
        // Once the cancelled entry's deadline has passed, a sync round hands over everything
        // due by then: nothing else may come.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while clock.now_ms() <= soon {
            assert!(
                std::time::Instant::now() < deadline,
                "the clock stood still"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        timer.sync();
        assert!(rx.try_recv().is_err(), "a cancelled entry fired");
        assert_eq!(timer.entries.load(Ordering::Relaxed), 100);
    }
}

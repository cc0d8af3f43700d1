//! The engine: owns the live tasks, the timer thread and the dispatcher, and is the command
//! API that `api` and `main` use. It never parses HTTP.
//!
//! Concurrency model: every live (non-finished) task has a [`LiveTask`] cell with an async
//! mutex. Every change to a task or its runs happens under that lock and is written to the
//! store (and made durable) before the lock is released, so any two operations on one task are
//! ordered, and what a client is told matches what is on disk. A send is *started* under the
//! lock (its in-flight mark is durable first) and finished outside it, so a slow receiver never
//! blocks cancel.
mod alerts;
mod alive;
/// Alert deliveries in flight at most (they take no slot of their channel: `fdlimit.rs`).
pub(crate) const ALERT_DELIVERIES_MAX: usize = alerts::DELIVERIES_MAX;
mod arm;
mod cells;
mod change;
mod chunk;
pub mod cluster;
mod commit;
mod control;
mod dispatch;
pub mod events; // events (issue 11)
mod failures;
mod herd;
mod marks;
mod notify;
mod offload;
mod plan;
mod prefetch;
mod recovery;
mod render;
pub mod retention;
mod retry;
pub mod stats;
mod step;
pub mod timer;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::clock::Clock;
use crate::deliver::Channels;
use crate::model::{
    Failure, InvalidTransition, Limits, Run, Task, TaskProgress, TaskSpec, TaskState,
};
use crate::request::{Context, FieldError, TaskRequest};
use crate::store::{Inserted, Store, StoreError, Walk};
use timer::Timer;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Invalid(#[from] FieldError),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("id: a task with id {0:?} exists already")]
    IdTaken(String),
    #[error("Idempotency-Key was used before with a different request body")]
    KeyReused,
    #[error("{0}")]
    Limit(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Transition(#[from] InvalidTransition),
    #[error("engine is shutting down")]
    Stopped,
    /// Another request holds what this one needs and has not let go: try again (503).
    #[error("{0}")]
    Busy(String),
    /// Storage is failing: nothing can be made durable now (503).
    #[error("storage is failing: {0}")]
    Storage(String),
    /// A bug or a corrupt record met while handling a request: the task was parked `failed`
    /// (500, never a conflict).
    #[error("internal error: {0}")]
    Internal(String),
}

/// Engine settings that are not per channel.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub limits: Limits,
    /// Seed for retry jitter; fixed in tests for determinism.
    pub jitter_seed: u64,
    /// Channel that alert events are also delivered to.
    pub alerts_channel: Option<String>,
    /// Tests only: while set, start-up's background load of the live index waits before it
    /// reads anything (to test commands on tasks it has not reached yet).
    #[doc(hidden)]
    pub hold_index_load: Option<Arc<AtomicBool>>,
    /// How long finished tasks are kept (`[store] retention`); `None` keeps them forever.
    /// The server sets it from the config; the library default keeps everything.
    pub retention_ms: Option<u64>,
    /// Most run records an unfinished task keeps (`[store] runs_max`): each fire deletes the
    /// oldest finished ones beyond it (a bounded number per fire). `None` keeps every run.
    pub runs_max: Option<u32>,
    /// Most entries the failure list holds (`[store] failures_max`); `None`: no bound. Past
    /// it a message given up on is not listed: its run still counts it failed, the log says
    /// so, `herald_failures_unlisted` counts it, and one alert says the list is full.
    pub failures_max: Option<u64>,
    /// Cluster mode (HA.md): act only on the shards this process holds (`cluster.rs`).
    pub cluster: Option<cluster::ClusterHooks>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            limits: Limits::default(),
            jitter_seed: 0x5eed,
            alerts_channel: None,
            hold_index_load: None,
            retention_ms: None,
            runs_max: None,
            failures_max: None,
            cluster: None,
        }
    }
}

/// A loaded live task and its active runs, guarded by the task's lock.
pub(crate) struct LiveState {
    /// What the user asked for (without the messages: those are read one at a time when
    /// sent). Shared, never copied by a step; replaced whole by a patch.
    pub spec: Arc<TaskSpec>,
    /// What happened to it so far: what the steps change.
    pub progress: TaskProgress,
    /// Runs in state `Running` (sending or waiting between sends).
    pub runs: BTreeMap<u32, Run>,
    /// Runs whose send is in progress outside the lock; their in-flight attempt is real.
    pub sending: BTreeSet<u32>,
    /// The message of a run armed ahead of its instant (a one-shot's fire, `dispatch.rs`),
    /// read then so that the send at the instant does not: a herd's sends are what is short
    /// of CPU; or by the fire pump's prefetch (`prefetch.rs`) for the run the next fire
    /// starts. `(run, seq, message)`; a task's messages cannot change while it has a run,
    /// and a change of them before drops it (`commit.rs`).
    pub prefetched: Option<(u32, u32, crate::model::Message)>,
    /// Runs whose message was in flight when the task was last read from disk (after a crash,
    /// or a write that failed after a send): the next arm of each writes a
    /// `resumed_after_restart` timeline event with it (issue 25).
    pub resent: BTreeSet<u32>,
    /// Per run, the (message, attempt) whose `held` event is written already: a send the rate
    /// limit refuses again and again gets one event (and one write), not one per refusal.
    pub held_noted: BTreeMap<u32, (u32, u32)>,
    /// Cluster mode: the epoch the task's shard was held (and trusted) at when this memory
    /// was read from the store, or made by a create ([`Inner::load_epoch`], asked before the
    /// read). Every write from it carries it (`commit.rs`, `Op::LoadedAt`), and the store's
    /// fence refuses the write unless the shard is held at that epoch still. `None`: not in
    /// cluster mode, or the shard was not trusted then; such writes are fenced at the epoch
    /// held when they are made.
    pub loaded_at: Option<u64>,
}

impl LiveState {
    pub fn new(task: Task, runs: BTreeMap<u32, Run>) -> LiveState {
        let (spec, progress) = task.split();
        LiveState {
            spec: Arc::new(spec),
            progress,
            runs,
            sending: BTreeSet::new(),
            prefetched: None,
            resent: BTreeSet::new(),
            held_noted: BTreeMap::new(),
            loaded_at: None,
        }
    }

    /// [`LiveState::new`] of memory read (or made) at `loaded_at` ([`LiveState::loaded_at`]).
    pub(crate) fn at(mut self, loaded_at: Option<u64>) -> LiveState {
        self.loaded_at = loaded_at;
        self
    }

    fn view(&self) -> TaskView {
        TaskView {
            task: self.task(),
            run: self.runs.values().next_back().cloned(),
        }
    }

    /// The task in its wire shape (a copy of the spec: for views, not steps).
    pub fn task(&self) -> Task {
        Task::join(&self.spec, &self.progress)
    }

    /// Nothing of it runs or sends: it can leave memory until its next fire or command.
    fn is_idle(&self) -> bool {
        self.runs.is_empty() && self.sending.is_empty()
    }
}

/// A live task's cell. `Unloaded` until a step or command needs it: a pending task waiting for
/// its fire costs its wheel entry and its key in the live map, not its record.
pub(crate) enum Slot {
    /// Not in memory. The set is empty but when a failed write unloaded the task while other
    /// runs of it had a send out (outside the lock): those runs, which the next load keeps
    /// sending, to be settled by their own steps, instead of arming them to go again at once
    /// while their attempt is still under way ([`cells::load_task`]).
    Unloaded(BTreeSet<u32>),
    Loaded(Box<LiveState>),
}

impl Slot {
    /// An unloaded cell with no send out.
    pub(crate) fn unloaded() -> Slot {
        Slot::Unloaded(BTreeSet::new())
    }
}

/// The state a task's runs and schedule call for: sending beats waiting for a fire beats done.
pub(crate) fn state_for(task: &TaskProgress, has_active_runs: bool) -> TaskState {
    if has_active_runs {
        TaskState::Running
    } else if task.next_fire_at_ms.is_some() || !task.queued.is_empty() {
        TaskState::Pending
    } else {
        TaskState::Completed
    }
}

/// Like [`state_for`], but paused and finished tasks keep their state.
pub(crate) fn derive_state(task: &TaskProgress, has_active_runs: bool) -> TaskState {
    match task.state {
        TaskState::Paused | TaskState::Completed | TaskState::Cancelled | TaskState::Failed => {
            task.state
        }
        _ => state_for(task, has_active_runs),
    }
}

pub(crate) type LiveTask = tokio::sync::Mutex<Slot>;

pub(crate) struct Inner {
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub channels: Channels,
    pub config: EngineConfig,
    pub timer: Timer,
    /// Every unfinished task, by id; the cell only while it is loaded (see [`Slot`]). While
    /// start-up still loads the live index in the background, it lacks the tasks not reached
    /// yet (see [`cells::LiveMap`]).
    pub live: Mutex<cells::LiveMap>,
    /// When this process started watching: a fire due before it (and before the task's own
    /// `watched_since_ms`) was missed while herald was down.
    pub boot_ms: u64,
    pub ready: AtomicBool,
    /// Set by [`Engine::begin_drain`]: no step starts (and so no send), steps already running
    /// finish and settle durably.
    pub draining: AtomicBool,
    /// Sends that started and have not settled yet.
    pub sends_in_flight: AtomicUsize,
    /// Sends that went in a chunk (`chunk.rs`), since start.
    pub chunked_sends: AtomicU64,
    /// Chunks not yet past their send; a chunk's settle waits for them (`chunk.rs`).
    pub chunks_ahead: Arc<chunk::Ahead>,
    /// Turns for a chunk settle's plans and for its memory after the write,
    /// [`chunk::settles_at_once`] at a time each.
    pub settle_turns: tokio::sync::Semaphore,
    pub settle_after_turns: tokio::sync::Semaphore,
    pub alerts_raised: AtomicU64,
    /// How late sends start (`scheduled_at` → attempt start), in seconds.
    pub lateness: prometheus_client::metrics::histogram::Histogram,
    /// The last census of tasks by state (see `stats.rs`).
    pub census: Mutex<Option<stats::Census>>,
    /// Held while a census scans the store: one scan at a time, however many scrapes ask.
    pub census_scan: Mutex<()>,
    pub alerts_failed: AtomicU64,
    /// Entries in the failure list: counted at start-up, kept by `commit.rs`.
    pub failures: AtomicU64,
    /// Messages given up on that the full failure list did not take.
    pub failures_unlisted: AtomicU64,
    /// The failure list was full when a message was last given up on (one alert per filling).
    pub failures_full: AtomicBool,
    /// Notifications a change called for that could not be made (invalid, e.g. their channel
    /// was deleted, or no room among the live tasks): logged, the change goes on without them.
    pub notify_refused: AtomicU64,
    /// Permits for alert deliveries in flight (`alerts::DELIVERIES_MAX`).
    pub alert_sends: Arc<tokio::sync::Semaphore>,
    /// Serialises changes to failure records (retry steps against dismissals).
    pub failures_lock: tokio::sync::Mutex<()>,
    /// Failure-list entries whose retry attempt is being sent now (taken under
    /// `failures_lock`, let go after its settle): a retry step that finds its entry here does
    /// not send, so two attempts of one message never overlap (`retry.rs`).
    pub failure_sends: marks::Marks,
    /// Tasks with a send out outside their lock (`step.rs`: from the send to its settle), by
    /// how many: a cancelled task's last send may still be settling, and a delete must wait
    /// for it (`retention.rs`), or the settle writes records of a deleted task.
    pub sends_out: marks::Marks,
    /// One-shots counted per second they are due in: a herd's fires are handled earlier.
    pub herd: Mutex<herd::HerdLeads>,
    pub events: events::Bus, // events (issue 11)
}

impl Inner {
    /// A request validated and built into a new task with its messages, as of now: what a
    /// create checks (the API's and a notification's, `commit.rs`).
    pub(crate) fn task_of(
        &self,
        req: TaskRequest,
    ) -> Result<(Task, Vec<crate::model::Message>), EngineError> {
        let channels = self.channels.clone();
        let exists = move |c: &str| channels.contains(c);
        Ok(req.into_task(&Context {
            now_ms: self.clock.now_ms(),
            limits: &self.config.limits,
            channel_exists: &exists,
        })?)
    }
}

/// Raises an alert when storage starts failing and when it works again. (The commit thread
/// logs the change; this adds the alert event, which needs the runtime.)
async fn watch_storage(inner: std::sync::Weak<Inner>) {
    let mut was: Option<String> = None;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = inner.store.failing();
        if now.is_some() != was.is_some() {
            alerts::storage(&inner, now.as_deref());
        }
        was = now;
    }
}

/// A page of runs and the run number the next page starts after (`None` on the last page).
pub type RunPage = (Vec<Run>, Option<u32>);

/// A task as seen by a client: the record plus its current (or last) run.
#[derive(Debug, Clone)]
pub struct TaskView {
    pub task: Task,
    pub run: Option<Run>,
}

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// Outcome of a create call.
pub enum Created {
    /// A new task (201).
    New(TaskView),
    /// The idempotency key replayed an earlier create with the same body (200).
    Replayed(TaskView),
}

impl Engine {
    /// Starts the timer thread and the dispatcher, then recovers every live task from the
    /// store. Must be called inside a tokio runtime.
    pub async fn start(
        store: Store,
        channels: Channels,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
    ) -> Result<Engine, EngineError> {
        let engine = Engine::new(store, channels, clock, config)?;
        engine.recover().await?;
        Ok(engine)
    }

    /// Recovers every live task from the store (once, at start-up), then reports ready.
    /// Until then the API answers 503.
    pub async fn recover(&self) -> Result<(), EngineError> {
        if self.is_ready() {
            return Ok(());
        }
        recovery::recover(&self.inner).await?;
        self.inner.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Cluster mode: follows the lease loop's events (load and unload shards), takes back the
    /// marks armed ahead on shards it hands over, and reads the inbox, until the engine stops
    /// (`cluster.rs`).
    pub fn follow_cluster(
        &self,
        events: tokio::sync::mpsc::UnboundedReceiver<crate::cluster::node::Event>,
    ) {
        // Before the lease loop starts: its first handover already takes marks back.
        cluster::stand_down_on_release(&self.inner);
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(cluster::follow(weak.clone(), events));
        tokio::spawn(cluster::drain_inbox(weak));
    }

    /// Whether this process acts on `task` (always outside cluster mode; in it, whether the
    /// task's shard is held and trusted now).
    pub fn owns(&self, task: &str) -> bool {
        self.inner.owns(task)
    }

    /// The cluster settings this engine runs with (`None`: alone).
    pub fn cluster(&self) -> Option<&cluster::ClusterHooks> {
        self.inner.config.cluster.as_ref()
    }

    /// Starts the timer thread and the dispatcher without recovering; call
    /// [`Engine::recover`] before relying on the engine.
    pub fn new(
        store: Store,
        channels: Channels,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
    ) -> Result<Engine, EngineError> {
        let (due_tx, due_rx) = mpsc::unbounded_channel();
        let timer = Timer::start(clock.clone(), due_tx).map_err(StoreError::Io)?;
        let boot_ms = clock.now_ms();
        let inner = Arc::new(Inner {
            store,
            clock,
            channels,
            config,
            timer,
            live: Mutex::new(cells::LiveMap::default()),
            boot_ms,
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            sends_in_flight: AtomicUsize::new(0),
            chunked_sends: AtomicU64::new(0),
            chunks_ahead: Arc::default(),
            settle_turns: tokio::sync::Semaphore::new(chunk::settles_at_once()),
            settle_after_turns: tokio::sync::Semaphore::new(chunk::settles_at_once()),
            alerts_raised: AtomicU64::new(0),
            lateness: stats::lateness_histogram(),
            census: Mutex::new(None),
            census_scan: Mutex::new(()),
            alerts_failed: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            failures_unlisted: AtomicU64::new(0),
            notify_refused: AtomicU64::new(0),
            failures_full: AtomicBool::new(false),
            alert_sends: Arc::new(tokio::sync::Semaphore::new(alerts::DELIVERIES_MAX)),
            failures_lock: tokio::sync::Mutex::new(()),
            failure_sends: Default::default(),
            sends_out: Default::default(),
            herd: Mutex::new(herd::HerdLeads::default()),
            events: events::Bus::new(), // events (issue 11)
        });
        // The dispatcher holds a weak reference so dropping the last Engine shuts it down.
        tokio::spawn(dispatch::dispatcher(Arc::downgrade(&inner), due_rx));
        tokio::spawn(watch_storage(Arc::downgrade(&inner)));
        if let (Some(r), false) = (inner.config.retention_ms, inner.clock.is_manual()) {
            tokio::spawn(retention::sweeper(Arc::downgrade(&inner), r));
        }
        Ok(Engine { inner })
    }

    /// The storage error herald is stuck on, while writes fail.
    pub fn storage_failing(&self) -> Option<String> {
        self.inner.store.failing()
    }

    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    /// Starts a drain (SIGTERM): from now on no step of the wheel starts, so no send starts;
    /// what is due stays in its durable state (pending, or armed) and the next boot picks it
    /// up, sending each message once. Steps already running, sends among them, go on and
    /// settle durably. See [`Engine::drain`].
    pub fn begin_drain(&self) {
        self.inner.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }

    /// Sends that went in a chunk with others since start (`engine/chunk.rs`).
    pub fn chunked_sends(&self) -> u64 {
        self.inner.chunked_sends.load(Ordering::Relaxed)
    }

    /// Sends that started and have not settled yet.
    pub fn sends_in_flight(&self) -> usize {
        self.inner.sends_in_flight.load(Ordering::Acquire)
    }

    /// The least time a drain gives to taking back the attempts armed ahead
    /// ([`step::stand_down_all`]) after its wait for the steps under way.
    const STAND_DOWN_MIN: std::time::Duration = std::time::Duration::from_secs(2);

    /// Begins a drain and waits, up to `timeout`, until every step that was running has
    /// finished: each send in flight has its answer and its outcome is durable. Returns whether
    /// that happened in time; if not, the sends still waiting for an answer stay in flight on
    /// disk and go again after a restart, with the next attempt number.
    pub async fn drain(&self, timeout: std::time::Duration) -> bool {
        self.begin_drain();
        let end = std::time::Instant::now() + timeout;
        let drained = loop {
            if self.inner.timer.outstanding.load(Ordering::Acquire) == 0 {
                break true;
            }
            if std::time::Instant::now() >= end {
                break false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        };
        // Attempts armed ahead of their instant before the drain began are not sent by this
        // process: taken back now, durably, so the next boot sends them at their time as
        // their first attempt, not as sends cut short. Given `STAND_DOWN_MIN` from now
        // (within the exit's grace after the drain's timeout, `main.rs`): also when the drain
        // ended early, so one cell still busy cannot hold the exit for the rest of `timeout`.
        let until = std::time::Instant::now() + Self::STAND_DOWN_MIN;
        let taken = step::stand_down_all(&self.inner, until.into(), |_| true).await;
        if taken > 0 {
            tracing::info!(
                tasks = taken,
                "draining: attempts armed ahead of their instant taken back"
            );
        }
        alive::last(&self.inner).await;
        drained
    }

    /// The live event bus (`GET /v1/events`).
    pub fn events(&self) -> &events::Bus {
        // events (issue 11)
        &self.inner.events
    }

    /// The limits requests are validated against (schedule preview).
    pub fn limits(&self) -> &Limits {
        // events (issue 11): accessor for the preview
        &self.inner.config.limits
    }

    pub fn channels(&self) -> &Channels {
        &self.inner.channels
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// Makes the timer re-read a manual clock.
    pub fn wake(&self) {
        self.inner.timer.wake();
    }

    /// For tests on a manual clock: waits until every step due at the clock's current time
    /// (and every step those steps scheduled for now) has finished, then returns the wheel's
    /// next deadline. Advancing a manual clock to each returned deadline in turn replays a
    /// schedule deterministically, with every event at its exact instant.
    pub async fn idle(&self) -> Option<u64> {
        let timer = &self.inner.timer;
        // The background load of the live index puts fires on the wheel: wait for it, so the
        // deadline returned below accounts for every live task.
        while self.index_loading() {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        loop {
            // First let every running step finish: the commands they sent to the timer are
            // then queued ahead of the sync below, so its answer accounts for them.
            while timer.outstanding.load(Ordering::Acquire) != 0 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            let completed = timer.completed.load(Ordering::Acquire);
            let inner = self.inner.clone();
            let (next, fired) = tokio::task::spawn_blocking(move || inner.timer.sync())
                .await
                .unwrap_or((None, 0));
            // Idle only if nothing happened around the sync: it handed nothing over, no step
            // is running, and none ran in between (a step the timer started concurrently may
            // have planned more, which `next` would not show). And nothing is due now.
            let now = self.inner.clock.now_ms();
            if fired == 0
                && timer.outstanding.load(Ordering::Acquire) == 0
                && timer.completed.load(Ordering::Acquire) == completed
                && next.is_none_or(|d| d > now)
            {
                return next;
            }
        }
    }

    /// A handle that does not keep the engine alive; `upgrade` fails once it has stopped.
    pub fn downgrade(&self) -> std::sync::Weak<impl Sized> {
        Arc::downgrade(&self.inner)
    }

    /// Validates and creates a task; answers once it is durable.
    /// `idem` is the client's `Idempotency-Key` with a hash of the request body.
    /// Run it to its end: dropped once its write is on its way, it leaves the task stored but
    /// unarmed (the API runs every changing request as a task of its own, `api::changing`;
    /// so must any other caller that may give up). The commands of `control.rs` likewise.
    pub async fn create(
        &self,
        req: TaskRequest,
        idem: Option<(String, [u8; 32])>,
    ) -> Result<Created, EngineError> {
        let inner = &self.inner;
        self.check_storage()?;
        if let Some(replayed) = self.replay_used_key(idem.as_ref()).await? {
            return Ok(replayed);
        }
        let generated = req.id.is_none();
        let (task, messages) = inner.task_of(req)?;
        // Register the cell (locked) before the task is in the store, so that a cancel racing
        // with this create waits for it instead of missing it.
        let id: Arc<str> = Arc::from(task.id.as_str());
        let cell = Arc::new(tokio::sync::Mutex::new(Slot::Loaded(Box::new(
            LiveState::new(task.clone(), BTreeMap::new()).at(inner.load_epoch(&id)),
        ))));
        let guard = cell.clone().lock_owned().await;
        let id_taken_live = claim_id(inner, &id, &cell, generated).await?;
        let inserted = if id_taken_live {
            // Still check the key first: a replay of a create whose task is live is a 200.
            // Never insert here: the live cell may belong to a create still in progress.
            let key = idem.as_ref().map(|(k, _)| k.clone());
            let read = offload::read(inner, move |i| {
                Ok(key.map(|k| i.store.idem_get(&k)).transpose()?)
            });
            match read.await? {
                Some(Some(rec)) => Inserted::KeyUsed(rec),
                _ => Inserted::IdTaken,
            }
        } else {
            match insert_freeing_key(inner, &id, &task, &messages, idem.as_ref()).await {
                Ok(i) => i,
                Err(e) => {
                    // Out of the map before its lock is let go: a command waiting for the
                    // lock then finds the cell gone (`cells::lock`), not a task never stored.
                    self.forget_cell(&id, &cell);
                    drop(guard);
                    return Err(e.into());
                }
            }
        };
        match inserted {
            Inserted::Created => {
                tracing::info!(task = %task.id, channel = %task.channel, messages = task.message_count,
                    next_fire_at = %crate::schedule::format_opt(task.next_fire_at_ms), "task created");
                cluster::created(inner, cells::Locked { id, guard }, cell, &task);
                let view = TaskView { task, run: None };
                Ok(Created::New(view))
            }
            Inserted::IdTaken => {
                if !id_taken_live {
                    self.forget_cell(&id, &cell);
                }
                drop(guard);
                Err(EngineError::IdTaken(task.id.clone()))
            }
            Inserted::KeyUsed(rec) => {
                if !id_taken_live {
                    self.forget_cell(&id, &cell);
                }
                drop(guard);
                let hash = idem.map(|(_, h)| h).unwrap_or_default();
                self.replay(rec, hash).await
            }
        }
    }

    /// A create whose body could not be read into a request (not JSON, a wrong shape, an
    /// unknown field): its key is looked at first all the same, as [`Engine::create`] looks
    /// at it before it judges the body (docs/API.md). A key used by a task that exists answers
    /// as a create would: its task for the same raw body (one a newer herald no longer reads),
    /// 409 for another. `None`: no key, or one free; the body's own error stands. Nothing is
    /// read without a key.
    pub async fn replay_key(
        &self,
        idem: Option<&(String, [u8; 32])>,
    ) -> Result<Option<Created>, EngineError> {
        if idem.is_none() {
            return Ok(None);
        }
        self.check_storage()?;
        self.replay_used_key(idem).await
    }

    /// A create whose idempotency key names a task that exists: answered from the key
    /// ([`Engine::replay`]) before the body is judged. A retry must get its task even when the
    /// checks the body passed depend on what changed since: an `at` now further in the past
    /// than `misfire_grace`, `live_tasks_max` reached, a channel gone from the config. `None`
    /// (no key, a key never used, or one whose task is gone and which is free again): the
    /// create goes on, and its insert still looks at the key (a create racing with this one).
    /// Without a key nothing is read.
    async fn replay_used_key(
        &self,
        idem: Option<&(String, [u8; 32])>,
    ) -> Result<Option<Created>, EngineError> {
        let Some((key, hash)) = idem else {
            return Ok(None);
        };
        let key = key.clone();
        let used = offload::read(&self.inner, move |i| {
            let Some(rec) = i.store.idem_get(&key)? else {
                return Ok(None);
            };
            Ok(i.store.task_exists(&rec.task_id)?.then_some(rec))
        });
        match used.await? {
            Some(rec) => self.replay(rec, *hash).await.map(Some),
            None => Ok(None),
        }
    }

    /// A create whose idempotency key was used before: the same body is answered with the
    /// task it created (200), another body is refused.
    async fn replay(
        &self,
        rec: crate::store::IdemRecord,
        hash: [u8; 32],
    ) -> Result<Created, EngineError> {
        if rec.body_sha256 != hash {
            return Err(EngineError::KeyReused);
        }
        // The original create is durable: its key is only visible once its group is
        // applied, and the group is answered only after its flush. A create still in
        // flight holds its cell's lock; wait for it so the view is complete.
        if let Some(l) = commit::lock(&self.inner, &rec.task_id).await? {
            l.release(&self.inner);
        }
        let view = self
            .get(&rec.task_id)?
            .ok_or_else(|| EngineError::NotFound(rec.task_id.clone()))?;
        Ok(Created::Replayed(view))
    }

    /// Refuses writes while storage fails (503 until a write succeeds again).
    pub(crate) fn check_storage(&self) -> Result<(), EngineError> {
        match self.inner.store.failing() {
            Some(e) => Err(EngineError::Storage(e)),
            None => Ok(()),
        }
    }

    fn forget_cell(&self, id: &str, cell: &Arc<LiveTask>) {
        let mut live = self.inner.live.lock();
        if live.cell(id).is_some_and(|c| Arc::ptr_eq(c, cell)) {
            live.remove(id);
        }
    }

    /// One task with its current or last run ([`view_run`]).
    pub fn get(&self, id: &str) -> Result<Option<TaskView>, EngineError> {
        let Some(task) = self.inner.store.get_task(id)? else {
            return Ok(None);
        };
        let run = view_run(&self.inner.store, &task)?;
        Ok(Some(TaskView { task, run }))
    }

    /// A page of tasks in id order, where the next page starts, and how many records were
    /// skipped as unreadable. A page examines at most `store::SCAN_MAX` records: with a rare
    /// filter it can be short (even empty) and still have a next page.
    /// Running and paused tasks are listed from their stretch of the due index, so
    /// `?state=paused` never walks the others; pending ones from every task (format 7 keeps
    /// no id-ordered index of them alone). Blocking: the API calls it off the runtime's workers.
    pub fn list(
        &self,
        state: Option<TaskState>,
        channel: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<TaskView>, Option<String>, usize), EngineError> {
        let walk = match state {
            Some(TaskState::Running) => Walk::Running,
            Some(TaskState::Paused) => Walk::Paused,
            _ => Walk::All,
        };
        let (tasks, next, bad) = self.inner.store.task_page(after, limit, walk, |t| {
            state.is_none_or(|s| t.state == s) && channel.is_none_or(|c| t.channel == c)
        })?;
        let mut skipped = bad.len();
        let mut out = Vec::with_capacity(tasks.len());
        for task in tasks {
            let run = match view_run(&self.inner.store, &task) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(task = %task.id, error = %e, "listing shows a task without its unreadable run");
                    skipped += 1;
                    None
                }
            };
            out.push(TaskView { task, run });
        }
        Ok((out, next, skipped))
    }

    /// A page of a task's runs after run number `after`, oldest first, and the run number the
    /// next page starts after (`None` on the last page); `None` if there is no such task.
    pub fn runs_page(
        &self,
        id: &str,
        after: Option<u32>,
        limit: usize,
    ) -> Result<Option<RunPage>, EngineError> {
        if !self.inner.store.task_exists(id)? {
            return Ok(None);
        }
        let (runs, more) = self.inner.store.runs_page(id, after, limit)?;
        let next = if more {
            runs.last().map(|r| r.run)
        } else {
            None
        };
        Ok(Some((runs, next)))
    }

    /// The runs of a task, oldest first.
    pub fn runs(&self, id: &str) -> Result<Option<Vec<Run>>, EngineError> {
        if !self.inner.store.task_exists(id)? {
            return Ok(None);
        }
        Ok(Some(self.inner.store.runs_of(id)?))
    }

    /// True while start-up still loads the live index in the background (after ready; see
    /// `recovery.rs`).
    pub fn index_loading(&self) -> bool {
        self.inner.live.lock().loading.is_some()
    }

    /// Tasks that are pending, running or paused.
    pub fn live_tasks(&self) -> usize {
        self.inner.live.lock().len()
    }

    /// The fire-lateness histogram (seconds).
    pub fn lateness(&self) -> &prometheus_client::metrics::histogram::Histogram {
        &self.inner.lateness
    }

    /// Entries on the timing wheel (one per pending fire, active run step and failure retry),
    /// as of the timer's last round: a far-off entry is counted up to ~10 ms after its `At`.
    pub fn wheel_entries(&self) -> usize {
        self.inner
            .timer
            .entries
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Unfinished tasks by state and the failure list's size: the cached census while it is
    /// fresh, else a new one (a scan of the `live` index and the failure list). Blocking. One
    /// scan at a time: while another runs, the last census however old, or
    /// [`EngineError::Busy`] when there is none yet.
    pub fn census(&self) -> Result<stats::Census, EngineError> {
        if let Some(c) = self.last_census() {
            if c.is_fresh(std::time::Instant::now()) {
                return Ok(c);
            }
        }
        let Some(_scan) = self.inner.census_scan.try_lock() else {
            return self.last_census().ok_or_else(|| {
                EngineError::Busy("the first census of tasks is being taken".into())
            });
        };
        // Taken meanwhile by the scan that just ended?
        let now = std::time::Instant::now();
        if let Some(c) = self.last_census().filter(|c| c.is_fresh(now)) {
            return Ok(c);
        }
        let mut c = stats::Census {
            pending: 0,
            running: 0,
            paused: 0,
            failures: 0,
            taken_at: now,
            took: std::time::Duration::ZERO,
        };
        for e in self.inner.store.live_entries() {
            let entry = match e {
                Ok((_, entry)) => entry,
                // Skipped, as recovery skips it (logged there): one unreadable record must
                // not keep every census from being taken. A read error ends the scan.
                Err(crate::store::StoreError::Corrupt { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            match entry.state {
                TaskState::Pending => c.pending += 1,
                TaskState::Running => c.running += 1,
                TaskState::Paused => c.paused += 1,
                _ => {}
            }
        }
        c.failures = self.inner.store.failure_count()?;
        c.took = now.elapsed();
        *self.inner.census.lock() = Some(c);
        Ok(c)
    }

    /// The last census taken, however old (`None` before the first).
    pub fn last_census(&self) -> Option<stats::Census> {
        *self.inner.census.lock()
    }

    /// Messages given up on that the full failure list did not take (`[store] failures_max`).
    pub fn failures_unlisted(&self) -> u64 {
        self.inner.failures_unlisted.load(Ordering::Relaxed)
    }

    /// Notifications a change called for that could not be made, since start.
    pub fn notify_refused(&self) -> u64 {
        self.inner.notify_refused.load(Ordering::Relaxed)
    }

    /// Alerts raised and alert deliveries that failed, since start.
    pub fn alert_counts(&self) -> (u64, u64) {
        (
            self.inner.alerts_raised.load(Ordering::Relaxed),
            self.inner.alerts_failed.load(Ordering::Relaxed),
        )
    }

    /// A page of the failure list.
    pub fn failures(
        &self,
        task: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Failure>, bool), EngineError> {
        Ok(self.inner.store.failure_page(task, after, limit)?)
    }
}

/// The run a task's view shows (its `progress`): the newest run still sending, else the last
/// run. Every fire writes a run record, a skipped (overlap) or expired one too, so while run N
/// sends the last record may well be run N+1 `skipped`. Only a running or paused task whose
/// last run is not running reads more: its stretch of the `active_runs` index, one entry per
/// active run; a pending or finished task has none (`state_for`), and a listing of them
/// costs what it did.
fn view_run(store: &Store, task: &Task) -> Result<Option<Run>, StoreError> {
    let last = store.last_run(&task.id)?;
    let sending = last
        .as_ref()
        .is_some_and(|r| r.state == crate::model::RunState::Running);
    if sending || !matches!(task.state, TaskState::Running | TaskState::Paused) {
        return Ok(last);
    }
    Ok(store.active_runs_of(&task.id)?.pop().or(last))
}

/// Claims `id` in the live map for a create with the (locked) `cell`: `false` when claimed,
/// `true` when the id is taken by a live task (or a create of it that went through).
///
/// A task of this id that the background load (or, in cluster mode, the inbox) has not
/// reached yet is live too: it is adopted first, its entry read without the map's lock
/// (`cells::adopt_off`). Not for an id herald made (`generated`): none is on disk yet.
async fn claim_id(
    inner: &Arc<Inner>,
    id: &Arc<str>,
    cell: &Arc<LiveTask>,
    generated: bool,
) -> Result<bool, EngineError> {
    let mut waits = 0;
    let mut looked = generated;
    loop {
        if !looked && cells::may_adopt(inner, &inner.live.lock(), id) {
            looked = true;
            cells::adopt_off(inner, id).await?;
        }
        let other = {
            let mut live = inner.live.lock();
            if live.contains_key(id) {
                live.cell(id).cloned()
            } else if live.len() >= inner.config.limits.live_tasks_max {
                return Err(EngineError::Limit(format!(
                    "herald already holds {} unfinished tasks (limits.live_tasks_max)",
                    live.len()
                )));
            } else {
                live.claim(id.clone(), Some(cell.clone()));
                return Ok(false);
            }
        };
        // The cell may be a create of this id still on its way to the store (a client's
        // retry of a create that has not answered yet): 409 now would say "stored" before
        // it is, and that create may yet fail. Its holder is waited for, and the store then
        // says whether the id is taken; if not (that create failed), this one goes ahead.
        // (Our own cell is in no map: nothing waits for it meanwhile.)
        let Some(c) = other else {
            return Ok(true); // live, not loaded yet: a stored task
        };
        if waits == 3 {
            // Creates of this id keep failing while this one waits (or a cell outlived its
            // create): not "taken" without the store saying so; the client tries again.
            return Err(EngineError::Busy(format!(
                "a create of task {id:?} is in progress and has not ended; try again shortly"
            )));
        }
        drop(c.lock().await);
        waits += 1;
        let key = id.clone();
        if offload::read(inner, move |i| Ok(i.store.task_exists(&key)?)).await? {
            return Ok(true);
        }
    }
}

/// Whether the task an idempotency key names exists (read off the worker when reads block);
/// a read that fails says it does (the key is then not freed).
async fn key_task_exists(inner: &Arc<Inner>, rec: &crate::store::IdemRecord) -> bool {
    let id = rec.task_id.clone();
    let read = offload::read(inner, move |i| Ok(i.store.task_exists(&id)?)).await;
    read.unwrap_or(true)
}

/// Inserts a new task (`commit::insert`). A key whose task was deleted since (retention,
/// DELETE) is free again: it is removed once and the insert tried again. The background sweep
/// removes such keys too; this covers the time until. The removal applies only while the key
/// still names the gone task: a create that freed it first and took it is answered by the
/// retry as the key's task (`Store::delete_idem_keys`).
async fn insert_freeing_key(
    inner: &Arc<Inner>,
    id: &Arc<str>,
    task: &Task,
    messages: &[crate::model::Message],
    idem: Option<&(String, [u8; 32])>,
) -> Result<Inserted, StoreError> {
    let mut freed_key = false;
    loop {
        let inserted = commit::insert(
            inner,
            id,
            task,
            messages,
            idem.map(|(k, h)| (k.as_str(), *h)),
        )
        .await?;
        match inserted {
            Inserted::KeyUsed(rec) if !freed_key && !key_task_exists(inner, &rec).await => {
                freed_key = true;
                let keys = idem
                    .iter()
                    .map(|(k, _)| (k.clone(), rec.task_id.clone()))
                    .collect();
                commit::delete_idem_keys(inner, keys).await?;
            }
            i => return Ok(i),
        }
    }
}

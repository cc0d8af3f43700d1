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
mod dispatch;
mod recovery;
mod retry;
pub mod timer;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::clock::Clock;
use crate::deliver::Channels;
use crate::model::{
    Context, Failure, FieldError, InvalidTransition, Limits, PatchRequest, Run, RunState, Task,
    TaskRequest, TaskState,
};
use crate::store::{Batch, Inserted, Store, StoreError};
use timer::{RunKey, Timer};

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
}

/// Engine settings that are not per channel.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub limits: Limits,
    /// Seed for retry jitter; fixed in tests for determinism.
    pub jitter_seed: u64,
    /// Channel that alert events are also delivered to.
    pub alerts_channel: Option<String>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            limits: Limits::default(),
            jitter_seed: 0x5eed,
            alerts_channel: None,
        }
    }
}

/// A live task and its active runs, guarded by the task's lock.
pub(crate) struct LiveState {
    pub task: Task,
    /// Runs in state `Running` (sending or waiting between sends).
    pub runs: BTreeMap<u32, Run>,
    /// Runs whose send is in progress outside the lock; their in-flight attempt is real.
    pub sending: BTreeSet<u32>,
}

impl LiveState {
    pub fn new(task: Task, runs: BTreeMap<u32, Run>) -> LiveState {
        LiveState {
            task,
            runs,
            sending: BTreeSet::new(),
        }
    }

    fn view(&self) -> TaskView {
        TaskView {
            task: self.task.clone(),
            run: self.runs.values().next_back().cloned(),
        }
    }
}

/// The state a task's runs and schedule call for: sending beats waiting for a fire beats done.
pub(crate) fn state_for(task: &Task, has_active_runs: bool) -> TaskState {
    if has_active_runs {
        TaskState::Running
    } else if task.next_fire_at_ms.is_some() || !task.queued.is_empty() {
        TaskState::Pending
    } else {
        TaskState::Completed
    }
}

/// Like [`state_for`], but paused and finished tasks keep their state.
pub(crate) fn derive_state(task: &Task, has_active_runs: bool) -> TaskState {
    match task.state {
        TaskState::Paused | TaskState::Completed | TaskState::Cancelled | TaskState::Failed => {
            task.state
        }
        _ => state_for(task, has_active_runs),
    }
}

pub(crate) type LiveTask = tokio::sync::Mutex<LiveState>;

pub(crate) struct Inner {
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub channels: Channels,
    pub config: EngineConfig,
    pub timer: Timer,
    pub live: Mutex<HashMap<String, Arc<LiveTask>>>,
    pub ready: AtomicBool,
    pub alerts_raised: AtomicU64,
    pub alerts_failed: AtomicU64,
    /// Serialises changes to failure records (retry steps against dismissals).
    pub failures_lock: tokio::sync::Mutex<()>,
}

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
        let inner = Arc::new(Inner {
            store,
            clock,
            channels,
            config,
            timer,
            live: Mutex::new(HashMap::new()),
            ready: AtomicBool::new(false),
            alerts_raised: AtomicU64::new(0),
            alerts_failed: AtomicU64::new(0),
            failures_lock: tokio::sync::Mutex::new(()),
        });
        // The dispatcher holds a weak reference so dropping the last Engine shuts it down.
        tokio::spawn(dispatch::dispatcher(Arc::downgrade(&inner), due_rx));
        Ok(Engine { inner })
    }

    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
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
    pub async fn create(
        &self,
        req: TaskRequest,
        idem: Option<(String, [u8; 32])>,
    ) -> Result<Created, EngineError> {
        let inner = &self.inner;
        let channels = inner.channels.clone();
        let exists = move |c: &str| channels.contains(c);
        let task = req.into_task(&Context {
            now_ms: inner.clock.now_ms(),
            limits: &inner.config.limits,
            channel_exists: &exists,
        })?;
        // Register the cell (locked) before the task is in the store, so that a cancel racing
        // with this create waits for it instead of missing it.
        let cell = Arc::new(tokio::sync::Mutex::new(LiveState::new(
            task.clone(),
            BTreeMap::new(),
        )));
        let guard = cell.clone().lock_owned().await;
        let id_taken_live = {
            let mut live = inner.live.lock();
            if live.contains_key(&task.id) {
                true
            } else if live.len() >= inner.config.limits.live_tasks_max {
                return Err(EngineError::Limit(format!(
                    "herald already holds {} unfinished tasks (limits.live_tasks_max)",
                    live.len()
                )));
            } else {
                live.insert(task.id.clone(), cell.clone());
                false
            }
        };
        let inserted = if id_taken_live {
            // Still check the key first: a replay of a create whose task is live is a 200.
            // Never insert here: the live cell may belong to a create still in progress.
            match idem
                .as_ref()
                .map(|(k, _)| inner.store.idem_get(k))
                .transpose()?
            {
                Some(Some(rec)) => Inserted::KeyUsed(rec),
                _ => Inserted::IdTaken,
            }
        } else {
            match inner
                .store
                .insert_new_task(&task, idem.as_ref().map(|(k, h)| (k.as_str(), *h)))
            {
                Ok(i) => i,
                Err(e) => {
                    self.forget_cell(&task.id, &cell);
                    return Err(e.into());
                }
            }
        };
        match inserted {
            Inserted::Created => {
                let durable = inner.store.durable().await;
                if let Err(e) = durable {
                    drop(guard);
                    self.forget_cell(&task.id, &cell);
                    return Err(e.into());
                }
                dispatch::plan_fire(inner, &task);
                tracing::info!(task = %task.id, channel = %task.channel, messages = task.messages.len(),
                    next_fire_at = ?task.next_fire_at_ms, "task created");
                drop(guard);
                Ok(Created::New(TaskView { task, run: None }))
            }
            Inserted::IdTaken => {
                drop(guard);
                if !id_taken_live {
                    self.forget_cell(&task.id, &cell);
                }
                Err(EngineError::IdTaken(task.id.clone()))
            }
            Inserted::KeyUsed(rec) => {
                drop(guard);
                if !id_taken_live {
                    self.forget_cell(&task.id, &cell);
                }
                let hash = idem.map(|(_, h)| h).unwrap_or_default();
                if rec.body_sha256 != hash {
                    return Err(EngineError::KeyReused);
                }
                // The original create may still be waiting for its flush: answer only once
                // what we return is durable.
                inner.store.durable().await?;
                let view = self
                    .get(&rec.task_id)?
                    .ok_or_else(|| EngineError::NotFound(rec.task_id.clone()))?;
                Ok(Created::Replayed(view))
            }
        }
    }

    fn forget_cell(&self, id: &str, cell: &Arc<LiveTask>) {
        let mut live = self.inner.live.lock();
        if live.get(id).is_some_and(|c| Arc::ptr_eq(c, cell)) {
            live.remove(id);
        }
    }

    /// One task with its current or last run.
    pub fn get(&self, id: &str) -> Result<Option<TaskView>, EngineError> {
        let Some(task) = self.inner.store.get_task(id)? else {
            return Ok(None);
        };
        let run = self.inner.store.last_run(id)?;
        Ok(Some(TaskView { task, run }))
    }

    /// A page of tasks in id order.
    pub fn list(
        &self,
        state: Option<TaskState>,
        channel: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<TaskView>, bool), EngineError> {
        let (tasks, more) = self.inner.store.task_page(after, limit, |t| {
            state.is_none_or(|s| t.state == s) && channel.is_none_or(|c| t.channel == c)
        })?;
        let mut out = Vec::with_capacity(tasks.len());
        for task in tasks {
            let run = self.inner.store.last_run(&task.id)?;
            out.push(TaskView { task, run });
        }
        Ok((out, more))
    }

    /// The runs of a task, oldest first.
    pub fn runs(&self, id: &str) -> Result<Option<Vec<Run>>, EngineError> {
        if self.inner.store.get_task(id)?.is_none() {
            return Ok(None);
        }
        Ok(Some(self.inner.store.runs_of(id)?))
    }

    /// The live cell of a task, or the right error: 404 if unknown, 409 if finished (every
    /// unfinished task is live).
    fn live_cell(&self, id: &str) -> Result<Arc<LiveTask>, EngineError> {
        if let Some(cell) = self.inner.live.lock().get(id).cloned() {
            return Ok(cell);
        }
        match self.inner.store.get_task(id)? {
            None => Err(EngineError::NotFound(format!("task {id:?}"))),
            Some(t) => Err(EngineError::Conflict(format!(
                "task {id:?} is already {}",
                t.state
            ))),
        }
    }

    /// Writes `st`'s task and the given runs durably, then takes the task's wheel entries off
    /// or puts them on according to its new state.
    async fn commit(
        &self,
        st: &mut LiveState,
        task: Task,
        runs: Vec<Run>,
    ) -> Result<(), EngineError> {
        let mut batch = Batch::new();
        batch.task(&task);
        for r in &runs {
            batch.run(&task.id, r);
        }
        self.inner.store.apply(&batch)?;
        self.inner.store.durable().await?;
        for r in runs {
            if r.state == RunState::Running {
                st.runs.insert(r.run, r);
            } else {
                st.runs.remove(&r.run);
            }
        }
        st.task = task;
        let inner = &self.inner;
        if st.task.state == TaskState::Running {
            for r in st.runs.values() {
                dispatch::plan_run(inner, &st.task.id, r);
            }
        } else {
            for r in st.runs.keys() {
                inner.timer.cancel(RunKey::new(&st.task.id, *r));
            }
        }
        dispatch::plan_fire(inner, &st.task);
        if st.task.state.is_terminal() {
            inner.live.lock().remove(&st.task.id);
        }
        Ok(())
    }

    /// Runs that were armed but are not sending give their attempt back (nothing was sent).
    fn disarmed(st: &LiveState) -> Vec<Run> {
        st.runs
            .values()
            .filter(|r| !st.sending.contains(&r.run))
            .map(|r| {
                let mut r = r.clone();
                r.disarm();
                r
            })
            .collect()
    }

    /// Cancels a task: no send of it starts after this returns. Durable before it returns.
    pub async fn cancel(&self, id: &str) -> Result<TaskView, EngineError> {
        let cell = self.live_cell(id)?;
        let mut st = cell.lock().await;
        if st.task.state.is_terminal() {
            return Err(EngineError::Conflict(format!(
                "task {id:?} is already {}",
                st.task.state
            )));
        }
        let now = self.inner.clock.now_ms();
        let mut task = st.task.clone();
        task.set_state(TaskState::Cancelled, now)?;
        task.next_fire_at_ms = None;
        task.queued.clear();
        let mut runs = Self::disarmed(&st);
        runs.extend(
            st.runs
                .values()
                .filter(|r| st.sending.contains(&r.run))
                .cloned(),
        );
        for r in &mut runs {
            r.state = RunState::Cancelled;
            r.finished_at_ms = Some(now);
            r.next_at_ms = None;
        }
        // Keep sending runs in memory (their outcome is still settled); drop the rest.
        let sending: Vec<Run> = runs
            .iter()
            .filter(|r| st.sending.contains(&r.run))
            .cloned()
            .collect();
        let view_run = runs.iter().max_by_key(|r| r.run).cloned();
        self.commit(&mut st, task, runs).await?;
        for r in sending {
            st.runs.insert(r.run, r);
        }
        tracing::info!(task = %id, "task cancelled");
        let view = TaskView {
            task: st.task.clone(),
            run: view_run,
        };
        drop(st);
        Ok(match view.run {
            Some(_) => view,
            None => TaskView {
                run: self.inner.store.last_run(id)?,
                ..view
            },
        })
    }

    /// Pauses a task: nothing of it is sent until resumed; a sequence stops after its in-flight
    /// message. Durable before it returns, and survives restarts.
    pub async fn pause(&self, id: &str) -> Result<TaskView, EngineError> {
        let cell = self.live_cell(id)?;
        let mut st = cell.lock().await;
        if !matches!(st.task.state, TaskState::Pending | TaskState::Running) {
            return Err(EngineError::Conflict(format!(
                "task {id:?} is {}; only pending or running tasks can be paused",
                st.task.state
            )));
        }
        let now = self.inner.clock.now_ms();
        let mut task = st.task.clone();
        task.set_state(TaskState::Paused, now)?;
        let runs = Self::disarmed(&st);
        self.commit(&mut st, task, runs).await?;
        tracing::info!(task = %id, "task paused");
        Ok(self.view_of(&st))
    }

    /// Resumes a paused task: sequences continue at their cursor; fire times missed while
    /// paused are judged by the misfire policy.
    pub async fn resume(&self, id: &str) -> Result<TaskView, EngineError> {
        let cell = self.live_cell(id)?;
        let mut st = cell.lock().await;
        if st.task.state != TaskState::Paused {
            return Err(EngineError::Conflict(format!(
                "task {id:?} is {}; only paused tasks can be resumed",
                st.task.state
            )));
        }
        let now = self.inner.clock.now_ms();
        let mut task = st.task.clone();
        task.set_state(state_for(&task, !st.runs.is_empty()), now)?;
        let runs: Vec<Run> = st
            .runs
            .values()
            .map(|r| {
                let mut r = r.clone();
                r.next_at_ms = Some(r.next_at_ms.unwrap_or(now).max(now));
                r
            })
            .collect();
        self.commit(&mut st, task, runs).await?;
        tracing::info!(task = %id, state = %st.task.state, "task resumed");
        Ok(self.view_of(&st))
    }

    /// Starts a run now ("send now"). For a one-shot task this replaces its scheduled time.
    pub async fn trigger(&self, id: &str) -> Result<TaskView, EngineError> {
        let cell = self.live_cell(id)?;
        let mut st = cell.lock().await;
        match st.task.state {
            TaskState::Pending => {}
            TaskState::Running if st.task.overlap == crate::model::Overlap::Allow => {}
            s => {
                return Err(EngineError::Conflict(format!(
                    "task {id:?} is {s}; trigger needs a pending task (or overlap allow)"
                )))
            }
        }
        let now = self.inner.clock.now_ms();
        let mut task = st.task.clone();
        task.fires += 1;
        let run_no = task.fires;
        if task.schedule.is_one_shot() {
            task.last_fire_ms = Some(now);
        }
        let run = dispatch::start_run(&mut task, run_no, now, now);
        task.next_fire_at_ms = crate::schedule::next_fire(&task, now);
        task.set_state(TaskState::Running, now)?;
        tracing::info!(task = %id, run = run_no, "run triggered");
        self.commit(&mut st, task, vec![run]).await?;
        Ok(self.view_of(&st))
    }

    /// Changes a pending or paused task; its next fire is recomputed.
    pub async fn patch(&self, id: &str, req: PatchRequest) -> Result<TaskView, EngineError> {
        let cell = self.live_cell(id)?;
        let mut st = cell.lock().await;
        if !matches!(st.task.state, TaskState::Pending | TaskState::Paused) {
            return Err(EngineError::Conflict(format!(
                "task {id:?} is {}; only pending or paused tasks can be changed",
                st.task.state
            )));
        }
        if req.changes_messages() && !st.runs.is_empty() {
            return Err(EngineError::Conflict(format!(
                "task {id:?} is paused in the middle of a run; its messages cannot change until the run ends"
            )));
        }
        let inner = &self.inner;
        let channels = inner.channels.clone();
        let exists = move |c: &str| channels.contains(c);
        let now = inner.clock.now_ms();
        let mut task = req.apply(
            &st.task,
            &Context {
                now_ms: now,
                limits: &inner.config.limits,
                channel_exists: &exists,
            },
        )?;
        let to = derive_state(&task, !st.runs.is_empty());
        task.set_state(to, now)?;
        self.commit(&mut st, task, vec![]).await?;
        tracing::info!(task = %id, next_fire_at = ?st.task.next_fire_at_ms, "task changed");
        Ok(self.view_of(&st))
    }

    fn view_of(&self, st: &LiveState) -> TaskView {
        let mut v = st.view();
        if v.run.is_none() {
            v.run = self.inner.store.last_run(&st.task.id).ok().flatten();
        }
        v
    }

    /// Retries a message from the failure list (202): new attempts, same idempotency key.
    pub async fn retry_failure(&self, id: &str) -> Result<Failure, EngineError> {
        let inner = &self.inner;
        let _g = inner.failures_lock.lock().await;
        let mut f = inner
            .store
            .get_failure(id)?
            .ok_or_else(|| EngineError::NotFound(format!("failure {id:?}")))?;
        if !f.retrying {
            f.retrying = true;
            f.retries = 0;
            let mut b = Batch::new();
            b.failure(f.clone());
            inner.store.apply(&b)?;
            inner.store.durable().await?;
        }
        inner.timer.at(
            RunKey::new(id, timer::FAILURE_RETRY_RUN),
            inner.clock.now_ms(),
        );
        tracing::info!(failure = %id, "failure retry requested");
        Ok(f)
    }

    /// Removes a message from the failure list (and stops a retry of it).
    pub async fn dismiss_failure(&self, id: &str) -> Result<Failure, EngineError> {
        let inner = &self.inner;
        let _g = inner.failures_lock.lock().await;
        let f = inner
            .store
            .get_failure(id)?
            .ok_or_else(|| EngineError::NotFound(format!("failure {id:?}")))?;
        let mut b = Batch::new();
        b.ops.push(crate::store::Op::DeleteFailure(id.to_string()));
        inner.store.apply(&b)?;
        inner.store.durable().await?;
        inner
            .timer
            .cancel(RunKey::new(id, timer::FAILURE_RETRY_RUN));
        tracing::info!(failure = %id, "failure dismissed");
        Ok(f)
    }

    /// Tasks that are pending, running or paused.
    pub fn live_tasks(&self) -> usize {
        self.inner.live.lock().len()
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

//! The engine: owns the live tasks, the timer thread and the dispatcher, and is the command
//! API that `api` and `main` use. It never parses HTTP.
//!
//! Concurrency model: every live (non-finished) task has a [`LiveTask`] cell with an async
//! mutex. Every change to a task or its runs happens under that lock and is written to the
//! store (and made durable) before the lock is released, so any two operations on one task are
//! ordered, and what a client is told matches what is on disk. A send is *started* under the
//! lock (its in-flight mark is durable first) and finished outside it, so a slow receiver never
//! blocks cancel.

mod dispatch;
mod recovery;
pub mod timer;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::clock::Clock;
use crate::deliver::Channels;
use crate::model::{
    Context, Failure, FieldError, InvalidTransition, Limits, Run, RunState, Task, TaskRequest,
    TaskState,
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
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            limits: Limits::default(),
            jitter_seed: 0x5eed,
        }
    }
}

/// A live task and its active runs, guarded by the task's lock.
pub(crate) struct LiveState {
    pub task: Task,
    pub runs: BTreeMap<u32, Run>,
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
        let cell = Arc::new(tokio::sync::Mutex::new(LiveState {
            task: task.clone(),
            runs: BTreeMap::new(),
        }));
        let guard = cell.clone().lock_owned().await;
        let id_taken_live = {
            let mut live = inner.live.lock();
            if live.contains_key(&task.id) {
                true
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
                if let Some(at) = task.next_fire_at_ms {
                    inner.timer.at(RunKey::new(&task.id, task.runs + 1), at);
                }
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

    /// Cancels a task: no send of it starts after this returns. Durable before it returns.
    pub async fn cancel(&self, id: &str) -> Result<TaskView, EngineError> {
        let inner = &self.inner;
        let cell = inner.live.lock().get(id).cloned();
        let Some(cell) = cell else {
            // Not live: either unknown or finished (every unfinished task is live).
            return match inner.store.get_task(id)? {
                None => Err(EngineError::NotFound(format!("task {id:?}"))),
                Some(t) => Err(EngineError::Conflict(format!(
                    "task {id:?} is already {}",
                    t.state
                ))),
            };
        };
        let mut st = cell.lock().await;
        if st.task.state.is_terminal() {
            return Err(EngineError::Conflict(format!(
                "task {id:?} is already {}",
                st.task.state
            )));
        }
        let now = inner.clock.now_ms();
        let mut next = st.task.clone();
        next.set_state(TaskState::Cancelled, now)?;
        next.next_fire_at_ms = None;
        let mut batch = Batch::new();
        batch.task(&next);
        let mut runs = st.runs.clone();
        for r in runs.values_mut() {
            r.state = RunState::Cancelled;
            r.finished_at_ms = Some(now);
            r.next_at_ms = None;
            batch.run(id, r);
        }
        inner.store.apply(&batch)?;
        inner.store.durable().await?;
        // Only now is the cancel visible to the dispatcher (it checks the state under the lock).
        let pending_fire = RunKey::new(id, st.task.runs + 1);
        st.task = next;
        st.runs = runs;
        inner.timer.cancel(pending_fire);
        for r in st.runs.keys() {
            inner.timer.cancel(RunKey::new(id, *r));
        }
        let view = TaskView {
            task: st.task.clone(),
            run: st.runs.values().next_back().cloned(),
        };
        drop(st);
        inner.live.lock().remove(id);
        tracing::info!(task = %id, "task cancelled");
        Ok(match view.run {
            Some(_) => view,
            None => TaskView {
                run: inner.store.last_run(id)?,
                ..view
            },
        })
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

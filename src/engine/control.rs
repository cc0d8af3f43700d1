//! The control commands: cancel, pause, resume, trigger, patch. Each takes the task's lock,
//! computes the new task and runs, makes them durable, and only then changes memory and the
//! wheel — so once a command answers, the dispatcher (which checks state under the same lock)
//! acts on it.

use std::sync::Arc;

use super::dispatch;
use super::timer::RunKey;
use super::{derive_state, state_for, Engine, EngineError, LiveState, LiveTask, TaskView};
use crate::model::{Context, PatchRequest, Run, RunState, Task, TaskState};
use crate::store::Batch;

impl Engine {
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
        self.inner.events.committed(&task, &runs); // events (issue 11)
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
}

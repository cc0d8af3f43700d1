//! The control commands: cancel, pause, resume, trigger, patch. Each takes the task's lock,
//! computes the new task and runs, makes them durable, and only then changes memory and the
//! wheel — so once a command answers, the dispatcher (which checks state under the same lock)
//! acts on it.

use super::cells::{self, Locked};
use super::dispatch;
use super::timer::RunKey;
use super::{derive_state, state_for, Engine, EngineError, LiveState, TaskView};
use crate::model::{Context, Message, PatchRequest, Run, RunState, Task, TaskState};
use crate::store::{Batch, Op};

impl Engine {
    /// The locked live task, or the right error: 404 if unknown, 409 if finished (every
    /// unfinished task is live). Refused while storage fails (nothing could be made durable).
    async fn locked(&self, id: &str) -> Result<Locked, EngineError> {
        self.check_storage()?;
        if let Some(l) = cells::lock(&self.inner, id).await? {
            return Ok(l);
        }
        match self.inner.store.get_task(id)? {
            None => Err(EngineError::NotFound(format!("task {id:?}"))),
            Some(t) => Err(EngineError::Conflict(format!(
                "task {id:?} is already {}",
                t.state
            ))),
        }
    }

    /// Runs a command on the locked task. A bug it hits (an invalid transition) parks the task
    /// `failed` and answers 500, never 409.
    async fn command<T>(
        &self,
        id: &str,
        f: impl AsyncFnOnce(&Self, &mut Locked) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let mut l = self.locked(id).await?;
        let r = f(self, &mut l).await;
        let r = match r {
            Err(EngineError::Transition(e)) => {
                let reason = format!("bug: {e}");
                let parked = dispatch::park(&self.inner, &mut l, &reason).await;
                l.release(&self.inner);
                parked?;
                return Err(EngineError::Internal(reason));
            }
            r => r,
        };
        l.release(&self.inner);
        r
    }

    /// Writes the task and the given runs durably, then takes the task's wheel entries off
    /// or puts them on according to its new state.
    async fn commit(
        &self,
        st: &mut LiveState,
        task: Task,
        runs: Vec<Run>,
        messages: Option<Vec<Message>>,
    ) -> Result<(), EngineError> {
        let mut batch = Batch::new();
        if let Some(m) = messages {
            batch.ops.push(Op::Messages {
                task_id: task.id.clone(),
                old_count: st.task.message_count,
                messages: m,
            });
            batch.task(&task);
        } else if crate::store::records::spec_of(&task) != crate::store::records::spec_of(&st.task)
        {
            batch.task(&task);
        } else {
            batch.progress(&task);
        }
        for r in &runs {
            batch.run(&task.id, r);
        }
        self.inner.store.write(&batch).await?;
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
        let view = self
            .command(id, async |this, l| {
                let st = l.st();
                let now = this.inner.clock.now_ms();
                let mut task = st.task.clone();
                task.set_state(TaskState::Cancelled, now)?;
                task.next_fire_at_ms = None;
                task.queued.clear();
                let mut runs = Self::disarmed(st);
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
                this.commit(st, task, runs, None).await?;
                for r in sending {
                    st.runs.insert(r.run, r);
                }
                tracing::info!(task = %id, "task cancelled");
                Ok(TaskView {
                    task: st.task.clone(),
                    run: view_run,
                })
            })
            .await?;
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
        self.command(id, async |this, l| {
            let st = l.st();
            if !matches!(st.task.state, TaskState::Pending | TaskState::Running) {
                return Err(EngineError::Conflict(format!(
                    "task {id:?} is {}; only pending or running tasks can be paused",
                    st.task.state
                )));
            }
            let now = this.inner.clock.now_ms();
            let mut task = st.task.clone();
            task.set_state(TaskState::Paused, now)?;
            let runs = Self::disarmed(st);
            this.commit(st, task, runs, None).await?;
            tracing::info!(task = %id, "task paused");
            Ok(this.view_of(st))
        })
        .await
    }

    /// Resumes a paused task: sequences continue at their cursor; fire times missed while
    /// paused are judged by the misfire policy.
    pub async fn resume(&self, id: &str) -> Result<TaskView, EngineError> {
        self.command(id, async |this, l| {
            let st = l.st();
            if st.task.state != TaskState::Paused {
                return Err(EngineError::Conflict(format!(
                    "task {id:?} is {}; only paused tasks can be resumed",
                    st.task.state
                )));
            }
            let now = this.inner.clock.now_ms();
            let mut task = st.task.clone();
            task.set_state(state_for(&task, !st.runs.is_empty()), now)?;
            // Fires due while paused were missed: the fire step judges them against this.
            task.watched_since_ms = now;
            let runs: Vec<Run> = st
                .runs
                .values()
                .map(|r| {
                    let mut r = r.clone();
                    r.next_at_ms = Some(r.next_at_ms.unwrap_or(now).max(now));
                    r
                })
                .collect();
            this.commit(st, task, runs, None).await?;
            tracing::info!(task = %id, state = %st.task.state, "task resumed");
            Ok(this.view_of(st))
        })
        .await
    }

    /// Starts a run now ("send now"). For a one-shot task this replaces its scheduled time.
    pub async fn trigger(&self, id: &str) -> Result<TaskView, EngineError> {
        self.command(id, async |this, l| {
            let st = l.st();
            match st.task.state {
                TaskState::Pending => {}
                TaskState::Running if st.task.overlap == crate::model::Overlap::Allow => {}
                s => {
                    return Err(EngineError::Conflict(format!(
                        "task {id:?} is {s}; trigger needs a pending task (or overlap allow)"
                    )))
                }
            }
            let now = this.inner.clock.now_ms();
            let mut task = st.task.clone();
            task.fires += 1;
            let run_no = task.fires;
            if task.schedule.is_one_shot() {
                task.last_fire_ms = Some(now);
            }
            let run = super::plan::start_run(&mut task, run_no, now, now);
            task.next_fire_at_ms = crate::schedule::next_fire(&task, now);
            task.set_state(TaskState::Running, now)?;
            tracing::info!(task = %id, run = run_no, "run triggered");
            this.commit(st, task, vec![run], None).await?;
            Ok(this.view_of(st))
        })
        .await
    }

    /// Changes a pending or paused task; its next fire is recomputed.
    pub async fn patch(&self, id: &str, req: PatchRequest) -> Result<TaskView, EngineError> {
        self.command(id, async |this, l| {
            let st = l.st();
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
            let inner = &this.inner;
            let channels = inner.channels.clone();
            let exists = move |c: &str| channels.contains(c);
            let now = inner.clock.now_ms();
            let new_schedule = req.schedule.is_some();
            let (mut task, messages) = req.apply(
                &st.task,
                &Context {
                    now_ms: now,
                    limits: &inner.config.limits,
                    channel_exists: &exists,
                },
            )?;
            if new_schedule {
                // Fires of the new schedule before now were never watched: missed.
                task.watched_since_ms = now;
            }
            let to = derive_state(&task, !st.runs.is_empty());
            task.set_state(to, now)?;
            this.commit(st, task, vec![], messages).await?;
            tracing::info!(task = %id, next_fire_at = %crate::schedule::format_opt(st.task.next_fire_at_ms), "task changed");
            Ok(this.view_of(st))
        })
        .await
    }

    fn view_of(&self, st: &LiveState) -> TaskView {
        let mut v = st.view();
        if v.run.is_none() {
            v.run = self.inner.store.last_run(&st.task.id).ok().flatten();
        }
        v
    }
}

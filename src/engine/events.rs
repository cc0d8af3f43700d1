//! Live events for `GET /v1/events` (the dashboard and `herald tasks watch`): task changes,
//! run progress and failure-list changes, on a `tokio::sync::broadcast` bus.
//!
//! Publishing never blocks and never fails: with nobody listening it returns at once without
//! building the event; a subscriber that falls more than [`CAPACITY`] events behind loses the
//! oldest ones and is told so (the API turns that into a `resync` event, after which a client
//! reloads what it shows). Events are hints about state that is already durable: a client can
//! always re-read the task, run or failure list through the API.
//!
//! The engine publishes from its one commit place (`commit.rs`), after each durable write:
//! every step of every task (fire, settle, control, recovery, retention) publishes there.
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::model::{Failure, Run, RunState, Task, TaskProgress, TaskSpec, TaskState};
use crate::schedule::format_utc;

/// Events a subscriber may fall behind by before it is told to resync.
pub const CAPACITY: usize = 4096;

/// One event: its SSE `event:` name, the task it is about, and its JSON `data:`.
#[derive(Clone, Debug)]
pub struct Event {
    pub kind: &'static str,
    pub task: String,
    pub data: Value,
}

/// The broadcast bus. Cloning shares it.
#[derive(Clone)]
pub struct Bus {
    tx: broadcast::Sender<Event>,
}

impl Default for Bus {
    fn default() -> Self {
        Bus::new()
    }
}

fn run_state(s: &RunState) -> &'static str {
    match s {
        RunState::Running => "running",
        RunState::Completed => "completed",
        RunState::Cancelled => "cancelled",
        RunState::Skipped => "skipped",
        RunState::Expired => "expired",
    }
}

fn instant(ms: Option<u64>) -> Value {
    ms.map(|m| json!(format_utc(m))).unwrap_or(Value::Null)
}

impl Bus {
    pub fn new() -> Bus {
        let (tx, _) = broadcast::channel(CAPACITY);
        Bus { tx }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    fn listening(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    fn send(&self, kind: &'static str, task: &str, data: Value) {
        // An error only means nobody is subscribed any more.
        let _ = self.tx.send(Event {
            kind,
            task: task.to_string(),
            data,
        });
    }

    /// `task`: a task's state, schedule or next fire changed.
    pub fn task(&self, spec: &TaskSpec, p: &TaskProgress) {
        self.task_head(
            &spec.id,
            &spec.channel,
            p.state,
            p.next_fire_at_ms,
            p.runs,
            p.updated_at_ms,
        );
    }

    /// `task`: a task was created (in its wire shape).
    pub fn created(&self, t: &Task) {
        self.task_head(
            &t.id,
            &t.channel,
            t.state,
            t.next_fire_at_ms,
            t.runs,
            t.updated_at_ms,
        );
    }

    fn task_head(
        &self,
        id: &str,
        channel: &str,
        state: TaskState,
        next_fire_at_ms: Option<u64>,
        runs: u32,
        updated_at_ms: u64,
    ) {
        if !self.listening() {
            return;
        }
        let data = json!({
            "id": id,
            "state": state.as_str(),
            "channel": channel,
            "next_fire_at": instant(next_fire_at_ms),
            "runs": runs,
            "updated_at": format_utc(updated_at_ms),
        });
        self.send("task", id, data);
    }

    /// `progress`: a run started, or its cursor moved (a message sent or given up on), or it
    /// finished. Carries the task's state too, so one event is enough to redraw a row.
    pub fn progress(&self, task_id: &str, task_state: TaskState, r: &Run) {
        if !self.listening() {
            return;
        }
        let data = json!({
            "task": task_id,
            "task_state": task_state.as_str(),
            "run": r.run,
            "state": run_state(&r.state),
            "total": r.total,
            "sent": r.sent,
            "failed": r.failed,
            "in_flight": u32::from(r.in_flight.is_some()),
            "started_at": format_utc(r.started_at_ms),
            "next_at": instant(r.next_at_ms),
        });
        self.send("progress", task_id, data);
    }

    /// `deleted`: a finished task was deleted (retention, or `DELETE /v1/tasks/{id}`) with
    /// everything of it.
    pub fn deleted(&self, task_id: &str) {
        if !self.listening() {
            return;
        }
        self.send("deleted", task_id, json!({ "id": task_id }));
    }

    /// `timeline`: events of a task's timeline, once durable (the same as `GET
    /// /v1/tasks/{id}/timeline` shows, with the task's id). The seqs are those the store gave
    /// (0 when the store writes no events: `[store] timeline_max = 0`).
    pub fn timeline(&self, task_id: &str, events: &[crate::model::timeline::TimelineEvent]) {
        if !self.listening() {
            return;
        }
        for e in events {
            let mut data = e.view();
            // `view` is always an object; the task's id is added to it.
            if let Some(fields) = data.as_object_mut() {
                fields.insert("task".to_owned(), json!(task_id));
            }
            self.send("timeline", task_id, data);
        }
    }

    /// `failure`: an entry of the failure list was `added`, `retrying`, `resolved` (a retry
    /// delivered it), `failed` again (a retry gave up) or `dismissed`.
    pub fn failure(&self, f: &Failure, action: &'static str) {
        if !self.listening() {
            return;
        }
        let data = json!({
            "id": f.id,
            "task": f.task_id,
            "run": f.run,
            "seq": f.seq,
            "action": action,
            "attempts": f.attempts,
            "last_error": f.last_error,
        });
        self.send("failure", &f.task_id, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure() -> Failure {
        Failure {
            id: "t:1:0".into(),
            task_id: "t".into(),
            run: 1,
            seq: 0,
            to: "a".into(),
            channel: "log".into(),
            attempts: 1,
            last_error: "boom".into(),
            failed_at_ms: 0,
            retrying: false,
            retries: 0,
        }
    }

    #[test]
    fn nobody_listening_costs_nothing_and_never_blocks() {
        let bus = Bus::new();
        for _ in 0..CAPACITY * 3 {
            bus.failure(&failure(), "added");
        }
    }

    #[test]
    fn subscribers_get_events_in_order_and_laggards_are_told() {
        let bus = Bus::new();
        let mut rx = bus.subscribe();
        bus.failure(&failure(), "added");
        bus.failure(&failure(), "dismissed");
        let a = rx.try_recv().unwrap();
        assert_eq!((a.kind, a.task.as_str()), ("failure", "t"));
        assert_eq!(a.data["action"], "added");
        assert_eq!(rx.try_recv().unwrap().data["action"], "dismissed");
        for _ in 0..CAPACITY + 10 {
            bus.failure(&failure(), "added");
        }
        match rx.try_recv() {
            Err(broadcast::error::TryRecvError::Lagged(n)) => assert_eq!(n, 10),
            other => panic!("expected a lag, got {other:?}"),
        }
    }
}

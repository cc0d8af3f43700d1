//! What one decision changes about one task, as plain data: `plan.rs` builds it (pure), and
//! `commit.rs` carries it out: one store write, then memory, the wheel, events and alerts, in
//! that order, in one place. Nothing else writes a task.

use std::sync::Arc;

use crate::model::{Failure, Message, Run, TaskProgress, TaskSpec, TimelineEvent};
use crate::schedule::misfire::Expiry;

/// The wheel moves a change asks for, besides the task's fire (which [`super::commit`] always
/// brings in line with the task's next fire). A closed set: the instants follow from the run
/// in memory after the change (`arm.rs`), so a plan never computes a wheel deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WheelOp {
    /// Run `n`'s next step: its send at its instant when it is armed, else its arm
    /// `ARM_LEAD_MS` ahead of it; off the wheel if the run is no longer active or the task
    /// is not running.
    Step(u32),
    /// [`WheelOp::Step`] at an instant a person named (the end of quiet hours), held to the
    /// wall clock alone (`Timer::at_wall`): a wall step in the night moves it with the wall,
    /// so 08:00 stays 08:00.
    StepAtWall(u32),
    /// [`WheelOp::Step`] for every active run of the task (a resume, a trigger, recovery).
    Steps,
    /// Every run of the task off the wheel (pause, cancel, park).
    DropSteps,
}

/// One task's change. `Change::default()` changes nothing.
#[derive(Clone, Debug, Default)]
pub(crate) struct Change {
    /// The task's progress after the step; `None`: unchanged.
    pub progress: Option<TaskProgress>,
    /// The task's new spec (a patch): its whole record is written, not only its progress.
    /// Comes with `progress`.
    pub spec: Option<Arc<TaskSpec>>,
    /// New messages (a patch that replaced them); comes with `spec`.
    pub messages: Option<Vec<Message>>,
    /// Run records to write. After the write a run in state `Running` that is not done stays
    /// in memory (active); any other leaves it, unless it is sending right now (its outcome is
    /// still settled when the send returns).
    pub runs: Vec<Run>,
    /// Delete the task's finished runs numbered below this (history bound, `[store] runs_max`).
    pub trim_runs_below: Option<u32>,
    /// A message given up on: listed in the failure list, alerted, published.
    pub failure: Option<Failure>,
    /// The zone of the message given up on (`Message::tz`, in recipient time): its
    /// notification names when it was due as its recipient reads it (`notify.rs`). Not written.
    pub failure_tz: Option<String>,
    /// When the message given up on was due: the instant its last attempt was planned for
    /// (the delivery's `scheduled_at`: the run's instant for its first message, the pacing's
    /// for a later one), so its notification names the message's own time, not the run's
    /// (`notify.rs`). Not written.
    pub failure_due_ms: Option<u64>,
    /// Why each expired run of `runs` expired, by run number: its notification says so in
    /// the task's language (`notify.rs`); the run's stored `reason` is this in English. Not
    /// written.
    pub expired_why: Vec<(u32, Expiry)>,
    /// The task was parked `failed` for this reason (a bug or a corrupt record): alerted.
    pub parked: Option<String>,
    pub wheel: Vec<WheelOp>,
    /// Timeline events of this step (issue 25), written in the same durable write.
    pub timeline: Vec<TimelineEvent>,
}

impl Change {
    /// The change writes nothing (memory, wheel and events may still follow it).
    pub fn writes_nothing(&self) -> bool {
        self.progress.is_none()
            && self.spec.is_none()
            && self.runs.is_empty()
            && self.trim_runs_below.is_none()
            && self.failure.is_none()
            && self.timeline.is_empty()
    }
}

//! Task states and the one table that says which transitions are allowed.
//!
//! Every state change in the engine goes through [`TaskState::transition`], so an impossible
//! move (e.g. `completed → running`) is an error at the point it is attempted, not a corrupt
//! record found later.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskState {
    Pending,
    Running,
    Paused,
    Completed,
    Cancelled,
    Failed,
    /// A one-shot or reminders task whose every fire expired without sending (misfire grace):
    /// finished like `completed`, but a new schedule (PATCH) or a trigger re-arms it.
    Expired,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("task state cannot go from {from} to {to}")]
pub struct InvalidTransition {
    pub from: TaskState,
    pub to: TaskState,
}

impl TaskState {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Running => "running",
            TaskState::Paused => "paused",
            TaskState::Completed => "completed",
            TaskState::Cancelled => "cancelled",
            TaskState::Failed => "failed",
            TaskState::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<TaskState> {
        Some(match s {
            "pending" => TaskState::Pending,
            "running" => TaskState::Running,
            "paused" => TaskState::Paused,
            "completed" => TaskState::Completed,
            "cancelled" => TaskState::Cancelled,
            "failed" => TaskState::Failed,
            "expired" => TaskState::Expired,
            _ => return None,
        })
    }

    /// Finished tasks send nothing more and leave their state only by an explicit re-arm
    /// (`expired` → `pending`/`running`, see [`TaskState::can_become`]); the others never.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Cancelled | TaskState::Failed | TaskState::Expired
        )
    }

    /// The transition table of DESIGN.md. `Pending → Completed` covers a task whose last
    /// fire was skipped (misfire) without starting a run; `→ Expired` a one-shot or reminders
    /// task whose every fire expired (from `running` when recovery expires a run armed before
    /// an outage whose first message never left). `Expired` is the one finished state that
    /// moves again: a new schedule re-arms it (`pending`), a trigger sends it now (`running`).
    pub fn can_become(self, to: TaskState) -> bool {
        use TaskState::*;
        matches!(
            (self, to),
            (Pending, Running)
                | (Pending, Paused)
                | (Pending, Cancelled)
                | (Pending, Completed)
                | (Running, Pending)
                | (Running, Completed)
                | (Running, Paused)
                | (Running, Cancelled)
                | (Running, Failed)
                | (Paused, Pending)
                | (Paused, Running)
                | (Paused, Cancelled)
                | (Pending, Expired)
                | (Running, Expired)
                | (Expired, Pending)
                | (Expired, Running)
        )
    }

    /// Parking: any unfinished task may be moved to `failed` when a bug or a corrupt record
    /// makes it impossible to go on. This is not a move of the table above (which a normal step
    /// follows) but the way out of one that went wrong, so it is its own function.
    pub fn park(self) -> Result<TaskState, InvalidTransition> {
        if self.is_terminal() {
            Err(InvalidTransition {
                from: self,
                to: TaskState::Failed,
            })
        } else {
            Ok(TaskState::Failed)
        }
    }

    /// Checks a move against the table; staying in the same state is always allowed.
    pub fn transition(self, to: TaskState) -> Result<TaskState, InvalidTransition> {
        if self == to || self.can_become(to) {
            Ok(to)
        } else {
            Err(InvalidTransition { from: self, to })
        }
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::TaskState::*;
    use super::*;

    const ALL: [TaskState; 7] = [
        Pending, Running, Paused, Completed, Cancelled, Failed, Expired,
    ];

    #[test]
    fn terminal_states_never_move_but_expired_is_re_armed() {
        for from in ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in ALL.into_iter().filter(|t| *t != from) {
                let re_arm = from == Expired && matches!(to, Pending | Running);
                assert_eq!(from.transition(to).is_ok(), re_arm, "{from} -> {to}");
            }
        }
        assert!(
            Expired.park().is_err(),
            "an expired task is finished: nothing to park"
        );
    }

    #[test]
    fn only_unfinished_tasks_expire() {
        for from in ALL {
            let ok = matches!(from, Pending | Running | Expired);
            assert_eq!(from.transition(Expired).is_ok(), ok, "{from}");
        }
    }

    #[test]
    fn cancel_is_reachable_from_every_live_state() {
        for from in [Pending, Running, Paused] {
            assert_eq!(from.transition(Cancelled), Ok(Cancelled));
        }
    }

    #[test]
    fn names_round_trip() {
        for s in ALL {
            assert_eq!(TaskState::parse(s.as_str()), Some(s));
        }
        assert_eq!(TaskState::parse("done"), None);
    }

    #[test]
    fn paused_cannot_complete_or_fail_directly() {
        assert!(Paused.transition(Completed).is_err());
        assert!(Paused.transition(Failed).is_err());
        assert!(Pending.transition(Failed).is_err());
    }
}

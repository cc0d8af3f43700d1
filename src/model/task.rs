//! The task: what a user created, resolved and validated (`TaskSpec`), plus what happened to
//! it so far (`TaskProgress`); the flat `Task` joins both for the API and exports.
//!
//! These are the model's types: they may change freely. What is on disk are the frozen types
//! of `store/records/` with explicit conversions (`records/convert.rs`), never these.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::state::TaskState;

/// One message of a sequence.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub to: String,
    pub body: String,
    /// Free JSON object for platform fields (e.g. a template id), as JSON text (so the frozen
    /// record holds a string). Available to channel templates as `data`.
    pub data: Option<String>,
    /// The recipient's IANA zone, for schedules in recipient time (`"tz": "recipient"`); the
    /// task's `default_tz` was filled in at validation. `None` in exports made before it.
    #[serde(default)]
    pub tz: Option<String>,
}

/// What to do with a local time that does not exist (spring forward).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DstGap {
    /// Fire at the first valid instant after the gap.
    #[default]
    Shift,
    /// Drop that fire.
    Skip,
}

/// What to do with a local time that occurs twice (fall back).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DstRepeat {
    #[default]
    First,
    Last,
    Both,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DstPolicy {
    pub gap: DstGap,
    pub repeat: DstRepeat,
}

/// The schedule as the user wrote it (kept for the view), next to its resolved instants.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Once, at an instant. `at` is the text as given; `tz` the zone it was read in, if any.
    At {
        at: String,
        tz: Option<String>,
        dst: DstPolicy,
        at_ms: u64,
    },
    /// Once, `after_ms` after creation (`after` is the text as given).
    After {
        after: String,
        after_ms: u64,
        at_ms: u64,
    },
    /// Every time the cron expression matches, in `tz` (IANA; `None` = UTC).
    Cron {
        cron: String,
        tz: Option<String>,
        dst: DstPolicy,
        start: Option<String>,
        start_ms: Option<u64>,
        end: Option<String>,
        end_ms: Option<u64>,
        max_runs: Option<u32>,
    },
    /// One run per offset before an event.
    Reminders {
        event_at: String,
        tz: Option<String>,
        dst: DstPolicy,
        event_ms: u64,
        /// The offsets as given, and in milliseconds (same order).
        before: Vec<String>,
        before_ms: Vec<u64>,
    },
}

impl Schedule {
    pub fn is_one_shot(&self) -> bool {
        matches!(self, Schedule::At { .. } | Schedule::After { .. })
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pacing {
    /// Minimum time between the starts of two consecutive sends of one run.
    pub interval_ms: u64,
    /// Messages per batch; after each full batch the run pauses `batch_pause_ms`.
    pub batch_size: Option<u32>,
    pub batch_pause_ms: u64,
}

impl Pacing {
    pub fn every(interval_ms: u64) -> Pacing {
        Pacing {
            interval_ms,
            ..Pacing::default()
        }
    }

    /// The gap before message `index` (0-based) of a run: the batch pause at a batch boundary
    /// (never shorter than the interval), the interval otherwise.
    pub fn gap_before(&self, index: u32) -> u64 {
        match self.batch_size {
            Some(b) if b > 0 && index > 0 && index.is_multiple_of(b) => {
                self.batch_pause_ms.max(self.interval_ms)
            }
            _ => self.interval_ms,
        }
    }

    /// The sum of [`Pacing::gap_before`] over the messages `from..to`, in closed form: a run's
    /// ETA is read in every view of it, and a loop over 10 000 messages per running task made
    /// a listing cost O(messages). Saturates instead of overflowing.
    pub fn gaps_between(&self, from: u32, to: u32) -> u64 {
        if to <= from {
            return 0;
        }
        let all = u64::from(to - from).saturating_mul(self.interval_ms);
        let boundaries = match self.batch_size {
            // Batch boundaries are the indices `i > 0` with `i % b == 0`: count those in
            // `max(from, 1)..to`.
            Some(b) if b > 0 => {
                let lo = from.max(1);
                if to <= lo {
                    0
                } else {
                    (to - 1) / b - (lo - 1) / b
                }
            }
            _ => 0,
        };
        let extra = self.batch_pause_ms.max(self.interval_ms) - self.interval_ms;
        all.saturating_add(u64::from(boundaries).saturating_mul(extra))
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backoff {
    Fixed,
    /// `initial * 2^(attempt-1)` capped at `max`, with full jitter.
    Exponential,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = never retry).
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub initial_ms: u64,
    pub max_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            backoff: Backoff::Fixed,
            initial_ms: 1_000,
            max_ms: 300_000,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Misfire {
    #[default]
    FireNow,
    Skip,
    FireAll,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Overlap {
    #[default]
    Skip,
    Queue,
    Allow,
}

pub const DEFAULT_MISFIRE_GRACE_MS: u64 = 10 * 60_000;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub id: String,
    pub name: Option<String>,
    pub channel: String,
    pub schedule: Schedule,
    /// How many messages the sequence has. The messages themselves are stored one record each
    /// (`store`, tree `messages`) and read when sent: a task in memory never holds them.
    pub message_count: u32,
    pub pacing: Pacing,
    /// The task's own retry policy; `None` means the channel's default.
    pub retry: Option<RetryPolicy>,
    pub misfire: Misfire,
    pub misfire_grace_ms: u64,
    pub overlap: Overlap,
    pub metadata: BTreeMap<String, String>,
    pub state: TaskState,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// When the schedule fires next; `None` when it never fires again.
    pub next_fire_at_ms: Option<u64>,
    /// Runs started so far.
    pub runs: u32,
    /// Fires handled so far: runs started plus fires skipped or expired. Every fire gets the
    /// next run number (1-based), so idempotency keys `{task}:{run}:{seq}` never repeat.
    pub fires: u32,
    /// Scheduled instant of the last fire handled (for cron: where the next search starts).
    pub last_fire_ms: Option<u64>,
    /// In recipient time, the wall time (ms as if UTC) of the cron slot of the last fire
    /// handled: the next slot is the first cron wall after it (two slots can share a run
    /// instant, `schedule/recipient.rs`). `None`: not known (a record or export made before
    /// it, any other schedule): the next slot is the first whose instant is after
    /// `last_fire_ms`. Defaulted in exports.
    #[serde(default)]
    pub last_slot_wall_ms: Option<u64>,
    /// Reminders: the offsets (ms) whose fire was handled; the others are still to come.
    pub done_offsets_ms: Vec<u64>,
    /// Fires waiting for the active run to finish (overlap `queue`, misfire `fire_all`),
    /// oldest first.
    pub queued: Vec<Queued>,
    /// Fires not sent: skipped (overlap, misfire `skip`, coalesced) and expired (missed by
    /// more than `misfire_grace`). Each also has a run record saying why.
    pub skipped: u32,
    pub expired: u32,
    /// Since when herald has been watching this task's schedule without interruption: set at
    /// creation, at every start-up and at every resume. A fire due before it was missed (herald
    /// down or the task paused); a fire due after it is never judged missed, however late herald
    /// handles it (its own backlog, a wall-clock jump).
    pub watched_since_ms: u64,
    /// Why the task is `failed` (a bug or a corrupt record parked it), if it is.
    pub failed_reason: Option<String>,
    /// The language of texts written for the task's people (descriptions when the request
    /// names none). Defaulted: exports made before it existed import as `en`.
    #[serde(default)]
    pub lang: super::Lang,
    /// A schedule in recipient time (`"tz": "recipient"`): the distinct zones of its messages,
    /// sorted; the run of a slot fires at the earliest of them. Empty otherwise.
    #[serde(default)]
    pub recipient_zones: Vec<String>,
    /// Quiet hours: the channel's (default), none (`"quiet_hours": null`), or the task's own.
    #[serde(default)]
    pub quiet_hours: QuietSetting,
    /// Whom to tell when a message lands in the failure list or a fire expires.
    #[serde(default)]
    pub notify: Option<Notify>,
    /// The W3C trace this task belongs to (issue 25): the caller's `traceparent` at create,
    /// or one herald started. `None` for tasks made before traces existed (their deliveries
    /// use [`crate::model::timeline::fallback_trace_id`]). Hex in exports.
    #[serde(default, with = "crate::model::timeline::hex_trace")]
    pub trace_id: Option<[u8; 16]>,
}

/// A fire waiting for the active run to finish (`Task::queued`). In exports `[run, at]`, or
/// `[run, at, wall]` when its slot's wall is known (an export made before walls has pairs).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(from = "QueuedWire", into = "QueuedWire")]
pub struct Queued {
    /// Its run number.
    pub run: u32,
    /// Its scheduled instant.
    pub at_ms: u64,
    /// In recipient time, its cron slot's wall time (see [`Task::last_slot_wall_ms`]).
    pub wall_ms: Option<u64>,
}

impl Queued {
    /// A queued fire of no known slot wall (read from its instant).
    pub fn at(run: u32, at_ms: u64) -> Queued {
        Queued {
            run,
            at_ms,
            wall_ms: None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy)]
#[serde(untagged)]
enum QueuedWire {
    Slot(u32, u64, u64),
    Plain(u32, u64),
}

impl From<QueuedWire> for Queued {
    fn from(w: QueuedWire) -> Queued {
        match w {
            QueuedWire::Slot(run, at_ms, wall) => Queued {
                run,
                at_ms,
                wall_ms: Some(wall),
            },
            QueuedWire::Plain(run, at_ms) => Queued::at(run, at_ms),
        }
    }
}

impl From<Queued> for QueuedWire {
    fn from(q: Queued) -> QueuedWire {
        match q.wall_ms {
            Some(w) => QueuedWire::Slot(q.run, q.at_ms, w),
            None => QueuedWire::Plain(q.run, q.at_ms),
        }
    }
}

/// A task's quiet hours (API.md "People's time"): a task's own window wins over its channel's.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub enum QuietSetting {
    /// The channel's `quiet_hours`, if it has any.
    #[default]
    Channel,
    /// None at all, whatever the channel says (`"quiet_hours": null`).
    Off,
    /// The task's own window.
    Own(super::quiet::QuietHours),
}

/// What a notification is about.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotifyOn {
    /// A message landed in the failure list.
    Failed,
    /// A fire expired (missed by more than `misfire_grace`).
    Expired,
}

impl NotifyOn {
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyOn::Failed => "failed",
            NotifyOn::Expired => "expired",
        }
    }
}

/// `notify`: one short message to `to` through `channel` when one of `on` happens.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Notify {
    pub channel: String,
    pub to: String,
    pub on: Vec<NotifyOn>,
}

/// What the user asked for: a task's half that only a create or a patch writes. In memory
/// the engine holds it as an `Arc<TaskSpec>`, shared by every step of the task and never
/// copied by one (DESIGN.md "The engine's shape (next)").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskSpec {
    pub id: String,
    pub name: Option<String>,
    pub channel: String,
    pub schedule: Schedule,
    pub message_count: u32,
    pub pacing: Pacing,
    pub retry: Option<RetryPolicy>,
    pub misfire: Misfire,
    pub misfire_grace_ms: u64,
    pub overlap: Overlap,
    pub metadata: BTreeMap<String, String>,
    pub created_at_ms: u64,
    pub lang: super::Lang,
    pub recipient_zones: Vec<String>,
    pub quiet_hours: QuietSetting,
    pub notify: Option<Notify>,
    pub trace_id: Option<[u8; 16]>,
}

/// What happened to a task so far: the small half the engine rewrites at every step (the
/// fields of [`Task`] of the same names say what each means).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskProgress {
    pub state: TaskState,
    pub updated_at_ms: u64,
    pub next_fire_at_ms: Option<u64>,
    pub runs: u32,
    pub fires: u32,
    pub last_fire_ms: Option<u64>,
    pub last_slot_wall_ms: Option<u64>,
    pub done_offsets_ms: Vec<u64>,
    pub queued: Vec<Queued>,
    pub skipped: u32,
    pub expired: u32,
    pub watched_since_ms: u64,
    pub failed_reason: Option<String>,
}

impl TaskSpec {
    /// The W3C trace this task belongs to (see [`Task::trace_id`]).
    pub fn trace(&self) -> [u8; 16] {
        self.trace_id
            .unwrap_or_else(|| super::timeline::fallback_trace_id(&self.id))
    }
}

impl TaskProgress {
    /// Moves to `to` if the transition table allows it.
    pub fn set_state(
        &mut self,
        to: TaskState,
        now_ms: u64,
    ) -> Result<(), super::state::InvalidTransition> {
        self.state = self.state.transition(to)?;
        self.updated_at_ms = now_ms;
        Ok(())
    }
}

impl Task {
    /// The wire/export shape of a spec and its progress (API views, export, the store's
    /// write of a whole task). Copies the spec: for the edges, never a step.
    pub fn join(s: &TaskSpec, p: &TaskProgress) -> Task {
        Task {
            id: s.id.clone(),
            name: s.name.clone(),
            channel: s.channel.clone(),
            schedule: s.schedule.clone(),
            message_count: s.message_count,
            pacing: s.pacing,
            retry: s.retry,
            misfire: s.misfire,
            misfire_grace_ms: s.misfire_grace_ms,
            overlap: s.overlap,
            metadata: s.metadata.clone(),
            state: p.state,
            created_at_ms: s.created_at_ms,
            updated_at_ms: p.updated_at_ms,
            next_fire_at_ms: p.next_fire_at_ms,
            runs: p.runs,
            fires: p.fires,
            last_fire_ms: p.last_fire_ms,
            last_slot_wall_ms: p.last_slot_wall_ms,
            done_offsets_ms: p.done_offsets_ms.clone(),
            queued: p.queued.clone(),
            skipped: p.skipped,
            expired: p.expired,
            watched_since_ms: p.watched_since_ms,
            failed_reason: p.failed_reason.clone(),
            lang: s.lang,
            recipient_zones: s.recipient_zones.clone(),
            quiet_hours: s.quiet_hours.clone(),
            notify: s.notify.clone(),
            trace_id: s.trace_id,
        }
    }

    /// The task as the engine holds it (moves every field, copies nothing).
    pub fn split(self) -> (TaskSpec, TaskProgress) {
        (
            TaskSpec {
                id: self.id,
                name: self.name,
                channel: self.channel,
                schedule: self.schedule,
                message_count: self.message_count,
                pacing: self.pacing,
                retry: self.retry,
                misfire: self.misfire,
                misfire_grace_ms: self.misfire_grace_ms,
                overlap: self.overlap,
                metadata: self.metadata,
                created_at_ms: self.created_at_ms,
                lang: self.lang,
                recipient_zones: self.recipient_zones,
                quiet_hours: self.quiet_hours,
                notify: self.notify,
                trace_id: self.trace_id,
            },
            TaskProgress {
                state: self.state,
                updated_at_ms: self.updated_at_ms,
                next_fire_at_ms: self.next_fire_at_ms,
                runs: self.runs,
                fires: self.fires,
                last_fire_ms: self.last_fire_ms,
                last_slot_wall_ms: self.last_slot_wall_ms,
                done_offsets_ms: self.done_offsets_ms,
                queued: self.queued,
                skipped: self.skipped,
                expired: self.expired,
                watched_since_ms: self.watched_since_ms,
                failed_reason: self.failed_reason,
            },
        )
    }

    /// Moves to `to` if the transition table allows it.
    pub fn set_state(
        &mut self,
        to: TaskState,
        now_ms: u64,
    ) -> Result<(), super::state::InvalidTransition> {
        self.state = self.state.transition(to)?;
        self.updated_at_ms = now_ms;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Pacing;
    use proptest::prelude::*;

    fn looped(p: &Pacing, from: u32, to: u32) -> u64 {
        (from..to)
            .map(|i| p.gap_before(i))
            .fold(0u64, |a, g| a.saturating_add(g))
    }

    #[test]
    fn batch_boundaries_count_once_each() {
        let p = Pacing {
            interval_ms: 10,
            batch_size: Some(3),
            batch_pause_ms: 100,
        };
        // 1..7: boundaries at 3 and 6.
        assert_eq!(p.gaps_between(1, 7), 4 * 10 + 2 * 100);
        assert_eq!(p.gaps_between(0, 1), 10, "index 0 is never a boundary");
        assert_eq!(p.gaps_between(5, 5), 0);
        assert_eq!(p.gaps_between(6, 2), 0);
    }

    proptest! {
        #[test]
        fn the_closed_form_is_the_loop(
            interval in 0u64..10_000,
            batch in proptest::option::of(0u32..50),
            pause in 0u64..100_000,
            from in 0u32..3_000,
            len in 0u32..3_000,
        ) {
            let p = Pacing { interval_ms: interval, batch_size: batch, batch_pause_ms: pause };
            let to = from + len;
            prop_assert_eq!(p.gaps_between(from, to), looped(&p, from, to));
        }
    }
}

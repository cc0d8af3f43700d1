//! Every conversion between the model and the frozen on-disk types, in one place: a task split
//! into its records and joined back ([`spec_of`], [`progress_of`], [`live_of`], [`join`]),
//! and each record family to and from its frozen type ([`Stored`]).
//!
//! This is where a model change meets the disk. A new model field gets its value for old
//! records here (its default, or one derived from what the record holds); a new model variant
//! makes a match here non-exhaustive, so it cannot reach the disk without a decision (a new
//! record version). Conversions to disk are infallible and exhaustive; from disk, every value
//! a frozen type can hold has a model value.

use std::borrow::Cow;

use super::progress::{LiveV1, ProgressV1, ProgressV2, ProgressV3, TaskStateV1};
use super::run::{FailureV1, IdemV1, RunStateV1, RunV1, RunV2};
use super::spec::{
    BackoffV1, DstGapV1, DstPolicyV1, DstRepeatV1, LangV1, MessageV1, MisfireV1, NotifyOnV1,
    NotifyV1, OverlapV1, PacingV1, QuietHoursV1, QuietSettingV1, RetryPolicyV1, ScheduleV1, SpecV1,
    SpecV2,
};
use super::{LiveEntry, ProgressRecord, SpecRecord};
use crate::model::{
    Backoff, DstGap, DstPolicy, DstRepeat, Failure, Lang, Message, Misfire, Notify, NotifyOn,
    Overlap, Pacing, Queued, QuietSetting, RetryPolicy, Run, RunState, Schedule, Task, TaskState,
};
use crate::schedule::quiet::QuietHours;
use crate::store::codec::{decode_body, encode_body, Stored};
use crate::store::legacy::{MessageV1 as MessageF1, TaskV1};
use crate::store::timeline::TimelineRecord;
use crate::store::IdemRecord;
use crate::store::StoreError;

// ---- a task split into its records, and joined back ----

pub fn spec_of(t: &Task) -> SpecRecord {
    SpecRecord {
        id: t.id.clone(),
        name: t.name.clone(),
        channel: t.channel.clone(),
        schedule: t.schedule.clone(),
        message_count: t.message_count,
        pacing: t.pacing,
        retry: t.retry,
        misfire: t.misfire,
        misfire_grace_ms: t.misfire_grace_ms,
        overlap: t.overlap,
        metadata: t.metadata.clone(),
        created_at_ms: t.created_at_ms,
        lang: t.lang,
        message: None,
        recipient_zones: t.recipient_zones.clone(),
        quiet_hours: t.quiet_hours.clone(),
        notify: t.notify.clone(),
        trace_id: t.trace_id,
        initial: None,
    }
}

pub fn progress_of(t: &Task) -> ProgressRecord {
    ProgressRecord {
        state: t.state,
        updated_at_ms: t.updated_at_ms,
        next_fire_at_ms: t.next_fire_at_ms,
        runs: t.runs,
        fires: t.fires,
        last_fire_ms: t.last_fire_ms,
        last_slot_wall_ms: t.last_slot_wall_ms,
        done_offsets_ms: t.done_offsets_ms.clone(),
        queued: t.queued.clone(),
        skipped: t.skipped,
        expired: t.expired,
        watched_since_ms: t.watched_since_ms,
        failed_reason: t.failed_reason.clone(),
        one_shot: t.schedule.is_one_shot(),
    }
}

pub fn live_of(t: &Task) -> LiveEntry {
    LiveEntry {
        state: t.state,
        next_fire_at_ms: t.next_fire_at_ms,
        one_shot: t.schedule.is_one_shot(),
    }
}

/// The progress record of the engine's in-memory progress (the same fields) of a task with
/// this spec.
pub fn progress_record(
    spec: &crate::model::TaskSpec,
    p: &crate::model::TaskProgress,
) -> ProgressRecord {
    ProgressRecord {
        state: p.state,
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
        one_shot: spec.schedule.is_one_shot(),
    }
}

pub fn join(s: SpecRecord, p: ProgressRecord) -> Task {
    Task {
        id: s.id,
        name: s.name,
        channel: s.channel,
        schedule: s.schedule,
        message_count: s.message_count,
        pacing: s.pacing,
        retry: s.retry,
        misfire: s.misfire,
        misfire_grace_ms: s.misfire_grace_ms,
        overlap: s.overlap,
        metadata: s.metadata,
        state: p.state,
        created_at_ms: s.created_at_ms,
        updated_at_ms: p.updated_at_ms,
        next_fire_at_ms: p.next_fire_at_ms,
        runs: p.runs,
        fires: p.fires,
        last_fire_ms: p.last_fire_ms,
        last_slot_wall_ms: p.last_slot_wall_ms,
        done_offsets_ms: p.done_offsets_ms,
        queued: p.queued,
        skipped: p.skipped,
        expired: p.expired,
        watched_since_ms: p.watched_since_ms,
        failed_reason: p.failed_reason,
        lang: s.lang,
        recipient_zones: s.recipient_zones,
        quiet_hours: s.quiet_hours,
        notify: s.notify,
        trace_id: s.trace_id,
    }
}

/// A format-1 task: the current task and its messages. `watched_since_ms` becomes the last
/// update (the best lower bound of when herald last watched the task); the fields added since
/// format 1 take their defaults.
pub fn upgrade_v1(t: TaskV1) -> (Task, Vec<Message>) {
    let messages: Vec<Message> = t.messages.into_iter().map(message_of_f1).collect();
    let task = Task {
        id: t.id,
        name: t.name,
        channel: t.channel,
        schedule: t.schedule.into(),
        message_count: messages.len() as u32,
        pacing: t.pacing.into(),
        retry: t.retry.map(Into::into),
        misfire: t.misfire.into(),
        misfire_grace_ms: t.misfire_grace_ms,
        overlap: t.overlap.into(),
        metadata: t.metadata,
        state: t.state.into(),
        created_at_ms: t.created_at_ms,
        updated_at_ms: t.updated_at_ms,
        next_fire_at_ms: t.next_fire_at_ms,
        runs: t.runs,
        fires: t.fires,
        last_fire_ms: t.last_fire_ms,
        last_slot_wall_ms: None,
        done_offsets_ms: t.done_offsets_ms,
        queued: queued_of(t.queued),
        skipped: t.skipped,
        expired: t.expired,
        watched_since_ms: t.updated_at_ms,
        failed_reason: None,
        lang: Lang::default(),
        recipient_zones: Vec::new(),
        quiet_hours: QuietSetting::default(),
        notify: None,
        trace_id: None,
    };
    (task, messages)
}

fn message_of_f1(m: MessageF1) -> Message {
    Message {
        to: m.to,
        body: m.body,
        data: None,
        tz: None,
    }
}

// ---- the record families and their frozen types ----

impl Stored for SpecRecord {
    type Disk = SpecV2;
    const VERSION: u8 = 2;
    fn to_disk(&self) -> Cow<'_, SpecV2> {
        Cow::Owned(SpecV2 {
            name: self.name.clone(),
            channel: self.channel.clone(),
            schedule: (&self.schedule).into(),
            message_count: self.message_count,
            pacing: self.pacing.into(),
            retry: self.retry.map(Into::into),
            misfire: self.misfire.into(),
            misfire_grace_ms: self.misfire_grace_ms,
            overlap: self.overlap.into(),
            metadata: self.metadata.clone(),
            created_at_ms: self.created_at_ms,
            lang: self.lang.into(),
            message: self.message.as_ref().map(Into::into),
            recipient_zones: self.recipient_zones.clone(),
            quiet_hours: (&self.quiet_hours).into(),
            notify: self.notify.as_ref().map(Into::into),
            trace_id: self.trace_id,
            initial: self.initial.as_ref().map(|l| l.to_disk().into_owned()),
        })
    }
    fn from_disk(d: SpecV2) -> SpecRecord {
        SpecRecord {
            // Given by `with_key`: the key is the id.
            id: String::new(),
            name: d.name,
            channel: d.channel,
            schedule: d.schedule.into(),
            message_count: d.message_count,
            pacing: d.pacing.into(),
            retry: d.retry.map(Into::into),
            misfire: d.misfire.into(),
            misfire_grace_ms: d.misfire_grace_ms,
            overlap: d.overlap.into(),
            metadata: d.metadata,
            created_at_ms: d.created_at_ms,
            lang: d.lang.into(),
            message: d.message.map(Into::into),
            recipient_zones: d.recipient_zones,
            quiet_hours: d.quiet_hours.into(),
            notify: d.notify.map(Into::into),
            trace_id: d.trace_id,
            initial: d.initial.map(LiveEntry::from_disk),
        }
    }
    /// Version 1 (formats 4 to 6): its own id inside, no initial live entry (format 6 kept it
    /// in the `live` tree, which the migration to format 7 empties).
    fn from_older(version: u8, body: &[u8]) -> Option<Result<SpecRecord, String>> {
        (version == 1).then(|| decode_body::<SpecV1>(body).map(spec_v1))
    }
    fn with_key(mut self, key: &[u8]) -> SpecRecord {
        if self.id.is_empty() {
            self.id = String::from_utf8_lossy(key).into_owned();
        }
        self
    }
}

fn spec_v1(d: SpecV1) -> SpecRecord {
    SpecRecord {
        id: d.id,
        name: d.name,
        channel: d.channel,
        schedule: d.schedule.into(),
        message_count: d.message_count,
        pacing: d.pacing.into(),
        retry: d.retry.map(Into::into),
        misfire: d.misfire.into(),
        misfire_grace_ms: d.misfire_grace_ms,
        overlap: d.overlap.into(),
        metadata: d.metadata,
        created_at_ms: d.created_at_ms,
        lang: d.lang.into(),
        message: d.message.map(Into::into),
        recipient_zones: d.recipient_zones,
        quiet_hours: d.quiet_hours.into(),
        notify: d.notify.map(Into::into),
        trace_id: d.trace_id,
        initial: None,
    }
}

/// Queued fires of a record without their slots' walls (before progress version 3).
fn queued_of(pairs: Vec<(u32, u64)>) -> Vec<Queued> {
    pairs.into_iter().map(|(n, at)| Queued::at(n, at)).collect()
}

impl ProgressRecord {
    /// Whether version 2 holds all of it: no slot wall is known (see [`ProgressV3`]).
    fn without_walls(&self) -> bool {
        self.last_slot_wall_ms.is_none() && self.queued.iter().all(|q| q.wall_ms.is_none())
    }
}

impl Stored for ProgressRecord {
    type Disk = ProgressV3;
    const VERSION: u8 = 3;
    fn to_disk(&self) -> Cow<'_, ProgressV3> {
        Cow::Owned(ProgressV3 {
            state: self.state.into(),
            updated_at_ms: self.updated_at_ms,
            next_fire_at_ms: self.next_fire_at_ms,
            runs: self.runs,
            fires: self.fires,
            last_fire_ms: self.last_fire_ms,
            done_offsets_ms: self.done_offsets_ms.clone(),
            queued: self
                .queued
                .iter()
                .map(|q| (q.run, q.at_ms, q.wall_ms))
                .collect(),
            skipped: self.skipped,
            expired: self.expired,
            watched_since_ms: self.watched_since_ms,
            failed_reason: self.failed_reason.clone(),
            one_shot: self.one_shot,
            last_slot_wall_ms: self.last_slot_wall_ms,
        })
    }
    fn from_disk(d: ProgressV3) -> ProgressRecord {
        ProgressRecord {
            state: d.state.into(),
            updated_at_ms: d.updated_at_ms,
            next_fire_at_ms: d.next_fire_at_ms,
            runs: d.runs,
            fires: d.fires,
            last_fire_ms: d.last_fire_ms,
            last_slot_wall_ms: d.last_slot_wall_ms,
            done_offsets_ms: d.done_offsets_ms,
            queued: d
                .queued
                .into_iter()
                .map(|(run, at_ms, wall_ms)| Queued {
                    run,
                    at_ms,
                    wall_ms,
                })
                .collect(),
            skipped: d.skipped,
            expired: d.expired,
            watched_since_ms: d.watched_since_ms,
            failed_reason: d.failed_reason,
            one_shot: d.one_shot,
        }
    }
    /// Version 2 when no slot wall is known: the bytes of every task not in recipient time
    /// (and of one in recipient time that knows none: an `at`, a cron with no fire recorded
    /// with its wall yet) stay those older builds read. Any known wall forces version 3, even
    /// one its instant would give back (that is not checked).
    fn encode_older(&self, out: &mut Vec<u8>) -> Option<Result<(), StoreError>> {
        self.without_walls().then(|| {
            let v2 = ProgressV2 {
                state: self.state.into(),
                updated_at_ms: self.updated_at_ms,
                next_fire_at_ms: self.next_fire_at_ms,
                runs: self.runs,
                fires: self.fires,
                last_fire_ms: self.last_fire_ms,
                done_offsets_ms: self.done_offsets_ms.clone(),
                queued: self.queued.iter().map(|q| (q.run, q.at_ms)).collect(),
                skipped: self.skipped,
                expired: self.expired,
                watched_since_ms: self.watched_since_ms,
                failed_reason: self.failed_reason.clone(),
                one_shot: self.one_shot,
            };
            encode_body(2, &v2, out)
        })
    }
    /// Version 2 (format 7): no slot walls (derived from the instants, as before). Version 1
    /// (formats 4 to 6): nor `one_shot` (false; see [`ProgressRecord::one_shot`]).
    fn from_older(version: u8, body: &[u8]) -> Option<Result<ProgressRecord, String>> {
        match version {
            2 => Some(decode_body::<ProgressV2>(body).map(|d| ProgressRecord {
                state: d.state.into(),
                updated_at_ms: d.updated_at_ms,
                next_fire_at_ms: d.next_fire_at_ms,
                runs: d.runs,
                fires: d.fires,
                last_fire_ms: d.last_fire_ms,
                last_slot_wall_ms: None,
                done_offsets_ms: d.done_offsets_ms,
                queued: queued_of(d.queued),
                skipped: d.skipped,
                expired: d.expired,
                watched_since_ms: d.watched_since_ms,
                failed_reason: d.failed_reason,
                one_shot: d.one_shot,
            })),
            1 => Some(decode_body::<ProgressV1>(body).map(|d| ProgressRecord {
                state: d.state.into(),
                updated_at_ms: d.updated_at_ms,
                next_fire_at_ms: d.next_fire_at_ms,
                runs: d.runs,
                fires: d.fires,
                last_fire_ms: d.last_fire_ms,
                last_slot_wall_ms: None,
                done_offsets_ms: d.done_offsets_ms,
                queued: queued_of(d.queued),
                skipped: d.skipped,
                expired: d.expired,
                watched_since_ms: d.watched_since_ms,
                failed_reason: d.failed_reason,
                one_shot: false,
            })),
            _ => None,
        }
    }
}

impl Stored for LiveEntry {
    type Disk = LiveV1;
    fn to_disk(&self) -> Cow<'_, LiveV1> {
        Cow::Owned(LiveV1 {
            state: self.state.into(),
            next_fire_at_ms: self.next_fire_at_ms,
            one_shot: self.one_shot,
        })
    }
    fn from_disk(d: LiveV1) -> LiveEntry {
        LiveEntry {
            state: d.state.into(),
            next_fire_at_ms: d.next_fire_at_ms,
            one_shot: d.one_shot,
        }
    }
}

impl Stored for Message {
    type Disk = MessageV1;
    fn to_disk(&self) -> Cow<'_, MessageV1> {
        Cow::Owned(self.into())
    }
    fn from_disk(d: MessageV1) -> Message {
        d.into()
    }
}

impl Stored for Run {
    type Disk = RunV2;
    const VERSION: u8 = 2;
    fn to_disk(&self) -> Cow<'_, RunV2> {
        Cow::Owned(RunV2 {
            run: self.run,
            scheduled_at_ms: self.scheduled_at_ms,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
            state: (&self.state).into(),
            total: self.total,
            cursor: self.cursor,
            in_flight: self.in_flight,
            attempts: self.attempts,
            sent: self.sent,
            failed: self.failed,
            next_at_ms: self.next_at_ms,
            last_attempt_at_ms: self.last_attempt_at_ms,
            reason: self.reason.clone(),
            slot_wall_ms: self.slot_wall_ms,
        })
    }
    fn from_disk(d: RunV2) -> Run {
        Run {
            slot_wall_ms: d.slot_wall_ms,
            ..run_of_v1(RunV1 {
                run: d.run,
                scheduled_at_ms: d.scheduled_at_ms,
                started_at_ms: d.started_at_ms,
                finished_at_ms: d.finished_at_ms,
                state: d.state,
                total: d.total,
                cursor: d.cursor,
                in_flight: d.in_flight,
                attempts: d.attempts,
                sent: d.sent,
                failed: d.failed,
                next_at_ms: d.next_at_ms,
                last_attempt_at_ms: d.last_attempt_at_ms,
                reason: d.reason,
            })
        }
    }
    /// Version 1 for a run without a slot wall (every run not of a recipient-time cron slot):
    /// the bytes older builds read.
    fn encode_older(&self, out: &mut Vec<u8>) -> Option<Result<(), StoreError>> {
        self.slot_wall_ms.is_none().then(|| {
            let v1 = RunV1 {
                run: self.run,
                scheduled_at_ms: self.scheduled_at_ms,
                started_at_ms: self.started_at_ms,
                finished_at_ms: self.finished_at_ms,
                state: (&self.state).into(),
                total: self.total,
                cursor: self.cursor,
                in_flight: self.in_flight,
                attempts: self.attempts,
                sent: self.sent,
                failed: self.failed,
                next_at_ms: self.next_at_ms,
                last_attempt_at_ms: self.last_attempt_at_ms,
                reason: self.reason.clone(),
            };
            encode_body(1, &v1, out)
        })
    }
    /// Version 1 (formats 1 to 7): no slot wall (derived from the instant, as before).
    fn from_older(version: u8, body: &[u8]) -> Option<Result<Run, String>> {
        (version == 1).then(|| decode_body::<RunV1>(body).map(run_of_v1))
    }
}

fn run_of_v1(d: RunV1) -> Run {
    Run {
        run: d.run,
        scheduled_at_ms: d.scheduled_at_ms,
        started_at_ms: d.started_at_ms,
        finished_at_ms: d.finished_at_ms,
        state: d.state.into(),
        total: d.total,
        cursor: d.cursor,
        in_flight: d.in_flight,
        attempts: d.attempts,
        sent: d.sent,
        failed: d.failed,
        next_at_ms: d.next_at_ms,
        last_attempt_at_ms: d.last_attempt_at_ms,
        reason: d.reason,
        slot_wall_ms: None,
    }
}

impl Stored for Failure {
    type Disk = FailureV1;
    fn to_disk(&self) -> Cow<'_, FailureV1> {
        Cow::Owned(FailureV1 {
            id: self.id.clone(),
            task_id: self.task_id.clone(),
            run: self.run,
            seq: self.seq,
            to: self.to.clone(),
            channel: self.channel.clone(),
            attempts: self.attempts,
            last_error: self.last_error.clone(),
            failed_at_ms: self.failed_at_ms,
            retrying: self.retrying,
            retries: self.retries,
        })
    }
    fn from_disk(d: FailureV1) -> Failure {
        Failure {
            id: d.id,
            task_id: d.task_id,
            run: d.run,
            seq: d.seq,
            to: d.to,
            channel: d.channel,
            attempts: d.attempts,
            last_error: d.last_error,
            failed_at_ms: d.failed_at_ms,
            retrying: d.retrying,
            retries: d.retries,
        }
    }
}

impl Stored for IdemRecord {
    type Disk = IdemV1;
    fn to_disk(&self) -> Cow<'_, IdemV1> {
        Cow::Owned(IdemV1 {
            task_id: self.task_id.clone(),
            body_sha256: self.body_sha256,
        })
    }
    fn from_disk(d: IdemV1) -> IdemRecord {
        IdemRecord {
            task_id: d.task_id,
            body_sha256: d.body_sha256,
        }
    }
}

/// Types that are frozen themselves: their bytes are their own.
macro_rules! frozen_is_its_own_disk {
    ($($t:ty),*) => {$(
        impl Stored for $t {
            type Disk = $t;
            fn to_disk(&self) -> Cow<'_, $t> {
                Cow::Borrowed(self)
            }
            fn from_disk(d: $t) -> $t {
                d
            }
        }
    )*};
}
frozen_is_its_own_disk!(TimelineRecord, TaskV1);

// ---- the values inside the records ----

impl From<&Message> for MessageV1 {
    fn from(m: &Message) -> MessageV1 {
        MessageV1 {
            to: m.to.clone(),
            body: m.body.clone(),
            data: m.data.clone(),
            tz: m.tz.clone(),
        }
    }
}

impl From<MessageV1> for Message {
    fn from(m: MessageV1) -> Message {
        Message {
            to: m.to,
            body: m.body,
            data: m.data,
            tz: m.tz,
        }
    }
}

impl From<DstPolicy> for DstPolicyV1 {
    fn from(d: DstPolicy) -> DstPolicyV1 {
        DstPolicyV1 {
            gap: match d.gap {
                DstGap::Shift => DstGapV1::Shift,
                DstGap::Skip => DstGapV1::Skip,
            },
            repeat: match d.repeat {
                DstRepeat::First => DstRepeatV1::First,
                DstRepeat::Last => DstRepeatV1::Last,
                DstRepeat::Both => DstRepeatV1::Both,
            },
        }
    }
}

impl From<DstPolicyV1> for DstPolicy {
    fn from(d: DstPolicyV1) -> DstPolicy {
        DstPolicy {
            gap: match d.gap {
                DstGapV1::Shift => DstGap::Shift,
                DstGapV1::Skip => DstGap::Skip,
            },
            repeat: match d.repeat {
                DstRepeatV1::First => DstRepeat::First,
                DstRepeatV1::Last => DstRepeat::Last,
                DstRepeatV1::Both => DstRepeat::Both,
            },
        }
    }
}

impl From<&Schedule> for ScheduleV1 {
    fn from(s: &Schedule) -> ScheduleV1 {
        match s.clone() {
            Schedule::At { at, tz, dst, at_ms } => ScheduleV1::At {
                at,
                tz,
                dst: dst.into(),
                at_ms,
            },
            Schedule::After {
                after,
                after_ms,
                at_ms,
            } => ScheduleV1::After {
                after,
                after_ms,
                at_ms,
            },
            Schedule::Cron {
                cron,
                tz,
                dst,
                start,
                start_ms,
                end,
                end_ms,
                max_runs,
            } => ScheduleV1::Cron {
                cron,
                tz,
                dst: dst.into(),
                start,
                start_ms,
                end,
                end_ms,
                max_runs,
            },
            Schedule::Reminders {
                event_at,
                tz,
                dst,
                event_ms,
                before,
                before_ms,
            } => ScheduleV1::Reminders {
                event_at,
                tz,
                dst: dst.into(),
                event_ms,
                before,
                before_ms,
            },
        }
    }
}

impl From<ScheduleV1> for Schedule {
    fn from(s: ScheduleV1) -> Schedule {
        match s {
            ScheduleV1::At { at, tz, dst, at_ms } => Schedule::At {
                at,
                tz,
                dst: dst.into(),
                at_ms,
            },
            ScheduleV1::After {
                after,
                after_ms,
                at_ms,
            } => Schedule::After {
                after,
                after_ms,
                at_ms,
            },
            ScheduleV1::Cron {
                cron,
                tz,
                dst,
                start,
                start_ms,
                end,
                end_ms,
                max_runs,
            } => Schedule::Cron {
                cron,
                tz,
                dst: dst.into(),
                start,
                start_ms,
                end,
                end_ms,
                max_runs,
            },
            ScheduleV1::Reminders {
                event_at,
                tz,
                dst,
                event_ms,
                before,
                before_ms,
            } => Schedule::Reminders {
                event_at,
                tz,
                dst: dst.into(),
                event_ms,
                before,
                before_ms,
            },
        }
    }
}

impl From<Pacing> for PacingV1 {
    fn from(p: Pacing) -> PacingV1 {
        PacingV1 {
            interval_ms: p.interval_ms,
            batch_size: p.batch_size,
            batch_pause_ms: p.batch_pause_ms,
        }
    }
}

impl From<PacingV1> for Pacing {
    fn from(p: PacingV1) -> Pacing {
        Pacing {
            interval_ms: p.interval_ms,
            batch_size: p.batch_size,
            batch_pause_ms: p.batch_pause_ms,
        }
    }
}

impl From<RetryPolicy> for RetryPolicyV1 {
    fn from(r: RetryPolicy) -> RetryPolicyV1 {
        RetryPolicyV1 {
            max_attempts: r.max_attempts,
            backoff: match r.backoff {
                Backoff::Fixed => BackoffV1::Fixed,
                Backoff::Exponential => BackoffV1::Exponential,
            },
            initial_ms: r.initial_ms,
            max_ms: r.max_ms,
        }
    }
}

impl From<RetryPolicyV1> for RetryPolicy {
    fn from(r: RetryPolicyV1) -> RetryPolicy {
        RetryPolicy {
            max_attempts: r.max_attempts,
            backoff: match r.backoff {
                BackoffV1::Fixed => Backoff::Fixed,
                BackoffV1::Exponential => Backoff::Exponential,
            },
            initial_ms: r.initial_ms,
            max_ms: r.max_ms,
        }
    }
}

impl From<Misfire> for MisfireV1 {
    fn from(m: Misfire) -> MisfireV1 {
        match m {
            Misfire::FireNow => MisfireV1::FireNow,
            Misfire::Skip => MisfireV1::Skip,
            Misfire::FireAll => MisfireV1::FireAll,
        }
    }
}

impl From<MisfireV1> for Misfire {
    fn from(m: MisfireV1) -> Misfire {
        match m {
            MisfireV1::FireNow => Misfire::FireNow,
            MisfireV1::Skip => Misfire::Skip,
            MisfireV1::FireAll => Misfire::FireAll,
        }
    }
}

impl From<Overlap> for OverlapV1 {
    fn from(o: Overlap) -> OverlapV1 {
        match o {
            Overlap::Skip => OverlapV1::Skip,
            Overlap::Queue => OverlapV1::Queue,
            Overlap::Allow => OverlapV1::Allow,
        }
    }
}

impl From<OverlapV1> for Overlap {
    fn from(o: OverlapV1) -> Overlap {
        match o {
            OverlapV1::Skip => Overlap::Skip,
            OverlapV1::Queue => Overlap::Queue,
            OverlapV1::Allow => Overlap::Allow,
        }
    }
}

impl From<Lang> for LangV1 {
    fn from(l: Lang) -> LangV1 {
        match l {
            Lang::En => LangV1::En,
            Lang::Zh => LangV1::Zh,
        }
    }
}

impl From<LangV1> for Lang {
    fn from(l: LangV1) -> Lang {
        match l {
            LangV1::En => Lang::En,
            LangV1::Zh => Lang::Zh,
        }
    }
}

impl From<&QuietSetting> for QuietSettingV1 {
    fn from(q: &QuietSetting) -> QuietSettingV1 {
        match q {
            QuietSetting::Channel => QuietSettingV1::Channel,
            QuietSetting::Off => QuietSettingV1::Off,
            QuietSetting::Own(h) => QuietSettingV1::Own(QuietHoursV1 {
                from_min: h.from_min,
                to_min: h.to_min,
                tz: h.tz.clone(),
            }),
        }
    }
}

impl From<QuietSettingV1> for QuietSetting {
    fn from(q: QuietSettingV1) -> QuietSetting {
        match q {
            QuietSettingV1::Channel => QuietSetting::Channel,
            QuietSettingV1::Off => QuietSetting::Off,
            QuietSettingV1::Own(h) => QuietSetting::Own(QuietHours {
                from_min: h.from_min,
                to_min: h.to_min,
                tz: h.tz,
            }),
        }
    }
}

impl From<NotifyOn> for NotifyOnV1 {
    fn from(n: NotifyOn) -> NotifyOnV1 {
        match n {
            NotifyOn::Failed => NotifyOnV1::Failed,
            NotifyOn::Expired => NotifyOnV1::Expired,
        }
    }
}

impl From<NotifyOnV1> for NotifyOn {
    fn from(n: NotifyOnV1) -> NotifyOn {
        match n {
            NotifyOnV1::Failed => NotifyOn::Failed,
            NotifyOnV1::Expired => NotifyOn::Expired,
        }
    }
}

impl From<&Notify> for NotifyV1 {
    fn from(n: &Notify) -> NotifyV1 {
        NotifyV1 {
            channel: n.channel.clone(),
            to: n.to.clone(),
            on: n.on.iter().map(|&o| o.into()).collect(),
        }
    }
}

impl From<NotifyV1> for Notify {
    fn from(n: NotifyV1) -> Notify {
        Notify {
            channel: n.channel,
            to: n.to,
            on: n.on.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<TaskState> for TaskStateV1 {
    fn from(s: TaskState) -> TaskStateV1 {
        match s {
            TaskState::Pending => TaskStateV1::Pending,
            TaskState::Running => TaskStateV1::Running,
            TaskState::Paused => TaskStateV1::Paused,
            TaskState::Completed => TaskStateV1::Completed,
            TaskState::Cancelled => TaskStateV1::Cancelled,
            TaskState::Failed => TaskStateV1::Failed,
            TaskState::Expired => TaskStateV1::Expired,
        }
    }
}

impl From<TaskStateV1> for TaskState {
    fn from(s: TaskStateV1) -> TaskState {
        match s {
            TaskStateV1::Pending => TaskState::Pending,
            TaskStateV1::Running => TaskState::Running,
            TaskStateV1::Paused => TaskState::Paused,
            TaskStateV1::Completed => TaskState::Completed,
            TaskStateV1::Cancelled => TaskState::Cancelled,
            TaskStateV1::Failed => TaskState::Failed,
            TaskStateV1::Expired => TaskState::Expired,
        }
    }
}

impl From<&RunState> for RunStateV1 {
    fn from(s: &RunState) -> RunStateV1 {
        match s {
            RunState::Running => RunStateV1::Running,
            RunState::Completed => RunStateV1::Completed,
            RunState::Cancelled => RunStateV1::Cancelled,
            RunState::Skipped => RunStateV1::Skipped,
            RunState::Expired => RunStateV1::Expired,
        }
    }
}

impl From<RunStateV1> for RunState {
    fn from(s: RunStateV1) -> RunState {
        match s {
            RunStateV1::Running => RunState::Running,
            RunStateV1::Completed => RunState::Completed,
            RunStateV1::Cancelled => RunState::Cancelled,
            RunStateV1::Skipped => RunState::Skipped,
            RunStateV1::Expired => RunState::Expired,
        }
    }
}

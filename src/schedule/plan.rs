//! When a task's schedule fires next, given what has fired already. Pure.

use crate::model::{Schedule, Task, TaskProgress, TaskSpec};

use super::cron::CronSchedule;
use super::parse_tz;

/// Parses a stored cron schedule (validated at creation, so errors here mean the stored record
/// is from an incompatible version; the caller treats that as "never fires again").
pub fn cron_of(schedule: &Schedule) -> Option<CronSchedule> {
    match schedule {
        Schedule::Cron { cron, tz, dst, .. } => {
            let zone = match tz {
                Some(name) => parse_tz(name).ok()?,
                None => chrono_tz::UTC,
            };
            CronSchedule::parse(cron, zone, *dst).ok()
        }
        _ => None,
    }
}

/// What the next fire depends on, borrowed from a [`Task`] (a create, a preview) or from a
/// spec and its progress (the engine), so neither is copied to ask.
struct Fired<'a> {
    schedule: &'a Schedule,
    recipient_zones: &'a [String],
    last_fire_ms: Option<u64>,
    last_slot_wall_ms: Option<u64>,
    done_offsets_ms: &'a [u64],
    /// [`runs_committed`].
    committed: u32,
}

/// The next fire of `task`'s schedule that has not been handled yet. `from_ms` is where a cron
/// schedule that has never fired starts looking (creation time, or now after an edit).
/// May be in the past (a reminder created late, a fire missed while down): the engine judges
/// such fires with the misfire policy.
pub fn next_fire(task: &Task, from_ms: u64) -> Option<u64> {
    next_fire_in(&fired(task), from_ms).map(|(at, _)| at)
}

fn fired(task: &Task) -> Fired<'_> {
    Fired {
        schedule: &task.schedule,
        recipient_zones: &task.recipient_zones,
        last_fire_ms: task.last_fire_ms,
        last_slot_wall_ms: task.last_slot_wall_ms,
        done_offsets_ms: &task.done_offsets_ms,
        committed: task.runs.saturating_add(task.queued.len() as u32),
    }
}

/// [`next_fire`] of a spec and its progress.
pub fn next_fire_of(spec: &TaskSpec, p: &TaskProgress, from_ms: u64) -> Option<u64> {
    next_fire_in(&fired_of(spec, p), from_ms).map(|(at, _)| at)
}

/// [`next_fire_of`] and, for a cron in recipient time, the wall time of the slot it is the
/// run of (`schedule/recipient.rs`; `None` for any other schedule): an outage's latest fire
/// is found by its instant, and its slot from that one's (`engine/plan.rs::latest_missed`).
pub fn next_slot_of(spec: &TaskSpec, p: &TaskProgress, from_ms: u64) -> Option<(u64, Option<u64>)> {
    next_fire_in(&fired_of(spec, p), from_ms)
}

/// For a cron in recipient time, the last slot sharing the run instant of the slot at `wall`
/// ([`super::recipient::last_slot_sharing`]); `None` for any other schedule.
pub fn last_slot_sharing_of(spec: &TaskSpec, wall: u64) -> Option<u64> {
    use super::recipient::{is_recipient, last_slot_sharing, parse_zones, wall_cron};
    let Schedule::Cron { tz, dst, .. } = &spec.schedule else {
        return None;
    };
    if !is_recipient(tz.as_deref()) {
        return None;
    }
    let zones = parse_zones(&spec.recipient_zones);
    last_slot_sharing(&wall_cron(&spec.schedule)?, &zones, *dst, wall)
}

fn fired_of<'a>(spec: &'a TaskSpec, p: &'a TaskProgress) -> Fired<'a> {
    Fired {
        schedule: &spec.schedule,
        recipient_zones: &spec.recipient_zones,
        last_fire_ms: p.last_fire_ms,
        last_slot_wall_ms: p.last_slot_wall_ms,
        done_offsets_ms: &p.done_offsets_ms,
        committed: runs_committed(p),
    }
}

/// The next fire, and its slot's wall for a cron in recipient time (`None` for any other).
fn next_fire_in(task: &Fired<'_>, from_ms: u64) -> Option<(u64, Option<u64>)> {
    match task.schedule {
        Schedule::At { at_ms, .. } | Schedule::After { at_ms, .. } => {
            task.last_fire_ms.is_none().then_some((*at_ms, None))
        }
        Schedule::Cron {
            start_ms,
            end_ms,
            max_runs,
            ..
        } => {
            if max_runs.is_some_and(|m| task.committed >= m) {
                return None;
            }
            if let Schedule::Cron { tz, dst, .. } = task.schedule {
                if super::recipient::is_recipient(tz.as_deref()) {
                    let (wall, next) = next_recipient_slot(task, *dst, *start_ms, from_ms)?;
                    return (!end_ms.is_some_and(|e| next > e)).then_some((next, Some(wall)));
                }
            }
            let cron = cron_of(task.schedule)?;
            let after = match (task.last_fire_ms, start_ms) {
                (Some(last), _) => last,
                // `next_after` is strict and `start` inclusive: search from just before it.
                (None, Some(s)) if *s > from_ms => s - 1,
                (None, _) => from_ms,
            };
            let next = cron.next_after(after)?;
            if end_ms.is_some_and(|e| next > e) {
                return None;
            }
            Some((next, None))
        }
        Schedule::Reminders {
            event_ms,
            before_ms,
            ..
        } => before_ms
            .iter()
            .filter(|o| !task.done_offsets_ms.contains(o))
            .map(|o| event_ms.saturating_sub(*o))
            .min()
            .map(|at| (at, None)),
    }
}

/// The next slot of a cron in recipient time, `(wall, instant)`: the first cron wall after the
/// last slot's that runs no earlier than the last fire when the wall is known (the zones may
/// have changed since: `recipient::slot_after_wall`), else (nothing fired yet, or a record
/// from before walls) the first slot whose instant is after the last fire's, or from
/// `start`/`from_ms`.
fn next_recipient_slot(
    task: &Fired<'_>,
    dst: crate::model::DstPolicy,
    start_ms: Option<u64>,
    from_ms: u64,
) -> Option<(u64, u64)> {
    use super::recipient::{next_slot, parse_zones, slot_after_wall, wall_cron};
    let cron = wall_cron(task.schedule)?;
    let zones = parse_zones(task.recipient_zones);
    if let Some(wall) = task.last_slot_wall_ms {
        return slot_after_wall(&cron, &zones, dst, wall, task.last_fire_ms);
    }
    let after = match (task.last_fire_ms, start_ms) {
        (Some(last), _) => last,
        (None, Some(s)) if s > from_ms => s - 1,
        (None, _) => from_ms,
    };
    next_slot(&cron, &zones, dst, after)
}

/// The slot wall of the fire at `fire_ms` for a cron in recipient time (`None` for any other
/// schedule): the next slot's after what `task` has handled when that is the one at
/// `fire_ms` (a tie with the last fire's instant included), else the first slot at that
/// instant (a fire found otherwise; the engine hands an outage's fires their walls itself,
/// `engine/plan.rs`). Not bounded by `max_runs` or `end`: the fire exists, and the one that
/// reaches `max_runs` is a slot like the others (review finding: it took the first wall).
fn fire_wall(task: &Fired<'_>, fire_ms: u64) -> Option<u64> {
    use super::recipient::{is_recipient, parse_zones, slot_of_cron, wall_cron};
    let Schedule::Cron {
        tz, dst, start_ms, ..
    } = task.schedule
    else {
        return None;
    };
    if !is_recipient(tz.as_deref()) {
        return None;
    }
    match next_recipient_slot(task, *dst, *start_ms, fire_ms.checked_sub(1)?) {
        Some((wall, at)) if at == fire_ms => Some(wall),
        _ => {
            let zones = parse_zones(task.recipient_zones);
            slot_of_cron(&wall_cron(task.schedule)?, &zones, *dst, fire_ms)
        }
    }
}

/// The wall of `task`'s next fire (`next_fire_at_ms`) for a cron in recipient time, as it
/// will be marked fired: the next slot after the last one's wall, so a slot sharing the last
/// fire's instant is named as itself, not as the first slot of that instant (what a task's
/// `next_fire_human` says). `None` for any other schedule, or no next fire.
pub fn next_fire_wall(task: &Task) -> Option<u64> {
    fire_wall(&fired(task), task.next_fire_at_ms?)
}

/// Runs started plus runs queued to start: what `max_runs` bounds.
pub fn runs_committed(p: &TaskProgress) -> u32 {
    p.runs.saturating_add(p.queued.len() as u32)
}

/// Whether a cron task's `max_runs` allows another run.
pub fn may_run_more(spec: &TaskSpec, p: &TaskProgress) -> bool {
    match &spec.schedule {
        Schedule::Cron {
            max_runs: Some(m), ..
        } => runs_committed(p) < *m,
        _ => true,
    }
}

/// Records that the fire at `fire_ms` was handled (run, skipped or expired), with its slot's
/// wall in recipient time (the next slot's, so a slot sharing the last one's instant is
/// still to come).
pub fn mark_fired(task: &mut Task, fire_ms: u64) {
    let wall = fire_wall(&fired(task), fire_ms);
    task.last_slot_wall_ms = wall;
    task.fires += 1;
    task.last_fire_ms = Some(fire_ms);
    if let Some(o) = offset_fired(&task.schedule, &task.done_offsets_ms, fire_ms) {
        task.done_offsets_ms.push(o);
    }
}

/// [`mark_fired`] on a task's progress.
pub fn mark_fired_of(spec: &TaskSpec, p: &mut TaskProgress, fire_ms: u64) {
    mark_slot_fired_of(spec, p, fire_ms, None);
}

/// [`mark_fired_of`], given the fire's slot wall when the caller knows it (`Some`: the engine's
/// missed fires, each listed with its own): set as it is. `None`: worked out from what has
/// fired, as [`mark_fired_of`] does (and `None` for a schedule not in recipient time).
pub fn mark_slot_fired_of(spec: &TaskSpec, p: &mut TaskProgress, fire_ms: u64, wall: Option<u64>) {
    let wall = wall.or_else(|| fire_wall(&fired_of(spec, p), fire_ms));
    p.last_slot_wall_ms = wall;
    p.fires += 1;
    p.last_fire_ms = Some(fire_ms);
    if let Some(o) = offset_fired(&spec.schedule, &p.done_offsets_ms, fire_ms) {
        p.done_offsets_ms.push(o);
    }
}

/// Reminders: the offset whose fire is at `fire_ms`, if it is not done yet.
fn offset_fired(schedule: &Schedule, done: &[u64], fire_ms: u64) -> Option<u64> {
    match schedule {
        Schedule::Reminders {
            event_ms,
            before_ms,
            ..
        } => before_ms
            .iter()
            .find(|o| event_ms.saturating_sub(**o) == fire_ms && !done.contains(o))
            .copied(),
        _ => None,
    }
}

/// For reminders: the minutes left until the event at `send_ms`, the instant the message is
/// sent (what `{{minutes_left}}` becomes): a reminder held by quiet hours or a rate limit says
/// what is left when it goes, not what was left at its slot. Whole minutes to the nearest (a
/// send a few ms after its 30-minute slot still says 30), never negative (0 once the event
/// has begun).
pub fn minutes_left(schedule: &Schedule, send_ms: u64) -> Option<u64> {
    match schedule {
        Schedule::Reminders { event_ms, .. } => {
            Some((event_ms.saturating_sub(send_ms) + 30_000) / 60_000)
        }
        _ => None,
    }
}

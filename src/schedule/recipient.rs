//! Per-recipient local time (`"tz": "recipient"`, API.md "People's time"). Pure.
//!
//! A schedule in recipient time names a *wall time* (`at` without an offset, or each slot of a
//! cron read as wall times) and every message goes out at that wall time in its own zone.
//! How runs are grouped: one run per slot (one `at`, or one cron match as a wall time), fired
//! at the slot's earliest instant over the task's zones; each message of the run then waits
//! for its own instant. So a daily 09:00 over zones 24+ hours apart is one run a day, which
//! spans those hours; the next slot's run starts a day after this one's, and may run beside
//! it (runs of a recipient-time schedule are never judged overlaps of each other). So a queued
//! fire (backfill, a `misfire: fire_all` catch-up) waits only for the runs of earlier slots
//! (and of its own instant), never for the schedule's newer runs beside them, which would hold
//! it for as long as the schedule fires (`engine/plan.rs::queue_head_may_start`).
//!
//! Wall times are carried as milliseconds "as if UTC" (a `NaiveDateTime` read in UTC), which is
//! how a cron evaluated in UTC yields them.
//!
//! DST per zone: the wall time is resolved in each recipient's zone with the task's policy,
//! except that a message is never dropped: a wall time in a zone's gap goes at the gap's end
//! (`shift`) whatever `dst.gap` says, and a repeated one at the first (or, `repeat: last`, the
//! last) of its instants (`both` means the first: one message is one send).
//!
//! Slots are known by their wall, not their run instant: two slots whose earliest zone puts
//! them at the same instant (a gap there: Berlin's 02:00, 02:30 and 03:00 on 28 March 2027
//! are all 03:00 CEST) are still two slots, and the later zones' messages of each (New York's
//! 02:30) go at their own time. The progress keeps the last slot's wall
//! (`TaskProgress::last_slot_wall_ms`), each queued fire its own (`Queued::wall_ms`), and a
//! run its slot's (`Run::slot_wall_ms`; progress record version 3, run record version 2,
//! written only when a wall is known); the next slot is the first cron wall after the last
//! one that runs no earlier than the last fire ([`slot_after_wall`]), and a run's messages
//! wait for its recorded wall ([`run_wall`]). While the zones stay the same, slot instants
//! never decrease as walls grow, so the bound changes nothing: fires stay in order, ties
//! included. New messages can add a zone east of the others, whose earlier instants would put
//! the slots after the last one before its fire (a burst of stale runs): those slots are
//! skipped, as the slots before a task's creation are (the later zones' messages of them
//! are not sent). A record from before walls has none: the wall is read from the instant, as
//! before ([`next_slot`] after the last fire, [`run_slot_wall`]), which is right except in a
//! gap.
//!
//! Missed fires (an outage, a pause) are judged by instant (`misfire.rs`), but each carries
//! its slot's wall from the walk that found it (`engine/plan.rs`): an outage's latest fire,
//! found past the counted ones by a bisection over instants, is the last slot sharing its
//! instant ([`last_slot_sharing`]), as all of them were missed.
//!
//! Backfill (`backfill.rs`) lists a range's slots by wall the same way (the first slot from
//! the range's start, then [`slot_after_wall`]), matches each against the runs and queued
//! fires that carry its wall (one without a wall, from before walls, by its instant: all the
//! slots of that instant), and each backfilled slot is a run of its own carrying its wall.
//! So the later slots of a gap that a build from before walls skipped (it ran only the first
//! of an instant) cannot be backfilled while that run's record is kept: conservative, never a
//! second send (`backfill::Marks`). A task's next fire in words ([`next_fire_human`]) names
//! the fire's own slot (`plan::next_fire_wall`: the slot after the last one's wall), not the
//! first of its instant.

use chrono::{DateTime, NaiveDateTime};
use chrono_tz::Tz;

use crate::model::{DstGap, DstPolicy, DstRepeat, Lang, Schedule};

use super::cron::CronSchedule;
use super::local::resolve_local;

/// The `tz` of a schedule in recipient time.
pub const RECIPIENT: &str = "recipient";

/// Whether a schedule's `tz` says recipient time.
pub fn is_recipient(tz: Option<&str>) -> bool {
    tz == Some(RECIPIENT)
}

/// Widest span of UTC offsets plus DST slack: a wall further than this from an instant cannot
/// resolve to it in any zone (offsets are within −12 h .. +14 h). So it also bounds how far a
/// change of the task's zones can move a slot's run instant (the earliest zone removed: up to
/// ~26 h later), and how long after its slot a run lasts (its last zone's instant).
pub const SPAN_MS: u64 = 30 * 3_600_000;

/// A wall time (ms as if UTC) as a naive date-time.
pub fn naive(wall_ms: u64) -> Option<NaiveDateTime> {
    DateTime::from_timestamp_millis(i64::try_from(wall_ms).ok()?).map(|t| t.naive_utc())
}

/// A naive date-time as a wall time (ms as if UTC).
pub fn wall_of(naive: NaiveDateTime) -> Option<u64> {
    u64::try_from(naive.and_utc().timestamp_millis()).ok()
}

/// The DST policy a task's `dst` comes to in recipient time (the module's rule: a message is
/// never dropped, and is one send).
pub fn message_dst(dst: DstPolicy) -> DstPolicy {
    DstPolicy {
        gap: DstGap::Shift,
        repeat: match dst.repeat {
            DstRepeat::Last => DstRepeat::Last,
            DstRepeat::First | DstRepeat::Both => DstRepeat::First,
        },
    }
}

/// The instant wall time `wall_ms` stands for in `zone` (never none: see the module's DST rule).
pub fn instant_in(wall_ms: u64, zone: Tz, dst: DstPolicy) -> Option<u64> {
    resolve_local(naive(wall_ms)?, zone, message_dst(dst))
        .first()
        .copied()
}

/// A slot's run instant: the earliest of its zones' instants.
pub fn first_instant(wall_ms: u64, zones: &[Tz], dst: DstPolicy) -> Option<u64> {
    zones
        .iter()
        .filter_map(|z| instant_in(wall_ms, *z, dst))
        .min()
}

/// The next slot of a cron read as wall times (`cron` parsed in UTC) whose run instant is
/// strictly after `after_ms`: `(wall, instant)`.
///
/// In one zone instants never decrease as walls grow (a gap's walls all go at its end, a
/// fold's at its first, or last, pass), so neither does a slot's run instant, the earliest of
/// its zones'. A slot runs after `after_ms` exactly when its wall is at or past every zone's
/// [`wall_threshold`]; the next slot is the first cron wall from the largest of those: one
/// cron evaluation, whatever the cron's frequency.
pub fn next_slot(
    cron: &CronSchedule,
    zones: &[Tz],
    dst: DstPolicy,
    after_ms: u64,
) -> Option<(u64, u64)> {
    let mut from = 0;
    for zone in zones {
        from = from.max(wall_threshold(*zone, dst, after_ms)?);
    }
    // `next_after` is strict: from just before the threshold (a wall at the epoch itself is
    // not a slot herald can meet).
    let wall = cron.next_after(from.checked_sub(1)?)?;
    let at = first_instant(wall, zones, dst)?;
    (at > after_ms).then_some((wall, at))
}

/// The slot after the one whose wall is `wall` that runs no earlier than `not_before_ms` (the
/// last fire's instant): the first cron wall strictly after `wall` whose run instant is at or
/// after it, `(wall, instant)`. This is how the next slot is found once the last slot's wall
/// is known: two slots whose earliest zone puts them at one instant (a gap there) are two
/// slots, each fired once, where [`next_slot`] after their instant would go past the second.
///
/// While the zones stay as they were, slot instants never decrease as walls grow (see
/// [`next_slot`]): the slot after `wall` runs at or after `wall`'s own instant, the last fire,
/// and the bound changes nothing (a tie, an instant equal to the last, included). A change of
/// the zones (new messages, `request/build.rs`) can move the slots after `wall` to instants
/// long past: a zone east of the others puts the next hourly wall hours before the last fire
/// (review finding: a burst of stale runs). The bound skips those slots, as [`next_slot`]
/// does: the first wall from every zone's [`wall_threshold`] on.
pub fn slot_after_wall(
    cron: &CronSchedule,
    zones: &[Tz],
    dst: DstPolicy,
    wall: u64,
    not_before_ms: Option<u64>,
) -> Option<(u64, u64)> {
    let mut from = wall;
    if let Some(after) = not_before_ms.and_then(|t| t.checked_sub(1)) {
        for zone in zones {
            // Walls from the threshold on run after `after`; `next_after` is strict.
            from = from.max(wall_threshold(*zone, dst, after)?.saturating_sub(1));
        }
    }
    let next = cron.next_after(from)?;
    Some((next, first_instant(next, zones, dst)?))
}

/// The last slot sharing the run instant of the slot at `wall` (`wall` itself when the next
/// slot runs later): in a gap of the earliest zone several walls run at one instant (Berlin's
/// 02:00 to 03:00 of a spring-forward day). Slot instants never decrease as walls grow, so a
/// bisection over the walls after `wall` finds it in ~40 cron evaluations, whatever the cron's
/// frequency (an outage's latest fire, `engine/plan.rs::latest_missed`: all of them missed).
pub fn last_slot_sharing(
    cron: &CronSchedule,
    zones: &[Tz],
    dst: DstPolicy,
    wall: u64,
) -> Option<u64> {
    let at = first_instant(wall, zones, dst)?;
    let shares = |w: u64| {
        cron.next_after(w)
            .and_then(|n| first_instant(n, zones, dst))
            == Some(at)
    };
    // The slot after `lo` shares the instant; the one after `hi` does not (two spans past
    // `wall`, its instant is a day and more after `at` in every zone).
    let (mut lo, mut hi) = (wall.checked_sub(1)?, wall.checked_add(2 * SPAN_MS)?);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if shares(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    cron.next_after(lo)
}

/// The smallest wall (ms as if UTC) whose instant in `zone` is after `after_ms` (a zone that
/// cannot place a wall does not hold it back, as in [`first_instant`]). Usually the wall of the
/// next millisecond itself; next to a fold or gap a bisection over walls, instants growing
/// with them.
fn wall_threshold(zone: Tz, dst: DstPolicy, after_ms: u64) -> Option<u64> {
    let later = |w: u64| instant_in(w, zone, dst).is_none_or(|t| t > after_ms);
    let next = after_ms.checked_add(1)?;
    let local = DateTime::from_timestamp_millis(i64::try_from(next).ok()?)?
        .with_timezone(&zone)
        .naive_local();
    let guess = wall_of(local)?;
    if later(guess) && (guess == 0 || !later(guess - 1)) {
        return Some(guess);
    }
    let (mut lo, mut hi) = (
        after_ms.saturating_sub(SPAN_MS),
        after_ms.checked_add(SPAN_MS)?,
    );
    if later(lo) {
        return Some(lo);
    }
    // `lo` is not later, `hi` is.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if later(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// The wall time of the cron slot whose run instant is `fire_ms` (a run's `scheduled_at`).
pub fn slot_of_cron(
    cron: &CronSchedule,
    zones: &[Tz],
    dst: DstPolicy,
    fire_ms: u64,
) -> Option<u64> {
    next_slot(cron, zones, dst, fire_ms.checked_sub(1)?)
        .filter(|(_, at)| *at == fire_ms)
        .map(|(wall, _)| wall)
}

/// The cron of a schedule in recipient time, read as wall times (in UTC).
pub fn wall_cron(schedule: &Schedule) -> Option<CronSchedule> {
    match schedule {
        Schedule::Cron { cron, dst, .. } => CronSchedule::parse(cron, chrono_tz::UTC, *dst).ok(),
        _ => None,
    }
}

/// The wall time of the slot whose run fires at `fire_ms`: the `at` itself for a one-shot,
/// the matching cron slot for a cron.
pub fn slot_wall(schedule: &Schedule, zones: &[Tz], fire_ms: u64) -> Option<u64> {
    match schedule {
        Schedule::At { at, .. } => at_wall(at),
        Schedule::Cron { dst, .. } => slot_of_cron(&wall_cron(schedule)?, zones, *dst, fire_ms),
        _ => None,
    }
}

/// An `at` in recipient time (a local time without offset) as a wall time.
fn at_wall(at: &str) -> Option<u64> {
    ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(at, f).ok())
        .and_then(wall_of)
}

/// The wall time of the slot the run that fired at `fire_ms` is the run *of*: as
/// [`slot_wall`], but a one-shot's only when the run fired at the `at`'s own instant
/// (`at_ms`, where the slot comes first). A run started at any other instant is no slot's:
/// a trigger ("send now", API.md), whose messages all go now, not at the `at` in their zones.
/// (A cron's runs are matched by instant already: a trigger between slots has none.)
pub fn run_slot_wall(schedule: &Schedule, zones: &[Tz], fire_ms: u64) -> Option<u64> {
    match schedule {
        Schedule::At { at, at_ms, .. } if *at_ms == fire_ms => at_wall(at),
        Schedule::At { .. } => None,
        _ => slot_wall(schedule, zones, fire_ms),
    }
}

/// The wall time of the slot of the run that fired at `fire_ms`: for a cron, the one the run
/// recorded (`recorded`, `Run::slot_wall_ms`: two slots can share an instant) while it is a
/// slot of the cron, else as [`run_slot_wall`] reads it from the instant (a run recorded
/// before walls, a trigger, a cron patched since to one without that slot: as before walls,
/// a paused run's new schedule that moves its slot is refused, `engine/control.rs`).
pub fn run_wall(
    schedule: &Schedule,
    zones: &[Tz],
    fire_ms: u64,
    recorded: Option<u64>,
) -> Option<u64> {
    let kept = recorded.filter(|w| is_cron_slot(schedule, *w));
    kept.or_else(|| run_slot_wall(schedule, zones, fire_ms))
}

/// What holds the messages of the run that fired at `fire_ms` (its recorded slot wall
/// `recorded`, see [`run_wall`]) in recipient time: its slot's wall time and the DST policy
/// its messages follow in their zones. `None`: nothing does (not recipient time, or a run
/// that is no slot's). A run records its slot's wall only for a cron (an `at` has one slot);
/// otherwise it is read from the task's schedule and zones each time, so a change of the
/// schedule would move, or drop, the hold of a run under way.
pub fn run_hold(
    schedule: &Schedule,
    recipient_zones: &[String],
    fire_ms: u64,
    recorded: Option<u64>,
) -> Option<(u64, DstPolicy)> {
    let dst = match schedule {
        Schedule::At { tz, dst, .. } | Schedule::Cron { tz, dst, .. }
            if is_recipient(tz.as_deref()) && !recipient_zones.is_empty() =>
        {
            message_dst(*dst)
        }
        _ => return None,
    };
    let wall = run_wall(schedule, &parse_zones(recipient_zones), fire_ms, recorded)?;
    Some((wall, dst))
}

/// When a message in zone `tz` of the run that fired at `fire_ms` (its recorded slot wall
/// `recorded`, see [`run_wall`]) is due: the slot's wall time in that zone. `None` for a
/// schedule not in recipient time (or a zone unknown to this build), or a run that is no
/// slot's ([`run_slot_wall`]: a trigger): the message follows the run's pacing alone.
pub fn message_due(
    schedule: &Schedule,
    zones: &[Tz],
    fire_ms: u64,
    recorded: Option<u64>,
    tz: &str,
) -> Option<u64> {
    let zone: Tz = tz.parse().ok()?;
    let dst = match schedule {
        Schedule::At { dst, .. } | Schedule::Cron { dst, .. } => *dst,
        _ => return None,
    };
    instant_in(run_wall(schedule, zones, fire_ms, recorded)?, zone, dst)
}

/// When the run of `schedule` that fires at `at_ms` is, for people (a task's
/// `next_fire_human`): in recipient time its slot's wall time, which each recipient has in
/// their own zone, on its day where it comes first ("tomorrow at 09:00 (each recipient's local
/// time)"); otherwise [`super::next_fire_human`] in the schedule's zone. `wall`: the fire's
/// own slot wall when the caller knows it (`plan::next_fire_wall`): slots sharing an instant
/// (a gap in the earliest zone) are told apart by it; else, or when it is no slot of the
/// cron, the first slot of the instant.
pub fn next_fire_human(
    schedule: &Schedule,
    recipient_zones: &[String],
    (at_ms, wall): (u64, Option<u64>),
    now_ms: u64,
    lang: Lang,
) -> String {
    slot_human(schedule, recipient_zones, (at_ms, wall), now_ms, lang)
        .unwrap_or_else(|| super::next_fire_human(at_ms, now_ms, super::zone_of(schedule), lang))
}

fn slot_human(
    schedule: &Schedule,
    recipient_zones: &[String],
    (at_ms, wall): (u64, Option<u64>),
    now_ms: u64,
    lang: Lang,
) -> Option<String> {
    let dst = match schedule {
        Schedule::At { tz, dst, .. } | Schedule::Cron { tz, dst, .. }
            if is_recipient(tz.as_deref()) =>
        {
            *dst
        }
        _ => return None,
    };
    let zones = parse_zones(recipient_zones);
    let wall = match wall.filter(|w| is_cron_slot(schedule, *w)) {
        Some(w) => w,
        None => slot_wall(schedule, &zones, at_ms)?,
    };
    let first = zones
        .iter()
        .copied()
        .min_by_key(|z| instant_in(wall, *z, dst).unwrap_or(u64::MAX))?;
    super::describe::slot_human(wall, now_ms, first, lang)
}

/// Whether `wall` is a slot of `schedule`'s cron read as wall times (`false` for any other
/// schedule): a wall recorded for a slot may outlive a change of the cron.
fn is_cron_slot(schedule: &Schedule, wall: u64) -> bool {
    wall_cron(schedule)
        .zip(wall.checked_sub(1))
        .is_some_and(|(c, before)| c.next_after(before) == Some(wall))
}

/// The distinct zones of a task's messages, parsed, in a stable order.
pub fn parse_zones(names: &[String]) -> Vec<Tz> {
    let mut zones: Vec<Tz> = names.iter().filter_map(|n| n.parse::<Tz>().ok()).collect();
    zones.sort_by_key(|z| z.name());
    zones.dedup();
    zones
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::parse_instant;

    fn utc(s: &str) -> u64 {
        parse_instant(s, None, DstPolicy::default()).unwrap()[0]
    }

    fn tz(n: &str) -> Tz {
        n.parse().unwrap()
    }

    #[test]
    fn a_wall_time_in_each_zone_with_its_own_dst() {
        let wall = utc("2026-03-29T09:00:00Z"); // Berlin springs forward at 02:00 that day
        let d = DstPolicy::default();
        assert_eq!(
            instant_in(wall, tz("Europe/Berlin"), d),
            Some(utc("2026-03-29T07:00:00Z"))
        );
        assert_eq!(
            instant_in(wall, tz("Asia/Shanghai"), d),
            Some(utc("2026-03-29T01:00:00Z"))
        );
        // A wall time in Berlin's gap is sent at the gap's end, even with gap: skip.
        let gap = utc("2026-03-29T02:30:00Z");
        let skip = DstPolicy {
            gap: DstGap::Skip,
            ..d
        };
        assert_eq!(
            instant_in(gap, tz("Europe/Berlin"), skip),
            Some(utc("2026-03-29T01:00:00Z"))
        );
    }

    #[test]
    fn a_daily_cron_is_one_run_a_day_over_zones_a_day_apart() {
        let cron = CronSchedule::parse("0 9 * * *", chrono_tz::UTC, DstPolicy::default()).unwrap();
        let zones = parse_zones(&[
            "Pacific/Kiritimati".into(), // UTC+14
            "Pacific/Pago_Pago".into(),  // UTC−11
        ]);
        let d = DstPolicy::default();
        let (wall, at) = next_slot(&cron, &zones, d, utc("2026-12-01T12:00:00Z")).unwrap();
        // 09:00 on 2 Dec at UTC+14 is 1 Dec 19:00 UTC: the run of the 2 Dec slot.
        assert_eq!(
            (wall, at),
            (utc("2026-12-02T09:00:00Z"), utc("2026-12-01T19:00:00Z"))
        );
        // The run spans 25 hours: its last message (Pago Pago) is at 2 Dec 20:00 UTC, an hour
        // after the next slot's run started (2 Dec 19:00 UTC): that is the next day's slot, a
        // run of its own beside it (`engine/plan.rs::fire` never judges it an overlap).
        let (wall2, at2) = next_slot(&cron, &zones, d, at).unwrap();
        assert_eq!(
            (wall2, at2),
            (utc("2026-12-03T09:00:00Z"), utc("2026-12-02T19:00:00Z"))
        );
        assert_eq!(slot_of_cron(&cron, &zones, d, at), Some(wall));
        assert_eq!(slot_of_cron(&cron, &zones, d, at + 1), None);
    }

    /// The search before the thresholds: every wall from 30 h before `after_ms` on, kept as the
    /// reference the new one must agree with.
    fn next_slot_by_scan(
        cron: &CronSchedule,
        zones: &[Tz],
        dst: DstPolicy,
        after_ms: u64,
    ) -> Option<(u64, u64)> {
        let mut wall = after_ms.saturating_sub(SPAN_MS);
        let mut best: Option<(u64, u64)> = None;
        loop {
            wall = cron.next_after(wall)?;
            if best.is_some_and(|(_, b)| wall > b + SPAN_MS) {
                return best;
            }
            if let Some(at) = first_instant(wall, zones, dst) {
                if at > after_ms && best.is_none_or(|(_, b)| at < b) {
                    best = Some((wall, at));
                }
            }
        }
    }

    #[test]
    fn slots_are_those_of_a_scan_of_every_wall_across_dst() {
        let sets: [&[&str]; 4] = [
            &["America/New_York"],
            &["America/New_York", "America/Phoenix"],
            &["Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata"],
            &[
                "Pacific/Kiritimati",
                "Pacific/Pago_Pago",
                "America/Santiago",
            ],
        ];
        let crons = ["0 * * * *", "*/20 1-3 * * *", "30 1 * * *", "0 9 * * 1-5"];
        let starts = [
            "2027-03-13T20:00:00Z",
            "2026-11-01T02:00:00Z",
            "2026-10-03T12:00:00Z",
            "2026-04-04T10:00:00Z",
        ];
        for repeat in [DstRepeat::First, DstRepeat::Last] {
            let d = DstPolicy {
                repeat,
                ..DstPolicy::default()
            };
            for (zones, expr, start) in itertools_product(&sets, &crons, &starts) {
                let zones = parse_zones(&zones.iter().map(|z| z.to_string()).collect::<Vec<_>>());
                let cron = CronSchedule::parse(expr, chrono_tz::UTC, d).unwrap();
                let mut after = utc(start);
                for _ in 0..30 {
                    let new = next_slot(&cron, &zones, d, after);
                    assert_eq!(
                        new,
                        next_slot_by_scan(&cron, &zones, d, after),
                        "{expr} {zones:?} after {after}"
                    );
                    // and from a moment inside each hour, not only from the last fire
                    let mid = after + 1_234_567;
                    assert_eq!(
                        next_slot(&cron, &zones, d, mid),
                        next_slot_by_scan(&cron, &zones, d, mid)
                    );
                    let Some((_, at)) = new else { break };
                    after = at;
                }
            }
        }
    }

    fn itertools_product<'a>(
        a: &'a [&'a [&'a str]],
        b: &'a [&'a str],
        c: &'a [&'a str],
    ) -> impl Iterator<Item = (&'a [&'a str], &'a str, &'a str)> + 'a {
        a.iter().flat_map(move |x| {
            b.iter()
                .flat_map(move |y| c.iter().map(move |z| (*x, *y, *z)))
        })
    }

    #[test]
    fn a_slot_costs_one_cron_evaluation_whatever_the_crons_frequency() {
        use crate::schedule::cron::evaluations;
        let d = DstPolicy::default();
        let zones = parse_zones(&["Pacific/Kiritimati".into(), "UTC".into()]);
        for (expr, wall, at) in [
            ("* * * * *", "2026-06-01T14:01:00Z", "2026-06-01T00:01:00Z"),
            (
                "* * * * * *",
                "2026-06-01T14:00:01Z",
                "2026-06-01T00:00:01Z",
            ),
        ] {
            let cron = CronSchedule::parse(expr, chrono_tz::UTC, d).unwrap();
            let (slot, n) =
                evaluations::of(|| next_slot(&cron, &zones, d, utc("2026-06-01T00:00:00Z")));
            assert_eq!(slot, Some((utc(wall), utc(at))), "{expr}");
            assert_eq!(n, 1, "{expr}: {n} cron evaluations for one slot");
        }
    }

    /// Berlin springs forward at 02:00 on 28 March 2027 (02:00–02:59 do not exist there:
    /// shifted to 03:00 CEST, 01:00Z); New York is on EDT already (since 14 March). Every
    /// half hour, the walls 02:00, 02:30 and 03:00 all come first in Berlin at 01:00Z: one
    /// run instant, three slots. Known by their walls, each is a slot once, in order.
    #[test]
    fn slots_sharing_an_instant_in_a_gap_are_each_a_slot_once() {
        let d = DstPolicy::default();
        let cron = CronSchedule::parse("*/30 * * * *", chrono_tz::UTC, d).unwrap();
        let zones = parse_zones(&["Europe/Berlin".into(), "America/New_York".into()]);
        let mut wall = utc("2027-03-28T01:30:00Z");
        assert_eq!(
            first_instant(wall, &zones, d),
            Some(utc("2027-03-28T00:30:00Z"))
        );
        let mut got = Vec::new();
        // Bounded by the last fire's instant, as the schedule goes on: ties still come.
        let mut last = first_instant(wall, &zones, d);
        for _ in 0..4 {
            let (next, at) = slot_after_wall(&cron, &zones, d, wall, last).unwrap();
            assert_eq!(
                slot_after_wall(&cron, &zones, d, wall, None),
                Some((next, at))
            );
            got.push((next, at));
            (wall, last) = (next, Some(at));
        }
        let want = [
            ("2027-03-28T02:00:00Z", "2027-03-28T01:00:00Z"),
            ("2027-03-28T02:30:00Z", "2027-03-28T01:00:00Z"),
            ("2027-03-28T03:00:00Z", "2027-03-28T01:00:00Z"),
            ("2027-03-28T03:30:00Z", "2027-03-28T01:30:00Z"),
        ]
        .map(|(w, a)| (utc(w), utc(a)));
        assert_eq!(got, want);
        assert!(
            got.windows(2).all(|p| p[0].1 <= p[1].1),
            "instants never decrease"
        );
        // New York's messages of the 02:30 slot go at 02:30 EDT, which exists there.
        assert_eq!(
            instant_in(want[1].0, tz("America/New_York"), d),
            Some(utc("2027-03-28T06:30:00Z"))
        );
        // Known by their instant alone, the slots after 01:00Z skip 02:30 and 03:00: the
        // limit the walls remove.
        let (w, _) = next_slot(&cron, &zones, d, utc("2027-03-28T01:00:00Z")).unwrap();
        assert_eq!(w, utc("2027-03-28T03:30:00Z"));
        // The last of the slots sharing 01:00Z, from any of them; a slot alone at its instant
        // is its own last (per second too: ~40 evaluations, not one per wall).
        for w in &want[..3] {
            assert_eq!(last_slot_sharing(&cron, &zones, d, w.0), Some(want[2].0));
        }
        assert_eq!(
            last_slot_sharing(&cron, &zones, d, want[3].0),
            Some(want[3].0)
        );
        let secs = CronSchedule::parse("* * * * * *", chrono_tz::UTC, d).unwrap();
        let (last, n) = crate::schedule::cron::evaluations::of(|| {
            last_slot_sharing(&secs, &zones, d, utc("2027-03-28T02:00:00Z"))
        });
        assert_eq!(last, Some(utc("2027-03-28T03:00:00Z")));
        assert!(n < 64, "{n} cron evaluations");
    }

    /// Review finding: a patch adding a zone east of the others (new messages) left the next
    /// slot the cron wall after the last one, hours before the last fire: an hourly cron for
    /// London (UTC in December) fired its 10:00 slot at 10:00Z; with Tokyo (UTC+9) its 11:00
    /// is 02:00Z, the first of nine stale slots. The next slot runs no earlier than the last
    /// fire: 19:00, Tokyo's 10:00Z (a tie with it), then one an hour.
    #[test]
    fn a_new_zone_to_the_east_never_moves_the_next_slot_before_the_last_fire() {
        use crate::schedule::plan::{mark_fired, next_fire};
        let start = utc("2026-12-01T09:30:00Z");
        let mut t = crate::request::test_task(
            serde_json::json!({"schedule": {"cron": "0 * * * *", "tz": "recipient"},
            "messages": [{"to": "l", "body": "x", "tz": "Europe/London"}]}),
            start,
        );
        let ten = utc("2026-12-01T10:00:00Z");
        assert_eq!(next_fire(&t, start), Some(ten));
        mark_fired(&mut t, ten);
        assert_eq!(t.last_slot_wall_ms, Some(ten));
        assert_eq!(next_fire(&t, ten), Some(utc("2026-12-01T11:00:00Z")));
        t.recipient_zones.push("Asia/Tokyo".into());
        let now = utc("2026-12-01T10:10:00Z");
        let mut got = Vec::new();
        for _ in 0..3 {
            let at = next_fire(&t, now).unwrap();
            mark_fired(&mut t, at);
            got.push((t.last_slot_wall_ms.unwrap(), at));
        }
        let want = [
            ("2026-12-01T19:00:00Z", "2026-12-01T10:00:00Z"),
            ("2026-12-01T20:00:00Z", "2026-12-01T11:00:00Z"),
            ("2026-12-01T21:00:00Z", "2026-12-01T12:00:00Z"),
        ]
        .map(|(w, a)| (utc(w), utc(a)));
        assert_eq!(got, want);
    }

    /// Review finding: the fire that reaches `max_runs` (a catch-up's last, skipped for it)
    /// took the first slot of its instant, as if nothing had fired: the 02:00 slot again, not
    /// 02:30.
    #[test]
    fn the_fire_at_max_runs_is_its_own_slot() {
        use crate::schedule::plan::{mark_fired, next_fire};
        let start = utc("2027-03-28T00:00:00Z");
        let mut t = crate::request::test_task(
            serde_json::json!({"schedule": {"cron": "*/30 * * * *", "tz": "recipient",
                "max_runs": 2},
            "messages": [{"to": "b", "body": "x", "tz": "Europe/Berlin"}]}),
            start,
        );
        for _ in 0..2 {
            let at = next_fire(&t, start).unwrap();
            mark_fired(&mut t, at);
            t.runs += 1;
        }
        assert_eq!(t.last_slot_wall_ms, Some(utc("2027-03-28T02:00:00Z")));
        assert_eq!(next_fire(&t, start), None, "max_runs reached");
        mark_fired(&mut t, utc("2027-03-28T01:00:00Z"));
        assert_eq!(t.last_slot_wall_ms, Some(utc("2027-03-28T02:30:00Z")));
    }

    /// A run's recorded wall holds while it is a slot of the task's cron (`run_wall`): the run
    /// of the 02:30 slot (01:00Z, shared with 02:00 and 03:00) keeps its hold under a new
    /// cron that keeps 02:30, and falls back to its instant's first slot, 02:00, under one
    /// that drops it: New York's message would go at 02:00 EDT, not 02:30, so
    /// `engine/control.rs::hold_moved` refuses that patch (409).
    #[test]
    fn a_recorded_wall_holds_while_it_is_a_slot_of_the_cron() {
        let zones = vec!["Europe/Berlin".to_string(), "America/New_York".to_string()];
        let schedule = |cron: &str| {
            crate::request::test_task(
                serde_json::json!({"schedule": {"cron": cron, "tz": "recipient"},
                "messages": [{"to": "b", "body": "x", "tz": "Europe/Berlin"},
                             {"to": "n", "body": "y", "tz": "America/New_York"}]}),
                utc("2027-03-27T00:00:00Z"),
            )
            .schedule
        };
        let (fire, wall) = (utc("2027-03-28T01:00:00Z"), utc("2027-03-28T02:30:00Z"));
        let old = schedule("*/30 * * * *");
        let hold = |s: &Schedule, w| run_hold(s, &zones, fire, w).map(|h| h.0);
        assert_eq!(hold(&old, Some(wall)), Some(wall));
        // Not recorded (a run from before walls): the instant's first slot.
        let first = utc("2027-03-28T02:00:00Z");
        assert_eq!(hold(&old, None), Some(first));
        for keeps in ["0,30 * * * *", "30 2 * * *", "*/15 * * * *"] {
            assert_eq!(hold(&schedule(keeps), Some(wall)), Some(wall), "{keeps}");
        }
        for drops in ["0 * * * *", "45 * * * *"] {
            let new = schedule(drops);
            assert_ne!(hold(&new, Some(wall)), hold(&old, Some(wall)), "{drops}");
        }
        assert_eq!(hold(&schedule("0 * * * *"), Some(wall)), Some(first));
        // New York's message of the slot, by the recorded wall: 02:30 EDT.
        let ny = message_due(
            &old,
            &parse_zones(&zones),
            fire,
            Some(wall),
            "America/New_York",
        );
        assert_eq!(ny, Some(utc("2027-03-28T06:30:00Z")));
    }

    /// The same slots through the schedule's own bookkeeping (`plan::mark_fired`, what the
    /// engine and the preview go through): each wall handled once, none skipped, and a task
    /// whose last slot's wall is not known (a record from before walls) goes on from its
    /// instant as before.
    #[test]
    fn marking_fires_goes_through_every_slot_of_a_gap() {
        use crate::schedule::plan::{mark_fired, next_fire};
        let start = utc("2027-03-28T00:00:00Z");
        let mut t = crate::request::test_task(
            serde_json::json!({"schedule": {"cron": "*/30 * * * *", "tz": "recipient"},
            "messages": [{"to": "b", "body": "x", "tz": "Europe/Berlin"},
                         {"to": "n", "body": "y", "tz": "America/New_York"}]}),
            start,
        );
        let mut fires = Vec::new();
        let mut from = start;
        while let Some(at) = next_fire(&t, from) {
            if at > utc("2027-03-28T01:30:00Z") {
                break;
            }
            mark_fired(&mut t, at);
            fires.push((t.last_slot_wall_ms.unwrap(), at));
            from = at;
        }
        let walls: Vec<u64> = fires.iter().map(|f| f.0).collect();
        let want: Vec<u64> = ["01:30", "02:00", "02:30", "03:00", "03:30"]
            .iter()
            .map(|h| utc(&format!("2027-03-28T{h}:00Z")))
            .collect();
        assert_eq!(walls, want, "{fires:?}");
        // A record from before walls: the last fire's instant alone (01:00Z, 02:00's).
        t.last_fire_ms = Some(utc("2027-03-28T01:00:00Z"));
        t.last_slot_wall_ms = None;
        assert_eq!(next_fire(&t, start), Some(utc("2027-03-28T01:30:00Z")));
    }

    /// Review finding (the module's open limit): a task's next fire in words named the first
    /// slot of its instant, so after the 02:00 slot's run (01:00Z) the next fire, the 02:30
    /// slot at the same instant, was called 02:00 again. It names the fire's own slot.
    #[test]
    fn the_next_fire_in_words_names_its_own_slot_of_a_shared_instant() {
        use crate::schedule::plan::{mark_fired, next_fire, next_fire_wall};
        let now = utc("2027-03-28T00:50:00Z");
        let mut t = crate::request::test_task(
            serde_json::json!({"schedule": {"cron": "*/30 * * * *", "tz": "recipient"},
            "messages": [{"to": "b", "body": "x", "tz": "Europe/Berlin"},
                         {"to": "n", "body": "y", "tz": "America/New_York"}]}),
            now,
        );
        let at = utc("2027-03-28T01:00:00Z");
        let human = |t: &crate::model::Task| {
            let fire = (t.next_fire_at_ms.unwrap(), next_fire_wall(t));
            next_fire_human(&t.schedule, &t.recipient_zones, fire, now, Lang::En)
        };
        let mut said = Vec::new();
        for _ in 0..3 {
            assert_eq!(t.next_fire_at_ms, Some(at));
            said.push(human(&t));
            mark_fired(&mut t, at);
            t.runs += 1;
            t.next_fire_at_ms = next_fire(&t, now);
        }
        let want = ["02:00", "02:30", "03:00"]
            .map(|w| format!("today at {w} (each recipient's local time)"));
        assert_eq!(said, want);
        // Without a wall (or one that is no slot of the cron): the first slot of the instant.
        let first = next_fire_human(&t.schedule, &t.recipient_zones, (at, None), now, Lang::En);
        assert_eq!(first, want[0]);
        let odd = (at, Some(utc("2027-03-28T02:10:00Z")));
        let first = next_fire_human(&t.schedule, &t.recipient_zones, odd, now, Lang::En);
        assert_eq!(first, want[0]);
    }

    #[test]
    fn a_rare_cron_keeps_its_slot_beyond_the_next_one() {
        // Feb 29 on a Monday (`+`: day of month AND day of week): 2044, then 2072, more than the 10-year horizon after it.
        let d = DstPolicy::default();
        let cron = CronSchedule::parse("0 9 29 2 +1", chrono_tz::UTC, d).unwrap();
        let after = utc("2040-01-01T00:00:00Z");
        assert_eq!(cron.next_after(after), Some(utc("2044-02-29T09:00:00Z")));
        let zones = parse_zones(&["UTC".into(), "Asia/Tokyo".into()]);
        assert_eq!(
            next_slot(&cron, &zones, d, after),
            Some((utc("2044-02-29T09:00:00Z"), utc("2044-02-29T00:00:00Z")))
        );
    }
}

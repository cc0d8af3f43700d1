//! Per-recipient local time (`"tz": "recipient"`, API.md "People's time"). Pure.
//!
//! A schedule in recipient time names a *wall time* (`at` without an offset, or each slot of a
//! cron read as wall times) and every message goes out at that wall time in its own zone.
//! How runs are grouped: one run per slot (one `at`, or one cron match as a wall time), fired
//! at the slot's earliest instant over the task's zones; each message of the run then waits
//! for its own instant. So a daily 09:00 over zones 24+ hours apart is one run a day, which
//! spans those hours; the next slot's run starts a day after this one's, and may run beside
//! it (runs of a recipient-time schedule are never judged overlaps of each other).
//!
//! Wall times are carried as milliseconds "as if UTC" (a `NaiveDateTime` read in UTC), which is
//! how a cron evaluated in UTC yields them.
//!
//! DST per zone: the wall time is resolved in each recipient's zone with the task's policy,
//! except that a message is never dropped: a wall time in a zone's gap goes at the gap's end
//! (`shift`) whatever `dst.gap` says, and a repeated one at the first (or, `repeat: last`, the
//! last) of its instants (`both` means the first: one message is one send).
//!
//! Known limit (open): slots are known by their run instant (`last_fire_ms`, `queued`, a
//! run's `scheduled_at_ms`), so two slots whose earliest zone puts them at the same instant (a
//! gap there: Berlin's 02:00 and 02:30 on 28 March 2027 are both 03:00 CEST) are one slot:
//! [`next_slot`] after that instant goes past the second, whose later zones' messages (New
//! York's 02:30) never go. The fix is to carry the slot's wall: the progress's last slot wall
//! and each queued fire's, and a run's (a new record version of each), the next slot the
//! first cron wall after the last one (slot instants never decrease as walls grow, so fires
//! stay in order, ties included).

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
/// resolve to it in any zone (offsets are within −12 h .. +14 h).
const SPAN_MS: u64 = 30 * 3_600_000;

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

/// What holds the messages of the run that fired at `fire_ms` in recipient time: its slot's
/// wall time and the DST policy its messages follow in their zones. `None`: nothing does (not
/// recipient time, or a run that is no slot's). A run keeps no record of its slot (`Run` has
/// only its instant), so this is read from the task's schedule and zones each time: a change
/// of the schedule that changes it would move, or drop, the hold of a run under way.
pub fn run_hold(
    schedule: &Schedule,
    recipient_zones: &[String],
    fire_ms: u64,
) -> Option<(u64, DstPolicy)> {
    let dst = match schedule {
        Schedule::At { tz, dst, .. } | Schedule::Cron { tz, dst, .. }
            if is_recipient(tz.as_deref()) && !recipient_zones.is_empty() =>
        {
            message_dst(*dst)
        }
        _ => return None,
    };
    let wall = run_slot_wall(schedule, &parse_zones(recipient_zones), fire_ms)?;
    Some((wall, dst))
}

/// When a message in zone `tz` of the run that fired at `fire_ms` is due: the slot's wall
/// time in that zone. `None` for a schedule not in recipient time (or a zone unknown to this
/// build), or a run that is no slot's ([`run_slot_wall`]: a trigger): the message follows the
/// run's pacing alone.
pub fn message_due(schedule: &Schedule, zones: &[Tz], fire_ms: u64, tz: &str) -> Option<u64> {
    let zone: Tz = tz.parse().ok()?;
    let dst = match schedule {
        Schedule::At { dst, .. } | Schedule::Cron { dst, .. } => *dst,
        _ => return None,
    };
    instant_in(run_slot_wall(schedule, zones, fire_ms)?, zone, dst)
}

/// When the run of `schedule` that fires at `at_ms` is, for people (a task's
/// `next_fire_human`): in recipient time its slot's wall time, which each recipient has in
/// their own zone, on its day where it comes first ("tomorrow at 09:00 (each recipient's local
/// time)"); otherwise [`super::next_fire_human`] in the schedule's zone.
pub fn next_fire_human(
    schedule: &Schedule,
    recipient_zones: &[String],
    at_ms: u64,
    now_ms: u64,
    lang: Lang,
) -> String {
    slot_human(schedule, recipient_zones, at_ms, now_ms, lang)
        .unwrap_or_else(|| super::next_fire_human(at_ms, now_ms, super::zone_of(schedule), lang))
}

fn slot_human(
    schedule: &Schedule,
    recipient_zones: &[String],
    at_ms: u64,
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
    let wall = slot_wall(schedule, &zones, at_ms)?;
    let first = zones
        .iter()
        .copied()
        .min_by_key(|z| instant_in(wall, *z, dst).unwrap_or(u64::MAX))?;
    super::describe::slot_human(wall, now_ms, first, lang)
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

//! Cron schedules: which instants a cron expression fires at, in an IANA zone, under a DST policy.
//!
//! croner matches *wall-clock* times only; it never sees the zone. We hand it naive local times
//! (a `NaiveDateTime` has no gaps or folds), and map every matching wall time to instants with
//! [`resolve_local`], the same function that reads user-written local times. So a cron fire and an
//! `at` in the same zone follow one DST policy, and croner's own DST rules (OCPS: fixed-time jobs
//! shift, interval jobs skip gaps and run twice in folds) never apply.
//!
//! Because a wall time can map to an instant earlier than that of a smaller wall time (the second
//! occurrence of 01:00 comes after the first of 01:30), enumerating wall times in order does not
//! give instants in order. [`CronSchedule::next_after`] therefore scans a window of wall times
//! bounded by the zone's offsets (see there) and keeps the smallest instant.

use chrono::{DateTime, Datelike, NaiveDate, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use croner::errors::CronError;
use croner::parser::{CronParser, Seconds};
use croner::{Cron, Weekday};

use super::local::resolve_local;
use crate::model::DstPolicy;

/// Fires further away than this (from `after`) are not searched for: `next_after` says `None`.
/// Matches the API limit "schedules at most 10 years ahead", and bounds the work for expressions
/// that match rarely or never.
const HORIZON_MS: i64 = 10 * 366 * 24 * 3_600_000;

/// Offsets are looked at over this window after `after` and before a candidate fire. It must
/// exceed the largest offset change in the database (24 h, Pacific/Apia in 2011), and the
/// spread of offsets (-12 h to +14 h), so that instants outside it cannot matter.
const WINDOW_MS: i64 = 26 * 3_600_000;
const HOUR_MS: i64 = 3_600_000;

/// The fields in the order of a 6-field expression, with their ranges, for error messages.
const FIELDS: [(&str, u32, u32); 6] = [
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
];

/// A parsed cron schedule: 5 fields (minute precision) or 6 fields (leading seconds), in an IANA
/// zone with a DST policy.
#[derive(Clone, Debug)]
pub struct CronSchedule {
    /// The expression as given (trimmed), for the fallback description.
    expr: String,
    cron: Cron,
    tz: Tz,
    dst: DstPolicy,
}

impl CronSchedule {
    /// Parses `expr` (5 or 6 whitespace-separated fields; names like `MON` and `JAN`, and croner's
    /// `L`, `W`, `#` and `?` are accepted). Errors are short sentences like
    /// "minute: 61 is out of range 0-59", without the API field path (`schedule.cron`), which the
    /// caller adds.
    pub fn parse(expr: &str, tz: Tz, dst: DstPolicy) -> Result<CronSchedule, String> {
        let fields: Vec<&str> = expr.split_whitespace().collect();
        // croner also takes a 7th (year) field and `@daily`-style nicknames; the API promises
        // 5 or 6 fields, so anything else is refused here rather than half-supported.
        if !(5..=6).contains(&fields.len()) {
            return Err(format!("expected 5 or 6 fields, got {}", fields.len()));
        }
        let specs = FIELDS.get(6 - fields.len()..).unwrap_or_default();
        for (text, spec) in fields.iter().zip(specs) {
            check_numbers(text, *spec)?;
        }
        let cron = parser()
            .parse(expr)
            .map_err(|e| explain(&fields, specs, e))?;
        Ok(CronSchedule {
            expr: fields.join(" "),
            cron,
            tz,
            dst,
        })
    }

    /// The expression as given, fields separated by single spaces.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The zone the expression is read in.
    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// The first fire instant strictly after `after_ms`, or `None` if there is none within
    /// [`HORIZON_MS`] (or at all).
    ///
    /// Wall times are scanned in order, from a lower bound to a stop bound, keeping the smallest
    /// instant. Let `W` be a matching wall time and `i > after` an instant it resolves to, in an
    /// offset run `[start, end)` with offset `off`. Outside gaps `W = i + off`; a gap shifted to
    /// its transition `i` has `W < i + off` and `W >= i + off_before`. Hence:
    /// - `W > max(after, start - 1) + off` for the run holding `i` (or, for a shifted gap, the
    ///   run before it), so the scan starts after the minimum of that over the runs of
    ///   `[after, after + WINDOW]` (an instant further out has a larger `W` anyway);
    /// - once `best` is known, an `i < best` has `W < min(best, end) + off`, so walls at or past
    ///   the maximum of that over the runs of `[after, best]` cannot improve on `best`.
    ///
    /// The runs are the zone's real ones, so outside a fold the scan starts at `after`'s own wall
    /// time and stops at the first fire; near a fold it covers just the walls that can still
    /// resolve into it.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        #[cfg(test)]
        evaluations::count();
        let after = i64::try_from(after_ms).ok()?;
        // Wall times as if they were UTC, in ms. `lower` is exclusive; croner's exclusive search
        // steps to the next whole second, which is exactly "the first wall second > lower".
        let lower = self
            .runs(after, after.checked_add(WINDOW_MS)?)
            .iter()
            .map(|&(start, _, off)| after.max(start - 1) + off)
            .min()?;
        let give_up = lower.checked_add(HORIZON_MS)?;
        let mut cursor = DateTime::from_timestamp_millis(lower)?.naive_utc();
        if !self.some_day_matches(cursor.date(), DateTime::from_timestamp_millis(give_up)?) {
            return None;
        }
        let mut best: Option<i64> = None;
        let mut stop = i64::MAX;
        loop {
            // An error means croner ran out of calendar (year 5000): no further wall times.
            let next = self.cron.find_next_occurrence(&cursor, false);
            let Some(wall) = next.ok().filter(|w| {
                let ms = w.and_utc().timestamp_millis();
                ms < stop && ms <= give_up
            }) else {
                return best.map(|b| b as u64);
            };
            for instant in resolve_local(wall, self.tz, self.dst) {
                let instant = instant as i64;
                if instant > after && best.is_none_or(|b| instant < b) {
                    best = Some(instant);
                    // Instants before `instant - WINDOW` have walls far below this bound.
                    let from = after.max(instant - WINDOW_MS);
                    stop = self
                        .runs(from, instant)
                        .iter()
                        .map(|&(_, end, off)| end.min(instant) + off)
                        .max()?;
                }
            }
            cursor = wall;
        }
    }

    /// A human sentence, e.g. "every weekday at 09:00 (Asia/Shanghai)".
    pub fn describe(&self) -> String {
        self.describe_in(crate::model::Lang::En)
    }

    /// The sentence in `lang` (`describe`'s, in English or Chinese).
    pub fn describe_in(&self, lang: crate::model::Lang) -> String {
        super::describe::cron_sentence(
            Some(self.cron.as_str()),
            &self.expr,
            self.tz,
            self.dst,
            lang,
        )
    }

    /// Whether a date from `from` to `until` satisfies the day, month and weekday fields.
    ///
    /// croner's search for an expression that can never match (31 April) only gives up at year
    /// 5000, about a second of work in a debug build; this date-only scan (at most ~3 660 dates,
    /// usually one) settles "nothing within the horizon" first.
    fn some_day_matches(&self, from: NaiveDate, until: DateTime<Utc>) -> bool {
        let p = &self.cron.pattern;
        from.iter_days()
            .take_while(|d| *d <= until.date_naive())
            .any(|d| {
                let weekday = Weekday::from_days_from_sunday(d.weekday().num_days_from_sunday());
                p.month_match(d.month()).unwrap_or(false)
                    && p.day_match(d.year(), d.month(), d.day(), weekday)
                        .unwrap_or(false)
            })
    }

    /// The runs of constant UTC offset over `[from, to]`: `(start, end, offset)`, all in ms, the
    /// first starting at `from`, the last ending at `to`, the others at exact transitions.
    ///
    /// Samples hourly and bisects where the offset changed, so it assumes a zone never holds an
    /// offset for less than an hour (true of the tz database).
    fn runs(&self, from: i64, to: i64) -> Vec<(i64, i64, i64)> {
        let mut runs = vec![(from, to, self.offset_ms(from))];
        let mut t = from;
        while t < to {
            let next = (t + HOUR_MS).min(to);
            let off = self.offset_ms(next);
            let Some(last) = runs.last_mut() else { break };
            if off != last.2 {
                // The offset is the old one at `lo` and the new one at `hi`.
                let (mut lo, mut hi) = (t, next);
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if self.offset_ms(mid) == off {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                }
                last.1 = hi;
                runs.push((hi, to, off));
            }
            t = next;
        }
        runs
    }

    fn offset_ms(&self, at_ms: i64) -> i64 {
        match DateTime::from_timestamp_millis(at_ms) {
            Some(t) => {
                let off = self.tz.offset_from_utc_datetime(&t.naive_utc());
                i64::from(off.fix().local_minus_utc()) * 1000
            }
            None => 0,
        }
    }
}

/// croner's parser as herald uses it: seconds optional (5 fields get second 0), strict OCPS
/// syntax (no `5/15` shorthand), day of month OR day of week when both are restricted (AND
/// with a `+` before the day of week). Only a literal `*` (or `?`) leaves a day field
/// unrestricted: `*/1` restricts it, so "0 9 */1 * 1" fires every day (Vixie cron took any
/// field starting with `*` as unrestricted).
fn parser() -> CronParser {
    CronParser::builder().seconds(Seconds::Optional).build()
}

/// Checks the plain numbers of one field (values, range ends, steps) so that the common mistakes
/// get a precise message naming the value. Anything else (names, `L`, `W`, `#`) is left to croner.
fn check_numbers(text: &str, (name, lo, hi): (&str, u32, u32)) -> Result<(), String> {
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (item, None),
        };
        if let Some(Ok(step)) = step.map(str::parse::<u32>) {
            if step == 0 {
                return Err(format!("{name}: step must be at least 1"));
            }
        }
        let ends: Vec<Option<u32>> = range.split('-').map(|n| n.parse().ok()).collect();
        for n in ends.iter().flatten() {
            if *n < lo || *n > hi {
                return Err(format!("{name}: {n} is out of range {lo}-{hi}"));
            }
        }
        if let [Some(a), Some(b)] = ends[..] {
            if a > b {
                return Err(format!(
                    "{name}: range {a}-{b} runs backwards (write {a}-{hi},{lo}-{b})"
                ));
            }
        }
    }
    Ok(())
}

/// Turns a croner error into "field: reason": re-parses each field alone (the others `*`) to find
/// the one croner rejects.
fn explain(fields: &[&str], specs: &[(&str, u32, u32)], err: CronError) -> String {
    for (i, (text, (name, _, _))) in fields.iter().zip(specs).enumerate() {
        let mut alone = ["0", "*", "*", "*", "*", "*"];
        if let Some(slot) = alone.get_mut(6usize.saturating_sub(fields.len()) + i) {
            *slot = text;
        }
        if let Err(e) = parser().parse(&alone.join(" ")) {
            return format!("{name}: {}", reason(text, &e));
        }
    }
    reason(&fields.join(" "), &err)
}

fn reason(text: &str, err: &CronError) -> String {
    match err {
        CronError::IllegalCharacters(_) => format!("{text:?} is not a valid value"),
        CronError::ComponentError(msg) | CronError::InvalidPattern(msg) => {
            // croner says e.g. "Range out of bounds." — make it a lower-case clause.
            let msg = msg.trim_end_matches('.');
            let mut chars = msg.chars();
            match chars.next() {
                Some(c) => format!("{}{} in {text:?}", c.to_lowercase(), chars.as_str()),
                None => format!("{text:?} is not a valid value"),
            }
        }
        other => other.to_string(),
    }
}

/// How many times [`CronSchedule::next_after`] ran on this thread (tests bound the work of
/// callers with it, never with a clock).
#[cfg(test)]
pub(crate) mod evaluations {
    use std::cell::Cell;

    thread_local! {
        static COUNT: Cell<u64> = const { Cell::new(0) };
    }

    pub(super) fn count() {
        COUNT.with(|c| c.set(c.get() + 1));
    }

    /// The evaluations `f` made.
    pub(crate) fn of<T>(f: impl FnOnce() -> T) -> (T, u64) {
        let before = COUNT.with(Cell::get);
        let out = f();
        (out, COUNT.with(Cell::get) - before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DstGap, DstRepeat};
    use chrono::NaiveDateTime;

    fn utc(s: &str) -> u64 {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis() as u64
    }

    fn policy(gap: DstGap, repeat: DstRepeat) -> DstPolicy {
        DstPolicy { gap, repeat }
    }

    fn sched(expr: &str, tz: &str, dst: DstPolicy) -> CronSchedule {
        CronSchedule::parse(expr, tz.parse().unwrap(), dst).unwrap()
    }

    /// Every fire in `[from, to)`, by iterating `next_after`.
    fn fires(s: &CronSchedule, from: u64, to: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut t = from - 1;
        while let Some(next) = s.next_after(t) {
            assert!(next > t, "next_after({t}) = {next} is not strictly after");
            if next >= to {
                break;
            }
            out.push(next);
            t = next;
            assert!(out.len() < 100_000, "runaway");
        }
        out
    }

    /// A zone over 2026–2027 written down by hand from the published rules, independent of
    /// chrono-tz: the UTC offset (minutes) before the first transition and after each of the
    /// four transitions (UTC instants).
    struct Model {
        name: &'static str,
        offsets: [i64; 5],
        transitions: [&'static str; 4],
    }

    const NEW_YORK: Model = Model {
        name: "America/New_York",
        // EST -05:00, EDT -04:00; second Sunday of March and first Sunday of November, 02:00 local.
        offsets: [-300, -240, -300, -240, -300],
        transitions: [
            "2026-03-08T07:00:00Z",
            "2026-11-01T06:00:00Z",
            "2027-03-14T07:00:00Z",
            "2027-11-07T06:00:00Z",
        ],
    };

    const BERLIN: Model = Model {
        name: "Europe/Berlin",
        // CET +01:00, CEST +02:00; last Sunday of March and of October, 01:00 UTC.
        offsets: [60, 120, 60, 120, 60],
        transitions: [
            "2026-03-29T01:00:00Z",
            "2026-10-25T01:00:00Z",
            "2027-03-28T01:00:00Z",
            "2027-10-31T01:00:00Z",
        ],
    };

    const LORD_HOWE: Model = Model {
        name: "Australia/Lord_Howe",
        // +11:00 in (southern) summer, +10:30 in winter; first Sunday of April at 02:00 local
        // (back to 01:30) and first Sunday of October at 02:00 local (on to 02:30).
        offsets: [660, 630, 660, 630, 660],
        transitions: [
            "2026-04-04T15:00:00Z",
            "2026-10-03T15:30:00Z",
            "2027-04-03T15:00:00Z",
            "2027-10-02T15:30:00Z",
        ],
    };

    impl Model {
        /// The instants of local wall time `w` under `dst`, from the model alone.
        fn resolve(&self, w: NaiveDateTime, dst: DstPolicy) -> Vec<u64> {
            let w = w.and_utc().timestamp_millis();
            let mut bounds = vec![i64::MIN];
            bounds.extend(self.transitions.iter().map(|t| utc(t) as i64));
            bounds.push(i64::MAX);
            let at = |k: usize| w - self.offsets[k] * 60_000;
            let found: Vec<u64> = (0..5)
                .filter(|&k| bounds[k] <= at(k) && at(k) < bounds[k + 1])
                .map(|k| at(k) as u64)
                .collect();
            match (found.len(), dst.repeat) {
                (0, _) if dst.gap == DstGap::Skip => vec![],
                // In a gap: the wall time is past the transition read with the old offset and
                // before it read with the new one; the fire is the transition itself.
                (0, _) => (1..5)
                    .filter(|&k| at(k - 1) >= bounds[k] && at(k) < bounds[k])
                    .map(|k| bounds[k] as u64)
                    .collect(),
                (2, DstRepeat::First) => vec![found[0]],
                (2, DstRepeat::Last) => vec![found[1]],
                _ => found,
            }
        }

        fn local(&self, s: &str) -> u64 {
            let w = NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M").unwrap();
            self.resolve(w, DstPolicy::default())[0]
        }

        /// Expected fires of "M H * * *" for every local day of 2026 and 2027.
        fn daily(&self, h: u32, m: u32, dst: DstPolicy) -> Vec<u64> {
            let mut day = NaiveDate::from_ymd_opt(2026, 1, 1).unwrap();
            let mut out = Vec::new();
            while day.format("%Y").to_string() != "2028" {
                out.extend(self.resolve(day.and_hms_opt(h, m, 0).unwrap(), dst));
                day = day.succ_opt().unwrap();
            }
            out
        }

        /// Simulates "M H * * *" over local 2026-01-01 00:00 to 2028-01-01 00:00 and checks it
        /// against the model; returns the number of fires.
        fn check_daily(&self, h: u32, m: u32, dst: DstPolicy) -> usize {
            let s = sched(&format!("{m} {h} * * *"), self.name, dst);
            let got = fires(
                &s,
                self.local("2026-01-01T00:00"),
                self.local("2028-01-01T00:00"),
            );
            let want = self.daily(h, m, dst);
            assert_eq!(got, want, "{} {h:02}:{m:02} {dst:?}", self.name);
            got.len()
        }
    }

    const DAYS: usize = 365 + 365;

    #[test]
    fn two_years_daily_default_policy_one_fire_per_day() {
        for zone in [NEW_YORK, BERLIN, LORD_HOWE] {
            for (h, m) in [(9, 0), (2, 30), (1, 30), (2, 15)] {
                assert_eq!(zone.check_daily(h, m, DstPolicy::default()), DAYS);
            }
        }
    }

    #[test]
    fn two_years_gap_skip() {
        let skip = policy(DstGap::Skip, DstRepeat::First);
        // 02:30 falls in the gap in New York and Berlin (02:00–03:00): no fire on two days.
        assert_eq!(NEW_YORK.check_daily(2, 30, skip), DAYS - 2);
        assert_eq!(BERLIN.check_daily(2, 30, skip), DAYS - 2);
        // Lord Howe's gap is only 02:00–02:30: 02:30 exists (it is the transition), 02:15 not.
        assert_eq!(LORD_HOWE.check_daily(2, 30, skip), DAYS);
        assert_eq!(LORD_HOWE.check_daily(2, 15, skip), DAYS - 2);
        for zone in [NEW_YORK, BERLIN, LORD_HOWE] {
            assert_eq!(zone.check_daily(9, 0, skip), DAYS);
        }
    }

    #[test]
    fn two_years_repeat_both_and_last() {
        let both = policy(DstGap::Shift, DstRepeat::Both);
        let last = policy(DstGap::Shift, DstRepeat::Last);
        // Repeated hours: New York 01:00–02:00, Berlin 02:00–03:00, Lord Howe 01:30–02:00.
        assert_eq!(NEW_YORK.check_daily(1, 30, both), DAYS + 2);
        assert_eq!(NEW_YORK.check_daily(2, 30, both), DAYS);
        assert_eq!(BERLIN.check_daily(2, 30, both), DAYS + 2);
        assert_eq!(LORD_HOWE.check_daily(1, 45, both), DAYS + 2);
        assert_eq!(LORD_HOWE.check_daily(1, 15, both), DAYS);
        for zone in [NEW_YORK, BERLIN, LORD_HOWE] {
            assert_eq!(zone.check_daily(9, 0, both), DAYS);
        }
        assert_eq!(NEW_YORK.check_daily(1, 30, last), DAYS);
        assert_eq!(BERLIN.check_daily(2, 30, last), DAYS);
    }

    #[test]
    fn transition_days_by_hand() {
        let next = |expr: &str, tz: &str, dst: DstPolicy, after: &str| {
            sched(expr, tz, dst).next_after(utc(after))
        };
        let d = DstPolicy::default();
        let skip = policy(DstGap::Skip, DstRepeat::First);
        let last = policy(DstGap::Shift, DstRepeat::Last);
        let ny = "America/New_York";
        // 02:30 on 2027-03-14 does not exist in New York: 03:00 EDT = 07:00Z, or the next day.
        let r = next("30 2 * * *", ny, d, "2027-03-14T00:00:00Z");
        assert_eq!(r, Some(utc("2027-03-14T07:00:00Z")));
        let r = next("30 2 * * *", ny, skip, "2027-03-14T00:00:00Z");
        assert_eq!(r, Some(utc("2027-03-15T06:30:00Z")));
        // 01:30 on 2026-11-01 happens at 05:30Z (EDT) and 06:30Z (EST).
        let r = next("30 1 * * *", ny, d, "2026-11-01T00:00:00Z");
        assert_eq!(r, Some(utc("2026-11-01T05:30:00Z")));
        let r = next("30 1 * * *", ny, last, "2026-11-01T00:00:00Z");
        assert_eq!(r, Some(utc("2026-11-01T06:30:00Z")));
        // Berlin: 2026-03-29 02:30 -> 03:00 CEST = 01:00Z; 2026-10-25 02:30 at 00:30Z / 01:30Z.
        let be = "Europe/Berlin";
        let r = next("30 2 * * *", be, d, "2026-03-29T00:00:00Z");
        assert_eq!(r, Some(utc("2026-03-29T01:00:00Z")));
        let r = next("30 2 * * *", be, d, "2026-10-25T00:00:00Z");
        assert_eq!(r, Some(utc("2026-10-25T00:30:00Z")));
        let r = next("30 2 * * *", be, last, "2026-10-25T00:00:00Z");
        assert_eq!(r, Some(utc("2026-10-25T01:30:00Z")));
        // Lord Howe: 2026-10-04 02:00 +10:30 becomes 02:30 +11:00 at 15:30Z the day before.
        let lh = "Australia/Lord_Howe";
        let r = next("30 2 * * *", lh, skip, "2026-10-03T12:00:00Z");
        assert_eq!(r, Some(utc("2026-10-03T15:30:00Z")));
        let r = next("15 2 * * *", lh, d, "2026-10-03T12:00:00Z");
        assert_eq!(r, Some(utc("2026-10-03T15:30:00Z")));
        // 2026-04-05 01:45 happens at 14:45Z (+11:00) and 15:15Z (+10:30).
        let r = next("45 1 * * *", lh, last, "2026-04-04T12:00:00Z");
        assert_eq!(r, Some(utc("2026-04-04T15:15:00Z")));
    }

    fn quarter_hours(tz: &str, dst: DstPolicy, from: &str, to: &str) -> Vec<String> {
        let s = sched("*/15 * * * *", tz, dst);
        fires(&s, utc(from), utc(to))
            .into_iter()
            .map(super::super::format_utc)
            .collect()
    }

    #[test]
    fn every_15_minutes_across_spring_forward() {
        let (from, to) = ("2027-03-14T06:30:00Z", "2027-03-14T07:31:00Z");
        // 02:00–02:45 do not exist; shifted, they all land on 03:00 EDT (07:00Z) with 03:00
        // itself, and fire once there. Skipped, 03:00 still fires.
        let want = [
            "2027-03-14T06:30:00Z",
            "2027-03-14T06:45:00Z",
            "2027-03-14T07:00:00Z",
            "2027-03-14T07:15:00Z",
            "2027-03-14T07:30:00Z",
        ];
        for gap in [DstGap::Shift, DstGap::Skip] {
            let dst = policy(gap, DstRepeat::First);
            assert_eq!(quarter_hours("America/New_York", dst, from, to), want);
        }
        // Lord Howe, 2026-10-04: 02:00 and 02:15 (+10:30) do not exist; 02:30 (+11:00) = 15:30Z.
        let want = [
            "2026-10-03T15:00:00Z",
            "2026-10-03T15:15:00Z",
            "2026-10-03T15:30:00Z",
            "2026-10-03T15:45:00Z",
        ];
        let got = quarter_hours(
            "Australia/Lord_Howe",
            DstPolicy::default(),
            "2026-10-03T15:00:00Z",
            "2026-10-03T16:00:00Z",
        );
        assert_eq!(got, want);
    }

    #[test]
    fn every_15_minutes_across_fall_back() {
        let (from, to) = ("2026-11-01T04:45:00Z", "2026-11-01T07:01:00Z");
        let ny = "America/New_York";
        let at = |hm: &[&str]| -> Vec<String> {
            hm.iter().map(|t| format!("2026-11-01T{t}:00Z")).collect()
        };
        // first: 00:45 EDT, 01:00–01:45 EDT, then 02:00 EST.
        let got = quarter_hours(ny, policy(DstGap::Shift, DstRepeat::First), from, to);
        assert_eq!(
            got,
            at(&["04:45", "05:00", "05:15", "05:30", "05:45", "07:00"])
        );
        // last: 00:45 EDT, then 01:00–01:45 EST, 02:00 EST.
        let got = quarter_hours(ny, policy(DstGap::Shift, DstRepeat::Last), from, to);
        assert_eq!(
            got,
            at(&["04:45", "06:00", "06:15", "06:30", "06:45", "07:00"])
        );
        // both: every quarter hour of real time, in instant order.
        let got = quarter_hours(ny, policy(DstGap::Shift, DstRepeat::Both), from, to);
        let want = at(&[
            "04:45", "05:00", "05:15", "05:30", "05:45", "06:00", "06:15", "06:30", "06:45",
            "07:00",
        ]);
        assert_eq!(got, want);
        // The API's example: */30 with both.
        let s = sched("*/30 * * * *", ny, policy(DstGap::Shift, DstRepeat::Both));
        let got: Vec<String> = fires(&s, utc("2026-11-01T05:00:00Z"), utc(to))
            .into_iter()
            .map(super::super::format_utc)
            .collect();
        assert_eq!(got, at(&["05:00", "05:30", "06:00", "06:30", "07:00"]));
    }

    #[test]
    fn every_10_seconds_through_both_changes_follows_real_time() {
        let ny = "America/New_York";
        let both = policy(DstGap::Shift, DstRepeat::Both);
        // Fall back with `both`: every wall time of the repeated hour fires twice, so the fires
        // are exactly every 10 s of real time, in order, from 00:30 EDT to 02:30 EST.
        let s = sched("*/10 * * * * *", ny, both);
        let (from, to) = (utc("2026-11-01T04:30:00Z"), utc("2026-11-01T07:30:00Z"));
        let got = fires(&s, from, to);
        let want: Vec<u64> = (from..to).step_by(10_000).collect();
        assert_eq!(got, want);
        // With `first` the second pass of 01:00–02:00 EST (06:00Z–07:00Z) is silent.
        let s = sched("*/10 * * * * *", ny, DstPolicy::default());
        let got = fires(&s, from, to);
        let silent = utc("2026-11-01T06:00:00Z")..utc("2026-11-01T07:00:00Z");
        let want: Vec<u64> = want.into_iter().filter(|t| !silent.contains(t)).collect();
        assert_eq!(got, want);
        // Spring forward, shifted: the 360 wall times of 02:00–03:00 all land on 07:00Z and
        // fire once there, then 03:00:10 EDT follows.
        let got = fires(&s, utc("2027-03-14T06:59:50Z"), utc("2027-03-14T07:00:20Z"));
        let want: Vec<u64> = ["06:59:50", "07:00:00", "07:00:10"]
            .iter()
            .map(|t| utc(&format!("2027-03-14T{t}Z")))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn seconds_field() {
        let s = sched("30 * * * * *", "UTC", DstPolicy::default());
        let t = utc("2026-06-01T12:00:30Z");
        // Strictly after: a fire exactly at `after` is not returned, the next one is.
        assert_eq!(s.next_after(t), Some(utc("2026-06-01T12:01:30Z")));
        assert_eq!(s.next_after(t - 1), Some(t));
        assert_eq!(s.next_after(t - 29_999), Some(t));
        let s = sched("*/20 * * * * *", "Asia/Shanghai", DstPolicy::default());
        let got = fires(&s, utc("2026-06-01T00:00:00Z"), utc("2026-06-01T00:01:00Z"));
        let want: Vec<u64> = ["00:00:00", "00:00:20", "00:00:40"]
            .iter()
            .map(|t| utc(&format!("2026-06-01T{t}Z")))
            .collect();
        assert_eq!(got, want);
        // Seconds inside a gap shift to the transition, like minutes do.
        let s = sched("10 30 2 * * *", "America/New_York", DstPolicy::default());
        let r = s.next_after(utc("2027-03-14T00:00:00Z"));
        assert_eq!(r, Some(utc("2027-03-14T07:00:00Z")));
    }

    #[test]
    fn weekdays() {
        // 2026-12-04 is a Friday; 09:00 in Shanghai is 01:00Z.
        let s = sched("0 9 * * 1-5", "Asia/Shanghai", DstPolicy::default());
        let got = fires(&s, utc("2026-12-04T00:00:00Z"), utc("2026-12-09T00:00:00Z"));
        let want: Vec<u64> = ["04", "07", "08"]
            .iter()
            .map(|d| utc(&format!("2026-12-{d}T01:00:00Z")))
            .collect();
        assert_eq!(got, want);
        let s = sched("0 9 * * MON,FRI", "Europe/Berlin", DstPolicy::default());
        let r = s.next_after(utc("2026-12-04T08:00:00Z"));
        assert_eq!(r, Some(utc("2026-12-07T08:00:00Z")));
    }

    #[test]
    fn strictly_after_at_a_fire() {
        let s = sched("0 9 * * *", "America/New_York", DstPolicy::default());
        let fire = utc("2026-07-01T13:00:00Z");
        assert_eq!(s.next_after(fire - 1), Some(fire));
        assert_eq!(s.next_after(fire), Some(utc("2026-07-02T13:00:00Z")));
    }

    #[test]
    fn impossible_and_far_expressions_return_none_quickly() {
        let start = std::time::Instant::now();
        for expr in ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *"] {
            let s = sched(expr, "Europe/Berlin", DstPolicy::default());
            assert_eq!(s.next_after(utc("2026-01-01T00:00:00Z")), None, "{expr}");
        }
        // 29 February on a Monday (`+` = both day fields must match): 2044, beyond 10 years.
        let s = sched("0 0 29 2 +1", "UTC", DstPolicy::default());
        assert_eq!(s.next_after(utc("2026-01-01T00:00:00Z")), None);
        assert_eq!(
            s.next_after(utc("2040-01-01T00:00:00Z")),
            Some(utc("2044-02-29T00:00:00Z"))
        );
        assert!(start.elapsed().as_secs() < 2, "{:?}", start.elapsed());
    }

    #[test]
    fn parse_errors() {
        let err = |e: &str| {
            CronSchedule::parse(e, chrono_tz::UTC, DstPolicy::default())
                .map(|_| ())
                .unwrap_err()
        };
        assert_eq!(err("* * *"), "expected 5 or 6 fields, got 3");
        assert_eq!(err(""), "expected 5 or 6 fields, got 0");
        assert_eq!(err("0 0 0 * * * 2026"), "expected 5 or 6 fields, got 7");
        assert_eq!(err("@daily"), "expected 5 or 6 fields, got 1");
        assert_eq!(err("61 * * * *"), "minute: 61 is out of range 0-59");
        assert_eq!(err("60 * * * * *"), "second: 60 is out of range 0-59");
        assert_eq!(err("0 24 * * *"), "hour: 24 is out of range 0-23");
        assert_eq!(err("0 9 0 * *"), "day of month: 0 is out of range 1-31");
        assert_eq!(err("0 9 * 13 *"), "month: 13 is out of range 1-12");
        assert_eq!(err("0 9 * * 8"), "day of week: 8 is out of range 0-7");
        assert_eq!(err("0 9-70 * * *"), "hour: 70 is out of range 0-23");
        assert_eq!(err("*/0 * * * *"), "minute: step must be at least 1");
        assert_eq!(
            err("0 22-2 * * *"),
            "hour: range 22-2 runs backwards (write 22-23,0-2)"
        );
        assert_eq!(
            err("hello * * * *"),
            "minute: \"hello\" is not a valid value"
        );
        assert_eq!(
            err("0 9 * * MON-XYZ"),
            "day of week: \"MON-XYZ\" is not a valid value"
        );
        // Messages croner words itself still name the field.
        let e = err("0 9 * * 1#6");
        assert!(e.starts_with("day of week: "), "{e}");
        let e = err("5/15 * * * *");
        assert!(e.starts_with("minute: "), "{e}");
        // Good ones, for contrast.
        for ok in [
            "0 9 * * 1-5",
            "*/15 * * * *",
            "30 * * * * *",
            "0 0 L * *",
            "0 9 ? * MON",
        ] {
            CronSchedule::parse(ok, chrono_tz::UTC, DstPolicy::default()).unwrap();
        }
    }
}

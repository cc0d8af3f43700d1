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

use chrono::{DateTime, Offset, TimeZone};
use chrono_tz::Tz;
use croner::errors::CronError;
use croner::parser::{CronParser, Seconds};
use croner::Cron;

use super::local::resolve_local;
use crate::model::DstPolicy;

/// Fires further away than this (from `after`) are not searched for: `next_after` says `None`.
/// Matches the API limit "schedules at most 10 years ahead", and bounds the work for expressions
/// that match rarely or never.
const HORIZON_MS: i64 = 10 * 366 * 24 * 3_600_000;

/// Offsets are sampled hourly over this window around the instants of interest. It must cover
/// the largest offset change in the database (24 h, e.g. Pacific/Apia in 2011) plus a margin.
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
    /// "minute: 61 is out of range 0-59"; the caller adds the field path.
    pub fn parse(expr: &str, tz: Tz, dst: DstPolicy) -> Result<CronSchedule, String> {
        let fields: Vec<&str> = expr.split_whitespace().collect();
        // croner also takes a 7th (year) field and `@daily`-style nicknames; the API promises
        // 5 or 6 fields, so anything else is refused here rather than half-supported.
        if !(5..=6).contains(&fields.len()) {
            return Err(format!("expected 5 or 6 fields, got {}", fields.len()));
        }
        let specs = &FIELDS[6 - fields.len()..];
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

    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// The first fire instant strictly after `after_ms`, or `None` if there is none within
    /// [`HORIZON_MS`] (or at all).
    ///
    /// Let `W` be a matching wall time and `i` an instant it resolves to. Outside gaps
    /// `W = i + off(i)`; for a gap shifted to its transition `i`, `W < i + off(i)` and
    /// `W >= i + off(just before i)`. Hence, with offsets sampled around the instants concerned:
    /// - every `W` with an instant `> after` satisfies `W > after + min_off`, so the scan starts
    ///   there (min over `[after, after + WINDOW]`; an instant further out gives a larger `W`
    ///   anyway, since offsets span less than the window);
    /// - once a candidate `best` is known, no `W > best + max_off` (max over
    ///   `[best - WINDOW, best]`) can resolve to an instant below `best`, so the scan stops there.
    ///
    /// Assumes a zone never holds an offset for less than an hour (true of the tz database), so
    /// hourly samples see every offset.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        let after = i64::try_from(after_ms).ok()?;
        let (min_off, _) = self.offset_range(after, after.checked_add(WINDOW_MS)?);
        // Wall times as if they were UTC, in ms. `lower` is exclusive; croner's exclusive search
        // steps to the next whole second, which is exactly "the first wall second > lower".
        let lower = after + min_off;
        let give_up = lower.checked_add(HORIZON_MS)?;
        let mut cursor = DateTime::from_timestamp_millis(lower)?.naive_utc();
        let mut best: Option<i64> = None;
        let mut stop = i64::MAX;
        loop {
            // Errors mean croner ran out of calendar (year 5000) or found no match: no more fires.
            let wall = self.cron.find_next_occurrence(&cursor, false).ok()?;
            let wall_ms = wall.and_utc().timestamp_millis();
            if wall_ms > stop || wall_ms > give_up {
                return best.map(|b| b as u64);
            }
            for instant in resolve_local(wall, self.tz, self.dst) {
                let instant = instant as i64;
                if instant > after && best.is_none_or(|b| instant < b) {
                    best = Some(instant);
                    let (_, max_off) = self.offset_range(instant - WINDOW_MS, instant);
                    stop = instant + max_off;
                }
            }
            cursor = wall;
        }
    }

    /// A human sentence, e.g. "every weekday at 09:00 (Asia/Shanghai)".
    pub fn describe(&self) -> String {
        super::describe::describe_cron(self.cron.as_str(), &self.expr, self.tz)
    }

    /// Min and max UTC offset (ms) in force at hourly samples from `from` to `to` (both included).
    fn offset_range(&self, from: i64, to: i64) -> (i64, i64) {
        let mut t = from;
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        loop {
            let off = self.offset_ms(t.min(to));
            lo = lo.min(off);
            hi = hi.max(off);
            if t >= to {
                return (lo, hi);
            }
            t += HOUR_MS;
        }
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
/// syntax (no `5/15` shorthand), day-of-month OR day-of-week as in Vixie cron.
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
        alone[6 - fields.len() + i] = text;
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

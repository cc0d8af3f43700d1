//! Reading instants that users write, in a time zone, with an explicit DST policy.
//!
//! A local wall-clock time maps to zero, one or two instants. Zero (spring forward gap):
//! `gap: shift` takes the first valid instant after the gap (the transition itself), `gap: skip`
//! drops it. Two (fall back): `repeat` picks the first, the last, or both.

use chrono::{DateTime, Datelike, LocalResult, NaiveDateTime, TimeZone, Timelike};
use chrono_tz::Tz;

use crate::model::duration::push_digits;
pub use crate::model::instant::format_utc;
use crate::model::instant::push_date_time;
use crate::model::{DstGap, DstPolicy, DstRepeat};

/// Parses an IANA zone name.
pub fn parse_tz(name: &str) -> Result<Tz, String> {
    name.parse::<Tz>().map_err(|_| {
        format!("unknown time zone {name:?} (expected an IANA name like \"Asia/Shanghai\")")
    })
}

/// The instants a local time stands for in `tz` under `dst`, in order (empty when skipped).
pub fn resolve_local(naive: NaiveDateTime, tz: Tz, dst: DstPolicy) -> Vec<u64> {
    match tz.from_local_datetime(&naive) {
        LocalResult::Single(t) => vec![ms(&t)],
        LocalResult::Ambiguous(a, b) => {
            let (a, b) = (ms(&a), ms(&b));
            let (first, last) = (a.min(b), a.max(b));
            match dst.repeat {
                DstRepeat::First => vec![first],
                DstRepeat::Last => vec![last],
                DstRepeat::Both => vec![first, last],
            }
        }
        LocalResult::None => match dst.gap {
            DstGap::Skip => vec![],
            DstGap::Shift => first_valid_after_gap(naive, tz).into_iter().collect(),
        },
    }
}

/// The transition instant that ends a gap containing `naive`: the earliest instant whose local
/// time is later than `naive`. Gaps are at most a few hours and transitions fall on whole
/// minutes in every zone of the database since 1970, so a minute walk finds the end of the gap;
/// the instant found is then the start of the new offset, i.e. the transition.
fn first_valid_after_gap(naive: NaiveDateTime, tz: Tz) -> Option<u64> {
    let mut probe = naive;
    for _ in 0..(26 * 60) {
        probe += chrono::Duration::minutes(1);
        // Truncate to the whole minute so e.g. 02:30:15 lands on 03:00:00, not 03:00:15.
        let minute = probe.with_second(0).and_then(|p| p.with_nanosecond(0))?;
        match tz.from_local_datetime(&minute) {
            LocalResult::Single(t) => return Some(ms(&t)),
            LocalResult::Ambiguous(a, b) => return Some(ms(&a).min(ms(&b))),
            LocalResult::None => {}
        }
    }
    None
}

fn ms<T: TimeZone>(t: &DateTime<T>) -> u64 {
    t.timestamp_millis().max(0) as u64
}

/// Parses an instant: RFC 3339 with an offset, or a local time without offset read in `tz`.
/// Returns the instants it stands for (see [`resolve_local`]).
pub fn parse_instant(s: &str, tz: Option<Tz>, dst: DstPolicy) -> Result<Vec<u64>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        let v = t.timestamp_millis();
        if v < 0 {
            return Err(format!("instant {s:?} is before 1970"));
        }
        return Ok(vec![v as u64]);
    }
    let naive = ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
        .ok_or_else(|| {
            format!("invalid instant {s:?}: expected RFC 3339 like \"2026-12-01T09:00:00+08:00\", or a local time like \"2026-12-01T09:00:00\" with tz")
        })?;
    let Some(tz) = tz else {
        return Err(format!(
            "instant {s:?} has no UTC offset; add one (e.g. \"Z\" or \"+08:00\") or give tz"
        ));
    };
    Ok(resolve_local(naive, tz, dst))
}

/// An optional instant for log lines: RFC 3339, or `none`.
pub fn format_opt(ms: Option<u64>) -> String {
    ms.map_or_else(|| "none".to_string(), format_utc)
}

/// Formats an instant as a local wall time for descriptions: `2026-12-01 09:00`, and the
/// seconds when they are not zero.
pub fn format_local(ms: u64, tz: Tz) -> String {
    match tz.timestamp_millis_opt(ms.min(i64::MAX as u64) as i64) {
        // The fields directly: `format("%Y-…")` parses its pattern on every call, and every
        // create's 201 body has a description.
        LocalResult::Single(t) if (0..=9999).contains(&t.year()) => {
            let mut s = String::with_capacity(19);
            push_date_time(&mut s, &t.naive_local(), ' ');
            if t.second() != 0 {
                s.push(':');
                push_digits(&mut s, t.second().into(), 2);
            }
            s
        }
        LocalResult::Single(t) => {
            let (y, mo, d, h, mi) = (t.year(), t.month(), t.day(), t.hour(), t.minute());
            match t.second() {
                0 => format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}"),
                sec => format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{sec:02}"),
            }
        }
        _ => format_utc(ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::SecondsFormat;
    use chrono::Utc;

    fn utc(s: &str) -> u64 {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis() as u64
    }

    /// The digits written by hand are chrono's RFC 3339 (`AutoSi`, `Z`) and the old
    /// `format!` of the local fields, over instants from 1970 to past 9999 and edge ones.
    #[test]
    fn instants_format_as_chrono_formats_them() {
        let sh = parse_tz("Asia/Shanghai").unwrap();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut cases = vec![
            0,
            1,
            999,
            1_000,
            59_999,
            253_402_300_799_999,
            253_402_300_800_000,
        ];
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(x % 300_000_000_000_000);
            cases.push(x % 300_000_000_000_000 / 1000 * 1000);
        }
        for ms in cases {
            let t = Utc.timestamp_millis_opt(ms as i64).unwrap();
            assert_eq!(
                format_utc(ms),
                t.to_rfc3339_opts(SecondsFormat::AutoSi, true),
                "{ms}"
            );
            for tz in [sh, chrono_tz::UTC] {
                let l = t.with_timezone(&tz);
                let (y, mo, d, h, mi) = (l.year(), l.month(), l.day(), l.hour(), l.minute());
                let want = match l.second() {
                    0 => format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}"),
                    s => format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}"),
                };
                assert_eq!(format_local(ms, tz), want, "{ms} in {tz}");
            }
        }
        assert_eq!(format_utc(u64::MAX), u64::MAX.to_string());
    }

    #[test]
    fn local_wall_times_print_minutes_and_seconds_only_when_set() {
        let sh = parse_tz("Asia/Shanghai").unwrap();
        let t = utc("2026-12-01T01:00:00Z");
        assert_eq!(format_local(t, sh), "2026-12-01 09:00");
        assert_eq!(format_local(t + 5_000, sh), "2026-12-01 09:00:05");
        assert_eq!(
            format_local(t + 5_250, chrono_tz::UTC),
            "2026-12-01 01:00:05"
        );
        assert_eq!(format_local(0, chrono_tz::UTC), "1970-01-01 00:00");
    }

    fn local(s: &str, tz: &str, dst: DstPolicy) -> Vec<u64> {
        parse_instant(s, Some(parse_tz(tz).unwrap()), dst).unwrap()
    }

    #[test]
    fn rfc3339_with_offset() {
        let v = parse_instant("2026-12-01T09:00:00+08:00", None, DstPolicy::default()).unwrap();
        assert_eq!(v, vec![utc("2026-12-01T01:00:00Z")]);
    }

    #[test]
    fn local_time_in_zone() {
        let v = local("2026-12-01T09:00:00", "Asia/Shanghai", DstPolicy::default());
        assert_eq!(v, vec![utc("2026-12-01T01:00:00Z")]);
        let v = local("2026-12-01T09:00", "Asia/Shanghai", DstPolicy::default());
        assert_eq!(v, vec![utc("2026-12-01T01:00:00Z")]);
    }

    #[test]
    fn local_time_without_zone_is_an_error() {
        let e = parse_instant("2026-12-01T09:00:00", None, DstPolicy::default()).unwrap_err();
        assert!(e.contains("offset"), "{e}");
        assert!(parse_instant("tomorrow", None, DstPolicy::default()).is_err());
    }

    #[test]
    fn spring_forward_gap_shifts_to_the_transition() {
        // 2027-03-14 02:30 does not exist in New York; the clocks jump 02:00 EST -> 03:00 EDT.
        let v = local(
            "2027-03-14T02:30:00",
            "America/New_York",
            DstPolicy::default(),
        );
        assert_eq!(v, vec![utc("2027-03-14T07:00:00Z")]);
        let skip = DstPolicy {
            gap: DstGap::Skip,
            ..Default::default()
        };
        assert!(local("2027-03-14T02:30:00", "America/New_York", skip).is_empty());
    }

    #[test]
    fn fall_back_repeat_policies() {
        // 2026-11-01 01:30 happens twice in New York: 05:30Z (EDT) and 06:30Z (EST).
        let (first, second) = (utc("2026-11-01T05:30:00Z"), utc("2026-11-01T06:30:00Z"));
        let p = |repeat| DstPolicy {
            repeat,
            ..Default::default()
        };
        let s = "2026-11-01T01:30:00";
        assert_eq!(
            local(s, "America/New_York", p(DstRepeat::First)),
            vec![first]
        );
        assert_eq!(
            local(s, "America/New_York", p(DstRepeat::Last)),
            vec![second]
        );
        assert_eq!(
            local(s, "America/New_York", p(DstRepeat::Both)),
            vec![first, second]
        );
    }

    #[test]
    fn lord_howe_half_hour_gap() {
        // Lord Howe moves 02:00 -> 02:30 (+10:30 -> +11:00) on 2026-10-04.
        let v = local(
            "2026-10-04T02:15:00",
            "Australia/Lord_Howe",
            DstPolicy::default(),
        );
        assert_eq!(v, vec![utc("2026-10-03T15:30:00Z")]);
    }

    #[test]
    fn formats() {
        assert_eq!(
            format_utc(utc("2026-12-01T01:00:00Z")),
            "2026-12-01T01:00:00Z"
        );
        assert_eq!(
            format_utc(utc("2026-12-01T01:00:00.250Z")),
            "2026-12-01T01:00:00.250Z"
        );
        let sh = parse_tz("Asia/Shanghai").unwrap();
        assert_eq!(
            format_local(utc("2026-12-01T01:00:00Z"), sh),
            "2026-12-01 09:00"
        );
        assert!(parse_tz("Mars/Olympus").is_err());
    }
}

//! When a schedule fires, and how to say it to a person. Pure: no IO, no clock (callers pass
//! `now`).

pub mod cron;
mod describe;
pub mod local;
pub mod misfire;
pub mod plan;
pub mod preview;

pub use cron::CronSchedule;
pub use local::{format_local, format_opt, format_utc, parse_instant, parse_tz, resolve_local};
pub use plan::{mark_fired, minutes_left, next_fire};

use crate::model::{format_duration_ms, Schedule};

/// A human sentence for a schedule, e.g. "once at 2026-12-01 09:00 (Asia/Shanghai)".
pub fn describe(schedule: &Schedule) -> String {
    match schedule {
        Schedule::At { tz, at_ms, .. } => match tz.as_deref().and_then(|t| parse_tz(t).ok()) {
            Some(zone) => format!("once at {} ({})", format_local(*at_ms, zone), zone.name()),
            None => format!("once at {} (UTC)", format_local(*at_ms, chrono_tz::UTC)),
        },
        // Pieces pushed, not `format!`: every create's 201 body has a description.
        Schedule::After {
            after_ms, at_ms, ..
        } => [
            "once, ",
            &format_duration_ms(*after_ms),
            " after creation, at ",
            &format_local(*at_ms, chrono_tz::UTC),
            " (UTC)",
        ]
        .concat(),
        Schedule::Cron { cron, tz, .. } => match plan::cron_of(schedule) {
            Some(c) => c.describe(),
            None => format!("cron {cron:?} ({})", tz.as_deref().unwrap_or("UTC")),
        },
        Schedule::Reminders {
            tz,
            event_ms,
            before_ms,
            ..
        } => {
            let zone = tz
                .as_deref()
                .and_then(|t| parse_tz(t).ok())
                .unwrap_or(chrono_tz::UTC);
            format!(
                "{} before {} ({})",
                offsets_phrase(before_ms),
                format_local(*event_ms, zone),
                zone.name()
            )
        }
    }
}

/// "30, 15 and 5 minutes" / "1h and 1m30s": the offsets in the order given.
fn offsets_phrase(before_ms: &[u64]) -> String {
    let all_minutes = before_ms.iter().all(|o| o % 60_000 == 0);
    let parts: Vec<String> = before_ms
        .iter()
        .map(|o| {
            if all_minutes {
                (o / 60_000).to_string()
            } else {
                format_duration_ms(*o)
            }
        })
        .collect();
    let list = match parts.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    };
    if all_minutes {
        let unit = if before_ms == [60_000] {
            "minute"
        } else {
            "minutes"
        };
        format!("{list} {unit}")
    } else {
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DstPolicy;

    #[test]
    fn describes_one_shots() {
        let at = Schedule::At {
            at: "2026-12-01T09:00:00".into(),
            tz: Some("Asia/Shanghai".into()),
            dst: DstPolicy::default(),
            at_ms: 1_796_086_800_000,
        };
        assert_eq!(describe(&at), "once at 2026-12-01 09:00 (Asia/Shanghai)");
        let after = Schedule::After {
            after: "90m".into(),
            after_ms: 5_400_000,
            at_ms: 1_796_086_800_000,
        };
        assert_eq!(
            describe(&after),
            "once, 1h30m after creation, at 2026-12-01 01:00 (UTC)"
        );
    }

    #[test]
    fn describes_reminders() {
        let r = |before_ms: Vec<u64>| Schedule::Reminders {
            event_at: "2026-12-01T10:00:00".into(),
            tz: Some("Asia/Shanghai".into()),
            dst: DstPolicy::default(),
            event_ms: 1_796_090_400_000,
            before: vec![],
            before_ms,
        };
        assert_eq!(
            describe(&r(vec![1_800_000, 900_000, 300_000])),
            "30, 15 and 5 minutes before 2026-12-01 10:00 (Asia/Shanghai)"
        );
        assert_eq!(
            describe(&r(vec![60_000])),
            "1 minute before 2026-12-01 10:00 (Asia/Shanghai)"
        );
        assert_eq!(
            describe(&r(vec![3_600_000, 90_000])),
            "1h and 1m30s before 2026-12-01 10:00 (Asia/Shanghai)"
        );
    }
}

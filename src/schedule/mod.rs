//! When a schedule fires, and how to say it to a person. Pure: no IO, no clock (callers pass
//! `now`).

pub mod cron;
mod describe;
pub mod local;

pub use cron::CronSchedule;
pub use local::{format_local, format_utc, parse_instant, parse_tz, resolve_local};

use crate::model::{format_duration_ms, Schedule};

/// A human sentence for a schedule, e.g. "once at 2026-12-01 09:00 (Asia/Shanghai)".
pub fn describe(schedule: &Schedule) -> String {
    match schedule {
        Schedule::At { tz, at_ms, .. } => match tz.as_deref().and_then(|t| parse_tz(t).ok()) {
            Some(zone) => format!("once at {} ({})", format_local(*at_ms, zone), zone.name()),
            None => format!("once at {} (UTC)", format_local(*at_ms, chrono_tz::UTC)),
        },
        Schedule::After {
            after_ms, at_ms, ..
        } => format!(
            "once, {} after creation, at {} (UTC)",
            format_duration_ms(*after_ms),
            format_local(*at_ms, chrono_tz::UTC)
        ),
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
}

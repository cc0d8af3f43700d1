//! When a schedule fires, and how to say it to a person. Pure: no IO, no clock (callers pass
//! `now`).

pub mod backfill;
pub mod cron;
mod describe;
pub mod local;
pub mod misfire;
pub mod notify;
pub mod plan;
pub mod preview;
pub mod quiet;
pub mod recipient;

pub use cron::CronSchedule;
pub use local::{format_local, format_opt, format_utc, parse_instant, parse_tz, resolve_local};
pub use plan::{mark_fired, mark_fired_of, minutes_left, next_fire, next_fire_of};

pub use describe::{local_time, next_fire_human, recipient_time, zone_of};

use crate::model::{Lang, Schedule};

/// A human sentence for a schedule in English, e.g. "once at 2026-12-01 09:00 (Asia/Shanghai)".
pub fn describe(schedule: &Schedule) -> String {
    describe::describe(schedule, Lang::En)
}

/// The sentence in `lang`: "every weekday at 09:00 (Asia/Shanghai)" / "每个工作日 09:00（Asia/Shanghai）".
pub fn describe_in(schedule: &Schedule, lang: Lang) -> String {
    describe::describe(schedule, lang)
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

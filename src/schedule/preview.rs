//! Schedule preview: the next fires of a schedule, as `POST /v1/schedules/preview` and the
//! offline `herald next` show them. Pure (`now` is passed in).
//!
//! The schedule is validated by the very code that validates a task creation
//! ([`TaskRequest::into_task`]), so a preview refuses exactly what a create would refuse, with the
//! same field names, and its fires are those [`next_fire`] would plan, one after another.

use chrono_tz::Tz;
use serde::Deserialize;

use super::misfire::{judge, Decision, MISSED_LIST_MAX};
use super::{describe, describe_in, format_utc, mark_fired, next_fire, zone_of};
use crate::model::{Lang, Limits, Schedule, Task};
use crate::request::{
    Context, DstRequest, FieldError, MessageRequest, ScheduleRequest, TaskRequest,
};

/// Fires shown when the request does not say.
pub const PREVIEW_N_DEFAULT: u32 = 5;
/// Most fires one preview shows.
pub const PREVIEW_N_MAX: u32 = 100;

/// The body of `POST /v1/schedules/preview`.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct PreviewRequest {
    pub schedule: ScheduleRequest,
    /// The DST policy; may also be given inside `schedule` (as in a task), not both.
    pub dst: Option<DstRequest>,
    /// How many fires (1–100, default 5).
    pub n: Option<u32>,
}

/// What a preview answers.
#[derive(Debug, Clone)]
pub struct Preview {
    /// In English; [`Preview::description_in`] says it in another language.
    pub description: String,
    /// The schedule as validated.
    pub schedule: Schedule,
    /// The instant the preview was computed at.
    pub now_ms: u64,
    /// The zone local times are shown in (the schedule's, or UTC).
    pub tz: Tz,
    pub fires: Vec<u64>,
    /// The zones of the task the preview stands for (one, UTC, in recipient time).
    pub recipient_zones: Vec<String>,
}

impl Preview {
    /// An instant as RFC 3339 UTC (`Z`).
    pub fn utc(&self, ms: u64) -> String {
        format_utc(ms)
    }

    pub fn description_in(&self, lang: Lang) -> String {
        describe_in(&self.schedule, lang)
    }

    /// A fire relative to the preview's `now` in the schedule's zone: "tomorrow at 09:00
    /// (Asia/Shanghai)"; in recipient time, the slot's wall time (recipient.rs), the first of
    /// its instant (a preview's recipient is in UTC: no gap, no two slots share an instant).
    pub fn human(&self, ms: u64, lang: Lang) -> String {
        let zones = &self.recipient_zones;
        super::recipient::next_fire_human(&self.schedule, zones, (ms, None), self.now_ms, lang)
    }

    /// An instant as RFC 3339 with the offset in force in the schedule's zone.
    pub fn local(&self, ms: u64) -> String {
        local_rfc3339(ms, self.tz)
    }
}

/// RFC 3339 with the zone's offset at that instant, e.g. `2026-03-08T03:00:00-04:00`.
pub fn local_rfc3339(ms: u64, tz: Tz) -> String {
    use chrono::TimeZone;
    match tz.timestamp_millis_opt(ms.min(i64::MAX as u64) as i64) {
        chrono::LocalResult::Single(t) => t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, false),
        _ => format_utc(ms),
    }
}

/// The next `n` fires of the schedule in `req`, validated as a task creation at `now_ms` would
/// validate it. Errors name the field (`schedule.cron`, `schedule.dst.gap`, `n`, `dst`).
pub fn preview(req: PreviewRequest, now_ms: u64, limits: &Limits) -> Result<Preview, FieldError> {
    let n = req.n.unwrap_or(PREVIEW_N_DEFAULT);
    if !(1..=PREVIEW_N_MAX).contains(&n) {
        return Err(FieldError::new(
            "n",
            format!("must be 1 to {PREVIEW_N_MAX}, got {n}"),
        ));
    }
    let mut schedule = req.schedule;
    if let Some(d) = req.dst {
        if schedule.dst.is_some() {
            return Err(FieldError::new(
                "dst",
                "given twice: put the DST policy either in schedule.dst or in dst",
            ));
        }
        schedule.dst = Some(d);
    }
    // A task around the schedule, as small as a create allows: the schedule is all that counts.
    // In recipient time its fires are previewed for a recipient in UTC.
    let default_tz =
        super::recipient::is_recipient(schedule.tz.as_deref()).then(|| "UTC".to_string());
    let probe = TaskRequest {
        id: Some("preview".into()),
        name: None,
        channel: Some("log".into()),
        schedule,
        messages: Some(vec![MessageRequest {
            to: "preview".into(),
            body: "preview".into(),
            data: None,
            tz: None,
        }]),
        to: None,
        body: None,
        pacing: None,
        retry: None,
        misfire: None,
        misfire_grace: None,
        overlap: None,
        metadata: None,
        lang: None,
        default_tz,
        quiet_hours: None,
        notify: None,
        trace_id: None,
    };
    let (mut task, _messages) = probe.into_task(&Context {
        now_ms,
        limits,
        channel_exists: &|_| true,
    })?;
    let mut fires = missed_runs(&mut task, now_ms);
    fires.truncate(n as usize);
    let mut next = task.next_fire_at_ms;
    while let Some(at) = next.filter(|_| fires.len() < n as usize) {
        fires.push(at);
        // As the engine does for each fire: it is handled, a run starts, the next is planned.
        mark_fired(&mut task, at);
        task.runs += 1;
        next = next_fire(&task, now_ms);
    }
    Ok(Preview {
        description: describe(&task.schedule),
        tz: zone_of(&task.schedule),
        fires,
        schedule: task.schedule,
        recipient_zones: task.recipient_zones,
        now_ms,
    })
}

/// The fires of a task created at `now_ms` that are already past (reminders created late, an
/// `at` within its grace): missed, so the engine judges them together by the task's misfire
/// policy (`misfire::judge`, as its first fire step does), and only those it runs are shown.
/// `task` is left as the engine leaves it: they are handled, the next fire planned.
fn missed_runs(task: &mut Task, now_ms: u64) -> Vec<u64> {
    let mut missed = Vec::new();
    while let Some(at) = task.next_fire_at_ms.filter(|at| *at < now_ms) {
        if missed.len() >= MISSED_LIST_MAX {
            break;
        }
        missed.push(at);
        mark_fired(task, at);
        task.next_fire_at_ms = next_fire(task, now_ms);
    }
    let judged = judge(task.misfire, task.misfire_grace_ms, &missed, now_ms);
    let runs: Vec<u64> = judged
        .into_iter()
        .filter_map(|d| match d {
            Decision::Run(at) => Some(at),
            _ => None,
        })
        .collect();
    task.runs += runs.len() as u32;
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: serde_json::Value) -> PreviewRequest {
        serde_json::from_value(v).unwrap()
    }

    const NOW: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    #[test]
    fn cron_fires_in_order_with_description() {
        let p = preview(
            req(serde_json::json!({"schedule": {"cron": "0 9 * * *", "tz": "Asia/Shanghai"}, "n": 3})),
            NOW,
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(p.fires.len(), 3);
        assert_eq!(p.utc(p.fires[0]), "2026-01-01T01:00:00Z");
        assert_eq!(p.local(p.fires[0]), "2026-01-01T09:00:00+08:00");
        assert_eq!(p.fires[1] - p.fires[0], 86_400_000);
        assert!(p.description.contains("09:00"), "{}", p.description);
    }

    #[test]
    fn max_runs_bounds_the_preview() {
        let p = preview(
            req(serde_json::json!({"schedule": {"cron": "*/5 * * * *", "max_runs": 2}, "n": 10})),
            NOW,
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(p.fires.len(), 2);
    }

    #[test]
    fn errors_name_the_field() {
        let e = |v| preview(req(v), NOW, &Limits::default()).unwrap_err().field;
        assert_eq!(
            e(serde_json::json!({"schedule": {"cron": "0 9 *"}})),
            "schedule.cron"
        );
        assert_eq!(
            e(serde_json::json!({"schedule": {"cron": "0 9 * * *"}, "n": 0})),
            "n"
        );
        assert_eq!(
            e(serde_json::json!({"schedule": {"cron": "0 9 * * *", "dst": {}}, "dst": {}})),
            "dst"
        );
        assert_eq!(
            e(serde_json::json!({"schedule": {"cron": "0 9 * * *"}, "dst": {"gap": "x"}})),
            "schedule.dst.gap"
        );
    }
}

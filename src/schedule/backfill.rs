//! Backfill (API.md "Missed runs and backfill"): the slots of a task's schedule in a range that
//! have no completed run, in slot order. Pure: the caller passes the instants of the task's
//! completed runs.

use std::collections::BTreeSet;

use crate::model::{Schedule, TaskSpec};

use super::plan::cron_of;
use super::recipient::{is_recipient, next_slot, parse_zones, wall_cron};

/// Most slots one backfill may cover; a range with more is refused (422), not cut short.
pub const BACKFILL_SLOTS_MAX: usize = 1_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackfillError {
    /// `to` is before `from`.
    Backwards,
    /// The range holds more than [`BACKFILL_SLOTS_MAX`] slots.
    TooMany,
}

/// Every slot of `task`'s schedule in `[from_ms, to_ms]`, ascending, counting all of them
/// against the bound (a slot that already has a completed run is still a slot of the range).
pub fn slots(task: &TaskSpec, from_ms: u64, to_ms: u64) -> Result<Vec<u64>, BackfillError> {
    if to_ms < from_ms {
        return Err(BackfillError::Backwards);
    }
    let mut out = Vec::new();
    let mut push = |t: u64| -> Result<(), BackfillError> {
        if (from_ms..=to_ms).contains(&t) {
            if out.len() == BACKFILL_SLOTS_MAX {
                return Err(BackfillError::TooMany);
            }
            out.push(t);
        }
        Ok(())
    };
    match &task.schedule {
        Schedule::At { at_ms, .. } | Schedule::After { at_ms, .. } => push(*at_ms)?,
        Schedule::Reminders {
            event_ms,
            before_ms,
            ..
        } => {
            let mut at: Vec<u64> = before_ms
                .iter()
                .map(|b| event_ms.saturating_sub(*b))
                .collect();
            at.sort_unstable();
            for t in at {
                push(t)?;
            }
        }
        Schedule::Cron {
            tz,
            dst,
            start_ms,
            end_ms,
            ..
        } => {
            let lo = from_ms.max(start_ms.unwrap_or(0));
            let hi = to_ms.min(end_ms.unwrap_or(u64::MAX));
            let mut after = lo.saturating_sub(1);
            if is_recipient(tz.as_deref()) {
                let Some(cron) = wall_cron(&task.schedule) else {
                    return Ok(out);
                };
                let zones = parse_zones(&task.recipient_zones);
                while let Some((_, t)) = next_slot(&cron, &zones, *dst, after) {
                    if t > hi {
                        break;
                    }
                    push(t)?;
                    after = t;
                }
            } else {
                let Some(cron) = cron_of(&task.schedule) else {
                    return Ok(out);
                };
                while let Some(t) = cron.next_after(after) {
                    if t > hi {
                        break;
                    }
                    push(t)?;
                    after = t;
                }
            }
        }
    }
    Ok(out)
}

/// The slots of the range to backfill: those without a completed run (`completed`: the
/// scheduled instants of the task's completed runs).
pub fn to_backfill(
    task: &TaskSpec,
    from_ms: u64,
    to_ms: u64,
    completed: &BTreeSet<u64>,
) -> Result<Vec<u64>, BackfillError> {
    Ok(slots(task, from_ms, to_ms)?
        .into_iter()
        .filter(|t| !completed.contains(t))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

    fn task(v: serde_json::Value) -> TaskSpec {
        crate::request::test_task(v, NOW).split().0
    }

    #[test]
    fn slots_without_a_completed_run_in_order_and_bounded() {
        let t = task(
            serde_json::json!({"schedule": {"cron": "*/15 * * * *"}, "to": ["a"], "body": "b"}),
        );
        let m = 60_000;
        let all = slots(&t, NOW, NOW + 60 * m).unwrap();
        assert_eq!(
            all,
            vec![NOW, NOW + 15 * m, NOW + 30 * m, NOW + 45 * m, NOW + 60 * m]
        );
        let done = BTreeSet::from([NOW, NOW + 60 * m]);
        assert_eq!(
            to_backfill(&t, NOW, NOW + 60 * m, &done).unwrap(),
            vec![NOW + 15 * m, NOW + 30 * m, NOW + 45 * m]
        );
        // 1 000 slots of 15 minutes fit; 1 001 do not.
        assert_eq!(slots(&t, NOW, NOW + 999 * 15 * m).unwrap().len(), 1_000);
        assert_eq!(
            slots(&t, NOW, NOW + 1_000 * 15 * m),
            Err(BackfillError::TooMany)
        );
        assert_eq!(slots(&t, NOW + 1, NOW), Err(BackfillError::Backwards));
    }
}

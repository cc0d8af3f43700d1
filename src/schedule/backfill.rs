//! Backfill (API.md "Missed runs and backfill"): the slots of a task's schedule in a range that
//! have no completed run, in slot order. Pure: the caller passes what the task has handled
//! ([`Handled`]: its progress and the run records the store still keeps).

use std::collections::BTreeSet;

use crate::model::{Run, RunState, Schedule, TaskProgress, TaskSpec};

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
    /// `to` is after [`Handled::latest`]: later slots are the schedule's own to send.
    Ahead { latest: u64 },
    /// A slot of the range without a run record is at or before [`Handled::unknown_through`]:
    /// it may have been sent by a run whose record was trimmed.
    Trimmed { through: u64 },
    /// The range has more slots to backfill (`slots`) than the cron's `max_runs` (`max`)
    /// leaves runs for (`left`): a backfilled run counts toward it like any other, so the
    /// range is refused rather than cut short, as for [`BackfillError::TooMany`].
    MaxRuns { slots: usize, left: u32, max: u32 },
}

/// What a task has handled already, as far as backfill needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// Slots with a completed or running run, or a fire queued to run: never backfilled.
    pub done: BTreeSet<u64>,
    /// Slots with a run record of any state (a skipped or expired one says it was not sent).
    pub recorded: BTreeSet<u64>,
    /// The latest instant a backfilled slot may be: now, and before the schedule's next fire,
    /// which the schedule handles itself (a paused task's missed ones at resume, by its misfire
    /// policy): a slot backfilled there would be sent twice.
    pub latest: u64,
    /// Set when the record of a run that started is gone (history trimmed to `[store]
    /// runs_max`): its slot is at or before this instant, and which slot it was is lost, so a
    /// slot up to here without a record may have been sent already.
    pub unknown_through: Option<u64>,
    /// Runs started or queued to start (`plan::runs_committed`): what a cron's `max_runs`
    /// bounds, backfilled runs included.
    pub committed: u32,
}

impl Handled {
    /// From the task's progress and the run records kept (`runs`); `lead_ms`: how far ahead
    /// of its slot a fire step may run (a run's number may be given before its slot).
    pub fn of(runs: &[Run], p: &TaskProgress, now: u64, lead_ms: u64) -> Handled {
        let mut done: BTreeSet<u64> = runs
            .iter()
            .filter(|r| matches!(r.state, RunState::Completed | RunState::Running))
            .map(|r| r.scheduled_at_ms)
            .collect();
        done.extend(p.queued.iter().map(|q| q.at_ms));
        // `runs` counts every run started (an expired one given back); one not kept is lost.
        let started = runs.iter().filter(|r| was_started(&r.state)).count();
        let lost = usize::try_from(p.runs).map_or(true, |n| n > started);
        Handled {
            done,
            recorded: runs.iter().map(|r| r.scheduled_at_ms).collect(),
            latest: p
                .next_fire_at_ms
                .map_or(now, |n| now.min(n.saturating_sub(1))),
            unknown_through: lost.then(|| numbered_by(runs, p, now).saturating_add(lead_ms)),
            committed: super::plan::runs_committed(p),
        }
    }
}

fn was_started(s: &RunState) -> bool {
    matches!(
        s,
        RunState::Running | RunState::Completed | RunState::Cancelled
    )
}

/// An instant by which every run whose record is gone had its number: numbers are given in
/// order, and the highest number without a record (nor a queued fire) bounds the lost ones;
/// every record above it started no earlier than its number was given. Now if none.
fn numbered_by(runs: &[Run], p: &TaskProgress, now: u64) -> u64 {
    let mut have: BTreeSet<u32> = runs.iter().map(|r| r.run).collect();
    have.extend(p.queued.iter().map(|q| q.run));
    let gap = (1..=p.fires).rev().find(|n| !have.contains(n)).unwrap_or(0);
    runs.iter()
        .filter(|r| r.run > gap)
        .map(|r| r.started_at_ms)
        .min()
        .unwrap_or(now)
        .min(now)
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

/// The slots of the range to backfill: those the task has not handled (`h.done`). Refused
/// rather than cut short: a `to` after `h.latest`, a slot without a record that a trimmed
/// run may have sent (never sent twice), and more slots than a cron's `max_runs` leaves runs
/// for (a backfilled run counts toward it as a fire's does).
pub fn to_backfill(
    task: &TaskSpec,
    from_ms: u64,
    to_ms: u64,
    h: &Handled,
) -> Result<Vec<u64>, BackfillError> {
    if to_ms >= from_ms && to_ms > h.latest {
        return Err(BackfillError::Ahead { latest: h.latest });
    }
    let fresh: Vec<u64> = slots(task, from_ms, to_ms)?
        .into_iter()
        .filter(|t| !h.done.contains(t))
        .collect();
    if let Some(through) = h.unknown_through {
        if fresh
            .iter()
            .any(|t| *t <= through && !h.recorded.contains(t))
        {
            return Err(BackfillError::Trimmed { through });
        }
    }
    if let Schedule::Cron {
        max_runs: Some(max),
        ..
    } = &task.schedule
    {
        let left = max.saturating_sub(h.committed);
        if fresh.len() > usize::try_from(left).unwrap_or(usize::MAX) {
            return Err(BackfillError::MaxRuns {
                slots: fresh.len(),
                left,
                max: *max,
            });
        }
    }
    Ok(fresh)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z
    const M: u64 = 60_000;

    fn task(v: serde_json::Value) -> TaskSpec {
        crate::request::test_task(v, NOW).split().0
    }

    fn every_15() -> TaskSpec {
        task(serde_json::json!({"schedule": {"cron": "*/15 * * * *"}, "to": ["a"], "body": "b"}))
    }

    /// Nothing handled; backfill may take slots up to `latest`.
    fn nothing(latest: u64) -> Handled {
        Handled {
            done: BTreeSet::new(),
            recorded: BTreeSet::new(),
            latest,
            unknown_through: None,
            committed: 0,
        }
    }

    fn run(n: u32, at: u64, state: RunState) -> Run {
        Run {
            state,
            ..Run::new(n, at, at, 1)
        }
    }

    #[test]
    fn slots_without_a_completed_run_in_order_and_bounded() {
        let t = every_15();
        let all = slots(&t, NOW, NOW + 60 * M).unwrap();
        assert_eq!(
            all,
            vec![NOW, NOW + 15 * M, NOW + 30 * M, NOW + 45 * M, NOW + 60 * M]
        );
        let h = Handled {
            done: BTreeSet::from([NOW, NOW + 60 * M]),
            ..nothing(NOW + 60 * M)
        };
        assert_eq!(
            to_backfill(&t, NOW, NOW + 60 * M, &h).unwrap(),
            vec![NOW + 15 * M, NOW + 30 * M, NOW + 45 * M]
        );
        // 1 000 slots of 15 minutes fit; 1 001 do not.
        assert_eq!(slots(&t, NOW, NOW + 999 * 15 * M).unwrap().len(), 1_000);
        assert_eq!(
            slots(&t, NOW, NOW + 1_000 * 15 * M),
            Err(BackfillError::TooMany)
        );
        assert_eq!(slots(&t, NOW + 1, NOW), Err(BackfillError::Backwards));
    }

    #[test]
    fn a_to_past_now_or_at_the_next_fire_is_refused() {
        let t = every_15();
        let p = crate::request::test_task(
            serde_json::json!({"schedule": {"cron": "*/15 * * * *"}, "to": ["a"], "body": "b"}),
            NOW,
        )
        .split()
        .1;
        // Pending, next fire at 00:15, now 00:10: slots after now are the schedule's.
        let mut p = TaskProgress {
            next_fire_at_ms: Some(NOW + 15 * M),
            ..p
        };
        let h = Handled::of(&[], &p, NOW + 10 * M, 0);
        assert_eq!(h.latest, NOW + 10 * M);
        assert_eq!(to_backfill(&t, NOW, NOW + 10 * M, &h), Ok(vec![NOW]));
        assert_eq!(
            to_backfill(&t, NOW, NOW + 10 * M + 1, &h),
            Err(BackfillError::Ahead {
                latest: NOW + 10 * M
            })
        );
        // Paused over 00:15: that fire is the schedule's, judged at resume.
        let h = Handled::of(&[], &p, NOW + 20 * M, 0);
        assert_eq!(h.latest, NOW + 15 * M - 1);
        assert!(matches!(
            to_backfill(&t, NOW, NOW + 15 * M, &h),
            Err(BackfillError::Ahead { .. })
        ));
        // A schedule that never fires again: up to now.
        p.next_fire_at_ms = None;
        assert_eq!(Handled::of(&[], &p, NOW + 20 * M, 0).latest, NOW + 20 * M);
    }

    #[test]
    fn a_slot_a_trimmed_run_may_have_sent_is_refused_not_sent_again() {
        let t = every_15();
        let base = crate::request::test_task(
            serde_json::json!({"schedule": {"cron": "*/15 * * * *"}, "to": ["a"], "body": "b"}),
            NOW,
        )
        .split()
        .1;
        // Six fires 00:00 … 01:15, every one run; the records of runs 1-3 were trimmed.
        let p = TaskProgress {
            runs: 6,
            fires: 6,
            last_fire_ms: Some(NOW + 75 * M),
            next_fire_at_ms: Some(NOW + 90 * M),
            ..base
        };
        let kept: Vec<Run> = (4..=6)
            .map(|n| run(n, NOW + u64::from(n - 1) * 15 * M, RunState::Completed))
            .collect();
        let now = NOW + 80 * M;
        let h = Handled::of(&kept, &p, now, 100);
        assert_eq!(h.unknown_through, Some(NOW + 45 * M + 100));
        assert_eq!(
            to_backfill(&t, NOW, NOW + 30 * M, &h),
            Err(BackfillError::Trimmed {
                through: NOW + 45 * M + 100
            })
        );
        // After the trimmed stretch the records decide: all sent, nothing to do.
        assert_eq!(to_backfill(&t, NOW + 45 * M, now, &h), Ok(vec![]));
        // The same history kept whole: the records decide everywhere.
        let mut all = kept.clone();
        all.extend((1..=3).map(|n| run(n, NOW + u64::from(n - 1) * 15 * M, RunState::Completed)));
        let h = Handled::of(&all, &p, now, 100);
        assert_eq!(h.unknown_through, None);
        assert_eq!(to_backfill(&t, NOW, now, &h), Ok(vec![]));
        // Run 2 expired (its record kept) and run 1's record trimmed: 00:15 is backfilled,
        // 00:00 is refused.
        let p = TaskProgress {
            runs: 5,
            expired: 1,
            ..p
        };
        all.retain(|r| r.run != 1 && r.run != 2);
        all.push(run(2, NOW + 15 * M, RunState::Expired));
        let h = Handled::of(&all, &p, now, 100);
        assert_eq!(
            to_backfill(&t, NOW + 15 * M, now, &h),
            Ok(vec![NOW + 15 * M])
        );
        assert!(matches!(
            to_backfill(&t, NOW, now, &h),
            Err(BackfillError::Trimmed { .. })
        ));
    }

    /// Review finding: backfilled runs did not count toward `max_runs`, so a backfill took a
    /// cron past it. A range with more slots than runs left is refused; as many is accepted.
    #[test]
    fn a_backfill_never_takes_a_cron_past_its_max_runs() {
        let t = task(
            serde_json::json!({"schedule": {"cron": "*/15 * * * *", "max_runs": 3},
            "to": ["a"], "body": "b"}),
        );
        let h = Handled {
            committed: 1,
            ..nothing(NOW + 60 * M)
        };
        assert_eq!(
            to_backfill(&t, NOW, NOW + 30 * M, &h),
            Err(BackfillError::MaxRuns {
                slots: 3,
                left: 2,
                max: 3
            })
        );
        assert_eq!(
            to_backfill(&t, NOW, NOW + 15 * M, &h),
            Ok(vec![NOW, NOW + 15 * M])
        );
        // Slots already handled are not runs to come: only the fresh ones count.
        let h = Handled {
            done: BTreeSet::from([NOW]),
            ..h
        };
        assert_eq!(
            to_backfill(&t, NOW, NOW + 30 * M, &h),
            Ok(vec![NOW + 15 * M, NOW + 30 * M])
        );
    }
}

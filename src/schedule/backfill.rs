//! Backfill (API.md "Missed runs and backfill"): the slots of a task's schedule in a range that
//! have no completed run, in slot order. Pure: the caller passes what the task has handled
//! ([`Handled`]: its progress and the run records the store still keeps).
//!
//! A slot of a cron in recipient time is known by its wall (`recipient.rs`): slots sharing a
//! run instant (a gap in the earliest zone) are each a slot of the range, matched against the
//! runs and queued fires that carry their wall, and each backfilled one carries it to its run
//! (its later zones' messages go at that slot's wall). A record without a wall (from before
//! walls) is matched by its instant, as is every slot of any other schedule.

use std::collections::BTreeSet;

use crate::model::{Run, RunState, Schedule, TaskProgress, TaskSpec};

use super::plan::cron_of;
use super::recipient::{is_recipient, next_slot, parse_zones, slot_after_wall, wall_cron, SPAN_MS};

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

/// A slot of a range: its run instant and, for a cron in recipient time, its wall (ms as if
/// UTC, `recipient.rs`), which tells slots sharing an instant apart; `None` for any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub at_ms: u64,
    pub wall_ms: Option<u64>,
}

impl Slot {
    /// A slot known by its instant alone (any schedule not in recipient time).
    pub fn at(at_ms: u64) -> Slot {
        Slot {
            at_ms,
            wall_ms: None,
        }
    }
}

/// The slots a task's run records (or queued fires) name: each by its wall when it carries
/// one, else by its instant.
///
/// A record without a wall (written by a build from before walls) names every slot of its
/// instant. That is conservative, never a second send, but it has a cost: of slots tied at
/// one instant (a DST gap of the earliest zone) such a build ran only the first and skipped
/// the others, and those others can never be backfilled while its record is kept (each is
/// taken as handled by it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    /// Every mark's instant: what a slot without a wall is matched by, as before walls.
    instants: BTreeSet<u64>,
    /// The instants of the marks without a wall (records from before walls, triggers): a slot
    /// with a wall at one of them is matched, as all slots of that instant were before walls.
    bare: BTreeSet<u64>,
    /// The walls of the marks with one.
    walls: BTreeSet<u64>,
}

impl Marks {
    /// From `(instant, wall)` pairs (`Run::slot_wall_ms`, `Queued::wall_ms`).
    pub fn of(marks: impl IntoIterator<Item = (u64, Option<u64>)>) -> Marks {
        let mut m = Marks::default();
        for (at, wall) in marks {
            m.instants.insert(at);
            match wall {
                Some(w) => m.walls.insert(w),
                None => m.bare.insert(at),
            };
        }
        m
    }

    /// Whether a mark names `slot`: by its wall when the slot has one (or by a mark without a
    /// wall at its instant), else by its instant.
    pub fn has(&self, slot: &Slot) -> bool {
        match slot.wall_ms {
            Some(w) => self.walls.contains(&w) || self.bare.contains(&slot.at_ms),
            None => self.instants.contains(&slot.at_ms),
        }
    }
}

/// What a task has handled already, as far as backfill needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// Slots with a completed or running run, or a fire queued to run: never backfilled.
    pub done: Marks,
    /// Slots with a run record of any state (a skipped or expired one says it was not sent).
    pub recorded: Marks,
    /// The latest instant a backfilled slot may be: now, and before the schedule's next fire,
    /// which the schedule handles itself (a paused task's missed ones at resume, by its misfire
    /// policy): a slot backfilled there would be sent twice.
    pub latest: u64,
    /// Set when the record of a run that started is gone (history trimmed to `[store]
    /// runs_max`): its slot is at or before this instant, and which slot it was is lost, so a
    /// slot up to here without a record may have been sent already. In recipient time an
    /// instant under the zones of then: [`to_backfill`] widens it by `recipient::SPAN_MS`.
    pub unknown_through: Option<u64>,
    /// Runs started or queued to start (`plan::runs_committed`): what a cron's `max_runs`
    /// bounds, backfilled runs included.
    pub committed: u32,
}

impl Handled {
    /// From the task's progress and the run records kept (`runs`); `lead_ms`: how far ahead
    /// of its slot a fire step may run (a run's number may be given before its slot).
    pub fn of(runs: &[Run], p: &TaskProgress, now: u64, lead_ms: u64) -> Handled {
        let done = Marks::of(
            runs.iter()
                .filter(|r| matches!(r.state, RunState::Completed | RunState::Running))
                .map(|r| (r.scheduled_at_ms, r.slot_wall_ms))
                .chain(p.queued.iter().map(|q| (q.at_ms, q.wall_ms))),
        );
        // `runs` counts every run started (an expired one given back); one not kept is lost.
        let started = runs.iter().filter(|r| was_started(&r.state)).count();
        let lost = usize::try_from(p.runs).map_or(true, |n| n > started);
        Handled {
            done,
            recorded: Marks::of(runs.iter().map(|r| (r.scheduled_at_ms, r.slot_wall_ms))),
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
pub fn slots(task: &TaskSpec, from_ms: u64, to_ms: u64) -> Result<Vec<Slot>, BackfillError> {
    if to_ms < from_ms {
        return Err(BackfillError::Backwards);
    }
    let mut out = Vec::new();
    let mut push = |s: Slot| -> Result<(), BackfillError> {
        if (from_ms..=to_ms).contains(&s.at_ms) {
            if out.len() == BACKFILL_SLOTS_MAX {
                return Err(BackfillError::TooMany);
            }
            out.push(s);
        }
        Ok(())
    };
    match &task.schedule {
        Schedule::At { at_ms, .. } | Schedule::After { at_ms, .. } => push(Slot::at(*at_ms))?,
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
                push(Slot::at(t))?;
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
                // By wall, as the schedule goes (`recipient.rs`): the first slot from `lo`
                // (the first wall of its instant), then each cron wall after the last that
                // runs no earlier than it, so slots sharing an instant are each listed.
                let mut next = next_slot(&cron, &zones, *dst, after);
                while let Some((wall, t)) = next.filter(|(_, t)| *t <= hi) {
                    push(Slot {
                        at_ms: t,
                        wall_ms: Some(wall),
                    })?;
                    next = slot_after_wall(&cron, &zones, *dst, wall, Some(t));
                }
            } else {
                let Some(cron) = cron_of(&task.schedule) else {
                    return Ok(out);
                };
                while let Some(t) = cron.next_after(after) {
                    if t > hi {
                        break;
                    }
                    push(Slot::at(t))?;
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
) -> Result<Vec<Slot>, BackfillError> {
    if to_ms >= from_ms && to_ms > h.latest {
        return Err(BackfillError::Ahead { latest: h.latest });
    }
    let fresh: Vec<Slot> = slots(task, from_ms, to_ms)?
        .into_iter()
        .filter(|s| !h.done.has(s))
        .collect();
    // In recipient time `unknown_through` is a run instant under the zones of its day: a
    // change of the zones since (the earliest one removed) moves every slot's instant later,
    // up to a span of offsets, so a trimmed run's slot may now run after it. Widened by that
    // span, the bound still covers every slot a trimmed run may have sent.
    let shift = if task.recipient_zones.is_empty() {
        0
    } else {
        SPAN_MS
    };
    if let Some(through) = h.unknown_through.map(|t| t.saturating_add(shift)) {
        if fresh
            .iter()
            .any(|s| s.at_ms <= through && !h.recorded.has(s))
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
            done: Marks::default(),
            recorded: Marks::default(),
            latest,
            unknown_through: None,
            committed: 0,
        }
    }

    /// The instants of slots (or the error), for schedules whose slots have no wall.
    fn instants(r: Result<Vec<Slot>, BackfillError>) -> Result<Vec<u64>, BackfillError> {
        r.map(|v| {
            assert!(v.iter().all(|s| s.wall_ms.is_none()), "{v:?}");
            v.into_iter().map(|s| s.at_ms).collect()
        })
    }

    fn slots_at(t: &TaskSpec, from: u64, to: u64) -> Result<Vec<u64>, BackfillError> {
        instants(slots(t, from, to))
    }

    fn backfill_at(
        t: &TaskSpec,
        from: u64,
        to: u64,
        h: &Handled,
    ) -> Result<Vec<u64>, BackfillError> {
        instants(to_backfill(t, from, to, h))
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
        let all = slots_at(&t, NOW, NOW + 60 * M).unwrap();
        assert_eq!(
            all,
            vec![NOW, NOW + 15 * M, NOW + 30 * M, NOW + 45 * M, NOW + 60 * M]
        );
        let h = Handled {
            done: Marks::of([(NOW, None), (NOW + 60 * M, None)]),
            ..nothing(NOW + 60 * M)
        };
        assert_eq!(
            backfill_at(&t, NOW, NOW + 60 * M, &h).unwrap(),
            vec![NOW + 15 * M, NOW + 30 * M, NOW + 45 * M]
        );
        // 1 000 slots of 15 minutes fit; 1 001 do not.
        assert_eq!(slots_at(&t, NOW, NOW + 999 * 15 * M).unwrap().len(), 1_000);
        assert_eq!(
            slots_at(&t, NOW, NOW + 1_000 * 15 * M),
            Err(BackfillError::TooMany)
        );
        assert_eq!(slots_at(&t, NOW + 1, NOW), Err(BackfillError::Backwards));
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
        assert_eq!(backfill_at(&t, NOW, NOW + 10 * M, &h), Ok(vec![NOW]));
        assert_eq!(
            backfill_at(&t, NOW, NOW + 10 * M + 1, &h),
            Err(BackfillError::Ahead {
                latest: NOW + 10 * M
            })
        );
        // Paused over 00:15: that fire is the schedule's, judged at resume.
        let h = Handled::of(&[], &p, NOW + 20 * M, 0);
        assert_eq!(h.latest, NOW + 15 * M - 1);
        assert!(matches!(
            backfill_at(&t, NOW, NOW + 15 * M, &h),
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
            backfill_at(&t, NOW, NOW + 30 * M, &h),
            Err(BackfillError::Trimmed {
                through: NOW + 45 * M + 100
            })
        );
        // After the trimmed stretch the records decide: all sent, nothing to do.
        assert_eq!(backfill_at(&t, NOW + 45 * M, now, &h), Ok(vec![]));
        // The same history kept whole: the records decide everywhere.
        let mut all = kept.clone();
        all.extend((1..=3).map(|n| run(n, NOW + u64::from(n - 1) * 15 * M, RunState::Completed)));
        let h = Handled::of(&all, &p, now, 100);
        assert_eq!(h.unknown_through, None);
        assert_eq!(backfill_at(&t, NOW, now, &h), Ok(vec![]));
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
            backfill_at(&t, NOW + 15 * M, now, &h),
            Ok(vec![NOW + 15 * M])
        );
        assert!(matches!(
            backfill_at(&t, NOW, now, &h),
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
            backfill_at(&t, NOW, NOW + 30 * M, &h),
            Err(BackfillError::MaxRuns {
                slots: 3,
                left: 2,
                max: 3
            })
        );
        assert_eq!(
            backfill_at(&t, NOW, NOW + 15 * M, &h),
            Ok(vec![NOW, NOW + 15 * M])
        );
        // Slots already handled are not runs to come: only the fresh ones count.
        let h = Handled {
            done: Marks::of([(NOW, None)]),
            ..h
        };
        assert_eq!(
            backfill_at(&t, NOW, NOW + 30 * M, &h),
            Ok(vec![NOW + 15 * M, NOW + 30 * M])
        );
    }

    /// An instant or a wall time (ms as if UTC) from RFC 3339.
    fn utc(s: &str) -> u64 {
        crate::schedule::parse_instant(s, None, crate::model::DstPolicy::default()).unwrap()[0]
    }

    /// Every half hour from 01:00 to 03:30 in recipient time, for Berlin and New York. Berlin
    /// springs forward at 02:00 on 28 March 2027: its 02:00, 02:30 and 03:00 are all 01:00Z,
    /// one run instant for three slots (`recipient.rs`); New York (EDT) has each at its own.
    fn gap() -> (crate::model::Task, [Slot; 3]) {
        let t = crate::request::test_task(
            serde_json::json!({"schedule": {"cron": "*/30 1-3 * * *", "tz": "recipient"},
            "messages": [{"to": "b", "body": "x", "tz": "Europe/Berlin"},
                         {"to": "n", "body": "y", "tz": "America/New_York"}]}),
            utc("2027-03-28T01:10:00Z"),
        );
        let at = utc("2027-03-28T01:00:00Z");
        let tied = ["02:00", "02:30", "03:00"].map(|w| Slot {
            at_ms: at,
            wall_ms: Some(utc(&format!("2027-03-28T{w}:00Z"))),
        });
        (t, tied)
    }

    /// Review finding (recipient.rs's open limit): backfill listed a range's slots by instant,
    /// so of the three sharing 01:00Z it offered 02:00 only; 02:30 and 03:00, New York's
    /// 06:30Z and 07:00Z, could not be backfilled. Each is a slot of the range, with its wall.
    #[test]
    fn slots_sharing_an_instant_in_a_gap_are_each_offered_with_their_wall() {
        let (t, tied) = gap();
        let spec = t.split().0;
        let (from, to) = (utc("2027-03-28T00:45:00Z"), utc("2027-03-28T01:10:00Z"));
        assert_eq!(slots(&spec, from, to), Ok(tied.to_vec()));
        assert_eq!(
            to_backfill(&spec, from, to, &nothing(to)),
            Ok(tied.to_vec())
        );
        // The whole day's slots by wall, in order: 01:00 and 01:30 before the three, 03:30 after.
        let day = slots(
            &spec,
            utc("2027-03-28T00:00:00Z"),
            utc("2027-03-28T02:00:00Z"),
        )
        .unwrap();
        let walls: Vec<u64> = day.iter().filter_map(|s| s.wall_ms).collect();
        let want: Vec<u64> = ["01:00", "01:30", "02:00", "02:30", "03:00", "03:30"]
            .iter()
            .map(|w| utc(&format!("2027-03-28T{w}:00Z")))
            .collect();
        assert_eq!(walls, want, "{day:?}");
    }

    /// What was handled is matched by wall: with the 02:00 slot's run completed (its wall
    /// recorded), 02:30 and 03:00 are offered; a fire queued for 02:30 leaves 03:00. A run
    /// recorded without a wall (from before walls) stands for its instant, all three slots.
    #[test]
    fn a_slot_is_handled_by_the_run_of_its_own_wall() {
        let (t, tied) = gap();
        let (spec, base) = t.split();
        let now = utc("2027-03-28T01:10:00Z");
        let (from, to) = (utc("2027-03-28T00:45:00Z"), now);
        let p = TaskProgress {
            runs: 1,
            fires: 1,
            next_fire_at_ms: Some(utc("2027-03-28T01:30:00Z")),
            ..base
        };
        let first = run(1, tied[0].at_ms, RunState::Completed).of_slot(tied[0].wall_ms);
        let h = Handled::of(std::slice::from_ref(&first), &p, now, 0);
        assert_eq!(to_backfill(&spec, from, to, &h), Ok(tied[1..].to_vec()));
        let queued = TaskProgress {
            fires: 2,
            queued: vec![crate::model::Queued {
                run: 2,
                at_ms: tied[1].at_ms,
                wall_ms: tied[1].wall_ms,
            }],
            ..p.clone()
        };
        let h = Handled::of(std::slice::from_ref(&first), &queued, now, 0);
        assert_eq!(to_backfill(&spec, from, to, &h), Ok(tied[2..].to_vec()));
        let old = run(1, tied[0].at_ms, RunState::Completed);
        let h = Handled::of(&[old], &p, now, 0);
        assert_eq!(to_backfill(&spec, from, to, &h), Ok(vec![]));
        // A trimmed run may have been any slot's: a skipped 02:00 kept, 02:30 and 03:00
        // without a record up to the trimmed stretch are refused, not sent twice.
        let trimmed = TaskProgress {
            runs: 1,
            fires: 2,
            ..p
        };
        let skipped = run(2, tied[0].at_ms, RunState::Skipped).of_slot(tied[0].wall_ms);
        let h = Handled::of(&[skipped], &trimmed, now, 0);
        assert!(
            h.unknown_through.is_some_and(|t| t >= tied[0].at_ms),
            "{h:?}"
        );
        assert!(matches!(
            to_backfill(&spec, from, to, &h),
            Err(BackfillError::Trimmed { .. })
        ));
    }

    /// Review finding: `unknown_through` is a run instant under the zones of its day. An hourly
    /// cron over Tokyo (+9) and London fired the walls 09:00 to 11:00 at Tokyo's 00:00Z to
    /// 02:00Z; run 1's record (09:00) was trimmed. Tokyo removed, the walls run at London's
    /// instants, nine hours later: the 09:00 slot (now 09:00Z) passed the `Trimmed` check
    /// (through 01:00Z) and was backfilled, a second send. Widened by the span a zone change
    /// can move an instant, the range is refused.
    #[test]
    fn a_zone_change_never_lets_a_trimmed_runs_slot_pass_for_unsent() {
        let h9 = |h: u64| NOW + h * 60 * M;
        let t = crate::request::test_task(
            serde_json::json!({"schedule": {"cron": "0 * * * *", "tz": "recipient"},
            "messages": [{"to": "l", "body": "x", "tz": "Europe/London"}]}),
            NOW - 60 * M,
        );
        let (spec, base) = t.split();
        // Walls as if UTC: the 09:00 of 1 December is NOW + 9 h.
        let kept: Vec<Run> = [(2, 10), (3, 11)]
            .map(|(n, wall)| run(n, h9(wall - 9), RunState::Completed).of_slot(Some(h9(wall))))
            .to_vec();
        let p = TaskProgress {
            runs: 3,
            fires: 3,
            last_fire_ms: Some(h9(2)),
            last_slot_wall_ms: Some(h9(11)),
            next_fire_at_ms: Some(h9(12)),
            ..base
        };
        let now = h9(10) + 30 * M;
        let h = Handled::of(&kept, &p, now, 0);
        assert_eq!(h.unknown_through, Some(h9(1)), "run 2's start");
        let (from, to) = (h9(8), h9(10));
        assert!(
            matches!(
                to_backfill(&spec, from, to, &h),
                Err(BackfillError::Trimmed { through }) if through >= h9(9)
            ),
            "{:?}",
            to_backfill(&spec, from, to, &h)
        );
        // Past the widened bound the records decide again: a slot without one is offered.
        let late = h9(1) + SPAN_MS + 60 * M;
        let h = Handled { latest: late, ..h };
        assert_eq!(to_backfill(&spec, late, late, &h).map(|v| v.len()), Ok(1));
    }
}

//! Misfire: what happens to fire times that passed while herald was down or the task paused.
//! Pure.
//!
//! Which fires count as missed is decided by the engine (`engine/plan.rs::fire`): only those
//! due before herald (re)started watching the task — never herald's own lateness. Their
//! lateness here is measured up to that instant, and `misfire_grace` means exactly what the
//! task says: there is no hidden tolerance.
//!
//! Each missed fire is judged on its own lateness first: missed by more than `misfire_grace`
//! it *expires* (recorded, never sent). The rest follow the task's policy:
//! - `fire_now` (default): one run now for the latest of them; earlier ones are recorded as
//!   skipped ("coalesced"), so a long outage never turns into a burst of identical runs;
//! - `skip`: none runs; all are recorded as skipped; the schedule continues with its next fire;
//! - `fire_all`: every one runs, in order (bounded by [`FIRE_ALL_MAX`]; the excess is skipped).
//!
//! An outage is judged as one however long it is: fires beyond one step's list are counted
//! ([`Rest`]), so fire_now still starts one run and fire_all at most [`FIRE_ALL_MAX`].

use crate::model::{format_duration_ms, Misfire};

use super::format_utc;

/// Most missed fires `fire_all` replays; a bound so that catch-up after a long outage is finite.
pub const FIRE_ALL_MAX: usize = 100;

/// Most missed fires enumerated one by one after an outage (one fire step's list).
pub const MISSED_LIST_MAX: usize = 1_000;

/// Most missed fires counted one by one after the listed ones, when the fires within the grace
/// do not fit in one list ([`Rest`]). A bound on one fire step's work: beyond it the engine goes
/// straight to the latest missed fire, and the ones in between are skipped uncounted.
pub const MISSED_COUNT_MAX: u64 = 10_000;

const COALESCED: &str = "missed; coalesced into one run by misfire fire_now";
const SKIPPED: &str = "missed; misfire policy is skip";

/// A missed fire as the caller knows it, judged by its instant alone: the instant itself, or
/// the engine's `(instant, slot wall)`. Two slots of a cron in recipient time can share an
/// instant (`recipient.rs`), so a decision hands back the fire it was given, wall and all,
/// and the caller records each fire's own slot (the wall of a fire reached past uncounted
/// ones cannot be worked out again from the fires before it).
pub trait Fire: Copy {
    /// The fire's instant.
    fn at(&self) -> u64;
}

impl Fire for u64 {
    fn at(&self) -> u64 {
        *self
    }
}

impl Fire for (u64, Option<u64>) {
    fn at(&self) -> u64 {
        self.0
    }
}

/// The missed fires of an outage after the listed ones, all within the grace: how many (at
/// least one) and the latest. Counted, never listed, so an outage of any length is judged as one
/// (one fire_now run, at most [`FIRE_ALL_MAX`] fire_all runs) in bounded memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rest<F = u64> {
    pub count: u64,
    pub last: F,
}

/// Why a fire expired: every expiry herald decides is one of these (the misfire judgement
/// here, and a reminder's event in `engine/plan.rs`). A run's stored and API `reason` is
/// [`Expiry::reason`], in English, as before; the kind stays typed beside it (not stored) so
/// that a notification can say it in the task's language (`notify.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// A fire missed (herald down, the task paused) by `late_ms`, more than the grace.
    Missed { late_ms: u64, grace_ms: u64 },
    /// A started run whose first message would have started `late_ms` late after an outage
    /// or a pause, more than the grace ([`judge_started`]).
    StartedLate { late_ms: u64, grace_ms: u64 },
    /// A reminder whose event began (at `event_ms`) before its first message could go.
    EventBegan { event_ms: u64 },
}

impl Expiry {
    /// The run's `reason` (stored, and in the API): English, whatever the task's language.
    pub fn reason(&self) -> String {
        match *self {
            Expiry::Missed { late_ms, grace_ms } => format!(
                "missed by {} (more than misfire_grace {})",
                format_duration_ms(late_ms),
                format_duration_ms(grace_ms)
            ),
            Expiry::StartedLate { late_ms, grace_ms } => format!(
                "its first message would have started {} late, after herald was down or the task paused (more than misfire_grace {})",
                format_duration_ms(late_ms),
                format_duration_ms(grace_ms)
            ),
            Expiry::EventBegan { event_ms } => format!(
                "the event began at {} before its first message could go",
                format_utc(event_ms)
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<F = u64> {
    /// Start a run for this fire (now).
    Run(F),
    /// Record as skipped, with the reason.
    Skip(F, String),
    /// Record as expired, with the reason.
    Expire(F, Expiry),
    /// Count this many fires (of a [`Rest`], before its last) as skipped, with no record each.
    /// The rest's last fire always follows (its own decision).
    SkipUnlisted(u64),
}

/// Judges missed fires (ascending instants, all in the past) at `now_ms`.
pub fn judge(policy: Misfire, grace_ms: u64, missed: &[u64], now_ms: u64) -> Vec<Decision> {
    judge_outage(policy, grace_ms, missed, None, now_ms)
}

/// [`judge`], the outage going on past the listed fires with `rest`. Then the latest missed fire
/// is the rest's: fire_now runs it (the listed fires are all coalesced), and fire_all runs the
/// first [`FIRE_ALL_MAX`] within the grace, so callers list at least that many before a rest.
pub fn judge_outage<F: Fire>(
    policy: Misfire,
    grace_ms: u64,
    missed: &[F],
    rest: Option<Rest<F>>,
    now_ms: u64,
) -> Vec<Decision<F>> {
    let mut out = judge_listed(policy, grace_ms, missed, rest.is_none(), now_ms);
    out.extend(rest.into_iter().flat_map(|r| judge_rest(policy, r)));
    out
}

/// The decisions for the listed fires; `latest_listed`: the last of them is the outage's last.
fn judge_listed<F: Fire>(
    policy: Misfire,
    grace_ms: u64,
    missed: &[F],
    latest_listed: bool,
    now_ms: u64,
) -> Vec<Decision<F>> {
    let mut out = Vec::with_capacity(missed.len());
    let mut within = Vec::new();
    for &t in missed {
        let late = now_ms.saturating_sub(t.at());
        if late > grace_ms {
            out.push(Decision::Expire(
                t,
                Expiry::Missed {
                    late_ms: late,
                    grace_ms,
                },
            ));
        } else {
            within.push(t);
        }
    }
    match policy {
        Misfire::FireNow => {
            if let Some((&last, earlier)) = within.split_last() {
                for &t in earlier {
                    out.push(Decision::Skip(t, COALESCED.into()));
                }
                out.push(if latest_listed {
                    Decision::Run(last)
                } else {
                    Decision::Skip(last, COALESCED.into())
                });
            }
        }
        Misfire::Skip => {
            for t in within {
                out.push(Decision::Skip(t, SKIPPED.into()));
            }
        }
        Misfire::FireAll => {
            for (i, t) in within.into_iter().enumerate() {
                if i < FIRE_ALL_MAX {
                    out.push(Decision::Run(t));
                } else {
                    out.push(Decision::Skip(t, fire_all_excess()));
                }
            }
        }
    }
    // Keep the record in time order: expired fires are the oldest anyway, but be explicit.
    out.sort_by_key(|d| match d {
        Decision::Run(t) | Decision::Skip(t, _) | Decision::Expire(t, _) => t.at(),
        Decision::SkipUnlisted(_) => 0,
    });
    out
}

/// The rest of an outage: all skipped, counted only, but its last fire (recorded), which runs
/// for fire_now. fire_all has replayed its fires from the listed ones.
fn judge_rest<F: Fire>(policy: Misfire, r: Rest<F>) -> Vec<Decision<F>> {
    let Some(before_last) = r.count.checked_sub(1) else {
        return Vec::new();
    };
    let last = match policy {
        Misfire::FireNow => Decision::Run(r.last),
        Misfire::Skip => Decision::Skip(r.last, SKIPPED.into()),
        Misfire::FireAll => Decision::Skip(r.last, fire_all_excess()),
    };
    let unlisted = (before_last > 0).then_some(Decision::SkipUnlisted(before_last));
    unlisted.into_iter().chain([last]).collect()
}

fn fire_all_excess() -> String {
    format!("missed; fire_all replays at most {FIRE_ALL_MAX} fires")
}

/// The grace of a run that had started (its first message armed, or waiting to be) when herald
/// went down or the task was paused: the user's grace is about when that message's send
/// *starts*, whatever herald did with the fire before the outage (a one-shot is armed up to 2 s
/// ahead, more in a herd).
///
/// Misfire is about outage, not lateness (DESIGN.md): only the time nobody was watching counts.
/// `scheduled_ms`: the run's instant; `planned_ms`: the instant its first send was planned for
/// as last written (the run's `next_at`: its instant, the end of a quiet-hours hold, the start
/// of a queued or backfilled run, or the pause that stopped it — a send still waiting then was
/// herald's backlog, not a miss); `send_ms`: when it would start now; `watched_ms`: when herald
/// watches the task again (boot, resume). The send is late from the later of the instant and
/// the plan: only a plan that fell before `watched_ms` was missed, so a hold still ahead (a
/// restart or a pause in the night, before 08:00) is never expired, and a run late for herald's
/// own reasons while it watched (a backlog, a rate limit, quiet hours) is judged only for the
/// outage after its plan. Why, when it expires.
pub fn judge_started(
    scheduled_ms: u64,
    planned_ms: u64,
    send_ms: u64,
    watched_ms: u64,
    grace_ms: u64,
) -> Option<Expiry> {
    let since = scheduled_ms.max(planned_ms);
    if since >= watched_ms {
        return None;
    }
    let late = send_ms.saturating_sub(since);
    (late > grace_ms).then_some(Expiry::StartedLate {
        late_ms: late,
        grace_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    fn kinds(d: &[Decision]) -> String {
        d.iter()
            .map(|d| match d {
                Decision::Run(_) => 'R',
                Decision::Skip(..) => 'S',
                Decision::Expire(..) => 'E',
                Decision::SkipUnlisted(_) => 'U',
            })
            .collect()
    }

    #[test]
    fn outage_of_three_hours_every_15_minutes() {
        // Fires at 0, 15, ..., 165 min; herald comes back at 180 min; grace 10 min.
        let missed: Vec<u64> = (0..12).map(|i| i * 15 * MIN).collect();
        let now = 180 * MIN;
        // Fires missed by more than 10 min expire; 165 (missed by 15) too. Nothing within grace.
        assert_eq!(
            kinds(&judge(Misfire::FireNow, 10 * MIN, &missed, now)),
            "EEEEEEEEEEEE"
        );
        // With a 40 min grace, 150 and 165 are within it.
        assert_eq!(
            kinds(&judge(Misfire::FireNow, 40 * MIN, &missed, now)),
            "EEEEEEEEEESR"
        );
        assert_eq!(
            kinds(&judge(Misfire::Skip, 40 * MIN, &missed, now)),
            "EEEEEEEEEESS"
        );
        assert_eq!(
            kinds(&judge(Misfire::FireAll, 40 * MIN, &missed, now)),
            "EEEEEEEEEERR"
        );
    }

    #[test]
    fn reasons_say_why() {
        let d = judge(Misfire::FireNow, MIN, &[0], 5 * MIN);
        match &d[0] {
            Decision::Expire(0, why) => {
                let why = why.reason();
                assert!(why.contains("4m") || why.contains("5m"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_started_run_is_judged_on_when_its_first_send_would_start() {
        let t = 100_000;
        // Armed 2 s ahead, down from t − 1.5 s to t + 2.5 s, grace 1 s: expired.
        let why = judge_started(t, t, t + 2_500, t + 2_500, 1_000)
            .expect("expired")
            .reason();
        assert!(why.contains("2s500ms") && why.contains("1s"), "{why}");
        // The same outage with a 3 s grace: it is sent.
        assert_eq!(judge_started(t, t, t + 2_500, t + 2_500, 3_000), None);
        // Exactly at the grace: still sent (expiry is *more* than the grace).
        assert_eq!(judge_started(t, t, t + 1_000, t + 1_000, 1_000), None);
        // Back before the instant: nothing was missed, however late the send then goes
        // (herald's own lateness is never an expiry).
        assert_eq!(judge_started(t, t, t + 60_000, t - 500, 1_000), None);
    }

    /// Review finding: a send held by quiet hours until 08:00 (written), herald restarted (or
    /// the task paused and resumed) at 23:00:05, was judged 9 h late and expired. Only the
    /// outage after the plan counts.
    #[test]
    fn a_started_run_is_late_only_from_its_plan() {
        let (t, h) = (100_000, 3_600_000);
        let until = t + 9 * h;
        // Restarted in the night: the hold is still ahead, nothing was missed.
        assert_eq!(judge_started(t, until, until, t + 5_000, 1_000), None);
        // A pause that began 15 min into a rate limit's backlog and lasted 1 s (the pause
        // wrote its instant as the plan): 1 s late, within the grace.
        let paused = t + 15 * 60_000;
        assert_eq!(
            judge_started(t, paused, paused + 1_000, paused + 1_000, 2_000),
            None
        );
        // An outage that ran past the hold's end by more than the grace: expired, by that much.
        let why = judge_started(t, until, until + 30 * 60_000, until + 30 * 60_000, 600_000)
            .expect("expired")
            .reason();
        assert!(why.contains("30m"), "{why}");
        // A plan before the instant (armed ahead) counts from the instant.
        assert!(judge_started(t, t - 2_000, t + 2_500, t + 2_500, 1_000).is_some());
    }

    /// An outage longer than its list: its latest fire is the rest's, counted only.
    #[test]
    fn an_outage_past_its_list_is_judged_as_one() {
        let rest: Option<Rest> = Some(Rest { count: 3, last: 10 });
        let k = |p| kinds(&judge_outage(p, u64::MAX, &[1, 2], rest, 20));
        assert_eq!(k(Misfire::FireNow), "SSUR");
        assert_eq!(k(Misfire::Skip), "SSUS");
        assert_eq!(k(Misfire::FireAll), "RRUS");
        let one: Option<Rest> = Some(Rest { count: 1, last: 10 });
        assert_eq!(
            judge_outage(Misfire::FireNow, u64::MAX, &[1], one, 20),
            [Decision::Skip(1, COALESCED.into()), Decision::Run(10)]
        );
        // Fires with their slots' walls come back as they were given.
        let walls: Option<Rest<(u64, Option<u64>)>> = Some(Rest {
            count: 2,
            last: (10, Some(7)),
        });
        assert_eq!(
            judge_outage(Misfire::FireNow, u64::MAX, &[(1, Some(5))], walls, 20),
            [
                Decision::Skip((1, Some(5)), COALESCED.into()),
                Decision::SkipUnlisted(1),
                Decision::Run((10, Some(7)))
            ]
        );
    }

    #[test]
    fn fire_all_is_bounded() {
        let missed: Vec<u64> = (0..150).collect();
        let d = judge(Misfire::FireAll, u64::MAX, &missed, 1_000);
        assert_eq!(
            d.iter().filter(|d| matches!(d, Decision::Run(_))).count(),
            FIRE_ALL_MAX
        );
        assert_eq!(d.len(), 150);
    }
}

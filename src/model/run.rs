//! One run of a task and its cursor: the pure state machine that decides, after each delivery
//! attempt, what happens next.
//!
//! Invariants (checked by the property test below and relied on by crash recovery):
//! - `cursor` only moves forward, and only after the message at it was accepted by the channel
//!   or given up on (failure list). Nothing before the cursor is ever sent again.
//! - `in_flight == Some(cursor)` from the moment an attempt starts until its outcome is settled;
//!   after a crash only that message may go out twice (with the same idempotency key).
//! - `attempts` counts attempts of the message at the cursor and resets when the cursor moves.
//! - `sent + failed == cursor`.

use serde::{Deserialize, Serialize};

use super::task::Pacing;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Sending (or waiting between sends).
    Running,
    /// Every message was sent or given up on.
    Completed,
    /// The task was cancelled while this run was active.
    Cancelled,
    /// A fire that did not start a run (overlap, misfire `skip`, coalesced); see `reason`.
    Skipped,
    /// A fire missed by more than `misfire_grace`; see `reason`.
    Expired,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub run: u32,
    /// When the run was due to start.
    pub scheduled_at_ms: u64,
    pub started_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    pub state: RunState,
    pub total: u32,
    /// Index of the next message to send.
    pub cursor: u32,
    /// The message whose attempt has started and not settled.
    pub in_flight: Option<u32>,
    /// Attempts made for the message at the cursor.
    pub attempts: u32,
    pub sent: u32,
    pub failed: u32,
    /// When the next step of this run is due (pacing or retry); recovery resumes from here.
    pub next_at_ms: Option<u64>,
    /// Start of the last attempt, the anchor for `interval` pacing.
    pub last_attempt_at_ms: Option<u64>,
    /// Why a fire was skipped or expired.
    pub reason: Option<String>,
    /// In recipient time (`schedule/recipient.rs`), the wall time (ms as if UTC) of the cron
    /// slot this run is the run of: two slots can share a run instant (a DST gap in the
    /// earliest zone), so the instant alone does not say which. `None`: not recorded (a run
    /// written before it, a trigger, any other schedule): read from the instant as before.
    /// Defaulted: exports made before it import with none.
    #[serde(default)]
    pub slot_wall_ms: Option<u64>,
}

/// What a channel said about one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted (2xx, or written to the log/file).
    Sent,
    /// Worth another attempt; `not_before_ms` comes from a `Retry-After`.
    Retry {
        error: String,
        not_before_ms: Option<u64>,
    },
    /// Rejected for good (4xx other than 408/425/429).
    Permanent { error: String },
    /// Never left this host: a local resource ran out (too many open files, no buffer space).
    /// Like a rate-limit hold: the attempt is not counted and the breaker is not told; the
    /// message is tried again at `until_ms` with the same attempt number. `why` goes into the
    /// `held` timeline event.
    Held {
        error: String,
        until_ms: u64,
        why: super::timeline::HeldWhy,
    },
}

/// A message given up on, to be written to the failure list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GaveUp {
    pub seq: u32,
    pub attempts: u32,
    pub error: String,
}

/// The decision after an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub gave_up: Option<GaveUp>,
    /// When to take the next step; `None` when the run is finished.
    pub next_at_ms: Option<u64>,
}

impl Run {
    pub fn new(run: u32, scheduled_at_ms: u64, now_ms: u64, total: u32) -> Run {
        Run {
            run,
            scheduled_at_ms,
            started_at_ms: now_ms,
            finished_at_ms: None,
            state: RunState::Running,
            total,
            cursor: 0,
            in_flight: None,
            attempts: 0,
            sent: 0,
            failed: 0,
            next_at_ms: Some(scheduled_at_ms.max(now_ms)),
            last_attempt_at_ms: None,
            reason: None,
            slot_wall_ms: None,
        }
    }

    /// This run as the run of the slot whose wall time is `wall` (see [`Run::slot_wall_ms`]).
    pub fn of_slot(self, wall: Option<u64>) -> Run {
        Run {
            slot_wall_ms: wall,
            ..self
        }
    }

    /// The record of a fire that did not start a run.
    pub fn not_started(
        run: u32,
        scheduled_at_ms: u64,
        now_ms: u64,
        total: u32,
        state: RunState,
        reason: String,
    ) -> Run {
        Run {
            state,
            finished_at_ms: Some(now_ms),
            next_at_ms: None,
            reason: Some(reason),
            ..Run::new(run, scheduled_at_ms, now_ms, total)
        }
    }

    pub fn is_done(&self) -> bool {
        self.cursor >= self.total
    }

    /// Starts an attempt of the message at the cursor and returns its index. Must be persisted
    /// before the send starts.
    pub fn begin_attempt(&mut self, now_ms: u64) -> Option<u32> {
        if self.is_done() {
            return None;
        }
        self.in_flight = Some(self.cursor);
        self.attempts += 1;
        self.last_attempt_at_ms = Some(now_ms);
        // `next_at_ms` stays: it is when the armed attempt is due to be sent.
        Some(self.cursor)
    }

    /// Takes back an attempt that was armed but never sent (paused or cancelled in between).
    pub fn disarm(&mut self) {
        if self.in_flight.take().is_some() {
            self.attempts = self.attempts.saturating_sub(1);
        }
    }

    /// Records the outcome of the attempt begun by `begin_attempt`.
    ///
    /// `max_attempts` is the retry budget, `retry_delay_ms` the backoff before the next attempt
    /// of the same message, `interval_ms` the pacing between consecutive sends (anchored at the
    /// start of the attempt, so two attempts never start closer than the interval).
    pub fn settle(
        &mut self,
        outcome: Outcome,
        max_attempts: u32,
        retry_delay_ms: u64,
        pacing: &Pacing,
        now_ms: u64,
    ) -> Settled {
        // `last_attempt_at_ms` is the millisecond in which the attempt started, anywhere within
        // it; counting the gap from the end of that millisecond guarantees that two attempts
        // never start less than the gap apart in real time.
        let anchor = self.last_attempt_at_ms;
        let after = |gap: u64| match (gap, anchor) {
            (0, _) | (_, None) => now_ms,
            (g, Some(a)) => a.saturating_add(1).saturating_add(g).max(now_ms),
        };
        let paced = after(pacing.interval_ms);
        self.in_flight = None;
        let mut gave_up = None;
        match outcome {
            Outcome::Sent => {
                self.sent += 1;
                self.advance();
            }
            Outcome::Retry {
                error,
                not_before_ms,
            } => {
                if self.attempts < max_attempts.max(1) {
                    let at = now_ms
                        .saturating_add(retry_delay_ms)
                        .max(not_before_ms.unwrap_or(0))
                        .max(paced);
                    self.next_at_ms = Some(at);
                    return Settled {
                        gave_up: None,
                        next_at_ms: Some(at),
                    };
                }
                gave_up = Some(self.give_up(error));
            }
            Outcome::Permanent { error } => {
                gave_up = Some(self.give_up(error));
            }
            Outcome::Held { until_ms, .. } => {
                // Not an attempt: give it back, stay at the cursor, try again at `until_ms`.
                self.attempts = self.attempts.saturating_sub(1);
                let at = until_ms.max(now_ms);
                self.next_at_ms = Some(at);
                return Settled {
                    gave_up: None,
                    next_at_ms: Some(at),
                };
            }
        }
        if self.is_done() {
            // A run cancelled while its last attempt was in flight stays cancelled.
            if self.state == RunState::Running {
                self.state = RunState::Completed;
                self.finished_at_ms = Some(now_ms);
            }
            self.next_at_ms = None;
        } else {
            // The cursor moved: a batch boundary before the next message means a longer pause.
            self.next_at_ms = Some(after(pacing.gap_before(self.cursor)));
        }
        Settled {
            gave_up,
            next_at_ms: self.next_at_ms,
        }
    }

    fn give_up(&mut self, error: String) -> GaveUp {
        let g = GaveUp {
            seq: self.cursor,
            attempts: self.attempts,
            error,
        };
        self.failed += 1;
        self.advance();
        g
    }

    fn advance(&mut self) {
        self.cursor += 1;
        self.attempts = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn retry() -> Outcome {
        Outcome::Retry {
            error: "500".into(),
            not_before_ms: None,
        }
    }

    #[test]
    fn paced_sequence_walks_the_cursor() {
        let mut r = Run::new(1, 1_000, 1_000, 3);
        for i in 0..3u32 {
            let t = 1_000 + u64::from(i) * 100;
            assert_eq!(r.begin_attempt(t), Some(i));
            assert_eq!(r.in_flight, Some(i));
            let s = r.settle(Outcome::Sent, 3, 50, &Pacing::every(100), t + 2);
            if i < 2 {
                assert_eq!(s.next_at_ms, Some(t + 101), "anchored at attempt start");
            } else {
                assert_eq!(s.next_at_ms, None);
            }
        }
        assert_eq!(r.state, RunState::Completed);
        assert_eq!((r.sent, r.failed, r.cursor), (3, 0, 3));
        assert_eq!(r.begin_attempt(2_000), None);
    }

    #[test]
    fn a_held_send_burns_no_attempt() {
        let mut r = Run::new(1, 0, 0, 1);
        r.begin_attempt(0);
        let held = Outcome::Held {
            error: "Too many open files".into(),
            until_ms: 200,
            why: crate::model::timeline::HeldWhy::LocalResource,
        };
        for _ in 0..5 {
            let s = r.settle(held.clone(), 1, 1_000, &Pacing::default(), 10);
            assert_eq!(
                s,
                Settled {
                    gave_up: None,
                    next_at_ms: Some(200)
                }
            );
            assert_eq!((r.attempts, r.in_flight, r.cursor), (0, None, 0));
            assert_eq!(r.begin_attempt(200), Some(0));
            assert_eq!(r.attempts, 1, "the same attempt number every time");
        }
        let s = r.settle(Outcome::Sent, 1, 1_000, &Pacing::default(), 210);
        assert_eq!(s.next_at_ms, None);
        assert_eq!((r.sent, r.failed), (1, 0));
    }

    #[test]
    fn retries_then_gives_up_and_moves_on() {
        let mut r = Run::new(1, 0, 0, 2);
        r.begin_attempt(0);
        let s = r.settle(retry(), 2, 1_000, &Pacing::default(), 10);
        assert_eq!(s.next_at_ms, Some(1_010));
        assert_eq!(r.cursor, 0);
        r.begin_attempt(1_010);
        let s = r.settle(retry(), 2, 1_000, &Pacing::default(), 1_020);
        assert_eq!(
            s.gave_up,
            Some(GaveUp {
                seq: 0,
                attempts: 2,
                error: "500".into()
            })
        );
        assert_eq!(s.next_at_ms, Some(1_020));
        assert_eq!((r.cursor, r.attempts, r.failed), (1, 0, 1));
    }

    #[test]
    fn retry_after_and_interval_both_hold_back_the_next_attempt() {
        let mut r = Run::new(1, 0, 0, 1);
        r.begin_attempt(0);
        let s = r.settle(
            Outcome::Retry {
                error: "429".into(),
                not_before_ms: Some(5_000),
            },
            3,
            10,
            &Pacing::default(),
            1,
        );
        assert_eq!(s.next_at_ms, Some(5_000));
        r.begin_attempt(5_000);
        let s = r.settle(retry(), 3, 10, &Pacing::every(3_000), 5_001);
        assert_eq!(
            s.next_at_ms,
            Some(8_001),
            "interval from the attempt start wins"
        );
    }

    #[test]
    fn permanent_failure_does_not_retry() {
        let mut r = Run::new(1, 0, 0, 1);
        r.begin_attempt(0);
        let s = r.settle(
            Outcome::Permanent {
                error: "400".into(),
            },
            5,
            10,
            &Pacing::default(),
            1,
        );
        assert_eq!(s.gave_up.map(|g| g.attempts), Some(1));
        assert_eq!(s.next_at_ms, None);
        assert_eq!(r.state, RunState::Completed);
    }

    #[test]
    fn batches_pause_between_them() {
        // 7 messages, batches of 3, 100 ms apart within a batch, 1 s between batches.
        let pacing = Pacing {
            interval_ms: 100,
            batch_size: Some(3),
            batch_pause_ms: 1_000,
        };
        let mut r = Run::new(1, 0, 0, 7);
        let mut now = 0;
        let mut starts = vec![];
        while r.begin_attempt(now).is_some() {
            starts.push(now);
            match r.settle(Outcome::Sent, 1, 0, &pacing, now).next_at_ms {
                Some(at) => now = at,
                None => break,
            }
        }
        assert_eq!(starts, [0, 101, 202, 1_203, 1_304, 1_405, 2_406]);
    }

    proptest! {
        /// Random outcomes against the invariants in the module doc.
        #[test]
        fn cursor_invariants_hold(outcomes in proptest::collection::vec(0u8..3, 1..200),
                                  total in 1u32..20, max_attempts in 1u32..5) {
            let mut r = Run::new(1, 0, 0, total);
            let mut now = 0u64;
            let mut sends_per_seq = vec![0u32; total as usize];
            for o in outcomes {
                let before = r.cursor;
                let Some(seq) = r.begin_attempt(now) else { break };
                prop_assert_eq!(seq, before);
                sends_per_seq[seq as usize] += 1;
                let outcome = match o {
                    0 => Outcome::Sent,
                    1 => retry(),
                    _ => Outcome::Permanent { error: "400".into() },
                };
                now += 7;
                let s = r.settle(outcome, max_attempts, 3, &Pacing::every(5), now);
                prop_assert!(r.cursor >= before && r.cursor <= before + 1);
                prop_assert_eq!(r.in_flight, None);
                prop_assert_eq!(r.sent + r.failed, r.cursor);
                prop_assert!(r.attempts < max_attempts.max(1));
                if let Some(at) = s.next_at_ms { prop_assert!(at >= now); now = at; }
                else { prop_assert!(r.is_done()); }
            }
            for n in sends_per_seq { prop_assert!(n <= max_attempts); }
        }
    }
}

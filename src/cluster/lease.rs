//! A node's shard leases as it may trust them (HA.md "Trust window"). Pure: every instant is
//! passed in, on the node's monotonic clock (ms); the database's own time decides who owns a
//! row, this decides how long *this process* may act on what it was granted.
//!
//! Rules:
//! - A grant or a renewal is trusted until `sent + ttl − safety`, where `sent` is when the
//!   statement that granted it was *sent* (not answered): the database may have started the
//!   lease any time after that, so the window never outlives the row.
//! - Only one renewal is in flight at a time; an ambiguous one (timeout, lost connection, an
//!   error) drops every shard it covered at once — trust is never extended on a guess.
//! - A renewal that answers without a shard (its epoch or incarnation no longer matched) drops
//!   that shard: someone took it over.
//! - A send may start on a shard only with at least `safety` of trust left, and its request
//!   deadline must end inside the window ([`Leases::may_send`]).

use std::collections::BTreeMap;

/// The timing of leases (`[cluster] lease`, `renew`, `safety`), in ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub ttl_ms: u64,
    pub renew_ms: u64,
    pub safety_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            ttl_ms: 10_000,
            renew_ms: 2_000,
            safety_ms: 1_000,
        }
    }
}

impl Timing {
    /// Why this timing cannot hold a lease safely, if it cannot: a renewal must come well
    /// inside the trust window, or one slow round trip ends trust.
    pub fn check(&self) -> Result<(), String> {
        if self.safety_ms == 0 {
            return Err("cluster.safety must be more than 0".into());
        }
        if self.ttl_ms <= self.safety_ms {
            return Err("cluster.lease must be longer than cluster.safety".into());
        }
        if self.renew_ms == 0 || self.renew_ms.saturating_mul(2) > self.ttl_ms - self.safety_ms {
            return Err(
                "cluster.renew must be at most half of (cluster.lease - cluster.safety)".into(),
            );
        }
        Ok(())
    }
}

/// The longest [`Leases::renew_wake_in`] waits while no renewal is due (one in flight).
pub const RENEW_RECHECK_MS: u64 = 100;

/// One owned shard: the epoch it was granted at and until when it is trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub epoch: u64,
    pub trusted_until_ms: u64,
}

/// Why a shard was dropped (the engine then stops its sends, drops its wheel entries and
/// unloads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// Trust ran out before a renewal answered.
    Expired,
    /// A renewal's outcome is unknown.
    Ambiguous,
    /// A renewal came back without it: its row has another epoch or incarnation now.
    Lost,
    /// A fenced write was refused (`OwnershipLost`), or a commit's outcome is unknown.
    Fenced,
    /// Handed over while a send on it was still counted: the row is not freed, its lease left
    /// to run out, so the next owner waits as after a crash (`node.rs::hand_over`).
    Unsettled,
}

/// The shards this process holds.
#[derive(Debug, Default)]
pub struct Leases {
    timing: Timing,
    held: BTreeMap<u32, Held>,
    /// Shards being handed over: still held (their writes still fenced at their epochs, so
    /// the sends under way can settle), but no send may start on them.
    releasing: std::collections::BTreeSet<u32>,
    /// The renewal in flight: when it was sent, and the shards (with epochs) it covers.
    renewing: Option<(u64, Vec<(u32, u64)>)>,
    last_renew_sent_ms: Option<u64>,
}

impl Leases {
    pub fn new(timing: Timing) -> Leases {
        Leases {
            timing,
            ..Leases::default()
        }
    }

    pub fn held(&self) -> impl Iterator<Item = (u32, Held)> + '_ {
        self.held.iter().map(|(s, h)| (*s, *h))
    }

    pub fn owns(&self, shard: u32) -> Option<Held> {
        self.held.get(&shard).copied()
    }

    pub fn count(&self) -> usize {
        self.held.len()
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    fn window_end(&self, sent_ms: u64) -> u64 {
        sent_ms.saturating_add(self.timing.ttl_ms - self.timing.safety_ms)
    }

    /// An acquisition statement sent at `sent_ms` granted `shard` at `epoch`. A grant over
    /// the shard still held at an older epoch (its row ran out and was granted again before
    /// this process's trust ended, or a late `expire`) answers that one's drop, to be reported
    /// before the grant: the engine then unloads what it holds of the old epoch and loads the
    /// shard anew, instead of taking its tasks for loaded already.
    pub fn granted(&mut self, shard: u32, epoch: u64, sent_ms: u64) -> Option<(u32, Dropped)> {
        let trusted_until_ms = self.window_end(sent_ms);
        self.releasing.remove(&shard);
        let old = self.held.insert(
            shard,
            Held {
                epoch,
                trusted_until_ms,
            },
        );
        old.filter(|h| h.epoch != epoch)
            .map(|_| (shard, Dropped::Lost))
    }

    /// Whether a renewal is due now (none in flight, and `renew` passed since the last one).
    pub fn renew_due(&self, now_ms: u64) -> bool {
        self.renew_due_at().is_some_and(|t| now_ms >= t)
    }

    /// When the next renewal is due (`None`: nothing held, or one is in flight, whose answer
    /// decides the next), so that the loop can send it on time beside other statements.
    pub fn renew_due_at(&self) -> Option<u64> {
        if self.renewing.is_some() || self.held.is_empty() {
            return None;
        }
        Some(
            self.last_renew_sent_ms
                .map_or(0, |t| t.saturating_add(self.timing.renew_ms)),
        )
    }

    /// Ms from `now_ms` until a loop that sends renewals beside other work
    /// (`node.rs`, `Loop::beside_renewals`) looks again: until the next renewal is due; or,
    /// when none can be said to be due ([`Leases::renew_due_at`] is `None`: one is in flight,
    /// perhaps sent by that work itself, or nothing is held yet), after at most
    /// [`RENEW_RECHECK_MS`] (or `renew`, if shorter). Waiting for ever then left the work's
    /// remainder (a handover's stand-down and release) with no renewal sent: up to ~8.5 s
    /// of a 9 s trust window at defaults.
    pub fn renew_wake_in(&self, now_ms: u64) -> u64 {
        self.renew_due_at().map_or_else(
            || RENEW_RECHECK_MS.min(self.timing.renew_ms),
            |t| t.saturating_sub(now_ms),
        )
    }

    /// When the first held shard's trust ends (`None`: nothing held).
    pub fn trust_ends_at(&self) -> Option<u64> {
        self.held.values().map(|h| h.trusted_until_ms).min()
    }

    /// A renewal of every held shard is being sent now: the shards and epochs it names.
    pub fn renew_sent(&mut self, now_ms: u64) -> Vec<(u32, u64)> {
        let covers: Vec<(u32, u64)> = self.held.iter().map(|(s, h)| (*s, h.epoch)).collect();
        self.renewing = Some((now_ms, covers.clone()));
        self.last_renew_sent_ms = Some(now_ms);
        covers
    }

    /// The renewal in flight answered: `renewed` are the shards whose rows it extended (epoch
    /// and incarnation matched). Trust of those moves to the window of the renewal's send;
    /// the others it covered are lost. Returns the shards dropped.
    pub fn renew_answered(&mut self, renewed: &[u32]) -> Vec<(u32, Dropped)> {
        let Some((sent, covers)) = self.renewing.take() else {
            return Vec::new();
        };
        let until = self.window_end(sent);
        let mut dropped = Vec::new();
        for (shard, epoch) in covers {
            match self.held.get_mut(&shard) {
                // Re-granted at another epoch meanwhile: that grant's own window stands.
                Some(h) if h.epoch != epoch => {}
                Some(h) if renewed.contains(&shard) => {
                    h.trusted_until_ms = h.trusted_until_ms.max(until);
                }
                Some(_) => {
                    self.held.remove(&shard);
                    dropped.push((shard, Dropped::Lost));
                }
                None => {}
            }
        }
        dropped
    }

    /// The renewal in flight failed or timed out: nobody knows whether it extended the rows,
    /// so every shard it covered is dropped now.
    pub fn renew_ambiguous(&mut self) -> Vec<(u32, Dropped)> {
        let Some((_, covers)) = self.renewing.take() else {
            return Vec::new();
        };
        let mut dropped = Vec::new();
        for (s, e) in covers {
            if self.held.get(&s).is_some_and(|h| h.epoch == e) {
                self.held.remove(&s);
                dropped.push((s, Dropped::Ambiguous));
            }
        }
        dropped
    }

    /// A fenced write on `shard` at `epoch` was refused, or its outcome is unknown. Only a
    /// grant at that epoch is dropped: a late answer of a group fenced at an older epoch says
    /// nothing of a grant made since.
    pub fn fenced(&mut self, shard: u32, epoch: u64) -> Option<(u32, Dropped)> {
        if self.held.get(&shard).is_none_or(|h| h.epoch != epoch) {
            return None;
        }
        self.held.remove(&shard);
        self.releasing.remove(&shard);
        Some((shard, Dropped::Fenced))
    }

    /// A handover of `shard` begins (handoff, SIGTERM): no send starts on it from now on,
    /// while the ones under way still settle under its epoch ([`Leases::released`] ends it).
    pub fn begin_release(&mut self, shard: u32) {
        if self.held.contains_key(&shard) {
            self.releasing.insert(shard);
        }
    }

    /// Whether `shard` is held and being handed over.
    pub fn releasing(&self, shard: u32) -> bool {
        self.releasing.contains(&shard) && self.held.contains_key(&shard)
    }

    /// Released on purpose (handoff, SIGTERM), once its sends have settled.
    pub fn released(&mut self, shard: u32) {
        self.held.remove(&shard);
        self.releasing.remove(&shard);
    }

    /// Shards whose trust has ended by `now_ms`, dropped.
    pub fn expire(&mut self, now_ms: u64) -> Vec<(u32, Dropped)> {
        let gone: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| now_ms >= h.trusted_until_ms)
            .map(|(s, _)| *s)
            .collect();
        for s in &gone {
            self.held.remove(s);
        }
        gone.into_iter().map(|s| (s, Dropped::Expired)).collect()
    }

    /// Whether a send on `shard` may start at `now_ms` with a request deadline `timeout_ms`
    /// later: at least `safety` of trust left, and the whole request inside the window.
    pub fn may_send(&self, shard: u32, now_ms: u64, timeout_ms: u64) -> bool {
        if self.releasing.contains(&shard) {
            return false;
        }
        self.held.get(&shard).is_some_and(|h| {
            h.trusted_until_ms.saturating_sub(now_ms) >= self.timing.safety_ms
                && now_ms.saturating_add(timeout_ms) <= h.trusted_until_ms
        })
    }

    /// The next instant something must happen (a renewal due, or a shard's trust ending).
    pub fn next_deadline(&self) -> Option<u64> {
        let expiry = self.trust_ends_at();
        let renew = match (self.renewing.is_none(), self.last_renew_sent_ms) {
            (true, Some(t)) if !self.held.is_empty() => Some(t + self.timing.renew_ms),
            _ => None,
        };
        expiry.into_iter().chain(renew).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leases() -> Leases {
        Leases::new(Timing::default())
    }

    #[test]
    fn trust_runs_from_the_send_of_the_grant_not_its_answer() {
        let mut l = leases();
        l.granted(3, 7, 1_000);
        let h = l.owns(3).unwrap();
        assert_eq!((h.epoch, h.trusted_until_ms), (7, 1_000 + 10_000 - 1_000));
        assert!(l.may_send(3, 2_000, 5_000));
        // Less than `safety` left, or a deadline past the window: no send.
        assert!(!l.may_send(3, 9_500, 100));
        assert!(
            l.may_send(3, 5_000, 5_000),
            "a deadline at the window end is inside it"
        );
        assert!(!l.may_send(3, 5_000, 5_001));
        assert!(!l.may_send(4, 2_000, 10), "not held");
    }

    #[test]
    fn a_shard_being_handed_over_starts_no_send_but_stays_held_until_released() {
        let mut l = leases();
        l.granted(3, 7, 1_000);
        assert!(!l.releasing(3));
        l.begin_release(3);
        assert!(l.releasing(3));
        assert!(!l.may_send(3, 2_000, 10), "no send starts on it");
        assert_eq!(
            l.owns(3).map(|h| h.epoch),
            Some(7),
            "still held: the sends under way settle at its epoch"
        );
        l.released(3);
        assert!(l.owns(3).is_none());
        assert!(!l.releasing(3));
        // Granted again later: sends start again.
        l.granted(3, 8, 20_000);
        assert!(l.may_send(3, 21_000, 10));
        // A handover of a shard not held marks nothing.
        l.begin_release(4);
        l.granted(4, 1, 20_000);
        assert!(l.may_send(4, 21_000, 10));
    }

    #[test]
    fn the_wake_beside_other_work_is_bounded_while_a_renewal_is_in_flight() {
        let mut l = leases();
        assert_eq!(l.renew_wake_in(0), RENEW_RECHECK_MS, "nothing held yet");
        l.granted(1, 1, 0);
        assert_eq!(l.renew_wake_in(500), 0, "never renewed: due now");
        l.renew_sent(1_000);
        // In flight (sent by other work): no due time, but the wake is still bounded, so a
        // renewal goes out soon after the answer instead of when the work ends.
        assert_eq!(l.renew_due_at(), None);
        assert_eq!(l.renew_wake_in(1_050), RENEW_RECHECK_MS);
        let short = Leases::new(Timing {
            renew_ms: 40,
            ..Timing::default()
        });
        assert_eq!(short.renew_wake_in(0), 40, "never past one renew interval");
        l.renew_answered(&[1]);
        assert_eq!(
            l.renew_wake_in(1_500),
            1_500,
            "due `renew` after the last send"
        );
        assert_eq!(l.renew_wake_in(4_000), 0);
    }

    #[test]
    fn a_renewal_extends_from_its_send_and_loses_what_it_did_not_renew() {
        let mut l = leases();
        l.granted(1, 1, 0);
        l.granted(2, 5, 0);
        assert!(l.renew_due(0), "never renewed yet");
        let covers = l.renew_sent(2_000);
        assert_eq!(covers, [(1, 1), (2, 5)]);
        assert!(!l.renew_due(4_500), "one renewal in flight at a time");
        // Shard 2's row was taken over: the answer does not name it.
        let dropped = l.renew_answered(&[1]);
        assert_eq!(dropped, [(2, Dropped::Lost)]);
        assert_eq!(l.owns(1).unwrap().trusted_until_ms, 2_000 + 9_000);
        assert!(l.owns(2).is_none());
        assert!(!l.renew_due(3_999));
        assert!(l.renew_due(4_000));
    }

    #[test]
    fn the_next_renewal_is_due_a_renew_interval_after_the_last_send_and_never_while_one_is_out() {
        let mut l = leases();
        assert_eq!(l.renew_due_at(), None, "nothing held");
        l.granted(1, 1, 0);
        assert_eq!(l.renew_due_at(), Some(0), "never renewed: due at once");
        l.renew_sent(500);
        assert_eq!(l.renew_due_at(), None, "one in flight");
        l.renew_answered(&[1]);
        assert_eq!(l.renew_due_at(), Some(2_500));
        assert_eq!(l.trust_ends_at(), Some(9_500));
        l.granted(2, 1, 100);
        assert_eq!(l.trust_ends_at(), Some(9_100), "the first to end");
    }

    #[test]
    fn an_ambiguous_renewal_drops_every_shard_it_covered() {
        let mut l = leases();
        l.granted(1, 1, 0);
        l.granted(2, 1, 0);
        l.renew_sent(2_000);
        // Granted again during the renewal (a new epoch): its own grant stands.
        l.granted(2, 2, 2_500);
        let dropped = l.renew_ambiguous();
        assert_eq!(dropped, [(1, Dropped::Ambiguous)]);
        assert_eq!(l.owns(2).map(|h| h.epoch), Some(2));
    }

    #[test]
    fn trust_ends_by_itself_when_renewals_stall() {
        let mut l = leases();
        l.granted(9, 4, 0);
        l.renew_sent(2_000); // never answered: a hung connection
        assert_eq!(l.next_deadline(), Some(9_000));
        assert!(l.expire(8_999).is_empty());
        assert_eq!(l.expire(9_000), [(9, Dropped::Expired)]);
        assert_eq!(l.count(), 0);
        // The late answer changes nothing: the shard is gone.
        assert!(l.renew_answered(&[9]).is_empty());
        assert!(l.owns(9).is_none());
    }

    #[test]
    fn a_refused_fenced_write_drops_its_shard() {
        let mut l = leases();
        l.granted(5, 3, 0);
        assert_eq!(l.fenced(5, 3), Some((5, Dropped::Fenced)));
        assert_eq!(l.fenced(5, 3), None);
    }

    #[test]
    fn a_late_fence_of_an_older_epoch_keeps_the_fresh_grant() {
        let mut l = leases();
        l.granted(5, 3, 0);
        assert_eq!(l.expire(9_000), [(5, Dropped::Expired)]);
        l.granted(5, 4, 10_000);
        // The group fenced at epoch 3 answers `Unavailable` only now.
        assert_eq!(
            l.fenced(5, 3),
            None,
            "a grant at epoch 4 is not the one fenced"
        );
        assert_eq!(l.owns(5).map(|h| h.epoch), Some(4));
        assert_eq!(l.fenced(5, 4), Some((5, Dropped::Fenced)));
        assert!(l.owns(5).is_none());
        assert_eq!(l.fenced(6, 1), None, "never held");
    }

    #[test]
    fn a_grant_over_an_older_epoch_still_held_reports_its_drop() {
        let mut l = leases();
        assert_eq!(l.granted(5, 3, 0), None, "nothing held before");
        // Granted again at a new epoch before this process noticed the old one ran out.
        assert_eq!(l.granted(5, 4, 8_000), Some((5, Dropped::Lost)));
        let h = l.owns(5).unwrap();
        assert_eq!((h.epoch, h.trusted_until_ms), (4, 8_000 + 9_000));
        // The same epoch again drops nothing.
        assert_eq!(l.granted(5, 4, 8_500), None);
    }

    #[test]
    fn unsafe_timings_are_refused() {
        assert!(Timing::default().check().is_ok());
        let bad = |ttl_ms, renew_ms, safety_ms| {
            Timing {
                ttl_ms,
                renew_ms,
                safety_ms,
            }
            .check()
            .is_err()
        };
        assert!(bad(1_000, 200, 1_000), "lease not longer than safety");
        assert!(bad(10_000, 5_000, 1_000), "renew over half the window");
        assert!(bad(10_000, 2_000, 0), "no safety");
    }
}

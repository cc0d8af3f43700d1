//! Per-channel rate limit `N/period`: at most `N` sends in *any* window of length `period`.
//! Pure: the caller passes `now_ms` and puts a send that may not go yet back on its timing
//! wheel at the instant the limiter names — nothing sleeps (DESIGN.md, "rate limiting *is*
//! scheduling").
//!
//! Why a sliding log and not a token bucket / GCRA: a bucket of capacity `N` lets a full burst
//! go and then refills during the same window, so a `20/1m` bucket can send 39 messages within
//! one minute — exactly what gets a batch throttled by a platform that enforces "20 per minute"
//! over a sliding window. The log keeps the start ticks of the last `N` sends (memory `O(N)`,
//! `N` is capped at [`RATE_COUNT_MAX`]) and admits a send only when the oldest of them is a
//! full period behind. Bursts of up to `N` are still allowed.
//!
//! Millisecond ticks: `now_ms` is the truncated millisecond in which the send starts, so the
//! real start lies somewhere in `[now_ms, now_ms + 1)`. A new send at tick `s` is admitted only
//! if `s >= t + 1 + period` where `t` is the tick of the `N`-th most recent send, so even with
//! the earlier send at the very end of its tick and the new one at the very start of its own,
//! the `N + 1` sends never fit in one real window of length `period`. After a `1/200ms` send at
//! tick `t` the next is refused until `t + 201`: two sends are at least 200 ms apart in real
//! time. The price is one millisecond per period when the channel is saturated.
//!
//! The log is kept on the monotonic clock ([`Durations`]): a wall clock that jumps forward
//! leaves it full, so a limited channel never exceeds its rate across a jump. Callers pass the
//! wall `now` and get wall instants back; without a clock attached the two are the same.

use crate::clock::Durations;
use crate::model::parse_duration_ms;

/// `count` sends per `period_ms` (both > 0 when made by [`parse_rate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub period_ms: u64,
}

/// Parses `"<count>/<period>"`: `"1/3s"`, `"20/1m"`, `"100/1s"`, `"5/250ms"`. The period uses
/// herald's duration grammar. No spaces, no signs, no zero count, no zero period.
pub fn parse_rate(s: &str) -> Result<Rate, String> {
    let Some((count, period)) = s.split_once('/') else {
        return Err(format!(
            "invalid rate {s:?}: expected \"<count>/<period>\", e.g. \"20/1m\""
        ));
    };
    // `u32::from_str` would accept a leading '+'; only plain digits are a count.
    if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "invalid rate {s:?}: count {count:?} is not a whole number"
        ));
    }
    let count: u32 = count
        .parse()
        .map_err(|_| format!("invalid rate {s:?}: count is too large"))?;
    if count == 0 {
        return Err(format!("invalid rate {s:?}: count must be at least 1"));
    }
    if count > RATE_COUNT_MAX {
        return Err(format!(
            "invalid rate {s:?}: count must be at most {RATE_COUNT_MAX}"
        ));
    }
    let period_ms = parse_duration_ms(period).map_err(|e| format!("invalid rate {s:?}: {e}"))?;
    if period_ms == 0 {
        return Err(format!("invalid rate {s:?}: period must be more than 0"));
    }
    Ok(Rate { count, period_ms })
}

/// Largest `N` accepted in a rate: the log holds `N` ticks per channel.
pub const RATE_COUNT_MAX: u32 = 100_000;

/// The sliding log of one channel, shared by every task on it.
#[derive(Clone, Debug)]
pub struct Limiter {
    rate: Rate,
    /// Start ticks of the most recent sends, oldest first; at most `rate.count` of them.
    log: std::collections::VecDeque<u64>,
    /// Latest tick seen: time going backwards is clamped to it.
    last: u64,
    /// Where the log's ticks come from (monotonic).
    durations: Durations,
}

impl Limiter {
    pub fn new(rate: Rate) -> Limiter {
        Limiter {
            rate,
            log: std::collections::VecDeque::with_capacity(rate.count.min(RATE_COUNT_MAX) as usize),
            last: 0,
            durations: Durations::default(),
        }
    }

    /// Keeps the log on `durations`' monotonic clock (the server's limiters do).
    pub fn with_durations(mut self, durations: Durations) -> Limiter {
        self.durations = durations;
        self
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Tries to take a slot for a send starting at wall tick `now_ms`. `Ok(())`: go now (the
    /// slot is taken). `Err(at)`: not before wall instant `at` (nothing taken); if nothing
    /// else acquires in between and the clocks do not jump, `try_acquire(at)` succeeds.
    pub fn try_acquire(&mut self, now_ms: u64) -> Result<(), u64> {
        self.try_take(now_ms).map(|_| ())
    }

    /// [`Limiter::try_acquire`] that names the tick the slot is logged at (for
    /// [`Limiter::retake`]).
    pub fn try_take(&mut self, now_ms: u64) -> Result<u64, u64> {
        let mono = self.durations.mono(now_ms);
        self.acquire_mono(mono)
            .map_err(|at| Durations::wall_at(now_ms, mono, at))
    }

    /// A send admitted with the slot logged at `tick` that could only start later (it waited
    /// for a free slot of its channel's concurrency) takes its slot again at wall tick
    /// `now_ms`: the limit counts sends when they start, so the slot logged at the admission
    /// is given back first. Without this, sends admitted apart but held back together by a
    /// slow receiver went out together, past the rate. `Err(at)`: not before wall instant
    /// `at`; nothing is taken and the admission's slot stays given back.
    pub fn retake(&mut self, tick: u64, now_ms: u64) -> Result<u64, u64> {
        self.give_back(tick);
        self.try_take(now_ms)
    }

    /// Gives back the slot logged at `tick` ([`Limiter::try_take`]) for a send that did not
    /// go (the breaker held it): the limit counts sends that start, not ones asked for. A tick
    /// no longer in the log (pushed out by later sends) gives back nothing.
    pub fn give_back(&mut self, tick: u64) {
        // The log stays in order: one tick is taken out, none moved.
        if let Some(i) = self.log.iter().rposition(|&t| t == tick) {
            self.log.remove(i);
        }
    }

    /// [`Limiter::try_take`] on the monotonic tick `now_ms`.
    fn acquire_mono(&mut self, now_ms: u64) -> Result<u64, u64> {
        let now = now_ms.max(self.last);
        self.last = now;
        let free = self.free_at(now);
        if free > now {
            return Err(free);
        }
        if self.log.len() >= self.capacity() {
            self.log.pop_front();
        }
        self.log.push_back(now);
        Ok(now)
    }

    /// When the next send could go (for a status view); `<= now_ms` means "now".
    pub fn next_free_ms(&self, now_ms: u64) -> u64 {
        let mono = self.durations.mono(now_ms);
        Durations::wall_at(now_ms, mono, self.free_at(mono.max(self.last)))
    }

    fn capacity(&self) -> usize {
        self.rate.count.clamp(1, RATE_COUNT_MAX) as usize
    }

    fn free_at(&self, now: u64) -> u64 {
        if self.log.len() < self.capacity() {
            return now;
        }
        match self.log.front() {
            Some(oldest) => oldest
                .saturating_add(1)
                .saturating_add(self.rate.period_ms)
                .max(now),
            None => now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forward_wall_jump_does_not_empty_the_window() {
        use crate::clock::{Clock, ManualClock};
        let clock = std::sync::Arc::new(ManualClock::new(1_000_000));
        let mut l = Limiter::new(rate("1/2s")).with_durations(Durations::of(clock.clone()));
        assert!(l.try_acquire(clock.now_ms()).is_ok());
        clock.advance(20);
        clock.jump_wall(3_600_000);
        let now = clock.now_ms();
        let at = l.try_acquire(now).unwrap_err();
        assert_eq!(
            at,
            now + 2_001 - 20,
            "2 s after the first send, on the monotonic clock"
        );
        assert_eq!(l.next_free_ms(now), at);
        clock.advance(at - now);
        assert!(l.try_acquire(clock.now_ms()).is_ok());
    }

    fn rate(s: &str) -> Rate {
        parse_rate(s).unwrap()
    }

    #[test]
    fn a_send_that_starts_late_is_counted_when_it_starts() {
        // 1 per second. A is admitted at 0 but held back by a busy channel until 900; B is
        // admitted at 1 000. Counted at admission, both would start within 100 ms.
        let mut l = Limiter::new(rate("1/1s"));
        let a = l.try_take(0).unwrap();
        assert_eq!(
            l.retake(a, 900),
            Ok(900),
            "A's own slot is given back first"
        );
        assert_eq!(
            l.try_take(1_000),
            Err(1_901),
            "B waits a second after A's start"
        );
        // A retake that the limit refuses takes nothing: the next send is not pushed later.
        let mut l = Limiter::new(rate("1/1s"));
        let a = l.try_take(0).unwrap();
        let b = l.try_take(1_001).unwrap();
        assert_eq!(l.retake(a, 1_500), Err(2_002));
        assert_eq!(l.try_take(2_002), Ok(2_002));
        let _ = b;
    }

    /// A caller that wants to send `want` messages as early as possible from `start`: each
    /// refusal moves it to the instant the limiter named. Returns the ticks of the sends.
    fn greedy(l: &mut Limiter, start: u64, want: usize) -> Vec<u64> {
        let mut now = start;
        let mut sent = Vec::with_capacity(want);
        while sent.len() < want {
            match l.try_acquire(now) {
                Ok(()) => sent.push(now),
                Err(at) => {
                    assert!(at > now, "Err({at}) at {now} must lie in the future");
                    // The promise: nothing else acquired, so `at` succeeds.
                    assert!(l.clone().try_acquire(at).is_ok(), "at {at} refused");
                    now = at;
                }
            }
        }
        sent
    }

    /// Largest number of sends, each somewhere inside its tick `[t, t + 1)`, that can fall in
    /// one real window `[x, x + len)`: sends `p..=q` fit iff `ticks[q] - ticks[p] <= len`.
    fn max_in_window(ticks: &[u64], len: u64) -> usize {
        let mut best = 0;
        let mut q = 0;
        for p in 0..ticks.len() {
            while q + 1 < ticks.len() && ticks[q + 1] - ticks[p] <= len {
                q += 1;
            }
            best = best.max(q + 1 - p);
        }
        best
    }

    #[test]
    fn parse_table() {
        for (s, count, period_ms) in [
            ("1/3s", 1, 3_000),
            ("20/1m", 20, 60_000),
            ("100/1s", 100, 1_000),
            ("5/250ms", 5, 250),
            ("3/1h30m", 3, 5_400_000),
            ("100000/1d", 100_000, 86_400_000),
        ] {
            assert_eq!(parse_rate(s), Ok(Rate { count, period_ms }), "{s}");
        }
        for s in [
            "",
            "1",
            "/3s",
            "1/",
            "0/1s",
            "1/0s",
            "1/0ms",
            "-1/1s",
            "+1/1s",
            "1 /1s",
            "1/ 1s",
            " 1/1s",
            "1/1s ",
            "1/1 s",
            "a/1s",
            "1/s",
            "1/3x",
            "1/1s/2",
            "1.5/1s",
            "4294967296/1s",
        ] {
            assert!(parse_rate(s).is_err(), "{s:?} accepted");
        }
        // Errors say what is wrong and quote the input, without the config key.
        assert_eq!(
            parse_rate("0/1s").unwrap_err(),
            "invalid rate \"0/1s\": count must be at least 1"
        );
        assert!(parse_rate("1/3x").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn burst_then_a_full_period() {
        let mut l = Limiter::new(rate("5/250ms"));
        let t0 = 1_800_000_000_000;
        for _ in 0..5 {
            assert_eq!(l.try_acquire(t0), Ok(()));
        }
        // The oldest of the last five went at t0: the next goes a full period (+1 ms) later.
        assert_eq!(l.try_acquire(t0), Err(t0 + 251));
        assert_eq!(l.try_acquire(t0 + 250), Err(t0 + 251));
        assert_eq!(l.next_free_ms(t0 + 20), t0 + 251);
        assert_eq!(l.try_acquire(t0 + 251), Ok(()));
        for _ in 0..4 {
            assert_eq!(l.try_acquire(t0 + 251), Ok(()));
        }
        assert_eq!(l.try_acquire(t0 + 251), Err(t0 + 502));
        // Idle for a full period: the whole burst is back.
        let later = t0 + 10_000;
        assert_eq!(l.next_free_ms(later), later);
        for _ in 0..5 {
            assert_eq!(l.try_acquire(later), Ok(()));
        }
        assert!(l.try_acquire(later).is_err());
    }

    #[test]
    fn one_per_200ms_is_200ms_apart_in_real_time() {
        let mut l = Limiter::new(rate("1/200ms"));
        assert_eq!(l.try_acquire(1_000), Ok(()));
        // The send may have started at 1000.999: the next must not start before 1201.
        assert_eq!(l.try_acquire(1_000), Err(1_201));
        assert_eq!(l.try_acquire(1_200), Err(1_201));
        assert_eq!(l.try_acquire(1_201), Ok(()));
        let ticks = greedy(&mut Limiter::new(rate("1/200ms")), 7, 1_000);
        for w in ticks.windows(2) {
            assert!(w[1] >= w[0] + 1 + 200, "{w:?}");
        }
        assert_eq!(max_in_window(&ticks, 200), 1);
    }

    #[test]
    fn never_more_than_n_in_any_window_of_the_period() {
        for s in [
            "1/3s", "3/1s", "5/250ms", "20/1m", "7/1s", "100/1s", "1000/1s",
        ] {
            let r = rate(s);
            let (n, p) = (r.count as u64, r.period_ms);
            let ticks = greedy(&mut Limiter::new(r), 1_000_000, 50 * n as usize);
            assert_eq!(max_in_window(&ticks, p), n as usize, "{s}");
            // And it does not under-deliver: bursts of N, one period (+1 ms) apart.
            let span = ticks.last().unwrap() - ticks[0];
            assert_eq!(span, 49 * (p + 1), "{s}");
        }
    }

    #[test]
    fn irregular_callers_never_exceed_n_per_window() {
        for s in ["1/200ms", "3/1s", "5/250ms", "7/100ms", "20/1m"] {
            let r = rate(s);
            let (n, p) = (u64::from(r.count), r.period_ms);
            let mut l = Limiter::new(r);
            let mut x: u64 = 0x2545_F491_4F6C_DD1D;
            let mut now = 10_000u64;
            let mut sent: Vec<u64> = Vec::new();
            for _ in 0..4_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                now = match x % 10 {
                    0..=4 => now,                    // same tick
                    5..=7 => now + x % (p / n + 2),  // a little later
                    8 => now + x % (3 * p),          // a while later
                    _ => now.saturating_sub(x % 50), // the clock stepped back
                };
                let tick = now.max(sent.last().copied().unwrap_or(0));
                match l.try_acquire(now) {
                    Ok(()) => sent.push(tick),
                    Err(at) => {
                        assert!(at > tick, "{s}: Err({at}) at {tick}");
                        assert!(l.clone().try_acquire(at).is_ok(), "{s}: {at} refused");
                    }
                }
            }
            assert!(sent.len() > 100, "{s}: only {} sends", sent.len());
            assert!(max_in_window(&sent, p) <= n as usize, "{s}");
        }
    }

    #[test]
    fn time_going_backwards_is_clamped() {
        let mut l = Limiter::new(rate("1/1s"));
        assert_eq!(l.try_acquire(10_000), Ok(()));
        // An earlier tick is treated as the latest one seen: no panic, no early slot.
        assert_eq!(l.try_acquire(5_000), Err(11_001));
        assert_eq!(l.next_free_ms(0), 11_001);
        assert_eq!(l.try_acquire(11_001), Ok(()));
        // Extremes neither overflow nor panic.
        let mut l = Limiter::new(Rate {
            count: 1,
            period_ms: u64::MAX,
        });
        assert_eq!(l.try_acquire(u64::MAX), Ok(()));
        let _ = l.try_acquire(u64::MAX);
        let _ = l.next_free_ms(u64::MAX);
        assert!(parse_rate("100001/1s").is_err());
    }
}

//! Per-channel rate limit `N/period` as a GCRA (generic cell rate algorithm). Pure: the caller
//! passes `now_ms` and puts a send that may not go yet back on its timing wheel at the instant
//! the limiter names — nothing sleeps (DESIGN.md, "rate limiting *is* scheduling").
//!
//! Semantics: emission interval `T = period / N`, burst tolerance `τ = (N - 1)·T`. From idle up
//! to `N` sends go at once; after that one more every `T`, so the long-run rate is `N` per
//! `period`. Like every token bucket with capacity `N`, a window of length `period` can hold up
//! to `2N - 1` sends (a full burst, then the `N - 1` slots that refill during that window). For
//! `N = 1` this is exactly "at most one send per period". A downstream that enforces a strict
//! "`N` in any `period`" needs the burst-free spelling of the same rate: `1/3s` instead of
//! `20/1m`.
//!
//! Exactness: all instants are kept scaled by `N` (one unit = `1/N` ms), which makes `T` the
//! integer `period_ms` — no rounding, no drift for rates like `3/1s` (`T = 333.3… ms`).
//!
//! Millisecond ticks: `now_ms` is the truncated millisecond in which the send starts, so the
//! real start lies somewhere in `[now_ms, now_ms + 1)`. The limiter guarantees GCRA conformance
//! for *every* placement of the real starts inside their ticks: a send is admitted at tick `t`
//! only if `t ≥ t_j + 1 + m·T` for every earlier send `j` that, together with this one, spans
//! `m + N` sends with `m ≥ 1` (the earlier send taken at the *end* of its tick, this one at the
//! *start* of its own). In the recursion this is "a send at `t` updates the theoretical arrival
//! time as if it happened at `t + 1`": after a `1/200ms` send at `t` the next is refused until
//! `t + 201`, so two sends are at least 200 ms apart in real time. Sends within one tick are
//! bounded by `N` alone (nothing in the tick can be `T` apart from anything else in it), which
//! keeps a full burst of `N` possible within a single tick. The price of the guarantee is one
//! millisecond per busy stretch: a channel kept busy at `1/3s` sends once per 3.001 s.

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
    let period_ms = parse_duration_ms(period).map_err(|e| format!("invalid rate {s:?}: {e}"))?;
    if period_ms == 0 {
        return Err(format!("invalid rate {s:?}: period must be more than 0"));
    }
    Ok(Rate { count, period_ms })
}

/// GCRA state of one channel, shared by every task sending on it.
///
/// Invariants (instants in scaled units, `ms · N`): `tat_before` is the theoretical arrival
/// time after every admitted send in ticks before `tick`; `in_tick ≤ N` sends were admitted in
/// `tick`; `tick` never decreases.
#[derive(Clone, Debug)]
pub struct Limiter {
    rate: Rate,
    /// `N`.
    n: u128,
    /// Emission interval `T`, scaled: exactly `period_ms`.
    t: u128,
    /// Burst tolerance `τ = (N - 1)·T`, scaled.
    tau: u128,
    tat_before: u128,
    tick: u64,
    in_tick: u32,
}

impl Limiter {
    /// A limiter with a full burst available. A zero count or period (which [`parse_rate`]
    /// never produces) is raised to 1 rather than dividing by zero.
    pub fn new(rate: Rate) -> Limiter {
        let rate = Rate {
            count: rate.count.max(1),
            period_ms: rate.period_ms.max(1),
        };
        let n = u128::from(rate.count);
        let t = u128::from(rate.period_ms);
        Limiter {
            rate,
            n,
            t,
            tau: (n - 1) * t,
            tat_before: 0,
            tick: 0,
            in_tick: 0,
        }
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Tries to take a slot for a send starting in the millisecond `now_ms`. `Ok(())`: go now,
    /// the slot is consumed. `Err(at)`: not before `at` (> `now_ms`), nothing consumed; if no
    /// other send is admitted meanwhile, `try_acquire(at)` succeeds. Time going backwards is
    /// clamped to the latest `now_ms` seen (never a panic, never an early slot).
    pub fn try_acquire(&mut self, now_ms: u64) -> Result<(), u64> {
        let now = now_ms.max(self.tick);
        if now > self.tick {
            // A new tick: the sends of the previous one become ordinary history.
            self.tat_before = self.tat();
            self.tick = now;
            self.in_tick = 0;
        }
        let c = u128::from(self.in_tick);
        // Earlier ticks: now ≥ tat_before + c·T − τ (see the module docs); this tick: < N sends.
        if c < self.n && now as u128 * self.n + self.tau >= self.tat_before + c * self.t {
            self.in_tick += 1;
            Ok(())
        } else {
            Err(self.earliest_later_tick())
        }
    }

    /// When the next send could go (for a status view); `<= now_ms` means "now".
    pub fn next_free_ms(&self, now_ms: u64) -> u64 {
        match self.clone().try_acquire(now_ms) {
            Ok(()) => now_ms,
            Err(at) => at,
        }
    }

    /// Theoretical arrival time after every admitted send, each taken at the end of its tick.
    fn tat(&self) -> u128 {
        if self.in_tick == 0 {
            self.tat_before
        } else {
            let end_of_tick = (u128::from(self.tick) + 1) * self.n;
            self.tat_before.max(end_of_tick) + u128::from(self.in_tick) * self.t
        }
    }

    /// First tick after `tick` at which a send would be admitted: `ceil((TAT − τ) / N)`.
    fn earliest_later_tick(&self) -> u64 {
        let at = self.tat().saturating_sub(self.tau).div_ceil(self.n);
        u64::try_from(at)
            .unwrap_or(u64::MAX)
            .max(self.tick.saturating_add(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> Rate {
        parse_rate(s).unwrap()
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
            ("4294967295/1d", u32::MAX, 86_400_000),
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
    fn burst_then_spacing() {
        // 5/250ms: T = 50 ms. A full burst of 5 inside one millisecond, then one every 50 ms
        // (plus the one millisecond of "end of tick" at the start of the busy stretch).
        let mut l = Limiter::new(rate("5/250ms"));
        let t0 = 1_800_000_000_000;
        for _ in 0..5 {
            assert_eq!(l.try_acquire(t0), Ok(()));
        }
        // TAT = t0 + 1 + 250; the next goes when TAT − τ = t0 + 51 is reached.
        assert_eq!(l.try_acquire(t0), Err(t0 + 51));
        assert_eq!(l.try_acquire(t0 + 50), Err(t0 + 51));
        assert_eq!(l.next_free_ms(t0 + 20), t0 + 51);
        assert_eq!(l.try_acquire(t0 + 51), Ok(()));
        assert_eq!(l.try_acquire(t0 + 51), Err(t0 + 101));
        assert_eq!(l.try_acquire(t0 + 101), Ok(()));
        // Idle for a full period: the whole burst is back.
        let later = t0 + 1_000;
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
        // Strictly one per period in any real window, for N = 1.
        assert_eq!(max_in_window(&ticks, 200), 1);
    }

    #[test]
    fn sustained_rate_in_sliding_windows() {
        for s in [
            "1/3s", "3/1s", "5/250ms", "20/1m", "7/1s", "100/1s", "1000/1s",
        ] {
            let r = rate(s);
            let (n, p) = (r.count as u64, r.period_ms);
            let mut l = Limiter::new(r);
            let ticks = greedy(&mut l, 1_000_000, 50 * n as usize);
            // GCRA bound for a real window of length L: at most N + floor((L − 1)·N / P)
            // sends. For L = P that is 2N − 1 (reached from idle); over longer windows the
            // excess over N per period never grows: the rate is N per period.
            for periods in [1, 2, 10] {
                let len = periods * p;
                let bound = (n + (len - 1) * n / p) as usize;
                let got = max_in_window(&ticks, len);
                assert!(got <= bound, "{s}: {got} sends in {len} ms > {bound}");
            }
            // The documented 2N − 1 per period is really reached (burst, then refills).
            assert_eq!(max_in_window(&ticks, p), 2 * n as usize - 1, "{s}");
            // Once the initial burst is spent the limiter keeps to N per period exactly.
            assert!(
                max_in_window(&ticks[n as usize..], p) <= n as usize + 1,
                "{s}"
            );
            assert!(
                max_in_window(&ticks[2 * n as usize..], p - 1) <= n as usize,
                "{s}"
            );
            // And it does not under-deliver: 50·N sends take 49 periods, plus the end-of-tick
            // millisecond once per busy stretch. With N = 1 every send starts a new stretch
            // (nothing is left of the burst), so there it is one per `period + 1 ms`.
            let span = ticks.last().unwrap() - ticks[0];
            let expect = if n == 1 { 49 * (p + 1) } else { 49 * p + 1 };
            assert_eq!(span, expect, "{s}");
        }
    }

    #[test]
    fn irregular_callers_keep_the_real_time_guarantee() {
        // Callers at pseudo-random ticks (bursts within a tick, gaps, the odd step back in
        // time). Every pair of admitted sends p < q that spans c = q − p + 1 > N sends must be
        // (c − N)·T apart in real time whatever their places inside their ticks:
        // a_q − (a_p + 1) ≥ (c − N)·P / N, in integers N·(a_q − a_p − 1) ≥ (c − N)·P.
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
            for q in 0..sent.len() {
                for pp in (0..q).rev() {
                    let c = (q - pp + 1) as u64;
                    if c <= n {
                        continue;
                    }
                    let gap = sent[q] as i128 - sent[pp] as i128 - 1;
                    assert!(
                        n as i128 * gap >= ((c - n) * p) as i128,
                        "{s}: sends {pp}..={q} at {} and {}",
                        sent[pp],
                        sent[q]
                    );
                }
            }
        }
    }

    #[test]
    fn three_per_second_does_not_drift() {
        let mut l = Limiter::new(rate("3/1s"));
        let ticks = greedy(&mut l, 0, 10_000);
        assert_eq!(&ticks[..3], &[0, 0, 0]);
        // Scaled by 3, TAT after k sends (busy since tick 0, end of tick = 1 ms) is
        // 3 + 1000·k, so send k ≥ 3 goes at ceil((3 + 1000·k − 2000) / 3) exactly.
        for (k, &t) in ticks.iter().enumerate().skip(3) {
            let expect = (3 + 1_000 * k as u64 - 2_000).div_ceil(3);
            assert_eq!(t, expect, "send {k}");
        }
        // 10 000 sends at 333.3 ms: 9 997 intervals after the burst, to the millisecond.
        assert_eq!(*ticks.last().unwrap(), 3_332_335);
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
            count: u32::MAX,
            period_ms: u64::MAX,
        });
        assert_eq!(l.try_acquire(u64::MAX), Ok(()));
        let mut l = Limiter::new(Rate {
            count: 0,
            period_ms: 0,
        });
        assert_eq!(l.try_acquire(u64::MAX), Ok(()));
        assert_eq!(l.try_acquire(u64::MAX), Err(u64::MAX));
    }
}

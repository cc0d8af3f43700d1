//! Per-channel circuit breaker (DESIGN.md, "Delivery semantics"). Pure: the caller passes
//! `now_ms`. When too many sends to a channel fail, the channel *opens*: sends are held (put
//! back on the wheel), not failed, and an alert is raised; after a cool-down one probe is let
//! through, and its outcome closes the channel again or re-opens it.
//!
//! ```text
//! Closed ──failures/requests ≥ ratio over the window (≥ min_requests)──▶ Open{until}   [Opened]
//! Open ──admit at/after until──▶ HalfOpen (one probe in flight)
//! HalfOpen ──probe succeeded──▶ Closed, window cleared                               [Closed]
//! HalfOpen ──probe failed──▶ Open{now + cool_down}      (no second alert: still the same outage)
//! ```
//!
//! Calling order: ask the rate limiter first, the breaker second, and give the limiter's slot
//! back when the breaker holds the send (`Channel::admit`): a slot kept for a send that never
//! started would push the channel's next sends later, the probe's and those after it. A probe
//! taken and not used blocks the channel until [`Breaker::abandon_probe`] or until its lease
//! runs out (`cool_down`, or one attempt's longest duration if that is longer:
//! [`Breaker::set_probe_lease`]), after which another probe is admitted.

use crate::model::parse_duration_ms;

/// The sliding window is this many buckets of `window_ms / BUCKETS` each, so memory is fixed.
const BUCKETS: usize = 10;
/// Longest re-check delay for a send held while a probe is in flight.
const PROBE_RECHECK_MS_MAX: u64 = 1_000;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerConfig {
    pub window_ms: u64,
    pub min_requests: u32,
    pub failure_ratio: f64,
    pub cool_down_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> BreakerConfig {
        BreakerConfig {
            window_ms: 60_000,
            min_requests: 20,
            failure_ratio: 0.5,
            cool_down_ms: 30_000,
        }
    }
}

impl BreakerConfig {
    /// Checks the ranges; the error names the sub-key (`"failure_ratio: must be in (0, 1]"`).
    pub fn validate(&self) -> Result<(), String> {
        if self.window_ms == 0 {
            return Err("window: must be more than 0".into());
        }
        if self.min_requests == 0 {
            return Err("min_requests: must be at least 1".into());
        }
        // Written so that NaN fails too.
        if !(self.failure_ratio > 0.0 && self.failure_ratio <= 1.0) {
            return Err("failure_ratio: must be in (0, 1]".into());
        }
        if self.cool_down_ms == 0 {
            return Err("cool_down: must be more than 0".into());
        }
        Ok(())
    }
}

/// Reads a channel's `breaker = { window = "60s", min_requests = 20, failure_ratio = 0.5,
/// cool_down = "30s" }`; missing keys take the defaults, unknown keys are errors. The error
/// names the sub-key; the caller adds `channels.x.breaker.`.
pub fn parse_breaker(table: &toml::Table) -> Result<BreakerConfig, String> {
    let mut cfg = BreakerConfig::default();
    for (key, value) in table {
        match key.as_str() {
            "window" => cfg.window_ms = duration(key, value)?,
            "cool_down" => cfg.cool_down_ms = duration(key, value)?,
            "min_requests" => {
                cfg.min_requests = value
                    .as_integer()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| format!("{key}: expected a whole number, got {value}"))?
            }
            "failure_ratio" => {
                cfg.failure_ratio = match value {
                    toml::Value::Float(f) => *f,
                    toml::Value::Integer(i) => *i as f64,
                    _ => return Err(format!("{key}: expected a number, got {value}")),
                }
            }
            other => {
                return Err(format!(
                    "unknown key {other:?}; expected window, min_requests, failure_ratio, cool_down"
                ))
            }
        }
    }
    cfg.validate()?;
    Ok(cfg)
}

fn duration(key: &str, value: &toml::Value) -> Result<u64, String> {
    let s = value
        .as_str()
        .ok_or_else(|| format!("{key}: expected a duration string like \"30s\", got {value}"))?;
    parse_duration_ms(s).map_err(|e| format!("{key}: {e}"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open { until_ms: u64 },
    HalfOpen,
}

/// The breaker's answer to "may a send start now?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Go.
    Yes,
    /// Go, as the one probe of a half-open channel: report with `was_probe = true`.
    Probe,
    /// Hold the send (do not fail it) and ask again at this instant.
    HoldUntil(u64),
}

/// A state flip worth an alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Opened,
    Closed,
}

/// Outcomes in `[epoch · width, (epoch + 1) · width)`.
#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    epoch: u64,
    requests: u32,
    failures: u32,
}

/// Breaker state of one channel.
///
/// Window: bucket `b = now / width` lives in slot `b % BUCKETS`; a slot counts only while its
/// epoch is one of the last `BUCKETS` (the current one included). So an outcome is counted for
/// at least `9·width` and at most `10·width ≤ window_ms` (width = `window_ms / 10`, at least
/// 1 ms).
#[derive(Clone, Debug)]
pub struct Breaker {
    cfg: BreakerConfig,
    width_ms: u64,
    buckets: [Bucket; BUCKETS],
    state: BreakerState,
    /// HalfOpen only: when the probe in flight was admitted (`None`: no probe in flight).
    probe_since_ms: Option<u64>,
    /// How long a probe in flight holds the half-open channel before it is presumed lost; at
    /// least `cool_down`.
    probe_lease_ms: u64,
    /// Latest monotonic `now` seen; earlier instants are clamped to it.
    last_ms: u64,
    /// Open only: the end of the cool-down on the monotonic clock (`state` carries the wall
    /// instant it was expected at, for status views).
    open_until_mono: u64,
    /// Windows and cool-downs are measured on its monotonic clock: a wall jump neither ends a
    /// cool-down early nor empties the window.
    durations: crate::clock::Durations,
}

impl Breaker {
    pub fn new(cfg: BreakerConfig) -> Breaker {
        Breaker {
            cfg,
            width_ms: (cfg.window_ms / BUCKETS as u64).max(1),
            buckets: [Bucket::default(); BUCKETS],
            state: BreakerState::Closed,
            probe_since_ms: None,
            probe_lease_ms: cfg.cool_down_ms,
            last_ms: 0,
            open_until_mono: 0,
            durations: Default::default(),
        }
    }

    /// Measures on `durations`' monotonic clock (the server's breakers do).
    pub fn with_durations(mut self, durations: crate::clock::Durations) -> Breaker {
        self.durations = durations;
        self
    }

    /// A probe in flight is presumed lost only once it is older than `attempt_ms` (the
    /// channel's longest attempt: `Channel::attempt_bound_ms`) or `cool_down`, whichever is
    /// longer. Otherwise a receiver that hangs for longer than `cool_down` would get a new
    /// probe every `cool_down` while the first is still under way.
    pub fn set_probe_lease(&mut self, attempt_ms: u64) {
        self.probe_lease_ms = self.cfg.cool_down_ms.max(attempt_ms);
    }

    /// May a send start now? Closed → `Yes`. Open before `until` → `HoldUntil(until)`. Open
    /// at/after `until` → HalfOpen and `Probe`. HalfOpen with a probe in flight →
    /// `HoldUntil(now + min(cool_down, 1s))` (never past the probe's lease), or a new `Probe`
    /// once the probe in flight is older than its lease (presumed lost: its send never
    /// happened or never reported; [`Breaker::set_probe_lease`]).
    pub fn admit(&mut self, now_ms: u64) -> Admit {
        let mono = self.durations.mono(now_ms);
        match self.admit_mono(mono) {
            Admit::HoldUntil(at) => {
                Admit::HoldUntil(crate::clock::Durations::wall_at(now_ms, mono, at))
            }
            a => a,
        }
    }

    /// [`Breaker::admit`] on the monotonic clock.
    fn admit_mono(&mut self, now_ms: u64) -> Admit {
        let now = self.clamp(now_ms);
        match self.state {
            BreakerState::Closed => Admit::Yes,
            BreakerState::Open { .. } if now < self.open_until_mono => {
                Admit::HoldUntil(self.open_until_mono)
            }
            BreakerState::Open { .. } => {
                self.state = BreakerState::HalfOpen;
                self.probe_since_ms = Some(now);
                Admit::Probe
            }
            BreakerState::HalfOpen => match self.probe_since_ms {
                Some(since) if now < since.saturating_add(self.probe_lease_ms) => {
                    let recheck = self.cfg.cool_down_ms.clamp(1, PROBE_RECHECK_MS_MAX);
                    let lease_end = since.saturating_add(self.probe_lease_ms);
                    Admit::HoldUntil(now.saturating_add(recheck).min(lease_end))
                }
                _ => {
                    self.probe_since_ms = Some(now);
                    Admit::Probe
                }
            },
        }
    }

    /// Gives back a probe that was admitted but will not be sent (task cancelled, limiter said
    /// "later"), so the next `admit` can probe at once instead of waiting out the lease.
    pub fn abandon_probe(&mut self) {
        if self.state == BreakerState::HalfOpen {
            self.probe_since_ms = None;
        }
    }

    /// Outcome of an admitted send: `success` = the channel accepted it (a permanent 4xx counts
    /// as success: the channel is up); failure = a retryable failure (5xx, 429, timeout,
    /// connection error — the caller decides).
    ///
    /// Returns `Opened` when Closed flips to Open (only a failure can do that), `Closed` when a
    /// probe succeeds (the window is cleared, so the outage does not count against the fresh
    /// start). A failed probe re-opens for a new cool-down and returns `None`: it is the same
    /// outage, already alerted. Outcomes that arrive while Open, or non-probe outcomes while
    /// HalfOpen (sends admitted before the channel opened), change nothing. A probe outcome
    /// arriving when Closed (a presumed-lost probe reporting late) counts as an ordinary one.
    pub fn record(&mut self, now_ms: u64, success: bool, was_probe: bool) -> Option<Transition> {
        let mono = self.durations.mono(now_ms);
        let now = self.clamp(mono);
        match self.state {
            BreakerState::Closed => {
                self.count(now, success);
                if success {
                    return None;
                }
                let (requests, failures) = self.totals(now);
                let tripped = requests >= u64::from(self.cfg.min_requests)
                    && failures as f64 >= self.cfg.failure_ratio * requests as f64;
                if tripped {
                    self.open(now, now_ms);
                    return Some(Transition::Opened);
                }
                None
            }
            BreakerState::HalfOpen if was_probe => {
                if success {
                    self.state = BreakerState::Closed;
                    self.probe_since_ms = None;
                    self.buckets = [Bucket::default(); BUCKETS];
                    Some(Transition::Closed)
                } else {
                    self.open(now, now_ms);
                    None
                }
            }
            BreakerState::HalfOpen | BreakerState::Open { .. } => None,
        }
    }

    /// Open: the wall instant its cool-down ends at, measured now on the monotonic clock as
    /// [`Breaker::admit`] measures it (the `until_ms` of [`BreakerState::Open`] is the wall
    /// instant expected when it opened: too late after the wall steps back, too early after
    /// it jumps forward). Never before `now_ms`. `None`: not open.
    pub fn open_until(&self, now_ms: u64) -> Option<u64> {
        match self.state {
            BreakerState::Open { .. } => {
                let mono = self.durations.mono(now_ms);
                Some(crate::clock::Durations::wall_at(
                    now_ms,
                    mono,
                    self.open_until_mono,
                ))
            }
            _ => None,
        }
    }

    /// The state as of the last call; an Open whose cool-down has passed turns HalfOpen on the
    /// next [`Breaker::admit`].
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Share of successes over the window (`None` when it holds no requests), for the
    /// channels status view.
    pub fn success_ratio(&self, now_ms: u64) -> Option<f64> {
        let mono = self.durations.mono(now_ms);
        let (requests, failures) = self.totals(mono.max(self.last_ms));
        (requests > 0).then(|| (requests - failures) as f64 / requests as f64)
    }

    fn clamp(&mut self, now_ms: u64) -> u64 {
        self.last_ms = self.last_ms.max(now_ms);
        self.last_ms
    }

    /// Opens at monotonic `now` (wall `wall_now`) for one cool-down.
    fn open(&mut self, now: u64, wall_now: u64) {
        self.open_until_mono = now.saturating_add(self.cfg.cool_down_ms);
        self.state = BreakerState::Open {
            until_ms: wall_now.saturating_add(self.cfg.cool_down_ms),
        };
        self.probe_since_ms = None;
    }

    fn count(&mut self, now: u64, success: bool) {
        let epoch = now / self.width_ms;
        // `epoch % BUCKETS` is below BUCKETS, the length of `buckets`: the slot always exists.
        let Some(b) = self.buckets.get_mut((epoch % BUCKETS as u64) as usize) else {
            return;
        };
        if b.epoch != epoch {
            // The slot held an epoch at least BUCKETS old: it has left the window.
            *b = Bucket {
                epoch,
                ..Bucket::default()
            };
        }
        b.requests = b.requests.saturating_add(1);
        if !success {
            b.failures = b.failures.saturating_add(1);
        }
    }

    /// (requests, failures) in the window ending at `now`.
    fn totals(&self, now: u64) -> (u64, u64) {
        let epoch = now / self.width_ms;
        self.buckets
            .iter()
            .filter(|b| b.epoch <= epoch && epoch - b.epoch < BUCKETS as u64)
            .fold((0, 0), |(r, f), b| {
                (r + u64::from(b.requests), f + u64::from(b.failures))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forward_wall_jump_does_not_end_a_cool_down() {
        use crate::clock::{Clock, Durations, ManualClock};
        let clock = std::sync::Arc::new(ManualClock::new(1_000_000));
        let cfg = BreakerConfig {
            failure_ratio: 0.5,
            min_requests: 1,
            window_ms: 10_000,
            cool_down_ms: 5_000,
        };
        let mut b = Breaker::new(cfg).with_durations(Durations::of(clock.clone()));
        assert_eq!(b.admit(clock.now_ms()), Admit::Yes);
        assert_eq!(
            b.record(clock.now_ms(), false, false),
            Some(Transition::Opened)
        );
        clock.advance(1_000);
        clock.jump_wall(3_600_000);
        let now = clock.now_ms();
        assert_eq!(
            b.admit(now),
            Admit::HoldUntil(now + 4_000),
            "4 s of cool-down left"
        );
        clock.advance(4_000);
        assert_eq!(b.admit(clock.now_ms()), Admit::Probe);
    }

    const T0: u64 = 1_800_000_000_000;

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            window_ms: 10_000,
            min_requests: 10,
            failure_ratio: 0.5,
            cool_down_ms: 5_000,
        }
    }

    fn record_n(b: &mut Breaker, now: u64, n: u32, success: bool) -> Vec<Transition> {
        (0..n)
            .filter_map(|_| b.record(now, success, false))
            .collect()
    }

    #[test]
    fn opens_at_threshold_but_not_below_min_requests() {
        let mut b = Breaker::new(cfg());
        // 9 failures out of 9: ratio 1, but fewer than min_requests.
        assert!(record_n(&mut b, T0, 9, false).is_empty());
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.admit(T0), Admit::Yes);
        // The 10th request, a failure, trips it.
        assert_eq!(b.record(T0 + 1, false, false), Some(Transition::Opened));
        assert_eq!(
            b.state(),
            BreakerState::Open {
                until_ms: T0 + 1 + 5_000
            }
        );

        // Exactly at the ratio: 5 successes, then failures; opens at 5 of 10.
        let mut b = Breaker::new(cfg());
        assert!(record_n(&mut b, T0, 5, true).is_empty());
        assert!(record_n(&mut b, T0, 4, false).is_empty());
        assert_eq!(b.record(T0, false, false), Some(Transition::Opened));

        // Below the ratio it stays closed however many requests.
        let mut b = Breaker::new(cfg());
        for _ in 0..100 {
            assert_eq!(b.record(T0, true, false), None);
            assert_eq!(b.record(T0, true, false), None);
            assert_eq!(b.record(T0, false, false), None);
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn holds_until_cool_down_then_single_probe() {
        let mut b = Breaker::new(cfg());
        assert_eq!(record_n(&mut b, T0, 10, false), vec![Transition::Opened]);
        let until = T0 + 5_000;
        assert_eq!(b.admit(T0), Admit::HoldUntil(until));
        assert_eq!(b.admit(until - 1), Admit::HoldUntil(until));
        // Stragglers admitted before the opening change nothing.
        assert_eq!(b.record(T0 + 10, true, false), None);
        assert_eq!(b.admit(until), Admit::Probe);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        // Exactly one probe in flight: everyone else re-checks shortly.
        assert_eq!(b.admit(until), Admit::HoldUntil(until + 1_000));
        assert_eq!(b.admit(until + 300), Admit::HoldUntil(until + 1_300));
        assert_eq!(b.record(until + 400, false, false), None);
        assert_eq!(b.state(), BreakerState::HalfOpen);
    }

    #[test]
    fn failed_probe_reopens_without_a_second_alert() {
        let mut b = Breaker::new(cfg());
        assert_eq!(record_n(&mut b, T0, 10, false), vec![Transition::Opened]);
        assert_eq!(b.admit(T0 + 5_000), Admit::Probe);
        assert_eq!(b.record(T0 + 5_200, false, true), None);
        assert_eq!(
            b.state(),
            BreakerState::Open {
                until_ms: T0 + 10_200
            }
        );
        assert_eq!(b.admit(T0 + 10_199), Admit::HoldUntil(T0 + 10_200));
        assert_eq!(b.admit(T0 + 10_200), Admit::Probe);
    }

    #[test]
    fn probe_success_closes_with_a_fresh_window() {
        let mut b = Breaker::new(cfg());
        record_n(&mut b, T0, 10, false);
        assert_eq!(b.admit(T0 + 5_000), Admit::Probe);
        assert_eq!(b.record(T0 + 5_100, true, true), Some(Transition::Closed));
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.admit(T0 + 5_100), Admit::Yes);
        // The outage's failures are gone: 9 new failures are below min_requests again.
        assert_eq!(b.success_ratio(T0 + 5_100), None);
        assert!(record_n(&mut b, T0 + 5_200, 9, false).is_empty());
        assert_eq!(b.record(T0 + 5_200, false, false), Some(Transition::Opened));
    }

    #[test]
    fn lost_probe_is_replaced_after_its_lease_or_when_abandoned() {
        let mut b = Breaker::new(cfg());
        record_n(&mut b, T0, 10, false);
        let half = T0 + 5_000;
        assert_eq!(b.admit(half), Admit::Probe);
        // The re-check never points past the lease.
        assert_eq!(b.admit(half + 4_500), Admit::HoldUntil(half + 5_000));
        assert_eq!(b.admit(half + 5_000), Admit::Probe);
        b.abandon_probe();
        assert_eq!(b.admit(half + 5_001), Admit::Probe);
        // A probe that reports after another closed the breaker counts as an ordinary outcome.
        assert_eq!(b.record(half + 5_002, true, true), Some(Transition::Closed));
        assert_eq!(b.record(half + 5_003, false, true), None);
        assert_eq!(b.success_ratio(half + 5_003), Some(0.0));
    }

    #[test]
    fn a_probe_is_leased_for_the_longest_attempt() {
        // cool_down 5 s, but one attempt may take 30 s + 2 s: a probe to a receiver that hangs
        // is not replaced while it may still be under way.
        let mut b = Breaker::new(cfg());
        b.set_probe_lease(32_000);
        record_n(&mut b, T0, 10, false);
        let half = T0 + 5_000;
        assert_eq!(b.admit(half), Admit::Probe);
        for at in [half + 5_000, half + 10_000, half + 30_000] {
            assert_eq!(
                b.admit(at),
                Admit::HoldUntil(at + 1_000),
                "at +{}",
                at - half
            );
        }
        assert_eq!(b.admit(half + 31_900), Admit::HoldUntil(half + 32_000));
        assert_eq!(b.admit(half + 32_000), Admit::Probe, "presumed lost now");
        // A bound shorter than cool_down leaves the lease at cool_down.
        let mut b = Breaker::new(cfg());
        b.set_probe_lease(1_000);
        record_n(&mut b, T0, 10, false);
        assert_eq!(b.admit(half), Admit::Probe);
        assert_eq!(b.admit(half + 4_999), Admit::HoldUntil(half + 5_000));
        assert_eq!(b.admit(half + 5_000), Admit::Probe);
    }

    #[test]
    fn old_failures_age_out_of_the_window() {
        let mut b = Breaker::new(cfg());
        // 9 failures, then quiet for longer than the window.
        record_n(&mut b, T0, 9, false);
        assert_eq!(b.success_ratio(T0 + 9_000), Some(0.0));
        assert_eq!(b.success_ratio(T0 + 10_000), None);
        // One more failure much later does not meet 9 old ones.
        assert_eq!(b.record(T0 + 10_000, false, false), None);
        assert_eq!(b.state(), BreakerState::Closed);
        // Slots are reused as the ring wraps: a long steady stream stays bounded and correct.
        let mut b = Breaker::new(cfg());
        for i in 0..1_000 {
            // One request every 100 ms, every 4th fails: ratio 0.25, never opens.
            assert_eq!(b.record(T0 + i * 100, i % 4 != 0, false), None);
        }
        let r = b.success_ratio(T0 + 99_900).unwrap();
        assert!((0.74..=0.76).contains(&r), "{r}");
    }

    #[test]
    fn success_ratio_view_and_backwards_time() {
        let mut b = Breaker::new(cfg());
        assert_eq!(b.success_ratio(T0), None);
        record_n(&mut b, T0, 3, true);
        record_n(&mut b, T0, 1, false);
        assert_eq!(b.success_ratio(T0), Some(0.75));
        // Time going backwards is clamped: no panic, same view.
        assert_eq!(b.record(T0 - 50_000, true, false), None);
        assert_eq!(b.success_ratio(0), Some(0.8));
        assert_eq!(b.admit(0), Admit::Yes);
    }

    #[test]
    fn config_defaults_and_parsing() {
        let d = BreakerConfig::default();
        assert_eq!(
            (d.window_ms, d.min_requests, d.failure_ratio, d.cool_down_ms),
            (60_000, 20, 0.5, 30_000)
        );
        let parse = |s: &str| parse_breaker(&s.parse::<toml::Table>().unwrap());
        assert_eq!(parse(""), Ok(d));
        assert_eq!(
            parse("window = \"10s\"\nmin_requests = 5\nfailure_ratio = 1\ncool_down = \"1m\""),
            Ok(BreakerConfig {
                window_ms: 10_000,
                min_requests: 5,
                failure_ratio: 1.0,
                cool_down_ms: 60_000,
            })
        );
        for (s, err) in [
            ("failure_ratio = 0.0", "failure_ratio: must be in (0, 1]"),
            ("failure_ratio = 1.5", "failure_ratio: must be in (0, 1]"),
            ("failure_ratio = nan", "failure_ratio: must be in (0, 1]"),
            (
                "failure_ratio = \"half\"",
                "failure_ratio: expected a number",
            ),
            ("min_requests = 0", "min_requests: must be at least 1"),
            ("min_requests = -1", "min_requests: expected a whole number"),
            ("window = \"0s\"", "window: must be more than 0"),
            ("window = 60", "window: expected a duration"),
            ("cool_down = \"3 s\"", "cool_down: invalid duration"),
            ("cool_down = \"0ms\"", "cool_down: must be more than 0"),
            ("windw = \"1s\"", "unknown key \"windw\""),
        ] {
            let e = parse(s).unwrap_err();
            assert!(e.starts_with(err), "{s}: {e}");
        }
    }
}

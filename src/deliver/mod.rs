//! Channels: where messages go. A channel is operator-configured (never a raw URL in a task)
//! and has a sink — `log`, `file` (JSON lines) or `webhook` — plus its own timeout, default
//! retry policy, concurrency cap, rate limit (`ratelimit`), circuit breaker (`breaker`) and
//! webhook signing (`sign`).
//!
//! Sinks turn one [`Delivery`] into an [`Outcome`]; they never touch the store and never
//! decide about retries beyond classifying what happened (the run's cursor does that).

pub mod backoff;
pub mod breaker;
pub mod classify;
pub mod file;
pub mod platform;
pub mod preset;
pub mod ratelimit;
pub mod sign;
pub mod success;
pub mod template;
pub mod token;
pub mod webhook;

use crate::logsafe::{Escaped, Opt};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::metrics::histogram::Histogram;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::model::{Outcome, RetryPolicy};
use breaker::{Admit, Breaker, BreakerState, Transition};
use ratelimit::Limiter;

/// One attempt to hand one message to a channel.
#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    pub task_id: String,
    pub run: u32,
    pub seq: u32,
    pub to: String,
    pub body: String,
    /// RFC 3339 UTC instant this message was due.
    pub scheduled_at: String,
    pub attempt: u32,
    pub idempotency_key: String,
    /// RFC 3339 UTC instant (ms) this attempt started: lets a receiver see herald's own pacing.
    pub sent_at: String,
    /// The message's `data` object as JSON text; in herald's own body as an object when set,
    /// and `data` in channel templates.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "data_as_object"
    )]
    pub data: Option<String>,
    /// `scheduled_at` in Unix ms (templates: `scheduled_at_ms`).
    #[serde(skip)]
    pub scheduled_at_ms: u64,
    /// Reminders: whole minutes from `scheduled_at` to the event (templates: `minutes_left`).
    #[serde(skip)]
    pub minutes_left: Option<u64>,
    /// The task's metadata (templates: `metadata`).
    #[serde(skip)]
    pub metadata: BTreeMap<String, String>,
    /// `"notify"` for a notification (API.md "Telling the person"), with what it is `about`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub about: Option<serde_json::Value>,
    /// The task's W3C trace (issue 25): every attempt's `traceparent` carries it, with a span
    /// of the attempt's own. Not in the body.
    #[serde(skip)]
    pub trace_id: [u8; 16],
    /// Cluster mode: the epoch of the task's shard this node sends under (HA.md "The send
    /// itself"), as the `herald-epoch` header, so a receiver can fence a stale sender too.
    #[serde(skip)]
    pub epoch: Option<u64>,
}

fn data_as_object<S: serde::Serializer>(data: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    let v: Option<serde_json::Value> = data
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok());
    serde::Serialize::serialize(&v, s)
}

/// What one attempt carries besides its delivery, and what it learnt (issue 25).
#[derive(Debug, Default)]
pub struct AttemptTrace {
    /// The `traceparent` header of this attempt (the task's trace, the attempt's own span);
    /// `None`: no header (alerts).
    pub traceparent: Option<String>,
    /// The answer's HTTP status; 0 when there was none (no answer, a local sink).
    pub status: std::sync::atomic::AtomicU32,
    /// The `herald-epoch` header (cluster mode); `None`: no header.
    pub epoch: Option<u64>,
}

impl AttemptTrace {
    pub fn status(&self) -> Option<u16> {
        match self.status.load(Ordering::Relaxed) {
            0 => None,
            s => u16::try_from(s).ok(),
        }
    }
}

/// What an attempt's timeline event records beyond its outcome ([`Channel::send_traced`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttemptReport {
    /// The answer's HTTP status (`None`: no answer, or a local sink).
    pub status: Option<u16>,
    /// How long the sink took (request to judged answer).
    pub duration_ms: u64,
    /// The attempt's span (in its `traceparent`).
    pub span_id: [u8; 8],
}

/// An alert event: a message entered the failure list, a breaker opened or closed.
#[derive(Debug, Clone, Serialize)]
pub struct Alert {
    /// Always `"herald.alert"`, so a receiver can tell alerts from deliveries.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `failure`, `breaker_opened`, `breaker_closed`, `failure_retry_failed`.
    pub event: &'static str,
    pub channel: String,
    pub task_id: Option<String>,
    pub failure_id: Option<String>,
    pub to: Option<String>,
    pub attempts: Option<u32>,
    pub error: Option<String>,
    pub at: String,
    /// Unique per alert; used as its idempotency key.
    pub id: String,
}

/// Where a channel sends.
pub enum Sink {
    /// Writes each delivery to the log (tracing, target `herald::delivery`). Always succeeds.
    Log,
    File(file::FileSink),
    Webhook(Box<webhook::WebhookSink>),
}

/// Counters for the channel view.
#[derive(Debug)]
pub struct ChannelStats {
    pub sent: AtomicU64,
    pub retryable_failures: AtomicU64,
    pub permanent_failures: AtomicU64,
    /// Times a send was held (rate limit, open breaker, local resource shortage) and put back
    /// on the wheel.
    pub held: AtomicU64,
    /// Of those, holds for a local resource shortage (too many open files, no buffer space).
    pub held_local: AtomicU64,
    /// How long attempts took (the sink's work: request to answer), in seconds, by outcome
    /// ([`OUTCOMES`] order).
    pub latency: [Histogram; 4],
}

/// Outcome labels of [`ChannelStats::latency`], in index order.
pub const OUTCOMES: [&str; 4] = ["sent", "retryable", "permanent", "held"];

/// Upper bounds (seconds) of the delivery latency buckets.
pub const LATENCY_BOUNDS_S: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

impl Default for ChannelStats {
    fn default() -> Self {
        ChannelStats {
            sent: AtomicU64::new(0),
            retryable_failures: AtomicU64::new(0),
            permanent_failures: AtomicU64::new(0),
            held: AtomicU64::new(0),
            held_local: AtomicU64::new(0),
            latency: std::array::from_fn(|_| Histogram::new(LATENCY_BOUNDS_S)),
        }
    }
}

impl ChannelStats {
    /// The latency histogram of an outcome ([`OUTCOMES`] order).
    fn latency_of(&self, o: &Outcome) -> &Histogram {
        let [sent, retry, permanent, held] = &self.latency;
        match o {
            Outcome::Sent => sent,
            Outcome::Retry { .. } => retry,
            Outcome::Permanent { .. } => permanent,
            Outcome::Held { .. } => held,
        }
    }
}

/// The answer to "may a send start on this channel now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Go; `probe` = this send is the breaker's half-open probe; `rate_tick`: where the rate
    /// limiter logged its slot ([`Channel::retake_rate`]), if the channel has one.
    Go { probe: bool, rate_tick: Option<u64> },
    /// Not before this instant (rate limit or open breaker); nothing is failed or burned.
    Hold { until_ms: u64, breaker: bool },
}

pub struct Channel {
    pub name: String,
    pub sink: Sink,
    /// Default retry policy for tasks on this channel that do not bring their own.
    pub retry: RetryPolicy,
    /// Caps sends in flight at once on this channel.
    pub concurrency: Arc<Semaphore>,
    pub concurrency_max: usize,
    pub limiter: Option<Mutex<Limiter>>,
    pub breaker: Option<Mutex<Breaker>>,
    pub stats: ChannelStats,
    /// Quiet hours of the channel (`quiet_hours`): tasks without their own window wait for
    /// its end (`schedule::quiet`).
    pub quiet_hours: Option<crate::schedule::quiet::QuietHours>,
    /// The trace of each task's attempts and the span export (shared by all channels:
    /// [`Channels::new`]).
    pub tracing: Arc<crate::trace::Tracing>,
}

impl Channel {
    /// A channel with no limiter, breaker or signing (tests and the default `log`).
    pub fn plain(name: &str, mut sink: Sink, retry: RetryPolicy, concurrency: usize) -> Channel {
        if let Sink::Webhook(w) = &mut sink {
            w.keep_drains(concurrency);
        }
        Channel {
            name: name.to_string(),
            sink,
            retry,
            concurrency: Arc::new(Semaphore::new(concurrency)),
            concurrency_max: concurrency,
            limiter: None,
            breaker: None,
            stats: ChannelStats::default(),
            quiet_hours: None,
            tracing: Arc::default(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self.sink {
            Sink::Log => "log",
            Sink::File(_) => "file",
            Sink::Webhook(_) => "webhook",
        }
    }

    /// How long one attempt may be under way at the receiver: the webhook's `timeout` (a
    /// local sink has nothing outside this process). Cluster mode's wait before an inherited
    /// in-flight mark is sent again (`engine/plan.rs::inherited_not_before`).
    pub fn send_timeout_ms(&self) -> u64 {
        match &self.sink {
            Sink::Webhook(w) => u64::try_from(w.timeout().as_millis()).unwrap_or(u64::MAX),
            Sink::Log | Sink::File(_) => 0,
        }
    }

    /// Sends in flight right now.
    pub fn in_flight(&self) -> usize {
        self.concurrency_max
            .saturating_sub(self.concurrency.available_permits())
    }

    /// May a send start at `now_ms`? Asks the rate limiter first (a slot taken for a send the
    /// breaker then holds costs nothing while the channel is down), then the breaker. Every
    /// `Go` must be followed by exactly one [`Channel::record`].
    pub fn admit(&self, now_ms: u64) -> Admission {
        let mut rate_tick = None;
        if let Some(l) = &self.limiter {
            match l.lock().try_take(now_ms) {
                Ok(tick) => rate_tick = Some(tick),
                Err(at) => {
                    self.stats.held.fetch_add(1, Ordering::Relaxed);
                    return Admission::Hold {
                        until_ms: at,
                        breaker: false,
                    };
                }
            }
        }
        let probe = match &self.breaker {
            Some(b) => match b.lock().admit(now_ms) {
                Admit::Yes => false,
                Admit::Probe => true,
                Admit::HoldUntil(at) => {
                    self.stats.held.fetch_add(1, Ordering::Relaxed);
                    return Admission::Hold {
                        until_ms: at,
                        breaker: true,
                    };
                }
            },
            None => false,
        };
        Admission::Go { probe, rate_tick }
    }

    /// A send admitted at `rate_tick` ([`Admission::Go`]) that waited for a free slot takes
    /// its rate slot again now, when it starts ([`ratelimit::Limiter::retake`]). `Err(at)`:
    /// not before `at` (counted as held).
    pub fn retake_rate(&self, rate_tick: Option<u64>, now_ms: u64) -> Result<(), u64> {
        let (Some(l), Some(tick)) = (&self.limiter, rate_tick) else {
            return Ok(());
        };
        let taken = l.lock().retake(tick, now_ms);
        if taken.is_err() {
            self.stats.held.fetch_add(1, Ordering::Relaxed);
        }
        taken.map(|_| ())
    }

    /// Records the outcome of an admitted send; returns a breaker transition worth an alert.
    /// A permanent rejection counts as success for the breaker: the channel answered.
    /// A send held for a local resource shortage is not the channel's fault: it is counted as
    /// held and never reaches the breaker (a probe it carried is given back).
    pub fn record(&self, now_ms: u64, outcome: &Outcome, probe: bool) -> Option<Transition> {
        let success = !matches!(outcome, Outcome::Retry { .. });
        match outcome {
            Outcome::Sent => &self.stats.sent,
            Outcome::Retry { .. } => &self.stats.retryable_failures,
            Outcome::Permanent { .. } => &self.stats.permanent_failures,
            Outcome::Held { .. } => {
                self.stats.held.fetch_add(1, Ordering::Relaxed);
                self.stats.held_local.fetch_add(1, Ordering::Relaxed);
                self.unsent(probe);
                return None;
            }
        }
        .fetch_add(1, Ordering::Relaxed);
        self.breaker
            .as_ref()
            .and_then(|b| b.lock().record(now_ms, success, probe))
    }

    /// An admitted send that does not go after all (its task stopped while it waited for a
    /// slot, or the rate limit refused it once it could start): a breaker probe it carried is
    /// given back, so the next send probes at once instead of waiting out the probe's lease.
    pub fn unsent(&self, probe: bool) {
        if let (true, Some(b)) = (probe, &self.breaker) {
            b.lock().abandon_probe();
        }
    }

    pub fn breaker_state(&self) -> Option<BreakerState> {
        self.breaker.as_ref().map(|b| b.lock().state())
    }

    /// Delivers once; waits for a concurrency permit first.
    pub async fn send(&self, d: &Delivery, now_ms: impl Fn() -> u64) -> Outcome {
        self.send_traced(d, now_ms).await.0
    }

    /// [`Channel::send`] with what the attempt's timeline event says about it: the answer's
    /// status, how long the sink took, the attempt's span.
    pub async fn send_traced(
        &self,
        d: &Delivery,
        now_ms: impl Fn() -> u64,
    ) -> (Outcome, AttemptReport) {
        match self.permit().await {
            Some((permit, waited)) => self.send_with(d, permit, waited, now_ms).await,
            None => Channel::closed(),
        }
    }

    /// A slot of the channel's `concurrency`: at once if one is free (`false`), else once one
    /// frees (`true`); `None` if the channel is closed.
    pub async fn permit(&self) -> Option<(tokio::sync::SemaphorePermit<'_>, bool)> {
        match self.concurrency.try_acquire() {
            Ok(p) => Some((p, false)),
            Err(_) => self.concurrency.acquire().await.ok().map(|p| (p, true)),
        }
    }

    /// The outcome of a send on a closed channel.
    pub fn closed() -> (Outcome, AttemptReport) {
        let o = Outcome::Retry {
            error: "channel closed".into(),
            not_before_ms: None,
        };
        (o, AttemptReport::default())
    }

    /// Delivers once in the slot `_permit` ([`Channel::permit`]; `waited`: it had to wait).
    pub async fn send_with(
        &self,
        d: &Delivery,
        _permit: tokio::sync::SemaphorePermit<'_>,
        waited: bool,
        now_ms: impl Fn() -> u64,
    ) -> (Outcome, AttemptReport) {
        // `sent_at` is when the request is written: if the channel has to wait for a
        // concurrency slot, the attempt is stamped again once it has one. Without a wait the
        // stamp made at admission stands (it is what the rate limit spaced).
        let restamped;
        let d = if waited {
            restamped = Delivery {
                sent_at: crate::schedule::format_utc(now_ms()),
                ..d.clone()
            };
            &restamped
        } else {
            d
        };
        // The task's trace and a span of this attempt's own (API.md "Trace and timeline").
        let trace_id = d.trace_id;
        let span_id = crate::trace::new_span_id();
        let trace = AttemptTrace {
            traceparent: Some(crate::trace::traceparent(&trace_id, &span_id)),
            epoch: d.epoch,
            ..Default::default()
        };
        // Real time, not the engine's clock: this measures the channel, not the schedule.
        let started = std::time::Instant::now();
        let started_ns = crate::trace::otlp::now_unix_ns();
        let outcome = match &self.sink {
            Sink::Log => self.log_delivery(d, &trace_id),
            Sink::File(f) => f.write(d).await,
            Sink::Webhook(w) => w.deliver(d, &trace, now_ms).await,
        };
        let took = started.elapsed();
        self.stats.latency_of(&outcome).observe(took.as_secs_f64());
        self.export_attempt(d, &outcome, trace_id, span_id, started_ns, trace.status());
        let report = AttemptReport {
            status: trace.status(),
            duration_ms: took.as_millis() as u64,
            span_id,
        };
        (outcome, report)
    }

    /// The span of one attempt (only with `[telemetry] otlp_endpoint`): task, run, message,
    /// attempt, channel, the answer's status and platform code, the outcome.
    fn export_attempt(
        &self,
        d: &Delivery,
        outcome: &Outcome,
        trace_id: [u8; 16],
        span_id: [u8; 8],
        started_ns: u64,
        status: Option<u16>,
    ) {
        let Some(t) = self.tracing.telemetry() else {
            return;
        };
        let (name, code, error) = crate::trace::attempt_facts(outcome);
        let mut span = crate::trace::otlp::Span {
            trace_id,
            span_id,
            parent: None,
            name: format!("attempt {}", self.name),
            kind: crate::trace::otlp::SpanKind::Client,
            start_unix_ns: started_ns,
            end_unix_ns: crate::trace::otlp::now_unix_ns(),
            attrs: Vec::with_capacity(9),
            error: error.filter(|_| name != "sent").map(str::to_string),
            links: Vec::new(),
        }
        .attr("herald.task.id", d.task_id.as_str())
        .attr("herald.run", d.run)
        .attr("herald.seq", d.seq)
        .attr("herald.attempt", d.attempt)
        .attr("herald.channel", self.name.as_str())
        .attr("herald.outcome", name);
        if let Some(s) = status {
            span = span.attr("http.response.status_code", s);
        }
        if let Some(c) = code {
            span = span.attr("herald.platform.code", c);
        }
        t.export(span);
    }

    /// The log sink's send: the delivery as a log line (target `herald::delivery`), with its
    /// task's trace id.
    fn log_delivery(&self, d: &Delivery, trace_id: &[u8; 16]) -> Outcome {
        tracing::info!(target: "herald::delivery", channel = %self.name, task = %d.task_id,
            run = d.run, seq = d.seq, to = %Escaped(&d.to), attempt = d.attempt,
            trace_id = %crate::model::timeline::hex(trace_id),
            body = %Escaped(&d.body), "delivered to log");
        Outcome::Sent
    }

    /// A local sink (file or log): a send costs no round trip, so a chunk of due sends can go
    /// together ([`Channel::send_local`]).
    pub fn is_local(&self) -> bool {
        matches!(self.sink, Sink::Log | Sink::File(_))
    }

    /// Delivers a chunk to a local sink at once (`engine/chunk.rs`): permits for the whole
    /// chunk (in parts of at most the channel's concurrency), one append for a file. One
    /// outcome per delivery, in order. Like [`Channel::send`], a part that had to wait for its
    /// permits is stamped `sent_at` again. A webhook is never sent this way (a slow receiver
    /// must not hold the others): its deliveries are failed as retryable, which a caller that
    /// checks [`Channel::is_local`] never sees.
    pub async fn send_local(
        &self,
        mut ds: Vec<&mut Delivery>,
        now_ms: impl Fn() -> u64,
    ) -> Vec<Outcome> {
        let mut out = Vec::with_capacity(ds.len());
        let part = self.concurrency_max.max(1);
        for chunk in ds.chunks_mut(part) {
            let n = chunk.len() as u32;
            let _permits = match self.concurrency.try_acquire_many(n) {
                Ok(p) => p,
                Err(_) => match self.concurrency.acquire_many(n).await {
                    Ok(p) => {
                        let stamp = crate::schedule::format_utc(now_ms());
                        for d in chunk.iter_mut() {
                            d.sent_at = stamp.clone();
                        }
                        p
                    }
                    Err(_) => {
                        out.extend(chunk.iter().map(|_| Outcome::Retry {
                            error: "channel closed".into(),
                            not_before_ms: None,
                        }));
                        continue;
                    }
                },
            };
            let started = std::time::Instant::now();
            let started_ns = crate::trace::otlp::now_unix_ns();
            let outcomes: Vec<Outcome> = match &self.sink {
                Sink::Log => chunk
                    .iter()
                    .map(|d| self.log_delivery(d, &d.trace_id))
                    .collect(),
                Sink::File(f) => {
                    let refs: Vec<&Delivery> = chunk.iter().map(|d| &**d).collect();
                    f.write_many(&refs).await
                }
                Sink::Webhook(_) => chunk
                    .iter()
                    .map(|_| Outcome::Retry {
                        error: "a webhook is not sent in chunks".into(),
                        not_before_ms: None,
                    })
                    .collect(),
            };
            let took = started.elapsed().as_secs_f64();
            for o in &outcomes {
                self.stats.latency_of(o).observe(took);
            }
            if self.tracing.telemetry().is_some() {
                for (d, o) in chunk.iter().zip(&outcomes) {
                    let span_id = crate::trace::new_span_id();
                    self.export_attempt(d, o, d.trace_id, span_id, started_ns, None);
                }
            }
            out.extend(outcomes);
        }
        out
    }

    /// The platform side of a webhook channel (templates, success rule, token), if any.
    pub fn platform(&self) -> Option<&platform::Platform> {
        match &self.sink {
            Sink::Webhook(w) => w.platform(),
            _ => None,
        }
    }

    /// Delivers an alert once (no breaker, no limiter: alerts must get out, and must never
    /// feed the breaker that might raise another alert).
    pub async fn send_alert(&self, a: &Alert, now_ms: impl Fn() -> u64) -> Outcome {
        match &self.sink {
            Sink::Log => {
                tracing::warn!(target: "herald::alert", channel = %self.name, event = a.event,
                    about = %a.channel, task = %Opt(a.task_id.as_deref()),
                    error = %Opt(a.error.as_deref()), "alert");
                Outcome::Sent
            }
            Sink::File(f) => f.write(a).await,
            Sink::Webhook(w) => w.alert(a, now_ms).await,
        }
    }

    /// Asks the breaker again for a send admitted earlier ([`Channel::admit`]) that waited for
    /// a free slot: it goes only if the breaker is still closed, or if it is the probe.
    /// `Err(at)`: held, not before `at` (counted as held; the send asks [`Channel::admit`]
    /// again then, which decides on a probe). Takes nothing from the breaker: a send that
    /// does not go gives back a probe it carried with [`Channel::unsent`].
    pub fn recheck(&self, now_ms: u64, probe: bool) -> Result<(), u64> {
        /// How long a send is held while the breaker's probe is out (as `admit` holds it).
        const HALF_OPEN_RECHECK_MS: u64 = 1_000;
        let Some(b) = &self.breaker else {
            return Ok(());
        };
        if probe {
            return Ok(());
        }
        let at = match b.lock().state() {
            BreakerState::Closed => return Ok(()),
            // The wall instant the cool-down was expected to end at; `admit` measures it on
            // the monotonic clock when the send comes back.
            BreakerState::Open { until_ms } => until_ms.max(now_ms),
            // A probe is out: look again when `admit` would (at most a second).
            BreakerState::HalfOpen => now_ms.saturating_add(HALF_OPEN_RECHECK_MS),
        };
        self.stats.held.fetch_add(1, Ordering::Relaxed);
        Err(at)
    }
}

/// The configured channels by name. `log` always exists.
#[derive(Clone)]
pub struct Channels {
    map: Arc<BTreeMap<String, Arc<Channel>>>,
    tracing: Arc<crate::trace::Tracing>,
}

impl Channels {
    pub fn new(list: Vec<Channel>) -> Channels {
        let tracing: Arc<crate::trace::Tracing> = Arc::default();
        let mut map = BTreeMap::new();
        for mut c in list {
            c.tracing = tracing.clone();
            map.insert(c.name.clone(), Arc::new(c));
        }
        map.entry("log".to_string()).or_insert_with(|| {
            let mut log = Channel::plain("log", Sink::Log, RetryPolicy::default(), 64);
            log.tracing = tracing.clone();
            Arc::new(log)
        });
        Channels {
            map: Arc::new(map),
            tracing,
        }
    }

    /// What every channel traces its attempts with.
    pub fn tracing(&self) -> &Arc<crate::trace::Tracing> {
        &self.tracing
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Channel>> {
        self.map.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Channel>> {
        self.map.values()
    }
}

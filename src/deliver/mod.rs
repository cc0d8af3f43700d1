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

    /// The longest one attempt can be under way: the webhook's `timeout`, then the wait for
    /// its answer's body (a platform's `answer_timeout`, else the failure excerpt's read, which
    /// [`ANSWER_SLACK_MS`] covers), plus that slack; 0 for a local sink. The breaker's probe
    /// is presumed lost only after this ([`Breaker::set_probe_lease`]).
    pub fn attempt_bound_ms(&self) -> u64 {
        let answer_ms = match &self.sink {
            Sink::Webhook(w) => w.platform().map_or(0, |p| p.spec.answer_timeout_ms),
            Sink::Log | Sink::File(_) => return 0,
        };
        self.send_timeout_ms()
            .saturating_add(answer_ms)
            .saturating_add(ANSWER_SLACK_MS)
    }

    /// Sends in flight right now.
    pub fn in_flight(&self) -> usize {
        self.concurrency_max
            .saturating_sub(self.concurrency.available_permits())
    }

    /// May a send start at `now_ms`? Asks the rate limiter first, then the breaker (so a
    /// limited channel never hands out a probe it cannot send now); a send the breaker holds
    /// gives its rate slot back at once. A `Go` is followed by one [`Channel::record`] (or
    /// [`Channel::record_attempt`]) once the send is over, or by [`Channel::unsent`] if it
    /// does not go; a `Go` followed by neither only costs its rate slot and, for a probe,
    /// holds the breaker half-open until the probe's lease runs out.
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
        let breaker = self.breaker.as_ref().map(|b| b.lock().admit(now_ms));
        let probe = match breaker {
            None | Some(Admit::Yes) => false,
            Some(Admit::Probe) => true,
            Some(Admit::HoldUntil(at)) => {
                if let (Some(l), Some(tick)) = (&self.limiter, rate_tick) {
                    l.lock().give_back(tick);
                }
                self.stats.held.fetch_add(1, Ordering::Relaxed);
                return Admission::Hold {
                    until_ms: at,
                    breaker: true,
                };
            }
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

    /// Gives back the rate slot of a send admitted at `rate_tick` ([`Admission::Go`]) that
    /// will not go now (quiet hours began while it waited for a free slot): the limit counts
    /// sends that start ([`ratelimit::Limiter::give_back`]).
    pub fn give_back_rate(&self, rate_tick: Option<u64>) {
        if let (Some(l), Some(tick)) = (&self.limiter, rate_tick) {
            l.lock().give_back(tick);
        }
    }

    /// Records the outcome of an admitted send; returns a breaker transition worth an alert.
    /// Without the attempt's report (use [`Channel::record_attempt`] when it is at hand), a
    /// webhook's permanent failure is taken as the receiver's rejection; a local sink's
    /// (the delivery could not be encoded) never reached anything.
    pub fn record(&self, now_ms: u64, outcome: &Outcome, probe: bool) -> Option<Transition> {
        self.record_as(now_ms, outcome, !self.is_local(), probe)
    }

    /// Records the outcome of an admitted send with what its attempt learnt (`report`, from
    /// [`Channel::send_with`]); returns a breaker transition worth an alert. A permanent
    /// failure with no answer (`report.status` is `None`: a template or encoding error, a
    /// request that could not be built) never reached the receiver: it says nothing about the
    /// channel, so the breaker is left as it was (a probe it carried is given back).
    pub fn record_attempt(
        &self,
        now_ms: u64,
        outcome: &Outcome,
        report: &AttemptReport,
        probe: bool,
    ) -> Option<Transition> {
        self.record_as(now_ms, outcome, report.status.is_some(), probe)
    }

    /// [`Channel::record`]; `answered`: a permanent failure is the receiver's answer.
    ///
    /// For the breaker, a permanent rejection counts as success: the channel answered. One
    /// that was not `answered` counts as neither success nor failure. A send held for a local
    /// resource shortage is not the channel's fault either: it is counted as held and never
    /// reaches the breaker. Both give back a probe they carried.
    fn record_as(
        &self,
        now_ms: u64,
        outcome: &Outcome,
        answered: bool,
        probe: bool,
    ) -> Option<Transition> {
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
        if matches!(outcome, Outcome::Permanent { .. }) && !answered {
            self.unsent(probe);
            return None;
        }
        self.breaker
            .as_ref()
            .and_then(|b| b.lock().record(now_ms, success, probe))
    }

    /// An admitted send that does not go after all (its task stopped while it waited for a
    /// slot, the rate limit refused it once it could start, or it failed before reaching the
    /// receiver): a breaker probe it carried is given back, so the next send probes at once
    /// instead of waiting out the probe's lease. Its rate slot stays taken.
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
    ///
    /// `after_wait(i, now)` is asked about each delivery `i` (its index in `ds`) of a part that
    /// had to wait for its permits, at `now`, before anything of the part is written: what the
    /// delivery was admitted on may have changed during the wait (a drain, the breaker, the
    /// rate limit; `engine/chunk.rs`, as `engine/step.rs::slot` for one send). `Some(outcome)`:
    /// it is not sent, `outcome` is its own (not counted in the channel's latency nor traced:
    /// the caller accounts for it).
    pub async fn send_local(
        &self,
        mut ds: Vec<&mut Delivery>,
        now_ms: impl Fn() -> u64,
        mut after_wait: impl FnMut(usize, u64) -> Option<Outcome>,
    ) -> Vec<Outcome> {
        let mut out = Vec::with_capacity(ds.len());
        let part = self.concurrency_max.max(1);
        for (k, chunk) in ds.chunks_mut(part).enumerate() {
            let n = chunk.len() as u32;
            let first = k * part;
            let mut not_sent: Vec<Option<Outcome>> = chunk.iter().map(|_| None).collect();
            let _permits = match self.concurrency.try_acquire_many(n) {
                Ok(p) => p,
                Err(_) => match self.concurrency.acquire_many(n).await {
                    Ok(p) => {
                        let now = now_ms();
                        let stamp = crate::schedule::format_utc(now);
                        for (i, (d, held)) in chunk.iter_mut().zip(&mut not_sent).enumerate() {
                            d.sent_at = stamp.clone();
                            *held = after_wait(first + i, now);
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
            let going: Vec<&Delivery> = chunk
                .iter()
                .zip(&not_sent)
                .filter(|(_, held)| held.is_none())
                .map(|(d, _)| &**d)
                .collect();
            let mut sent = self.write_local(&going).await.into_iter();
            out.extend(not_sent.into_iter().map(|held| {
                held.unwrap_or_else(|| {
                    sent.next().unwrap_or_else(|| Outcome::Retry {
                        error: "no outcome for this send".into(),
                        not_before_ms: None,
                    })
                })
            }));
        }
        out
    }

    /// One part of [`Channel::send_local`], its permits held: written (one append for a
    /// file), timed and traced. One outcome per delivery, in order.
    async fn write_local(&self, chunk: &[&Delivery]) -> Vec<Outcome> {
        if chunk.is_empty() {
            return Vec::new();
        }
        let started = std::time::Instant::now();
        let started_ns = crate::trace::otlp::now_unix_ns();
        let outcomes: Vec<Outcome> = match &self.sink {
            Sink::Log => chunk
                .iter()
                .map(|d| self.log_delivery(d, &d.trace_id))
                .collect(),
            Sink::File(f) => f.write_many(chunk).await,
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
        outcomes
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
        let b = b.lock();
        let at = match b.state() {
            BreakerState::Closed => return Ok(()),
            // The end of the cool-down on the monotonic clock, as `admit` holds a send (the
            // wall instant stored when it opened is wrong once the wall has stepped).
            BreakerState::Open { .. } => b.open_until(now_ms).unwrap_or(now_ms),
            // A probe is out: look again when `admit` would (at most a second).
            BreakerState::HalfOpen => now_ms.saturating_add(HALF_OPEN_RECHECK_MS),
        };
        drop(b);
        self.stats.held.fetch_add(1, Ordering::Relaxed);
        Err(at)
    }
}

/// Slack on a webhook attempt's bound ([`Channel::attempt_bound_ms`]): a plain webhook's
/// failure excerpt is read for up to 1 s after its answer (`webhook.rs`), and the send's task
/// is scheduled around the request.
const ANSWER_SLACK_MS: u64 = 2_000;

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
            // A probe still under way is not presumed lost (its lease) before its attempt
            // could have ended.
            let bound = c.attempt_bound_ms();
            if let Some(b) = &mut c.breaker {
                b.get_mut().set_probe_lease(bound);
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use breaker::BreakerConfig;

    const T0: u64 = 1_800_000_000_000;

    /// A breaker that opens on the first failure and cools down for 5 s.
    fn touchy() -> Mutex<Breaker> {
        Mutex::new(Breaker::new(BreakerConfig {
            window_ms: 10_000,
            min_requests: 1,
            failure_ratio: 0.5,
            cool_down_ms: 5_000,
        }))
    }

    fn log_channel() -> Channel {
        let mut c = Channel::plain("c", Sink::Log, RetryPolicy::default(), 4);
        c.breaker = Some(touchy());
        c
    }

    fn http_500() -> Outcome {
        Outcome::Retry {
            error: "HTTP 500".into(),
            not_before_ms: None,
        }
    }

    fn permanent(error: &str) -> Outcome {
        Outcome::Permanent {
            error: error.into(),
        }
    }

    fn report(status: Option<u16>) -> AttemptReport {
        AttemptReport {
            status,
            ..AttemptReport::default()
        }
    }

    /// A wall clock that steps back alone (`ManualClock` only jumps forward).
    struct SteppingClock {
        wall: std::sync::atomic::AtomicU64,
        mono: std::sync::atomic::AtomicU64,
    }

    impl crate::clock::Clock for SteppingClock {
        fn now_ms(&self) -> u64 {
            self.wall.load(Ordering::SeqCst)
        }
        fn mono_ms(&self) -> u64 {
            self.mono.load(Ordering::SeqCst)
        }
    }

    /// After the wall steps back, a send that waited for a slot is held until the cool-down
    /// ends by the monotonic clock, as `admit` would hold it, not until the stored wall
    /// instant (an hour later on the stepped wall).
    #[test]
    fn recheck_measures_the_cool_down_on_the_monotonic_clock() {
        let clock = std::sync::Arc::new(SteppingClock {
            wall: T0.into(),
            mono: 1_000.into(),
        });
        let mut c = log_channel();
        c.breaker = Some(Mutex::new(
            Breaker::new(BreakerConfig {
                window_ms: 10_000,
                min_requests: 1,
                failure_ratio: 0.5,
                cool_down_ms: 5_000,
            })
            .with_durations(crate::clock::Durations::of(clock.clone())),
        ));
        assert!(matches!(c.admit(T0), Admission::Go { probe: false, .. }));
        let opened = c.record_attempt(T0, &http_500(), &report(Some(500)), false);
        assert_eq!(opened, Some(Transition::Opened));
        // 1 s later by the monotonic clock, the wall stepped back an hour.
        clock.mono.store(2_000, Ordering::SeqCst);
        let now = T0 + 1_000 - 3_600_000;
        clock.wall.store(now, Ordering::SeqCst);
        assert_eq!(
            c.recheck(now, false),
            Err(now + 4_000),
            "4 s of cool-down left"
        );
        match c.admit(now) {
            Admission::Hold { until_ms, .. } => assert_eq!(until_ms, now + 4_000),
            _ => panic!("admitted while open"),
        }
        // Cooled down: a recheck lets the send ask `admit` again now.
        clock.mono.store(6_000, Ordering::SeqCst);
        let now = now + 4_000;
        assert_eq!(c.recheck(now, false), Err(now));
    }

    /// Opens `c`'s breaker with a 500 at T0 and admits the probe at T0 + 5 s.
    fn open_and_probe(c: &Channel) {
        assert!(matches!(c.admit(T0), Admission::Go { probe: false, .. }));
        let opened = c.record_attempt(T0, &http_500(), &report(Some(500)), false);
        assert_eq!(opened, Some(Transition::Opened));
        assert!(matches!(
            c.admit(T0 + 5_000),
            Admission::Go { probe: true, .. }
        ));
    }

    #[test]
    fn a_probe_that_never_reached_the_receiver_neither_closes_nor_reopens() {
        let c = log_channel();
        open_and_probe(&c);
        // The probe's template failed here: no request went out, nothing was learnt.
        let t = c.record_attempt(
            T0 + 5_100,
            &permanent("template: undefined value"),
            &report(None),
            true,
        );
        assert_eq!(t, None, "no breaker_closed alert");
        assert_eq!(c.breaker_state(), Some(BreakerState::HalfOpen));
        assert_eq!(c.stats.permanent_failures.load(Ordering::Relaxed), 1);
        // The probe was given back: the next send probes at once, and the receiver's own
        // permanent answer (it is up) closes the breaker.
        assert!(matches!(
            c.admit(T0 + 5_200),
            Admission::Go { probe: true, .. }
        ));
        let t = c.record_attempt(T0 + 5_300, &permanent("HTTP 400"), &report(Some(400)), true);
        assert_eq!(t, Some(Transition::Closed));

        // Without a report, a local sink's permanent failure (the delivery could not be
        // encoded) never reached anything either.
        let c = log_channel();
        open_and_probe(&c);
        assert_eq!(c.record(T0 + 5_100, &permanent("encode"), true), None);
        assert_eq!(c.breaker_state(), Some(BreakerState::HalfOpen));
    }

    #[test]
    fn sends_the_breaker_holds_give_their_rate_slots_back() {
        let mut c = log_channel();
        c.limiter = Some(Mutex::new(Limiter::new(ratelimit::Rate {
            count: 2,
            period_ms: 60_000,
        })));
        // Forced open (an outcome of a send admitted before), until T0 + 5 s.
        assert_eq!(c.record(T0, &http_500(), false), Some(Transition::Opened));
        for i in 0..10 {
            let a = c.admit(T0 + i * 100);
            assert!(matches!(a, Admission::Hold { breaker: true, .. }), "{a:?}");
        }
        // No send started in this minute: the probe, and the send after it, have their slots.
        let probe = c.admit(T0 + 5_000);
        assert!(
            matches!(probe, Admission::Go { probe: true, .. }),
            "{probe:?}"
        );
        assert_eq!(
            c.record(T0 + 5_100, &Outcome::Sent, true),
            Some(Transition::Closed)
        );
        let next = c.admit(T0 + 5_200);
        assert!(
            matches!(next, Admission::Go { probe: false, .. }),
            "{next:?}"
        );
        // Those two were the minute's sends.
        let third = c.admit(T0 + 5_300);
        assert!(
            matches!(third, Admission::Hold { breaker: false, .. }),
            "{third:?}"
        );
    }

    #[test]
    fn a_webhook_probe_is_leased_for_its_whole_attempt() {
        // timeout 30 s, cool_down 10 s: a receiver that hangs holds the probe for up to 32 s.
        let url = "http://127.0.0.1:9/".parse().unwrap();
        let sink = webhook::WebhookSink::new(url, 30_000, 1_000, &[], None).unwrap();
        let mut c = Channel::plain("hook", Sink::Webhook(Box::new(sink)), Default::default(), 4);
        c.breaker = Some(Mutex::new(Breaker::new(BreakerConfig {
            window_ms: 10_000,
            min_requests: 1,
            failure_ratio: 0.5,
            cool_down_ms: 10_000,
        })));
        assert_eq!(c.attempt_bound_ms(), 32_000);
        let channels = Channels::new(vec![c]);
        let c = channels.get("hook").unwrap();
        assert_eq!(c.record(T0, &http_500(), false), Some(Transition::Opened));
        assert!(matches!(
            c.admit(T0 + 10_000),
            Admission::Go { probe: true, .. }
        ));
        // Still under way 10 s and 31 s later: no second probe.
        for at in [T0 + 20_000, T0 + 41_000] {
            let a = c.admit(at);
            assert!(matches!(a, Admission::Hold { breaker: true, .. }), "{a:?}");
        }
        assert!(matches!(
            c.admit(T0 + 42_000),
            Admission::Go { probe: true, .. }
        ));
    }
}

//! `GET /metrics`: the Prometheus text format (0.0.4), written by `prometheus-client`.
//!
//! Histograms are observed where things happen and live there: fire lateness in the engine,
//! delivery latency per channel and outcome in each channel, flush time and group size in the
//! commit thread, API request time by route here ([`ApiMetrics`]). Everything else is read at
//! scrape time into one [`Scrape`] and encoded by the crate (names, `_total` suffixes, label
//! escaping, buckets). Task counts by state and the failure list's size come from a cached
//! census (`engine/stats.rs`) so that a scrape never turns into a full scan every time.

use std::sync::atomic::Ordering;
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;

use super::problem::Problem;
use super::ApiState;
use crate::deliver::breaker::BreakerState;
use crate::deliver::OUTCOMES;

/// Upper bounds (seconds) of the API request-time buckets.
const REQUEST_BOUNDS_S: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

type RequestLabels = [(&'static str, &'static str); 3];

fn request_histogram() -> Histogram {
    Histogram::new(REQUEST_BOUNDS_S)
}

/// API request time by route template, method and status class: bounded label values only
/// (a raw path would make one series per task id).
pub struct ApiMetrics {
    requests: Family<RequestLabels, Histogram, fn() -> Histogram>,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        ApiMetrics {
            requests: Family::new_with_constructor(request_histogram),
        }
    }
}

impl ApiMetrics {
    pub fn observe(&self, path: &str, method: &hyper::Method, status: u16, took: Duration) {
        let labels = [
            ("route", route_of(path)),
            ("method", method_label(method)),
            ("code", status_class(status)),
        ];
        self.requests
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }
}

/// The route template a path is served by (`/v1/tasks/{id}`), or `other`.
pub fn route_of(path: &str) -> &'static str {
    // Up to five segments, on the stack: every request is counted here. A longer path has a
    // sixth and matches no route.
    let mut buf = [""; 6];
    let mut len = 0;
    for s in path.trim_end_matches('/').split('/').skip(1) {
        let Some(slot) = buf.get_mut(len) else {
            return "other";
        };
        *slot = s;
        len += 1;
    }
    match buf.get(..len).unwrap_or_default() {
        [] | [""] => "/",
        ["healthz"] => "/healthz",
        ["metrics"] => "/metrics",
        ["dashboard", "app.js" | "app.css" | "format.js" | "metrics.js" | "chart.js" | "timeline.js"
        | "cluster.js"] => "/dashboard/{asset}",
        ["v1", rest @ ..] => match rest {
            ["tasks"] => "/v1/tasks",
            ["tasks", _] => "/v1/tasks/{id}",
            ["tasks", _, "cancel" | "pause" | "resume" | "trigger"] => "/v1/tasks/{id}/{action}",
            ["tasks", _, "runs"] => "/v1/tasks/{id}/runs",
            ["tasks", _, "timeline"] => "/v1/tasks/{id}/timeline",
            ["tasks", _, "backfill"] => "/v1/tasks/{id}/backfill",
            ["failures"] => "/v1/failures",
            ["failures", _] => "/v1/failures/{id}",
            ["failures", _, "retry"] => "/v1/failures/{id}/retry",
            ["channels"] => "/v1/channels",
            ["cluster"] => "/v1/cluster",
            ["schedules", "preview"] => "/v1/schedules/preview",
            ["events"] => "/v1/events",
            ["export"] => "/v1/export",
            ["openapi.json"] => "/v1/openapi.json",
            _ => "other",
        },
        _ => "other",
    }
}

fn method_label(m: &hyper::Method) -> &'static str {
    match *m {
        hyper::Method::GET => "GET",
        hyper::Method::HEAD => "HEAD",
        hyper::Method::POST => "POST",
        hyper::Method::PUT => "PUT",
        hyper::Method::PATCH => "PATCH",
        hyper::Method::DELETE => "DELETE",
        _ => "other",
    }
}

fn status_class(s: u16) -> &'static str {
    match s {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// One value of a metric family.
#[derive(Debug)]
enum Value {
    /// A gauge with a fractional value (seconds).
    GaugeF(f64),
    Gauge(i64),
    Counter(u64),
    Seconds(f64),
    Hist(Histogram),
}

type Labels = Vec<(&'static str, String)>;

/// One metric family: name (without `_total` for counters: the encoder adds it), help, rows.
#[derive(Debug)]
struct Fam {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    rows: Vec<(Labels, Value)>,
}

/// Everything one scrape shows, read once and encoded by the crate.
#[derive(Debug, Default)]
struct Scrape(Vec<Fam>);

impl Scrape {
    fn add(
        &mut self,
        name: &'static str,
        kind: MetricType,
        help: &'static str,
        rows: Vec<(Labels, Value)>,
    ) {
        self.0.push(Fam {
            name,
            help,
            kind,
            rows,
        });
    }
    fn gauge(&mut self, name: &'static str, help: &'static str, v: i64) {
        self.add(
            name,
            MetricType::Gauge,
            help,
            vec![(vec![], Value::Gauge(v))],
        );
    }
    fn gauge_f(&mut self, name: &'static str, help: &'static str, v: f64) {
        self.add(
            name,
            MetricType::Gauge,
            help,
            vec![(vec![], Value::GaugeF(v))],
        );
    }
    fn counter(&mut self, name: &'static str, help: &'static str, v: u64) {
        self.add(
            name,
            MetricType::Counter,
            help,
            vec![(vec![], Value::Counter(v))],
        );
    }
    fn histogram(&mut self, name: &'static str, help: &'static str, h: &Histogram) {
        self.add(
            name,
            MetricType::Histogram,
            help,
            vec![(vec![], Value::Hist(h.clone()))],
        );
    }
}

fn encode_value(v: &Value, e: prometheus_client::encoding::MetricEncoder) -> std::fmt::Result {
    match v {
        Value::Gauge(g) => ConstGauge::new(*g).encode(e),
        Value::GaugeF(g) => ConstGauge::new(*g).encode(e),
        Value::Counter(c) => ConstCounter::new(*c).encode(e),
        Value::Seconds(s) => ConstCounter::new(*s).encode(e),
        Value::Hist(h) => h.encode(e),
    }
}

impl prometheus_client::collector::Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        for f in &self.0 {
            let mut m = encoder.encode_descriptor(f.name, f.help, None, f.kind)?;
            for (labels, v) in &f.rows {
                if labels.is_empty() {
                    encode_value(v, m)?;
                    break;
                }
                encode_value(v, m.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

/// How long a scrape waits for a census that must be taken (`engine/stats.rs`). Past it the
/// scrape answers with the last census however old (its age is a gauge), or without the
/// by-state gauges before the first; the scan goes on and a later scrape gets it. A slow
/// store (a database with every round trip late) must not make `/metrics` slow, when it is
/// most wanted.
pub const CENSUS_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Renders `/metrics`. The task census may scan the store: it runs off the runtime's workers.
pub async fn render(state: &ApiState) -> Result<String, Problem> {
    let engine = state.engine.clone();
    let scan = tokio::task::spawn_blocking(move || engine.census());
    let census = match tokio::time::timeout(CENSUS_WAIT, scan).await {
        Ok(joined) => joined.map_err(|e| Problem::internal(format!("metrics: {e}")))?,
        Err(_) => state.engine.last_census().ok_or_else(|| {
            crate::engine::EngineError::Busy("the first census of tasks is being taken".into())
        }),
    };
    let mut s = Scrape::default();
    tasks(&mut s, state, census);
    otlp(&mut s, state);
    losses(&mut s, state);
    cluster(&mut s, state);
    store(&mut s, state);
    wall_clock(&mut s, state);
    connections(&mut s, state);
    channels(&mut s, state);
    let engine = &state.engine;
    s.histogram(
        "herald_send_lateness_seconds",
        "How late sends start: from the instant the schedule (or pacing) planned the message to the start of its attempt",
        engine.lateness(),
    );
    s.counter(
        "herald_send_chunked",
        "Sends made in chunks (due together, armed, to a local channel: one append, one settle write); the rest took the one-key path",
        engine.chunked_sends(),
    );
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(s));
    registry.register(
        "herald_http_request_duration_seconds",
        "API request time (to the answer's head) by route template, method and status class",
        state.metrics.requests.clone(),
    );
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
        .map_err(|e| Problem::internal(format!("metrics: {e}")))?;
    Ok(out)
}

/// Readiness, and the tasks by state (`census`: the live index counted off the runtime).
fn tasks(
    s: &mut Scrape,
    state: &ApiState,
    census: Result<crate::engine::stats::Census, crate::engine::EngineError>,
) {
    let engine = &state.engine;
    s.gauge(
        "herald_ready",
        "1 once start-up recovery is done",
        i64::from(engine.is_ready()),
    );
    s.gauge(
        "herald_live_index_loading",
        "1 while start-up still loads the live index in the background (after ready)",
        i64::from(engine.index_loading()),
    );
    s.gauge(
        "herald_tasks_live",
        "Tasks that are pending, running or paused (from memory; while the live index loads, those loaded so far)",
        engine.live_tasks() as i64,
    );
    match census {
        Ok(c) => {
            s.gauge(
                "herald_tasks_census_age_seconds",
                "Age of the census the by-state counts below come from (a scrape waits at most 1 s for a new one)",
                c.taken_at.elapsed().as_secs() as i64,
            );
            let by_state = [
                ("pending", c.pending),
                ("running", c.running),
                ("paused", c.paused),
            ]
            .into_iter()
            .map(|(st, n)| (vec![("state", st.to_string())], Value::Gauge(n as i64)))
            .collect();
            s.add(
                "herald_tasks",
                MetricType::Gauge,
                "Unfinished tasks by state (from a census of the live index, refreshed at most every 10 s, longer on a large store)",
                by_state,
            );
            s.gauge(
                "herald_failures",
                "Entries in the failure list (same census)",
                c.failures as i64,
            );
        }
        // The first census still being taken: the counts come with a later scrape.
        Err(crate::engine::EngineError::Busy(e)) => tracing::debug!(%e, "metrics: no census yet"),
        // A storage error: the counts are left out (storage health has its own gauge).
        Err(e) => tracing::warn!(error = %e, "metrics: the task census failed"),
    }
    s.gauge(
        "herald_wheel_entries",
        "Entries on the timing wheel (pending fires, active run steps, failure retries)",
        engine.wheel_entries() as i64,
    );
}

/// The OTLP exporter's counts, when one is configured.
fn otlp(s: &mut Scrape, state: &ApiState) {
    if let Some(x) = state.tracing.telemetry().and_then(|t| t.stats()) {
        use std::sync::atomic::Ordering::Relaxed;
        s.counter(
            "herald_otlp_spans_exported",
            "Spans an OTLP collector accepted ([telemetry] otlp_endpoint)",
            x.exported.load(Relaxed),
        );
        s.counter(
            "herald_otlp_spans_dropped",
            "Spans not exported: the bounded export queue was full, or their POST to the collector failed",
            x.dropped.load(Relaxed),
        );
        s.counter(
            "herald_otlp_export_failures",
            "POSTs to the OTLP collector that failed (no connection, a timeout, a non-2xx answer)",
            x.failed_posts.load(Relaxed),
        );
    }
}

/// Cluster mode's figures (HA.md "Config"), when in it.
fn cluster(s: &mut Scrape, state: &ApiState) {
    let Some(c) = state.engine.cluster() else {
        return;
    };
    let own = &c.ownership;
    s.gauge(
        "herald_shards_owned",
        "Shards this node holds and trusts now",
        i64::try_from(own.count()).unwrap_or(i64::MAX),
    );
    s.counter(
        "herald_fence_rejected",
        "Writes refused because their shard had been taken over (the shard was let go)",
        own.fence_rejected.load(Ordering::Relaxed),
    );
    s.counter(
        "herald_shard_load_failed",
        "Granted shards let go because their load failed (a store error or a panic), to be granted and loaded again",
        own.shard_load_failed.load(Ordering::Relaxed),
    );
    s.counter(
        "herald_inflight_inherited",
        "Messages found in flight when a task was loaded (another node's, or this node's failed write), sent again with the same idempotency key",
        own.inflight_inherited.load(Ordering::Relaxed),
    );
    if let Some(ms) = own.clock_offset_ms() {
        s.gauge_f(
            "herald_clock_offset_seconds",
            "The database's clock minus this node's, as last measured",
            ms as f64 / 1000.0,
        );
    }
    s.histogram(
        "herald_failover_seconds",
        "Per shard taken over from an owner whose lease had run out: how long after it ran out (database time)",
        &own.failover_seconds,
    );
    s.histogram(
        "herald_lease_renew_seconds",
        "How long lease renewals took to answer",
        &own.renew_seconds,
    );
}

/// What was given up or dropped at a bound, and the alerts.
fn losses(s: &mut Scrape, state: &ApiState) {
    let engine = &state.engine;
    s.counter(
        "herald_failures_unlisted",
        "Messages given up on that the full failure list did not take ([store] failures_max); their runs count them failed",
        engine.failures_unlisted(),
    );
    s.counter(
        "herald_notifications_refused",
        "Notifications a task's notify called for that could not be made (e.g. their channel was deleted); the change went on without them",
        engine.notify_refused(),
    );
    s.counter(
        "herald_response_drains_dropped",
        "Webhook response bodies dropped undrained (connection closed) because as many drains as the channel's concurrency were running",
        crate::deliver::webhook::DRAINS_DROPPED.load(Ordering::Relaxed),
    );
    let (raised, failed) = engine.alert_counts();
    s.counter(
        "herald_alerts",
        "Alerts raised (failure list entries, breaker transitions)",
        raised,
    );
    s.counter(
        "herald_alert_deliveries_failed",
        "Alerts that could not be delivered to the alert channel",
        failed,
    );
}

/// The admission law's counters (`store/pace.rs::admit`).
fn admission(s: &mut Scrape, st: &crate::store::commit::CommitStats) {
    s.counter(
        "herald_store_admit_delayed",
        "Writes the admission law made wait before the commit queue (the memtable over its soft mark)",
        st.admit_delayed.load(Ordering::Relaxed),
    );
    s.gauge_f(
        "herald_store_admit_delay_max_seconds",
        "Longest wait the admission law has given one write since start",
        st.admit_delay_max_us.load(Ordering::Relaxed) as f64 / 1e6,
    );
    s.counter(
        "herald_store_admit_full",
        "Writes that found the memtable at its hard bound (a create got 503; an engine step waited for room)",
        st.admit_full.load(Ordering::Relaxed),
    );
}

/// The store's group commit and memtable, storage health, and the wall clock.
fn store(s: &mut Scrape, state: &ApiState) {
    let engine = &state.engine;
    let st = engine.store().commit_stats();
    s.counter(
        "herald_store_flushes",
        "Durable flushes (sled flush + fdatasync) done by the group commit",
        st.flushes.load(Ordering::Relaxed),
    );
    s.counter(
        "herald_store_flush_waiters",
        "Writes made durable by those flushes (waiters / flushes = batching)",
        st.waiters.load(Ordering::Relaxed),
    );
    s.add(
        "herald_store_busy_seconds",
        MetricType::Counter,
        "Time the commit thread spent applying and flushing groups",
        vec![(
            vec![],
            Value::Seconds(st.busy_us.load(Ordering::Relaxed) as f64 / 1e6),
        )],
    );
    s.counter(
        "herald_store_write_failures",
        "Write groups the storage refused (apply or flush failed)",
        st.failures.load(Ordering::Relaxed),
    );
    s.gauge(
        "herald_store_group_max",
        "Largest number of writers made durable by one flush since start",
        st.group_max.load(Ordering::Relaxed) as i64,
    );
    s.histogram(
        "herald_store_flush_duration_seconds",
        "Time per group commit: applying the group and the durable flush",
        &st.flush_seconds,
    );
    s.histogram(
        "herald_store_group_writers",
        "Writers made durable by one flush (a histogram of group sizes)",
        &st.group_size,
    );
    s.gauge(
        "herald_store_queue",
        "Writes waiting for the commit thread now",
        engine.store().queued() as i64,
    );
    s.gauge(
        "herald_store_memtable_bytes",
        "Writes durable in the log and not yet written into sled (the write-behind memtable)",
        engine.store().memtable_bytes() as i64,
    );
    admission(s, st);
    s.counter(
        "herald_store_read_round_trips",
        "Read round trips to the store's server (PostgreSQL: point reads, batched reads, scan pages; always 0 on sled)",
        engine.store().read_round_trips(),
    );
    s.gauge(
        "herald_storage_failing",
        "1 while storage fails (writes refused with 503, no new sends; /healthz 503)",
        i64::from(engine.storage_failing().is_some()),
    );
}

/// This node's wall clock steps (`clock.rs`). The node's own wall, also in cluster mode, where
/// database time does not follow it (`clock::OffsetClock`).
fn wall_clock(s: &mut Scrape, state: &ApiState) {
    let j = state.clock.node_wall_jumps();
    s.counter(
        "herald_wall_clock_jumps",
        "Forward jumps of the wall clock (5 s or more beyond the monotonic clock): jumped-over fires judged like an outage",
        j.count,
    );
    s.counter(
        "herald_wall_clock_steps_back",
        "Steps back of the wall clock (5 s or more behind the monotonic clock): herald's clock holds still until the wall catches up",
        j.back_count,
    );
}

/// HTTP connections and event streams at their caps.
fn connections(s: &mut Scrape, state: &ApiState) {
    let cs = &state.conns.stats;
    s.gauge(
        "herald_http_connections_open",
        "HTTP connection slots taken now (regular and reserve), each by a connection or by a request that runs on after its client left",
        state.conns.open() as i64,
    );
    s.counter(
        "herald_http_connections_accepted",
        "HTTP connections served since start",
        cs.accepted.load(Ordering::Relaxed),
    );
    s.counter(
        "herald_http_connections_evicted",
        "Silent HTTP connections (no byte for 1 s, no request in progress or unread) closed to make room at the connection cap",
        cs.evicted.load(Ordering::Relaxed),
    );
    s.counter(
        "herald_http_connections_refused",
        "HTTP connections that met the cap with none evictable: served from the reserve (/healthz, else 503) or left in the listen backlog until a slot freed; none is closed unanswered",
        cs.refused.load(Ordering::Relaxed),
    );
    s.counter(
        "herald_http_requests_shed",
        "Requests answered 503 with Retry-After because no connection slot freed in time",
        cs.shed.load(Ordering::Relaxed),
    );
    s.gauge(
        "herald_event_streams",
        "Event streams (GET /v1/events) open now",
        state.conns.streams() as i64,
    );
    s.counter(
        "herald_event_streams_refused",
        "Event streams answered 503: over the total cap or the cap per client address",
        cs.streams_refused.load(Ordering::Relaxed),
    );
}

/// Per channel: attempts, latency, held sends, in flight, the breaker.
fn channels(s: &mut Scrape, state: &ApiState) {
    let engine = &state.engine;
    let channels: Vec<_> = engine.channels().iter().cloned().collect();
    let ch = |c: &crate::deliver::Channel| vec![("channel", c.name.clone())];
    let mut attempts = Vec::new();
    let mut latency = Vec::new();
    let (mut held, mut held_local, mut in_flight, mut breaker) = (vec![], vec![], vec![], vec![]);
    for c in &channels {
        let st = &c.stats;
        for (o, v) in [
            ("sent", &st.sent),
            ("retryable", &st.retryable_failures),
            ("permanent", &st.permanent_failures),
        ] {
            let mut l = ch(c);
            l.push(("outcome", o.to_string()));
            attempts.push((l, Value::Counter(v.load(Ordering::Relaxed))));
        }
        for (o, h) in OUTCOMES.iter().zip(&st.latency) {
            let mut l = ch(c);
            l.push(("outcome", o.to_string()));
            latency.push((l, Value::Hist(h.clone())));
        }
        held.push((ch(c), Value::Counter(st.held.load(Ordering::Relaxed))));
        held_local.push((ch(c), Value::Counter(st.held_local.load(Ordering::Relaxed))));
        in_flight.push((ch(c), Value::Gauge(c.in_flight() as i64)));
        if let Some(b) = c.breaker_state() {
            breaker.push((ch(c), Value::Gauge(i64::from(b != BreakerState::Closed))));
        }
    }
    s.add(
        "herald_channel_attempts",
        MetricType::Counter,
        "Delivery attempts by channel and outcome",
        attempts,
    );
    s.add(
        "herald_delivery_duration_seconds",
        MetricType::Histogram,
        "Time one delivery attempt took (request to answer) by channel and outcome (held: a local resource ran out)",
        latency,
    );
    s.add(
        "herald_channel_held",
        MetricType::Counter,
        "Sends held by the rate limit, an open breaker or a local resource shortage (put back on the wheel)",
        held,
    );
    s.add(
        "herald_channel_held_local",
        MetricType::Counter,
        "Sends held because this host ran out of a resource (too many open files, no buffer space): no attempt counted, breaker not told",
        held_local,
    );
    s.add(
        "herald_channel_in_flight",
        MetricType::Gauge,
        "Sends in flight",
        in_flight,
    );
    if !breaker.is_empty() {
        s.add(
            "herald_channel_breaker_open",
            MetricType::Gauge,
            "1 while the channel's breaker is open or half-open",
            breaker,
        );
    }
}

/// The `Content-Type` of `/metrics`.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_templates_with_bounded_values() {
        assert_eq!(route_of("/v1/tasks/abc"), "/v1/tasks/{id}");
        assert_eq!(route_of("/v1/tasks/abc/"), "/v1/tasks/{id}");
        assert_eq!(route_of("/v1/tasks/a/pause"), "/v1/tasks/{id}/{action}");
        assert_eq!(route_of("/v1/tasks/a/runs"), "/v1/tasks/{id}/runs");
        assert_eq!(route_of("/v1/tasks/a/timeline"), "/v1/tasks/{id}/timeline");
        assert_eq!(route_of("/v1/tasks/a/backfill"), "/v1/tasks/{id}/backfill");
        assert_eq!(
            route_of("/v1/failures/a:1:2/retry"),
            "/v1/failures/{id}/retry"
        );
        assert_eq!(route_of("/"), "/");
        assert_eq!(route_of("/metrics"), "/metrics");
        assert_eq!(route_of("/v1/nothing/here"), "other");
        assert_eq!(route_of("/wp-admin.php"), "other");
        assert_eq!(route_of("/v1/tasks/a/pause/b/c/d/e"), "other");
        assert_eq!(status_class(204), "2xx");
        assert_eq!(status_class(503), "5xx");
        assert_eq!(method_label(&hyper::Method::TRACE), "other");
    }
}

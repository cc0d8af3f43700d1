//! Span export over OTLP/HTTP with the JSON encoding (`[telemetry] otlp_endpoint`,
//! `HERALD_OTLP_ENDPOINT`), written here over a plain TCP connection on a thread of its own.
//!
//! Why not the `opentelemetry` crates: their OTLP exporter needs protobuf (`prost`,
//! `opentelemetry-proto`) and an HTTP client of its own (reqwest, or hyper through
//! `opentelemetry-http` on a runtime it drives), a large build on this 2-core machine for
//! what is a few hundred lines: a bounded queue, a batch, one POST. OTLP/HTTP accepts JSON
//! (`Content-Type: application/json`, ids in hex) on the same `/v1/traces` path as protobuf,
//! and every collector (the OpenTelemetry Collector, Jaeger, Tempo) reads it.
//!
//! Cost and failure: with no endpoint there is no exporter and nothing is built
//! ([`Telemetry::off`]: every call site checks [`Telemetry::on`] first). With one, a span is
//! handed to a bounded queue with `try_send` ([`QUEUE_SPANS`]); a full queue drops the span and
//! counts it ([`ExportStats::dropped`], `/metrics`). The exporter thread batches what is queued
//! and POSTs it with short timeouts; a collector that is down costs that thread a refused
//! connect (and then a pause, [`RETRY_PAUSE`]), never a send or a request: they only ever
//! touch the queue.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::timeline::hex;

/// Spans waiting for the exporter thread; past it new spans are dropped (and counted).
pub const QUEUE_SPANS: usize = 4_096;
/// Most spans in one POST.
pub const BATCH_SPANS: usize = 512;
/// How long a span may wait for its batch to fill.
pub const BATCH_WAIT: Duration = Duration::from_millis(200);
/// The port of an endpoint that names none: OTLP/HTTP's own.
pub const DEFAULT_PORT: u16 = 4318;
/// Connect, write and read bounds of one POST.
pub const POST_TIMEOUT: Duration = Duration::from_secs(2);
/// After a failed POST the thread waits this long before trying again (spans keep queueing,
/// and are dropped once the queue is full).
pub const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// OTLP span kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Str(String),
    Int(i64),
}

impl From<&str> for Attr {
    fn from(s: &str) -> Attr {
        Attr::Str(s.to_string())
    }
}
impl From<String> for Attr {
    fn from(s: String) -> Attr {
        Attr::Str(s)
    }
}
impl From<u32> for Attr {
    fn from(n: u32) -> Attr {
        Attr::Int(i64::from(n))
    }
}
impl From<u64> for Attr {
    fn from(n: u64) -> Attr {
        Attr::Int(n.min(i64::MAX as u64) as i64)
    }
}
impl From<u16> for Attr {
    fn from(n: u16) -> Attr {
        Attr::Int(i64::from(n))
    }
}

/// One finished span.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub kind: SpanKind,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub attrs: Vec<(&'static str, Attr)>,
    /// An error status with its message (`None`: unset, i.e. fine).
    pub error: Option<String>,
    /// Spans of other traces this one is linked to (a control call made in the caller's
    /// trace on a task of another).
    pub links: Vec<([u8; 16], [u8; 8])>,
}

impl Span {
    pub fn attr(mut self, key: &'static str, v: impl Into<Attr>) -> Span {
        self.attrs.push((key, v.into()));
        self
    }
}

/// Nanoseconds since the Unix epoch now (span stamps are wall time, as OTLP wants).
pub fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// What the exporter did, for `/metrics`.
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Spans a collector accepted.
    pub exported: AtomicU64,
    /// Spans lost: the queue was full, or their POST failed.
    pub dropped: AtomicU64,
    /// POSTs that failed (no connection, a timeout, a status other than 2xx).
    pub failed_posts: AtomicU64,
}

/// The exporter as the rest of herald holds it: cheap to clone, a no-op when off.
#[derive(Clone, Default)]
pub struct Telemetry(Option<Arc<Exporter>>);

impl Telemetry {
    /// No export: every call costs one branch.
    pub fn off() -> Telemetry {
        Telemetry(None)
    }

    /// Exports to `endpoint` (see [`check_endpoint`]).
    pub fn start(endpoint: &str) -> Result<Telemetry, String> {
        Ok(Telemetry(Some(Arc::new(Exporter::start(endpoint)?))))
    }

    pub fn on(&self) -> bool {
        self.0.is_some()
    }

    /// Queues a finished span (dropped and counted when the queue is full).
    pub fn export(&self, span: Span) {
        if let Some(x) = &self.0 {
            x.export(span);
        }
    }

    pub fn stats(&self) -> Option<&ExportStats> {
        self.0.as_ref().map(|x| &*x.stats)
    }
}

pub struct Exporter {
    tx: crossbeam_channel::Sender<Span>,
    stats: Arc<ExportStats>,
}

impl Exporter {
    fn start(endpoint: &str) -> Result<Exporter, String> {
        let target = Target::parse(endpoint)?;
        let (tx, rx) = crossbeam_channel::bounded(QUEUE_SPANS);
        let stats = Arc::new(ExportStats::default());
        let st = stats.clone();
        std::thread::Builder::new()
            .name("herald-otlp".into())
            .spawn(move || run(target, rx, st))
            .map_err(|e| format!("cannot start the exporter thread: {e}"))?;
        Ok(Exporter { tx, stats })
    }

    fn export(&self, span: Span) {
        if self.tx.try_send(span).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `http://host:port[/path]`: OTLP/HTTP's base endpoint (`/v1/traces` is added unless the
/// path already ends with it). https is not spoken by this exporter: a collector on another
/// host is reached through a local agent or collector.
pub fn check_endpoint(e: &str) -> Result<(), String> {
    Target::parse(e).map(|_| ())
}

#[derive(Clone, Debug, PartialEq)]
struct Target {
    host: String,
    port: u16,
    path: String,
}

impl Target {
    fn parse(e: &str) -> Result<Target, String> {
        // Before any error that echoes the endpoint: user info would be a password in it.
        // Anywhere, not only before the first `/`: a password may hold `/`, `?` or `#` raw
        // (`user:pa/ss@host`), and the errors below would echo it.
        if e.contains('@') {
            return Err(
                "an @ is not supported in the endpoint: user info (user:password@) would be a password (not shown here); write http://host:port/path".into(),
            );
        }
        let rest = e.trim().strip_prefix("http://").ok_or_else(|| {
            format!("{e:?}: expected http://host:port (OTLP/HTTP; https is not supported, use a local collector)")
        })?;
        let (authority, path) = match rest.find(['/', '?', '#']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (host, port) = split_authority(e, authority)?;
        // The path goes into the request line as it is.
        if path.contains(['?', '#']) {
            return Err(format!(
                "{e:?}: a query (?) or fragment (#) is not supported; write http://host:port/path"
            ));
        }
        if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "{}: the path may not have whitespace or control characters",
                crate::logsafe::Escaped(e)
            ));
        }
        let path = path.trim_end_matches('/');
        let path = if path.ends_with("/v1/traces") {
            path.to_string()
        } else {
            format!("{path}/v1/traces")
        };
        Ok(Target {
            host: host.to_string(),
            port,
            path,
        })
    }

    /// `host:port` as a URL and a `Host` header write it: an IPv6 address in brackets.
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// An endpoint's authority as (host, port): `host`, `host:port`, `[v6]` or `[v6]:port`, the
/// port [`DEFAULT_PORT`] when none is given; an IPv6 address without its brackets is refused
/// (`::1:4318` cannot say where the address ends). `e` is the whole endpoint, for the errors.
fn split_authority<'a>(e: &str, authority: &'a str) -> Result<(&'a str, u16), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("{e:?}: {p:?} is not a port"))
    };
    if let Some(inner) = authority.strip_prefix('[') {
        let (ip, after) = inner
            .split_once(']')
            .ok_or_else(|| format!("{e:?}: the IPv6 address has no closing ']'"))?;
        if ip.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{e:?}: {ip:?} is not an IPv6 address"));
        }
        let port = match after {
            "" => DEFAULT_PORT,
            _ => match after.strip_prefix(':') {
                Some(p) => port(p)?,
                None => return Err(format!("{e:?}: expected :port after ']', not {after:?}")),
            },
        };
        return Ok((ip, port));
    }
    let (host, port) = match authority.split_once(':') {
        Some((_, p)) if p.contains(':') => {
            return Err(format!(
                "{e:?}: an IPv6 address goes in brackets, e.g. http://[::1]:{DEFAULT_PORT}"
            ))
        }
        Some((h, p)) => (h, port(p)?),
        None => (authority, DEFAULT_PORT),
    };
    if host.is_empty() {
        return Err(format!("{e:?}: no host"));
    }
    if host.contains(['[', ']']) {
        return Err(format!("{e:?}: {host:?} is not a host"));
    }
    Ok((host, port))
}

/// The exporter thread: batches, POSTs, pauses after a failure; ends when every sender is gone.
fn run(target: Target, rx: crossbeam_channel::Receiver<Span>, stats: Arc<ExportStats>) {
    let mut batch: Vec<Span> = Vec::with_capacity(BATCH_SPANS);
    let mut warned_at: Option<Instant> = None;
    loop {
        let first = match rx.recv() {
            Ok(s) => s,
            Err(_) => return,
        };
        batch.push(first);
        let deadline = Instant::now() + BATCH_WAIT;
        while batch.len() < BATCH_SPANS {
            match rx.recv_deadline(deadline) {
                Ok(s) => batch.push(s),
                Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        match post(&target, &encode(&batch)) {
            Ok(()) => {
                stats.exported.fetch_add(n, Ordering::Relaxed);
            }
            Err(why) => {
                stats.dropped.fetch_add(n, Ordering::Relaxed);
                stats.failed_posts.fetch_add(1, Ordering::Relaxed);
                // One line a minute at most: a collector that is down is not news every second.
                if warned_at.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    tracing::warn!(endpoint = %format!("http://{}{}", target.authority(), target.path),
                        error = %why, spans = n, "OTLP export failed; spans dropped");
                    warned_at = Some(Instant::now());
                }
                std::thread::sleep(RETRY_PAUSE);
            }
        }
        batch.clear();
    }
}

/// A connection to the first of `addrs` that accepts one, in the resolver's order, within
/// [`POST_TIMEOUT`] in all: `localhost` most often resolves to `::1` first, and a collector
/// listening on `127.0.0.1` only must still be reached (as `TcpStream::connect` would).
fn connect(addrs: &[SocketAddr]) -> Result<TcpStream, String> {
    let end = Instant::now() + POST_TIMEOUT;
    let mut last = String::from("the host resolves to no address");
    for addr in addrs {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(addr, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(last)
}

/// One POST of an encoded batch; `Ok` on a 2xx answer.
fn post(t: &Target, body: &[u8]) -> Result<(), String> {
    let addrs: Vec<SocketAddr> = (t.host.as_str(), t.port)
        .to_socket_addrs()
        .map_err(|e| format!("resolve {}: {e}", t.host))?
        .collect();
    let mut s = connect(&addrs)?;
    s.set_write_timeout(Some(POST_TIMEOUT))
        .and_then(|_| s.set_read_timeout(Some(POST_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let host = t.authority();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\nUser-Agent: herald\r\n\r\n",
        t.path,
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(body))
        .map_err(|e| e.to_string())?;
    // The status line is all that is needed; a short read bounded by the timeout.
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        let Some(room) = buf.get_mut(got..) else {
            break;
        };
        match s.read(room) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(e.to_string()),
        }
    }
    let line = String::from_utf8_lossy(buf.get(..got).unwrap_or_default());
    match line.split(' ').nth(1) {
        Some(code) if code.starts_with('2') => Ok(()),
        Some(code) => Err(format!("the collector answered {code}")),
        None => Err("the collector sent no status line".into()),
    }
}

/// A batch as an OTLP `ExportTraceServiceRequest` in its JSON mapping (ids hex, 64-bit
/// integers as strings).
pub fn encode(spans: &[Span]) -> Vec<u8> {
    use serde_json::{json, Value};
    let attr = |(k, v): &(&'static str, Attr)| -> Value {
        let value = match v {
            Attr::Str(s) => json!({ "stringValue": s }),
            Attr::Int(n) => json!({ "intValue": n.to_string() }),
        };
        json!({ "key": k, "value": value })
    };
    let list: Vec<Value> = spans
        .iter()
        .map(|s| {
            let mut o = serde_json::Map::new();
            let fields = [
                ("traceId", json!(hex(&s.trace_id))),
                ("spanId", json!(hex(&s.span_id))),
                ("name", json!(s.name)),
                ("kind", json!(s.kind as u8)),
                ("startTimeUnixNano", json!(s.start_unix_ns.to_string())),
                (
                    "endTimeUnixNano",
                    json!(s.end_unix_ns.max(s.start_unix_ns).to_string()),
                ),
                (
                    "attributes",
                    json!(s.attrs.iter().map(attr).collect::<Vec<_>>()),
                ),
            ];
            for (k, v) in fields {
                o.insert(k.into(), v);
            }
            if let Some(p) = &s.parent {
                o.insert("parentSpanId".into(), json!(hex(p)));
            }
            if let Some(e) = &s.error {
                o.insert("status".into(), json!({ "code": 2, "message": e }));
            }
            if !s.links.is_empty() {
                let links = s
                    .links
                    .iter()
                    .map(|(t, sp)| json!({ "traceId": hex(t), "spanId": hex(sp) }))
                    .collect();
                o.insert("links".into(), links);
            }
            Value::Object(o)
        })
        .collect();
    let doc = json!({
        "resourceSpans": [{
            "resource": { "attributes": [
                { "key": "service.name", "value": { "stringValue": "herald" } },
                { "key": "service.version", "value": { "stringValue": env!("CARGO_PKG_VERSION") } },
            ]},
            "scopeSpans": [{ "scope": { "name": "herald" }, "spans": list }],
        }]
    });
    serde_json::to_vec(&doc).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_https_is_refused_with_a_reason() {
        let t = Target::parse("http://127.0.0.1:4318").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("127.0.0.1", 4318, "/v1/traces")
        );
        let t = Target::parse("http://collector/otlp/").unwrap();
        assert_eq!((t.port, t.path.as_str()), (4318, "/otlp/v1/traces"));
        let t = Target::parse("http://[::1]:9/v1/traces").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 9, "/v1/traces")
        );
        assert!(check_endpoint("https://x:4318")
            .unwrap_err()
            .contains("https"));
        assert!(check_endpoint("http://x:port").is_err());
        assert!(check_endpoint("http://:1").is_err());
    }

    /// User info is refused without echoing it; a path must be fit for the request line as
    /// it is written there.
    #[test]
    fn user_info_queries_and_odd_characters_are_refused() {
        for e in [
            "http://user:pa55@collector:4318/x",
            "http://user:pa55@collector",
            "https://user:pa55@collector",
            "http://user:pa55@[::1]:bad",
        ] {
            let m = check_endpoint(e).unwrap_err();
            assert!(m.contains("user info") && !m.contains("pa55"), "{e}: {m}");
        }
        // A password may hold `/` raw: an `@` anywhere is refused, the endpoint not echoed.
        for e in [
            "http://user:pa/55@collector:4318",
            "http://collector/a@pa55",
        ] {
            let m = check_endpoint(e).unwrap_err();
            assert!(m.contains("user info") && !m.contains("pa55"), "{e}: {m}");
        }
        for e in [
            "http://collector/otlp?x=1",
            "http://collector:4318?x=1",
            "http://collector/otlp#f",
        ] {
            let m = check_endpoint(e).unwrap_err();
            assert!(m.contains("query (?) or fragment (#)"), "{e}: {m}");
        }
        for e in [
            "http://collector/ot lp",
            "http://collector/otlp\r\nX-Evil: 1",
            "http://collector/a\u{7f}",
        ] {
            let m = check_endpoint(e).unwrap_err();
            assert!(
                m.contains("whitespace or control") && !m.contains('\n'),
                "{e}: {m}"
            );
        }
        let env = |n: &str| (n == "HERALD_OTLP_ENDPOINT").then(|| "http://u:pa55@c".to_string());
        let m = crate::config::Config::from_toml_with_env(
            "",
            crate::config::Overrides::default(),
            &env,
        )
        .unwrap_err()
        .to_string();
        assert!(
            m.starts_with("telemetry.otlp_endpoint:") && !m.contains("pa55"),
            "{m}"
        );
    }

    /// An IPv6 literal with no port gets the default port, as a host name or IPv4 address
    /// does; the `Host` header and logs bracket it again.
    #[test]
    fn ipv6_endpoints_without_a_port_take_the_default_port() {
        let parts = |e: &str| {
            let t = Target::parse(e).unwrap_or_else(|m| panic!("{e}: {m}"));
            (t.host.clone(), t.port, t.path.clone(), t.authority())
        };
        let v6 = |port: u16, path: &str| {
            (
                "::1".to_string(),
                port,
                path.to_string(),
                format!("[::1]:{port}"),
            )
        };
        assert_eq!(parts("http://[::1]/v1/traces"), v6(4318, "/v1/traces"));
        assert_eq!(parts("http://[::1]"), v6(4318, "/v1/traces"));
        assert_eq!(parts("http://[::1]/"), v6(4318, "/v1/traces"));
        assert_eq!(parts("http://[::1]:4319/otlp"), v6(4319, "/otlp/v1/traces"));
        let t = Target::parse("http://[2001:db8::8]/x").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("2001:db8::8", DEFAULT_PORT));
        // The same default as a host name and an IPv4 address.
        assert_eq!(
            Target::parse("http://collector").unwrap().port,
            DEFAULT_PORT
        );
        assert_eq!(
            Target::parse("http://10.0.0.1/").unwrap().port,
            DEFAULT_PORT
        );
    }

    /// Malformed IPv6 endpoints are refused, each with what is wrong.
    #[test]
    fn malformed_ipv6_endpoints_are_refused_with_a_reason() {
        let err = |e: &str| check_endpoint(e).expect_err(e);
        assert!(
            err("http://::1").contains("brackets"),
            "{}",
            err("http://::1")
        );
        assert!(err("http://::1:4318/v1/traces").contains("brackets"));
        assert!(err("http://[::1").contains("closing ']'"));
        assert!(err("http://[::1/v1/traces").contains("closing ']'"));
        assert!(err("http://[::g]").contains("not an IPv6 address"));
        assert!(err("http://[]:4318").contains("not an IPv6 address"));
        assert!(err("http://[::1]4318").contains("expected :port"));
        assert!(err("http://[::1]:port").contains("not a port"));
        assert!(err("http://[::1]:").contains("not a port"));
        assert!(err("http://::1]").contains("brackets"));
        assert!(err("http://a]").contains("not a host"));
    }

    /// `localhost` resolving to `::1` first while the collector listens on `127.0.0.1` only:
    /// an address that refuses is passed over for the next (only the first was tried).
    #[test]
    fn an_address_that_refuses_is_passed_over_for_the_next() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let refused = closed.local_addr().unwrap();
        drop(closed);
        let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = connect(&[refused, open.local_addr().unwrap()]).expect("the second address");
        assert_eq!(s.peer_addr().unwrap(), open.local_addr().unwrap());
        let e = connect(&[refused]).expect_err("refused");
        assert!(e.starts_with(&refused.to_string()), "{e}");
        assert!(connect(&[]).is_err());
    }

    #[test]
    fn a_span_encodes_as_otlp_json() {
        let s = Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent: Some([3; 8]),
            name: "attempt".into(),
            kind: SpanKind::Client,
            start_unix_ns: 5,
            end_unix_ns: 9,
            attrs: vec![],
            error: Some("HTTP 500".into()),
            links: vec![],
        }
        .attr("herald.task.id", "t")
        .attr("herald.run", 2u32);
        let v: serde_json::Value = serde_json::from_slice(&encode(&[s])).unwrap();
        let span = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(span["traceId"], "01".repeat(16));
        assert_eq!(span["parentSpanId"], "03".repeat(8));
        assert_eq!(span["kind"], 3);
        assert_eq!(span["startTimeUnixNano"], "5");
        assert_eq!(span["attributes"][1]["value"]["intValue"], "2");
        assert_eq!(span["status"]["code"], 2);
    }

    #[test]
    fn with_no_collector_spans_are_dropped_and_counted_and_export_never_blocks() {
        // A port nobody listens on: bind one, learn its number, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let t = Telemetry::start(&format!("http://127.0.0.1:{port}")).unwrap();
        let span = Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent: None,
            name: "x".into(),
            kind: SpanKind::Internal,
            start_unix_ns: 1,
            end_unix_ns: 2,
            attrs: vec![],
            error: None,
            links: vec![],
        };
        let started = Instant::now();
        let n = QUEUE_SPANS as u64 * 3;
        for _ in 0..n {
            t.export(span.clone());
        }
        // Bounded: 12 288 spans queued or dropped well under the time of one POST.
        assert!(started.elapsed() < POST_TIMEOUT, "{:?}", started.elapsed());
        let stats = t.stats().unwrap();
        assert!(
            stats.dropped.load(Ordering::Relaxed) >= n - QUEUE_SPANS as u64 - BATCH_SPANS as u64
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.failed_posts.load(Ordering::Relaxed) == 0 {
            assert!(
                Instant::now() < deadline,
                "the refused POST was never counted"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(stats.exported.load(Ordering::Relaxed), 0);
    }
}

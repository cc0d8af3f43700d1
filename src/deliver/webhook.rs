//! The `webhook` sink: POSTs the delivery as JSON with hyper's pooled client (connections are
//! reused across deliveries of a channel) under a per-channel timeout. `https://` URLs go over
//! rustls (ring) trusting the Mozilla roots plus the channel's `ca_file`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use hyper::{Request, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

use super::platform::{Platform, Prepared};
use super::sign::{Signer, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};
use super::success::{Answer, SuccessRule, Verdict};
use super::{Alert, AttemptTrace, Delivery};
use crate::model::Outcome;

/// How much of a failed answer's body we read (for the failure list) when no rule needs more.
const EXCERPT_BYTES_MAX: usize = 512;

pub struct WebhookSink {
    url: Uri,
    timeout: Duration,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    signer: Option<Signer>,
    platform: Option<Platform>,
    /// The platform's success rule, or the default (2xx).
    rule: SuccessRule,
    /// Answers' bodies drained in the background at once ([`finish_or_drain`]): as many as
    /// the channel's `concurrency` ([`WebhookSink::keep_drains`]), whose descriptors the
    /// budget keeps (`fdlimit::reserve`).
    drains: Arc<tokio::sync::Semaphore>,
}

/// Reads the PEM CA certificates of a `ca_file`: at least one, each usable as a trust anchor.
pub fn load_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: bad PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no CERTIFICATE in it", path.display()));
    }
    let mut store = RootCertStore::empty();
    for cert in &certs {
        store
            .add(cert.clone())
            .map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
    }
    Ok(certs)
}

/// TLS client settings: ring, TLS 1.2/1.3, webpki roots plus `extra_roots`, ALPN http/1.1.
pub(crate) fn tls_config(extra_roots: &[CertificateDer<'static>]) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for cert in extra_roots {
        roots
            .add(cert.clone())
            .map_err(|e| format!("CA certificate: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// True if the error chain holds a rustls error (handshake: unknown CA, wrong name, alert).
fn is_tls_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        // io::Error's source() skips the error it wraps (which may be another io::Error), so
        // look inside as well.
        let mut inner = Some(err);
        while let Some(i) = inner {
            if i.is::<rustls::Error>() {
                return true;
            }
            inner = i
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .map(|b| b as &(dyn std::error::Error + 'static));
        }
        cur = err.source();
    }
    false
}

impl WebhookSink {
    /// `url` is `http://` or `https://` (checked by config). `timeout_ms` bounds the attempt up
    /// to the answer's status line and headers: connect, TLS handshake, send, wait;
    /// `connect_timeout_ms` the TCP connect alone. `extra_roots` are trusted besides the
    /// webpki roots (`ca_file`). With a signer every request carries the Standard Webhooks
    /// headers; with a platform the request comes from its templates and the answer is judged
    /// by its success rule.
    pub fn new(
        url: Uri,
        timeout_ms: u64,
        connect_timeout_ms: u64,
        extra_roots: &[CertificateDer<'static>],
        signer: Option<Signer>,
    ) -> Result<WebhookSink, String> {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(Duration::from_millis(connect_timeout_ms)));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(extra_roots)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Ok(WebhookSink {
            url,
            timeout: Duration::from_millis(timeout_ms),
            client,
            signer,
            platform: None,
            rule: SuccessRule::default(),
            drains: Arc::new(tokio::sync::Semaphore::new(DRAINS_DEFAULT)),
        })
    }

    /// Background drains at once for a channel of `concurrency` (`Channel::plain`): each
    /// holds the socket of a send whose slot was let go, so there are as many as slots.
    pub fn keep_drains(&mut self, concurrency: usize) {
        self.drains = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    }

    /// The bound on one request (`timeout`: connect, send, the answer's status line).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Makes this a platform channel (templates, success rule, token, signer).
    pub fn with_platform(mut self, platform: Platform) -> WebhookSink {
        self.rule = platform.spec.success.clone();
        self.platform = Some(platform);
        self
    }

    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// Whether requests carry Standard Webhooks signatures.
    pub fn signed(&self) -> bool {
        self.signer.is_some()
    }

    pub fn platform(&self) -> Option<&Platform> {
        self.platform.as_ref()
    }

    /// Delivers one message.
    pub async fn deliver(
        &self,
        d: &Delivery,
        trace: &AttemptTrace,
        now_ms: impl Fn() -> u64,
    ) -> Outcome {
        let tp = trace.traceparent.as_deref().unwrap_or("");
        match &self.platform {
            None => {
                self.post_default(d, &d.idempotency_key, trace, &now_ms)
                    .await
            }
            Some(p) => {
                self.post_platform(p, &d.idempotency_key, trace, &now_ms, |tok, now| {
                    p.prepare(d, tp, tok, now)
                })
                .await
            }
        }
    }

    /// Delivers one alert.
    pub async fn alert(&self, a: &Alert, now_ms: impl Fn() -> u64) -> Outcome {
        let trace = AttemptTrace::default();
        match &self.platform {
            None => self.post_default(a, &a.id, &trace, &now_ms).await,
            Some(p) => {
                self.post_platform(p, &a.id, &trace, &now_ms, |tok, now| {
                    p.prepare_alert(a, tok, now)
                })
                .await
            }
        }
    }

    /// herald's own body: `payload` as JSON.
    async fn post_default<T: serde::Serialize>(
        &self,
        payload: &T,
        key: &str,
        trace: &AttemptTrace,
        now_ms: &impl Fn() -> u64,
    ) -> Outcome {
        let body = match serde_json::to_vec(payload) {
            Ok(b) => b,
            Err(e) => {
                return Outcome::Permanent {
                    error: format!("encode: {e}"),
                }
            }
        };
        let prepared = Prepared {
            method: hyper::Method::POST,
            uri: self.url.clone(),
            headers: Vec::new(),
            body,
            has_content_type: false,
        };
        match self
            .exchange(prepared, key, trace, now_ms, self.timeout)
            .await
        {
            Verdict::Done(o) => o,
            Verdict::RefreshToken { error } => Outcome::Retry {
                error,
                not_before_ms: None,
            },
        }
    }

    /// A platform request: token (if any), templates, send, success rule; when the platform
    /// refuses the token, one refresh (shared with every concurrent send) and one more try.
    /// The channel's `timeout` bounds the whole attempt's requests, the token's fetch, the
    /// refresh and the second try included (only reading an answer's body may go past it, by
    /// `answer_timeout`, as for any webhook): the drain's wait and cluster mode's wait before an
    /// inherited in-flight mark goes again both count on no request being under way after it.
    async fn post_platform(
        &self,
        p: &Platform,
        key: &str,
        trace: &AttemptTrace,
        now_ms: &impl Fn() -> u64,
        prepare: impl Fn(Option<&str>, u64) -> Result<Prepared, String>,
    ) -> Outcome {
        let mut refreshed = false;
        let end = tokio::time::Instant::now() + self.timeout;
        let left = || end.saturating_duration_since(tokio::time::Instant::now());
        loop {
            let token = match &p.token {
                Some(cache) => match cache.get(now_ms, end, || self.fetch_token(p, left())).await {
                    Ok(t) => Some(t),
                    Err(error) => {
                        return Outcome::Retry {
                            error: format!("access token: {error}"),
                            not_before_ms: None,
                        }
                    }
                },
                None => None,
            };
            let prepared = match prepare(token.as_ref().map(|t| t.0.as_str()), now_ms()) {
                Ok(r) => r,
                Err(error) => return Outcome::Permanent { error },
            };
            if left().is_zero() {
                // Nothing was sent in this attempt (a slow token, or a refresh after a refusal).
                return Outcome::Retry {
                    error: format!("timed out after {} ms", self.timeout.as_millis()),
                    not_before_ms: None,
                };
            }
            match self.exchange(prepared, key, trace, now_ms, left()).await {
                Verdict::Done(o) => return o,
                Verdict::RefreshToken { error } => match (&p.token, token) {
                    (Some(cache), Some((_, generation))) if !refreshed => {
                        tracing::info!(error = %crate::logsafe::Escaped(&error), "the platform refused the access token; refreshing");
                        cache.refused(generation);
                        refreshed = true;
                    }
                    _ => {
                        return Outcome::Retry {
                            error,
                            not_before_ms: None,
                        }
                    }
                },
            }
        }
    }

    /// Asks the token endpoint; returns the answer's status and (bounded) body.
    async fn fetch_token(&self, p: &Platform, limit: Duration) -> Result<(u16, Vec<u8>), String> {
        let Some(cache) = &p.token else {
            return Err("no token endpoint".into());
        };
        let spec = &cache.spec;
        let method = hyper::Method::from_bytes(spec.method.as_bytes())
            .map_err(|_| "bad token.method".to_string())?;
        let uri: Uri = spec
            .url
            .parse()
            .map_err(|_| "token.url is not a URL".to_string())?;
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("user-agent", concat!("herald/", env!("CARGO_PKG_VERSION")));
        if spec.body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(
                spec.body.clone().unwrap_or_default(),
            )))
            // The error would print the URL, which holds a secret.
            .map_err(|_| "cannot build the token request".to_string())?;
        let resp = within(limit, self.client.request(req))
            .await
            .ok_or_else(|| format!("timed out after {} ms", self.timeout.as_millis()))?
            .map_err(|e| error_text(&e))?;
        let status = resp.status().as_u16();
        let (bytes, cut) = read_bounded(
            resp.into_body(),
            p.spec.answer_bytes_max,
            Duration::from_millis(p.spec.answer_timeout_ms),
        )
        .await;
        if let Some(why) = cut {
            return Err(format!("HTTP {status}, answer cut short ({why})"));
        }
        Ok((status, bytes))
    }

    /// Sends one request and judges the answer on its status line and headers; the body is
    /// read (bounded, with its own timeout) only when the rule needs it or for the failure
    /// list, so a 2xx whose body is slow or trickles is not a timeout.
    /// `limit`: how long the request may take until its answer's head.
    async fn exchange(
        &self,
        p: Prepared,
        key: &str,
        trace: &AttemptTrace,
        now_ms: &impl Fn() -> u64,
        limit: Duration,
    ) -> Verdict {
        let req = match self.request(p, key, trace, now_ms) {
            Ok(r) => r,
            Err(v) => return v,
        };
        // The last look before the request is written: a token fetched or refreshed above
        // may have taken until after a cancel or pause of the delivery's task was answered.
        if gate_closed() {
            return Verdict::Done(Gate::stopped(now_ms()));
        }
        let resp = match within(limit, self.client.request(req)).await {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                let error = error_text(&e);
                if is_local_resource_error(&e) {
                    return Verdict::Done(Outcome::Held {
                        error: format!("held, not sent: {error}"),
                        until_ms: now_ms().saturating_add(LOCAL_RESOURCE_HOLD_MS),
                        why: crate::model::timeline::HeldWhy::LocalResource,
                    });
                }
                return Verdict::Done(Outcome::Retry {
                    error,
                    not_before_ms: None,
                });
            }
            None => {
                return Verdict::Done(Outcome::Retry {
                    error: format!("timed out after {} ms", self.timeout.as_millis()),
                    not_before_ms: None,
                })
            }
        };
        self.judge_answer(resp, trace, now_ms).await
    }

    /// The request: herald's headers, the channel's (which replace them), the signature.
    fn request(
        &self,
        p: Prepared,
        key: &str,
        trace: &AttemptTrace,
        now_ms: &impl Fn() -> u64,
    ) -> Result<Request<Full<Bytes>>, Verdict> {
        let mut req = Request::builder()
            .method(p.method)
            .uri(p.uri)
            .header("user-agent", concat!("herald/", env!("CARGO_PKG_VERSION")))
            .header("idempotency-key", key);
        if let Some(tp) = &trace.traceparent {
            // W3C trace context: the task's trace, this attempt's span (a channel header of
            // the same name still wins, below).
            req = req.header("traceparent", tp.as_str());
        }
        if let Some(e) = trace.epoch {
            req = req.header("herald-epoch", e);
        }
        if !p.has_content_type {
            req = req.header("content-type", "application/json");
        }
        if let Some(h) = req.headers_mut() {
            // The channel's headers replace herald's defaults of the same name.
            for (name, value) in p.headers {
                h.insert(name, value);
            }
        }
        if let Some(signer) = &self.signer {
            let ts = now_ms() / 1_000;
            req = req
                .header(HEADER_ID, key)
                .header(HEADER_TIMESTAMP, ts.to_string())
                .header(HEADER_SIGNATURE, signer.signature_header(key, ts, &p.body));
        }
        req.body(Full::new(Bytes::from(p.body))).map_err(|e| {
            Verdict::Done(Outcome::Permanent {
                error: format!("request: {e}"),
            })
        })
    }

    /// Judges an answer on its status line and headers, reading its body (bounded) only when
    /// the rule needs it or for the failure list's excerpt.
    async fn judge_answer(
        &self,
        resp: hyper::Response<Incoming>,
        trace: &AttemptTrace,
        now_ms: &impl Fn() -> u64,
    ) -> Verdict {
        let status = resp.status().as_u16();
        trace
            .status
            .store(u32::from(status), std::sync::atomic::Ordering::Relaxed);
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp.into_body();
        let (limit, wait) = match &self.platform {
            Some(p) => (
                p.spec.answer_bytes_max,
                Duration::from_millis(p.spec.answer_timeout_ms),
            ),
            None => (EXCERPT_BYTES_MAX, Duration::from_millis(EXCERPT_TIMEOUT_MS)),
        };
        let (bytes, cut) = if self.rule.needs_body(status) {
            read_bounded(body, limit, wait).await
        } else if self.rule.status.contains(status) {
            // Success on the status line alone: the outcome does not wait for the body. It is
            // drained in the background so the connection can be reused.
            finish_or_drain(body, &self.drains).await;
            return Verdict::Done(
                self.rule
                    .judge(status, retry_after.as_deref(), Answer::Unread, now_ms())
                    .into_outcome(),
            );
        } else {
            // A failure: a short excerpt for the failure list.
            read_bounded(
                body,
                EXCERPT_BYTES_MAX,
                Duration::from_millis(EXCERPT_TIMEOUT_MS),
            )
            .await
        };
        let answer = match cut {
            None => Answer::Complete(&bytes),
            Some(why) => Answer::Partial(&bytes, why),
        };
        self.rule
            .judge(status, retry_after.as_deref(), answer, now_ms())
    }
}

impl Verdict {
    fn into_outcome(self) -> Outcome {
        match self {
            Verdict::Done(o) => o,
            Verdict::RefreshToken { error } => Outcome::Retry {
                error,
                not_before_ms: None,
            },
        }
    }
}

/// Whether the sends of one task may still start. The engine closes it when a cancel or a
/// pause of the task is about to be made durable (and opens it again if that write fails, or
/// on resume), so a send prepared before the command starts no request after its answer
/// (API.md: "no send of this task starts after the answer"). Read without a lock by the send
/// it is given to ([`gated`]) right before each request of the delivery: after a token fetch,
/// and before the second try after a token refresh. (A request whose look came before the
/// close started before the answer; it may still be on its way when the answer goes.)
#[derive(Debug, Default)]
pub struct Gate {
    closed: std::sync::atomic::AtomicBool,
}

impl Gate {
    /// Closes the gate; whether it was closed already.
    pub fn close(&self) -> bool {
        self.closed.swap(true, std::sync::atomic::Ordering::SeqCst)
    }

    pub fn open(&self) {
        self.closed
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The outcome of a send its closed gate stopped: nothing was sent, nothing is counted
    /// (a cancelled run ends with it, a paused one sends on resume).
    pub fn stopped(now_ms: u64) -> Outcome {
        Outcome::Held {
            error: "not sent: the task was cancelled or paused before the message's request was written".into(),
            until_ms: now_ms,
            why: crate::model::timeline::HeldWhy::Stopped,
        }
    }
}

tokio::task_local! {
    /// The gate of the send being polled ([`gated`]); none for alerts and notifications.
    static GATE: Arc<Gate>;
}

/// Runs `send` (a delivery's attempt) with `gate` as its gate: every request of the delivery
/// is written only while the gate is open (a closed one makes the attempt [`Gate::stopped`]).
/// The gate goes with the attempt as a task-local value, so `Channel::send_with` and the
/// sinks between it and the request need not carry it.
pub async fn gated<F: std::future::Future>(gate: Arc<Gate>, send: F) -> F::Output {
    GATE.scope(gate, send).await
}

/// Whether the gate of the send being polled is closed (`false` outside [`gated`]).
pub fn gate_closed() -> bool {
    GATE.try_with(|g| g.is_closed()).unwrap_or(false)
}

/// How long a send that hit a local resource limit waits before it is tried again.
pub const LOCAL_RESOURCE_HOLD_MS: u64 = 250;
/// Time allowed to read the excerpt of a failed answer.
const EXCERPT_TIMEOUT_MS: u64 = 1_000;

/// The client error with the root cause (refused, reset, ...) rather than hyper's wrapper.
fn error_text(e: &hyper_util::client::legacy::Error) -> String {
    let mut msg = e.to_string();
    if is_tls_error(e) {
        let what = if e.is_connect() {
            "TLS handshake failed"
        } else {
            "TLS error"
        };
        msg = format!("{what}: {msg}");
    }
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    msg
}

/// True if the error chain holds an OS error that says this host ran out of something (file
/// descriptors, buffer space, memory): the request never left, and the receiver is not to blame.
pub fn is_local_resource_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if let Some(code) = io.raw_os_error() {
                if [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM].contains(&code) {
                    return true;
                }
            }
            if let Some(inner) = io.get_ref() {
                if is_local_resource_error(inner) {
                    return true;
                }
            }
        }
        cur = err.source();
    }
    false
}

/// Background drains of a sink made without [`WebhookSink::keep_drains`] (tests, benches).
const DRAINS_DEFAULT: usize = 4;

/// Bodies dropped undrained because the channel's drains were all running (a metric). Past
/// them a body still on its way is dropped instead: its connection closes rather than going
/// back to the pool (a slow receiver then costs a new connection, never an unbounded number
/// of tasks or descriptors).
pub static DRAINS_DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A permit to drain one body in the background, if fewer than `drains` allows run.
fn drain_permit(drains: &Arc<tokio::sync::Semaphore>) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let p = drains.clone().try_acquire_owned().ok();
    if p.is_none() {
        DRAINS_DROPPED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    p
}

/// Reads the rest of a body the outcome does not depend on, so hyper can put the connection
/// back in the pool: what has already arrived is read now, without waiting (a small answer
/// usually comes with its head); a body still on its way is read in a task of its own
/// (bounded in size and time, and in number: the channel's drains) that nothing waits for.
async fn finish_or_drain(mut body: Incoming, drains: &Arc<tokio::sync::Semaphore>) {
    for _ in 0..8 {
        if body.is_end_stream() {
            return;
        }
        // `timeout` polls the frame once before looking at the (zero) deadline.
        match tokio::time::timeout(Duration::ZERO, body.frame()).await {
            Ok(Some(Ok(_))) => continue,
            Ok(None) | Ok(Some(Err(_))) => return,
            Err(_) => break,
        }
    }
    let Some(permit) = drain_permit(drains) else {
        return; // dropped: the connection closes
    };
    tokio::spawn(async move {
        let _permit = permit;
        let _ = read_bounded(body, 1 << 20, Duration::from_secs(30)).await;
    });
}

/// Reads at most `max` bytes of a body within `wait`. Returns what was read and, if it was cut
/// short, why.
pub async fn read_bounded(
    mut body: Incoming,
    max: usize,
    wait: Duration,
) -> (Vec<u8>, Option<&'static str>) {
    let mut buf = Vec::new();
    let read = async {
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        buf.extend_from_slice(data);
                        if buf.len() > max {
                            return Some("larger than the bound");
                        }
                    }
                }
                Some(Err(_)) => return Some("body error"),
                None => return None,
            }
        }
    };
    let cut = match tokio::time::timeout(wait, read).await {
        Ok(cut) => cut,
        Err(_) => Some("not complete in time"),
    };
    buf.truncate(max);
    (buf, cut)
}

/// A deadline timer that fires this late means the process was not running at the deadline
/// (SIGSTOP, a paused VM, a starved host), not that the peer was slow.
const FROZEN_LATE: Duration = Duration::from_millis(200);
/// After such a freeze, how long an attempt may still take to read what arrived meanwhile.
const AFTER_FREEZE_GRACE: Duration = Duration::from_secs(1);

/// `fut` within `limit` (`None`: timed out), except that a freeze is not a timeout: when the
/// deadline's timer fires [`FROZEN_LATE`] or more after the deadline, the answer may be in the
/// socket already and the runtime simply has not read it yet (timer and socket are woken in
/// the same turn after SIGCONT, the timer can win). Then `fut` gets [`AFTER_FREEZE_GRACE`]
/// more to read it: an answer that arrived is an answer.
async fn within<F: std::future::Future>(limit: Duration, fut: F) -> Option<F::Output> {
    tokio::pin!(fut);
    let deadline = tokio::time::Instant::now() + limit;
    tokio::select! {
        biased;
        r = &mut fut => return Some(r),
        _ = tokio::time::sleep_until(deadline) => {}
    }
    let late = tokio::time::Instant::now().saturating_duration_since(deadline);
    if late < FROZEN_LATE {
        return None;
    }
    tracing::info!(
        late_ms = late.as_millis() as u64,
        "a send's deadline passed while herald was not running: reading what arrived before judging it"
    );
    tokio::time::timeout(AFTER_FREEZE_GRACE, fut).await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_late_deadline_gives_the_answer_a_chance_an_on_time_one_does_not() {
        // On time: a future that never finishes times out.
        assert_eq!(
            within(Duration::from_millis(10), std::future::pending::<()>()).await,
            None
        );
        // The thread was not running at the deadline (blocked here like a stopped process):
        // the answer that became ready meanwhile is read.
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        // Like a socket whose readiness the runtime learns a turn after the timer's: ready
        // only on the poll after the one that saw the answer arrive.
        let answer = async move {
            let v = rx.await.ok();
            tokio::task::yield_now().await;
            v
        };
        let t = tokio::spawn(within(Duration::from_millis(10), answer));
        tokio::task::yield_now().await;
        std::thread::sleep(Duration::from_millis(300)); // the freeze itself, not a wait
        let _ = tx.send(7);
        assert_eq!(t.await.unwrap(), Some(Some(7)));
    }

    #[test]
    fn background_drains_are_bounded_and_the_rest_counted() {
        let drains = Arc::new(tokio::sync::Semaphore::new(16));
        let before = DRAINS_DROPPED.load(std::sync::atomic::Ordering::Relaxed);
        let held: Vec<_> = std::iter::from_fn(|| drain_permit(&drains))
            .take(17)
            .collect();
        assert_eq!(held.len(), 16, "at most the channel's drains at once");
        assert!(drain_permit(&drains).is_none());
        assert!(DRAINS_DROPPED.load(std::sync::atomic::Ordering::Relaxed) >= before + 2);
        drop(held);
        assert!(
            drain_permit(&drains).is_some(),
            "a finished drain frees its place"
        );
    }

    #[test]
    fn local_resource_errors() {
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert!(is_local_resource_error(&emfile));
        let nobufs = std::io::Error::other(std::io::Error::from_raw_os_error(libc::ENOBUFS));
        assert!(is_local_resource_error(&nobufs));
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert!(!is_local_resource_error(&refused));
    }
}

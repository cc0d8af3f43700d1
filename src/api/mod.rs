//! The HTTP control API on hyper 1 (HTTP/1.1): routing, body limits, auth, JSON in and out,
//! problem documents for every error. It talks to the [`Engine`] only; it never touches the
//! store's trees or the wheel.

mod backfill;
pub mod conns;
mod dashboard;
pub mod events;
mod export;
mod finish;
pub(crate) mod forward;
mod input;
mod lang;
pub mod metrics;
mod origin;
mod preview;
pub mod problem;
mod rejections;
mod runs;
pub mod timeline;
pub mod views;

/// The OpenAPI 3.1 document of this API, served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::engine::{Created, Engine, TaskView};
use crate::model::{check_id, Lang, RetryPolicy};
use crate::request::{PatchRequest, TaskRequest};
use input::{
    failure_path_id, page_params, param, parse_json, path_id, query, read_body, FAILURE_ID_LEN_MAX,
};
use problem::Problem;

type Resp = Response<Full<Bytes>>;

/// What every request handler can see.
pub struct ApiState {
    pub engine: Engine,
    pub token: Option<String>,
    pub body_bytes_max: usize,
    /// The whole request body must arrive within this (408 otherwise).
    pub body_read_timeout: Duration,
    /// The request head must arrive within this (hyper closes the connection otherwise).
    pub header_read_timeout: Duration,
    /// API request times by route (`/metrics`).
    pub metrics: metrics::ApiMetrics,
    /// The connection table (cap, reserve, event-stream caps; counters for `/metrics`).
    pub conns: Arc<conns::Conns>,
    /// The engine's clock (wall jumps for `/metrics`).
    pub clock: Arc<dyn crate::clock::Clock>,
    /// Each task's trace as deliveries see it, and the OTLP span export (`[telemetry]
    /// otlp_endpoint`; off: no cost). Shared with the channels.
    pub tracing: Arc<crate::trace::Tracing>,
}

const IDEMPOTENCY_KEY_BYTES_MAX: usize = 255;

/// Longest request target (path and query) answered; longer is 414 problem+json.
pub const URI_BYTES_MAX: usize = 8 * 1024;
/// Largest request head (the header lines) answered; larger is 431 problem+json.
pub const HEAD_BYTES_MAX: usize = 16 * 1024;
/// hyper's read buffer: heads up to this size reach the handler, which answers the two limits
/// above with a problem document. Past it hyper answers 431 itself (and a malformed request
/// 400), with an empty body that `rejections::ProblemIo` turns into a problem document.
const READ_BUF_BYTES: usize = 64 * 1024;

/// How long a request in progress may take to finish once the server stops.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Accepts connections until `shutdown` turns true; serves at most `conns.max()` at once, plus
/// the reserve (`conns.rs`). With every slot taken it stops accepting: the kernel's backlog
/// holds new clients until a slot frees, none is closed unanswered.
pub async fn serve(
    listener: TcpListener,
    state: Arc<ApiState>,
    mut shutdown: watch::Receiver<bool>,
) {
    let conns = state.conns.clone();
    let mut accept_warn = conns::WarnGate::default();
    while let Some((stream, peer)) = next_conn(&listener, &mut shutdown, &mut accept_warn).await {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
        let mut first = true;
        let slot = loop {
            if let Some(slot) = conns.admit(peer.ip(), fd, first) {
                break slot;
            }
            first = false;
            tokio::select! {
                _ = conns.wait_freed() => {}
                _ = shutdown.changed() => return,
            }
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let shutdown = shutdown.clone();
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let handle_slot = slot.handle();
            let header_read_timeout = state.header_read_timeout;
            let svc = service_fn(move |req| {
                let state = state.clone();
                let shutdown = shutdown.clone();
                let slot = handle_slot.clone();
                async move {
                    let busy = slot.busy();
                    Ok::<_, Infallible>(handle(&state, req, peer, shutdown, &slot, busy).await)
                }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .max_buf_size(READ_BUF_BYTES)
                .serve_connection(
                    TokioIo::new(rejections::ProblemIo::new(conns::Tracked::new(
                        stream, &slot,
                    ))),
                    svc,
                );
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                }
                // Evicted to make room (it was the longest idle), or an event stream whose
                // client stopped reading (`events.rs`): dropping it closes it.
                _ = slot.close.notified() => {
                    tracing::debug!(%peer, "connection closed: idle and needed to make room, or an event stream not read");
                }
                // The server stops: an idle keep-alive connection closes now, a request in
                // progress is answered first. Otherwise a client's idle connection would keep
                // the engine (and the data directory) open after shutdown.
                _ = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(CLOSE_GRACE, conn).await;
                }
            }
            drop(slot);
        });
    }
}

/// The next connection, or `None` once `shutdown` turns true. A failed accept is logged
/// through `warn` (at most once per 10 s: out of descriptors, it fails every 50 ms).
async fn next_conn(
    listener: &TcpListener,
    shutdown: &mut watch::Receiver<bool>,
    warn: &mut conns::WarnGate,
) -> Option<(tokio::net::TcpStream, std::net::SocketAddr)> {
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => return Some(x),
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly, keep serving.
                    if let Some(suppressed) = warn.pass(std::time::Instant::now()) {
                        tracing::warn!(error = %e, suppressed,
                            "accept failed (suppressed: like warnings since the last one)");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => return None,
        }
    }
}

/// Resolves once the server stops (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        let now = *stop.borrow_and_update();
        if now || stop.changed().await.is_err() {
            return;
        }
    }
}

async fn handle(
    state: &Arc<ApiState>,
    req: Request<Incoming>,
    _peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
    slot: &conns::SlotHandle,
    busy: conns::Busy,
) -> Response<events::Body> {
    let started = std::time::Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    // A request on a reserve connection (the cap was full) waits for a slot, or is a 503.
    let admitted = match check_head(&req) {
        Ok(()) => slot.admit_request(&path).await,
        e => e,
    };
    // The event stream is the one answer that is not a single buffer.
    let resp = match admitted {
        Err(p) => Err(p),
        Ok(()) if path.trim_end_matches('/') == "/v1/events" => {
            events::handle(state, &req, shutdown, slot)
        }
        Ok(()) if path.trim_end_matches('/') == "/v1/export" => export::handle(state, &req, busy),
        Ok(()) if matches!(method, Method::GET | Method::HEAD) => {
            route(state, req).await.map(|r| r.map(BodyExt::boxed))
        }
        Ok(()) => changing(state, req, busy)
            .await
            .map(|r| r.map(BodyExt::boxed)),
    };
    let resp = resp.unwrap_or_else(|p| p.into_response().map(BodyExt::boxed));
    state
        .metrics
        .observe(&path, &method, resp.status().as_u16(), started.elapsed());
    tracing::debug!(%method, path = %crate::logsafe::Escaped(&path), status = resp.status().as_u16(), "request");
    resp
}

/// A request that may change something runs to its end whether or not anyone waits for the
/// answer: hyper drops a request's future when its client hangs up (no half-close), and a
/// create or a command dropped after its write went to the store left memory behind the
/// store: a task durable but never armed, a cell a retry of the same create then took for a
/// create in progress (nemesis seed 2912089: the client's retry got 409 for a task not stored
/// yet, and it never fired on that node). See [`finish::Finish`]. The request's mark on its
/// connection (`busy`) goes with it, so its slot stays taken to its end and requests whose
/// clients left count against the connection cap (`conns`) too.
async fn changing(
    state: &Arc<ApiState>,
    req: Request<Incoming>,
    busy: conns::Busy,
) -> Result<Resp, Problem> {
    let state = state.clone();
    finish::Finish::new(async move {
        let _busy = busy;
        route(&state, req).await
    })
    .await
}

/// 414 and 431 as problem documents, for what fits hyper's buffer but is more than herald
/// reads.
fn check_head(req: &Request<Incoming>) -> Result<(), Problem> {
    let target = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    if target > URI_BYTES_MAX {
        let mut p = Problem::new(
            StatusCode::URI_TOO_LONG,
            "uri-too-long",
            "URI too long",
            format!("the request target is {target} bytes; at most {URI_BYTES_MAX}"),
        );
        p.close = true;
        return Err(p);
    }
    let head: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if head > HEAD_BYTES_MAX {
        let mut p = Problem::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers-too-large",
            "Request header fields too large",
            format!("the request headers are {head} bytes; at most {HEAD_BYTES_MAX}"),
        );
        p.close = true;
        return Err(p);
    }
    Ok(())
}

/// `v` as the JSON body. Serialized straight to bytes (`Value`'s `Display` goes through
/// `fmt::Write`, several times slower); serializing a `Value` or a derived view cannot fail.
fn json_response<T: serde::Serialize + ?Sized>(status: StatusCode, v: &T) -> Resp {
    let body = serde_json::to_vec(v).unwrap_or_else(|_| b"null".to_vec());
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn method_not_allowed(allow: &'static str) -> Problem {
    let mut p = Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "Method not allowed",
        format!("allowed: {allow}"),
    );
    p.allow = Some(allow);
    p
}

async fn route(state: &ApiState, req: Request<Incoming>) -> Result<Resp, Problem> {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    match segs.as_slice() {
        ["healthz"] => healthz(state, &req),
        ["metrics"] => metrics_page(state, &req).await,
        _ => match dashboard::asset(&path) {
            Some(_) if req.method() != Method::GET => Err(method_not_allowed("GET")),
            Some(page) => Ok(page),
            None => match segs.split_first() {
                Some((&"v1", rest)) => v1(state, req, rest, &path).await,
                _ => Err(Problem::not_found(format!("no route for {path}"))),
            },
        },
    }
}

/// `GET /healthz`: ready, draining, failing storage or still recovering (no authorization).
fn healthz(state: &ApiState, req: &Request<Incoming>) -> Result<Resp, Problem> {
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return Err(method_not_allowed("GET, HEAD"));
    }
    let (status, mut body) = if state.engine.is_draining() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "draining", "in_flight": state.engine.sends_in_flight()}),
        )
    } else if let Some(e) = state.engine.storage_failing() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "storage_failing", "reason": format!("storage: {e}")}),
        )
    } else if state.engine.is_ready() {
        (StatusCode::OK, json!({"status": "ok"}))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "recovering"}),
        )
    };
    // Cluster mode (HA.md "Config"): which node this is and what it holds.
    if let (Some(c), Some(obj)) = (state.engine.cluster(), body.as_object_mut()) {
        obj.insert(
            "cluster".into(),
            json!({
                "node_id": c.node_id,
                "shards_owned": c.ownership.count(),
                "shards": c.shards,
                "clock_offset_ms": c.ownership.clock_offset_ms(),
                "refusing_shards": c.ownership.clock_refusal(c.max_clock_offset_ms),
            }),
        );
    }
    Ok(json_response(status, &body))
}

/// `GET /v1/cluster` (API.md "Cluster mode", HA.md "Config"): S, every shard's epoch, and the
/// nodes with the shards each owns now, its last heartbeat and clock offset; beside the
/// contract's fields, this node's own counts and per shard its owner and lease expiry
/// (`leases`), as this node's lease loop last read them (`read_at`: at most one `renew` old).
fn cluster_view(state: &ApiState) -> Result<Resp, Problem> {
    let Some(c) = state.engine.cluster() else {
        return Err(Problem::not_found(
            "herald is not in cluster mode (no [cluster] section in its config)",
        ));
    };
    let v = c.ownership.view();
    let utc = |ms: Option<i64>| {
        ms.and_then(|ms| u64::try_from(ms).ok())
            .map(crate::schedule::format_utc)
    };
    let leases: Vec<_> = v
        .shards
        .iter()
        .map(|s| {
            json!({"shard": s.shard, "epoch": s.epoch, "owner_node": s.owner_node,
                   "lease_expires": utc(s.lease_expires_ms), "free": s.takeable})
        })
        .collect();
    let epochs: serde_json::Map<String, Value> = v
        .shards
        .iter()
        .map(|s| (s.shard.to_string(), json!(s.epoch)))
        .collect();
    let nodes: Vec<_> = v
        .nodes
        .iter()
        .map(|n| {
            // Owned now: not takeable, and held by this very process (incarnation).
            let mut owns: Vec<u32> = v
                .shards
                .iter()
                .filter(|s| !s.takeable && s.owner_incarnation.as_deref() == Some(&n.incarnation))
                .map(|s| s.shard)
                .collect();
            owns.sort_unstable();
            json!({"node_id": n.node_id, "incarnation": n.incarnation,
                   "advertise": n.advertise, "shards": owns,
                   "heartbeat_at": utc(n.heartbeat_at_ms),
                   "clock_offset_ms": n.clock_offset_ms,
                   "live": n.live, "shards_owned": owns.len()})
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "shards": c.shards,
            "nodes": nodes,
            "epochs": epochs,
            "node_id": c.node_id,
            "shards_total": c.shards,
            "shards_owned": c.ownership.count(),
            "clock_offset_ms": c.ownership.clock_offset_ms(),
            "read_at": v.read_at_ms.map(crate::schedule::format_utc),
            "leases": leases,
        }),
    ))
}

/// `GET /metrics` in the Prometheus text format.
async fn metrics_page(state: &ApiState, req: &Request<Incoming>) -> Result<Resp, Problem> {
    authorize(state, req)?;
    if req.method() != Method::GET {
        return Err(method_not_allowed("GET"));
    }
    let mut r = Response::new(Full::new(Bytes::from(metrics::render(state).await?)));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(metrics::CONTENT_TYPE),
    );
    Ok(r)
}

/// The `/v1/...` routes (`rest`: the segments after `v1`).
#[allow(
    clippy::too_many_lines,
    reason = "the route table of API.md: one arm per path, each a method match and a call"
)]
async fn v1(
    state: &ApiState,
    req: Request<Incoming>,
    rest: &[&str],
    path: &str,
) -> Result<Resp, Problem> {
    authorize(state, &req)?;
    ready(state)?;
    // The language of texts for people in task views and previews.
    let lang = lang::wanted(&req)?;
    let m = req.method().clone();
    if state.engine.is_draining()
        && !matches!(m, Method::GET | Method::HEAD)
        && rest != ["schedules", "preview"]
    {
        // Nothing new is accepted once herald drains: a write now could arm a send that
        // would only start after the restart anyway, and the client should go to the next
        // instance. Reads keep working until the process exits.
        return Err(Problem::unavailable(
            "herald is shutting down (draining its sends); nothing was changed. Try again shortly",
        )
        .kind("draining", "Shutting down"));
    }
    // Cluster mode: a command for another node's task is that node's to carry out.
    if let Some(task) = forward::target(&m, rest) {
        if !state.engine.owns(&task) {
            return forward::forward(state, req, &task).await;
        }
    }
    match rest {
        ["tasks"] => match m {
            Method::POST => create_task(state, req, lang).await,
            Method::GET => list_tasks(state, &req, lang).await,
            _ => Err(method_not_allowed("GET, POST")),
        },
        ["tasks", id] => {
            let id = path_id(id)?;
            match m {
                Method::GET => get_task(state, &id, lang).await,
                Method::DELETE => delete_task(state, &req, &id, lang).await,
                Method::PATCH => patch_task(state, &id, req, lang).await,
                _ => Err(method_not_allowed("GET, PATCH, DELETE")),
            }
        }
        ["tasks", id, action @ ("cancel" | "pause" | "resume" | "trigger")] => {
            let id = path_id(id)?;
            if m != Method::POST {
                return Err(method_not_allowed("POST"));
            }
            control(state, &req, &id, action, lang).await
        }
        ["tasks", id, "backfill"] => {
            let id = path_id(id)?;
            match m {
                Method::POST => backfill::handle(state, &id, req).await,
                _ => Err(method_not_allowed("POST")),
            }
        }
        ["tasks", id, "runs"] => {
            let id = path_id(id)?;
            match m {
                Method::GET => runs::handle(state, &id, &req).await,
                _ => Err(method_not_allowed("GET")),
            }
        }
        ["tasks", id, "timeline"] => {
            let id = path_id(id)?;
            match m {
                Method::GET => timeline::handle(state, &id, &req).await,
                _ => Err(method_not_allowed("GET")),
            }
        }
        ["failures"] => match m {
            Method::GET => list_failures(state, &req).await,
            _ => Err(method_not_allowed("GET")),
        },
        ["failures", id] => {
            let id = failure_path_id(id)?;
            match m {
                Method::DELETE => {
                    let f = state.engine.dismiss_failure(&id).await?;
                    Ok(json_response(StatusCode::OK, &views::failure(&f)))
                }
                _ => Err(method_not_allowed("DELETE")),
            }
        }
        ["failures", id, "retry"] => {
            let id = failure_path_id(id)?;
            match m {
                Method::POST => {
                    let f = state.engine.retry_failure(&id).await?;
                    Ok(json_response(StatusCode::ACCEPTED, &views::failure(&f)))
                }
                _ => Err(method_not_allowed("POST")),
            }
        }
        ["schedules", "preview"] => match m {
            Method::POST => preview::handle(state, req, lang).await,
            _ => Err(method_not_allowed("POST")),
        },
        ["openapi.json"] => match m {
            Method::GET => Ok(openapi()),
            _ => Err(method_not_allowed("GET")),
        },
        ["cluster"] => match m {
            Method::GET => cluster_view(state),
            _ => Err(method_not_allowed("GET")),
        },
        ["channels"] => match m {
            Method::GET => Ok(channels(state)),
            _ => Err(method_not_allowed("GET")),
        },
        _ => Err(Problem::not_found(format!("no route for {path}"))),
    }
}

/// `POST /v1/tasks/{id}/{cancel,pause,resume,trigger}`, with its request span.
async fn control(
    state: &ApiState,
    req: &Request<Incoming>,
    id: &str,
    action: &str,
    lang: Option<Lang>,
) -> Result<Resp, Problem> {
    let caller = caller_trace(req);
    let started = crate::trace::otlp::now_unix_ns();
    let e = &state.engine;
    let (v, name) = match action {
        "cancel" => (e.cancel(id).await?, "POST /v1/tasks/{id}/cancel"),
        "pause" => (e.pause(id).await?, "POST /v1/tasks/{id}/pause"),
        "resume" => (e.resume(id).await?, "POST /v1/tasks/{id}/resume"),
        _ => (e.trigger(id).await?, "POST /v1/tasks/{id}/trigger"),
    };
    request_span(state, caller.as_ref(), &v.task, name, started, 200);
    Ok(json_response(StatusCode::OK, &task_json(state, &v, lang)))
}

/// `GET /v1/openapi.json`: the contract this build serves.
fn openapi() -> Resp {
    let mut r = Response::new(Full::new(Bytes::from_static(OPENAPI.as_bytes())));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// `GET /v1/channels`: every channel's state and the alert counts.
fn channels(state: &ApiState) -> Resp {
    let now = state.engine.now_ms();
    let list: Vec<Value> = state
        .engine
        .channels()
        .iter()
        .map(|c| views::channel(c, now))
        .collect();
    let (raised, failed) = state.engine.alert_counts();
    json_response(
        StatusCode::OK,
        &json!({"channels": list, "alerts": {"raised": raised, "delivery_failed": failed}}),
    )
}

/// 503 until recovery is done.
fn ready(state: &ApiState) -> Result<(), Problem> {
    if state.engine.is_ready() {
        return Ok(());
    }
    Err(Problem::recovering())
}

fn authorize(state: &ApiState, req: &Request<Incoming>) -> Result<(), Problem> {
    let Some(token) = &state.token else {
        // Loopback trust is the local user's, not every web page's (`origin.rs`).
        return origin::check(req.headers());
    };
    // The scheme is case-insensitive (RFC 9110 §11.1), spaces around the token do not count.
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    // Compare digests so the time taken does not depend on how many leading bytes match.
    let ok =
        given.is_some_and(|g| Sha256::digest(g.as_bytes()) == Sha256::digest(token.as_bytes()));
    if ok {
        Ok(())
    } else {
        let mut p = Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            "missing or wrong bearer token",
        )
        .with_field("Authorization");
        p.bearer_challenge = true;
        Err(p)
    }
}

fn channel_retry(state: &ApiState, channel: &str) -> RetryPolicy {
    state
        .engine
        .channels()
        .get(channel)
        .map(|c| c.retry)
        .unwrap_or_default()
}

fn task_json<'a>(state: &ApiState, v: &'a TaskView, lang: Option<Lang>) -> views::TaskDoc<'a> {
    views::task_doc(
        v,
        channel_retry(state, &v.task.channel),
        state.engine.now_ms(),
        lang,
    )
}

async fn create_task(
    state: &ApiState,
    req: Request<Incoming>,
    lang: Option<Lang>,
) -> Result<Resp, Problem> {
    let key = match req.headers().get("idempotency-key") {
        Some(v) => {
            let k = v
                .to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= IDEMPOTENCY_KEY_BYTES_MAX)
                .ok_or_else(|| {
                    Problem::bad_request(format!(
                        "Idempotency-Key: must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} visible ASCII characters"
                    ))
                    .with_field("Idempotency-Key")
                })?;
            Some(k.to_string())
        }
        None => None,
    };
    let caller = caller_trace(&req);
    let minimal = prefers_minimal(&req);
    let started = crate::trace::otlp::now_unix_ns();
    let body = read_body(state, req).await?;
    let idem = key.map(|k| (k, Sha256::digest(&body).into()));
    let mut task_req: TaskRequest = match parse_json(&body) {
        Ok(r) => r,
        // The key is looked at before the body is judged (docs/API.md): a used key answers
        // as it would for a body that parses (409 for another body), a free one leaves the
        // body's error. Only a failed parse pays for the lookup.
        Err(p) => match state.engine.replay_key(idem.as_ref()).await? {
            Some(replayed) => {
                return Ok(created_response(
                    state, &replayed, caller, started, minimal, lang,
                ))
            }
            None => return Err(p),
        },
    };
    // The caller's trace, or a new one (API.md "Trace and timeline").
    task_req.trace_id = Some(
        caller
            .as_ref()
            .map_or_else(crate::trace::new_trace_id, |c| c.trace_id),
    );
    let created = state.engine.create(task_req, idem).await?;
    Ok(created_response(
        state, &created, caller, started, minimal, lang,
    ))
}

/// The answer to a create: 201 with `Location` for a new task, 200 for a replayed key; the
/// task view, or only its id for `Prefer: return=minimal`.
fn created_response(
    state: &ApiState,
    created: &Created,
    caller: Option<crate::trace::TraceContext>,
    started: u64,
    minimal: bool,
    lang: Option<Lang>,
) -> Resp {
    let (Created::New(v) | Created::Replayed(v)) = created;
    let status = if matches!(created, Created::New(_)) {
        201
    } else {
        200
    };
    request_span(
        state,
        caller.as_ref(),
        &v.task,
        "POST /v1/tasks",
        started,
        status,
    );
    let code = if status == 201 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut r = if minimal {
        // RFC 7240: the client asked for the acknowledgement only, not the task view.
        let mut r = json_response(code, &MinimalDoc { id: &v.task.id });
        r.headers_mut().insert(
            PREFERENCE_APPLIED,
            hyper::header::HeaderValue::from_static("return=minimal"),
        );
        r
    } else {
        json_response(code, &task_json(state, v, lang))
    };
    if code == StatusCode::CREATED {
        if let Ok(loc) = hyper::header::HeaderValue::from_str(&format!("/v1/tasks/{}", v.task.id)) {
            r.headers_mut().insert(hyper::header::LOCATION, loc);
        }
    }
    r
}

const PREFERENCE_APPLIED: hyper::header::HeaderName =
    hyper::header::HeaderName::from_static("preference-applied");

/// The body of a create answered with `Prefer: return=minimal`.
#[derive(serde::Serialize)]
struct MinimalDoc<'a> {
    id: &'a str,
}

/// Whether the request's `Prefer` headers (RFC 7240: comma-separated preferences, names and
/// the token compared without case) ask for `return=minimal`.
fn prefers_minimal(req: &Request<Incoming>) -> bool {
    req.headers()
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| {
            let p = p.split(';').next().unwrap_or("").trim();
            p.split_once('=').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("return")
                    && v.trim().trim_matches('"').eq_ignore_ascii_case("minimal")
            })
        })
}

/// Store reads of API requests on the blocking pool at once ([`off_workers`]).
const READS_MAX: usize = 64;

/// What [`off_workers`] reads hold: one place each, kept until the read ends, even if its
/// client hung up meanwhile (hyper drops the request's future, not the blocking read).
static READS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(READS_MAX);

/// Runs a store read off the runtime's workers: on PostgreSQL one waits for the database, up
/// to its statement timeout, and two such reads must not hold both workers (and with them
/// `/healthz`, `/metrics` and the fires) through an outage. At most [`READS_MAX`] at once,
/// then 503 with `Retry-After`: clients that hang up and retry during an outage would
/// otherwise fill tokio's blocking pool, and the engine's own reads (`engine/offload.rs`, a
/// herd's prefetch) would queue behind them.
pub(super) async fn off_workers<T: Send + 'static, E>(
    read: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, Problem>
where
    E: Into<crate::engine::EngineError> + Send + 'static,
{
    let Ok(place) = READS.try_acquire() else {
        return Err(crate::engine::EngineError::Busy(format!(
            "{READS_MAX} reads are waiting for the store already; try again shortly"
        ))
        .into());
    };
    tokio::task::spawn_blocking(move || {
        let _place = place;
        read()
    })
    .await
    .map_err(|e| Problem::internal(format!("a read failed: {e}")))?
    .map_err(|e| Problem::from(e.into()))
}

async fn get_task(state: &ApiState, id: &str, lang: Option<Lang>) -> Result<Resp, Problem> {
    let (engine, id_owned) = (state.engine.clone(), id.to_string());
    match off_workers(move || engine.get(&id_owned)).await? {
        Some(v) => Ok(json_response(StatusCode::OK, &task_json(state, &v, lang))),
        None => Err(Problem::not_found(format!("task {id:?} does not exist"))),
    }
}

async fn list_tasks(
    state: &ApiState,
    req: &Request<Incoming>,
    lang: Option<Lang>,
) -> Result<Resp, Problem> {
    let q = query(req, &["state", "channel", "limit", "after", "lang"])?;
    let (limit, after) = page_params(&q, crate::model::id::ID_MAX_LEN)?;
    let st = match param(&q, "state") {
        // A value that is not a state is 422 naming `state`, as on the runs' listing (a
        // malformed `limit` or `after` stays 400: the request's shape).
        Some(s) if !s.is_empty() => Some(views::parse_state(s).ok_or_else(|| {
            Problem::invalid(
                "state",
                format!("unknown task state {s:?}; expected one of pending, running, paused, completed, cancelled, failed, expired"),
            )
        })?),
        _ => None,
    };
    let channel = param(&q, "channel")
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    // A listing reads the store page by page: off the runtime's workers, so no mix of reads
    // can delay fires or /healthz.
    let engine = state.engine.clone();
    let (tasks, next, skipped) =
        off_workers(move || engine.list(st, channel.as_deref(), after.as_deref(), limit)).await?;
    let list: Vec<views::TaskDoc> = tasks.iter().map(|v| task_json(state, v, lang)).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({ "tasks": list, "next": next, "unreadable": skipped }),
    ))
}

/// `DELETE /v1/tasks/{id}`: cancels an unfinished task, exactly as `POST .../cancel` (the API's
/// first meaning of DELETE; the task stays readable as `cancelled`; traced as the cancel is),
/// and deletes a finished one with its messages, runs and idempotency keys. Both answer the
/// task as it was last seen.
async fn delete_task(
    state: &ApiState,
    req: &Request<Incoming>,
    id: &str,
    lang: Option<Lang>,
) -> Result<Resp, Problem> {
    let caller = caller_trace(req);
    let started = crate::trace::otlp::now_unix_ns();
    let (engine, id_owned) = (state.engine.clone(), id.to_string());
    let finished = match off_workers(move || engine.get(&id_owned)).await? {
        Some(v) => v.task.state.is_terminal(),
        None => return Err(crate::engine::EngineError::NotFound(format!("task {id:?}")).into()),
    };
    let v = if finished {
        state.engine.delete(id).await?
    } else {
        state.engine.cancel(id).await?
    };
    request_span(
        state,
        caller.as_ref(),
        &v.task,
        "DELETE /v1/tasks/{id}",
        started,
        200,
    );
    Ok(json_response(StatusCode::OK, &task_json(state, &v, lang)))
}

async fn patch_task(
    state: &ApiState,
    id: &str,
    req: Request<Incoming>,
    lang: Option<Lang>,
) -> Result<Resp, Problem> {
    let caller = caller_trace(&req);
    let started = crate::trace::otlp::now_unix_ns();
    let body = read_body(state, req).await?;
    let patch: PatchRequest = parse_json(&body)?;
    let v = state.engine.patch(id, patch).await?;
    request_span(
        state,
        caller.as_ref(),
        &v.task,
        "PATCH /v1/tasks/{id}",
        started,
        200,
    );
    Ok(json_response(StatusCode::OK, &task_json(state, &v, lang)))
}

/// The caller's W3C trace context; a malformed `traceparent` is logged and ignored, never
/// refused (API.md).
fn caller_trace(req: &Request<Incoming>) -> Option<crate::trace::TraceContext> {
    match crate::trace::from_headers(req.headers()) {
        Ok(cx) => cx,
        Err(why) => {
            tracing::warn!(error = %why, path = %crate::logsafe::Escaped(req.uri().path()),
                "ignoring a malformed traceparent header");
            None
        }
    }
}

/// The span of a request that created or changed `task` (exported only with
/// `[telemetry] otlp_endpoint`). It is in the task's trace: a child of the caller's span when
/// the caller is in that trace, linked to it when the caller's trace is another.
fn request_span(
    state: &ApiState,
    caller: Option<&crate::trace::TraceContext>,
    task: &crate::model::Task,
    name: &'static str,
    started_ns: u64,
    status: u16,
) {
    let Some(telemetry) = state.tracing.telemetry() else {
        return;
    };
    let trace_id = views::trace_id_of(task);
    let (parent, links) = match caller {
        Some(c) if c.trace_id == trace_id => (Some(c.parent_span), vec![]),
        Some(c) => (None, vec![(c.trace_id, c.parent_span)]),
        None => (None, vec![]),
    };
    let span = crate::trace::otlp::Span {
        trace_id,
        span_id: crate::trace::new_span_id(),
        parent,
        name: name.to_string(),
        kind: crate::trace::otlp::SpanKind::Server,
        start_unix_ns: started_ns,
        end_unix_ns: crate::trace::otlp::now_unix_ns(),
        attrs: vec![],
        error: None,
        links,
    }
    .attr("herald.task.id", task.id.as_str())
    .attr("http.response.status_code", status)
    .attr("herald.task.state", task.state.as_str());
    telemetry.export(span);
}

async fn list_failures(state: &ApiState, req: &Request<Incoming>) -> Result<Resp, Problem> {
    let q = query(req, &["task", "limit", "after"])?;
    let (limit, after) = page_params(&q, FAILURE_ID_LEN_MAX)?;
    let task = match param(&q, "task") {
        Some(t) if !t.is_empty() => {
            check_id(t)
                .map_err(|e| Problem::bad_request(format!("task: {e}")).with_field("task"))?;
            Some(t.to_string())
        }
        _ => None,
    };
    let after = match (after, param(&q, "after")) {
        (Some(a), _) => Some(a),
        _ => None,
    };
    let engine = state.engine.clone();
    let (list, more) =
        off_workers(move || engine.failures(task.as_deref(), after.as_deref(), limit)).await?;
    let next = if more {
        list.last().map(|f| f.id.clone())
    } else {
        None
    };
    let items: Vec<Value> = list.iter().map(views::failure).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({ "failures": items, "next": next }),
    ))
}

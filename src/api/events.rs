//! `GET /v1/events`: the engine's live events as server-sent events (`text/event-stream`).
//!
//! Authenticated like the rest of `/v1` (a browser sends the token with a `fetch` stream, since
//! `EventSource` cannot send headers). The format, also in the OpenAPI document:
//!
//! ```text
//! event: ready                       first, once the subscription is live
//! data: {"now":"2026-12-01T01:00:00Z"}
//!
//! event: task                        a task was created or changed state / next fire
//! data: {"id":"t1","state":"running","channel":"log","next_fire_at":null,"runs":1,"updated_at":"..."}
//!
//! event: progress                    a run started, moved its cursor, or finished
//! data: {"task":"t1","task_state":"running","run":1,"state":"running","total":200,"sent":57,
//!        "failed":1,"in_flight":1,"started_at":"...","next_at":"..."}
//!
//! event: failure                     the failure list changed: added | retrying | resolved | failed | dismissed
//! data: {"id":"t1:1:4","task":"t1","run":1,"seq":4,"action":"added","attempts":4,"last_error":"..."}
//!
//! event: timeline                    an event of a task's timeline (as GET /v1/tasks/{id}/timeline shows it, with "task")
//! event: resync                      this client fell behind and missed events: re-read what it shows
//! data: {"missed":12}
//!
//! : keep-alive                       a comment every 15 s
//! ```
//!
//! Streams are capped (`conns.rs`: a quarter of `connections_max`, a quarter of that per
//! client address); one over a cap is a 503 problem with `Retry-After`.
//!
//! `?task=ID` keeps only the events of one task (`ready`, `resync` and keep-alives always come).
//! The stream ends when herald shuts down, or when its client takes nothing for
//! [`STALL_MAX`] while a frame waits for it (its connection is closed then); a client
//! reconnects and re-reads (events are not replayed).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use tokio::sync::{broadcast, mpsc, watch};

use super::conns::SlotHandle;
use super::input::{param, query};
use super::problem::Problem;
use super::ApiState;
use crate::engine::events::Event;
use crate::model::check_id;
use crate::schedule::format_utc;

/// The body type of every answer (most are one buffer; this one is a stream).
pub type Body = BoxBody<Bytes, Infallible>;

const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Frames buffered for a slow reader before the pump waits (and the bus, past its own
/// capacity, tells this client to resync).
const FRAMES_BUFFERED: usize = 64;
/// How long a frame may wait for a client that takes nothing before its stream ends and its
/// connection closes. Without a bound a client that stopped reading held its stream (never
/// evicted, `conns.rs`) until herald stopped, and a few such clients filled the stream cap: every
/// new dashboard got 503. The bound counts anew with each frame the connection takes; the
/// connection takes one only once the socket has room, which the kernel reports after a
/// good part of its send buffer has drained. So a client reading, but slower than the events
/// come (less than a third of that buffer per 30 s), is closed too: it could never catch up,
/// and it reconnects and re-reads. On a quiet server a client that stopped reading holds its
/// stream until events fill the buffers (keep-alives alone take hours). The same bound as an
/// unread answer's (`conns::STALLED_EVICT_MIN`).
pub const STALL_MAX: Duration = super::conns::STALLED_EVICT_MIN;
/// Test knob, not configuration: [`STALL_MAX`] in milliseconds (`tests/connections.rs`). Read
/// when a stream starts.
pub const STALL_ENV: &str = "HERALD_TEST_EVENTS_STALL_MS";

/// [`STALL_MAX`], or the test knob [`STALL_ENV`] when set (unset, zero or unreadable: the
/// constant).
fn stall_max() -> Duration {
    super::conns::knob_ms(STALL_ENV, STALL_MAX)
}

/// A body that yields what the pump task sends, and ends when the pump ends. (Also the body
/// of `GET /v1/export`.)
pub(super) struct EventBody {
    pub(super) rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .rx
            .poll_recv(cx)
            .map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

fn frame(kind: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// Answers `GET /v1/events`.
pub fn handle(
    state: &ApiState,
    req: &Request<Incoming>,
    shutdown: watch::Receiver<bool>,
    slot: &SlotHandle,
) -> Result<Response<Body>, Problem> {
    super::authorize(state, req)?;
    if req.method() != Method::GET {
        return Err(super::method_not_allowed("GET"));
    }
    super::ready(state)?;
    let q = query(req, &["task"])?;
    let task = match param(&q, "task") {
        Some(t) if !t.is_empty() => {
            check_id(t)
                .map_err(|e| Problem::bad_request(format!("task: {e}")).with_field("task"))?;
            Some(t.to_string())
        }
        _ => None,
    };
    // Counted against the stream caps (`conns.rs`) last, once the request is valid.
    slot.start_stream()?;
    let sub = state.engine.events().subscribe();
    let now = state.engine.now_ms();
    let (tx, rx) = mpsc::channel(FRAMES_BUFFERED);
    let out = Out {
        tx,
        slot: slot.clone(),
        stall: stall_max(),
    };
    tokio::spawn(pump(sub, out, shutdown, task, now));
    let mut r = Response::new(EventBody { rx }.boxed());
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    use hyper::header::{HeaderValue, CACHE_CONTROL, CONNECTION, CONTENT_TYPE};
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // The connection ends with the stream: an idle keep-alive must not outlive herald's stop.
    h.insert(CONNECTION, HeaderValue::from_static("close"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(r)
}

/// Where the pump's frames go: the body's channel, and the connection to close when a frame
/// waits longer than `stall` for a client that takes nothing.
struct Out {
    tx: mpsc::Sender<Bytes>,
    slot: SlotHandle,
    stall: Duration,
}

/// Moves events from the bus to one client until the client goes, stops reading
/// ([`STALL_MAX`]), or herald stops.
async fn pump(
    mut sub: broadcast::Receiver<Event>,
    out: Out,
    mut shutdown: watch::Receiver<bool>,
    task: Option<String>,
    now_ms: u64,
) {
    let mut keep_alive =
        tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE);
    let mut next = Some(Bytes::from(format!(
        "retry: 2000\n\n{}",
        String::from_utf8_lossy(&frame("ready", &json!({ "now": format_utc(now_ms) })))
    )));
    loop {
        if *shutdown.borrow() {
            return;
        }
        if let Some(bytes) = next.take() {
            tokio::select! {
                r = out.tx.send(bytes) => if r.is_err() { return },
                _ = shutdown.changed() => return,
                // Ending the body is not enough: hyper, its write to the full socket pending,
                // would not see it. The connection goes, and its slot and stream with it.
                _ = tokio::time::sleep(out.stall) => {
                    tracing::info!(stall_ms = out.stall.as_millis() as u64,
                        "event stream closed: its client took nothing while a frame waited");
                    out.slot.close();
                    return;
                }
            }
        }
        next = tokio::select! {
            r = sub.recv() => match r {
                Ok(ev) => {
                    if task.as_ref().is_some_and(|t| *t != ev.task) {
                        continue;
                    }
                    Some(frame(ev.kind, &ev.data))
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    Some(frame("resync", &json!({ "missed": n })))
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = keep_alive.tick() => Some(Bytes::from_static(b": keep-alive\n\n")),
            _ = shutdown.changed() => return,
            _ = out.tx.closed() => return,
        };
    }
}

//! `GET /v1/export`: the whole store as export lines (`backup/`), streamed while herald runs.
//! Each task is read as one consistent image, so the export can be imported and resumes as
//! the running herald would after a crash at that moment. The export runs off the runtime's
//! workers and waits for a slow client (bounded buffer); a client that goes away stops it, and
//! so does one that takes nothing for [`STALL_MAX`]. An export that fails or stops midway
//! ends without its `end` line, which `herald import` refuses.
//! At most [`EXPORTS_MAX`] run at once; one more is answered 503 with `Retry-After`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use tokio::sync::mpsc;

use super::events::{Body, EventBody};
use super::input::query;
use super::problem::Problem;
use super::ApiState;

/// Bytes gathered before a chunk goes out.
const CHUNK_BYTES: usize = 64 << 10;
/// Chunks buffered for a slow client before the export waits.
const CHUNKS_BUFFERED: usize = 16;
/// Exports under way at once. Each holds a thread of tokio's blocking pool for as long as its
/// client takes to read it (it waits in `blocking_send`; a client that takes nothing, up to
/// [`STALL_MAX`]): 512 clients that stopped reading held the whole pool, and every `spawn_blocking` of the engine (a send's message read
/// ahead, reads off the workers) queued behind them. One more is answered 503 with
/// `Retry-After`. Per process (one server per process; in-process tests share it).
const EXPORTS_MAX: usize = 2;

/// How long a chunk may wait for a client that takes nothing before the export gives up.
/// Without a bound a client that never reads held one of the [`EXPORTS_MAX`] places, a
/// blocking thread and (busy, so never closed to make room) its connection for good. A slow
/// reader is not cut: the limit counts anew with each chunk it takes ([`CHUNK_BYTES`]), so
/// only a client that takes less than a chunk in that time is.
const STALL_MAX: Duration = Duration::from_secs(60);
/// Test knob, not configuration: [`STALL_MAX`] in milliseconds (`tests/connections.rs`).
/// Read when an export starts.
pub const STALL_ENV: &str = "HERALD_TEST_EXPORT_STALL_MS";

static EXPORTS: AtomicUsize = AtomicUsize::new(0);

/// [`STALL_MAX`], or the test knob [`STALL_ENV`] when set (unset, zero or unreadable: the
/// constant).
fn stall_max() -> Duration {
    super::conns::knob_ms(STALL_ENV, STALL_MAX)
}

/// One of the [`EXPORTS_MAX`] places, given back when the export ends.
struct ExportSlot;

impl ExportSlot {
    fn take() -> Option<ExportSlot> {
        EXPORTS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < EXPORTS_MAX).then_some(n + 1)
            })
            .ok()
            .map(|_| ExportSlot)
    }
}

impl Drop for ExportSlot {
    fn drop(&mut self) {
        EXPORTS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `busy` (the request's mark on its connection) stays with the export until its last chunk
/// is handed over: a connection whose export is slow to read the store is not silent, and is
/// never closed to make room (`conns`). An export whose client takes nothing for
/// [`STALL_MAX`] gives up (`hand_over`): it lets go of its place, its thread and `busy`, and
/// its connection is then one more answer left unread (`conns::STALLED_EVICT_MIN`).
pub fn handle(
    state: &ApiState,
    req: &Request<Incoming>,
    busy: super::conns::Busy,
) -> Result<Response<Body>, Problem> {
    super::authorize(state, req)?;
    if req.method() != Method::GET {
        return Err(super::method_not_allowed("GET"));
    }
    super::ready(state)?;
    query(req, &[])?;
    let slot = ExportSlot::take().ok_or_else(|| {
        Problem::unavailable(format!(
            "{EXPORTS_MAX} exports are under way already; try again when one has ended"
        ))
        .kind("exports-busy", "Too many exports")
    })?;
    let (tx, from_export) = mpsc::channel::<Bytes>(CHUNKS_BUFFERED);
    // The body's own channel holds one chunk: what waits for the client waits in `hand_over`,
    // where the wait is timed.
    let (to_body, rx) = mpsc::channel::<Bytes>(1);
    tokio::spawn(hand_over(from_export, to_body, busy, stall_max()));
    let engine = state.engine.clone();
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let gone = || std::io::Error::other("the client went away or stopped reading");
        let mut buf: Vec<u8> = Vec::with_capacity(CHUNK_BYTES);
        let r = crate::backup::export::export(engine.store(), engine.now_ms(), &mut |l| {
            serde_json::to_writer(&mut buf, l)?;
            buf.push(b'\n');
            if buf.len() >= CHUNK_BYTES {
                tx.blocking_send(Bytes::from(std::mem::take(&mut buf)))
                    .map_err(|_| gone())?;
            }
            Ok(())
        });
        match r {
            Ok((tasks, lines)) => {
                if !buf.is_empty() && tx.blocking_send(Bytes::from(buf)).is_err() {
                    tracing::warn!(
                        "export: the client went away or stopped reading before the end"
                    );
                    return;
                }
                tracing::info!(tasks, lines, "export streamed");
            }
            // Without its end line the partial file is refused by `herald import`.
            Err(e) => tracing::error!(error = %e, "export stopped"),
        }
    });
    let mut r = Response::new(EventBody { rx }.boxed());
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/jsonl"),
    );
    Ok(r)
}

/// Hands the export's chunks to the response body, each within `stall`. A client that takes
/// nothing for that long, or goes away, ends it: `from` is dropped, so the export's next send
/// fails and its thread ends (with its place); the body ends without the `end` line. Holds
/// the connection's `busy` mark until then.
async fn hand_over(
    mut from: mpsc::Receiver<Bytes>,
    to: mpsc::Sender<Bytes>,
    busy: super::conns::Busy,
    stall: Duration,
) {
    let _busy = busy;
    while let Some(chunk) = from.recv().await {
        match tokio::time::timeout(stall, to.send(chunk)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return, // the client went away: the export says so
            Err(_) => {
                tracing::warn!(
                    stall_s = stall.as_secs_f64(),
                    "export: the client took nothing for the stall limit; the export stops unfinished"
                );
                return;
            }
        }
    }
}

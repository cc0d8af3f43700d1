//! `GET /v1/export`: the whole store as export lines (`backup/`), streamed while herald runs.
//! Each task is read as one consistent image, so the export can be imported and resumes as
//! the running herald would after a crash at that moment. The export runs off the runtime's
//! workers and waits for a slow client (bounded buffer); a client that goes away stops it.
//! An export that fails midway ends without its `end` line, which `herald import` refuses.
//! At most [`EXPORTS_MAX`] run at once; one more is answered 503 with `Retry-After`.

use std::sync::atomic::{AtomicUsize, Ordering};

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
/// client takes to read it (it waits in `blocking_send`): 512 clients that stopped reading
/// held the whole pool, and every `spawn_blocking` of the engine (a send's message read
/// ahead, reads off the workers) queued behind them. One more is answered 503 with
/// `Retry-After`. Per process (one server per process; in-process tests share it).
const EXPORTS_MAX: usize = 2;

static EXPORTS: AtomicUsize = AtomicUsize::new(0);

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
/// never closed to make room (`conns`).
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
    let (tx, rx) = mpsc::channel::<Bytes>(CHUNKS_BUFFERED);
    let engine = state.engine.clone();
    tokio::task::spawn_blocking(move || {
        let _busy = busy;
        let _slot = slot;
        let gone = || std::io::Error::other("the client went away");
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
                    tracing::warn!("export: the client went away before the end");
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

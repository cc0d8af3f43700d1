//! `GET /v1/export`: the whole store as export lines (`backup/`), streamed while herald runs.
//! Each task is read as one consistent image, so the export can be imported and resumes as
//! the running herald would after a crash at that moment. The export runs off the runtime's
//! workers and waits for a slow client (bounded buffer); a client that goes away stops it.
//! An export that fails midway ends without its `end` line, which `herald import` refuses.

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
    let (tx, rx) = mpsc::channel::<Bytes>(CHUNKS_BUFFERED);
    let engine = state.engine.clone();
    tokio::task::spawn_blocking(move || {
        let _busy = busy;
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

//! Cluster mode: a command for a task whose shard another node holds is forwarded to that
//! node (HA.md "Creates and commands on any node"), so the owner does the fenced write under
//! the task's lock and a cancel stays race-free across nodes. Reads and listings are answered
//! by any node from the database; creates go through the inbox (`store/pg/fence.rs`).
//!
//! The owner's address is the one it advertises (`[cluster] advertise`), as the lease loop
//! last read it. A forwarded request carries `herald-forwarded`; a node that gets one for a
//! shard it does not hold either (the shard moved meanwhile) answers 503 instead of passing
//! it on, so a request never goes round in circles. Unknown owner, none advertised, or an
//! owner that does not answer: 503 with `Retry-After` — the client tries again and by then
//! the shard has its new owner.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use super::{input::read_body, ApiState, Problem, Resp};
use crate::store::backend::TreeId;
use crate::store::pg::shard::task_id_of;

/// The header a forwarded request carries: the node it came through.
pub const FORWARDED: &str = "herald-forwarded";
/// Longest a forwarded request waits for the owner's answer.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// The task a request changes, for the routes that act on one task (`None`: not one of those:
/// answered here).
pub fn target(m: &Method, rest: &[&str]) -> Option<String> {
    let decode = |raw: &str| super::input::path_id(raw).ok();
    match (m, rest) {
        (&Method::DELETE | &Method::PATCH, ["tasks", id]) => decode(id),
        (&Method::POST, ["tasks", id, "cancel" | "pause" | "resume" | "trigger" | "backfill"]) => {
            decode(id)
        }
        (&Method::DELETE, ["failures", id]) | (&Method::POST, ["failures", id, "retry"]) => {
            let f = super::input::failure_path_id(id).ok()?;
            let task = task_id_of(TreeId::Failures, f.as_bytes(), None);
            Some(String::from_utf8_lossy(&task).into_owned())
        }
        _ => None,
    }
}

fn client() -> &'static Client<HttpConnector, Full<Bytes>> {
    static C: OnceLock<Client<HttpConnector, Full<Bytes>>> = OnceLock::new();
    C.get_or_init(|| {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(Duration::from_secs(2)));
        Client::builder(TokioExecutor::new()).build(http)
    })
}

fn unavailable(detail: String) -> Problem {
    Problem::unavailable(detail).kind("not_owner", "Not this node's task")
}

/// Forwards `req` to the node holding `task`'s shard and answers what it answered.
pub async fn forward(
    state: &ApiState,
    req: Request<Incoming>,
    task: &str,
) -> Result<Resp, Problem> {
    let Some(c) = state.engine.cluster() else {
        return Err(Problem::internal("forwarding outside cluster mode"));
    };
    let shard = crate::store::pg::fence::shard_of_task(task, c.shards);
    if req.headers().contains_key(FORWARDED) {
        return Err(unavailable(format!(
            "task {task:?} is in shard {shard}, which this node does not hold either (it moved); try again shortly"
        )));
    }
    let Some(owner) = c.ownership.owner_address(shard) else {
        return Err(unavailable(format!(
            "task {task:?} is in shard {shard}, which no reachable node holds right now (a takeover is under way); try again shortly"
        )));
    };
    let (parts, body) = req.into_parts();
    let body = read_body(state, Request::from_parts(parts.clone(), body)).await?;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri = format!("{}{path}", owner.trim_end_matches('/'));
    let mut out = Request::builder().method(parts.method.clone()).uri(&uri);
    // Not `origin`: this node has checked it (`api/origin.rs`), and it names this node, which
    // the owner would take for another origin.
    for (k, v) in &parts.headers {
        if !matches!(
            k.as_str(),
            "host" | "origin" | "connection" | "content-length" | "transfer-encoding"
        ) {
            out = out.header(k, v);
        }
    }
    let out = out
        .header(FORWARDED, c.node_id.as_str())
        .body(Full::new(body))
        .map_err(|e| Problem::internal(format!("cannot forward to {uri}: {e}")))?;
    let answer = tokio::time::timeout(FORWARD_TIMEOUT, client().request(out)).await;
    let resp = match answer {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return Err(unavailable(format!(
                "the node holding shard {shard} ({owner}) cannot be reached: {e}; try again shortly"
            )))
        }
        Err(_) => {
            return Err(unavailable(format!(
                "the node holding shard {shard} ({owner}) did not answer within {} s; the command may or may not have been applied",
                FORWARD_TIMEOUT.as_secs()
            )))
        }
    };
    let (rp, rb) = resp.into_parts();
    let bytes = tokio::time::timeout(FORWARD_TIMEOUT, rb.collect())
        .await
        .map_err(|_| unavailable(format!("the answer of {owner} did not arrive in time")))?
        .map_err(|e| unavailable(format!("the answer of {owner} was cut off: {e}")))?
        .to_bytes();
    let mut r = Response::new(Full::new(bytes));
    *r.status_mut() = rp.status;
    for (k, v) in &rp.headers {
        if !matches!(
            k.as_str(),
            "connection" | "content-length" | "transfer-encoding"
        ) {
            r.headers_mut().append(k, v.clone());
        }
    }
    Ok(r)
}

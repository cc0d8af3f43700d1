//! Cluster mode: a command for a task whose shard another node holds is forwarded to that
//! node (HA.md "Creates and commands on any node"), so the owner does the fenced write under
//! the task's lock and a cancel stays race-free across nodes. Reads and listings are answered
//! by any node from the database; creates go through the inbox (`store/pg/fence.rs`).
//!
//! The owner's address is the one it advertises (`[cluster] advertise`, `http://` or
//! `https://`: the webhooks' TLS client, webpki roots), as the lease loop last read it. A
//! forwarded request carries `herald-forwarded`; a node that gets one for a shard it does not
//! hold either (the shard moved meanwhile) answers 503 instead of passing it on, so a request
//! never goes round in circles.
//!
//! What the client is told depends on whether the command can have reached the owner:
//! - nothing sent (unknown owner, none advertised, no connection to it, too many forwards
//!   under way here): 503 with `Retry-After` — the client tries again, and by then the shard
//!   has its new owner;
//! - sent, but no answer came (the owner died or closed the connection after the request was
//!   written, or did not answer within the lease): 502 or 504 with no `Retry-After`, saying
//!   the command may or may not have been applied. A trigger retried blindly would run twice.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use super::{input::read_body, ApiState, Problem, Resp};
use crate::store::backend::TreeId;
use crate::store::pg::shard::task_id_of;

/// The header a forwarded request carries: the node it came through.
pub const FORWARDED: &str = "herald-forwarded";
/// Forwards under way at once on this node, at most: each holds a connection to an owner
/// (kept back from HTTP clients in cluster mode: `fdlimit::reserve`). Beyond, a forward waits
/// up to [`FORWARD_SLOT_WAIT`] for one to end, then is answered 503 with `Retry-After`.
pub const FORWARDS_MAX: usize = 64;
/// How long a forward waits for one of the [`FORWARDS_MAX`] slots.
const FORWARD_SLOT_WAIT: Duration = Duration::from_secs(1);
/// Idle connections kept per owner, for the next forwards to it. With [`FORWARDS_MAX`] in
/// use and this many idle per other node, a cluster of up to 17 nodes holds at most
/// 2 × [`FORWARDS_MAX`] descriptors for forwarding (what `fdlimit::reserve` keeps back).
const IDLE_PER_OWNER: usize = 4;
/// How long an idle connection to an owner is kept, at most: a third of the owner's default
/// `header_read_timeout` (30 s), after which hyper's server closes a keep-alive connection
/// that has sat idle (its timer starts as it waits for the next request head). At 30 s, the
/// same, a forward written on a pooled connection just as the owner closed it found no answer
/// (`IncompleteMessage`, not `is_connect`), and its client got a false 502 "may or may not
/// have been applied". hyper-util's client (`retry_canceled_requests`, on by default, left
/// on) retries on a fresh connection only a request none of which was written (a pooled
/// connection already seen closed is never handed out); one written into a connection the
/// owner is closing is not, and cannot be. So the pool lets connections go well before the
/// owner would. Not covered: an owner whose connection table is full evicts a connection
/// quiet for 1 s (`api/conns.rs`), whatever this is; a forward that meets that is a 502.
const IDLE_FOR: Duration = Duration::from_millis(crate::config::DEFAULT_HEADER_READ_TIMEOUT_MS / 3);
const _: () =
    assert!(IDLE_FOR.as_millis() * 2 < crate::config::DEFAULT_HEADER_READ_TIMEOUT_MS as u128);

/// How long the pool keeps an idle connection to an owner, given this node's
/// `header_read_timeout` (the nodes of a cluster normally share their configuration, so it
/// stands for the owner's): [`IDLE_FOR`], or a third of a shorter one. Pure.
fn idle_for(header_read_timeout: Duration) -> Duration {
    IDLE_FOR.min(header_read_timeout / 3)
}

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

type Forwarder = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The forwarding client: `http://` and `https://` owners (a plain `HttpConnector` refused
/// `https://` before it connected, so every forward to a node advertising it failed for good
/// with a 503 that said to try again), a capped idle pool per owner, each connection kept idle
/// for [`idle_for`] this node's `header_read_timeout` (the first call's). `Err`: no TLS
/// settings (a bug: the built-in roots and provider always make them).
fn client(header_read_timeout: Duration) -> Result<&'static Forwarder, Problem> {
    static C: OnceLock<Result<Forwarder, String>> = OnceLock::new();
    let c = C.get_or_init(|| {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(Duration::from_secs(2)));
        http.set_nodelay(true);
        http.enforce_http(false);
        let tls = crate::deliver::webhook::tls_config(&[])?;
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(IDLE_PER_OWNER)
            .pool_idle_timeout(idle_for(header_read_timeout))
            .build(connector))
    });
    c.as_ref()
        .map_err(|e| Problem::internal(format!("the forwarding client: {e}")))
}

/// The slots of [`FORWARDS_MAX`].
fn slots() -> &'static tokio::sync::Semaphore {
    static S: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(FORWARDS_MAX);
    &S
}

/// How long a forward waits for the owner's answer: the lease. An owner that has not answered
/// by then (stopped, cut off from the database) has lost its shard's lease too.
fn answer_within(c: &crate::engine::cluster::ClusterHooks) -> Duration {
    Duration::from_millis(c.ownership.timing().ttl_ms.max(1_000))
}

fn unavailable(detail: String) -> Problem {
    Problem::unavailable(detail).kind("not_owner", "Not this node's task")
}

/// The request went to the owner and no answer came back: 502 (the connection closed or
/// failed) or 504 (none in time), without `Retry-After`: the command may have been applied.
fn unanswered(status: StatusCode, detail: String) -> Problem {
    Problem::new(
        status,
        "forward-unanswered",
        "Forwarded, no answer",
        format!("{detail}; the command may or may not have been applied: read the task before trying again"),
    )
}

/// An error with its sources (hyper's own says only "client error (SendRequest)").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        text.push_str(": ");
        text.push_str(&s.to_string());
        cur = s.source();
    }
    text
}

/// What the client is told when the forward failed: `is_connect` — no connection to the owner
/// was made (the request was never written: hyper-util reports a connection that failed before
/// the request as a connect error, and retries a pooled connection that closed before it was
/// written), so it may simply be tried again; anything else happened after the request was on
/// its way.
fn failed(e: &hyper_util::client::legacy::Error, shard: u32, owner: &str) -> Problem {
    if e.is_connect() {
        return unavailable(format!(
            "the node holding shard {shard} ({owner}) cannot be reached: {}; nothing was sent to it; try again shortly",
            chain(e)
        ));
    }
    unanswered(
        StatusCode::BAD_GATEWAY,
        format!(
            "the command was sent to the node holding shard {shard} ({owner}), which gave no answer: {}",
            chain(e)
        ),
    )
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
    let client = client(state.header_read_timeout)?;
    send_to_owner(c, client, out, (task, shard), &owner).await
}

/// Sends the forwarded request `out` for `task` in `shard` to `owner` in one of the
/// [`FORWARDS_MAX`] slots, and answers what it answered.
async fn send_to_owner(
    c: &crate::engine::cluster::ClusterHooks,
    client: &Forwarder,
    out: Request<Full<Bytes>>,
    (task, shard): (&str, u32),
    owner: &str,
) -> Result<Resp, Problem> {
    let within = answer_within(c);
    let Ok(Ok(_slot)) = tokio::time::timeout(FORWARD_SLOT_WAIT, slots().acquire()).await else {
        return Err(unavailable(format!(
            "task {task:?} is in shard {shard}, held by {owner}, and this node has {FORWARDS_MAX} forwards under way; nothing was sent; try again shortly"
        )));
    };
    let resp = match tokio::time::timeout(within, client.request(out)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(failed(&e, shard, owner)),
        Err(_) => {
            return Err(unanswered(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "the node holding shard {shard} ({owner}) did not answer within {} ms",
                    within.as_millis()
                ),
            ))
        }
    };
    let (rp, rb) = resp.into_parts();
    let cut = |why: String| {
        unanswered(
            StatusCode::BAD_GATEWAY,
            format!(
                "the node holding shard {shard} ({owner}) answered {}, but {why}",
                rp.status
            ),
        )
    };
    let bytes = tokio::time::timeout(within, rb.collect())
        .await
        .map_err(|_| cut("the rest of its answer did not arrive in time".into()))?
        .map_err(|e| cut(format!("its answer was cut off: {}", chain(&e))))?
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn post(uri: &str) -> Request<Full<Bytes>> {
        Request::post(uri)
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    }

    /// Reads one request's head (and its 2-byte body) from the first connection, then closes
    /// it without answering: the owner killed after its commit.
    async fn reads_and_closes(l: TcpListener) {
        let (mut s, _) = l.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(b"\r\n\r\n{}") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request arrives whole");
            got.extend_from_slice(&buf[..n]);
        }
        let _ = s.shutdown().await;
    }

    /// A request written to the owner with no answer back is not "try again": the command may
    /// have been applied (a trigger retried would run twice). Before, every failure was a 503
    /// with `Retry-After`.
    #[tokio::test]
    async fn a_forward_sent_and_never_answered_is_a_502_without_retry_after() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let owner = format!("http://{}", l.local_addr().unwrap());
        let server = tokio::spawn(reads_and_closes(l));
        let e = client(IDLE_FOR)
            .unwrap()
            .request(post(&format!("{owner}/v1/tasks/t/trigger")))
            .await
            .unwrap_err();
        server.await.unwrap();
        let p = failed(&e, 3, &owner);
        assert_eq!(p.status, StatusCode::BAD_GATEWAY, "{p:?}");
        assert_eq!(p.retry_after_s, None);
        assert!(
            p.detail.contains("may or may not have been applied"),
            "{p:?}"
        );
    }

    /// The pool lets a connection to an owner go well before the owner's server closes it
    /// idle (hyper's `header_read_timeout`): a forward written into a connection the owner is
    /// closing gets no answer, a false 502. Before, both were 30 s.
    #[test]
    fn pooled_forward_connections_go_idle_well_before_the_owner_closes_them() {
        let default = Duration::from_millis(crate::config::DEFAULT_HEADER_READ_TIMEOUT_MS);
        assert_eq!(idle_for(default), Duration::from_secs(10));
        assert!(idle_for(default) * 2 < default);
        for ms in [1, 300, 5_000, 29_999, 30_000, 120_000] {
            let close = Duration::from_millis(ms);
            assert!(idle_for(close) * 2 < close, "{ms} ms");
        }
    }

    /// No connection to the owner: nothing was sent, so the client may try again.
    #[tokio::test]
    async fn a_forward_that_never_connected_is_a_503_with_retry_after() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let owner = format!("http://{}", l.local_addr().unwrap());
        drop(l);
        let e = client(IDLE_FOR)
            .unwrap()
            .request(post(&format!("{owner}/v1/tasks/t/trigger")))
            .await
            .unwrap_err();
        let p = failed(&e, 3, &owner);
        assert_eq!(p.status, StatusCode::SERVICE_UNAVAILABLE, "{p:?}");
        assert_eq!(p.retry_after_s, Some(1));
        assert!(p.detail.contains("nothing was sent"), "{p:?}");
    }

    /// An owner advertising `https://` is spoken to over TLS. Before, the plain connector
    /// refused the scheme without connecting, and every forward to it failed for good.
    #[tokio::test]
    async fn an_https_owner_is_reached_over_tls() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let owner = format!("https://{}", l.local_addr().unwrap());
        let _req = tokio::spawn(async move {
            client(IDLE_FOR)
                .unwrap()
                .request(post(&format!("{owner}/v1/tasks/t/trigger")))
                .await
        });
        let accepted = tokio::time::timeout(Duration::from_secs(5), l.accept()).await;
        let (mut s, _) = accepted.expect("a connection to the https owner").unwrap();
        let mut first = [0u8; 1];
        s.read_exact(&mut first).await.unwrap();
        assert_eq!(
            first[0], 0x16,
            "a TLS handshake record (ClientHello) comes first"
        );
    }
}

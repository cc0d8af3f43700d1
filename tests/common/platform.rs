//! A fake messaging platform for tests: a real HTTP/1.1 server on 127.0.0.1 whose answers come
//! from a handler the test writes (following the platform's documented answers: WeCom
//! `{"errcode":0,"errmsg":"ok"}`, Telegram `{"ok":false,"error_code":429,...}`, ...). It records
//! every request (method, path, query, headers, body, JSON) like the webhook receiver, and can
//! delay an answer or trickle its body to play a slow platform.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpListener;

use super::receiver::Recorded;

/// The answer to one request.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// Wait this long before answering at all.
    pub delay: Duration,
    /// Send the head at once, then the body in this many pieces, one every `Duration`.
    pub trickle: Option<(usize, Duration)>,
}

impl Reply {
    pub fn json(status: u16, v: serde_json::Value) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: v.to_string(),
            delay: Duration::ZERO,
            trickle: None,
        }
    }

    pub fn text(status: u16, text: &str) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: text.to_string(),
            delay: Duration::ZERO,
            trickle: None,
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn delay(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }

    pub fn trickle(mut self, pieces: usize, every: Duration) -> Reply {
        self.trickle = Some((pieces.max(1), every));
        self
    }
}

type Handler = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

/// A running fake platform; it stops when dropped.
pub struct FakePlatform {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakePlatform {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakePlatform {
    pub async fn start(
        handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
    ) -> FakePlatform {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake platform: bind");
        let addr = listener.local_addr().expect("local_addr");
        let requests: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let handler: Handler = Arc::new(handler);
        let recs = requests.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            let mut conn_id = 0u64;
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                conn_id += 1;
                let (handler, recs, id) = (handler.clone(), recs.clone(), conn_id);
                conns.spawn(async move {
                    let svc = service_fn(move |req| handle(req, handler.clone(), recs.clone(), id));
                    let _ = http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        FakePlatform {
            addr,
            requests,
            task,
        }
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().clone()
    }

    /// Requests whose path is `path`.
    pub fn requests_to(&self, path: &str) -> Vec<Recorded> {
        self.requests
            .lock()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// Polls every 5 ms until `n` requests to `path` arrived or `deadline` passed; returns
    /// them either way (the caller asserts).
    pub async fn wait_for(&self, path: &str, n: usize, deadline: Duration) -> Vec<Recorded> {
        let end = Instant::now() + deadline;
        loop {
            let got = self.requests_to(path);
            if got.len() >= n || Instant::now() >= end {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn handle(
    req: Request<Incoming>,
    handler: Handler,
    recs: Arc<Mutex<Vec<Recorded>>>,
    conn: u64,
) -> Result<Response<BoxBody<Bytes, Infallible>>, std::io::Error> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    let rec = Recorded {
        at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or(0.0),
        at: Instant::now(),
        method: parts.method.as_str().to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: super::header_pairs(&parts.headers),
        json: serde_json::from_slice(&body).ok(),
        body,
        conn,
        // This server's answers are not timed; the cluster checker reads `receiver.rs`'s.
        done_ms: None,
    };
    recs.lock().push(rec.clone());
    let reply = handler(&rec);
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let body: BoxBody<Bytes, Infallible> = match reply.trickle {
        None => Full::new(Bytes::from(reply.body)).boxed(),
        Some((pieces, every)) => {
            let bytes = reply.body.into_bytes();
            let size = bytes.len().div_ceil(pieces).max(1);
            let chunks: VecDeque<Bytes> = bytes.chunks(size).map(Bytes::copy_from_slice).collect();
            Trickle {
                chunks,
                every,
                sleep: None,
            }
            .boxed()
        }
    };
    let mut resp = Response::new(body);
    *resp.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (k, v) in &reply.headers {
        if let (Ok(k), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(k.as_bytes()),
            hyper::header::HeaderValue::from_str(v),
        ) {
            resp.headers_mut().insert(k, v);
        }
    }
    Ok(resp)
}

/// A body that yields one chunk every `every` (chunked transfer encoding).
struct Trickle {
    chunks: VecDeque<Bytes>,
    every: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Body for Trickle {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.chunks.is_empty() {
            return Poll::Ready(None);
        }
        let every = self.every;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
        match sleep.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                self.sleep = None;
                Poll::Ready(self.chunks.pop_front().map(|c| Ok(Frame::data(c))))
            }
        }
    }
}

/// The query string as a map, percent-decoded (`+` is a space).
pub fn query_map(query: Option<&str>) -> BTreeMap<String, String> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// Decodes `%XX` escapes and `+`.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// HMAC-SHA256 written out from RFC 2104 on `sha2` alone (independent of the `hmac` crate herald
/// uses), to verify platform signatures.
pub fn reference_hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| k.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

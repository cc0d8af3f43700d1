//! A real local HTTP/1.1 webhook receiver for tests.
//!
//! It records every request (arrival time, method, path, headers, body) and
//! answers according to a script: per-`Idempotency-Key` plans take precedence
//! over the global plan, then the seeded fail rate, then the default behavior.
//! Each connection is served on its own task with keep-alive; the server stops
//! (accept loop and every connection) when the last `Receiver` handle drops or
//! when `shutdown()` is awaited.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::{JoinHandle, JoinSet};

/// One request that arrived, recorded once its head and body were read and
/// before the answer was produced (`done_ms` is filled in once it is).
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Arrival, Unix epoch milliseconds with sub-millisecond precision.
    pub at_ms: f64,
    /// Arrival, monotonic.
    pub at: Instant,
    pub method: String,
    /// Path without the query string.
    pub path: String,
    /// Query string (without `?`), if any.
    pub query: Option<String>,
    /// Header names lower-cased; values lossily decoded as UTF-8.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// The body parsed as JSON, if it parses.
    pub json: Option<serde_json::Value>,
    /// 1-based sequence number of the TCP connection the request came on
    /// (equal numbers = the client reused a keep-alive connection).
    pub conn: u64,
    /// When the receiver handed its answer to the connection, Unix ms (`None`: not answered
    /// yet, or never: `Hang`, `Reset`). With `at_ms`, the attempt's span on the receiver's side.
    pub done_ms: Option<f64>,
}

impl Recorded {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `Idempotency-Key` header, if present.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.header("idempotency-key")
    }
}

/// How the receiver answers one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// 200 with a small JSON body.
    Ok,
    /// That status with a small JSON body (statuses outside 200..=599 are sent as 500).
    Status(u16),
    /// That status with a `Retry-After` header carrying the value verbatim
    /// (delta-seconds or HTTP-date; an invalid header value is omitted).
    RetryAfter(u16, String),
    /// Never answer; the connection stays open until the client gives up or the receiver stops.
    Hang,
    /// Wait, then 200.
    Slow(Duration),
    /// Close the TCP connection without any response (RST via SO_LINGER 0 on Unix).
    Reset,
}

#[derive(Debug)]
struct FailRate {
    ratio: f64,
    status: u16,
    rng: u64,
}

impl FailRate {
    /// splitmix64
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Debug)]
struct State {
    requests: Vec<Recorded>,
    answers: Vec<(String, u16)>,
    default: Behavior,
    global: VecDeque<Behavior>,
    per_key: HashMap<String, VecDeque<Behavior>>,
    fail: Option<FailRate>,
    connections: u64,
    open: usize,
    /// Bumped by `clear`, so an answer to a request recorded before it is not stamped on
    /// whatever now has its index.
    generation: u64,
}

impl State {
    fn decide(&mut self, key: &str) -> Behavior {
        if let Some(b) = self.per_key.get_mut(key).and_then(VecDeque::pop_front) {
            return b;
        }
        if let Some(b) = self.global.pop_front() {
            return b;
        }
        if let Some(f) = self.fail.as_mut() {
            if f.next_unit() < f.ratio {
                return Behavior::Status(f.status);
            }
        }
        self.default.clone()
    }
}

type Shared = Arc<Mutex<State>>;

struct Handle {
    addr: SocketAddr,
    shared: Shared,
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.lock().take() {
            // Dropping the accept task drops the listener and its JoinSet,
            // which aborts every connection task.
            task.abort();
        }
    }
}

/// Handle to a running receiver. Clones share the same server; it stops when
/// the last clone is dropped.
#[derive(Clone)]
pub struct Receiver {
    inner: Arc<Handle>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

impl Receiver {
    /// Binds 127.0.0.1:0 and serves on the current tokio runtime.
    pub async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("receiver: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("receiver: local_addr");
        let shared: Shared = Arc::new(Mutex::new(State {
            requests: Vec::new(),
            answers: Vec::new(),
            default: Behavior::Ok,
            global: VecDeque::new(),
            per_key: HashMap::new(),
            fail: None,
            connections: 0,
            open: 0,
            generation: 0,
        }));
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, shared.clone(), stop_rx));
        Receiver {
            inner: Arc::new(Handle {
                addr,
                shared,
                stop,
                task: Mutex::new(Some(task)),
            }),
        }
    }

    /// `http://127.0.0.1:PORT/hook`
    pub fn url(&self) -> String {
        format!("{}/hook", self.base_url())
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Snapshot of all recorded requests in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.shared.lock().requests.clone()
    }

    pub fn count(&self) -> usize {
        self.inner.shared.lock().requests.len()
    }

    /// Number of TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.inner.shared.lock().connections
    }

    /// Number of TCP connections currently open on the server side.
    pub fn open_connections(&self) -> usize {
        self.inner.shared.lock().open
    }

    /// Polls every 5 ms until at least `n` requests arrived or `deadline`
    /// passed; returns the snapshot either way (the caller asserts).
    pub async fn wait_for(&self, n: usize, deadline: Duration) -> Vec<Recorded> {
        let end = Instant::now() + deadline;
        loop {
            {
                let st = self.inner.shared.lock();
                if st.requests.len() >= n || Instant::now() >= end {
                    return st.requests.clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Behavior for requests with no scripted answer (initially `Ok`).
    pub fn set_default(&self, b: Behavior) {
        self.inner.shared.lock().default = b;
    }

    /// Appends to the global plan: the next requests (any key) get these
    /// answers in order, then the fail rate / default applies.
    pub fn script(&self, plan: Vec<Behavior>) {
        self.inner.shared.lock().global.extend(plan);
    }

    /// Appends to the plan for requests whose `Idempotency-Key` equals
    /// `idempotency_key` (`""` = requests without the header). Takes precedence
    /// over the global plan.
    pub fn script_key(&self, idempotency_key: &str, plan: Vec<Behavior>) {
        self.inner
            .shared
            .lock()
            .per_key
            .entry(idempotency_key.to_string())
            .or_default()
            .extend(plan);
    }

    /// Each request without a scripted answer fails with `status` with
    /// probability `ratio`, deterministically from `seed` (splitmix64; one
    /// draw per unscripted request). Calling again restarts the sequence;
    /// `ratio <= 0` never fails.
    pub fn fail_rate(&self, ratio: f64, status: u16, seed: u64) {
        self.inner.shared.lock().fail = Some(FailRate {
            ratio,
            status,
            rng: seed,
        });
    }

    /// What was answered, in decision (= arrival) order:
    /// (idempotency key or "", status sent; 0 for Hang/Reset).
    pub fn answers(&self) -> Vec<(String, u16)> {
        self.inner.shared.lock().answers.clone()
    }

    /// Forgets recorded requests and answers (scripts, default and fail rate stay).
    pub fn clear(&self) {
        let mut st = self.inner.shared.lock();
        st.requests.clear();
        st.answers.clear();
        st.generation += 1;
    }

    /// Stops accepting, closes every connection (hanging ones included) and
    /// waits until that is done; afterwards connecting is refused. Recorded
    /// data stays readable. Idempotent.
    pub async fn shutdown(&self) {
        let _ = self.inner.stop.send(true);
        let task = self.inner.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Shared, mut stop: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let id = {
                        let mut st = shared.lock();
                        st.connections += 1;
                        st.open += 1;
                        st.connections
                    };
                    // The guard moves into the future, so it is released even if
                    // the task is aborted before its first poll.
                    let open = OpenGuard(shared.clone());
                    conns.spawn(serve_conn(stream, shared.clone(), id, open));
                }
                // e.g. EMFILE: back off briefly instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
        }
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    conns.shutdown().await;
}

/// Decrements the open-connection count when a connection task ends or is aborted.
struct OpenGuard(Shared);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.lock().open -= 1;
    }
}

async fn serve_conn(stream: TcpStream, shared: Shared, conn_id: u64, _open: OpenGuard) {
    let _ = stream.set_nodelay(true);
    // A duplicate of the socket fd so a `Reset` can set SO_LINGER 0 while hyper owns the stream.
    #[cfg(unix)]
    let spare = {
        use std::os::fd::AsFd;
        stream.as_fd().try_clone_to_owned().ok()
    };
    let reset = Arc::new(Notify::new());
    let svc = {
        let reset = reset.clone();
        service_fn(move |req| handle(shared.clone(), conn_id, reset.clone(), req))
    };
    let conn = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), svc);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = reset.notified() => {
            #[cfg(unix)]
            if let Some(fd) = spare {
                let sock = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
                #[allow(deprecated)]
                let _ = sock.set_linger(Some(Duration::ZERO));
                // `sock` (the duplicate) closes here; the real fd closes when
                // `conn` drops below, and with linger 0 that sends an RST.
            }
        }
    }
}

async fn handle(
    shared: Shared,
    conn_id: u64,
    reset: Arc<Notify>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Err(std::io::Error::other(e)),
    };
    let headers: Vec<(String, String)> = super::header_pairs(&parts.headers);
    let key = parts
        .headers
        .get("idempotency-key")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let json = serde_json::from_slice(&body).ok();
    let mut rec = Recorded {
        at_ms: 0.0,
        at: Instant::now(),
        method: parts.method.as_str().to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers,
        body,
        json,
        conn: conn_id,
        done_ms: None,
    };

    let (behavior, index, generation) = {
        let mut st = shared.lock();
        // Stamp under the lock so the recorded order and the timestamps agree.
        rec.at = Instant::now();
        rec.at_ms = unix_ms();
        let index = st.requests.len();
        st.requests.push(rec);
        let b = st.decide(&key);
        let sent = match &b {
            Behavior::Ok | Behavior::Slow(_) => 200,
            Behavior::Status(s) | Behavior::RetryAfter(s, _) => effective_status(*s).as_u16(),
            Behavior::Hang | Behavior::Reset => 0,
        };
        st.answers.push((key, sent));
        (b, index, st.generation)
    };

    let resp = match behavior {
        Behavior::Ok => respond(200, None),
        Behavior::Status(s) => respond(s, None),
        Behavior::RetryAfter(s, v) => respond(s, Some(&v)),
        Behavior::Slow(d) => {
            tokio::time::sleep(d).await;
            respond(200, None)
        }
        Behavior::Hang => std::future::pending().await,
        Behavior::Reset => {
            reset.notify_one();
            std::future::pending().await
        }
    };
    let mut st = shared.lock();
    if st.generation == generation {
        if let Some(r) = st.requests.get_mut(index) {
            r.done_ms = Some(unix_ms());
        }
    }
    Ok(resp)
}

fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

fn effective_status(s: u16) -> StatusCode {
    match StatusCode::from_u16(s) {
        Ok(code) if (200..=599).contains(&s) => code,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn respond(status: u16, retry_after: Option<&str>) -> Response<Full<Bytes>> {
    let code = effective_status(status);
    let body = if code == StatusCode::OK {
        serde_json::json!({ "ok": true })
    } else {
        serde_json::json!({ "status": code.as_u16() })
    };
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(v) = retry_after.and_then(|v| HeaderValue::from_str(v).ok()) {
        resp.headers_mut().insert(RETRY_AFTER, v);
    }
    resp
}

//! A TCP proxy between herald and PostgreSQL that breaks one chosen `COMMIT` (HA.md "Tests":
//! ambiguous commits without network namespaces), blackholes, or delays every byte by a set
//! time (slow renewals). Everything else passes through unchanged.
//!
//! tokio-postgres sends `COMMIT` as a simple query of its own (`Q`, length 11, `COMMIT\0`),
//! after the answers to the group's statements came back, so the proxy sees it as the start
//! of a client read and knows the group's writes already ran on the server.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// What happens to the next `COMMIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The server gets it and commits; its answer is dropped and both connections closed.
    LoseReply,
    /// As `LoseReply`, and the proxy is blackholed at that moment ([`PgProxy::blackhole`]):
    /// the read-back that would decide the COMMIT's outcome cannot reach the server.
    LoseReplyThenBlackhole,
    /// It never reaches the server; both connections are closed (the server rolls back).
    DropBeforeServer,
    /// It is held: the client's connection is closed, the server's is left open with the
    /// transaction in it (a server that has not noticed a dead client yet). [`PgProxy::release`]
    /// sends it late.
    Hold,
}

const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

#[derive(Default)]
struct State {
    armed: Mutex<Option<Fault>>,
    fired: AtomicUsize,
    held: Mutex<Vec<(TcpStream, Vec<u8>)>>,
    /// While set, bytes in either direction are held (not lost): a partition that heals.
    blackhole: AtomicBool,
    /// Every chunk read is written on this many ms after it was read (0: at once).
    delay_ms: AtomicU64,
}

/// Waits while the proxy is blackholed.
fn hold_while_blackholed(state: &State) {
    while state.blackhole.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

pub struct PgProxy {
    port: u16,
    state: Arc<State>,
}

impl PgProxy {
    /// Listens on a free loopback port and forwards to the server on `upstream`.
    pub fn start(upstream: u16) -> PgProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(State::default());
        let st = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                pipe(client, server, st.clone());
            }
        });
        PgProxy { port, state }
    }

    /// `url` (a database on the real server) through the proxy.
    pub fn url(&self, url: &str) -> String {
        let db = url.rsplit('/').next().expect("a database in the URL");
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The next `COMMIT` through the proxy meets `fault`.
    pub fn arm(&self, fault: Fault) {
        *self.state.armed.lock().unwrap() = Some(fault);
    }

    /// How many faults happened so far.
    pub fn fired(&self) -> usize {
        self.state.fired.load(Ordering::SeqCst)
    }

    /// A partition between herald and the server (`true`), or its healing (`false`): while
    /// on, nothing passes either way; what was sent meanwhile arrives after the heal, late.
    pub fn blackhole(&self, on: bool) {
        self.state.blackhole.store(on, Ordering::SeqCst);
    }

    /// From now on every byte, in either direction, is passed on `d` after the proxy read it
    /// (`Duration::ZERO`: at once again; bytes already waiting keep their time). Order is kept;
    /// a round trip through the proxy takes 2 × `d` more. A renewal sent meanwhile reaches the
    /// server late and its answer comes back later still: a slow network, not a broken one.
    pub fn delay(&self, d: Duration) {
        self.state
            .delay_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sends the held `COMMIT`s to their servers now.
    pub fn release(&self) {
        for (mut server, bytes) in self.state.held.lock().unwrap().drain(..) {
            // The server may have ended that session already: that is the point.
            let _ = server.write_all(&bytes);
        }
    }
}

/// The writing half of one direction: chunks go out in order, each no earlier than the
/// instant it was queued with (read time + the delay then set). Ends when its queue closes
/// or a write fails.
fn writer(
    mut to: TcpStream,
) -> (
    mpsc::Sender<(Instant, Vec<u8>)>,
    std::thread::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let t = std::thread::spawn(move || {
        for (due, bytes) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now); // the fault itself: the bytes are late by design
            }
            if to.write_all(&bytes).is_err() {
                return;
            }
        }
    });
    (tx, t)
}

fn due(state: &State) -> Instant {
    Instant::now() + Duration::from_millis(state.delay_ms.load(Ordering::SeqCst))
}

fn pipe(client: TcpStream, server: TcpStream, state: Arc<State>) {
    let swallow = Arc::new(AtomicBool::new(false));
    let (c2, s2) = (
        client.try_clone().expect("clone"),
        server.try_clone().expect("clone"),
    );
    let sw = swallow.clone();
    let st = state.clone();
    // Server to client: passes everything, except the answer to a `LoseReply` COMMIT.
    std::thread::spawn(move || {
        let (mut from, to) = (s2, c2);
        let (tx, out) = writer(to.try_clone().expect("clone"));
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if sw.load(Ordering::SeqCst) {
                break;
            }
            hold_while_blackholed(&st);
            if tx.send((due(&st), buf[..n].to_vec())).is_err() {
                break;
            }
        }
        // What was read before the end still goes out (late, if delayed), then both close.
        drop(tx);
        let _ = out.join();
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
    std::thread::spawn(move || {
        let (mut from, to) = (client, server);
        let (tx, out) = writer(to.try_clone().expect("clone"));
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            hold_while_blackholed(&state);
            let fault = if chunk.windows(COMMIT.len()).any(|w| w == COMMIT) {
                state.armed.lock().unwrap().take()
            } else {
                None
            };
            if fault.is_some() {
                state.fired.fetch_add(1, Ordering::SeqCst);
            }
            match fault {
                None => {
                    if tx.send((due(&state), chunk.to_vec())).is_err() {
                        break;
                    }
                }
                Some(f @ (Fault::LoseReply | Fault::LoseReplyThenBlackhole)) => {
                    swallow.store(true, Ordering::SeqCst);
                    let _ = tx.send((due(&state), chunk.to_vec()));
                    if f == Fault::LoseReplyThenBlackhole {
                        // After the COMMIT was queued for the server: only what comes
                        // later (a new connection's bytes included) is held.
                        state.blackhole.store(true, Ordering::SeqCst);
                    }
                    drop(tx);
                    let _ = out.join();
                    // The other thread closes both once the answer came.
                    return;
                }
                Some(Fault::DropBeforeServer) => break,
                Some(Fault::Hold) => {
                    let _ = from.shutdown(Shutdown::Both);
                    // What came before the COMMIT reaches the server; the COMMIT waits.
                    drop(tx);
                    let _ = out.join();
                    state.held.lock().unwrap().push((to, chunk.to_vec()));
                    return;
                }
            }
        }
        drop(tx);
        let _ = out.join();
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

/// One herald (not clustered) on its own PostgreSQL, reached through a fresh proxy so that a
/// test can slow or break its database traffic. Fields drop in order: the node, then the
/// proxy, its directory, the server.
pub struct ProxiedNode {
    pub node: super::herald::Proc,
    pub proxy: PgProxy,
    pub dir: tempfile::TempDir,
    pub pg: super::pg::PgServer,
}

impl ProxiedNode {
    /// Starts it with `config` (TOML) in database `db`; `None` where PostgreSQL cannot run
    /// (the test then returns, as `PgServer::start` says why).
    pub fn start(test: &str, db: &str, config: &str) -> Option<ProxiedNode> {
        let pg = super::pg::PgServer::start(test)?;
        let url = pg.create_db(db);
        let proxy = PgProxy::start(pg.port());
        let dir = tempfile::tempdir().unwrap();
        let config = super::herald::write_config(dir.path(), config);
        let mut cmd = super::herald::Proc::command(&config, &dir.path().join("data"));
        cmd.env("HERALD_STORE_URL", proxy.url(&url));
        let node = super::herald::Proc::start(cmd);
        Some(ProxiedNode {
            node,
            proxy,
            dir,
            pg,
        })
    }
}

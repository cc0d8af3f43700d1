//! herald's process lock on PostgreSQL: one single-node process per database, or any number of
//! cluster nodes, never both (sled refuses a second process on one directory the same way).
//!
//! Why: outside cluster mode nothing fences the writes (`fence.rs` runs only with
//! `[cluster]`), so two `herald serve` processes on one database (a restart's overlap, a
//! blue/green deploy, a forgotten `[cluster]` section) would both load every task, both send
//! it, and overwrite each other's progress.
//!
//! How: a session-level advisory lock ([`PROCESS_LOCK`]) on a connection of its own, held for
//! the process's life. A process that means to write claims it when it opens the database,
//! before any migration (`PgOptions::process_lock`: `herald serve` and `herald import`; an
//! export, which only reads, takes none): a single-node process exclusively, a cluster node
//! shared. An exclusive claim while cluster nodes hold it shared fails with
//! [`CLUSTER_SERVES`]; any claim while a single process holds it exclusively waits up to
//! [`CLAIM_WAIT`] and fails with [`SERVES`]. The session's server-side keepalives
//! ([`KEEPALIVES`]) end a dead host's session, and with it its hold, in seconds.
//!
//! Losing it: when the session ends (a server restart, the connection cut, the session
//! terminated) the lock is gone, and another process may take it. The keeper task sees the
//! connection end at once when the server closes it, and a silent loss by a ping every
//! [`PING_EVERY`] that gets no answer within the ping wait (it then drops that connection, so
//! the server ends the session and lets go of the lock if it still held it). From then until
//! the lock is taken again on a new session, [`ProcessLock::refusal`] says why: the backend
//! refuses writes up front and a commit group checks it once more just before its `COMMIT`.
//!
//! The window that remains: between the server ending the session and this process noticing
//! (at once for a closed connection; up to [`PING_EVERY`] + the ping wait for a silent one), a
//! group may still commit. Another process can take the lock in that window only after the
//! server ended this process's session, and a group of this process lands after that only if
//! its `COMMIT` was sent before the loss was noticed. Closing it would take a check of the
//! lock inside every group's transaction (`pg_locks`), which is not done.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

use super::backend::describe;
use super::backoff::Backoff;

/// The advisory lock's key: "heraldP" in ASCII (the migration lock, `schema.rs`, is "herald").
pub const PROCESS_LOCK: i64 = 0x0068_6572_616c_6450;
/// How long a claim waits for a lock another process holds: a process being replaced lets go
/// when it exits (a restart's overlap), and the session of one whose host died ends once the
/// server's keepalives find the peer gone ([`KEEPALIVES`]: ~11 s).
pub const CLAIM_WAIT: Duration = Duration::from_secs(15);
/// The lock session's TCP keepalives on the server's side (a review finding: with the OS's
/// defaults the server kept a dead host's session, and the lock, for ~2 h, and the
/// replacement was refused all that time): probed after 5 s idle, every 2 s, gone after 3
/// unanswered. Ignored on a Unix socket, where a dead peer cannot be.
const KEEPALIVES: &str =
    "SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3";
const CLAIM_RETRY: Duration = Duration::from_millis(100);
/// How often the lock's session is asked whether it is still there.
pub const PING_EVERY: Duration = Duration::from_secs(1);

/// A claim refused: a single-node process holds the lock.
pub const SERVES: &str = "another herald serves this database; run several only in cluster mode \
     (a single-node herald, or an import, holds its process lock)";
/// A process without `[cluster]` on a database cluster nodes serve.
pub const CLUSTER_SERVES: &str = "herald nodes in cluster mode serve this database and this \
     process has no [cluster] section; another herald serves this database; run several only \
     in cluster mode";

/// How the lock is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A single-node process (or an import): nobody else.
    Exclusive,
    /// Cluster nodes, each holding it shared.
    Shared,
}

#[derive(Default)]
struct State {
    /// How this process holds it; `None` until claimed (a process that only reads).
    mode: Option<Mode>,
    /// The session holding it, while it does.
    client: Option<Arc<Client>>,
    /// Why it is not held now.
    lost: Option<String>,
}

/// The process lock (module doc). Cheap to clone: the clones share one state.
#[derive(Clone)]
pub struct ProcessLock {
    cfg: tokio_postgres::Config,
    state: Arc<Mutex<State>>,
    ping_wait: Duration,
}

/// A session that holds the lock, and its connection's task.
struct Session {
    client: Arc<Client>,
    conn: JoinHandle<Result<(), tokio_postgres::Error>>,
}

impl ProcessLock {
    /// An unclaimed lock on the database `cfg` names; a ping not answered within `ping_wait`
    /// counts the session as lost.
    pub fn new(mut cfg: tokio_postgres::Config, ping_wait: Duration) -> ProcessLock {
        cfg.application_name("herald process lock");
        ProcessLock {
            cfg,
            state: Arc::default(),
            ping_wait,
        }
    }

    /// How this process holds it (`None`: not claimed).
    pub fn mode(&self) -> Option<Mode> {
        self.state.lock().mode
    }

    /// Why writes must wait: claimed, and not held now. `None` when held or never claimed.
    pub fn refusal(&self) -> Option<String> {
        let s = self.state.lock();
        match (s.mode, &s.client) {
            (Some(_), None) => Some(
                s.lost
                    .clone()
                    .unwrap_or_else(|| "herald's process lock is not held".into()),
            ),
            _ => None,
        }
    }

    /// Takes the lock in `want`: `Exclusive` when nobody holds it, `Shared` when no single
    /// process holds it exclusively. Waits up to [`CLAIM_WAIT`] for a holder to let go, then
    /// fails with [`SERVES`] (or [`CLUSTER_SERVES`] for an exclusive claim on a database
    /// cluster nodes serve). Claimed once: a second call answers the first's mode. Runs on
    /// the backend's runtime (it spawns the keeper there).
    pub async fn claim(&self, want: Mode) -> Result<Mode, String> {
        if let Some(mode) = self.mode() {
            return Ok(mode);
        }
        let started = Instant::now();
        let session = self.connect().await?;
        loop {
            match take(&session.client, want).await {
                Ok(Taken::Held) => {
                    let mode = want;
                    {
                        let mut s = self.state.lock();
                        s.mode = Some(mode);
                        s.client = Some(session.client.clone());
                        s.lost = None;
                    }
                    tokio::spawn(self.clone().keep(session));
                    return Ok(mode);
                }
                Ok(_) if started.elapsed() < CLAIM_WAIT => {
                    tokio::time::sleep(CLAIM_RETRY).await;
                }
                Ok(Taken::ByCluster) => return Err(CLUSTER_SERVES.into()),
                Ok(Taken::BySingle) => return Err(SERVES.into()),
                Err(e) => {
                    return Err(format!(
                        "taking herald's process lock failed: {}",
                        describe(&e)
                    ))
                }
            }
        }
    }

    /// A cluster node's hold, once it has its fence: shared (an exclusive hold from its claim
    /// becomes shared: its own exclusive hold does not conflict, then that one is let go).
    pub async fn share(&self) -> Result<(), String> {
        let client = {
            let mut s = self.state.lock();
            match s.mode {
                None => None,
                Some(Mode::Shared) => return Ok(()),
                Some(Mode::Exclusive) => {
                    // A session taken again from now on takes it shared.
                    s.mode = Some(Mode::Shared);
                    s.client.clone()
                }
            }
        };
        let Some(client) = client else {
            return match self.mode() {
                None => self.claim(Mode::Shared).await.map(|_| ()),
                // Lost meanwhile: the keeper takes it again, shared.
                Some(_) => Ok(()),
            };
        };
        let r = async {
            client
                .query_one("SELECT pg_try_advisory_lock_shared($1)", &[&PROCESS_LOCK])
                .await?;
            client
                .query_one("SELECT pg_advisory_unlock($1)", &[&PROCESS_LOCK])
                .await
        }
        .await;
        r.map(|_| ())
            .map_err(|e| format!("sharing herald's process lock failed: {}", describe(&e)))
    }

    async fn connect(&self) -> Result<Session, String> {
        let (client, conn) =
            self.cfg.connect(NoTls).await.map_err(|e| {
                format!("cannot connect for herald's process lock: {}", describe(&e))
            })?;
        let conn = tokio::spawn(conn);
        // Best effort: a server or pooler that refuses them only keeps a dead host's hold
        // longer (PostgreSQL itself accepts them from any user, and ignores them on a socket).
        if let Err(e) = client.batch_execute(KEEPALIVES).await {
            tracing::warn!(error = %describe(&e), "the process lock's session could not set the server's keepalives: a dead host's hold may last until the server notices");
        }
        // PostgreSQL 12 and later: unacknowledged data ends the session after 10 s too.
        let _ = client.batch_execute("SET tcp_user_timeout = 10000").await;
        Ok(Session {
            client: Arc::new(client),
            conn,
        })
    }

    /// Holds the lock for the process's life: watches its session, and takes it again on a
    /// new one after a loss (module doc). Ends with the backend's runtime.
    async fn keep(self, mut session: Session) {
        loop {
            let why = self.watch(&mut session).await;
            session.conn.abort();
            {
                let mut s = self.state.lock();
                s.client = None;
                s.lost = Some(format!(
                    "the database session holding herald's process lock ended ({why}); writes are refused until it is taken again"
                ));
            }
            tracing::error!(%why, "the session holding herald's process lock ended; writes wait until it is taken again");
            session = self.retake().await;
            {
                let mut s = self.state.lock();
                s.client = Some(session.client.clone());
                s.lost = None;
            }
            tracing::warn!("herald's process lock is held again; writes resume");
        }
    }

    /// Until the session is gone: its connection ended, or a ping failed or got no answer.
    async fn watch(&self, session: &mut Session) -> String {
        loop {
            tokio::select! {
                r = &mut session.conn => {
                    return match r {
                        Ok(Ok(())) => "the server closed the connection".into(),
                        Ok(Err(e)) => describe(&e),
                        Err(e) => e.to_string(),
                    };
                }
                () = tokio::time::sleep(PING_EVERY) => {
                    match tokio::time::timeout(self.ping_wait, session.client.simple_query("SELECT 1")).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return describe(&e),
                        Err(_) => return format!("no answer to a ping within {} s", self.ping_wait.as_secs()),
                    }
                }
            }
        }
    }

    /// A new session holding the lock in this process's mode, trying with backoff.
    async fn retake(&self) -> Session {
        let mut fails = 0;
        loop {
            let want = self.mode().unwrap_or(Mode::Exclusive);
            let why = match self.connect().await {
                Ok(session) => match take(&session.client, want).await {
                    Ok(Taken::Held) => return session,
                    Ok(Taken::ByCluster) => CLUSTER_SERVES.to_string(),
                    Ok(Taken::BySingle) => SERVES.to_string(),
                    Err(e) => describe(&e),
                },
                Err(why) => why,
            };
            self.state.lock().lost = Some(format!(
                "herald's process lock was lost and is not held again yet ({why}); writes are refused until it is"
            ));
            fails += 1;
            tokio::time::sleep(Backoff::delay(fails)).await;
        }
    }
}

/// What one try found.
enum Taken {
    /// Held now, in the mode asked for.
    Held,
    /// A single process holds it exclusively.
    BySingle,
    /// Cluster nodes hold it shared (an exclusive try only).
    ByCluster,
}

/// One try in `want` (never the other mode: a single-node process holding it shared would
/// write unfenced beside cluster nodes).
async fn take(client: &Client, want: Mode) -> Result<Taken, tokio_postgres::Error> {
    let try_lock = |sql: &'static str| async move {
        let row = client.query_one(sql, &[&PROCESS_LOCK]).await?;
        row.try_get::<_, bool>(0)
    };
    match want {
        Mode::Shared => Ok(
            if try_lock("SELECT pg_try_advisory_lock_shared($1)").await? {
                Taken::Held
            } else {
                Taken::BySingle
            },
        ),
        Mode::Exclusive => {
            if try_lock("SELECT pg_try_advisory_lock($1)").await? {
                return Ok(Taken::Held);
            }
            // Who holds it: shared holders are cluster nodes (the shared hold is let go).
            if try_lock("SELECT pg_try_advisory_lock_shared($1)").await? {
                try_lock("SELECT pg_advisory_unlock_shared($1)").await?;
                return Ok(Taken::ByCluster);
            }
            Ok(Taken::BySingle)
        }
    }
}

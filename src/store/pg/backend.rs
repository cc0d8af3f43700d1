//! [`PgBackend`]: [`Backend`] on PostgreSQL with tokio-postgres and deadpool-postgres.
//!
//! The trait is synchronous and is called from the commit thread (`apply`, `sync`) and from
//! tokio workers (reads). Blocking on a runtime inside a tokio worker panics, so the backend
//! owns a small runtime of its own (`herald-pg` threads): each call hands its work to it and
//! waits on a std channel. Every call has a deadline (the statement timeout plus a margin), so
//! a database that stops answering fails calls instead of hanging them.
//!
//! Durability: `apply` runs the whole group as one transaction and commits it; `sync` has
//! nothing left to do. Committed means durable as the server's `synchronous_commit` says
//! (`on`, its default: flushed to its WAL; with synchronous replicas: on them too).
//!
//! A `COMMIT` whose answer never came (the connection dropped, the deadline passed) leaves the
//! group's outcome unknown, and `apply` answers nothing until it knows it ([`read_back`]):
//! every group that writes also inserts its own token into `herald_commit`, and the read-back
//! inserts the same token from another connection. If the group committed, the token is there
//! (the insert does nothing): the group is answered as applied. If not, the read-back's row
//! takes its place, so the group's transaction, should it still be open on a connection the
//! server has not dropped yet, can never commit (its own insert of the token conflicts); one
//! that holds the token's lock is waited for, and ended with `pg_terminate_backend` (a COMMIT
//! the server is already carrying out finishes first). The group is then refused, and nothing
//! of it is ever applied later. While the database cannot be reached the read-back is tried
//! again with backoff, and [`Backend::failing`] says so (`/healthz`, writes refused up front).
//! A read-back that cannot finish within [`READ_BACK_FOR`] leaves the outcome unknown: the
//! group is answered with an error, and in cluster mode every shard it wrote is dropped, as a
//! fenced write drops a shard taken over ([`Outcome::drops_shards`]).
//! Tokens of answered groups are deleted by a later group, in its transaction.
//!
//! Connections: reads (API reads, the engine's offloaded reads, the life sign, the inbox) share
//! a pool of `pool_size`; commit groups and their read-backs have a pool of their own
//! ([`COMMIT_CONNECTIONS`]), so reads that keep every read connection busy (a slow database,
//! 64 API reads at once) never hold a commit back; the process lock (`lock.rs`) has one more.
//! A process opens at most `pool_size` + 3 connections (cluster mode: + 2, its lease loop and
//! its `LISTEN`). A commit that waited for a connection and got none sent nothing: it is
//! refused as a plain failed write, not a lost connection (no backoff, no shard dropped).
//!
//! Single writer: a process that writes holds herald's process lock (`lock.rs`); while it does
//! not (its session lost), writes are refused and [`Backend::failing`] says why.
//!
//! Reconnecting: the pool opens connections on demand and drops closed ones. After a
//! connection failure calls fail at once for a growing delay (`backoff.rs`), so a server
//! coming back is not met by a storm of connection attempts.
//!
//! Concurrency: the group reads the keys its preconditions and indexed writes depend on, then
//! writes, in one READ COMMITTED transaction without row locks. That is sound because herald
//! writes a shard from one commit thread only (one node owns every shard; the cluster's epoch
//! fence of issue 24 keeps it so with several nodes).

use std::collections::VecDeque;
use std::future::Future;
use std::ops::Bound;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{IsolationLevel, NoTls};

use super::backoff::Backoff;
use super::fence::{job_fence, Fence, JobFence};
use super::lock::{self, Mode, ProcessLock};
use super::resolve::{reads_needed, resolve, Stored, Writes};
use super::schema::{self, table, SchemaError, DEFAULT_SHARDS, SCHEMA_VERSION};
use super::shard::{fnv1a64, shard_of};
use super::{prefix_end, redact};
use crate::store::backend::{Backend, Kv, KvIter, RawOp, Rejected, TreeId, TREES};
use crate::store::StoreError;

/// The `herald_meta` row of an import that has not finished ([`PgBackend::mark_import`]).
pub const IMPORT_MARK: &str = "import_unfinished";

/// How herald reaches its database.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// Connections for reads. Commits have [`COMMIT_CONNECTIONS`] of their own and the
    /// process lock one more: `pool_size` + 3 in all (module doc).
    pub pool_size: usize,
    /// The server cancels a statement running longer (`statement_timeout`); a call gives up
    /// on its own a little after.
    pub statement_timeout: Duration,
    /// Longest wait for a new connection (and for a free one from the pool).
    pub connect_timeout: Duration,
    /// S for a schema created by this open; an existing schema keeps its own.
    pub shards: u32,
    /// Used when the URL carries none (`PGPASSWORD` / `HERALD_STORE_PASSWORD`, read by the
    /// caller: this module reads no environment).
    pub password: Option<String>,
    /// How long the server keeps a transaction whose client went quiet; `None`: the
    /// statement timeout. Cluster mode shortens it: a partitioned node's open group holds its
    /// shards' lease rows `FOR KEY SHARE`, and a takeover skips a row so locked (`FOR UPDATE SKIP
    /// LOCKED`) until it is let go.
    pub idle_in_transaction: Option<Duration>,
    /// The process lock this open claims before anything else, migrations included
    /// (`lock.rs`): `Exclusive` for a single-node `herald serve` and an import, `Shared` for
    /// a cluster node; `None` (an export, which only reads; tests' backends) claims none.
    pub process_lock: Option<Mode>,
    /// Whether this open creates or upgrades the schema; `false` (an export, which holds no
    /// process lock) requires this build's schema, or one it reads as it is
    /// (`schema::check_current`).
    pub upgrade: bool,
    /// How long a read-back of a COMMIT that got no answer is tried before the group's
    /// outcome is given up as unknown ([`READ_BACK_FOR`]; tests make it short).
    pub read_back_for: Duration,
}

impl Default for PgOptions {
    fn default() -> PgOptions {
        PgOptions {
            pool_size: 8,
            statement_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            shards: DEFAULT_SHARDS,
            password: None,
            idle_in_transaction: None,
            process_lock: None,
            upgrade: true,
            read_back_for: READ_BACK_FOR,
        }
    }
}

/// Connections of the commit path's own pool: the group's, and a read-back's second one (to
/// end the session of a group whose COMMIT got no answer; the group's own connection has left
/// the pool by then).
pub const COMMIT_CONNECTIONS: usize = 2;

/// How much longer than the statement timeout a call waits before it fails by itself: the
/// server's own cancel, and its answer, come first when the server is there at all.
const CALL_MARGIN: Duration = Duration::from_secs(5);
/// Rows a scan fetches first, and at most per page (pages grow: most scans stop early).
const PAGE_FIRST: i64 = 64;
const PAGE_MAX: i64 = 1024;
/// Inbox rows one batch of a take deletes at most ([`Backend::take_inbox`]).
const INBOX_BATCH: i64 = 1024;
/// Batches one take runs at most: a steady flood of inbox rows (creates on other nodes faster
/// than batches go) must not keep a take from answering. The drain loads what it took and
/// takes the rest at its next round, within its floor (`engine/cluster.rs`, `INBOX_EVERY`).
const INBOX_BATCHES: usize = 64;
/// One batch of the inbox: the first [`INBOX_BATCH`] rows of the shards `$1` in key order
/// (the primary key's index), deleted, their ids answered in that order.
const INBOX_TAKE_SQL: &str = "WITH taken AS (\
     DELETE FROM herald_inbox i USING (\
       SELECT shard, task_id FROM herald_inbox WHERE shard = ANY($1) \
       ORDER BY shard, task_id LIMIT $2) s \
     WHERE i.shard = s.shard AND i.task_id = s.task_id \
     RETURNING i.shard, i.task_id) \
   SELECT task_id FROM taken ORDER BY shard, task_id";

/// How long a read-back of an unknown commit is tried (with backoff) before `apply` gives up
/// and says the outcome is unknown (`PgOptions::read_back_for`'s default). Long: nothing can
/// be written meanwhile anyway, and an answer that might be wrong is worse than a late one.
pub const READ_BACK_FOR: Duration = Duration::from_secs(600);
/// A read-back whose insert waits this long is blocked by the group's own transaction, still
/// open on a connection the server has not dropped: it ends that session.
const READ_BACK_BLOCKED: Duration = Duration::from_millis(200);

pub struct PgBackend {
    /// `None` only while dropping.
    rt: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    /// Reads (and the few writes outside the commit thread: life sign, inbox, import marks).
    pool: Pool,
    /// Commit groups and read-backs only ([`COMMIT_CONNECTIONS`]).
    commits: Pool,
    /// One process writes a database, or cluster nodes do (`lock.rs`).
    lock: ProcessLock,
    shards: u32,
    /// The URL without its password, for messages.
    shown: Arc<str>,
    call_deadline: Duration,
    /// [`PgOptions::read_back_for`].
    read_back_for: Duration,
    /// This process's random part of every commit token (`incarnation ‖ seq`).
    incarnation: u64,
    seq: AtomicU64,
    /// Tokens of answered groups, deleted by the next group that commits.
    spent: Mutex<Vec<Vec<u8>>>,
    /// Set while a read-back waits for the database: what [`Backend::failing`] says.
    outage: Mutex<Option<String>>,
    backoff: Mutex<Backoff>,
    /// Read round trips so far ([`Backend::read_round_trips`]).
    reads: AtomicU64,
    /// Cluster mode: this process's leases; every group is fenced on them (`fence.rs`).
    fence: Option<Arc<dyn Fence>>,
    /// Task ids deleted from the inbox by a call that has not answered them yet: filled in
    /// the transaction, before its `COMMIT`, and handed out by the next call that succeeds
    /// ([`Backend::take_inbox`]). A call that ran past its deadline after its delete
    /// committed left its ids here, not lost with their rows.
    inbox_taken: Arc<Mutex<Vec<String>>>,
}

/// A failure inside the runtime, before it gets its context. `conn`: the connection failed
/// (no server, a dropped connection), not a statement.
/// `busy`: no connection of the pool was free in time; nothing was sent, and nothing says the
/// server is gone (no backoff; a commit's outcome is not unknown).
struct Fail {
    why: String,
    conn: bool,
    busy: bool,
}

impl Fail {
    fn conn(why: String) -> Fail {
        Fail {
            why,
            conn: true,
            busy: false,
        }
    }

    fn stmt(why: String) -> Fail {
        Fail {
            why,
            conn: false,
            busy: false,
        }
    }
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Fail {
        Fail {
            why: describe(&e),
            conn: is_connection_failure(&e),
            busy: false,
        }
    }
}

/// Whether `e` says the server or the connection is gone (it may answer again shortly), not
/// that a statement failed: no server answer at all, a closed connection, a FATAL error (the
/// session ends), SQLSTATE class 08 (connection exception) or 57 (operator intervention: the
/// server shutting down, starting up, or ending the session), or too many connections.
fn is_connection_failure(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        return true;
    };
    let code = db.code().code();
    e.is_closed()
        || matches!(db.severity(), "FATAL" | "PANIC")
        || code.starts_with("08")
        || code.starts_with("57")
        || code == "53300"
}

impl From<deadpool_postgres::PoolError> for Fail {
    fn from(e: deadpool_postgres::PoolError) -> Fail {
        match e {
            deadpool_postgres::PoolError::Backend(e) => Fail::from(e),
            deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait) => Fail {
                why: "no connection of the pool was free in time (all busy); nothing was sent"
                    .into(),
                conn: true,
                busy: true,
            },
            e => Fail::conn(format!("no database connection: {e}")),
        }
    }
}

/// How a group's transaction ended, when it did not commit.
enum GroupFail {
    /// Before its COMMIT was sent, or the server refused the COMMIT: nothing was applied.
    Refused(Fail),
    /// The COMMIT was sent and no answer came: read it back.
    Unknown(String),
    /// The fence found these shards held by someone else now: nothing was written; the jobs
    /// come back to be tried again without the ones that write there.
    Fenced(Vec<u32>, Vec<Vec<RawOp>>),
}

impl From<Fail> for GroupFail {
    fn from(f: Fail) -> GroupFail {
        GroupFail::Refused(f)
    }
}

impl From<tokio_postgres::Error> for GroupFail {
    fn from(e: tokio_postgres::Error) -> GroupFail {
        GroupFail::Refused(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for GroupFail {
    fn from(e: deadpool_postgres::PoolError) -> GroupFail {
        GroupFail::Refused(e.into())
    }
}

/// What a commit group that got no results may have left in the database: what decides, in
/// cluster mode, whether its shards are still trusted ([`Outcome::drops_shards`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// Nothing of it is applied, now or later: the server refused it (a statement's error, a
    /// refused COMMIT), no connection of the pool was free, or the read-back inserted its
    /// token first.
    NotApplied,
    /// Nothing was committed, but the connection failed or the call's deadline passed before
    /// the COMMIT was sent: the database may not be reachable (the lease loop's renewals
    /// likely fail too), and the group's transaction may still be open on the server.
    ConnectionLost,
    /// The COMMIT was sent and whether it committed is not known (it could not be read back
    /// in time), or it committed while its writers are told it failed: the group's rows may
    /// differ from what the engine holds of them.
    Unknown,
}

impl Outcome {
    /// Whether the node stops trusting the shards the group wrote (HA.md "Fence every write":
    /// an unknown commit outcome forces re-acquisition before the next write). They are
    /// dropped as a fenced write drops a shard taken over (`Fence::lost`): the engine unloads
    /// their tasks, and whoever holds them next, at a new epoch, reads their rows again.
    fn drops_shards(self) -> bool {
        match self {
            Outcome::NotApplied => false,
            Outcome::ConnectionLost | Outcome::Unknown => true,
        }
    }
}

/// A commit group that failed: the error its writers get, and what it may have applied.
struct GroupError {
    error: StoreError,
    outcome: Outcome,
}

/// A group's results, left where [`PgBackend::apply`] finds them once its COMMIT was sent.
type Answer = Arc<Mutex<Option<Vec<Result<(), Rejected>>>>>;

/// A random number for this process (std's `RandomState` is seeded from the OS).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// A tokio-postgres error as one line: the server's message when it sent one, else the cause
/// (`Display` alone says only "db error" or "error connecting to server").
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    match std::error::Error::source(e) {
        Some(src) => format!("{e}: {src}"),
        None => e.to_string(),
    }
}

/// The connection settings of `url` (the password from `opts` when the URL has none), with
/// herald's statement and idle-transaction timeouts.
fn client_config(
    url: &str,
    opts: &PgOptions,
    refused: &dyn Fn(String) -> StoreError,
) -> Result<tokio_postgres::Config, StoreError> {
    let mut cfg = tokio_postgres::Config::from_str(url).map_err(|e| {
        refused(format!(
            "not a PostgreSQL URL ({e}); write it as postgres://user@host:port/database"
        ))
    })?;
    if cfg.get_password().is_none() {
        if let Some(p) = &opts.password {
            cfg.password(p);
        }
    }
    let statement_ms = opts.statement_timeout.as_millis().max(1);
    let idle_ms = opts
        .idle_in_transaction
        .map_or(statement_ms, |d| d.as_millis().max(1));
    // A transaction left open by a client that went away (its COMMIT lost on the way)
    // is ended by the server itself after the same time; the read-back does not wait
    // for that (it ends the session), this is for every other case.
    // No sequential scans: every statement herald runs is a point read, a key range or a
    // shard's rows, each served by an index. herald's tables start empty and are not analyzed
    // while they grow, and a prepared statement's generic plan, made while a table was small,
    // kept a sequential scan: a herd of 100 000 read its derived (absent) progress rows 256 at
    // a time with a scan of the whole table, 28 ms each, 27 s of the server's time in all
    // (`pg_stat_statements`), and its last send came at due + 8 to 16 s instead of < 3 s.
    cfg.application_name("herald")
        .connect_timeout(opts.connect_timeout)
        .options(format!(
            "-c statement_timeout={statement_ms} -c idle_in_transaction_session_timeout={idle_ms} \
             -c enable_seqscan=off"
        ));
    Ok(cfg)
}

/// A pool of at most `size` connections made with `cfg`, waiting `wait` at most for one.
fn make_pool(
    cfg: &tokio_postgres::Config,
    size: usize,
    wait: Duration,
    refused: &dyn Fn(String) -> StoreError,
) -> Result<Pool, StoreError> {
    let mgr = Manager::from_config(
        cfg.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(mgr)
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(wait))
        .create_timeout(Some(wait))
        .recycle_timeout(Some(wait))
        .build()
        .map_err(|e| refused(format!("cannot make a connection pool: {e}")))
}

impl PgBackend {
    /// Connects to `url`, creates or migrates herald's schema, and answers the backend. A
    /// malformed URL, an unreachable server, bad credentials, a missing database or a newer
    /// schema are errors naming the URL without its password.
    pub fn open(url: &str, opts: &PgOptions) -> Result<PgBackend, StoreError> {
        let shown: Arc<str> = redact(url).into();
        let refused = |what: String| StoreError::Database(format!("postgres {shown}: {what}"));
        let cfg = client_config(url, opts, &refused)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("herald-pg")
            .enable_all()
            .build()?;
        let pool = make_pool(&cfg, opts.pool_size.max(1), opts.connect_timeout, &refused)?;
        let commits = make_pool(&cfg, COMMIT_CONNECTIONS, opts.connect_timeout, &refused)?;
        let mut backend = PgBackend {
            handle: rt.handle().clone(),
            rt: Some(rt),
            pool,
            commits,
            lock: ProcessLock::new(cfg.clone(), opts.connect_timeout),
            shards: opts.shards,
            shown: shown.clone(),
            call_deadline: opts.statement_timeout + CALL_MARGIN,
            read_back_for: opts.read_back_for,
            incarnation: random_u64(),
            seq: AtomicU64::new(0),
            spent: Mutex::new(Vec::new()),
            outage: Mutex::new(None),
            backoff: Mutex::new(Backoff::default()),
            reads: AtomicU64::new(0),
            fence: None,
            inbox_taken: Arc::default(),
        };
        // Before the migration: a process that may not write must not upgrade the schema
        // under the one that serves (a review finding: a blue/green start migrated, was then
        // refused, and left the old binary on a schema newer than it knows).
        if let Some(mode) = opts.process_lock {
            backend.claim(mode)?;
        }
        backend.shards = backend.migrate_on_open(cfg, opts.shards, opts.upgrade, &refused)?;
        Ok(backend)
    }

    /// Cluster mode: fences every commit group on `fence` (HA.md "Fence every write"), and
    /// holds the process lock shared (`lock.rs`), as every cluster node does. Should another
    /// process hold it exclusively, writes are refused (and [`Backend::failing`] says so)
    /// until the keeper gets it.
    pub fn with_fence(mut self, fence: Arc<dyn Fence>) -> PgBackend {
        self.fence = Some(fence);
        let lock = self.lock.clone();
        let wait = lock::CLAIM_WAIT + self.call_deadline;
        match self.run_for(wait, async move { lock.share().await }) {
            Some(Ok(())) => {}
            Some(Err(why)) => tracing::error!(%why, "cluster mode: herald's process lock"),
            None => tracing::error!("cluster mode: taking herald's process lock got no answer"),
        }
        self
    }

    /// Takes the process lock (`lock.rs`) in `mode`. Fails, naming the cause, when another
    /// process holds it in a way `mode` cannot share.
    fn claim(&self, mode: Mode) -> Result<(), StoreError> {
        let lock = self.lock.clone();
        let wait = lock::CLAIM_WAIT + self.call_deadline;
        match self.run_for(wait, async move { lock.claim(mode).await }) {
            Some(Ok(_)) => Ok(()),
            Some(Err(why)) => Err(StoreError::Database(format!(
                "postgres {}: {why}",
                self.shown
            ))),
            None => Err(StoreError::Database(format!(
                "postgres {}: taking herald's process lock got no answer",
                self.shown
            ))),
        }
    }

    /// Creates or migrates the schema on a connection of its own (or, `upgrade` false, checks
    /// that it is this build's); answers S. Without the
    /// call's deadline: a migration may run for minutes (a large fold); `schema::migrate`
    /// bounds each of its statements by the call's deadline instead, and the connection by
    /// the connect timeout.
    fn migrate_on_open(
        &self,
        cfg: tokio_postgres::Config,
        shards: u32,
        upgrade: bool,
        refused: &dyn Fn(String) -> StoreError,
    ) -> Result<u32, StoreError> {
        let step = self.call_deadline;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let migrated = async move {
            // Its own connection, not the pool's: the first error (no server, bad password,
            // no database) is then reported as the server said it.
            let (mut client, conn) = cfg.connect(NoTls).await.map_err(|e| {
                SchemaError::Bad(format!("cannot connect: {}; check that the server runs and the URL's user, password and database exist", describe(&e)))
            })?;
            let conn = tokio::spawn(conn);
            let r = if upgrade {
                schema::migrate(&mut client, shards, step).await
            } else {
                schema::check_current(&mut client, step).await
            };
            if r.is_ok() && upgrade {
                // Tokens a crashed process left behind (answered groups' are deleted as
                // they go; an unanswered one is resolved within minutes).
                let stale = "DELETE FROM herald_commit WHERE at < now() - interval '1 day'";
                let _ = tokio::time::timeout(step, client.execute(stale, &[])).await;
            }
            drop(client);
            let _ = conn.await;
            r
        };
        self.handle.spawn(async move {
            let _ = tx.send(migrated.await);
        });
        match rx.recv().ok() {
            Some(Ok(s)) => Ok(s),
            Some(Err(SchemaError::Newer { found })) => {
                Err(refused(format!(
                    "the database holds herald schema version {found}, newer than this build's {SCHEMA_VERSION}; run the herald release that wrote it (or a newer one)"
                )))
            }
            Some(Err(SchemaError::Bad(why))) => Err(refused(why)),
            Some(Err(SchemaError::Db(e))) => {
                Err(refused(format!("creating herald's schema failed: {}", describe(&e))))
            }
            None => Err(refused("the server did not answer in time".into())),
        }
    }

    /// S: how many shards the schema has.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// Whether any task is stored (an import wants a database without).
    pub fn holds_tasks(&self) -> Result<bool, StoreError> {
        let pool = self.pool.clone();
        self.run("read", async move {
            let client = pool.get().await?;
            let sql = format!("SELECT EXISTS (SELECT 1 FROM {})", table(TreeId::Specs));
            Ok(client.query_one(&sql, &[]).await?.try_get(0)?)
        })
    }

    /// Deletes every row of herald's trees, in one transaction (a failed import into a
    /// database that held no tasks leaves it so again). The schema and lease rows stay.
    pub fn clear(&self) -> Result<(), StoreError> {
        self.write_gate("clear")?;
        let pool = self.pool.clone();
        self.run("clear", async move {
            let client = pool.get().await?;
            let tables: Vec<String> = TreeId::ALL.iter().map(|t| table(*t)).collect();
            client
                .batch_execute(&format!("TRUNCATE {}, herald_commit", tables.join(", ")))
                .await?;
            Ok(())
        })
    }

    /// Sets (`on`) or removes the mark of an import under way (`backup/marker.rs`): a row of
    /// `herald_meta`, set before the import's first write and removed once it has finished.
    /// Setting it also forgets the database's life sign ([`Backend::stamp_alive`]).
    pub fn mark_import(&self, on: bool) -> Result<(), StoreError> {
        self.write_gate("import mark")?;
        let pool = self.pool.clone();
        self.run("import mark", async move {
            let client = pool.get().await?;
            let sql = if on {
                "INSERT INTO herald_meta (name, value) VALUES ($1, now()::text) \
                 ON CONFLICT (name) DO NOTHING"
            } else {
                "DELETE FROM herald_meta WHERE name = $1"
            };
            client.execute(sql, &[&IMPORT_MARK]).await?;
            if on {
                // The imported runs were watched by the exporting process, not by the last
                // one on this database: its life sign does not speak for them.
                let forget = "DELETE FROM herald_meta WHERE name = 'alive'";
                client.execute(forget, &[]).await?;
            }
            Ok(())
        })
    }

    /// Whether an import into this database did not finish ([`PgBackend::mark_import`]).
    ///
    /// Asked first by every process that means to write the database (`herald serve` at
    /// start-up, `herald import` before it writes), after its open claimed the process lock
    /// (`PgOptions::process_lock`).
    pub fn import_unfinished(&self) -> Result<bool, StoreError> {
        let pool = self.pool.clone();
        // Not `run`: a cluster node gets its fence only after this (`server.rs`).
        self.run_gated("read", false, async move {
            let client = pool.get().await?;
            let sql = "SELECT EXISTS (SELECT 1 FROM herald_meta WHERE name = $1)";
            Ok(client.query_one(sql, &[&IMPORT_MARK]).await?.try_get(0)?)
        })
    }

    /// Runs `f` on the backend's runtime and waits for it; `None` when the deadline passed.
    fn run_raw<T: Send + 'static>(&self, f: impl Future<Output = T> + Send + 'static) -> Option<T> {
        self.run_for(self.call_deadline, f)
    }

    fn run_for<T: Send + 'static>(
        &self,
        deadline: Duration,
        f: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(tokio::time::timeout(deadline, f).await.ok());
        });
        rx.recv().ok().flatten()
    }

    fn error(&self, what: &str, why: &str) -> StoreError {
        StoreError::Write(format!("postgres {}: {what}: {why}", self.shown))
    }

    /// [`Self::error`] for a failure of the connection, not of a statement: the server may
    /// answer again shortly, and the engine keeps what it could not read.
    fn fail(&self, what: &str, f: &Fail) -> StoreError {
        if f.conn {
            StoreError::Unavailable(format!("postgres {}: {what}: {}", self.shown, f.why))
        } else {
            self.error(what, &f.why)
        }
    }

    /// Refuses at once while the backoff after a connection failure lasts, and every call of
    /// a process without a fence on a database whose cluster nodes hold the process lock.
    fn gate(&self, what: &str) -> Result<(), StoreError> {
        self.mode_gate()?;
        self.backoff_gate(what)
    }

    fn mode_gate(&self) -> Result<(), StoreError> {
        if self.fence.is_none() && self.lock.mode() == Some(Mode::Shared) {
            return Err(StoreError::Database(format!(
                "postgres {}: {}",
                self.shown,
                lock::CLUSTER_SERVES
            )));
        }
        Ok(())
    }

    /// Refuses a write while the process lock, once claimed, is not held (`lock.rs`).
    fn write_gate(&self, what: &str) -> Result<(), StoreError> {
        match self.lock.refusal() {
            Some(why) => Err(StoreError::Unavailable(format!(
                "postgres {}: {what}: {why}",
                self.shown
            ))),
            None => Ok(()),
        }
    }

    fn backoff_gate(&self, what: &str) -> Result<(), StoreError> {
        match self.backoff.lock().holding(Instant::now()) {
            Some((left, why)) => Err(self.fail(
                what,
                &Fail::conn(format!("{why} (next attempt in {} ms)", left.as_millis())),
            )),
            None => Ok(()),
        }
    }

    /// Counts a call's outcome into the backoff (a busy pool is no failure of the server).
    fn note<T>(&self, r: &Option<Result<T, Fail>>) {
        match r {
            Some(Ok(_)) => self.backoff.lock().succeeded(),
            Some(Err(f)) if f.conn && !f.busy => self.backoff.lock().failed(Instant::now(), &f.why),
            Some(Err(_)) => {}
            None => self
                .backoff
                .lock()
                .failed(Instant::now(), "the server did not answer"),
        }
    }

    /// [`Self::run_raw`] for database work: failures become storage errors naming the store.
    fn run<T: Send + 'static>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, Fail>> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.run_gated(what, true, f)
    }

    /// [`Self::run`], past the mode gate only when `mode`.
    fn run_gated<T: Send + 'static>(
        &self,
        what: &str,
        mode: bool,
        f: impl Future<Output = Result<T, Fail>> + Send + 'static,
    ) -> Result<T, StoreError> {
        if mode {
            self.mode_gate()?;
        }
        self.backoff_gate(what)?;
        let r = self.run_raw(f);
        self.note(&r);
        match r {
            Some(Ok(v)) => Ok(v),
            Some(Err(f)) => Err(self.fail(what, &f)),
            None => Err(self.fail(
                what,
                &Fail::conn(format!(
                    "no answer within {} s",
                    self.call_deadline.as_secs()
                )),
            )),
        }
    }

    /// A new commit token: unique per group across processes (random incarnation).
    fn token(&self) -> Vec<u8> {
        let mut t = self.incarnation.to_be_bytes().to_vec();
        t.extend_from_slice(&self.seq.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        t
    }

    /// Resolves a group whose COMMIT got no answer (module doc): its results when it was
    /// committed, an error when it was not (and now never will be), or, when it could not be
    /// read back for [`PgOptions::read_back_for`], an error whose outcome is
    /// [`Outcome::Unknown`]. Tried again with backoff while the database cannot be reached.
    fn read_back(
        &self,
        token: Vec<u8>,
        answer: Option<Vec<Result<(), Rejected>>>,
        why: &str,
    ) -> Result<Vec<Result<(), Rejected>>, GroupError> {
        let started = Instant::now();
        let mut fails = 0;
        let outcome = loop {
            *self.outage.lock() = Some(format!(
                "postgres {}: a COMMIT got no answer ({why}); reading back whether it was stored",
                self.shown
            ));
            let pool = self.commits.clone();
            let t = token.clone();
            match self.run_raw(read_back(pool, t)) {
                Some(Ok(committed)) => break Some(committed),
                Some(Err(f)) => {
                    tracing::warn!(error = %f.why, "reading back an unknown commit failed; trying again")
                }
                None => {
                    tracing::warn!("reading back an unknown commit got no answer; trying again")
                }
            }
            if started.elapsed() >= self.read_back_for {
                break None;
            }
            fails += 1;
            std::thread::sleep(Backoff::delay(fails));
        };
        *self.outage.lock() = None;
        let failed = |outcome: Outcome, what: String| GroupError {
            error: self.error("commit", &what),
            outcome,
        };
        match (outcome, answer) {
            (Some(true), Some(results)) => {
                tracing::warn!("a COMMIT got no answer; read back: it was stored");
                self.spent.lock().push(token);
                Ok(results)
            }
            // Stored, but its writers are told it failed: what they hold in memory is not
            // what is on disk, so the shards are not trusted either.
            (Some(true), None) => Err(failed(
                Outcome::Unknown,
                "the group was stored, but its answer was lost (a bug)".into(),
            )),
            (Some(false), _) => {
                tracing::warn!(
                    "a COMMIT got no answer; read back: it was not stored, and never will be"
                );
                // The read-back's row only fences a transaction that is over now.
                self.spent.lock().push(token);
                Err(failed(
                    Outcome::NotApplied,
                    format!(
                        "the COMMIT got no answer ({why}); read back: the group was not stored"
                    ),
                ))
            }
            (None, _) => {
                tracing::error!(
                    "a COMMIT got no answer and could not be read back: its outcome is unknown"
                );
                Err(failed(
                    Outcome::Unknown,
                    format!(
                        "the COMMIT got no answer ({why}) and reading it back failed for {} s: the group may or may not be stored",
                        self.read_back_for.as_secs()
                    ),
                ))
            }
        }
    }
}

/// The read-back of `token` (module doc): `true` when its group committed.
async fn read_back(pool: Pool, token: Vec<u8>) -> Result<bool, Fail> {
    let client = pool.get().await?;
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .try_get(0)?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&token];
    let insert = client.execute(
        "INSERT INTO herald_commit (token) VALUES ($1) ON CONFLICT (token) DO NOTHING",
        &params,
    );
    tokio::pin!(insert);
    loop {
        tokio::select! {
            r = &mut insert => return Ok(r? == 0),
            () = tokio::time::sleep(READ_BACK_BLOCKED) => {
                // Waiting on the group's open transaction: end its session. Our insert then
                // decides (a COMMIT under way finishes first, and our insert finds its row).
                let other = pool.get().await?;
                let ended = other
                    .execute(
                        "SELECT pg_terminate_backend(b) FROM unnest(pg_blocking_pids($1)) AS b",
                        &[&pid],
                    )
                    .await?;
                if ended > 0 {
                    tracing::warn!("ended the session of a group whose COMMIT got no answer");
                }
            }
        }
    }
}

impl PgBackend {
    /// One batch of [`Backend::take_inbox`]: at most [`INBOX_BATCH`] rows of the shards of
    /// `held` whose epochs the lease rows still have, deleted in key order, their ids added
    /// to `inbox_taken` before the `COMMIT`. `Ok(true)`: the batch was full and committed, so
    /// more rows may wait.
    fn take_inbox_batch(&self, held: Vec<(u32, u64)>) -> Result<bool, StoreError> {
        self.write_gate("read the inbox")?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let pool = self.pool.clone();
        let taken = self.inbox_taken.clone();
        self.run("read the inbox", async move {
            let mut client = pool.get().await?;
            let tx = client.transaction().await?;
            let lost = fenced_out(&tx, &held).await?;
            let ok: Vec<i32> = held
                .iter()
                .filter(|(s, _)| !lost.contains(s))
                .map(|(s, _)| i32::try_from(*s).unwrap_or(i32::MAX))
                .collect();
            let st = tx.prepare_cached(INBOX_TAKE_SQL).await?;
            let rows = tx.query(&st, &[&ok, &INBOX_BATCH]).await?;
            let full = rows.len() as i64 >= INBOX_BATCH;
            let mut ids: Vec<String> = Vec::with_capacity(rows.len());
            for r in rows {
                ids.push(r.try_get(0)?);
            }
            // Kept before the COMMIT is sent: whatever becomes of this call, they go out.
            taken.lock().extend(ids);
            // A COMMIT that got no answer may have deleted the rows: the ids go back either
            // way. Loading a task twice is a no-op; a notice lost here left its task unarmed
            // until its shard next moved (the nemesis' lost COMMIT reply, seed 21). No next
            // batch then: it could take the same rows again.
            if let Err(e) = tx.commit().await {
                tracing::warn!(error = %e, "taking the inbox: the COMMIT failed; its tasks are loaded anyway");
                return Ok(false);
            }
            Ok(full)
        })
    }
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        // `shutdown_background`, not a plain drop: the backend may be dropped on a tokio worker,
        // where dropping a runtime panics. Its connection tasks end with it.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Polls all of `futs` together, so their statements share the connection's pipeline (one
/// round trip for all, not one each), and answers their outputs in order.
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// One statement of a group's write.
enum Stmt<'a> {
    Upsert(TreeId, Vec<i32>, Vec<&'a [u8]>, Vec<&'a [u8]>),
    Delete(TreeId, Vec<&'a [u8]>),
    /// The group's own token (module doc). A plain insert: a read-back that got there first
    /// makes it fail, and the group with it.
    Token(&'a [u8]),
    /// Tokens of groups answered before.
    Spent(&'a [Vec<u8>]),
    /// Tasks created for shards this process does not hold, with one `NOTIFY` for all.
    Inbox(Vec<i32>, Vec<&'a str>),
}

async fn exec(tx: &deadpool_postgres::Transaction<'_>, stmt: Stmt<'_>) -> Result<u64, Fail> {
    Ok(match stmt {
        Stmt::Upsert(t, shards, keys, values) => {
            let sql = format!(
                "INSERT INTO {} (shard, key, value) \
                 SELECT * FROM unnest($1::int4[], $2::bytea[], $3::bytea[]) \
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                table(t)
            );
            let st = tx.prepare_cached(&sql).await?;
            tx.execute(&st, &[&shards, &keys, &values]).await?
        }
        Stmt::Delete(t, keys) => {
            let sql = format!("DELETE FROM {} WHERE key = ANY($1::bytea[])", table(t));
            let st = tx.prepare_cached(&sql).await?;
            tx.execute(&st, &[&keys]).await?
        }
        Stmt::Token(token) => {
            let st = tx
                .prepare_cached("INSERT INTO herald_commit (token) VALUES ($1)")
                .await?;
            tx.execute(&st, &[&token]).await?
        }
        Stmt::Spent(tokens) => {
            let st = tx
                .prepare_cached("DELETE FROM herald_commit WHERE token = ANY($1::bytea[])")
                .await?;
            tx.execute(&st, &[&tokens]).await?
        }
        Stmt::Inbox(shards, ids) => {
            let st = tx
                .prepare_cached(
                    "WITH i AS (INSERT INTO herald_inbox (shard, task_id) \
                       SELECT * FROM unnest($1::int4[], $2::text[]) ON CONFLICT DO NOTHING) \
                     SELECT pg_notify('herald_inbox', '')",
                )
                .await?;
            tx.execute(&st, &[&shards, &ids]).await?
        }
    })
}

/// Per tree, the rows of `keys` (a query per tree with keys, all pipelined: one round trip),
/// in a transaction or on a plain connection.
async fn read_keys<C: GenericClient>(tx: &C, keys: &[Vec<Vec<u8>>; TREES]) -> Result<Stored, Fail> {
    let reads = TreeId::ALL
        .iter()
        .filter(|t| !t.of(keys).is_empty())
        .map(|t| async move {
            let sql = format!(
                "SELECT key, value FROM {} WHERE key = ANY($1::bytea[])",
                table(*t)
            );
            let st = tx.prepare_cached(&sql).await?;
            let rows = tx.query(&st, &[&t.of(keys)]).await?;
            Ok::<_, Fail>((*t, rows))
        })
        .collect();
    let mut stored: Stored = Default::default();
    for r in join_all(reads).await {
        let (t, rows) = r?;
        for row in rows {
            t.of_mut(&mut stored)
                .insert(row.try_get(0)?, row.try_get(1)?);
        }
    }
    Ok(stored)
}

/// The statements that write `writes`: per tree one upsert and one delete.
fn statements(writes: &Writes, shards: u32) -> Vec<Stmt<'_>> {
    statements_within(writes, shards, STATEMENT_BYTES_MAX)
}

/// Most bytes of values one upsert statement carries: PostgreSQL refuses an array value (and
/// a Bind message) of more than ~1 GB, and a group may hold up to 2 GiB
/// (`store::commit::GROUP_BYTES_MAX` + a job), so a tree's rows go in statements of at most
/// this many bytes, in the group's one transaction. One value is at most the decoder's
/// 64 MiB (`codec.rs`), so each statement fits.
const STATEMENT_BYTES_MAX: usize = 256 << 20;

/// [`statements`], upserts cut at `max` bytes of values (a statement holds at least one row).
fn statements_within(writes: &Writes, shards: u32, max: usize) -> Vec<Stmt<'_>> {
    let mut out = Vec::new();
    for t in TreeId::ALL {
        let (mut sh, mut keys, mut values, mut dels) = (vec![], vec![], vec![], vec![]);
        let mut bytes = 0usize;
        for (k, v) in t.of(writes) {
            match v {
                Some(v) => {
                    if !keys.is_empty() && bytes + v.len() > max {
                        let (s, k) = (std::mem::take(&mut sh), std::mem::take(&mut keys));
                        out.push(Stmt::Upsert(t, s, k, std::mem::take(&mut values)));
                        bytes = 0;
                    }
                    bytes += v.len();
                    sh.push(shard_of(t, k, Some(v), shards));
                    keys.push(k.as_slice());
                    values.push(v.as_slice());
                }
                None => dels.push(k.as_slice()),
            }
        }
        if !keys.is_empty() {
            out.push(Stmt::Upsert(t, sh, keys, values));
        }
        if !dels.is_empty() {
            out.push(Stmt::Delete(t, dels));
        }
    }
    out
}

/// What a group hands [`apply_group`] besides its jobs.
struct GroupCtx {
    pool: Pool,
    shards: u32,
    token: Vec<u8>,
    spent: Vec<Vec<u8>>,
    /// Set just before the COMMIT goes out: from then on a failure is an unknown outcome.
    sent: Arc<AtomicBool>,
    answer: Answer,
    commit_wait: Duration,
    /// Cluster mode: the epochs the group's shards must still have (`fence.rs`).
    fence: Vec<(u32, u64)>,
    /// Cluster mode: per job, the inbox rows it writes if it applies.
    inbox: Vec<Vec<(u32, String)>>,
    /// Cluster mode: the keys jobs need absent are locked first ([`absent_locks`]).
    lock_absent: bool,
    /// Checked just before the COMMIT: no group commits once the process lock is known lost.
    process_lock: ProcessLock,
}

/// The advisory lock keys, ascending, of every key a job of `jobs` needs absent (a new task's
/// id, an idempotency key) or reads for [`RawOp::IdemOf`]'s precondition. Cluster mode only:
/// any node writes creates, so two nodes creating one id at once (a client's retry sent to
/// another node while the first try is on its way, or two clients choosing one id) both read
/// it absent and both write it (the writes are upserts): both answered 201, the later
/// commit's task over the earlier's. Locked for the
/// transaction, before the reads, the second waits for the first to end and then reads its
/// row: refused, 409. Ascending, so two groups never wait for each other in a circle. The key
/// is FNV-1a (`shard.rs`), the same on every node and build; a collision only makes two
/// creates wait for each other.
fn absent_locks(jobs: &[Vec<RawOp>]) -> Vec<i64> {
    let mut out: Vec<i64> = jobs
        .iter()
        .flatten()
        .filter_map(|op| {
            let (t, k) = match op {
                RawOp::Absent(t, k) => (*t, k),
                // A freed key's delete reads the key's record as a create's insert would:
                // the same lock orders them (`RawOp::IdemOf`'s precondition).
                RawOp::IdemOf(k, _) => (TreeId::Idem, k),
                _ => return None,
            };
            let mut b = t.name().as_bytes().to_vec();
            b.push(0);
            b.extend_from_slice(k);
            Some(i64::from_ne_bytes(fnv1a64(&b).to_ne_bytes()))
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// [`lock_keys`]' statement.
const LOCK_SQL: &str =
    "SELECT pg_advisory_xact_lock(k) FROM unnest($1::int8[]) WITH ORDINALITY AS u(k, n) ORDER BY n";

/// Takes [`absent_locks`]' locks for the transaction, in their order (the array's, which
/// `unnest` keeps).
async fn lock_keys(tx: &deadpool_postgres::Transaction<'_>, keys: &[i64]) -> Result<(), Fail> {
    if keys.is_empty() {
        return Ok(());
    }
    let st = tx.prepare_cached(LOCK_SQL).await?;
    tx.query(&st, &[&keys]).await?;
    Ok(())
}

/// The fence, first in the group's transaction: the lease rows of its shards held
/// `FOR KEY SHARE` until it ends (a takeover's `FOR UPDATE SKIP LOCKED` passes such a row by
/// and takes it in a later round), and the shards
/// whose epoch is no longer the one held (`cluster/rows.rs`'s protocol).
async fn fenced_out(
    tx: &deadpool_postgres::Transaction<'_>,
    fence: &[(u32, u64)],
) -> Result<Vec<u32>, Fail> {
    let ids: Vec<i32> = fence
        .iter()
        .map(|(s, _)| i32::try_from(*s).unwrap_or(i32::MAX))
        .collect();
    let st = tx
        .prepare_cached(
            "SELECT shard_id, epoch FROM herald_shard WHERE shard_id = ANY($1) \
             ORDER BY shard_id FOR KEY SHARE",
        )
        .await?;
    let rows = tx.query(&st, &[&ids]).await?;
    let mut found = std::collections::BTreeMap::new();
    for r in rows {
        let (s, e): (i32, i64) = (r.try_get(0)?, r.try_get(1)?);
        found.insert(
            u32::try_from(s).unwrap_or(u32::MAX),
            u64::try_from(e).unwrap_or(0),
        );
    }
    Ok(fence
        .iter()
        .filter(|(s, e)| found.get(s) != Some(e))
        .map(|(s, _)| *s)
        .collect())
}

/// The group's reads ([`reads_needed`]), after the locks of the keys its jobs need absent
/// when `lock_absent` (cluster mode, [`absent_locks`]).
async fn locked_reads(
    tx: &deadpool_postgres::Transaction<'_>,
    jobs: &[Vec<RawOp>],
    needed: &[Vec<Vec<u8>>; TREES],
    lock_absent: bool,
) -> Result<Stored, Fail> {
    let locks = if lock_absent {
        absent_locks(jobs)
    } else {
        Vec::new()
    };
    Ok(if locks.is_empty() {
        if needed.iter().any(|k| !k.is_empty()) {
            read_keys(tx, needed).await?
        } else {
            Stored::default()
        }
    } else {
        // The locks and the reads in one round trip: the lock statement prepared first (a
        // round trip only on its first use on a connection), so that its query is queued on
        // the connection before any read's, and the server runs it, waiting for the locks,
        // before the reads. (One more round trip per group cost cluster creates a sixth to
        // a third of their rate.)
        tx.prepare_cached(LOCK_SQL).await?;
        // `biased`: the lock is polled first on every poll, so its query is sent first.
        let (locked, stored) = tokio::join!(biased; lock_keys(tx, &locks), read_keys(tx, needed));
        locked?;
        stored?
    })
}

/// The group's transaction. `Ok(wrote)`: committed (`wrote`: it holds the token); the
/// results are in `ctx.answer`.
/// A commit group's connection, out of the pool when dropped unless given back: a group the
/// call's deadline drops while its `COMMIT` is pending, or one whose session failed, must not
/// hand that connection to the next group or to the read-back (a review finding: the
/// read-back's `pg_backend_pid()` queued behind the pending `COMMIT`, and the fence by ending
/// that session never came). A group that committed, was fenced out, or was refused by the
/// server's answer gives it back (deadpool makes a new one for a slot taken out).
struct Taken(Option<deadpool_postgres::Object>);

impl Taken {
    fn give_back(&mut self) {
        self.0.take();
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if let Some(o) = self.0.take() {
            drop(deadpool_postgres::Object::take(o));
        }
    }
}

async fn apply_group(ctx: GroupCtx, jobs: Vec<Vec<RawOp>>) -> Result<bool, GroupFail> {
    let needed = reads_needed(&jobs);
    let mut client = Taken(Some(ctx.pool.get().await?));
    let Some(conn) = client.0.as_mut() else {
        return Err(GroupFail::Refused(Fail::conn("no connection".into())));
    };
    let tx = conn.transaction().await?;
    if !ctx.fence.is_empty() {
        let lost = fenced_out(&tx, &ctx.fence).await?;
        if !lost.is_empty() {
            // A healthy session: back to the pool as the transaction rolls back.
            drop(tx);
            client.give_back();
            return Err(GroupFail::Fenced(lost, jobs));
        }
    }
    let stored = locked_reads(&tx, &jobs, &needed, ctx.lock_absent).await?;
    let (results, writes) = resolve(jobs, &stored);
    let (mut in_shards, mut in_ids) = (Vec::new(), Vec::new());
    for (rows, r) in ctx.inbox.iter().zip(&results) {
        for (shard, id) in rows.iter().filter(|_| r.is_ok()) {
            in_shards.push(i32::try_from(*shard).unwrap_or(i32::MAX));
            in_ids.push(id.as_str());
        }
    }
    let mut stmts = statements(&writes, ctx.shards);
    if !in_ids.is_empty() {
        stmts.push(Stmt::Inbox(in_shards, in_ids));
    }
    // A group that writes nothing has no outcome to read back.
    let wrote = !stmts.is_empty();
    if wrote {
        stmts.push(Stmt::Token(&ctx.token));
    }
    if !ctx.spent.is_empty() {
        stmts.push(Stmt::Spent(&ctx.spent));
    }
    for r in join_all(stmts.into_iter().map(|s| exec(&tx, s)).collect()).await {
        r?;
    }
    if let Some(why) = ctx.process_lock.refusal() {
        // Rolled back as the transaction drops: nothing of it is applied.
        return Err(GroupFail::Refused(Fail::stmt(why)));
    }
    *ctx.answer.lock() = Some(results);
    ctx.sent.store(true, Ordering::Release);
    let unknown = match tokio::time::timeout(ctx.commit_wait, tx.commit()).await {
        Ok(Ok(())) => {
            client.give_back();
            return Ok(wrote);
        }
        // The server answered with an error (not a lost session): it rolled the group back,
        // and the session is fine.
        Ok(Err(e)) if e.as_db_error().is_some_and(|d| d.severity() == "ERROR") => {
            client.give_back();
            return Err(GroupFail::Refused(e.into()));
        }
        Ok(Err(e)) => describe(&e),
        Err(_) => format!("no answer within {} s", ctx.commit_wait.as_secs()),
    };
    // Out of the pool (`Taken`'s drop): a connection whose COMMIT is still pending must
    // serve no one else.
    drop(client);
    if !wrote {
        // Nothing to lose either way: refusing it is the truth for every write it holds.
        return Err(GroupFail::Refused(Fail::conn(unknown)));
    }
    Err(GroupFail::Unknown(unknown))
}

impl PgBackend {
    /// A group refused before its COMMIT went out (or by the server's answer to it), as its
    /// writers and the fence see it.
    fn refused(&self, f: &Fail) -> GroupError {
        if f.busy {
            // Never sent: a plain failed write, not a lost connection (apply_fenced drops no
            // shard for it).
            return GroupError {
                error: self.error("commit", &f.why),
                outcome: Outcome::NotApplied,
            };
        }
        GroupError {
            error: self.fail("commit", f),
            outcome: if f.conn {
                Outcome::ConnectionLost
            } else {
                Outcome::NotApplied
            },
        }
    }

    /// A fenced group that failed: its shards dropped when its outcome says so
    /// ([`Outcome::drops_shards`]); the error its writers get.
    fn group_failed(
        &self,
        fence: &dyn Fence,
        epochs: &[(u32, u64)],
        failed: GroupError,
    ) -> StoreError {
        if failed.outcome.drops_shards() {
            // The outcome may be unknown: nothing more is written to these shards at their
            // epochs (HA.md "Fence every write").
            let shards: Vec<u32> = epochs.iter().map(|(s, _)| *s).collect();
            tracing::warn!(
                ?shards,
                outcome = ?failed.outcome,
                "a commit group failed without a known outcome; its shards are dropped"
            );
            for (s, e) in epochs {
                fence.outcome_unknown(*s, *e);
            }
        }
        failed.error
    }

    /// `apply` in cluster mode: each job's fence (`fence.rs`); a job on a shard not held is
    /// refused before the transaction, and one the transaction's fence finds taken over is
    /// refused and its shard dropped, the rest of the group tried again. An unknown outcome
    /// drops every shard of the group (re-acquired at a new epoch before the next write).
    fn apply_fenced(
        &self,
        fence: &dyn Fence,
        jobs: Vec<Vec<RawOp>>,
    ) -> Result<Vec<Result<(), Rejected>>, StoreError> {
        let refused = |shard: u32| Rejected {
            tree: TreeId::Specs,
            key: Vec::new(),
            lost_shard: Some(shard),
        };
        let mut out: Vec<Option<Result<(), Rejected>>> = jobs.iter().map(|_| None).collect();
        let mut pending: Vec<(usize, Vec<RawOp>, JobFence)> = Vec::new();
        for (i, ops) in jobs.into_iter().enumerate() {
            match job_fence(&ops, self.shards, fence) {
                Ok(f) => pending.push((i, ops, f)),
                Err(shard) => {
                    if let Some(slot) = out.get_mut(i) {
                        *slot = Some(Err(refused(shard)));
                    }
                }
            }
        }
        // Each round commits, fails, or drops at least one shard: at most S + 1 rounds.
        while !pending.is_empty() {
            let mut epochs = std::collections::BTreeMap::new();
            for (_, _, f) in &pending {
                epochs.extend(f.epochs.iter().map(|(s, e)| (*s, *e)));
            }
            let epochs: Vec<(u32, u64)> = epochs.into_iter().collect();
            let (mut idx, mut fences, mut group) = (Vec::new(), Vec::new(), Vec::new());
            for (i, ops, f) in pending.drain(..) {
                idx.push(i);
                fences.push(f);
                group.push(ops);
            }
            let inbox = fences.iter().map(|f| f.inbox.clone()).collect();
            let group_epochs = epochs.clone();
            match self.commit_group(group, epochs, inbox) {
                Ok(Ok(results)) => {
                    for (i, r) in idx.into_iter().zip(results) {
                        if let Some(slot) = out.get_mut(i) {
                            *slot = Some(r);
                        }
                    }
                }
                Ok(Err((lost, jobs))) => {
                    for (s, e) in group_epochs.iter().filter(|(s, _)| lost.contains(s)) {
                        tracing::warn!(
                            shard = s,
                            "fenced: the shard was taken over; its writes are refused"
                        );
                        fence.lost(*s, *e);
                    }
                    for ((i, ops), f) in idx.into_iter().zip(jobs).zip(fences) {
                        match f.epochs.keys().find(|s| lost.contains(s)) {
                            Some(s) => {
                                if let Some(slot) = out.get_mut(i) {
                                    *slot = Some(Err(refused(*s)));
                                }
                            }
                            None => pending.push((i, ops, f)),
                        }
                    }
                }
                Err(failed) => return Err(self.group_failed(fence, &group_epochs, failed)),
            }
        }
        Ok(out.into_iter().map(|r| r.unwrap_or(Ok(()))).collect())
    }

    /// One group's transaction and its answer; `Ok(Err)`: the fence refused it (the shards
    /// taken over, and the jobs back).
    #[allow(clippy::type_complexity, reason = "one private call site")]
    fn commit_group(
        &self,
        jobs: Vec<Vec<RawOp>>,
        fence: Vec<(u32, u64)>,
        inbox: Vec<Vec<(u32, String)>>,
    ) -> Result<Result<Vec<Result<(), Rejected>>, (Vec<u32>, Vec<Vec<RawOp>>)>, GroupError> {
        let token = self.token();
        let spent = std::mem::take(&mut *self.spent.lock());
        let sent = Arc::new(AtomicBool::new(false));
        let answer: Answer = Arc::default();
        let ctx = GroupCtx {
            pool: self.commits.clone(),
            shards: self.shards,
            token: token.clone(),
            spent: spent.clone(),
            sent: sent.clone(),
            answer: answer.clone(),
            commit_wait: self.call_deadline,
            lock_absent: self.fence.is_some(),
            process_lock: self.lock.clone(),
            fence,
            inbox,
        };
        // Reads, writes and COMMIT each get a call's deadline: the whole may take three.
        let r = self.run_for(self.call_deadline * 3, apply_group(ctx, jobs));
        let refused = |f: &Fail| {
            // Not deleted this time: the next group tries again.
            self.spent.lock().extend(spent.iter().cloned());
            self.refused(f)
        };
        match r {
            Some(Ok(wrote)) => {
                self.backoff.lock().succeeded();
                if wrote {
                    self.spent.lock().push(token);
                }
                Ok(Ok(answer.lock().take().unwrap_or_default()))
            }
            Some(Err(GroupFail::Fenced(lost, jobs))) => {
                self.spent.lock().extend(spent.iter().cloned());
                Ok(Err((lost, jobs)))
            }
            Some(Err(GroupFail::Refused(f))) => {
                self.note::<()>(&Some(Err(Fail {
                    why: f.why.clone(),
                    conn: f.conn,
                    busy: f.busy,
                })));
                Err(refused(&f))
            }
            Some(Err(GroupFail::Unknown(why))) => {
                let r = self.read_back(token, answer.lock().take(), &why);
                if r.is_err() {
                    self.spent.lock().extend(spent);
                }
                r.map(Ok)
            }
            None if sent.load(Ordering::Acquire) => {
                let why = "the call's deadline passed";
                let r = self.read_back(token, answer.lock().take(), why);
                if r.is_err() {
                    self.spent.lock().extend(spent);
                }
                r.map(Ok)
            }
            None => {
                let f = Fail::conn("the server did not answer".into());
                self.note::<()>(&Some(Err(Fail::conn(f.why.clone()))));
                Err(refused(&f))
            }
        }
    }
}

impl Backend for PgBackend {
    fn apply(&self, jobs: Vec<Vec<RawOp>>) -> Result<Vec<Result<(), Rejected>>, StoreError> {
        self.gate("commit")?;
        self.write_gate("commit")?;
        if let Some(f) = &self.fence {
            return self.apply_fenced(f.as_ref(), jobs);
        }
        match self
            .commit_group(jobs, Vec::new(), Vec::new())
            .map_err(|f| f.error)?
        {
            Ok(results) => Ok(results),
            // No fence was asked for, so none refuses.
            Err((lost, _)) => Err(self.error(
                "commit",
                &format!("fenced on shards {lost:?} without a fence"),
            )),
        }
    }

    /// `apply` committed already (module doc).
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn shard_rows(&self, tree: TreeId, shard: u32) -> Result<Vec<Kv>, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let pool = self.pool.clone();
        let shard = i32::try_from(shard).unwrap_or(i32::MAX);
        self.run("read a shard", async move {
            let client = pool.get().await?;
            let sql = format!(
                "SELECT key, value FROM {} WHERE shard = $1 ORDER BY key",
                table(tree)
            );
            let st = client.prepare_cached(&sql).await?;
            let rows = client.query(&st, &[&shard]).await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows {
                out.push((r.try_get(0)?, r.try_get(1)?));
            }
            Ok(out)
        })
    }

    /// Fenced like a commit group: only rows of shards whose lease row still has the epoch
    /// held are taken, so a stale owner never takes a new owner's notices. Taken in bounded
    /// batches, in key order (shard, then task id), each in a transaction of its own
    /// ([`PgBackend::take_inbox_batch`]), until one comes back short: a node that takes over a
    /// shard with a huge inbox never deletes it all in one statement (which could outlast the
    /// statement timeout every time, and so never be taken). The ids are kept in the backend
    /// before each `COMMIT` (`inbox_taken`): a call that fails after that point (its deadline
    /// passed with the `COMMIT` committed, its answer lost) hands them out with the next one,
    /// so an id taken out of the inbox is never lost with its row. An id may come back twice
    /// (the `COMMIT` did not commit, and its row is taken again): loading a task twice is a
    /// no-op.
    fn take_inbox(&self) -> Result<Vec<String>, StoreError> {
        let Some(fence) = &self.fence else {
            return Ok(Vec::new());
        };
        for _ in 0..INBOX_BATCHES {
            // Asked again for each batch: a shard let go meanwhile is taken from no more.
            let held = fence.held();
            if held.is_empty() || !self.take_inbox_batch(held)? {
                break;
            }
        }
        Ok(std::mem::take(&mut *self.inbox_taken.lock()))
    }

    fn failing(&self) -> Option<String> {
        if let Some(why) = self.outage.lock().clone() {
            return Some(why);
        }
        if let Err(e) = self.mode_gate() {
            return Some(e.to_string());
        }
        self.lock
            .refusal()
            .map(|why| format!("postgres {}: {why}", self.shown))
    }

    /// The `alive` row of `herald_meta` (single-node mode only: the engine stamps no other).
    fn last_alive(&self) -> Result<Option<u64>, StoreError> {
        let pool = self.pool.clone();
        self.run("read", async move {
            let client = pool.get().await?;
            let sql = "SELECT value FROM herald_meta WHERE name = 'alive'";
            let row = client.query_opt(sql, &[]).await?;
            let value: Option<String> = row.map(|r| r.try_get(0)).transpose()?;
            Ok(value.and_then(|v| v.parse().ok()))
        })
    }

    fn stamp_alive(&self, ms: u64) -> Result<(), StoreError> {
        self.write_gate("life sign")?;
        let pool = self.pool.clone();
        self.run("life sign", async move {
            let client = pool.get().await?;
            let sql = "INSERT INTO herald_meta (name, value) VALUES ('alive', $1) \
                 ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value";
            client.execute(sql, &[&ms.to_string()]).await?;
            Ok(())
        })
    }

    /// Every read is a round trip, up to the statement timeout when the server stalls.
    fn reads_block(&self) -> bool {
        true
    }

    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let pool = self.pool.clone();
        let key = key.to_vec();
        self.run("read", async move {
            let client = pool.get().await?;
            let sql = format!("SELECT value FROM {} WHERE key = $1", table(tree));
            let st = client.prepare_cached(&sql).await?;
            match client.query_opt(&st, &[&key]).await? {
                Some(row) => Ok(Some(row.try_get(0)?)),
                None => Ok(None),
            }
        })
    }

    fn scan<'a>(&'a self, tree: TreeId, start: &[u8], prefix: Option<&[u8]>) -> KvIter<'a> {
        let lower = match prefix {
            Some(p) if p > start => p.to_vec(),
            _ => start.to_vec(),
        };
        Box::new(PgScan {
            backend: self,
            tree,
            lower: Bound::Included(lower),
            end: prefix.and_then(prefix_end),
            buf: VecDeque::new(),
            page: PAGE_FIRST,
            done: false,
        })
    }

    fn last_with_prefix(&self, tree: TreeId, prefix: &[u8]) -> Result<Option<Kv>, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let pool = self.pool.clone();
        let prefix = prefix.to_vec();
        let end = prefix_end(&prefix);
        self.run("read", async move {
            let client = pool.get().await?;
            let row = match &end {
                Some(end) => {
                    let sql = format!(
                        "SELECT key, value FROM {} WHERE key >= $1 AND key < $2 ORDER BY key DESC LIMIT 1",
                        table(tree)
                    );
                    let st = client.prepare_cached(&sql).await?;
                    client.query_opt(&st, &[&prefix, end]).await?
                }
                None => {
                    let sql = format!(
                        "SELECT key, value FROM {} WHERE key >= $1 ORDER BY key DESC LIMIT 1",
                        table(tree)
                    );
                    let st = client.prepare_cached(&sql).await?;
                    client.query_opt(&st, &[&prefix]).await?
                }
            };
            match row {
                Some(row) => Ok(Some((row.try_get(0)?, row.try_get(1)?))),
                None => Ok(None),
            }
        })
    }

    /// One REPEATABLE READ, read-only transaction: every read sees one snapshot.
    fn get_atomic(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let pool = self.pool.clone();
        let keys = keys.to_vec();
        self.run("read", async move {
            let mut by_tree: [Vec<Vec<u8>>; TREES] = Default::default();
            for (t, k) in &keys {
                t.of_mut(&mut by_tree).push(k.clone());
            }
            let mut client = pool.get().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await?;
            let stored = read_keys(&tx, &by_tree).await?;
            tx.commit().await?;
            Ok(keys
                .iter()
                .map(|(t, k)| t.of(&stored).get(k).cloned())
                .collect())
        })
    }

    /// One statement per tree (`key = ANY($1)`), pipelined on one connection: one round
    /// trip for all the keys, outside any transaction (no snapshot is promised).
    fn get_many(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let pool = self.pool.clone();
        let keys = keys.to_vec();
        self.run("read", async move {
            let mut by_tree: [Vec<Vec<u8>>; TREES] = Default::default();
            for (t, k) in &keys {
                t.of_mut(&mut by_tree).push(k.clone());
            }
            let client = pool.get().await?;
            let stored = read_keys(&client, &by_tree).await?;
            Ok(keys
                .iter()
                .map(|(t, k)| t.of(&stored).get(k).cloned())
                .collect())
        })
    }

    fn read_round_trips(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// One statement for every prefix: per prefix, its first and its last key by two
    /// correlated `LIMIT 1` range reads of the primary key (each walks the B-tree from one end
    /// of the range), in one round trip. A prefix without an end (all `0xFF`, never a task's)
    /// is asked on its own.
    #[allow(
        clippy::type_complexity,
        reason = "per prefix: its first key and its last key, spelled out"
    )]
    fn prefix_bounds_many(
        &self,
        tree: TreeId,
        prefixes: &[Vec<u8>],
    ) -> Result<Vec<Option<(Vec<u8>, Vec<u8>)>>, StoreError> {
        let Some(ends) = prefixes
            .iter()
            .map(|p| prefix_end(p))
            .collect::<Option<Vec<Vec<u8>>>>()
        else {
            let mut out = Vec::with_capacity(prefixes.len());
            for p in prefixes {
                let first = self.scan(tree, p, Some(p)).next().transpose()?;
                let last = self.last_with_prefix(tree, p)?;
                out.push(first.map(|(k, _)| k).zip(last.map(|(k, _)| k)));
            }
            return Ok(out);
        };
        if prefixes.is_empty() {
            return Ok(Vec::new());
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let pool = self.pool.clone();
        let los = prefixes.to_vec();
        let sql = format!(
            "SELECT (SELECT key FROM {t} WHERE key >= p.lo AND key < p.hi ORDER BY key LIMIT 1), \
             (SELECT key FROM {t} WHERE key >= p.lo AND key < p.hi ORDER BY key DESC LIMIT 1) \
             FROM unnest($1::bytea[], $2::bytea[]) WITH ORDINALITY AS p(lo, hi, n) ORDER BY p.n",
            t = table(tree)
        );
        let rows = self.run("read", async move {
            let client = pool.get().await?;
            let st = client.prepare_cached(&sql).await?;
            let rows = client.query(&st, &[&los, &ends]).await?;
            rows.iter()
                .map(|r| {
                    let first: Option<Vec<u8>> = r.try_get(0)?;
                    let last: Option<Vec<u8>> = r.try_get(1)?;
                    Ok(first.zip(last))
                })
                .collect::<Result<Vec<_>, Fail>>()
        })?;
        if rows.len() != prefixes.len() {
            return Err(self.error(
                "read",
                &format!("{} rows for {} prefixes", rows.len(), prefixes.len()),
            ));
        }
        Ok(rows)
    }
}

/// The statement of one page of a scan: a range of the primary key, in key order, so the
/// server walks the key's B-tree from `$1` and stops after `$2` rows (`$3`: the prefix's end),
/// never the whole table (`tests/pg_backend.rs` checks the plan with `EXPLAIN`).
pub fn scan_sql(tree: TreeId, inclusive: bool, bounded: bool) -> String {
    let op = if inclusive { ">=" } else { ">" };
    let upper = if bounded { " AND key < $3" } else { "" };
    format!(
        "SELECT key, value FROM {} WHERE key {op} $1{upper} ORDER BY key LIMIT $2",
        table(tree)
    )
}

/// A forward scan fetched a page at a time, each page a range query on the primary key.
struct PgScan<'a> {
    backend: &'a PgBackend,
    tree: TreeId,
    /// Everything below this was returned.
    lower: Bound<Vec<u8>>,
    /// Keys stop before this (a prefix's end).
    end: Option<Vec<u8>>,
    buf: VecDeque<Kv>,
    page: i64,
    /// No more pages (the last was short, or a page failed).
    done: bool,
}

impl PgScan<'_> {
    fn fetch(&mut self) -> Result<(), StoreError> {
        let (from, inclusive) = match &self.lower {
            Bound::Included(k) => (k.clone(), true),
            Bound::Excluded(k) => (k.clone(), false),
            Bound::Unbounded => (Vec::new(), true),
        };
        let pool = self.backend.pool.clone();
        let tree = self.tree;
        let end = self.end.clone();
        let limit = self.page;
        self.backend.reads.fetch_add(1, Ordering::Relaxed);
        let rows: Vec<Kv> = self.backend.run("scan", async move {
            let client = pool.get().await?;
            let sql = scan_sql(tree, inclusive, end.is_some());
            let st = client.prepare_cached(&sql).await?;
            let rows = match &end {
                Some(end) => client.query(&st, &[&from, &limit, end]).await?,
                None => client.query(&st, &[&from, &limit]).await?,
            };
            rows.iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect::<Result<Vec<Kv>, Fail>>()
        })?;
        if (rows.len() as i64) < limit {
            self.done = true;
        }
        if let Some((k, _)) = rows.last() {
            self.lower = Bound::Excluded(k.clone());
        }
        self.page = (self.page * 2).min(PAGE_MAX);
        self.buf.extend(rows);
        Ok(())
    }
}

impl Iterator for PgScan<'_> {
    type Item = Result<Kv, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() && !self.done {
            if let Err(e) = self.fetch() {
                self.done = true;
                return Some(Err(e));
            }
        }
        self.buf.pop_front().map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::Outcome;

    /// Only a group known to have applied nothing leaves its shards trusted; one whose
    /// outcome is unknown (review finding: it was reported as a plain write error and kept
    /// them) or whose connection was lost drops them.
    #[test]
    fn only_a_group_known_not_applied_keeps_its_shards() {
        assert!(!Outcome::NotApplied.drops_shards());
        assert!(Outcome::ConnectionLost.drops_shards());
        assert!(Outcome::Unknown.drops_shards());
    }

    /// A tree's rows are cut into upserts of at most the bound's bytes of values (PostgreSQL
    /// refuses an array of more than ~1 GB; a group may hold 2 GiB), each with at least one
    /// row, in key order, every row once; deletes stay one statement.
    #[test]
    fn a_trees_rows_go_in_statements_within_the_bound() {
        use super::{statements_within, Stmt, TreeId, Writes};
        let mut w: Writes = Default::default();
        let specs = TreeId::Specs.of_mut(&mut w);
        for (i, n) in [40usize, 40, 30, 100, 10].into_iter().enumerate() {
            specs.insert(vec![i as u8], Some(vec![0; n]));
        }
        specs.insert(vec![9], None);
        let got: Vec<(Vec<u8>, usize)> = statements_within(&w, 1, 80)
            .iter()
            .filter_map(|s| match s {
                Stmt::Upsert(_, _, keys, values) => Some((
                    keys.iter().map(|k| k[0]).collect(),
                    values.iter().map(|v| v.len()).sum(),
                )),
                _ => None,
            })
            .collect();
        assert_eq!(
            got,
            [
                (vec![0, 1], 80),
                (vec![2], 30),
                (vec![3], 100),
                (vec![4], 10)
            ]
        );
        let deletes = statements_within(&w, 1, 80)
            .iter()
            .filter(|s| matches!(s, Stmt::Delete(..)))
            .count();
        assert_eq!(deletes, 1);
    }
}

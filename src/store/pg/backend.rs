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
//! (`on`, its default: flushed to its WAL; with synchronous replicas: on them too). A `COMMIT`
//! whose answer never came (the connection dropped, the deadline passed) is an error, never a
//! success: the group may or may not be in the database, and the caller must not say it is.
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
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{IsolationLevel, NoTls};

use super::resolve::{reads_needed, resolve, Stored, Writes};
use super::schema::{self, table, SchemaError, DEFAULT_SHARDS, SCHEMA_VERSION};
use super::shard::shard_of;
use super::{prefix_end, redact};
use crate::store::backend::{Backend, Kv, KvIter, RawOp, Rejected, TreeId, TREES};
use crate::store::StoreError;

/// How herald reaches its database.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// Connections in the pool.
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
}

impl Default for PgOptions {
    fn default() -> PgOptions {
        PgOptions {
            pool_size: 8,
            statement_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            shards: DEFAULT_SHARDS,
            password: None,
        }
    }
}

/// How much longer than the statement timeout a call waits before it fails by itself: the
/// server's own cancel, and its answer, come first when the server is there at all.
const CALL_MARGIN: Duration = Duration::from_secs(5);
/// Rows a scan fetches first, and at most per page (pages grow: most scans stop early).
const PAGE_FIRST: i64 = 64;
const PAGE_MAX: i64 = 1024;

pub struct PgBackend {
    /// `None` only while dropping.
    rt: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    pool: Pool,
    shards: u32,
    /// The URL without its password, for messages.
    shown: Arc<str>,
    call_deadline: Duration,
}

/// A failure inside the runtime, before it gets its context.
struct Fail(String);

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Fail {
        Fail(describe(&e))
    }
}

impl From<deadpool_postgres::PoolError> for Fail {
    fn from(e: deadpool_postgres::PoolError) -> Fail {
        match e {
            deadpool_postgres::PoolError::Backend(e) => Fail(describe(&e)),
            e => Fail(format!("no database connection: {e}")),
        }
    }
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

impl PgBackend {
    /// Connects to `url`, creates or migrates herald's schema, and answers the backend. A
    /// malformed URL, an unreachable server, bad credentials, a missing database or a newer
    /// schema are errors naming the URL without its password.
    pub fn open(url: &str, opts: &PgOptions) -> Result<PgBackend, StoreError> {
        let shown: Arc<str> = redact(url).into();
        let refused = |what: String| StoreError::Database(format!("postgres {shown}: {what}"));
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
        cfg.application_name("herald")
            .connect_timeout(opts.connect_timeout)
            .options(format!("-c statement_timeout={statement_ms}"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("herald-pg")
            .enable_all()
            .build()?;
        let mgr = Manager::from_config(
            cfg.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(opts.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(opts.connect_timeout))
            .create_timeout(Some(opts.connect_timeout))
            .recycle_timeout(Some(opts.connect_timeout))
            .build()
            .map_err(|e| refused(format!("cannot make a connection pool: {e}")))?;
        let mut backend = PgBackend {
            handle: rt.handle().clone(),
            rt: Some(rt),
            pool,
            shards: opts.shards,
            shown: shown.clone(),
            call_deadline: opts.statement_timeout + CALL_MARGIN,
        };
        let shards = opts.shards;
        let migrated = backend.run_raw(async move {
            // Its own connection, not the pool's: the first error (no server, bad password,
            // no database) is then reported as the server said it.
            let (mut client, conn) = cfg.connect(NoTls).await.map_err(|e| {
                SchemaError::Bad(format!("cannot connect: {}; check that the server runs and the URL's user, password and database exist", describe(&e)))
            })?;
            let conn = tokio::spawn(conn);
            let r = schema::migrate(&mut client, shards).await;
            drop(client);
            let _ = conn.await;
            r
        });
        backend.shards = match migrated {
            Some(Ok(s)) => s,
            Some(Err(SchemaError::Newer { found })) => {
                return Err(refused(format!(
                    "the database holds herald schema version {found}, newer than this build's {SCHEMA_VERSION}; run the herald release that wrote it (or a newer one)"
                )))
            }
            Some(Err(SchemaError::Bad(why))) => return Err(refused(why)),
            Some(Err(SchemaError::Db(e))) => {
                return Err(refused(format!("creating herald's schema failed: {}", describe(&e))))
            }
            None => return Err(refused("the server did not answer in time".into())),
        };
        Ok(backend)
    }

    /// S: how many shards the schema has.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// Runs `f` on the backend's runtime and waits for it; `None` when the deadline passed.
    fn run_raw<T: Send + 'static>(&self, f: impl Future<Output = T> + Send + 'static) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let deadline = self.call_deadline;
        self.handle.spawn(async move {
            let _ = tx.send(tokio::time::timeout(deadline, f).await.ok());
        });
        rx.recv().ok().flatten()
    }

    /// [`Self::run_raw`] for database work: failures become storage errors naming the store.
    fn run<T: Send + 'static>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, Fail>> + Send + 'static,
    ) -> Result<T, StoreError> {
        match self.run_raw(f) {
            Some(Ok(v)) => Ok(v),
            Some(Err(Fail(why))) => Err(StoreError::Write(format!(
                "postgres {}: {what}: {why}",
                self.shown
            ))),
            None => Err(StoreError::Write(format!(
                "postgres {}: {what}: no answer within {} s",
                self.shown,
                self.call_deadline.as_secs()
            ))),
        }
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
    })
}

/// Per tree, the rows of `keys` (a query per tree with keys, all pipelined).
async fn read_keys(
    tx: &deadpool_postgres::Transaction<'_>,
    keys: &[Vec<Vec<u8>>; TREES],
) -> Result<Stored, Fail> {
    let reads = TreeId::ALL
        .iter()
        .filter(|t| !keys[**t as usize].is_empty())
        .map(|t| async move {
            let sql = format!(
                "SELECT key, value FROM {} WHERE key = ANY($1::bytea[])",
                table(*t)
            );
            let st = tx.prepare_cached(&sql).await?;
            let rows = tx.query(&st, &[&keys[*t as usize]]).await?;
            Ok::<_, Fail>((*t, rows))
        })
        .collect();
    let mut stored: Stored = Default::default();
    for r in join_all(reads).await {
        let (t, rows) = r?;
        for row in rows {
            stored[t as usize].insert(row.try_get(0)?, row.try_get(1)?);
        }
    }
    Ok(stored)
}

/// The statements that write `writes`: per tree one upsert and one delete.
fn statements(writes: &Writes, shards: u32) -> Vec<Stmt<'_>> {
    let mut out = Vec::new();
    for t in TreeId::ALL {
        let (mut sh, mut keys, mut values, mut dels) = (vec![], vec![], vec![], vec![]);
        for (k, v) in &writes[t as usize] {
            match v {
                Some(v) => {
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

async fn apply_group(
    pool: Pool,
    shards: u32,
    jobs: Vec<Vec<RawOp>>,
) -> Result<Vec<Result<(), Rejected>>, Fail> {
    let needed = reads_needed(&jobs);
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let stored = if needed.iter().any(|k| !k.is_empty()) {
        read_keys(&tx, &needed).await?
    } else {
        Stored::default()
    };
    let (results, writes) = resolve(jobs, &stored);
    for r in join_all(
        statements(&writes, shards)
            .into_iter()
            .map(|s| exec(&tx, s))
            .collect(),
    )
    .await
    {
        r?;
    }
    tx.commit().await.map_err(|e| {
        Fail(format!(
            "COMMIT got no confirmation, so the group may or may not be stored: {}",
            describe(&e)
        ))
    })?;
    Ok(results)
}

impl Backend for PgBackend {
    fn apply(&self, jobs: Vec<Vec<RawOp>>) -> Result<Vec<Result<(), Rejected>>, StoreError> {
        let pool = self.pool.clone();
        let shards = self.shards;
        self.run("commit", apply_group(pool, shards, jobs))
    }

    /// `apply` committed already (module doc).
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
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
        let pool = self.pool.clone();
        let keys = keys.to_vec();
        self.run("read", async move {
            let mut by_tree: [Vec<Vec<u8>>; TREES] = Default::default();
            for (t, k) in &keys {
                by_tree[*t as usize].push(k.clone());
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
                .map(|(t, k)| stored[*t as usize].get(k).cloned())
                .collect())
        })
    }
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
        let rows: Vec<Kv> = self.backend.run("scan", async move {
            let client = pool.get().await?;
            let op = if inclusive { ">=" } else { ">" };
            let upper = if end.is_some() { " AND key < $3" } else { "" };
            let sql = format!(
                "SELECT key, value FROM {} WHERE key {op} $1{upper} ORDER BY key LIMIT $2",
                table(tree)
            );
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

//! herald's tables on PostgreSQL, created at start and migrated by version in one
//! transaction. `herald_meta` holds `schema_version` and `shards` (S, fixed when the schema is
//! first created). A database whose schema is newer than this build is refused: an older
//! binary must not write rows whose meaning it does not know.

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::store::backend::TreeId;

/// The schema this build writes. Each version's statements are in [`MIGRATIONS`].
pub const SCHEMA_VERSION: i32 = 8;
/// The oldest schema this build reads as it is, with no statement: 7 (schema 8 only moved the
/// number). An open that must not change the schema (an export) takes it.
pub const SCHEMA_READ_AS_IS: i32 = 7;
/// S for a schema created without another choice (HA.md).
pub const DEFAULT_SHARDS: u32 = 64;
/// Most shards a schema may have: S goes into an `int` column.
pub const MAX_SHARDS: u32 = 1 << 16;
/// Serialises the migrations of processes that start at once on one database (an arbitrary
/// constant; "herald" in ASCII).
const MIGRATION_LOCK: i64 = 0x6865_7261_6c64;

/// The table of a tree.
pub fn table(tree: TreeId) -> String {
    format!("herald_{}", tree.name())
}

/// The statements that take a schema from version `n - 1` to `n` (`MIGRATIONS[n - 1]`).
/// `shards` is S for a schema being created.
fn migration(version: i32, shards: u32) -> Vec<String> {
    match version {
        1 => {
            let mut s = Vec::new();
            for t in TreeId::ALL.into_iter().filter(|t| *t != TreeId::Timeline) {
                // `shard` is the task's (shard.rs): issue 24 fences writes and loads a shard's
                // tasks by it, so it is here from the first version.
                s.push(format!(
                    "CREATE TABLE {} (shard int NOT NULL, key bytea PRIMARY KEY, value bytea NOT NULL)",
                    table(t)
                ));
            }
            // A node taking a shard over loads its live tasks in start-up order.
            for t in [TreeId::Live, TreeId::Due] {
                s.push(format!(
                    "CREATE INDEX {0}_by_shard ON {0} (shard, key)",
                    table(t)
                ));
            }
            s.push(
                "CREATE TABLE herald_shard (shard_id int PRIMARY KEY, epoch bigint NOT NULL DEFAULT 0, \
                 owner_node text, owner_incarnation text, lease_expires timestamptz)"
                    .into(),
            );
            s.push(format!(
                "INSERT INTO herald_meta (name, value) VALUES ('shards', '{shards}')"
            ));
            s.push(format!(
                "INSERT INTO herald_shard (shard_id) SELECT generate_series(0, {})",
                shards - 1
            ));
            s
        }
        // A commit group's token (`backend.rs`): a group inserts its own, so a group whose
        // COMMIT got no answer is read back by its token, and a read-back that inserts the
        // token first keeps that group from ever committing.
        2 => vec![
            "CREATE TABLE IF NOT EXISTS herald_commit (token bytea PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"
                .into(),
        ],
        // Issue 25: a task's timeline events (`store/timeline.rs`), a tree like the others.
        3 => vec![format!(
            "CREATE TABLE IF NOT EXISTS {} (shard int NOT NULL, key bytea PRIMARY KEY, value bytea NOT NULL)",
            table(TreeId::Timeline)
        )],
        // Issue 24: the cluster's nodes, one row per process (incarnation) while it lives
        // (`cluster/rows.rs`): who counts toward `ceil(S / nodes)`, and where to forward to.
        4 => vec![
            "CREATE TABLE IF NOT EXISTS herald_node (incarnation text PRIMARY KEY, \
             node_id text NOT NULL, advertise text, expires timestamptz NOT NULL)"
                .into(),
        ],
        // Issue 24: tasks created on a node that does not hold their shard, for the owner
        // to load (`store/pg/fence.rs`, `engine/cluster.rs`).
        5 => vec![
            "CREATE TABLE IF NOT EXISTS herald_inbox (shard int NOT NULL, task_id text NOT NULL, \
             PRIMARY KEY (shard, task_id))"
                .into(),
        ],
        // `GET /v1/cluster` (API.md "Cluster mode"): each node's last heartbeat (database
        // time) and its last measured clock offset (database minus node).
        7 => vec![
            "ALTER TABLE herald_node ADD COLUMN IF NOT EXISTS heartbeat_at timestamptz, \
             ADD COLUMN IF NOT EXISTS clock_offset_ms bigint"
                .into(),
        ],
        // 8: no statement. Records may now be progress version 3 and run version 2
        // (recipient time's slot walls, `store/records/`), which a build of schema 7 cannot
        // read: the number moves so that such a build refuses the database instead of
        // skipping those rows as damaged.
        _ => Vec::new(),
    }
}

/// Live rows folded per round of the migration to version 6: each round is a few statements
/// that take well under a second, so no single statement runs long however many tasks there
/// are, and memory holds one round's rows, not the table's.
const FOLD_BATCH: i64 = 5_000;
/// The longest silence between two progress lines of a long migration.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Version 6 (issue 29, the sled data directory's format 7): every `herald_live` row folded
/// into its task's progress record (`store/migrate.rs`), in the migration's transaction, so
/// nodes starting together never see a half-migrated schema. The table stays, empty.
///
/// In rounds of [`FOLD_BATCH`] rows in key order, each statement bounded by `step` on the
/// client (the server's `statement_timeout` is off for the migration, [`migrate`]); progress
/// is logged. A million tasks take about a minute, where one statement over them all ran past
/// the statement timeout and rolled back on every start.
async fn fold_live_rows(
    tx: &tokio_postgres::Transaction<'_>,
    step: Duration,
) -> Result<(), SchemaError> {
    let started = Instant::now();
    let total: i64 = bounded(step, tx.query_one("SELECT count(*) FROM herald_live", &[]))
        .await?
        .try_get(0)?;
    if total > 0 {
        tracing::info!(
            tasks = total,
            "schema 5 -> 6: folding herald_live into progress records"
        );
    }
    let (mut after, mut done, mut logged) = (Vec::<u8>::new(), 0usize, Instant::now());
    loop {
        let rows = bounded(
            step,
            tx.query(
                "SELECT l.shard, l.key, l.value, s.value, p.value FROM herald_live l \
                 LEFT JOIN herald_specs s ON s.key = l.key LEFT JOIN herald_progress p ON p.key = l.key \
                 WHERE l.key > $1 ORDER BY l.key LIMIT $2",
                &[&after, &FOLD_BATCH],
            ),
        )
        .await?;
        let Some(last) = rows.last() else {
            break;
        };
        after = last.try_get(1)?;
        fold_round(tx, &rows, step).await?;
        done += rows.len();
        if logged.elapsed() >= PROGRESS_EVERY {
            logged = Instant::now();
            tracing::info!(done, of = total, "schema 5 -> 6: folding herald_live");
        }
        if (rows.len() as i64) < FOLD_BATCH {
            break;
        }
    }
    bounded(step, tx.execute("DELETE FROM herald_live", &[])).await?;
    if done > 0 {
        tracing::info!(
            tasks = done,
            secs = started.elapsed().as_secs(),
            "folded herald_live into progress records (schema 5 -> 6)"
        );
    }
    Ok(())
}

/// One round of [`fold_live_rows`]: its rows' progress and due entries written, their live
/// rows and old due entries deleted.
async fn fold_round(
    tx: &tokio_postgres::Transaction<'_>,
    rows: &[tokio_postgres::Row],
    step: Duration,
) -> Result<(), SchemaError> {
    use crate::store::migrate::fold;
    let (mut shards, mut keys, mut values, mut live_keys) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut due_shards, mut due_keys, mut due_values, mut old_due) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for row in rows {
        let shard: i32 = row.try_get(0)?;
        let id: Vec<u8> = row.try_get(1)?;
        let live: Vec<u8> = row.try_get(2)?;
        let spec: Option<Vec<u8>> = row.try_get(3)?;
        let progress: Option<Vec<u8>> = row.try_get(4)?;
        match fold(&id, &live, spec.as_deref(), progress.as_deref()) {
            Ok(Some(f)) => {
                old_due.push(crate::store::records::due_key(&id, &live));
                shards.push(shard);
                keys.push(id.clone());
                values.push(f.progress);
                due_shards.push(shard);
                due_keys.push(f.due.0);
                due_values.push(f.due.1);
            }
            Ok(None) => old_due.push(crate::store::records::due_key(&id, &live)),
            // Its due entry stays: start-up reports the task unreadable, as before.
            Err(e) => tracing::error!(error = %e, "a task's records do not decode; not migrated"),
        }
        live_keys.push(id);
    }
    bounded(
        step,
        tx.execute("DELETE FROM herald_due WHERE key = ANY($1)", &[&old_due]),
    )
    .await?;
    bounded(
        step,
        tx.execute(
        "INSERT INTO herald_progress (shard, key, value) SELECT * FROM unnest($1::int[], $2::bytea[], $3::bytea[]) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, shard = EXCLUDED.shard",
        &[&shards, &keys, &values],
    ),
    )
    .await?;
    bounded(
        step,
        tx.execute(
        "INSERT INTO herald_due (shard, key, value) SELECT * FROM unnest($1::int[], $2::bytea[], $3::bytea[]) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, shard = EXCLUDED.shard",
        &[&due_shards, &due_keys, &due_values],
    ),
    )
    .await?;
    bounded(
        step,
        tx.execute("DELETE FROM herald_live WHERE key = ANY($1)", &[&live_keys]),
    )
    .await?;
    Ok(())
}

/// `f`, given up on after `step`: the migration's own bound on each statement (module doc of
/// [`migrate`]).
async fn bounded<T>(
    step: Duration,
    f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, SchemaError> {
    match tokio::time::timeout(step, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(SchemaError::Bad(format!(
            "a statement of the schema migration got no answer within {} s",
            step.as_secs()
        ))),
    }
}

/// Why the schema cannot be used, as one line for the operator.
#[derive(Debug)]
pub enum SchemaError {
    Newer { found: i32 },
    Bad(String),
    Db(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for SchemaError {
    fn from(e: tokio_postgres::Error) -> SchemaError {
        SchemaError::Db(e)
    }
}

/// How often a process waiting for another's migration says so.
const LOCK_WAIT_LOG: Duration = Duration::from_secs(10);

/// Creates or migrates herald's schema in one transaction; answers S.
///
/// Not bounded by the server's `statement_timeout` (off in the migration's transaction, as
/// is `idle_in_transaction_session_timeout`: folding a large table runs longer than a call's
/// deadline, and rolled back on every start) nor by one deadline for the whole: each statement
/// gets `step` on the client instead, so a server that stops answering still fails start-up.
/// A process that finds another migrating waits for it, however long, and says so.
pub async fn migrate(client: &mut Client, shards: u32, step: Duration) -> Result<u32, SchemaError> {
    if shards == 0 || shards > MAX_SHARDS {
        return Err(SchemaError::Bad(format!(
            "shards must be between 1 and {MAX_SHARDS}, not {shards}"
        )));
    }
    let tx = bounded(step, client.transaction()).await?;
    let off = "SET LOCAL statement_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 0";
    bounded(step, tx.batch_execute(off)).await?;
    // Work may take as long as it takes; a wait for another session's table lock may not (a
    // review finding: an ALTER queued behind an open transaction hung start-up for good, and
    // its queued lock held every other query on the table meanwhile): refused by the server
    // after [`LOCK_WAIT_MAX`], well before the client's own bound and a cluster lease.
    let locks = format!("SET LOCAL lock_timeout = {}", lock_wait(step).as_millis());
    bounded(step, tx.batch_execute(&locks)).await?;
    wait_for_migration_lock(&tx, step).await?;
    bounded(
        step,
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS herald_meta (name text PRIMARY KEY, value text NOT NULL)",
        ),
    )
    .await?;
    let found = stored_version(&tx, step).await?;
    if found > SCHEMA_VERSION {
        return Err(SchemaError::Newer { found });
    }
    for v in found + 1..=SCHEMA_VERSION {
        for stmt in migration(v, shards) {
            bounded(step, tx.batch_execute(&stmt)).await?;
        }
        // A schema made just now has no rows to fold (nor a scan to spend on them).
        if v == 6 && found > 0 {
            fold_live_rows(&tx, step).await?;
        }
    }
    bounded(
        step,
        tx.execute(
            "INSERT INTO herald_meta (name, value) VALUES ('schema_version', $1) \
         ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
            &[&SCHEMA_VERSION.to_string()],
        ),
    )
    .await?;
    let stored = stored_shards(&tx, step).await?;
    bounded(step, tx.commit()).await?;
    Ok(stored)
}

/// The longest a migration's statement waits for another session's lock on a table.
pub const LOCK_WAIT_MAX: Duration = Duration::from_secs(5);

/// [`LOCK_WAIT_MAX`], or half the client's bound when that is shorter.
fn lock_wait(step: Duration) -> Duration {
    LOCK_WAIT_MAX.min(step / 2).max(Duration::from_millis(1))
}

/// An open that must not change the schema (an export, which takes no process lock: a newer
/// build's export upgraded the tables under the herald serving them, which then refused to
/// start again, a review finding): the schema must be this build's, or one it reads as it is
/// ([`SCHEMA_READ_AS_IS`]: an export writes nothing, so schema 7 stays 7 for the herald that
/// serves it). S, as [`migrate`] answers.
pub async fn check_current(client: &mut Client, step: Duration) -> Result<u32, SchemaError> {
    let tx = bounded(step, client.transaction()).await?;
    let q = tx.query_one("SELECT to_regclass('herald_meta') IS NOT NULL", &[]);
    if !bounded(step, q).await?.try_get::<_, bool>(0)? {
        return Err(SchemaError::Bad(
            "the database holds no herald schema".into(),
        ));
    }
    let found = stored_version(&tx, step).await?;
    if found > SCHEMA_VERSION {
        return Err(SchemaError::Newer { found });
    }
    if found < SCHEMA_READ_AS_IS {
        return Err(SchemaError::Bad(format!(
            "the database holds herald schema version {found}, older than this build's {SCHEMA_VERSION}; an export does not upgrade it: export with the herald release that serves it, or start this build's herald serve on it first"
        )));
    }
    stored_shards(&tx, step).await
}

/// S as `herald_meta` holds it.
async fn stored_shards(
    tx: &tokio_postgres::Transaction<'_>,
    step: Duration,
) -> Result<u32, SchemaError> {
    let shards_row = tx.query_opt("SELECT value FROM herald_meta WHERE name = 'shards'", &[]);
    let row = bounded(step, shards_row)
        .await?
        .ok_or_else(|| SchemaError::Bad("herald_meta has no shards row".into()))?;
    let s: String = row.try_get(0)?;
    s.parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_SHARDS).contains(n))
        .ok_or_else(|| SchemaError::Bad(format!("herald_meta holds shards {s:?}")))
}

/// The migration lock for the transaction ([`MIGRATION_LOCK`]), waited for as long as another
/// process migrates (its statements are bounded; should it die, its lock goes with it).
async fn wait_for_migration_lock(
    tx: &tokio_postgres::Transaction<'_>,
    step: Duration,
) -> Result<(), SchemaError> {
    let since = Instant::now();
    let mut said = Instant::now();
    loop {
        let row = bounded(
            step,
            tx.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&MIGRATION_LOCK]),
        )
        .await?;
        if row.try_get::<_, bool>(0)? {
            return Ok(());
        }
        if said.elapsed() >= LOCK_WAIT_LOG {
            said = Instant::now();
            tracing::info!(
                secs = since.elapsed().as_secs(),
                "waiting for another herald's schema migration of this database"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The schema version `herald_meta` holds; 0 for none.
async fn stored_version(
    tx: &tokio_postgres::Transaction<'_>,
    step: Duration,
) -> Result<i32, SchemaError> {
    let q = tx.query_opt(
        "SELECT value FROM herald_meta WHERE name = 'schema_version'",
        &[],
    );
    match bounded(step, q).await? {
        Some(row) => {
            let v: String = row.try_get(0)?;
            v.parse::<i32>().map_err(|_| {
                SchemaError::Bad(format!(
                    "herald_meta holds schema_version {v:?}, not a number"
                ))
            })
        }
        None => Ok(0),
    }
}

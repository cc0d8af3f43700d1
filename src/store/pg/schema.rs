//! herald's tables on PostgreSQL, created at start and migrated by version in one
//! transaction. `herald_meta` holds `schema_version` and `shards` (S, fixed when the schema is
//! first created). A database whose schema is newer than this build is refused: an older
//! binary must not write rows whose meaning it does not know.

use tokio_postgres::Client;

use crate::store::backend::TreeId;

/// The schema this build writes. Each version's statements are in [`MIGRATIONS`].
pub const SCHEMA_VERSION: i32 = 7;
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
        _ => Vec::new(),
    }
}

/// Version 6 (issue 29, the sled data directory's format 7): every `herald_live` row folded
/// into its task's progress record (`store/migrate.rs`), in the migration's transaction, so
/// nodes starting together never see a half-migrated schema. The table stays, empty.
async fn fold_live_rows(tx: &tokio_postgres::Transaction<'_>) -> Result<(), SchemaError> {
    use crate::store::migrate::fold;
    let rows = tx
        .query(
            "SELECT l.shard, l.key, l.value, s.value, p.value FROM herald_live l \
             LEFT JOIN herald_specs s ON s.key = l.key LEFT JOIN herald_progress p ON p.key = l.key",
            &[],
        )
        .await?;
    let (mut shards, mut keys, mut values) = (Vec::new(), Vec::new(), Vec::new());
    let (mut due_shards, mut due_keys, mut due_values, mut old_due) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for row in &rows {
        let shard: i32 = row.try_get(0)?;
        let id: Vec<u8> = row.try_get(1)?;
        let live: Vec<u8> = row.try_get(2)?;
        let spec: Option<Vec<u8>> = row.try_get(3)?;
        let progress: Option<Vec<u8>> = row.try_get(4)?;
        old_due.push(crate::store::records::due_key(&id, &live));
        match fold(&id, &live, spec.as_deref(), progress.as_deref()) {
            Ok(Some(f)) => {
                shards.push(shard);
                keys.push(id);
                values.push(f.progress);
                due_shards.push(shard);
                due_keys.push(f.due.0);
                due_values.push(f.due.1);
            }
            Ok(None) => {}
            Err(e) => {
                // Its due entry stays: start-up reports the task unreadable, as before.
                old_due.pop();
                tracing::error!(error = %e, "a task's records do not decode; not migrated");
            }
        }
    }
    tx.execute("DELETE FROM herald_due WHERE key = ANY($1)", &[&old_due])
        .await?;
    tx.execute(
        "INSERT INTO herald_progress (shard, key, value) SELECT * FROM unnest($1::int[], $2::bytea[], $3::bytea[]) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, shard = EXCLUDED.shard",
        &[&shards, &keys, &values],
    )
    .await?;
    tx.execute(
        "INSERT INTO herald_due (shard, key, value) SELECT * FROM unnest($1::int[], $2::bytea[], $3::bytea[]) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, shard = EXCLUDED.shard",
        &[&due_shards, &due_keys, &due_values],
    )
    .await?;
    tx.execute("DELETE FROM herald_live", &[]).await?;
    if !rows.is_empty() {
        tracing::info!(
            tasks = rows.len(),
            "folded herald_live into progress records (schema 5 -> 6)"
        );
    }
    Ok(())
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

/// Creates or migrates herald's schema in one transaction; answers S.
pub async fn migrate(client: &mut Client, shards: u32) -> Result<u32, SchemaError> {
    if shards == 0 || shards > MAX_SHARDS {
        return Err(SchemaError::Bad(format!(
            "shards must be between 1 and {MAX_SHARDS}, not {shards}"
        )));
    }
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS herald_meta (name text PRIMARY KEY, value text NOT NULL)",
    )
    .await?;
    let found = match tx
        .query_opt(
            "SELECT value FROM herald_meta WHERE name = 'schema_version'",
            &[],
        )
        .await?
    {
        Some(row) => {
            let v: String = row.try_get(0)?;
            v.parse::<i32>().map_err(|_| {
                SchemaError::Bad(format!(
                    "herald_meta holds schema_version {v:?}, not a number"
                ))
            })?
        }
        None => 0,
    };
    if found > SCHEMA_VERSION {
        return Err(SchemaError::Newer { found });
    }
    for v in found + 1..=SCHEMA_VERSION {
        for stmt in migration(v, shards) {
            tx.batch_execute(&stmt).await?;
        }
        // A schema made just now has no rows to fold (nor a scan to spend on them).
        if v == 6 && found > 0 {
            fold_live_rows(&tx).await?;
        }
    }
    tx.execute(
        "INSERT INTO herald_meta (name, value) VALUES ('schema_version', $1) \
         ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
        &[&SCHEMA_VERSION.to_string()],
    )
    .await?;
    let row = tx
        .query_opt("SELECT value FROM herald_meta WHERE name = 'shards'", &[])
        .await?
        .ok_or_else(|| SchemaError::Bad("herald_meta has no shards row".into()))?;
    let s: String = row.try_get(0)?;
    let stored = s
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_SHARDS).contains(n))
        .ok_or_else(|| SchemaError::Bad(format!("herald_meta holds shards {s:?}")))?;
    tx.commit().await?;
    Ok(stored)
}

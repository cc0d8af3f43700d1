//! The lease rows on PostgreSQL (HA.md "Lease rows", "Fence every write"): the statements that
//! acquire, renew, release and fence shards in `herald_shard`, and read the database's clock.
//! Every instant here is the database's `now()`; how long *this process* may trust what it
//! was granted is `lease.rs`'s business (on the monotonic clock, from when the statement was
//! sent).
//!
//! Row protocol (the invariants the cluster's safety rests on):
//! - A grant bumps `epoch`: every owner of a shard has an epoch no earlier owner had. Only a
//!   free row (never owned, released) or an expired one is granted, and the takeover locks it
//!   `FOR UPDATE SKIP LOCKED` first: a row a fenced commit group holds `FOR KEY SHARE` (or
//!   another node is taking right now) is left for a later round, never waited for, so a
//!   stale owner's group commits before the new epoch exists (the new owner then loads it)
//!   or, if the takeover locked the row first, the group's `FOR KEY SHARE` waits for it,
//!   then sees the new epoch and is refused. Skipping instead of waiting keeps two nodes acquiring at once (or one behind a
//!   slow group) from queueing on each other's rows with their lease loops stalled.
//! - A renewal extends only rows whose epoch *and* incarnation still match and whose lease
//!   has not run out: an expired lease is re-acquired with a new epoch, never renewed (someone
//!   may have been granted it and released it meanwhile). It updates a non-key column, so it
//!   takes `FOR NO KEY UPDATE`, which does not queue behind `FOR KEY SHARE`: renewals never
//!   wait for writes.
//! - A release clears the owner and the expiry but keeps the epoch (the next grant bumps it).
//! - A fence takes `FOR KEY SHARE` on the rows of the shards a commit group writes, inside the
//!   group's transaction, and refuses the group unless each row still has the epoch this
//!   process was granted.

use tokio_postgres::GenericClient;

/// A shard granted to this process at an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    pub shard: u32,
    pub epoch: u64,
}

/// One row of `herald_shard` as `GET /v1/cluster` and balancing read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardRow {
    pub shard: u32,
    pub epoch: u64,
    pub owner_node: Option<String>,
    pub owner_incarnation: Option<String>,
    /// The lease has run out (database time) or the row was never owned or was released:
    /// anyone may acquire it.
    pub takeable: bool,
    /// When the lease runs out, Unix ms of the database's clock (`None`: free).
    pub lease_expires_ms: Option<i64>,
}

/// Why a fenced group may not commit.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// A shard's row has another epoch than this process was granted: it was taken over
    /// (`OwnershipLost`); the node unloads the shard.
    #[error("shard {shard} is no longer owned at epoch {held} (the row says {found:?})")]
    OwnershipLost {
        shard: u32,
        held: u64,
        found: Option<u64>,
    },
    #[error("postgres: {0}")]
    Db(#[from] tokio_postgres::Error),
}

fn shard_ids(shards: impl IntoIterator<Item = u32>) -> Vec<i32> {
    // Shard ids are < S, which `herald_meta` bounds far below i32::MAX.
    shards
        .into_iter()
        .map(|s| i32::try_from(s).unwrap_or(i32::MAX))
        .collect()
}

fn grants(g: &[Grant]) -> (Vec<i32>, Vec<i64>) {
    (
        shard_ids(g.iter().map(|g| g.shard)),
        g.iter()
            .map(|g| i64::try_from(g.epoch).unwrap_or(i64::MAX))
            .collect(),
    )
}

fn to_u32(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn ttl_param(ttl_ms: u64) -> f64 {
    ttl_ms as f64
}

/// Acquires those of `wanted` that are free or expired, for `ttl_ms` from the database's now,
/// each at a new epoch. Rows another transaction holds locked (a fenced group in flight,
/// another node's acquisition) are skipped, not waited for: they are tried again in a later
/// round (see the module's protocol). Returns the grants, by shard.
pub async fn acquire(
    c: &impl GenericClient,
    node: &str,
    incarnation: &str,
    ttl_ms: u64,
    wanted: &[u32],
) -> Result<Vec<Grant>, tokio_postgres::Error> {
    Ok(acquire_timed(c, node, incarnation, ttl_ms, wanted)
        .await?
        .into_iter()
        .map(|(g, _)| g)
        .collect())
}

/// [`acquire`], with each grant's takeover delay: how long (seconds, database time) the
/// previous owner's lease had run out when it was taken over (`None`: the row was free:
/// never owned, or released).
pub async fn acquire_timed(
    c: &impl GenericClient,
    node: &str,
    incarnation: &str,
    ttl_ms: u64,
    wanted: &[u32],
) -> Result<Vec<(Grant, Option<f64>)>, tokio_postgres::Error> {
    let ids = shard_ids(wanted.iter().copied());
    let rows = c
        .query(
            "WITH takeable AS ( \
               SELECT shard_id, \
                 CASE WHEN owner_incarnation IS NOT NULL \
                   THEN extract(epoch FROM now() - lease_expires)::float8 END AS late \
               FROM herald_shard \
               WHERE shard_id = ANY($1) AND (lease_expires IS NULL OR lease_expires < now()) \
               ORDER BY shard_id FOR UPDATE SKIP LOCKED) \
             UPDATE herald_shard s SET epoch = s.epoch + 1, owner_node = $2, \
               owner_incarnation = $3, lease_expires = now() + $4 * interval '1 millisecond' \
             FROM takeable t \
             WHERE s.shard_id = t.shard_id \
               AND (s.lease_expires IS NULL OR s.lease_expires < now()) \
             RETURNING s.shard_id, s.epoch, t.late",
            &[&ids, &node, &incarnation, &ttl_param(ttl_ms)],
        )
        .await?;
    let mut out: Vec<(Grant, Option<f64>)> = rows
        .iter()
        .map(|r| {
            (
                Grant {
                    shard: to_u32(r.get(0)),
                    epoch: to_u64(r.get(1)),
                },
                r.get(2),
            )
        })
        .collect();
    out.sort_by_key(|(g, _)| *g);
    Ok(out)
}

/// Renews every grant in `held` whose row still has its epoch and this incarnation and whose
/// lease has not run out, by `ttl_ms` from the database's now, in one statement. Returns the
/// shards renewed; a shard left out was lost (`lease.rs` drops it).
pub async fn renew(
    c: &impl GenericClient,
    incarnation: &str,
    ttl_ms: u64,
    held: &[Grant],
) -> Result<Vec<u32>, tokio_postgres::Error> {
    let (ids, epochs) = grants(held);
    let rows = c
        .query(
            "UPDATE herald_shard s SET lease_expires = now() + $3 * interval '1 millisecond' \
             FROM unnest($1::int[], $2::bigint[]) AS h(shard_id, epoch) \
             WHERE s.shard_id = h.shard_id AND s.epoch = h.epoch \
               AND s.owner_incarnation = $4 AND s.lease_expires >= now() \
             RETURNING s.shard_id",
            &[&ids, &epochs, &ttl_param(ttl_ms), &incarnation],
        )
        .await?;
    let mut out: Vec<u32> = rows.iter().map(|r| to_u32(r.get(0))).collect();
    out.sort_unstable();
    Ok(out)
}

/// Releases the grants in `held` that this incarnation still has (a handover, SIGTERM):
/// the rows become free at once, epochs kept. Returns the shards released.
pub async fn release(
    c: &impl GenericClient,
    incarnation: &str,
    held: &[Grant],
) -> Result<Vec<u32>, tokio_postgres::Error> {
    let (ids, epochs) = grants(held);
    let rows = c
        .query(
            "UPDATE herald_shard s SET owner_node = NULL, owner_incarnation = NULL, \
               lease_expires = NULL \
             FROM unnest($1::int[], $2::bigint[]) AS h(shard_id, epoch) \
             WHERE s.shard_id = h.shard_id AND s.epoch = h.epoch AND s.owner_incarnation = $3 \
             RETURNING s.shard_id",
            &[&ids, &epochs, &incarnation],
        )
        .await?;
    let mut out: Vec<u32> = rows.iter().map(|r| to_u32(r.get(0))).collect();
    out.sort_unstable();
    Ok(out)
}

/// The fence of a commit group, to run first inside its transaction: holds the rows of the
/// shards it writes `FOR KEY SHARE` until the transaction ends, and refuses the group unless
/// each still has the epoch it was granted at.
pub async fn fence(c: &impl GenericClient, writes: &[Grant]) -> Result<(), FenceError> {
    let ids = shard_ids(writes.iter().map(|g| g.shard));
    let rows = c
        .query(
            "SELECT shard_id, epoch FROM herald_shard WHERE shard_id = ANY($1) \
             ORDER BY shard_id FOR KEY SHARE",
            &[&ids],
        )
        .await?;
    for g in writes {
        let found = rows
            .iter()
            .find(|r| to_u32(r.get(0)) == g.shard)
            .map(|r| to_u64(r.get(1)));
        if found != Some(g.epoch) {
            return Err(FenceError::OwnershipLost {
                shard: g.shard,
                held: g.epoch,
                found,
            });
        }
    }
    Ok(())
}

/// Every shard row, by shard.
pub async fn rows(c: &impl GenericClient) -> Result<Vec<ShardRow>, tokio_postgres::Error> {
    let rows = c
        .query(
            "SELECT shard_id, epoch, owner_node, owner_incarnation, \
               (lease_expires IS NULL OR lease_expires < now()), \
               (extract(epoch FROM lease_expires) * 1000)::bigint \
             FROM herald_shard ORDER BY shard_id",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| ShardRow {
            shard: to_u32(r.get(0)),
            epoch: to_u64(r.get(1)),
            owner_node: r.get(2),
            owner_incarnation: r.get(3),
            takeable: r.get(4),
            lease_expires_ms: r.get(5),
        })
        .collect())
}

/// Where each shard's live owner can be reached: `(shard, advertise)` for every shard whose
/// lease has not run out and whose owning process advertises an address (`herald_node`).
pub async fn owners(c: &impl GenericClient) -> Result<Vec<(u32, String)>, tokio_postgres::Error> {
    let rows = c
        .query(
            "SELECT s.shard_id, n.advertise FROM herald_shard s \
             JOIN herald_node n ON n.incarnation = s.owner_incarnation \
             WHERE s.lease_expires >= now() AND n.advertise IS NOT NULL",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (to_u32(r.get(0)), r.get::<_, String>(1)))
        .collect())
}

/// One process of the cluster as `GET /v1/cluster` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRow {
    pub node_id: String,
    pub incarnation: String,
    pub advertise: Option<String>,
    /// Its heartbeat is current (database time).
    pub live: bool,
    /// Its last heartbeat, Unix ms of the database's clock (`None`: a row written before
    /// schema 7).
    pub heartbeat_at_ms: Option<i64>,
    /// Its clock offset to the database when it last heartbeat (database minus node; `None`:
    /// not measured).
    pub clock_offset_ms: Option<i64>,
}

/// The processes in `herald_node`, by node id.
pub async fn nodes(c: &impl GenericClient) -> Result<Vec<NodeRow>, tokio_postgres::Error> {
    let rows = c
        .query(
            "SELECT node_id, incarnation, advertise, expires >= now(), \
               (extract(epoch FROM heartbeat_at) * 1000)::bigint, clock_offset_ms \
             FROM herald_node ORDER BY node_id, incarnation",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| NodeRow {
            node_id: r.get(0),
            incarnation: r.get(1),
            advertise: r.get(2),
            live: r.get(3),
            heartbeat_at_ms: r.get(4),
            clock_offset_ms: r.get(5),
        })
        .collect())
}

/// The database's clock now (`clock_timestamp()`, not the transaction's start), in Unix ms:
/// the other end of an offset probe (`offset.rs`).
pub async fn db_now_ms(c: &impl GenericClient) -> Result<u64, tokio_postgres::Error> {
    let r = c
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await?;
    Ok(to_u64(r.get(0)))
}

/// Says this process is alive until `ttl_ms` from the database's now (`herald_node`, one row
/// per incarnation), with the address other nodes forward to, when it said so (`heartbeat_at`,
/// the database's now) and its clock offset to the database (`clock_offset_ms`, database
/// minus node; `None`: not measured).
///
/// An incarnation's first heartbeat (its row not there yet) also ends, at once, the rows of
/// the other incarnations of its node id: a node restarted after a crash no longer counts
/// its old row as a second live node ([`live_nodes`]) until that row missed a heartbeat and
/// a half. A process of that node id that is still alive (two started with one id) says so
/// again at its own next heartbeat, within a balancing round, and counts again from then;
/// meanwhile the others aim at a larger share, which hands nothing over. One statement: the
/// check and both writes see the same snapshot.
pub async fn heartbeat(
    c: &impl GenericClient,
    node: &str,
    incarnation: &str,
    advertise: Option<&str>,
    ttl_ms: u64,
    clock_offset_ms: Option<i64>,
) -> Result<(), tokio_postgres::Error> {
    c.execute(
        "WITH born AS (SELECT NOT EXISTS (SELECT 1 FROM herald_node WHERE incarnation = $1) \
             AS first), \
           superseded AS (UPDATE herald_node SET expires = now() - interval '1 millisecond' \
             WHERE node_id = $2 AND incarnation <> $1 AND expires >= now() \
               AND (SELECT first FROM born)) \
         INSERT INTO herald_node (incarnation, node_id, advertise, expires, heartbeat_at, \
           clock_offset_ms) \
         VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond', now(), $5) \
         ON CONFLICT (incarnation) DO UPDATE SET node_id = EXCLUDED.node_id, \
           advertise = EXCLUDED.advertise, expires = EXCLUDED.expires, \
           heartbeat_at = EXCLUDED.heartbeat_at, clock_offset_ms = EXCLUDED.clock_offset_ms",
        &[
            &incarnation,
            &node,
            &advertise,
            &ttl_param(ttl_ms),
            &clock_offset_ms,
        ],
    )
    .await?;
    Ok(())
}

/// How many processes are alive now (database time), this one included if its heartbeat is
/// current, leaving out each one superseded by a newer incarnation of its node id: a row
/// whose last heartbeat is more than `superseded_ms` older than another live row's of the
/// same node id. A node restarted after a crash heartbeats under a new incarnation while the
/// old row, no longer heartbeating, lives on until it runs out (a lease); counted, it made
/// every node aim at too small a share (`balance::target`), hand shards over needlessly and
/// leave some free until the old row expired. (The new incarnation's first [`heartbeat`] ends
/// that row at once; this rule covers a row that outlives a newer one's birth, such as one of
/// two processes sharing a node id that crashed.) Two processes that share a node id and both
/// heartbeat still count as two (HA.md: the incarnation keeps them apart;
/// `tests/cluster_rolling.rs`). A row without `heartbeat_at` (written before schema 7) is
/// never taken for superseded. Rows long dead are swept on the way.
pub async fn live_nodes(
    c: &impl GenericClient,
    superseded_ms: u64,
) -> Result<usize, tokio_postgres::Error> {
    c.execute(
        "DELETE FROM herald_node WHERE expires < now() - interval '1 hour'",
        &[],
    )
    .await?;
    let r = c
        .query_one(
            "SELECT count(*) FROM herald_node n WHERE n.expires >= now() AND NOT EXISTS ( \
               SELECT 1 FROM herald_node m \
               WHERE m.node_id = n.node_id AND m.incarnation <> n.incarnation \
                 AND m.expires >= now() \
                 AND m.heartbeat_at > n.heartbeat_at + $1 * interval '1 millisecond')",
            &[&ttl_param(superseded_ms)],
        )
        .await?;
    Ok(usize::try_from(r.get::<_, i64>(0)).unwrap_or(0))
}

/// This process leaves (SIGTERM): its node row goes at once.
pub async fn leave(c: &impl GenericClient, incarnation: &str) -> Result<(), tokio_postgres::Error> {
    c.execute(
        "DELETE FROM herald_node WHERE incarnation = $1",
        &[&incarnation],
    )
    .await?;
    Ok(())
}

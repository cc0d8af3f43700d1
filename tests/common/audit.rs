//! The database's own record of fenced commits (HA.md "Tests": "an audit table of fenced
//! commits"), independent of what the nodes report: triggers on herald's tables log every
//! data row written with the epoch its shard's lease row had as the writing transaction saw
//! it (and whether that transaction held the row), and every change of a lease row's epoch;
//! [`check`] then orders the transactions by `pg_xact_commit_timestamp` (the test servers run
//! with `track_commit_timestamp = on`, `pg.rs`) and reports
//! - a write whose transaction does not hold a lock on its shard's lease row (the fence's
//!   `FOR KEY SHARE`), read from the row's xmax in the trigger;
//! - a write seen at epoch e of shard s whose transaction committed after the transaction that
//!   moved s from e to e + 1: it went through without the `FOR KEY SHARE` on s's lease row
//!   that a takeover's `FOR UPDATE SKIP LOCKED` cannot lock past (HA.md "Fence every write"),
//!   or without checking the epoch it held;
//! - an epoch that does not go up (a decrease, no change, a value seen before) and a lease
//!   row inserted or deleted after the schema was made (S is fixed at creation).
//!
//! Why commit timestamps order correctly here: a fenced writer takes its commit timestamp
//! before it releases its locks, and a takeover locks the row (it skips a locked one and
//! tries again in a later round) and takes its own only after that, so a fenced write is
//! always stamped earlier; only a write that did not hold the lock can be stamped after the
//! takeover.
//!
//! Limits: a stale writer that locks the row but checks no epoch, and whose statements already
//! see e + 1, is logged at e + 1 and passes; the fence's own tests (`cluster_rows.rs`) cover
//! the epoch check. An idempotency key's delete is fenced in the key's own shard
//! (`engine/retention.rs`), not the task's that its row's `shard` column holds: it would be
//! judged on the wrong row (the nemesis sends no idempotency keys). The audit lives in its own
//! schema, `herald_audit`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio_postgres::{Client, NoTls};

use super::herald::poll;

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (c, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(conn);
    Ok(c)
}

/// The audit's tables and trigger functions.
const SETUP: &str = "
CREATE SCHEMA herald_audit;
CREATE TABLE herald_audit.writes (id bigserial PRIMARY KEY, tbl text NOT NULL, op text NOT NULL,
  shard int NOT NULL, epoch bigint, locked boolean NOT NULL, txid bigint NOT NULL,
  at timestamptz NOT NULL);
CREATE TABLE herald_audit.epochs (id bigserial PRIMARY KEY, op text NOT NULL, shard int NOT NULL,
  old_epoch bigint, new_epoch bigint, owner_node text, txid bigint NOT NULL,
  at timestamptz NOT NULL);
CREATE TABLE herald_audit.inbox (id bigserial PRIMARY KEY, shard int NOT NULL,
  task_id text NOT NULL, txid bigint NOT NULL);

-- A data row: its shard (OLD's for a delete), that shard's epoch as this statement sees it,
-- and whether this transaction holds a lock on the shard's lease row. The lock is read from
-- the row's raw xmax: our own xid, or a multixact (other key-share lockers, or a renewal's
-- update) with us among its members. A non-key update (a renewal) carries the key-share
-- lockers over to the new row version, so a held lock is always found; a plain xid that is
-- not ours is not a multixact (pg_get_multixact_members fails): not held.
CREATE FUNCTION herald_audit.on_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE s int; e bigint; x xid; me xid; held boolean;
BEGIN
  IF TG_OP = 'DELETE' THEN s := OLD.shard; ELSE s := NEW.shard; END IF;
  me := (txid_current() % 4294967296)::text::xid;
  SELECT epoch, xmax INTO e, x FROM herald_shard WHERE shard_id = s;
  IF x IS NULL OR x::text = '0' THEN held := false;
  ELSIF x = me THEN held := true;
  ELSE
    BEGIN
      held := EXISTS (SELECT 1 FROM pg_get_multixact_members(x) m WHERE m.xid = me);
    EXCEPTION WHEN OTHERS THEN held := false;
    END;
  END IF;
  INSERT INTO herald_audit.writes (tbl, op, shard, epoch, locked, txid, at)
    VALUES (TG_TABLE_NAME, TG_OP, s, e, held, txid_current(), clock_timestamp());
  RETURN NULL;
END $$;

-- A lease row whose epoch changes (renewals and releases keep it: not logged).
CREATE FUNCTION herald_audit.on_shard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO herald_audit.epochs (op, shard, old_epoch, new_epoch, owner_node, txid, at)
      VALUES (TG_OP, NEW.shard_id, NULL, NEW.epoch, NEW.owner_node,
              txid_current(), clock_timestamp());
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO herald_audit.epochs (op, shard, old_epoch, new_epoch, owner_node, txid, at)
      VALUES (TG_OP, OLD.shard_id, OLD.epoch, NULL, OLD.owner_node,
              txid_current(), clock_timestamp());
  ELSIF NEW.epoch IS DISTINCT FROM OLD.epoch OR NEW.shard_id <> OLD.shard_id THEN
    INSERT INTO herald_audit.epochs (op, shard, old_epoch, new_epoch, owner_node, txid, at)
      VALUES (TG_OP, NEW.shard_id, OLD.epoch, NEW.epoch, NEW.owner_node,
              txid_current(), clock_timestamp());
  END IF;
  RETURN NULL;
END $$;

-- An inbox row a transaction means to write: BEFORE, so that a row `ON CONFLICT DO NOTHING`
-- skipped still marks its transaction as an inbox create.
CREATE FUNCTION herald_audit.on_inbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO herald_audit.inbox (shard, task_id, txid)
    VALUES (NEW.shard, NEW.task_id, txid_current());
  RETURN NEW;
END $$;
";

/// Waits (up to 60 s) until herald has made its schema (`herald_meta`'s `schema_version` is
/// this build's: the migration is one transaction, so every table is there), then installs
/// the audit on the database of `url`. Each trigger is made by a statement of its own: a
/// `CREATE TRIGGER` waits for the transactions writing its table, and several in one
/// transaction could deadlock with a running node's commit groups. The lease rows' and the
/// inbox's triggers come first, so every logged write has its epoch changes and inbox marks
/// logged too.
pub async fn install(url: &str) {
    let version = herald::store::pg::schema::SCHEMA_VERSION.to_string();
    let c = poll(Duration::from_secs(60), || async {
        let c = connect(url).await.ok()?;
        let row = c
            .query_opt(
                "SELECT value FROM herald_meta WHERE name = 'schema_version'",
                &[],
            )
            .await
            .ok()??;
        (row.get::<_, String>(0) == version).then_some(c)
    })
    .await
    .expect("herald made its schema within 60 s");
    c.batch_execute(SETUP).await.expect("the audit's tables");
    c.batch_execute(
        "CREATE TRIGGER herald_audit AFTER INSERT OR UPDATE OR DELETE ON herald_shard \
         FOR EACH ROW EXECUTE FUNCTION herald_audit.on_shard()",
    )
    .await
    .expect("the lease rows' trigger");
    c.batch_execute(
        "CREATE TRIGGER herald_audit_mark BEFORE INSERT ON herald_inbox \
         FOR EACH ROW EXECUTE FUNCTION herald_audit.on_inbox()",
    )
    .await
    .expect("the inbox's trigger");
    // Every herald table with a shard column: one per tree, and the inbox (whose deletes, the
    // owner taking its notices, are fenced too).
    let tables = c
        .query(
            "SELECT table_name::text FROM information_schema.columns \
             WHERE table_schema = current_schema() AND column_name = 'shard' \
               AND table_name::text LIKE 'herald\\_%' ORDER BY 1",
            &[],
        )
        .await
        .expect("list herald's tables");
    assert!(
        tables.len() > 1,
        "herald's data tables are listed: {tables:?}"
    );
    for t in tables {
        let t: String = t.get(0);
        c.batch_execute(&format!(
            "CREATE TRIGGER herald_audit AFTER INSERT OR UPDATE OR DELETE ON {t} \
             FOR EACH ROW EXECUTE FUNCTION herald_audit.on_write()"
        ))
        .await
        .unwrap_or_else(|e| panic!("the audit's trigger on {t}: {e}"));
    }
}

/// How much the audit logged: a check over nothing proves nothing.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    pub writes: i64,
    pub epoch_changes: i64,
    pub inbox_marks: i64,
    /// Rows of inbox creates that committed after their shard moved on: exempt, and proof
    /// that the exemption is needed.
    pub exempt_late: i64,
    /// Rows of inbox creates (unfenced by design, so never holding the lock): exempt.
    pub exempt_unlocked: i64,
}

pub async fn seen(url: &str) -> Seen {
    let c = connect(url).await.expect("connect for the audit");
    let n = |sql: &'static str| {
        let c = &c;
        async move { c.query_one(sql, &[]).await.expect(sql).get::<_, i64>(0) }
    };
    Seen {
        writes: n("SELECT count(*) FROM herald_audit.writes").await,
        epoch_changes: n("SELECT count(*) FROM herald_audit.epochs").await,
        inbox_marks: n("SELECT count(*) FROM herald_audit.inbox").await,
        exempt_late: c
            .query_one(&format!("SELECT count(*) {}", late(true)), &[])
            .await
            .expect("count the exempt writes")
            .get(0),
        exempt_unlocked: c
            .query_one(
                &format!(
                    "SELECT count(*) FROM herald_audit.writes w \
                     WHERE NOT w.locked AND {INBOX_CREATE}"
                ),
                &[],
            )
            .await
            .expect("count the exempt writes")
            .get(0),
    }
}

/// A txid (epoch-extended, `txid_current()`) as the `xid` `pg_xact_commit_timestamp` takes:
/// its low 32 bits.
const XID: &str = "(({0}) % 4294967296)::text::xid";

fn commit_ts(txid: &str) -> String {
    format!("pg_xact_commit_timestamp({})", XID.replace("{0}", txid))
}

/// The logged writes (`w`) seen at an epoch whose move to the next (`e`) committed before
/// them: those that are a creation's through the inbox (`exempt`), or all the others.
fn late(exempt: bool) -> String {
    let (wc, ec) = (commit_ts("w.txid"), commit_ts("e.txid"));
    format!(
        "FROM herald_audit.writes w \
         JOIN herald_audit.epochs e ON e.op = 'UPDATE' AND e.shard = w.shard \
           AND e.old_epoch = w.epoch \
         WHERE {wc} > {ec} AND {} {INBOX_CREATE}",
        if exempt { "" } else { "NOT" }
    )
}

/// A logged write `w` that is a task's creation through the inbox (see [`check`]).
const INBOX_CREATE: &str = "(w.op = 'INSERT' AND EXISTS (SELECT 1 FROM herald_audit.inbox i \
     WHERE i.txid = w.txid AND i.shard = w.shard))";

/// Everything the audit finds wrong in the database of `url`, one line each (empty: clean).
pub async fn check(url: &str) -> Vec<String> {
    let c = connect(url).await.expect("connect for the audit");
    let mut bad = Vec::new();
    let on: String = c
        .query_one("SHOW track_commit_timestamp", &[])
        .await
        .expect("track_commit_timestamp")
        .get(0);
    if on != "on" {
        return vec![format!(
            "track_commit_timestamp is {on}: the audit cannot order commits"
        )];
    }

    // Writes to a shard that has no lease row.
    for r in c
        .query(
            "SELECT tbl, shard, txid, count(*) FROM herald_audit.writes WHERE epoch IS NULL \
             GROUP BY 1, 2, 3 ORDER BY 3",
            &[],
        )
        .await
        .expect("read the audit")
    {
        bad.push(format!(
            "txid {} wrote {} row(s) of {} in shard {}, which has no lease row",
            r.get::<_, i64>(2),
            r.get::<_, i64>(3),
            r.get::<_, String>(0),
            r.get::<_, i32>(1)
        ));
    }

    // Writes whose transaction did not hold their shard's lease row (HA.md: "each commit group
    // first takes FOR KEY SHARE on the rows of the shards it writes"), whether or not a
    // takeover came in between; inbox creations exempt, as below.
    let sql = format!(
        "SELECT w.shard, w.txid, min(w.epoch), string_agg(DISTINCT w.tbl || ' ' || w.op, ', '), \
           count(*) FROM herald_audit.writes w WHERE NOT w.locked AND NOT {INBOX_CREATE} \
         GROUP BY w.shard, w.txid ORDER BY w.txid, w.shard"
    );
    for r in c.query(&sql, &[]).await.expect("read the audit") {
        bad.push(format!(
            "shard {}: txid {} wrote {} row(s) ({}) at epoch {} without holding the shard's \
             lease row",
            r.get::<_, i32>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(4),
            r.get::<_, String>(3),
            r.get::<_, Option<i64>>(2).unwrap_or(-1),
        ));
    }

    // Fenced writes committed after their shard moved on. Not counted: the rows a task's
    // creation inserts in a shard this node does not hold (HA.md "Creates and commands on any
    // node", `store/pg/fence.rs`): they are written unfenced by design, with the new task's
    // id required absent, in the same transaction as a `herald_inbox` row of that shard
    // (`backend.rs`, `Stmt::Inbox`). So a write is exempt only if it is an INSERT (a created
    // task's rows are all new) and its transaction also meant to insert an inbox row for that
    // same shard; an update or delete, or a row of another shard, in such a transaction is
    // still judged.
    let (wc, ec) = (commit_ts("w.txid"), commit_ts("e.txid"));
    let sql = format!(
        "SELECT w.shard, w.epoch, w.txid, e.txid, e.new_epoch, coalesce(e.owner_node, ''), \
           string_agg(DISTINCT w.tbl || ' ' || w.op, ', '), count(*), \
           ({wc})::text, ({ec})::text, \
           (extract(epoch FROM {wc} - {ec}) * 1000)::float8 {} \
         GROUP BY w.shard, w.epoch, w.txid, e.txid, e.new_epoch, e.owner_node \
         ORDER BY w.txid, w.shard",
        late(false)
    );
    for r in c.query(&sql, &[]).await.expect("read the audit") {
        bad.push(format!(
            "shard {}: txid {} wrote {} row(s) ({}) at epoch {} and committed at {}, {:.3} ms \
             after txid {} moved the shard to epoch {} (owner {}) committed at {}",
            r.get::<_, i32>(0),
            r.get::<_, i64>(2),
            r.get::<_, i64>(7),
            r.get::<_, String>(6),
            r.get::<_, i64>(1),
            r.get::<_, String>(8),
            r.get::<_, f64>(10),
            r.get::<_, i64>(3),
            r.get::<_, Option<i64>>(4).unwrap_or(-1),
            r.get::<_, String>(5),
            r.get::<_, String>(9),
        ));
    }

    // Logged rows whose transaction has no commit timestamp cannot be ordered: say so.
    let sql = format!(
        "SELECT count(*) FROM (SELECT txid FROM herald_audit.writes UNION \
         SELECT txid FROM herald_audit.epochs) t WHERE {} IS NULL",
        commit_ts("t.txid")
    );
    let unknown: i64 = c.query_one(&sql, &[]).await.expect("read the audit").get(0);
    if unknown > 0 {
        bad.push(format!(
            "{unknown} logged transaction(s) have no commit timestamp"
        ));
    }

    // Epochs, per shard in commit order.
    let sql = format!(
        "SELECT shard, op, old_epoch, new_epoch, coalesce(owner_node, ''), txid, ({})::text \
         FROM herald_audit.epochs e ORDER BY shard, {} NULLS LAST, id",
        commit_ts("e.txid"),
        commit_ts("e.txid")
    );
    let mut seen: BTreeMap<i32, BTreeSet<i64>> = BTreeMap::new();
    for r in c.query(&sql, &[]).await.expect("read the audit") {
        let shard: i32 = r.get(0);
        let op: String = r.get(1);
        let old: Option<i64> = r.get(2);
        let new: Option<i64> = r.get(3);
        let owner: String = r.get(4);
        let txid: i64 = r.get(5);
        let at: Option<String> = r.get(6);
        let what = format!(
            "shard {shard}: txid {txid} ({op}, owner {owner}, committed at {}) took the epoch \
             from {old:?} to {new:?}",
            at.unwrap_or_default()
        );
        let values = seen.entry(shard).or_default();
        if let Some(o) = old {
            values.insert(o);
        }
        if op != "UPDATE" {
            bad.push(format!(
                "{what}: lease rows are made with the schema, never later"
            ));
        } else if new <= old {
            bad.push(format!("{what}: epochs only go up"));
        } else if let Some(n) = new.filter(|n| !values.insert(*n)) {
            bad.push(format!("{what}: epoch {n} was reached before"));
        }
    }
    bad
}

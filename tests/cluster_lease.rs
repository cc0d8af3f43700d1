//! One lease loop (`cluster::node`) against a real PostgreSQL that misbehaves in the ways a
//! review of cluster mode found it unprepared for:
//! - a lock held by another session: the renewal fails at the server's `lock_timeout` and no
//!   backend of the loop is left waiting in the lock queue (before, the statement this side
//!   had given up on waited on in the server, and ran when the lock went);
//! - a database that refuses connections after a failed round: the loop backs off, and the
//!   shards' trust still ends on time, reported as it ends, not after the backoff;
//! - clock probes slower than the renew interval: the due renewals are sent beside them, so
//!   the shards stay held (before, three probes in a row outlasted the trust window);
//! - a node restarted after a crash, its old incarnation's row still live: the other node
//!   keeps its share (before, it counted three nodes and handed a shard over needlessly).
//!
//! Each test has its own database on the binary's shared private server.

mod common;

use std::time::{Duration, Instant};

use common::pg::{client, PgServer};
use herald::cluster::lease::{Dropped, Timing};
use herald::cluster::node::{self, Event, Handle, Identity, Settings};
use tokio::sync::mpsc;
use tokio_postgres::Client;

const SHARDS: u32 = 8;

fn database(pg: &PgServer, name: &str) -> String {
    pg.create_herald_db(name, SHARDS)
}

/// One loop and the events it sent.
struct Node {
    handle: Handle,
    events: mpsc::UnboundedReceiver<Event>,
    log: Vec<(Instant, Event)>,
}

impl Node {
    fn start(url: &str, timing: Timing, max_clock_offset_ms: u64) -> Node {
        Node::start_as(url, timing, max_clock_offset_ms, "a", "a-1")
    }

    fn start_as(
        url: &str,
        timing: Timing,
        max_clock_offset_ms: u64,
        node_id: &str,
        incarnation: &str,
    ) -> Node {
        let (tx, rx) = mpsc::unbounded_channel();
        let handle = node::start(
            Settings {
                url: url.to_string(),
                password: None,
                me: Identity {
                    node_id: node_id.into(),
                    incarnation: incarnation.into(),
                    advertise: None,
                },
                timing,
                shards: SHARDS,
                max_clock_offset_ms,
            },
            tx,
        );
        Node {
            handle,
            events: rx,
            log: Vec::new(),
        }
    }

    fn drain(&mut self) {
        while let Ok(e) = self.events.try_recv() {
            self.log.push((Instant::now(), e));
        }
    }

    fn held(&self) -> usize {
        self.handle.ownership.grants().len()
    }

    fn drops(&self) -> Vec<(Instant, u32, Dropped)> {
        self.log
            .iter()
            .filter_map(|(t, e)| match e {
                Event::Dropped { shard, why } => Some((*t, *shard, *why)),
                _ => None,
            })
            .collect()
    }

    /// Polls every 10 ms until `done`, for at most `within`.
    async fn until(&mut self, within: Duration, what: &str, done: impl Fn(&Node) -> bool) {
        let end = Instant::now() + within;
        loop {
            self.drain();
            if done(self) {
                return;
            }
            assert!(
                Instant::now() < end,
                "{what}: not within {within:?}; events {:?}",
                self.log
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Backends of the current database waiting for a lock.
async fn lock_waiters(c: &Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_behind_a_held_lock_fails_at_the_server_and_leaves_no_backend_waiting() {
    let Some(pg) = PgServer::shared(
        "a_renewal_behind_a_held_lock_fails_at_the_server_and_leaves_no_backend_waiting",
    ) else {
        return;
    };
    let url = database(&pg, "locked");
    // Window 2.5 s, statement deadline 1.25 s, lock_timeout 500 ms.
    let timing = Timing {
        ttl_ms: 3_000,
        renew_ms: 500,
        safety_ms: 500,
    };
    assert_eq!(node::session_timeouts(timing), (1_250, 500));
    let mut a = Node::start(&url, timing, 500);
    a.until(Duration::from_secs(30), "the loop takes every shard", |n| {
        n.held() == SHARDS as usize
    })
    .await;
    let mut locker = client(&url).await;
    let named: i64 = locker
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = $1",
            &[&node::APPLICATION_NAME],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(named, 1, "the lease connection is named");

    // Another session holds every lease row (a stuck transaction, a manual lock).
    let tx = locker.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM herald_shard FOR UPDATE", &[])
        .await
        .unwrap();
    a.until(
        Duration::from_secs(10),
        "the blocked renewal fails and drops every shard",
        |n| n.held() == 0 && n.drops().len() >= SHARDS as usize,
    )
    .await;
    assert!(
        a.drops()
            .iter()
            .all(|(_, _, why)| *why == Dropped::Ambiguous),
        "{:?}",
        a.log
    );
    // The renewal ended in the server too: no backend is left queued behind the lock (this
    // side's timeout alone left it there, one more per reconnect, for as long as the lock).
    let watch = client(&url).await;
    let end = Instant::now() + Duration::from_secs(3);
    loop {
        let n = lock_waiters(&watch).await;
        if n == 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "{n} backend(s) still wait for the lock the renewal met"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The lock goes: the loop takes its shards again.
    tx.rollback().await.unwrap();
    a.until(Duration::from_secs(30), "the shards are taken again", |n| {
        n.held() == SHARDS as usize
    })
    .await;
    a.handle.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_ends_on_time_while_the_database_refuses_connections() {
    let Some(pg) = PgServer::shared("trust_ends_on_time_while_the_database_refuses_connections")
    else {
        return;
    };
    let url = database(&pg, "refused");
    let db = url.rsplit('/').next().unwrap().to_string();
    // Window 5.5 s; the reconnect backoff reaches its 2 s cap (renew) within it.
    let timing = Timing {
        ttl_ms: 6_000,
        renew_ms: 2_000,
        safety_ms: 500,
    };
    let mut a = Node::start(&url, timing, 500);
    a.until(Duration::from_secs(30), "the loop takes every shard", |n| {
        n.held() == SHARDS as usize
    })
    .await;
    let admin = client(&pg.url("postgres")).await;
    let c = client(&url).await;
    // No new connection to the database from now on; the loop's own one goes too, at its
    // next balancing round, whose heartbeat is refused (the renewals before it go through).
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{db}\" WITH ALLOW_CONNECTIONS false"
        ))
        .await
        .unwrap();
    c.batch_execute(
        "CREATE FUNCTION refuse_heartbeat() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN RAISE EXCEPTION 'heartbeat refused by the test'; END $$; \
         CREATE TRIGGER refuse_heartbeat BEFORE INSERT OR UPDATE ON herald_node \
           FOR EACH ROW EXECUTE FUNCTION refuse_heartbeat();",
    )
    .await
    .unwrap();

    // Trust ends by itself (no renewal without a connection): `grants` shows it at once, and
    // the loop, backing off between connection attempts, reports the drops then too, not
    // when its backoff (up to 2 s here) next lets it look.
    let end = Instant::now() + Duration::from_secs(20);
    let mut untrusted_at = None;
    loop {
        a.drain();
        if untrusted_at.is_none() && a.held() == 0 {
            untrusted_at = Some(Instant::now());
        }
        if a.drops().len() >= SHARDS as usize {
            break;
        }
        assert!(Instant::now() < end, "no drop reported: {:?}", a.log);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let drops = a.drops();
    assert!(
        drops.iter().all(|(_, _, why)| *why == Dropped::Expired),
        "dropped as their trust ran out, not by a failed renewal: {drops:?}"
    );
    let untrusted_at = untrusted_at.expect("trust ended before its drops were reported");
    let late = drops
        .iter()
        .map(|(t, _, _)| t.saturating_duration_since(untrusted_at))
        .max()
        .unwrap_or_default();
    assert!(
        late <= Duration::from_millis(1_000),
        "the drops came {late:?} after the trust ended"
    );

    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{db}\" WITH ALLOW_CONNECTIONS true"
        ))
        .await
        .unwrap();
    c.batch_execute("DROP TRIGGER refuse_heartbeat ON herald_node")
        .await
        .unwrap();
    a.until(
        Duration::from_secs(30),
        "the loop reconnects and takes its shards again",
        |n| n.held() == SHARDS as usize,
    )
    .await;
    a.handle.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_renewals_go_out_beside_slow_clock_probes() {
    let Some(pg) = PgServer::shared("due_renewals_go_out_beside_slow_clock_probes") else {
        return;
    };
    let url = database(&pg, "probes");
    let db = url.rsplit('/').next().unwrap().to_string();
    // Window 6 s, statement deadline 3 s. Each probe will take 2.5 s: three in a row (7.5 s)
    // outlast the window, but one (what a renewal sent beside it waits for) fits the deadline.
    let timing = Timing {
        ttl_ms: 6_500,
        renew_ms: 1_000,
        safety_ms: 500,
    };
    let c = client(&url).await;
    // The loop's sessions look up `clock_timestamp()` in a schema of the test's first, where
    // a slow one appears once the loop holds its shards (the probe is
    // `SELECT clock_timestamp()`; the renewals and every other statement are untouched).
    c.batch_execute(&format!(
        "CREATE SCHEMA slow; \
         ALTER DATABASE \"{db}\" SET search_path = slow, pg_catalog, public"
    ))
    .await
    .unwrap();
    // A probe 2.5 s long reads ±1.25 s: a bound that lets the node keep its shards.
    let mut a = Node::start(&url, timing, 60_000);
    a.until(Duration::from_secs(30), "the loop takes every shard", |n| {
        n.held() == SHARDS as usize && n.handle.ownership.clock_offset_ms().is_some()
    })
    .await;
    c.batch_execute(
        "CREATE FUNCTION slow.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql \
           VOLATILE AS $$ BEGIN PERFORM pg_sleep(2.5); RETURN pg_catalog.clock_timestamp(); END $$",
    )
    .await
    .unwrap();
    // The next measurement (every 30 s) is made of slow probes: the database's reading comes
    // at the end of each, so the offset reads about +1.25 s once it is taken.
    let expiry = |rows: &[herald::cluster::rows::ShardRow]| {
        rows.iter().filter_map(|r| r.lease_expires_ms).min()
    };
    let end = Instant::now() + Duration::from_secs(50);
    let mut measured_with = None;
    loop {
        a.drain();
        assert_eq!(
            a.held(),
            SHARDS as usize,
            "a shard lost its trust while the probes ran: {:?}",
            a.log
        );
        assert!(a.drops().is_empty(), "{:?}", a.log);
        let table = herald::cluster::rows::rows(&c).await.unwrap();
        match measured_with {
            // A renewal after the slow measurement, too: the loop is past it.
            Some(before) if expiry(&table) > before => break,
            Some(_) => {}
            None if a.handle.ownership.clock_offset_ms() > Some(1_000) => {
                measured_with = Some(expiry(&table));
            }
            None => {}
        }
        assert!(
            Instant::now() < end,
            "no slow measurement and renewal after it within 50 s (offset {:?})",
            a.handle.ownership.clock_offset_ms()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.handle.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_nodes_old_incarnation_does_not_shrink_the_others_share() {
    let Some(pg) =
        PgServer::shared("a_restarted_nodes_old_incarnation_does_not_shrink_the_others_share")
    else {
        return;
    };
    let url = database(&pg, "restart");
    // Lease 3 s: a crashed process's node row lives 3 s past its last heartbeat.
    let timing = Timing {
        ttl_ms: 3_000,
        renew_ms: 500,
        safety_ms: 500,
    };
    let a = Node::start_as(&url, timing, 500, "a", "a-1");
    let mut b = Node::start_as(&url, timing, 500, "b", "b-1");
    let half = SHARDS as usize / 2;
    let end = Instant::now() + Duration::from_secs(30);
    while !(a.held() == half && b.held() == half) {
        assert!(
            Instant::now() < end,
            "no balance: {} and {}",
            a.held(),
            b.held()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    b.drain();
    let before = b.log.len();
    // a crashes (its rows and its node row are left to run out) and comes back under a new
    // incarnation once its old row has missed a heartbeat and a half (750 ms).
    a.handle.abort();
    let c = client(&url).await;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let stale: bool = c
            .query_one(
                "SELECT heartbeat_at < now() - interval '900 milliseconds' \
                 FROM herald_node WHERE incarnation = 'a-1'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if stale {
            break;
        }
        assert!(Instant::now() < end, "a-1 heartbeats after its abort");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut a2 = Node::start_as(&url, timing, 500, "a", "a-2");
    // a-2 takes a's shards once their leases run out; b keeps its share all along (counting
    // a-1 as a third node, it aimed at ceil(8 / 3) = 3 and handed shards over).
    a2.until(Duration::from_secs(30), "a-2 takes a's share", |n| {
        n.held() == half
    })
    .await;
    // And a few rounds more, with a-1's row run out by now.
    let settle = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < settle {
        b.drain();
        assert_eq!(b.held(), half, "b lost shards: {:?}", &b.log[before..]);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    b.drain();
    assert!(
        b.log[before..].is_empty(),
        "b's shards moved: {:?}",
        &b.log[before..]
    );
    b.handle.leave().await;
    a2.handle.leave().await;
}

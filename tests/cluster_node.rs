//! The lease loop of several processes on one real PostgreSQL (issue 24, HA.md "Trust
//! window", "Balancing", "Failover bounds"): loops share the shards out without ever holding
//! one twice, a crashed loop's shards are taken over once its leases run out, a partitioned
//! loop stops trusting its shards before anyone else is granted them (one machine's
//! monotonic clock orders both), and a loop that leaves hands its shards over at once.
//!
//! Timing is shortened (lease 1.5 s, renew 300 ms, safety 300 ms) so the tests run in seconds.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::pg::PgServer;
use common::pgproxy::PgProxy;
use herald::cluster::lease::Timing;
use herald::cluster::node::{self, Event, Handle, Identity, Settings};
use tokio::sync::mpsc;

const SHARDS: u32 = 8;
const TIMING: Timing = Timing {
    ttl_ms: 1_500,
    renew_ms: 300,
    safety_ms: 300,
};

fn database(pg: &PgServer, name: &str) -> String {
    pg.create_herald_db(name, SHARDS)
}

/// One loop, its events stamped on arrival with this process's monotonic clock.
struct Node {
    name: String,
    handle: Option<Handle>,
    events: mpsc::UnboundedReceiver<Event>,
    log: Vec<(Instant, Event)>,
}

impl Node {
    fn start(url: &str, name: &str) -> Node {
        let (tx, rx) = mpsc::unbounded_channel();
        let handle = node::start(
            Settings {
                url: url.to_string(),
                password: None,
                me: Identity {
                    node_id: name.to_string(),
                    incarnation: format!("{name}-{}", std::process::id()),
                    advertise: None,
                },
                timing: TIMING,
                shards: SHARDS,
                max_clock_offset_ms: 500,
            },
            tx,
        );
        Node {
            name: name.to_string(),
            handle: Some(handle),
            events: rx,
            log: Vec::new(),
        }
    }

    fn drain(&mut self) {
        while let Ok(e) = self.events.try_recv() {
            self.log.push((Instant::now(), e));
        }
    }

    fn held(&self) -> BTreeSet<u32> {
        self.handle
            .as_ref()
            .map(|h| h.ownership.grants().iter().map(|g| g.shard).collect())
            .unwrap_or_default()
    }
}

/// No shard held by two loops at once; answers the shards of each.
fn disjoint(nodes: &[&Node]) -> Vec<BTreeSet<u32>> {
    let held: Vec<BTreeSet<u32>> = nodes.iter().map(|n| n.held()).collect();
    for (i, a) in held.iter().enumerate() {
        for (j, b) in held.iter().enumerate().skip(i + 1) {
            assert!(
                a.is_disjoint(b),
                "{} and {} both hold {:?}",
                nodes[i].name,
                nodes[j].name,
                a.intersection(b).collect::<Vec<_>>()
            );
        }
    }
    held
}

/// Polls (every 20 ms, checking disjointness each time) until `done` holds of the counts.
async fn until(nodes: &mut [&mut Node], what: &str, done: impl Fn(&[usize]) -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        for n in nodes.iter_mut() {
            n.drain();
        }
        let view: Vec<&Node> = nodes.iter().map(|n| &**n).collect();
        let counts: Vec<usize> = disjoint(&view).iter().map(BTreeSet::len).collect();
        if done(&counts) {
            // A loop sends its events before its ownership shows them (a grant's event goes
            // out under the lease lock `held` takes), so what we saw is in the channel now:
            // drain it again, or a grant seen in `held` could be missing from the log.
            for n in nodes.iter_mut() {
                n.drain();
            }
            return;
        }
        assert!(Instant::now() < end, "{what}: still {counts:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loops_share_the_shards_out_and_take_over_a_crashed_ones() {
    let Some(pg) = PgServer::shared("loops_share_the_shards_out_and_take_over_a_crashed_ones")
    else {
        return;
    };
    let url = database(&pg, "share");
    let mut a = Node::start(&url, "a");
    let mut b = Node::start(&url, "b");
    let mut c = Node::start(&url, "c");
    until(
        &mut [&mut a, &mut b, &mut c],
        "three loops share 8 shards",
        |n| n.iter().sum::<usize>() == 8 && n.iter().all(|k| (2..=3).contains(k)),
    )
    .await;
    // `a` crashes: nothing is released, its leases run out, the others take its shards.
    let crashed = Instant::now();
    a.handle.take().expect("running").abort();
    until(&mut [&mut b, &mut c], "two loops take all 8", |n| {
        n == [4, 4]
    })
    .await;
    let took = crashed.elapsed();
    // Not a speed check: the takeover cannot come before the crashed leases ran out.
    assert!(
        took >= Duration::from_millis(TIMING.ttl_ms - TIMING.renew_ms),
        "taken over after {took:?}, before the crashed loop's leases could run out"
    );
    // In the order they happened, each shard's grants have strictly growing epochs.
    let mut grants: Vec<(Instant, u32, u64)> = [&a, &b, &c]
        .iter()
        .flat_map(|n| n.log.iter())
        .filter_map(|(t, e)| match e {
            Event::Granted(g) => Some((*t, g.shard, g.epoch)),
            _ => None,
        })
        .collect();
    grants.sort();
    let mut epochs: BTreeMap<u32, u64> = BTreeMap::new();
    for (_, shard, epoch) in grants {
        let last = epochs.entry(shard).or_default();
        assert!(epoch > *last, "shard {shard}: epoch {epoch} after {last}");
        *last = epoch;
    }
    assert_eq!(epochs.len(), SHARDS as usize, "every shard was granted");
    // `b` leaves: its shards are released at once (no lease to wait for), `c` takes all 8.
    let left = Instant::now();
    b.handle.take().expect("running").leave().await;
    until(&mut [&mut c], "the last loop takes all 8", |n| n == [8]).await;
    assert!(
        left.elapsed() < Duration::from_millis(TIMING.ttl_ms),
        "a handover waits for no lease: {:?}",
        left.elapsed()
    );
    c.handle.take().expect("running").leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_loop_stops_trusting_its_shards_before_anyone_else_gets_them() {
    let Some(pg) = PgServer::shared(
        "a_partitioned_loop_stops_trusting_its_shards_before_anyone_else_gets_them",
    ) else {
        return;
    };
    let url = database(&pg, "partition");
    let proxy = PgProxy::start(pg.port());
    let mut cut = Node::start(&proxy.url(&url), "cut");
    until(&mut [&mut cut], "one loop holds all", |n| n == [8]).await;
    let mut other = Node::start(&url, "other");
    until(&mut [&mut cut, &mut other], "two loops share", |n| {
        n == [4, 4]
    })
    .await;
    let theirs = cut.held();
    cut.drain();
    other.drain();
    cut.log.clear();
    other.log.clear();

    // Partition `cut` from the database: its renewals go unanswered (and arrive late).
    proxy.blackhole(true);
    until(&mut [&mut cut, &mut other], "the other takes all", |n| {
        n == [0, 8]
    })
    .await;
    // A drop's event follows the ownership change that `held` shows: wait (bounded) until
    // the log has every drop and grant before judging their order.
    let end = Instant::now() + Duration::from_secs(5);
    while !theirs.iter().all(|shard| {
        cut.log
            .iter()
            .any(|(_, e)| matches!(e, Event::Dropped { shard: s, .. } if s == shard))
            && other
                .log
                .iter()
                .any(|(_, e)| matches!(e, Event::Granted(g) if g.shard == *shard))
    }) && Instant::now() < end
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
        cut.drain();
        other.drain();
    }
    for shard in &theirs {
        let dropped = cut
            .log
            .iter()
            .find(|(_, e)| matches!(e, Event::Dropped { shard: s, .. } if s == shard))
            .map(|(t, _)| *t)
            .unwrap_or_else(|| panic!("shard {shard} was never dropped by the cut loop"));
        let granted = other
            .log
            .iter()
            .find(|(_, e)| matches!(e, Event::Granted(g) if g.shard == *shard))
            .map(|(t, _)| *t)
            .unwrap_or_else(|| panic!("shard {shard} was never granted to the other loop"));
        assert!(
            dropped < granted,
            "shard {shard}: granted to the other loop before the cut one stopped trusting it"
        );
    }
    // Heal: the late renewals change nothing (the rows have new epochs); the loops share
    // again, still never both holding a shard.
    proxy.blackhole(false);
    until(&mut [&mut cut, &mut other], "they share again", |n| {
        n == [4, 4]
    })
    .await;
    for n in [&mut cut, &mut other] {
        n.handle.take().expect("running").leave().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_whose_send_is_still_unsettled_leaves_the_row_to_lapse() {
    let Some(pg) =
        PgServer::shared("a_handover_whose_send_is_still_unsettled_leaves_the_row_to_lapse")
    else {
        return;
    };
    let url = database(&pg, "unsettled");
    let mut a = Node::start(&url, "a");
    until(&mut [&mut a], "one loop holds all", |n| n == [8]).await;
    let owned = |pg: &PgServer| -> Vec<u32> {
        pg.psql(
            &url,
            "SELECT shard_id FROM herald_shard WHERE owner_incarnation IS NOT NULL ORDER BY 1",
        )
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
    };
    let handle = a.handle.take().expect("running");
    let ownership = handle.ownership.clone();
    let shard = 3;
    // A send on shard 3 that has not settled when the handover's wait (one lease) ends: cut
    // off at its window, its settle still on its way to a slow database.
    let sending = ownership.sending(shard);
    let asked = Instant::now();
    handle.leave().await;
    assert!(
        asked.elapsed() >= Duration::from_millis(TIMING.ttl_ms),
        "the handover waited for the send"
    );
    assert_eq!(
        owned(&pg),
        [shard],
        "every other row is freed; shard {shard}'s is not while its send is unsettled"
    );
    assert_eq!(ownership.count(), 0, "nothing is acted on any more");
    a.drain();
    assert!(
        a.log
            .iter()
            .any(|(_, e)| matches!(e, Event::Dropped { shard: s, .. } if *s == shard)),
        "shard {shard} dropped, not released: {:?}",
        a.log
    );
    assert!(!a
        .log
        .iter()
        .any(|(_, e)| matches!(e, Event::Released(s) if *s == shard)));
    // Its lease runs out by itself: the next owner waits it out, as after a crash.
    drop(sending);
    let mut b = Node::start(&url, "b");
    until(&mut [&mut b], "b takes all", |n| n == [8]).await;
    b.handle.take().expect("running").leave().await;
}

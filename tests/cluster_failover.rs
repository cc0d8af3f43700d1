//! Cluster mode on real processes (HA.md, issue 24): two real `herald` nodes on one private
//! PostgreSQL share the shards; creates go to either node (a create for the other node's
//! shard is written with an inbox row and loaded by its owner); one node is killed with
//! SIGKILL and the other takes its shards over once their leases run out and sends what was
//! left — every acknowledged message arrives, and only a message in flight at the kill may
//! arrive twice (with the same idempotency key). Then a SIGTERM of the survivor frees every
//! shard at once (no lease left to run out).
//!
//! Short leases (2 s) keep the test quick; the protocol is the same at HA.md's 10 s.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::cluster::{owned, TEST_TIMING};
use common::herald::{in_ms, poll, Proc};
use common::history::{check, Expected, History};
use common::http;
use common::pg::PgServer;
use common::receiver::Receiver;
use serde_json::{json, Value};

const SHARDS: u32 = 8;

fn node(url: &str, dir: &std::path::Path, name: &str, hook: &str) -> Proc {
    common::cluster::node(url, dir, name, name, SHARDS, hook, TEST_TIMING)
}

fn node_with(url: &str, dir: &std::path::Path, name: &str, hook: &str, timing: &str) -> Proc {
    common::cluster::node(url, dir, name, name, SHARDS, hook, timing)
}

/// Who owns what, from the lease rows (database time): `(owner, lease live)` per shard.
fn table(pg: &PgServer, url: &str) -> Vec<(String, bool)> {
    pg.psql(
        url,
        "SELECT coalesce(owner_node, '-') || ' ' || coalesce((lease_expires >= now())::text, 'false') \
         FROM herald_shard ORDER BY shard_id",
    )
    .lines()
    .filter(|l| !l.trim().is_empty())
    .map(|l| {
        let mut p = l.split_whitespace();
        let owner = p.next().unwrap_or("-").to_string();
        (owner, p.next() == Some("true"))
    })
    .collect()
}

fn per_key(rx: &Receiver) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for r in rx.requests() {
        *m.entry(r.idempotency_key().unwrap_or("").to_string())
            .or_default() += 1;
    }
    m
}

/// Every shard's epoch in a `/v1/cluster` answer, into the history's samples.
fn sample_epochs(view: &Value, hist: &mut History) {
    for s in view["leases"].as_array().into_iter().flatten() {
        if let (Some(shard), Some(epoch)) = (s["shard"].as_u64(), s["epoch"].as_u64()) {
            hist.epochs.push((shard as u32, epoch));
        }
    }
}

/// `GET /v1/cluster` has the shape of the shared contract (API.md "Cluster mode"): `shards` is
/// S, `epochs` one number per shard, each node with the shards it owns now, its last
/// heartbeat (RFC 3339) and its clock offset (a number, or null); the nodes' `shards` together
/// are exactly the shards `leases` shows owned, none twice.
fn assert_contract(view: &Value) {
    assert_eq!(view["shards"].as_u64(), Some(u64::from(SHARDS)), "{view}");
    let epochs = view["epochs"].as_object().expect("epochs is an object");
    assert_eq!(epochs.len(), SHARDS as usize, "{view}");
    for s in 0..SHARDS {
        assert!(epochs[&s.to_string()].is_u64(), "epoch of {s}: {view}");
    }
    let mut union = Vec::new();
    for n in view["nodes"].as_array().expect("nodes") {
        for k in ["node_id", "incarnation"] {
            assert!(n[k].is_string(), "{k}: {n}");
        }
        assert!(
            n["advertise"].is_string() || n["advertise"].is_null(),
            "{n}"
        );
        let owns: Vec<u64> = n["shards"]
            .as_array()
            .unwrap_or_else(|| panic!("a node's shards is an array: {n}"))
            .iter()
            .map(|x| x.as_u64().expect("a shard number"))
            .collect();
        assert!(owns.windows(2).all(|w| w[0] < w[1]), "sorted: {n}");
        assert_eq!(n["shards_owned"].as_u64(), Some(owns.len() as u64), "{n}");
        let beat = n["heartbeat_at"].as_str().expect("heartbeat_at");
        chrono::DateTime::parse_from_rfc3339(beat)
            .unwrap_or_else(|e| panic!("heartbeat_at {beat:?} is not RFC 3339: {e}"));
        assert!(
            n["clock_offset_ms"].is_i64() || n["clock_offset_ms"].is_null(),
            "{n}"
        );
        // A node heartbeats only once its clock was measured and found acceptable.
        if n["live"] == true {
            assert!(n["clock_offset_ms"].is_i64(), "measured: {n}");
        }
        union.extend(owns);
    }
    union.sort_unstable();
    let owned: Vec<u64> = view["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .filter(|l| l["free"] == false)
        .map(|l| l["shard"].as_u64().unwrap())
        .collect();
    assert_eq!(
        union, owned,
        "the nodes' shards are the owned leases: {view}"
    );
}

fn one_shot(id: &str, after_ms: i64) -> Value {
    json!({"id": id, "channel": "hook", "schedule": {"at": in_ms(after_ms)},
           "messages": [{"to": "a", "body": id}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_the_shards_and_the_survivor_of_a_kill_9_sends_the_rest() {
    let Some(pg) = PgServer::start("cluster_failover") else {
        return;
    };
    let url = pg.create_db("failover");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();

    let mut a = node(&url, dir.path(), "a", &rx.url());
    // Alone, a takes every shard.
    poll(Duration::from_secs(30), || async {
        (owned(&a.url).await == u64::from(SHARDS)).then_some(())
    })
    .await
    .expect("the first node takes every shard");

    // Due after the kill below, created on a while it holds everything.
    let mut expected = Vec::new();
    for i in 0..20 {
        let id = format!("early-{i}");
        let r = http::post_json(
            &format!("{}/v1/tasks", a.url),
            &one_shot(&id, 9_000 + i * 150),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.text());
        expected.push(format!("{id}:1:0"));
    }
    // A paced sequence running across the kill.
    let seq = json!({"id": "seq", "channel": "hook", "schedule": {"at": in_ms(500)},
        "pacing": {"interval": "400ms"},
        "messages": (0..30).map(|i| json!({"to": format!("r{i}"), "body": "s"})).collect::<Vec<_>>()});
    let r = http::post_json(&format!("{}/v1/tasks", a.url), &seq).await;
    assert_eq!(r.status, 201, "{}", r.text());
    expected.extend((0..30).map(|i| format!("seq:1:{i}")));

    let b = node(&url, dir.path(), "b", &rx.url());
    // a hands its surplus over until each holds half.
    poll(Duration::from_secs(40), || async {
        let (na, nb) = (owned(&a.url).await, owned(&b.url).await);
        (na == u64::from(SHARDS / 2) && nb == u64::from(SHARDS / 2)).then_some(())
    })
    .await
    .expect("two nodes balance to half the shards each");
    // Never two owners: each shard's row names one node, and the two counts add up.
    let t = table(&pg, &url);
    assert_eq!(t.len(), SHARDS as usize);
    assert!(
        t.iter().all(|(o, live)| *live && (o == "a" || o == "b")),
        "{t:?}"
    );

    // The operator's view, from either node: two live nodes, each shard owned by one.
    let view = poll(Duration::from_secs(10), || async {
        let v = http::get(&format!("{}/v1/cluster", b.url)).await.json();
        let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
        (nodes.iter().filter(|n| n["live"] == true).count() == 2).then_some(v)
    })
    .await
    .expect("GET /v1/cluster lists both nodes");
    assert_contract(&view);
    assert_eq!(view["shards_total"], SHARDS);
    assert_eq!(view["leases"].as_array().unwrap().len(), SHARDS as usize);
    let a_shards: Vec<u32> = view["leases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["owner_node"] == "a")
        .map(|s| s["shard"].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(a_shards.len(), (SHARDS / 2) as usize, "{view}");
    // The same view on the command line.
    let burl = b.url.clone();
    let cli = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["cluster", "--url", &burl])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&cli.stdout);
    assert!(cli.status.success(), "herald cluster: {text}");
    assert!(
        text.contains("SHARD")
            && text.contains("holds 4 of 8 shards")
            && text
                .lines()
                .filter(|l| l.starts_with("a ") || l.starts_with("b "))
                .count()
                >= 2,
        "herald cluster prints the nodes and shards: {text}"
    );

    // Commands on the node that does not hold the task are forwarded to the one that does:
    // tasks created on a (any shard), cancelled through b; a's own ones come back 200 too.
    let mut forwarded = 0;
    for i in 0..12 {
        let id = format!("far-{i}");
        let r = http::post_json(&format!("{}/v1/tasks", a.url), &one_shot(&id, 120_000)).await;
        assert_eq!(r.status, 201, "{}", r.text());
        if a_shards.contains(&herald::store::pg::fence::shard_of_task(&id, SHARDS)) {
            forwarded += 1;
        }
        let r = poll(Duration::from_secs(10), || async {
            let r = http::post_json(&format!("{}/v1/tasks/{id}/cancel", b.url), &json!({})).await;
            (r.status != 503).then_some(r)
        })
        .await
        .expect("a cancel is answered");
        assert_eq!(r.status, 200, "cancel {id} through b: {}", r.text());
        assert_eq!(r.json()["state"], "cancelled", "{}", r.text());
    }
    assert!(
        forwarded > 0,
        "some of the cancels had to be forwarded to a"
    );
    // Non-owner commands on a missing task still answer 404 (from its owner).
    let r = http::post_json(&format!("{}/v1/tasks/nobody/cancel", b.url), &json!({})).await;
    assert_eq!(r.status, 404, "{}", r.text());

    // Creates on either node, each for shards of both: the other's go through the inbox.
    for i in 0..20 {
        let (id, base) = (
            format!("late-{i}"),
            if i % 2 == 0 { &a.url } else { &b.url },
        );
        let r = http::post_json(&format!("{base}/v1/tasks"), &one_shot(&id, 1_500 + i * 100)).await;
        assert_eq!(r.status, 201, "{}", r.text());
        expected.push(format!("{id}:1:0"));
    }
    // The inbox path delivers before any kill.
    let late_done = poll(Duration::from_secs(30), || async {
        let k = per_key(&rx);
        (0..20)
            .all(|i| k.contains_key(&format!("late-{i}:1:0")))
            .then_some(())
    })
    .await;
    assert!(
        late_done.is_some(),
        "creates on either node are sent by their shard's owner: {:?}",
        per_key(&rx)
    );

    // Let the sequence get going, then kill a in the middle of it.
    poll(Duration::from_secs(30), || async {
        (per_key(&rx)
            .keys()
            .filter(|k| k.starts_with("seq:"))
            .count()
            >= 5)
            .then_some(())
    })
    .await
    .expect("the sequence is under way");
    let killed = Instant::now();
    a.kill9();

    // b takes every shard once a's leases ran out.
    poll(Duration::from_secs(30), || async {
        (owned(&b.url).await == u64::from(SHARDS)).then_some(())
    })
    .await
    .expect("the survivor takes every shard over");
    let took = killed.elapsed();

    let all = poll(Duration::from_secs(60), || async {
        let k = per_key(&rx);
        expected.iter().all(|e| k.contains_key(e)).then_some(k)
    })
    .await
    .unwrap_or_else(|| {
        let k = per_key(&rx);
        let missing: Vec<_> = expected.iter().filter(|e| !k.contains_key(*e)).collect();
        panic!("not delivered after the failover: {missing:?}")
    });
    let twice: Vec<_> = all.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        all.values().all(|n| *n <= 2) && twice.len() <= 2,
        "only a message in flight at the kill may arrive twice: {twice:?}"
    );
    assert!(all.keys().all(|k| expected.contains(k)), "{all:?}");
    // Sequence order within the run, across the takeover.
    let seqs: Vec<u32> = rx
        .requests()
        .iter()
        .filter_map(|r| r.idempotency_key()?.strip_prefix("seq:1:")?.parse().ok())
        .collect();
    let mut dedup = seqs.clone();
    dedup.dedup();
    assert!(dedup.windows(2).all(|w| w[0] < w[1]), "seq order: {seqs:?}");
    // Every delivery names its shard's epoch (`herald-epoch`); the sequence's grow when the
    // survivor takes its shard over, and never go back.
    let epochs: Vec<u64> = rx
        .requests()
        .iter()
        .filter(|r| r.idempotency_key().is_some_and(|k| k.starts_with("seq:")))
        .map(|r| {
            r.header("herald-epoch")
                .and_then(|e| e.parse().ok())
                .expect("a herald-epoch header")
        })
        .collect();
    assert!(
        epochs.windows(2).all(|w| w[0] <= w[1]),
        "epochs: {epochs:?}"
    );
    assert!(
        epochs.first() < epochs.last(),
        "the takeover's epoch is higher: {epochs:?}"
    );
    eprintln!("takeover after kill -9: every shard owned by the survivor {took:?} after the kill; twice: {twice:?}");

    if std::env::var("HERALD_TEST_NODE_LOG").is_ok() {
        let m = http::get(&format!("{}/metrics", b.url)).await.text();
        for l in m.lines().filter(|l| {
            l.contains("flush_duration") || l.contains("busy_seconds") || l.contains("lateness")
        }) {
            eprintln!("b: {l}");
        }
    }
    // SIGTERM: the survivor drains and frees its rows at once.
    let mut b = b;
    b.signal(libc::SIGTERM);
    b.wait_exit(Duration::from_secs(30)).await;
    let t = table(&pg, &url);
    assert!(
        t.iter().all(|(o, live)| o == "-" && !*live),
        "released: {t:?}"
    );
}

/// Failover time over repeated kills (issue 24 "Measure"): each round kills the node holding
/// half the shards, measures from the kill to the first delivery by the survivor of a probe
/// armed on the victim before the kill (its in-flight mark inherited), restarts the victim
/// and waits for the two to balance again. `HERALD_CLUSTER_KILLS` rounds (default 2) with
/// `HERALD_CLUSTER_LEASE` (default 2s; renew a fifth of it, safety a tenth). Prints p50 and
/// max; the history checker (`tests/common/history.rs`) asserts every probe arrived, none
/// before it was due, and none more often than its shard changed owner, plus one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_after_repeated_kills_delivers_every_probe() {
    let Some(pg) = PgServer::start("cluster_failover_repeat") else {
        return;
    };
    let kills: usize = std::env::var("HERALD_CLUSTER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let lease_ms: u64 = std::env::var("HERALD_CLUSTER_LEASE")
        .ok()
        .and_then(|v| v.trim_end_matches('s').parse::<u64>().ok())
        .map_or(2_000, |s| s * 1000);
    let timing = format!(
        "lease = \"{lease_ms}ms\"\nrenew = \"{}ms\"\nsafety = \"{}ms\"\n",
        lease_ms / 5,
        lease_ms / 10
    );
    let url = pg.create_db("repeat");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = [
        Some(node_with(&url, dir.path(), "a", &rx.url(), &timing)),
        Some(node_with(&url, dir.path(), "b", &rx.url(), &timing)),
    ];
    let names = ["a", "b"];
    let balanced = |n: &[Option<Proc>; 2]| {
        let urls: Vec<String> = n.iter().map(|p| p.as_ref().unwrap().url.clone()).collect();
        async move {
            poll(Duration::from_secs(120), || async {
                let (x, y) = (owned(&urls[0]).await, owned(&urls[1]).await);
                (x == u64::from(SHARDS / 2) && y == u64::from(SHARDS / 2)).then_some(())
            })
            .await
            .expect("the two nodes balance")
        }
    };
    balanced(&nodes).await;
    let mut took = Vec::new();
    let mut probes = Vec::new();
    let mut hist = History {
        max_clock_offset_ms: 500.0,
        slack_ms: 50.0,
        ..History::default()
    };
    for k in 0..kills {
        let (v, s) = (k % 2, 1 - k % 2);
        let survivor = nodes[s].as_ref().unwrap().url.clone();
        let view = http::get(&format!("{survivor}/v1/cluster")).await.json();
        sample_epochs(&view, &mut hist);
        let theirs: Vec<u32> = view["leases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["owner_node"] == names[v])
            .map(|x| x["shard"].as_u64().unwrap() as u32)
            .collect();
        // A probe due 300 ms after the kill on one of the victim's shards: armed (in flight
        // on disk) by the victim before it dies.
        let id = (0..10_000)
            .map(|i| format!("probe-{k}-{i}"))
            .find(|id| theirs.contains(&herald::store::pg::fence::shard_of_task(id, SHARDS)))
            .unwrap();
        let victim = nodes[v].as_ref().unwrap().url.clone();
        let at = in_ms(1_300);
        let due_ms = common::herald::ms_of(&at);
        let body = json!({"id": id, "channel": "hook", "schedule": {"at": at},
                          "messages": [{"to": "a", "body": id}]});
        let r = http::post_json(&format!("{victim}/v1/tasks"), &body).await;
        assert_eq!(r.status, 201, "{}", r.text());
        probes.push(format!("{id}:1:0"));
        hist.expected.push(Expected {
            key: format!("{id}:1:0"),
            due_ms,
            shard: herald::store::pg::fence::shard_of_task(&id, SHARDS),
        });
        tokio::time::sleep(Duration::from_millis(1_000)).await; // armed ahead of its instant
        let killed = Instant::now();
        nodes[v].as_mut().unwrap().kill9();
        let key = format!("{id}:1:0");
        let got = poll(Duration::from_secs(60), || async {
            rx.requests()
                .iter()
                .find(|r| r.idempotency_key() == Some(key.as_str()))
                .map(|r| r.at)
        })
        .await
        .unwrap_or_else(|| panic!("probe {id} not delivered after the kill"));
        took.push(got.saturating_duration_since(killed));
        let view = http::get(&format!("{survivor}/v1/cluster")).await.json();
        sample_epochs(&view, &mut hist);
        nodes[v] = Some(node_with(&url, dir.path(), names[v], &rx.url(), &timing));
        balanced(&nodes).await;
        let view = http::get(&format!("{survivor}/v1/cluster")).await.json();
        sample_epochs(&view, &mut hist);
    }
    let per = per_key(&rx);
    hist.deliveries = common::cluster::deliveries(&rx);
    let bad = check(&hist);
    assert!(
        bad.is_empty(),
        "history over {kills} kills:\n{}",
        bad.join("\n")
    );
    took.sort();
    let ms: Vec<u128> = took.iter().map(Duration::as_millis).collect();
    eprintln!(
        "failover (kill -9 -> first send by the new owner), lease {lease_ms} ms, {kills} kills: p50 {} ms, max {} ms, all {ms:?}; probes delivered twice: {}",
        ms.get(ms.len() / 2).copied().unwrap_or(0),
        ms.last().copied().unwrap_or(0),
        probes.iter().filter(|p| per.get(*p) == Some(&2)).count()
    );
}

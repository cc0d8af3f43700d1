//! The seeded cluster nemesis (issue 24, HA.md "Tests"): three real nodes on one private
//! PostgreSQL, each behind its own TCP proxy, while one-shots, paced sequences and cancels go
//! to random nodes; each step draws one fault from the seed — `kill -9` of the busiest owner,
//! SIGSTOP for 2 × the lease, a node↔database blackhole, a dropped `COMMIT` reply, a PostgreSQL
//! immediate restart — heals it
//! and waits for balance. Then a rolling SIGTERM restart of every node, which must send no
//! duplicate at all, and the history checker (`tests/common/history.rs`) over everything.
//!
//! `HERALD_NEMESIS_SEED` replays a seed (printed at the start and in every failure);
//! `HERALD_NEMESIS_STEPS` runs more steps (default 4, a few minutes on 2 cores).

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::cluster::{balanced, owned, TEST_TIMING};
use common::herald::{in_ms, ms_of, poll, Proc};
use common::history::{check, duplicates_since, Cancel, Expected, History};
use common::http;
use common::pg::PgServer;
use common::pgproxy::{Fault, PgProxy};
use common::receiver::Receiver;
use serde_json::{json, Value};

const SHARDS: u32 = 9;
const NODES: usize = 3;
const EACH: u64 = (SHARDS as u64) / (NODES as u64);

/// A small seeded generator (xorshift64*): the run is a function of the seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

struct Cluster {
    url: String,
    dir: tempfile::TempDir,
    hook: String,
    proxies: Vec<PgProxy>,
    nodes: Vec<Proc>,
}

const NAMES: [&str; NODES] = ["a", "b", "c"];

impl Cluster {
    fn start_node(&self, i: usize) -> Proc {
        common::cluster::node(
            &self.proxies[i].url(&self.url),
            self.dir.path(),
            NAMES[i],
            NAMES[i],
            SHARDS,
            &self.hook,
            TEST_TIMING,
        )
    }

    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url.clone()).collect()
    }

    async fn balance(&self, what: &str) {
        let urls = self.urls();
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        balanced(&refs, EACH, Duration::from_secs(90), what).await;
    }

    /// Every shard's epoch, as node `i` reports it, into the history's samples.
    async fn sample(&self, i: usize, hist: &mut History) {
        let view = http::get(&format!("{}/v1/cluster", self.nodes[i].url))
            .await
            .json();
        for s in view["shards"].as_array().into_iter().flatten() {
            if let (Some(shard), Some(epoch)) = (s["shard"].as_u64(), s["epoch"].as_u64()) {
                hist.epochs.push((shard as u32, epoch));
            }
        }
    }
}

/// POSTs `body` as a client that honours `Retry-After` would: a 503 (a takeover under way,
/// the store failing) or a refused connection is tried again, for up to 30 s.
async fn post_retrying(url: &str, body: &Value) -> http::Resp {
    let bytes = serde_json::to_vec(body).unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let last = match http::try_request("POST", url, &[], Some(bytes.clone())).await {
            Ok(r) if r.status != 503 => return r,
            Ok(r) => r.text(),
            Err(e) => e,
        };
        assert!(
            std::time::Instant::now() < end,
            "POST {url}: no answer but 503 or an error for 30 s: {last}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await; // a client's retry pace
    }
}

/// Creates `body` through node `via`; on a 201 the messages `keys` with their due instant
/// become part of what the history expects.
async fn create(c: &Cluster, via: usize, body: &Value, n: usize, hist: &mut History) -> bool {
    let id = body["id"].as_str().unwrap();
    let due = ms_of(body["schedule"]["at"].as_str().unwrap());
    let r = post_retrying(&format!("{}/v1/tasks", c.nodes[via].url), body).await;
    // 409: an earlier try that answered 503 was stored after all; the task is there.
    if r.status != 201 && r.status != 409 {
        return false;
    }
    for seq in 0..n {
        hist.expected.push(Expected {
            key: format!("{id}:1:{seq}"),
            // A later seq is due no earlier than the first (pacing only delays it).
            due_ms: due,
            shard: herald::store::pg::fence::shard_of_task(id, SHARDS),
        });
    }
    true
}

/// One step's workload: two one-shots, a paced sequence, and a task cancelled through
/// another node before it is due.
async fn workload(c: &Cluster, step: usize, rng: &mut Rng, hist: &mut History, seed: u64) {
    for k in 0..2 {
        let id = format!("one-{step}-{k}");
        let body = json!({"id": id, "channel": "hook",
            "schedule": {"at": in_ms(500 + rng.below(2_000) as i64)},
            "messages": [{"to": "x", "body": id}]});
        let via = rng.below(NODES as u64) as usize;
        assert!(
            create(c, via, &body, 1, hist).await,
            "seed {seed}: create {id}"
        );
    }
    let id = format!("seq-{step}");
    let n = 6;
    let body = json!({"id": id, "channel": "hook", "schedule": {"at": in_ms(300)},
        "pacing": {"interval": "400ms"},
        "messages": (0..n).map(|i| json!({"to": format!("r{i}"), "body": "p"})).collect::<Vec<_>>()});
    let via = rng.below(NODES as u64) as usize;
    assert!(
        create(c, via, &body, n, hist).await,
        "seed {seed}: create {id}"
    );
    let id = format!("cancel-{step}");
    let body = json!({"id": id, "channel": "hook", "schedule": {"at": in_ms(4_000)},
        "messages": [{"to": "x", "body": id}]});
    let via = rng.below(NODES as u64) as usize;
    let r = post_retrying(&format!("{}/v1/tasks", c.nodes[via].url), &body).await;
    assert_eq!(r.status, 201, "seed {seed}: create {id}: {}", r.text());
    let other = (via + 1 + rng.below(NODES as u64 - 1) as usize) % NODES;
    let r = post_retrying(
        &format!("{}/v1/tasks/{id}/cancel", c.nodes[other].url),
        &json!({}),
    )
    .await;
    assert_eq!(r.status, 200, "seed {seed}: cancel {id}: {}", r.text());
    hist.cancels.push(Cancel {
        task: id,
        answered_ms: now_ms(),
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_faults_keep_every_cluster_promise() {
    let Some(pg) = PgServer::start("cluster_nemesis") else {
        return;
    };
    let seed: u64 = std::env::var("HERALD_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let steps: usize = std::env::var("HERALD_NEMESIS_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    eprintln!("nemesis: HERALD_NEMESIS_SEED={seed} HERALD_NEMESIS_STEPS={steps}");
    let mut rng = Rng(seed | 1);
    let rx = Receiver::start().await;
    let mut c = Cluster {
        url: pg.create_db("nemesis"),
        dir: tempfile::tempdir().unwrap(),
        hook: rx.url(),
        proxies: (0..NODES).map(|_| PgProxy::start(pg.port())).collect(),
        nodes: Vec::new(),
    };
    for i in 0..NODES {
        let n = c.start_node(i);
        c.nodes.push(n);
    }
    c.balance("the three nodes balance at start").await;
    let mut hist = History {
        max_clock_offset_ms: 500.0,
        slack_ms: 50.0,
        ..History::default()
    };
    let lease = Duration::from_secs(2);
    c.sample(0, &mut hist).await;
    for step in 0..steps {
        workload(&c, step, &mut rng, &mut hist, seed).await;
        c.sample(0, &mut hist).await;
        let victim = rng.below(NODES as u64) as usize;
        let fault = rng.below(5);
        eprintln!(
            "nemesis step {step}: {} (node {})",
            [
                "kill -9 of the busiest owner",
                "SIGSTOP",
                "blackhole",
                "lost COMMIT reply",
                "PostgreSQL immediate restart"
            ][fault as usize],
            NAMES[victim]
        );
        match fault {
            0 => {
                // The busiest owner dies and comes back.
                let mut busiest = 0;
                let mut most = 0;
                for (i, u) in c.urls().iter().enumerate() {
                    let o = owned(u).await;
                    if o > most {
                        (busiest, most) = (i, o);
                    }
                }
                c.nodes[busiest].kill9();
                let survivor = c.urls()[(busiest + 1) % NODES].clone();
                poll(Duration::from_secs(30), || async {
                    (owned(&survivor).await > EACH).then_some(())
                })
                .await
                .unwrap_or_else(|| {
                    panic!("seed {seed}: the survivors take the dead node's shards")
                });
                c.nodes[busiest] = c.start_node(busiest);
            }
            1 => {
                c.nodes[victim].signal(libc::SIGSTOP);
                tokio::time::sleep(lease * 2).await; // the fault's length, not a wait for a state
                c.nodes[victim].signal(libc::SIGCONT);
            }
            2 => {
                c.proxies[victim].blackhole(true);
                tokio::time::sleep(lease * 2).await; // the fault's length
                c.proxies[victim].blackhole(false);
            }
            3 => {
                c.proxies[victim].arm(Fault::LoseReply);
                let p = &c.proxies[victim];
                poll(Duration::from_secs(20), || async {
                    (p.fired() > 0).then_some(())
                })
                .await
                .unwrap_or_else(|| panic!("seed {seed}: a COMMIT went through the proxy"));
            }
            _ => pg.restart("immediate"),
        }
        c.balance(&format!("seed {seed} step {step}: balance after the fault"))
            .await;
        c.sample((victim + 1) % NODES, &mut hist).await;
    }

    // Everything acknowledged arrives once the faults are healed.
    let want: Vec<String> = hist.expected.iter().map(|e| e.key.clone()).collect();
    poll(Duration::from_secs(90), || async {
        let got: std::collections::HashSet<String> = rx
            .requests()
            .iter()
            .filter_map(|r| r.idempotency_key().map(str::to_string))
            .collect();
        want.iter().all(|k| got.contains(k)).then_some(())
    })
    .await;

    // A rolling SIGTERM restart while a sequence is sent: not one duplicate.
    let rolling_from = now_ms();
    let body = json!({"id": "rolling", "channel": "hook", "schedule": {"at": in_ms(300)},
        "pacing": {"interval": "300ms"},
        "messages": (0..12).map(|i| json!({"to": format!("r{i}"), "body": "p"})).collect::<Vec<_>>()});
    assert!(
        create(&c, 0, &body, 12, &mut hist).await,
        "seed {seed}: create rolling"
    );
    for (i, name) in NAMES.iter().enumerate() {
        c.nodes[i].signal(libc::SIGTERM);
        let code = c.nodes[i].wait_exit(Duration::from_secs(30)).await;
        assert!(
            code.is_some(),
            "seed {seed}: node {name} drains and exits on SIGTERM"
        );
        c.nodes[i] = c.start_node(i);
        c.balance(&format!("seed {seed}: balance after restarting {name}"))
            .await;
        c.sample(i, &mut hist).await;
    }
    poll(Duration::from_secs(60), || async {
        let n = rx
            .requests()
            .iter()
            .filter(|r| {
                r.idempotency_key()
                    .is_some_and(|k| k.starts_with("rolling:"))
            })
            .count();
        (n >= 12).then_some(())
    })
    .await;

    hist.deliveries = common::cluster::deliveries(&rx);
    let dups = duplicates_since(&hist.deliveries, rolling_from);
    assert!(
        dups.is_empty(),
        "seed {seed}: duplicates during the rolling restart: {dups:?}"
    );
    let bad = check(&hist);
    assert!(
        bad.is_empty(),
        "seed {seed} ({steps} steps), {} messages expected, {} delivered:\n{}",
        hist.expected.len(),
        hist.deliveries.len(),
        bad.join("\n")
    );
    eprintln!(
        "nemesis seed {seed}: {steps} steps, {} messages expected, {} deliveries, history clean",
        hist.expected.len(),
        hist.deliveries.len()
    );
}

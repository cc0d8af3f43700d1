//! The seeded cluster nemesis (issue 24, HA.md "Tests"): three real nodes on one private
//! PostgreSQL, each behind its own TCP proxy, while one-shots, paced sequences and cancels go
//! to random nodes; each step draws one fault from the seed — `kill -9` of the busiest owner,
//! SIGSTOP for 2 × the lease, a node↔database blackhole, a dropped `COMMIT` reply, a PostgreSQL
//! immediate restart, the busiest node's database traffic delayed (slow renewals), a blackhole
//! just longer than the trust window (a shard lost and regained fast), a second process with
//! an existing node's id — while a background client keeps creating and cancelling through
//! random nodes (started before the fault, joined after the heal), heals it and waits for
//! balance. Then a rolling SIGTERM restart of every node, which must send no duplicate at all,
//! and the history checker (`tests/common/history.rs`) over everything, attempt spans included,
//! beside the database's epoch audit (`tests/common/audit.rs`: no write committed at an epoch
//! after its shard moved on, epochs only up).
//!
//! `HERALD_NEMESIS_SEED` replays a seed (printed at the start and in every failure);
//! `HERALD_NEMESIS_STEPS` runs more steps (default 4, a few minutes on 2 cores).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::cluster::{balanced, owned, TEST_TIMING};
use common::herald::{in_ms, ms_of, poll, Proc};
use common::history::{check, duplicates_since, Cancel, Expected, History};
use common::http;
use common::pg::PgServer;
use common::pgproxy::{Fault, PgProxy};
use common::receiver::Receiver;
use parking_lot::Mutex;
use serde_json::{json, Value};

const SHARDS: u32 = 9;
const NODES: usize = 3;
const EACH: u64 = (SHARDS as u64) / (NODES as u64);

/// A small seeded generator (xorshift64*): the run is a function of the seed.
struct Rng(u64);

impl Rng {
    /// Seeds that differ in a low bit give unrelated runs (splitmix64 of the seed; never 0).
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

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
    /// The nodes' addresses as they are now, for the background client (a restarted node
    /// listens elsewhere).
    live: Arc<Mutex<Vec<String>>>,
    /// Every shard's epoch as the nodes reported it, with when the reporting node read it.
    samples: Mutex<Vec<(f64, u32, u64)>>,
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

    /// Node `i` is `p` from now on (the old process, if still running, is killed).
    fn set(&mut self, i: usize, p: Proc) {
        self.live.lock()[i] = p.url.clone();
        self.nodes[i] = p;
    }

    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url.clone()).collect()
    }

    /// The node holding the most shards now.
    async fn busiest(&self) -> usize {
        let mut busiest = 0;
        let mut most = 0;
        for (i, u) in self.urls().iter().enumerate() {
            let o = owned(u).await;
            if o > most {
                (busiest, most) = (i, o);
            }
        }
        busiest
    }

    async fn balance(&self, what: &str) {
        let urls = self.urls();
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        balanced(&refs, EACH, Duration::from_secs(90), what).await;
    }

    /// Every shard's epoch, as node `i` reports it, kept with the view's `read_at`.
    async fn sample(&self, i: usize) {
        let view = http::get(&format!("{}/v1/cluster", self.nodes[i].url))
            .await
            .json();
        // A node that has not read the rows yet reports nothing.
        let Some(read_at) = view["read_at"].as_str().map(ms_of) else {
            return;
        };
        let mut samples = self.samples.lock();
        for s in view["leases"].as_array().into_iter().flatten() {
            if let (Some(shard), Some(epoch)) = (s["shard"].as_u64(), s["epoch"].as_u64()) {
                samples.push((read_at, shard as u32, epoch));
            }
        }
    }

    /// The samples in the order the nodes read them: a node's view is its lease loop's last
    /// read (`GET /v1/cluster`'s `read_at`), so a view asked for later may be older than one
    /// asked for before on another node (seed 22 sampled epoch 3 after 4 on three shards,
    /// while the database audit saw every epoch go up).
    fn epochs_in_read_order(&self) -> Vec<(u32, u64)> {
        let mut s = self.samples.lock().clone();
        s.sort_by(|a, b| a.0.total_cmp(&b.0));
        s.into_iter()
            .map(|(_, shard, epoch)| (shard, epoch))
            .collect()
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
    // Cancelled: rule 1 is kept by the cancel; the rest (never after the answer, at most
    // once more per owner change) still hold.
    hist.expected.push(Expected {
        key: format!("{id}:1:0"),
        due_ms: ms_of(body["schedule"]["at"].as_str().unwrap()),
        shard: herald::store::pg::fence::shard_of_task(&id, SHARDS),
    });
    hist.cancels.push(Cancel {
        task: id,
        answered_ms: now_ms(),
    });
}

/// What the background client had acknowledged, merged into the history after its join.
#[derive(Default)]
struct Acked {
    expected: Vec<Expected>,
    cancels: Vec<Cancel>,
    /// Answers no client should get (the step's seed names them).
    errors: Vec<String>,
}

/// One request as a client that knows every node would make it: each try goes to a node drawn
/// from `live`, a refused connection, a 503 or no answer within 5 s (a stopped node) is tried
/// again elsewhere, for up to 30 s. So is a 502 or 504 (`forward-unanswered`: forwarded, the
/// owner gave no answer, the command may have been applied): the requests sent here are creates
/// by id and cancels, which a second try answers 409 if the first went through (the callers
/// read the task then). `None`: nothing but those for 30 s.
async fn send_anywhere(
    live: &Mutex<Vec<String>>,
    rng: &mut Rng,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Option<http::Resp> {
    let bytes = body.map(|b| serde_json::to_vec(b).unwrap());
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        let base = {
            let l = live.lock();
            l[rng.below(l.len() as u64) as usize].clone()
        };
        let url = format!("{base}{path}");
        let fut = http::try_request(method, &url, &[], bytes.clone());
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(5), fut).await {
            if !matches!(r.status, 502..=504) {
                return Some(r);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await; // a client's retry pace
    }
    None
}

/// A client running while a fault is on: one-shots, short paced sequences, and tasks created
/// and at once cancelled, through random nodes, one every ~150 ms until `stop` (at most 40).
async fn in_flight(
    live: Arc<Mutex<Vec<String>>>,
    mut rng: Rng,
    step: usize,
    stop: Arc<AtomicBool>,
) -> Acked {
    let mut out = Acked::default();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) && n < 40 {
        let id = format!("bg-{step}-{n}");
        n += 1;
        let kind = rng.below(3);
        let (body, msgs) = match kind {
            0 => (
                json!({"id": id, "channel": "hook",
                    "schedule": {"at": in_ms(200 + rng.below(1_300) as i64)},
                    "messages": [{"to": "x", "body": id}]}),
                1,
            ),
            1 => (
                json!({"id": id, "channel": "hook", "schedule": {"at": in_ms(200)},
                    "pacing": {"interval": "300ms"},
                    "messages": (0..3).map(|i| json!({"to": format!("r{i}"), "body": "p"})).collect::<Vec<_>>()}),
                3,
            ),
            _ => (
                json!({"id": id, "channel": "hook", "schedule": {"at": in_ms(3_000)},
                    "messages": [{"to": "x", "body": id}]}),
                1,
            ),
        };
        let due = ms_of(body["schedule"]["at"].as_str().unwrap());
        match send_anywhere(&live, &mut rng, "POST", "/v1/tasks", Some(&body)).await {
            // 409: an earlier try that got no answer was stored after all.
            Some(r) if r.status == 201 || r.status == 409 => {}
            other => {
                out.errors.push(format!(
                    "create {id}: {:?}",
                    other.map(|r| (r.status, r.text()))
                ));
                continue;
            }
        }
        for seq in 0..msgs {
            out.expected.push(Expected {
                key: format!("{id}:1:{seq}"),
                due_ms: due,
                shard: herald::store::pg::fence::shard_of_task(&id, SHARDS),
            });
        }
        if kind == 2 {
            let path = format!("/v1/tasks/{id}/cancel");
            let r = send_anywhere(&live, &mut rng, "POST", &path, Some(&json!({}))).await;
            let answered_ms = now_ms();
            match r.map(|r| r.status) {
                Some(200) => out.cancels.push(Cancel {
                    task: id,
                    answered_ms,
                }),
                // Already finished, or cancelled by a try whose answer was lost: the task
                // says which. Cancelled: it was so by now at the latest.
                Some(409) => {
                    let got =
                        send_anywhere(&live, &mut rng, "GET", &format!("/v1/tasks/{id}"), None)
                            .await;
                    if got.is_some_and(|g| g.status == 200 && g.json()["state"] == "cancelled") {
                        out.cancels.push(Cancel {
                            task: id,
                            answered_ms,
                        });
                    }
                }
                other => out.errors.push(format!("cancel {id}: {other:?}")),
            }
        }
        tokio::time::sleep(Duration::from_millis(150)).await; // the client's pace
    }
    out
}

/// The fault kinds a step draws from, by index.
const FAULTS: [&str; 8] = [
    "kill -9 of the busiest owner",
    "SIGSTOP",
    "blackhole",
    "lost COMMIT reply",
    "PostgreSQL immediate restart",
    "busiest node's database traffic delayed",
    "blackhole just past the trust window",
    "a second process with the node's id",
];

/// The tests' lease (`TEST_TIMING`) and how long a lease is trusted (lease − safety).
const LEASE: Duration = Duration::from_secs(2);
const TRUST: Duration = Duration::from_millis(1_500);

/// Applies fault `fault` (on `victim` where it takes one) and heals it.
async fn fault_and_heal(
    c: &mut Cluster,
    pg: &PgServer,
    fault: usize,
    victim: usize,
    rng: &mut Rng,
    seed: u64,
) {
    match fault {
        0 => {
            // The busiest owner dies and comes back.
            let busiest = c.busiest().await;
            c.nodes[busiest].kill9();
            let survivor = c.urls()[(busiest + 1) % NODES].clone();
            poll(Duration::from_secs(30), || async {
                (owned(&survivor).await > EACH).then_some(())
            })
            .await
            .unwrap_or_else(|| panic!("seed {seed}: the survivors take the dead node's shards"));
            let p = c.start_node(busiest);
            c.set(busiest, p);
        }
        1 => {
            c.nodes[victim].signal(libc::SIGSTOP);
            tokio::time::sleep(LEASE * 2).await; // the fault's length, not a wait for a state
            c.nodes[victim].signal(libc::SIGCONT);
        }
        2 => {
            c.proxies[victim].blackhole(true);
            tokio::time::sleep(LEASE * 2).await; // the fault's length
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
        4 => pg.restart("immediate"),
        5 => {
            // Renewals (and every write) reach the server late and answer later: lease/2 to
            // lease each way, for 2 × the lease.
            let busiest = c.busiest().await;
            let d = LEASE / 2 + Duration::from_millis(rng.below(LEASE.as_millis() as u64 / 2));
            eprintln!("nemesis: node {} delayed {d:?} each way", NAMES[busiest]);
            c.proxies[busiest].delay(d);
            tokio::time::sleep(LEASE * 2).await; // the fault's length
            c.proxies[busiest].delay(Duration::ZERO);
        }
        6 => {
            // Trust ends, the lease rows have not run out yet: the shards are dropped and
            // taken again (by this node or another) at once.
            let d = TRUST + Duration::from_millis(100 + rng.below(200));
            c.proxies[victim].blackhole(true);
            tokio::time::sleep(d).await; // the fault's length
            c.proxies[victim].blackhole(false);
        }
        _ => {
            // A second process with the victim's node id (another incarnation), then the
            // first one dies: the twin may hold the dead one's shards only at new epochs.
            let twin = common::cluster::node(
                &c.proxies[victim].url(&c.url),
                c.dir.path(),
                &format!("{}-twin", NAMES[victim]),
                NAMES[victim],
                SHARDS,
                &c.hook,
                TEST_TIMING,
            );
            tokio::time::sleep(LEASE).await; // both alive for a lease: the fault's length
            c.nodes[victim].kill9();
            let others: Vec<String> = (0..NODES)
                .filter(|&i| i != victim)
                .map(|i| c.nodes[i].url.clone())
                .chain([twin.url.clone()])
                .collect();
            poll(Duration::from_secs(30), || async {
                let mut held = 0;
                for u in &others {
                    held += owned(u).await;
                }
                (held == SHARDS as u64).then_some(())
            })
            .await
            .unwrap_or_else(|| {
                panic!("seed {seed}: the twin and the others hold every shard after the kill")
            });
            let p = c.start_node(victim);
            c.set(victim, p);
            let mut twin = twin;
            twin.signal(libc::SIGTERM);
            assert!(
                twin.wait_exit(Duration::from_secs(30)).await.is_some(),
                "seed {seed}: the twin drains and exits on SIGTERM"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_faults_keep_every_cluster_promise() {
    let t0 = Instant::now();
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
    let mut rng = Rng::new(seed);
    let rx = Receiver::start().await;
    let mut c = Cluster {
        url: pg.create_db("nemesis"),
        dir: tempfile::tempdir().unwrap(),
        hook: rx.url(),
        proxies: (0..NODES).map(|_| PgProxy::start(pg.port())).collect(),
        nodes: Vec::new(),
        live: Arc::new(Mutex::new(Vec::new())),
        samples: Mutex::new(Vec::new()),
    };
    for i in 0..NODES {
        let n = c.start_node(i);
        c.live.lock().push(n.url.clone());
        c.nodes.push(n);
    }
    c.balance("the three nodes balance at start").await;
    // The database's own record of epochs and fenced writes, checked at the end.
    common::audit::install(&c.url).await;
    eprintln!("nemesis: balanced at {:.1} s", t0.elapsed().as_secs_f64());
    let mut hist = History {
        max_clock_offset_ms: 500.0,
        slack_ms: 50.0,
        ..History::default()
    };
    c.sample(0).await;
    let started = Instant::now();
    let mut order: Vec<usize> = (0..FAULTS.len()).collect();
    for step in 0..steps {
        workload(&c, step, &mut rng, &mut hist, seed).await;
        c.sample(0).await;
        let victim = rng.below(NODES as u64) as usize;
        // Faults in a seeded order, each kind once before any repeats: 4 steps try 4 kinds.
        if step % FAULTS.len() == 0 {
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        let fault = order[step % FAULTS.len()];
        eprintln!(
            "nemesis step {step} at {:.1} s: {} (node {})",
            started.elapsed().as_secs_f64(),
            FAULTS[fault],
            NAMES[victim]
        );
        // The client runs through the fault: started before it, joined after the heal.
        let stop = Arc::new(AtomicBool::new(false));
        let client = tokio::spawn(in_flight(
            c.live.clone(),
            Rng::new(seed ^ (step as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            step,
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(300)).await; // let it get going first
        fault_and_heal(&mut c, &pg, fault, victim, &mut rng, seed).await;
        stop.store(true, Ordering::SeqCst);
        let acked = client.await.expect("the background client");
        assert!(
            acked.errors.is_empty(),
            "seed {seed} step {step}: the client got: {:?}",
            acked.errors
        );
        hist.expected.extend(acked.expected);
        hist.cancels.extend(acked.cancels);
        c.balance(&format!("seed {seed} step {step}: balance after the fault"))
            .await;
        c.sample((victim + 1) % NODES).await;
    }
    eprintln!(
        "nemesis: {steps} steps in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Everything acknowledged arrives once the faults are healed.
    // (A cancelled task's message may never come: not waited for; the checker judges it.)
    let cancelled: std::collections::HashSet<&str> =
        hist.cancels.iter().map(|c| c.task.as_str()).collect();
    let want: Vec<String> = hist
        .expected
        .iter()
        .filter(|e| !cancelled.contains(common::history::task_of(&e.key)))
        .map(|e| e.key.clone())
        .collect();
    // Every fault is healed and the nodes balanced: what is due goes out within a failover
    // bound or two, not at the next restart.
    let missing = || -> Vec<String> {
        let got: std::collections::HashSet<String> = rx
            .requests()
            .iter()
            .filter_map(|r| r.idempotency_key().map(str::to_string))
            .collect();
        want.iter().filter(|k| !got.contains(*k)).cloned().collect()
    };
    let arrived = poll(Duration::from_secs(30), || async {
        missing().is_empty().then_some(())
    })
    .await;
    if arrived.is_none() {
        let mut why = Vec::new();
        for k in missing() {
            let task = common::history::task_of(&k).to_string();
            let v = http::get(&format!("{}/v1/tasks/{task}", c.nodes[0].url)).await;
            let cl = http::get(&format!("{}/v1/cluster", c.nodes[0].url)).await;
            let shard = herald::store::pg::fence::shard_of_task(&task, SHARDS);
            let row = cl.json()["leases"]
                .as_array()
                .and_then(|a| a.iter().find(|s| s["shard"] == shard).cloned());
            why.push(format!("{k} (shard {shard}: {row:?}): {}", v.text()));
        }
        panic!(
            "seed {seed}: not delivered 30 s after the last heal:\n{}",
            why.join("\n")
        );
    }
    eprintln!(
        "nemesis: all delivered at {:.1} s",
        t0.elapsed().as_secs_f64()
    );
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
        let p = c.start_node(i);
        c.set(i, p);
        c.balance(&format!("seed {seed}: balance after restarting {name}"))
            .await;
        c.sample(i).await;
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

    eprintln!(
        "nemesis: rolling restart done at {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    hist.deliveries = common::cluster::deliveries(&rx);
    hist.epochs = c.epochs_in_read_order();
    let dups = duplicates_since(&hist.deliveries, rolling_from);
    assert!(
        dups.is_empty(),
        "seed {seed}: duplicates during the rolling restart: {dups:?}"
    );
    let bad = check(&hist);
    // The same promise judged by the database (`tests/common/audit.rs`), reported with the
    // history's failures.
    let audit = common::audit::check(&c.url).await;
    let seen = common::audit::seen(&c.url).await;
    eprintln!("nemesis: the audit saw {seen:?}");
    assert!(
        bad.is_empty() && audit.is_empty(),
        "seed {seed} ({steps} steps), {} messages expected, {} delivered:\n{}\n\
         the database's epoch audit:\n{}",
        hist.expected.len(),
        hist.deliveries.len(),
        bad.join("\n"),
        audit.join("\n")
    );
    assert!(
        seen.writes > 0 && seen.epoch_changes > 0,
        "seed {seed}: the audit logged writes and epoch changes: {seen:?}"
    );
    eprintln!(
        "nemesis seed {seed}: {steps} steps, {} messages expected, {} deliveries, history clean",
        hist.expected.len(),
        hist.deliveries.len()
    );
}

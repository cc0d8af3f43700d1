//! Cluster mode on one PostgreSQL (issue 24 "Measure"), each figure beside its same-run
//! baseline, with real `herald` nodes (release binary, `HERALD_BENCH_BIN` honoured) on
//! loopback and HA.md's default timing (lease 10 s, renew 2 s, safety 1 s):
//!
//! 1. durable creates over HTTP at 64 connections (the lean client): one node alone, and
//!    three nodes with the connections spread evenly over their addresses (a create for
//!    another node's shard is forwarded to its owner), each cluster on a fresh database, both
//!    up at once and taking turns: `HERALD_CLUSTER_ROUNDS` rounds each (default 3) of
//!    `HERALD_CLUSTER_CREATES` (20 000), so that neither gets the shared machine's better
//!    minutes; the rate over all rounds, p50/p99 over all latencies, and 3-node/1-node per round;
//! 2. fire lateness in steady state (`sent_at − scheduled_at` from each node's file channel,
//!    over all the files): `HERALD_CLUSTER_PROBES` one-shots (default 3 000) due over
//!    `HERALD_CLUSTER_SPREAD` (20 s), created across the nodes before the first is due — on
//!    the one node, then on the three;
//! 3. the same on the three nodes with the busiest one killed (SIGKILL) halfway through the
//!    spread: the probes on the victim's shards (their lateness is the failover) apart from
//!    the others' (which should stay at the steady figure), and the duplicates (one
//!    idempotency key written twice over the files).
//!
//! Run: `scripts/bench-cluster` (a private PostgreSQL; it passes `HERALD_STORE_URL`, the
//! server's admin database, on which this bench creates one database per cluster).
//! `HERALD_CLUSTER_LEASE` sets the lease (renew a fifth of it, safety a tenth, as in
//! `tests/cluster_failover.rs`); `HERALD_CLUSTER_LEAD` how long after the first probe's
//! create it is due (default 5 s + 1 ms per probe).

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use support::*;

const SHARDS: u32 = 64;
const CONNS: usize = 64;

fn ms_of(s: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(s).map_or(0, |t| t.timestamp_millis())
}

/// Lease, renew and safety in ms: `HERALD_CLUSTER_LEASE` (default HA.md's 10 s), renew a
/// fifth of it and safety a tenth (HA.md's 2 s and 1 s at the default).
fn timing() -> (u64, u64, u64) {
    let lease = std::env::var("HERALD_CLUSTER_LEASE")
        .ok()
        .and_then(|v| herald::model::parse_duration_ms(&v).ok())
        .unwrap_or(10_000);
    (lease, lease / 5, lease / 10)
}

/// The server of `HERALD_STORE_URL`: databases are made on it with `psql`.
struct Pg {
    admin: String,
}

impl Pg {
    /// A fresh database named `name` (with this run's pid); answers its URL.
    fn create_db(&self, name: &str) -> String {
        let db = format!("{name}_{}", std::process::id());
        let out = std::process::Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &self.admin, "-c"])
            .arg(format!("CREATE DATABASE {db}"))
            .output()
            .expect("run psql (apt-get install -y postgresql-client)");
        assert!(
            out.status.success(),
            "CREATE DATABASE {db}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (server, _) = self.admin.rsplit_once('/').expect("a URL with a database");
        format!("{server}/{db}")
    }
}

/// One delivered line of a node's file channel.
struct Row {
    /// Index of the node whose file it is in.
    node: usize,
    task: String,
    key: String,
    scheduled: i64,
    sent: i64,
}

impl Row {
    fn late(&self) -> i64 {
        self.sent - self.scheduled
    }
}

/// Every line of the files whose task id starts with `prefix`.
fn rows(files: &[PathBuf], prefix: &str) -> Vec<Row> {
    let mut out = Vec::new();
    for (node, f) in files.iter().enumerate() {
        for l in std::fs::read_to_string(f).unwrap_or_default().lines() {
            let Ok(v) = serde_json::from_str::<Value>(l) else {
                continue;
            };
            let task = v["task_id"].as_str().unwrap_or_default();
            if !task.starts_with(prefix) {
                continue;
            }
            out.push(Row {
                node,
                task: task.to_string(),
                key: v["idempotency_key"].as_str().unwrap_or_default().into(),
                scheduled: ms_of(v["scheduled_at"].as_str().unwrap_or_default()),
                sent: ms_of(v["sent_at"].as_str().unwrap_or_default()),
            });
        }
    }
    out
}

/// The nodes' files read as they grow: the idempotency keys of the lines whose task id
/// starts with `prefix`.
struct Tail {
    files: Vec<PathBuf>,
    offsets: Vec<u64>,
    /// Per file, the bytes after its last newline (a line still being written).
    partial: Vec<Vec<u8>>,
    prefix: String,
    keys: BTreeSet<String>,
}

impl Tail {
    fn new(files: &[PathBuf], prefix: &str) -> Tail {
        Tail {
            files: files.to_vec(),
            offsets: vec![0; files.len()],
            partial: vec![Vec::new(); files.len()],
            prefix: prefix.to_string(),
            keys: BTreeSet::new(),
        }
    }

    /// Reads what was appended; answers how many new lines of the round it held.
    fn read(&mut self) -> usize {
        use std::io::{Read, Seek, SeekFrom};
        let mut new = 0;
        for (i, f) in self.files.iter().enumerate() {
            let Ok(mut file) = std::fs::File::open(f) else {
                continue;
            };
            let buf = &mut self.partial[i];
            if file.seek(SeekFrom::Start(self.offsets[i])).is_err() {
                continue;
            }
            let Ok(got) = file.read_to_end(buf) else {
                continue;
            };
            self.offsets[i] += got as u64;
            let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
                continue;
            };
            for l in buf[..end].split(|b| *b == b'\n') {
                let Ok(v) = serde_json::from_slice::<Value>(l) else {
                    continue;
                };
                if v["task_id"]
                    .as_str()
                    .is_some_and(|t| t.starts_with(&self.prefix))
                {
                    new += 1;
                    self.keys
                        .insert(v["idempotency_key"].as_str().unwrap_or_default().into());
                }
            }
            buf.drain(..=end);
        }
        new
    }
}

/// p50, p99 and max lateness (ms) of `rows`.
fn lateness<'a>(rows: impl Iterator<Item = &'a Row>) -> (i64, i64, i64) {
    let mut l: Vec<i64> = rows.map(Row::late).collect();
    l.sort_unstable();
    if l.is_empty() {
        return (0, 0, 0);
    }
    let p = |q: f64| l[((l.len() - 1) as f64 * q).round() as usize];
    (p(0.5), p(0.99), *l.last().unwrap())
}

/// Nodes of one cluster on one database, each with its own dir and file channel `probe`.
struct Cluster {
    dir: tempfile::TempDir,
    ids: Vec<String>,
    nodes: Vec<Option<Proc>>,
}

impl Cluster {
    /// Starts `count` nodes at once on `db` (all at once, so that none takes every shard
    /// first and has to hand them over one per round) and waits until they are balanced.
    async fn start(tag: &str, db: &str, count: usize, http: &Http) -> Cluster {
        let bin = std::env::var("HERALD_BENCH_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_herald").to_string());
        let dir = disk_dir(&format!("cluster-{tag}"));
        let (lease, renew, safety) = timing();
        let ids: Vec<String> = (0..count).map(|i| format!("{tag}-{i}")).collect();
        let nodes: Vec<Option<Proc>> = std::thread::scope(|s| {
            let handles: Vec<_> = ids
                .iter()
                .map(|id| {
                    let nd = dir.path().join(id);
                    std::fs::create_dir_all(&nd).expect("node dir");
                    let config = write_config(
                        &nd,
                        &format!(
                            "[limits]\nlive_tasks_max = 5000000\nhorizon = \"3650d\"\n\
                             [channels.probe]\nkind = \"file\"\npath = \"{}\"\n\
                             [cluster]\nnode_id = \"{id}\"\nshards = {SHARDS}\n\
                             lease = \"{lease}ms\"\nrenew = \"{renew}ms\"\nsafety = \"{safety}ms\"\n",
                            nd.join("probe.jsonl").display()
                        ),
                    );
                    let bin = bin.clone();
                    s.spawn(move || {
                        Proc::spawn_env(
                            &bin,
                            &config,
                            &nd.join("data"),
                            &[("HERALD_STORE_URL", db)],
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| Some(h.join().expect("node started")))
                .collect()
        });
        let c = Cluster { dir, ids, nodes };
        let t = Instant::now();
        for u in c.urls() {
            wait_healthy(http, &u, Duration::from_secs(120))
                .await
                .expect("node ready");
        }
        // Balanced: every shard held, none above `ceil(S / nodes)` (each node's aim: 22, 22
        // and 20 is as settled as 22, 21 and 21, since a node at its aim hands nothing over).
        let aim = u64::from(SHARDS).div_ceil(count as u64);
        let last = std::sync::Mutex::new(Vec::new());
        let balanced = poll_until(Duration::from_secs(240), || async {
            let mut owned = Vec::new();
            for u in c.urls() {
                owned.push(shards_owned(http, &u).await);
            }
            let done =
                owned.iter().sum::<u64>() == u64::from(SHARDS) && owned.iter().all(|o| *o <= aim);
            *last.lock().unwrap() = owned;
            done
        })
        .await;
        assert!(
            balanced.is_some(),
            "{tag}: the nodes did not balance in 240 s: they hold {:?}",
            last.lock().unwrap()
        );
        println!(
            "   {count} node(s) on a fresh database, lease {lease} ms / renew {renew} ms / safety {safety} ms: balanced ({:?} shards) {:.1} s after start",
            last.lock().unwrap(),
            t.elapsed().as_secs_f64()
        );
        c
    }

    /// The live nodes' base URLs.
    fn urls(&self) -> Vec<String> {
        self.nodes.iter().flatten().map(|p| p.url.clone()).collect()
    }

    /// Every node's file channel output (the killed ones' too).
    fn files(&self) -> Vec<PathBuf> {
        self.ids
            .iter()
            .map(|id| self.dir.path().join(id).join("probe.jsonl"))
            .collect()
    }

    /// Herald's CPU (ns) so far, summed over the live nodes.
    fn cpu_ns(&self) -> u64 {
        self.nodes
            .iter()
            .flatten()
            .map(|p| thread_cpu_ns(p.pid()).values().sum::<u64>())
            .sum()
    }
}

/// `/healthz` "cluster".shards_owned (0 when it does not answer).
async fn shards_owned(http: &Http, base: &str) -> u64 {
    let (_, b) = get(http, &format!("{base}/healthz")).await;
    serde_json::from_slice::<Value>(&b)
        .ok()
        .map_or(0, |v| v["cluster"]["shards_owned"].as_u64().unwrap_or(0))
}

/// A configuration's creates over all its rounds.
#[derive(Default)]
struct Creates {
    lat: Vec<Duration>,
    wall: Duration,
    n: u64,
    failed: u64,
    cpu_ns: u64,
    /// Each round's rate, in order.
    rates: Vec<f64>,
}

impl Creates {
    fn rate(&self) -> f64 {
        self.n as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Percentile `p` of every round's latencies, in ms.
    fn ms(&self, p: f64) -> f64 {
        let mut l = self.lat.clone();
        l.sort();
        pct(&l, p).as_secs_f64() * 1e3
    }

    fn cpu_us(&self) -> f64 {
        self.cpu_ns as f64 / 1e3 / self.n.max(1) as f64
    }
}

/// The body of create `i + offset`: a one-shot 48 h out (as `benches/load.rs` creates).
fn create_body(offset: u64) -> Arc<dyn Fn(u64) -> Bytes + Send + Sync> {
    Arc::new(move |i| {
        Bytes::from(format!(
            r#"{{"id":"c{:08}","schedule":{{"after":"48h"}},"to":["a"],"body":"Good morning"}}"#,
            i + offset
        ))
    })
}

/// One round of `n` durable creates at 64 connections spread over the cluster's nodes (ids
/// from `offset`), added to `into` and printed.
async fn create_round(c: &Cluster, n: u64, offset: u64, into: &mut Creates) {
    let bases = c.urls();
    let failed = Arc::new(AtomicU64::new(0));
    let (cpu0, m0) = (c.cpu_ns(), machine_cpu());
    let (lat, wall) =
        create_many_lean_spread(&bases, n, CONNS, create_body(offset), failed.clone()).await;
    let (cpu1, m1) = (c.cpu_ns(), machine_cpu());
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let failed = failed.load(Ordering::Relaxed);
    let cpu = cpu1.saturating_sub(cpu0);
    println!(
        "   {n} creates at {CONNS} connections over {} node(s): {:.0}/s, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, non-201 {failed}; herald CPU per create (all nodes) {:.0} µs; machine: {}",
        bases.len(),
        n as f64 / wall.as_secs_f64(),
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        ms(pct(&lat, 1.0)),
        cpu as f64 / 1e3 / n as f64,
        machine_split(&m0, &m1)
    );
    into.rates.push(n as f64 / wall.as_secs_f64());
    into.lat.extend(lat);
    into.wall += wall;
    into.n += n;
    into.failed += failed;
    into.cpu_ns += cpu;
}

/// The creates of the one node and of the three, in alternating rounds (`rounds` each of `n`,
/// the one node first in even rounds, the three in odd ones) so that neither gets the
/// machine's better minutes; each after a warm-up of `n / 10` creates, not counted.
async fn creates(one: &Cluster, three: &Cluster, n: u64, rounds: u64) -> (Creates, Creates) {
    let (mut c1, mut c3) = (Creates::default(), Creates::default());
    for c in [one, three] {
        let warm = Arc::new(AtomicU64::new(0));
        create_many_lean_spread(&c.urls(), n / 10, CONNS, create_body(1 << 40), warm).await;
    }
    for r in 0..rounds {
        if r % 2 == 0 {
            create_round(one, n, r * n, &mut c1).await;
            create_round(three, n, r * n, &mut c3).await;
        } else {
            create_round(three, n, r * n, &mut c3).await;
            create_round(one, n, r * n, &mut c1).await;
        }
    }
    (c1, c3)
}

/// One probe round's outcome.
struct Probes {
    rows: Vec<Row>,
    missing: usize,
    /// Kill instant (Unix ms) and the victim's shards, when a node was killed.
    kill: Option<(i64, BTreeSet<u32>)>,
}

/// `n` one-shots due evenly over `spread`, created through every node (12 connections)
/// before the first is due; with `kill`, the busiest node is killed with SIGKILL halfway
/// through the spread. Waits until every probe was written, then until no line of the
/// round came for 3 s (an inherited in-flight message is sent again ~1 s after its shard is
/// loaded: the file channel has no timeout, plus twice `max_clock_offset`).
async fn probe_round(c: &mut Cluster, http: &Http, tag: &str, n: u64, kill: bool) -> Probes {
    let spread = env_u64("HERALD_CLUSTER_SPREAD", 20_000);
    let lead = env_u64("HERALD_CLUSTER_LEAD", 5_000 + n);
    let first = now_ms() + lead;
    let at: Vec<String> = (0..n).map(|i| rfc3339(first + i * spread / n)).collect();
    let prefix = tag.to_string();
    let body: Arc<dyn Fn(u64) -> Bytes + Send + Sync> = Arc::new(move |i| {
        Bytes::from(format!(
            r#"{{"id":"{prefix}{i:06}","channel":"probe","schedule":{{"at":"{}"}},"to":["p"],"body":"x"}}"#,
            at[i as usize]
        ))
    });
    let failed = Arc::new(AtomicU64::new(0));
    create_many_lean_spread(&c.urls(), n, 12, body, failed.clone()).await;
    let created = now_ms();
    if created >= first {
        println!(
            "   (the probes' creates ended {} ms after the first was due: the early ones' lateness includes the creates; raise HERALD_CLUSTER_LEAD)",
            created - first
        );
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0, "a probe's create failed");
    let mut killed = None;
    if kill {
        let at = first + spread / 2;
        tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await;
        killed = Some(kill_busiest(c, http).await);
    }
    let files = c.files();
    // Reads only what was appended since the last look, every 250 ms: parsing whole files
    // every poll would take CPU from the nodes on these same 2 cores (as `load.rs` found).
    let mut tail = Tail::new(&files, tag);
    let deadline = Instant::now() + Duration::from_millis(spread + 120_000);
    while (tail.keys.len() as u64) < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        tail.read();
    }
    if (tail.keys.len() as u64) < n {
        println!(
            "   (only {} of {n} probes were written within {} s)",
            tail.keys.len(),
            (spread + 120_000) / 1000
        );
    }
    // Then 3 s without a new line of the round: an inherited in-flight message has been sent
    // again by then (bounded at 30 s).
    let mut quiet_since = Instant::now();
    let end = Instant::now() + Duration::from_secs(30);
    while quiet_since.elapsed() < Duration::from_secs(3) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if tail.read() > 0 {
            quiet_since = Instant::now();
        }
    }
    let rows = rows(&files, tag);
    let keys: BTreeSet<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    let missing = (n as usize).saturating_sub(keys.len());
    Probes {
        missing,
        kill: killed,
        rows,
    }
}

/// Kills (SIGKILL) the node that holds the most shards; answers the instant (Unix ms) and
/// the shards it held, as another node's `GET /v1/cluster` saw them just before.
async fn kill_busiest(c: &mut Cluster, http: &Http) -> (i64, BTreeSet<u32>) {
    let urls = c.urls();
    let (_, b) = get(http, &format!("{}/v1/cluster", urls[0])).await;
    let view: Value = serde_json::from_slice(&b).expect("cluster view");
    let mut by_node: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for s in view["leases"].as_array().into_iter().flatten() {
        if let (Some(o), Some(n)) = (s["owner_node"].as_str(), s["shard"].as_u64()) {
            by_node.entry(o.to_string()).or_default().insert(n as u32);
        }
    }
    let (victim, shards) = by_node
        .into_iter()
        .max_by_key(|(_, s)| s.len())
        .expect("an owner");
    let i = c.ids.iter().position(|id| *id == victim).expect("victim");
    let at = now_ms() as i64;
    if let Some(mut p) = c.nodes[i].take() {
        p.kill9();
    }
    println!(
        "   killed {victim} (SIGKILL) holding {} shards",
        shards.len()
    );
    (at, shards)
}

/// Steady-state figures, printed: lateness (p50, p99, max) and the duplicates and missing.
fn report_steady(what: &str, p: &Probes, n: u64) -> ((i64, i64, i64), usize, usize) {
    let (p50, p99, max) = lateness(p.rows.iter());
    let dups = duplicates(&p.rows).len();
    println!(
        "   {what}: {n} probes over the files (lines per node {:?}): lateness p50 {p50} ms, p99 {p99} ms, max {max} ms; missing {}, duplicates {dups}",
        per_node(&p.rows),
        p.missing,
    );
    ((p50, p99, max), dups, p.missing)
}

/// The median of sorted `v` (the mean of the middle two when even).
fn median(v: &[f64]) -> f64 {
    let m = v.len() / 2;
    match v.len() {
        0 => f64::NAN,
        l if l % 2 == 0 => (v[m - 1] + v[m]) / 2.0,
        _ => v[m],
    }
}

/// Lines per node's file.
fn per_node(rows: &[Row]) -> Vec<usize> {
    let mut n = Vec::new();
    for r in rows {
        if n.len() <= r.node {
            n.resize(r.node + 1, 0);
        }
        n[r.node] += 1;
    }
    n
}

/// Idempotency keys written more than once over the files.
fn duplicates(rows: &[Row]) -> Vec<&str> {
    let mut per: HashMap<&str, usize> = HashMap::new();
    for r in rows {
        *per.entry(r.key.as_str()).or_default() += 1;
    }
    let mut d: Vec<&str> = per
        .into_iter()
        .filter(|(_, c)| *c > 1)
        .map(|(k, _)| k)
        .collect();
    d.sort_unstable();
    d
}

/// The rows of `v` due at or after `kill`.
fn after<'a>(v: &[&'a Row], kill: i64) -> Vec<&'a Row> {
    v.iter().copied().filter(|r| r.scheduled >= kill).collect()
}

struct Failover {
    others: (i64, i64, i64),
    others_after: (i64, i64, i64),
    victim_after: (i64, i64, i64),
    first_send: i64,
    dups: usize,
    missing: usize,
}

fn report_failover(p: &Probes) -> Failover {
    let (kill, shards) = p.kill.clone().expect("a kill");
    let on_victim =
        |r: &&Row| shards.contains(&herald::store::pg::fence::shard_of_task(&r.task, SHARDS));
    let victim: Vec<&Row> = p.rows.iter().filter(on_victim).collect();
    let others: Vec<&Row> = p.rows.iter().filter(|r| !on_victim(r)).collect();
    let (va, oa) = (after(&victim, kill), after(&others, kill));
    let first_send = va.iter().map(|r| r.sent).min().map_or(-1, |s| s - kill);
    let dups = duplicates(&p.rows);
    let f = Failover {
        others: lateness(others.iter().copied()),
        others_after: lateness(oa.iter().copied()),
        victim_after: lateness(va.iter().copied()),
        first_send,
        dups: dups.len(),
        missing: p.missing,
    };
    let (vb50, vb99, vbmax) = lateness(victim.iter().copied().filter(|r| r.scheduled < kill));
    println!(
        "   probes on the victim's {} shards: {} ({} due after the kill): due before the kill p50 {vb50} / p99 {vb99} / max {vbmax} ms; due after it p50 {} / p99 {} / max {} ms; first send of one due after the kill {} ms after the kill",
        shards.len(),
        victim.len(),
        va.len(),
        f.victim_after.0,
        f.victim_after.1,
        f.victim_after.2,
        f.first_send
    );
    println!(
        "   probes on the other shards: {} ({} due after the kill): all p50 {} / p99 {} / max {} ms; due after the kill p50 {} / p99 {} / max {} ms",
        others.len(),
        oa.len(),
        f.others.0,
        f.others.1,
        f.others.2,
        f.others_after.0,
        f.others_after.1,
        f.others_after.2
    );
    // Due before the kill but sent a second or more late: the victim had them in flight (or
    // claimed ahead of their instant) and the new owner sent them once it loaded the shard.
    let inherited = victim
        .iter()
        .filter(|r| r.scheduled < kill && r.late() > 1_000)
        .count();
    println!("   victim's probes due before the kill and sent > 1 s late (in flight at the kill, sent by the new owner): {inherited}");
    let detail: Vec<String> = dups
        .iter()
        .map(|k| {
            let w: Vec<String> = p
                .rows
                .iter()
                .filter(|r| r.key == *k)
                .map(|r| format!("node {} sent at kill {:+} ms", r.node, r.sent - kill))
                .collect();
            let due = p
                .rows
                .iter()
                .find(|r| r.key == *k)
                .map_or(0, |r| r.scheduled - kill);
            format!("{k} (due at kill {due:+} ms: {})", w.join(", "))
        })
        .collect();
    println!(
        "   duplicates (one idempotency key written twice over the files): {} {detail:?}; missing {}; lines per node {:?}",
        f.dups,
        f.missing,
        per_node(&p.rows)
    );
    f
}

fn main() {
    let Ok(admin) = std::env::var("HERALD_STORE_URL") else {
        println!("cluster bench: needs a PostgreSQL server (HERALD_STORE_URL): run scripts/bench-cluster");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(Pg { admin }));
}

async fn run(pg: Pg) {
    let http = client();
    let n = env_u64("HERALD_CLUSTER_CREATES", 20_000);
    let rounds = env_u64("HERALD_CLUSTER_ROUNDS", 3).max(1);
    let probes = env_u64("HERALD_CLUSTER_PROBES", 3_000);
    let (lease, renew, _) = timing();

    println!("0. one node and three nodes, each cluster on its own database");
    let mut one = Cluster::start("one", &pg.create_db("herald_one"), 1, &http).await;
    let mut three = Cluster::start("three", &pg.create_db("herald_three"), 3, &http).await;
    println!("1. durable creates, {rounds} rounds each of {n}, alternating");
    let (c1, c3) = creates(&one, &three, n, rounds).await;
    println!("2. fire lateness in steady state (the other cluster idle)");
    let (s1, d1, m1) = report_steady(
        "steady state, 1 node",
        &probe_round(&mut one, &http, "s1-", probes, false).await,
        probes,
    );
    drop(one);
    let (s3, d3, m3) = report_steady(
        "steady state, 3 nodes",
        &probe_round(&mut three, &http, "s3-", probes, false).await,
        probes,
    );
    println!("3. three nodes, the busiest killed halfway through the probes");
    let f = report_failover(&probe_round(&mut three, &http, "f3-", probes, true).await);
    drop(three);

    let ratio = |a: f64, b: f64| if b == 0.0 { f64::NAN } else { a / b };
    println!();
    println!("| figure (same run, same PostgreSQL) | 3 nodes | baseline | 3 / baseline |");
    println!("|---|---|---|---|");
    let paired: Vec<f64> = c3.rates.iter().zip(&c1.rates).map(|(a, b)| a / b).collect();
    let mut sorted = paired.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "| creates/s, {CONNS} connections ({rounds} × {n}, alternating) | {:.0} | {:.0} (1 node) | {:.2} (per round: {}; median {:.2}) |",
        c3.rate(),
        c1.rate(),
        ratio(c3.rate(), c1.rate()),
        paired
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        median(&sorted)
    );
    println!(
        "| create p50 / p99 | {:.1} / {:.1} ms | {:.1} / {:.1} ms (1 node) | {:.2} / {:.2} |",
        c3.ms(0.5),
        c3.ms(0.99),
        c1.ms(0.5),
        c1.ms(0.99),
        ratio(c3.ms(0.5), c1.ms(0.5)),
        ratio(c3.ms(0.99), c1.ms(0.99))
    );
    println!(
        "| herald CPU per create (all nodes) | {:.0} µs | {:.0} µs (1 node) | {:.2} |",
        c3.cpu_us(),
        c1.cpu_us(),
        ratio(c3.cpu_us(), c1.cpu_us())
    );
    println!(
        "| non-201 creates | {} | {} (1 node) | |",
        c3.failed, c1.failed
    );
    println!(
        "| fire lateness, steady, p50 / p99 / max (target p99 ≤ 5 ms) | {} / {} / {} ms | {} / {} / {} ms (1 node) | p99 {:.2} |",
        s3.0,
        s3.1,
        s3.2,
        s1.0,
        s1.1,
        s1.2,
        ratio(s3.1 as f64, s1.1 as f64)
    );
    println!(
        "| during the kill, shards that did not move, due after it: p50 / p99 / max (target ≤ 5 ms) | {} / {} / {} ms | {} / {} / {} ms (3 nodes steady) | p99 {:.2} |",
        f.others_after.0,
        f.others_after.1,
        f.others_after.2,
        s3.0,
        s3.1,
        s3.2,
        ratio(f.others_after.1 as f64, s3.1 as f64)
    );
    println!(
        "| during the kill, the victim's shards, due after it: p50 / max lateness; kill → first send | {} / {} ms; {} ms | bound lease + renew = {} ms | max {:.2} |",
        f.victim_after.0,
        f.victim_after.2,
        f.first_send,
        lease + renew,
        ratio(f.victim_after.2 as f64, (lease + renew) as f64)
    );
    println!(
        "| duplicates over the files / probes missing | {} / {} (the kill) | {} / {} (steady, 1 node), {} / {} (steady, 3 nodes) | |",
        f.dups, f.missing, d1, m1, d3, m3
    );
}

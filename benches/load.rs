//! End-to-end load on the real binary (release build, data on the real disk, 2 cores), each
//! figure beside its same-run baseline:
//!
//! 1. durable creates over HTTP at 16/64/256 connections: rate, p50/p99, and CPU per create
//!    by thread (herald's and the load generator's) — beside the raw `fdatasync` rate of the
//!    same disk (what one-flush-per-create would allow). A lean HTTP/1.1 client drives it
//!    (`support::create_many_lean`); a round at 64 connections uses hyper's client; then a
//!    sustained round of ten times the creates, and last the issue's own measure, 64
//!    connections for 15 s (`HERALD_LOAD_SECS`), as many creates as it answers, so sled takes
//!    writes all through it; after each lean round, the same-run peer: Redis with `appendfsync always`, one `EVAL`
//!    (`ZADD` + `HSET`) per create, through `redis-benchmark` (skipped if not installed), with
//!    the CPU per create of redis-server and of redis-benchmark. The lean client runs on one
//!    thread, as redis-benchmark does; its CPU leaves out the competing writer's. Under each
//!    herald round and each peer round, the machine's split (user, system, softirq, iowait,
//!    idle, from `/proc/stat`) and its busy time per create, every process included: loopback
//!    traffic is processed in softirq, which no thread's CPU counts, and an idle share says
//!    the round was bound by waiting, not by the cores;
//! 2. a herd of `HERALD_LOAD_HERD` (default 100 000) one-shots due at the same instant to the
//!    file channel: when the first and the last leave, and how late 200 probe tasks due 1 s
//!    after the herd are (p50/p99) — the file channel's sends/s is the herd's drain rate;
//! 3. lateness of 200 probe sends with `HERALD_LOAD_PENDING` (default 1 000 000) tasks pending,
//!    first alone, then while 2 clients loop `GET /v1/tasks?state=paused&limit=100`.
//!
//! Run: `cargo bench --bench load` (about 8 minutes on 2 cores); `HERALD_LOAD_COMPETE=1` runs
//! a competing `fdatasync` writer on the same disk (1 MiB `O_DIRECT` writes; `=4k` the small
//! writer used until stop 59, which loads the cores more than the disk) through each creates round and its peer, and
//! through the herd from its fill's end to its last probe
//! (`support::Competitor`, bounded), so any hour can be a slow one; `HERALD_LOAD_ONLY=herd` (or
//! `creates`, `pending`) runs one part; `HERALD_LOAD_CREATES` sets the creates per round (30 000); `HERALD_LOAD_PREFER=return=minimal` asks for the short answer to every create of the lean client (the part says so); `HERALD_LOAD_TIMELINE=1` prints each lean round's rate per 100 ms (its dips, if any). Webhook throughput against
//! the raw hyper client is `cargo bench --bench delivery`.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use support::*;

fn ms_of(s: &str) -> u64 {
    chrono::DateTime::parse_from_rfc3339(s).map_or(0, |t| t.timestamp_millis() as u64)
}

/// (scheduled_at, sent_at) of every line of a file channel's output.
fn lines(path: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| {
            (
                ms_of(v["scheduled_at"].as_str().unwrap_or_default()),
                ms_of(v["sent_at"].as_str().unwrap_or_default()),
            )
        })
        .collect()
}

fn lateness(rows: &[(u64, u64)]) -> (u64, u64, u64) {
    let mut l: Vec<u64> = rows.iter().map(|(s, t)| t.saturating_sub(*s)).collect();
    l.sort_unstable();
    if l.is_empty() {
        return (0, 0, 0);
    }
    let p = |q: f64| l[((l.len() - 1) as f64 * q).round() as usize];
    (p(0.5), p(0.99), *l.last().unwrap())
}

/// Waits until `path` holds `n` lines. Reads only what was appended since the last poll and
/// counts newlines: parsing the whole file every poll took most of a core from herald at
/// 100 000 lines (the bench runs on the same 2 cores).
async fn wait_lines(path: &Path, n: usize, deadline: Duration) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let end = std::time::Instant::now() + deadline;
    let (mut offset, mut seen) = (0u64, 0usize);
    let mut buf = Vec::new();
    while std::time::Instant::now() < end {
        if let Ok(mut f) = std::fs::File::open(path) {
            buf.clear();
            if f.seek(SeekFrom::Start(offset)).is_ok() && f.read_to_end(&mut buf).is_ok() {
                offset += buf.len() as u64;
                seen += buf.iter().filter(|b| **b == b'\n').count();
            }
        }
        if seen >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// The config of every part; `HERALD_LOAD_CONFIG` adds TOML to it (an A/B of a setting,
/// e.g. `[store]\ncache_mb = 4`).
fn config_text(dir: &Path) -> String {
    format!(
        "[limits]\nlive_tasks_max = 5000000\nhorizon = \"3650d\"\n\
         [channels.herd]\nkind = \"file\"\npath = \"{}\"\n\
         [channels.probe]\nkind = \"file\"\npath = \"{}\"\n{}\n",
        dir.join("herd.jsonl").display(),
        dir.join("probe.jsonl").display(),
        std::env::var("HERALD_LOAD_CONFIG").unwrap_or_default()
    )
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // HERALD_LOAD_ONLY=creates|herd|pending runs one part.
    let only = std::env::var("HERALD_LOAD_ONLY").unwrap_or_default();
    let run = |part: &str| only.is_empty() || only == part;
    rt.block_on(async {
        if run("creates") {
            creates().await;
        }
        if run("herd") {
            herd(env_u64("HERALD_LOAD_HERD", 100_000)).await;
        }
        if run("pending") {
            pending_with_listings(env_u64("HERALD_LOAD_PENDING", 1_000_000)).await;
        }
        // Only on request: an A/B of two builds (`HERALD_AB_BIN`).
        if only == "ab" {
            creates_ab().await;
        }
    });
}

/// Two builds side by side, for an A/B on a machine whose speed drifts by the minute: build A
/// (`HERALD_BENCH_BIN`, or this one) and build B (`HERALD_AB_BIN`) run at the same time on
/// their own data dirs, and take turns at short rounds of creates at 64 connections
/// (`HERALD_AB_CONNS`) through
/// the lean client (`HERALD_AB_ROUNDS` rounds each, default 10, of `HERALD_LOAD_CREATES`, default 30 000; each
/// side's memtable is in sled before the next round). Each round's
/// rate and CPU per create are printed; the medians and B/A at the end.
/// `HERALD_AB_B_CONFIG` is TOML added to B's config only: the same build against itself with
/// one setting changed (e.g. `[store]` `timeline_max = 0`: what the timeline costs a create);
/// `HERALD_AB_B_PREFER` a `Prefer` value B's creates send (e.g. `return=minimal`);
/// `HERALD_LOAD_COMPETE=1` runs the competing `fdatasync` writer through all the rounds.
async fn creates_ab() {
    let Ok(bin_b) = std::env::var("HERALD_AB_BIN") else {
        println!("HERALD_AB_BIN (the build to compare) is not set");
        return;
    };
    let bin_a = std::env::var("HERALD_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_herald").to_string());
    let rounds = env_u64("HERALD_AB_ROUNDS", 10).max(1);
    let n = env_u64("HERALD_LOAD_CREATES", 30_000);
    let conns = env_u64("HERALD_AB_CONNS", 64) as usize;
    let mut sides = Vec::new();
    let b_extra = std::env::var("HERALD_AB_B_CONFIG").unwrap_or_default();
    let b_prefer = std::env::var("HERALD_AB_B_PREFER").unwrap_or_default();
    if !b_prefer.is_empty() {
        println!("   B's creates send Prefer: {b_prefer}");
    }
    for (tag, bin) in [("A", bin_a), ("B", bin_b)] {
        let dir = disk_dir(&format!("load-ab-{tag}"));
        let mut text = config_text(dir.path());
        if tag == "B" && !b_extra.is_empty() {
            println!("   B's config adds: {}", b_extra.replace('\n', " "));
            text.push_str(&b_extra);
            text.push('\n');
        }
        let config = write_config(dir.path(), &text);
        let herald = Proc::spawn_bin(&bin, &config, &dir.path().join("data"));
        println!("   {tag}: {bin}");
        sides.push((tag, dir, herald, Vec::new(), Vec::new(), Vec::new()));
    }
    let http = client();
    for (_, _, h, _, _, _) in &sides {
        wait_healthy(&http, &h.url, Duration::from_secs(60))
            .await
            .expect("ready");
    }
    // The competing writer (`HERALD_LOAD_COMPETE=1`) through every round of both, on A's disk.
    let competitor = Competitor::from_env(sides[0].1.path());
    if let Some(c) = &competitor {
        println!(
            "   with the competing writer through every round ({})",
            c.kind()
        );
    }
    let mut next = 0u64;
    for round in 0..rounds {
        // Alternate who goes first, so neither always follows the other's applier work.
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (tag, _, herald, rates, cpus, commits) = &mut sides[i];
            let offset = next;
            next += n;
            let body = create_body(offset);
            let failed = Arc::new(AtomicU64::new(0));
            let cpu0 = thread_cpu_ns(herald.pid());
            let flushes0 = metric(&http, &herald.url, "herald_store_flushes_total").await;
            let prefer = match (*tag, b_prefer.as_str()) {
                ("B", p) if !p.is_empty() => format!("prefer: {p}\r\n"),
                _ => support::prefer_header(),
            };
            let bases = [herald.url.clone()];
            let (_, wall) =
                create_many_lean_prefer(&bases, n, conns, body, failed.clone(), prefer).await;
            let cpu1 = thread_cpu_ns(herald.pid());
            let rate = n as f64 / wall.as_secs_f64();
            let flushes = metric(&http, &herald.url, "herald_store_flushes_total").await - flushes0;
            // Without the applier: a burst's sled work is paid after the round (the drain). Nor
            // the spare thread, whose segment fills the applier did until 2026-12-05 (so the
            // figure compares with earlier builds').
            let busy: u64 = cpu1
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "herald-apply" | "herald-spare"))
                .map(|(k, v)| v.saturating_sub(cpu0.get(k).copied().unwrap_or(0)))
                .sum();
            let us = busy as f64 / 1e3 / n as f64;
            let per_create = |thread: &str| {
                let ns = cpu1
                    .get(thread)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(cpu0.get(thread).copied().unwrap_or(0));
                ns as f64 / 1e3 / n as f64
            };
            let (commit_us, apply_us) = (per_create("herald-commit"), per_create("herald-apply"));
            // Its memtable into sled before the other side's round, so that neither round
            // shares the CPU with the other build's applier. How long that took is printed:
            // a build that holds sled's work back pays it here, outside the timed round.
            let drain = Instant::now();
            let drained = wait_memtable_empty(&http, &herald.url, Duration::from_secs(120)).await;
            println!(
                "   round {round:>2} {tag}: {rate:>6.0} creates/s, herald CPU per create without the applier {us:.1} µs (commit thread {commit_us:.1}; the applier during the round {apply_us:.1}), {:.1} creates per flush, non-201 {}; {}",
                n as f64 / flushes.max(1.0),
                failed.load(Ordering::Relaxed),
                if drained {
                    format!("memtable into sled {:.1} s after", drain.elapsed().as_secs_f64())
                } else {
                    "memtable NOT empty 120 s after".to_string()
                }
            );
            rates.push(rate);
            cpus.push(us);
            commits.push(commit_us);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let m = v.len() / 2;
        if v.len().is_multiple_of(2) {
            (v[m - 1] + v[m]) / 2.0
        } else {
            v[m]
        }
    };
    // Each round's B against the A right beside it: steadier than the medians when the
    // machine's speed drifts over the run.
    let ratios =
        |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(a, b)| b / a).collect() };
    let mut paired = ratios(&sides[0].3, &sides[1].3);
    let b_wins = paired.iter().filter(|r| **r > 1.0).count();
    let rounds_run = paired.len();
    // The same for CPU per create, whole and the commit thread's: on this VM a round's CPU
    // per create drifts with its speed, so a small saving shows best paired.
    let mut cpu_paired = ratios(&sides[0].4, &sides[1].4);
    let mut commit_paired = ratios(&sides[0].5, &sides[1].5);
    println!(
        "   paired B/A rate per round: median {:.2}; B faster in {b_wins} of {rounds_run}; CPU per create {:.2}, commit thread's {:.2}",
        median(&mut paired),
        median(&mut cpu_paired),
        median(&mut commit_paired)
    );
    let (mut ra, mut ca) = (sides[0].3.clone(), sides[0].4.clone());
    let (mut rb, mut cb) = (sides[1].3.clone(), sides[1].4.clone());
    let (ra, ca, rb, cb) = (
        median(&mut ra),
        median(&mut ca),
        median(&mut rb),
        median(&mut cb),
    );
    println!(
        "   medians: A {ra:.0}/s {ca:.1} µs; B {rb:.0}/s {cb:.1} µs; B/A rate {:.2}, CPU {:.2}",
        rb / ra,
        cb / ca
    );
}

/// The body of create `i + offset`: a one-shot 48 h out with one short message.
fn create_body(offset: u64) -> Arc<dyn Fn(u64) -> Bytes + Send + Sync> {
    Arc::new(move |i| {
        Bytes::from(format!(
            r#"{{"id":"c{:08}","schedule":{{"after":"48h"}},"to":["a"],"body":"Good morning"}}"#,
            i + offset
        ))
    })
}

async fn creates() {
    let dir = disk_dir("load-creates");
    println!("1. durable creates over HTTP (data on disk)");
    let prefer = support::prefer_header();
    if !prefer.is_empty() {
        println!(
            "   every create of the lean client sends {}",
            prefer.trim_end()
        );
    }
    println!(
        "   raw fdatasync of this disk: {:.0}/s",
        fdatasync_rate(dir.path())
    );
    let data = dir.path().join("data");
    let config = write_config(dir.path(), &config_text(dir.path()));
    let herald = Proc::spawn(&config, &data);
    let http = client();
    wait_healthy(&http, &herald.url, Duration::from_secs(60))
        .await
        .expect("ready");
    let redis = RedisPeer::start();
    let mut next = 0u64;
    // The lean client at each concurrency, then hyper's client at 64 connections (the client
    // of earlier stops' figures), so the load generator's share is visible in the same run.
    let burst = env_u64("HERALD_LOAD_CREATES", 30_000);
    // A last round at 64 connections ten times as long: the sustained rate, with sled taking
    // every write as it comes (a burst of 30 000 fits in the memtable, `store/pace.rs`).
    // Last, the issue's own measure: 64 connections for `HERALD_LOAD_SECS` (15 s), its
    // creates counted, with sled taking writes all through it (after the sustained round, so
    // that round's figures stay comparable with earlier runs').
    let timed = Duration::from_secs(env_u64("HERALD_LOAD_SECS", 15));
    for (conns, lean, n, for_) in [
        (16usize, true, burst, None),
        (64, true, burst, None),
        (256, true, burst, None),
        (64, false, burst, None),
        (64, true, 10 * burst, None),
        (64, true, 100 * burst, Some(timed)),
    ] {
        let body = create_body(next);
        let failed = Arc::new(AtomicU64::new(0));
        // The competing writer (if asked for) runs through herald's round and the peer's, and
        // the raw fdatasync rate is read under it, beside each figure.
        let competitor = Competitor::from_env(dir.path());
        println!(
            "   raw fdatasync now{}: {:.0}/s",
            if competitor.is_some() {
                ", with the competing writer"
            } else {
                ""
            },
            fdatasync_rate(dir.path())
        );
        let (cpu0, own0, m0) = (
            thread_cpu_ns(herald.pid()),
            generator_cpu_ns(),
            machine_cpu(),
        );
        let syncs0 = metric(&http, &herald.url, "herald_store_flushes_total").await;
        let (lat, wall) = if lean {
            let limit = support::LeanLimit { n, for_ };
            let bases = [herald.url.clone()];
            create_many_lean_limited(&bases, limit, conns, body, failed.clone(), prefer.clone())
                .await
        } else {
            create_many(&http, &herald.url, n, conns, body, failed.clone()).await
        };
        // A round bounded by time made as many creates as it answered.
        let n = lat.len() as u64;
        next += n;
        let (cpu1, own1, m1) = (
            thread_cpu_ns(herald.pid()),
            generator_cpu_ns(),
            machine_cpu(),
        );
        println!(
            "   {conns:>3} connections{}: {:>6.0} creates/s, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, non-201 {}",
            if !lean {
                " (hyper client)".to_string()
            } else if let Some(d) = for_ {
                format!(" for {} s ({n} creates)", d.as_secs())
            } else if n > burst {
                format!(", sustained ({n} creates)")
            } else {
                String::new()
            },
            n as f64 / wall.as_secs_f64(),
            pct(&lat, 0.5).as_secs_f64() * 1e3,
            pct(&lat, 0.99).as_secs_f64() * 1e3,
            pct(&lat, 1.0).as_secs_f64() * 1e3,
            failed.load(Ordering::Relaxed)
        );
        // CPU per create: steadier than the rate on a VM whose speed varies, and it tells
        // where the time goes (the load generator shares the 2 cores).
        println!(
            "       CPU per create: herald {}; load generator {:.1} µs",
            cpu_per_item(&cpu0, &cpu1, n),
            (own1 - own0) as f64 / 1e3 / n as f64
        );
        println!(
            "       machine: {}; per create {}",
            machine_split(&m0, &m1),
            machine_per_item(&m0, &m1, n)
        );
        let syncs = metric(&http, &herald.url, "herald_store_flushes_total").await - syncs0;
        println!(
            "       herald's durable syncs: {:.3} per create, {:.0}/s",
            syncs / n as f64,
            syncs / wall.as_secs_f64()
        );
        print_store_metrics(&http, &herald.url).await;
        // What herald still owes sled is paid before anything else runs, so that it does not
        // take the CPU from the peer or from the next round.
        let caught_up = Instant::now();
        if wait_memtable_empty(&http, &herald.url, Duration::from_secs(120)).await {
            println!(
                "       sled took the rest of the memtable in {:.1} s",
                caught_up.elapsed().as_secs_f64()
            );
        } else {
            println!("       the memtable was not empty after 120 s");
        }
        // The same-run peer right after each herald round, on the same disk and cores.
        if let (true, Some(r)) = (lean, redis.as_ref()) {
            let m0 = machine_cpu();
            match r.creates(n, conns) {
                Some(r) => println!(
                    "       Redis peer (appendfsync always, ZADD+HSET in one EVAL, redis-benchmark): {:>6.0}/s, p50 {:.1} ms, p99 {:.1} ms; herald/Redis {:.2}\n       CPU per create: redis-server {:.1} µs; redis-benchmark {:.1} µs\n       machine: {}",
                    r.rate,
                    r.p50,
                    r.p99,
                    n as f64 / wall.as_secs_f64() / r.rate,
                    r.server_us,
                    r.client_us,
                    {
                        let m1 = machine_cpu();
                        format!(
                            "{}; per create {}",
                            machine_split(&m0, &m1),
                            machine_per_item(&m0, &m1, n)
                        )
                    }
                ),
                None => println!("       Redis peer: redis-benchmark gave no reading"),
            }
        }
        if let Some(c) = competitor {
            println!(
                "       competing writer ({}): {:.0} fdatasync/s through the round, {:.0} % of a core",
                c.kind(),
                c.rate(),
                100.0 * c.cpu_share()
            );
        }
    }
}

async fn herd(n: u64) {
    let dir = disk_dir("load-herd");
    let data = dir.path().join("data");
    let config = write_config(dir.path(), &config_text(dir.path()));
    let herald = Proc::spawn(&config, &data);
    let http = client();
    wait_healthy(&http, &herald.url, Duration::from_secs(60))
        .await
        .expect("ready");
    // Due far enough ahead that the fill is done (creates run at several thousand per second).
    let due = now_ms() + 30_000 + n / 2;
    let at = rfc3339(due);
    let probe_at: Vec<String> = (0..200).map(|i| rfc3339(due + 1_000 + i * 5)).collect();
    let body: Arc<dyn Fn(u64) -> Bytes + Send + Sync> = Arc::new(move |i| {
        Bytes::from(format!(
            r#"{{"id":"h{i:08}","channel":"herd","schedule":{{"at":"{at}"}},"misfire":"skip","misfire_grace":"1s","to":["u{i}"],"body":"x"}}"#
        ))
    });
    let failed = Arc::new(AtomicU64::new(0));
    create_many(&http, &herald.url, n, 64, body, failed.clone()).await;
    let probes: Arc<dyn Fn(u64) -> Bytes + Send + Sync> = Arc::new(move |i| {
        Bytes::from(format!(
            r#"{{"id":"p{i:04}","channel":"probe","schedule":{{"at":"{}"}},"to":["p"],"body":"x"}}"#,
            probe_at[i as usize]
        ))
    });
    create_many(&http, &herald.url, 200, 8, probes, failed.clone()).await;
    assert!(
        now_ms() < due,
        "the fill took longer than the lead; raise it"
    );
    println!(
        "2. herd: {n} one-shots due at the same instant (file channel, misfire skip, grace 1s), due {due} ms since the epoch (to line up a profile)"
    );
    // The competing writer (if asked for) from here through the herd and its probes, and the
    // raw fdatasync rate under it, beside the figure.
    println!(
        "   raw fdatasync of this disk: {:.0}/s",
        fdatasync_rate(dir.path())
    );
    let competitor = Competitor::from_env(dir.path());
    if competitor.is_some() {
        println!(
            "   raw fdatasync now, with the competing writer: {:.0}/s",
            fdatasync_rate(dir.path())
        );
    }
    assert!(
        now_ms() < due,
        "the fill and the fdatasync probes took longer than the lead; raise it"
    );
    // herald's CPU from the fill's end to the last send (the fires ahead of the instant,
    // the sends, and what sled takes meanwhile): steadier than the last send's instant when
    // two builds are compared in a noisy hour.
    let cpu0 = thread_cpu_ns(herald.pid());
    let done = wait_lines(
        &dir.path().join("herd.jsonl"),
        n as usize,
        Duration::from_secs(600),
    )
    .await;
    wait_lines(
        &dir.path().join("probe.jsonl"),
        200,
        Duration::from_secs(120),
    )
    .await;
    let cpu1 = thread_cpu_ns(herald.pid());
    if let Some(c) = competitor {
        println!(
            "   competing writer ({}): {:.0} fdatasync/s through the herd, {:.0} % of a core",
            c.kind(),
            c.rate(),
            100.0 * c.cpu_share()
        );
    }
    let rows = lines(&dir.path().join("herd.jsonl"));
    let first = rows.iter().map(|r| r.1).min().unwrap_or(0);
    let last = rows.iter().map(|r| r.1).max().unwrap_or(0);
    println!(
        "   sent {} of {n} (all: {done}); first left at due + {} ms, last at due + {} ms: {:.0} sends/s through the file channel",
        rows.len(),
        first.saturating_sub(due),
        last.saturating_sub(due),
        rows.len() as f64 / ((last.saturating_sub(due)).max(1) as f64 / 1000.0)
    );
    // Sends per 500 ms after due: where the drain is slow.
    let mut slices = vec![0u32; ((last.saturating_sub(due)) / 500 + 1) as usize];
    for r in &rows {
        if let Some(s) = slices.get_mut((r.1.saturating_sub(due) / 500) as usize) {
            *s += 1;
        }
    }
    println!("   sends per 500 ms after due: {slices:?}");
    // Finer, where a stall shows as a gap rather than a slower half-second.
    let mut fine = vec![0u32; ((last.saturating_sub(due)) / 100 + 1) as usize];
    for r in &rows {
        if let Some(s) = fine.get_mut((r.1.saturating_sub(due) / 100) as usize) {
            *s += 1;
        }
    }
    println!("   sends per 100 ms after due: {fine:?}");
    println!(
        "   herald CPU per one-shot, fill's end to last send: {}",
        cpu_per_item(&cpu0, &cpu1, n)
    );
    let probes = lines(&dir.path().join("probe.jsonl"));
    let (p50, p99, max) = lateness(&probes);
    println!(
        "   200 probes due 1 s after the herd: lateness p50 {p50} ms, p99 {p99} ms, max {max} ms"
    );
    // The late ones, by when they were due after the herd's instant: tells a backlog at the
    // herd's end from a stall later on.
    let mut late: Vec<(u64, u64)> = probes
        .iter()
        .filter(|(s, t)| t.saturating_sub(*s) > 5)
        .map(|(s, t)| (s.saturating_sub(due), t.saturating_sub(*s)))
        .collect();
    late.sort_unstable();
    println!("   probes over 5 ms late (due after the herd's instant, ms late): {late:?}");
    // With the metrics, the latest probe's timeline too (its fire, start and send instants
    // tell which step it waited in).
    if let (true, Some(&(after, _))) = (
        std::env::var("HERALD_LOAD_METRICS").is_ok(),
        late.iter().max_by_key(|(_, l)| *l),
    ) {
        let id = format!("p{:04}", after.saturating_sub(1_000) / 5);
        let (_, t) = get(&http, &format!("{}/v1/tasks/{id}/timeline", herald.url)).await;
        println!("   timeline of {id}: {}", String::from_utf8_lossy(&t));
    }
    print_store_metrics(&http, &herald.url).await;
    println!("   non-201 creates: {}", failed.load(Ordering::Relaxed));
}

/// Waits until herald's memtable is empty (its `herald_store_memtable_bytes` reads 0).
async fn wait_memtable_empty(http: &Http, base: &str, deadline: Duration) -> bool {
    let until = Instant::now() + deadline;
    while Instant::now() < until {
        let Ok((_, m)) = tokio::time::timeout(
            Duration::from_secs(5),
            get(http, &format!("{base}/metrics")),
        )
        .await
        else {
            continue;
        };
        let empty = String::from_utf8_lossy(&m)
            .lines()
            .any(|l| l == "herald_store_memtable_bytes 0");
        if empty {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// One counter or gauge of herald's `/metrics` (0 when it is missing).
async fn metric(http: &Http, base: &str, name: &str) -> f64 {
    let (_, m) = get(http, &format!("{base}/metrics")).await;
    String::from_utf8_lossy(&m)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// With `HERALD_LOAD_METRICS` set: herald's store and lateness metrics (cumulative).
async fn print_store_metrics(http: &Http, base: &str) {
    if std::env::var("HERALD_LOAD_METRICS").is_ok() {
        let (_, m) = get(http, &format!("{base}/metrics")).await;
        for l in String::from_utf8_lossy(&m).lines() {
            if l.starts_with("herald_store")
                || l.starts_with("herald_send_lateness")
                || l.starts_with("herald_send_chunked")
            {
                println!("   {l}");
            }
        }
    }
}

async fn probe_round(http: &Http, base: &str, tag: &str, dir: &Path) -> (u64, u64, u64) {
    let path = dir.join("probe.jsonl");
    let before = lines(&path).len();
    let start = now_ms() + 2_000;
    let at: Vec<String> = (0..200).map(|i| rfc3339(start + i * 50)).collect();
    let tag = tag.to_string();
    let body: Arc<dyn Fn(u64) -> Bytes + Send + Sync> = Arc::new(move |i| {
        Bytes::from(format!(
            r#"{{"id":"{tag}{i:04}","channel":"probe","schedule":{{"at":"{}"}},"to":["p"],"body":"x"}}"#,
            at[i as usize]
        ))
    });
    create_many(http, base, 200, 8, body, Arc::new(AtomicU64::new(0))).await;
    wait_lines(&path, before + 200, Duration::from_secs(120)).await;
    lateness(&lines(&path)[before..])
}

async fn pending_with_listings(n: u64) {
    let dir = disk_dir("load-pending");
    let data = dir.path().join("data");
    let config = write_config(dir.path(), &config_text(dir.path()));
    let herald = Proc::spawn(&config, &data);
    let http = client();
    wait_healthy(&http, &herald.url, Duration::from_secs(60))
        .await
        .expect("ready");
    let body: Arc<dyn Fn(u64) -> Bytes + Send + Sync> = Arc::new(|i| {
        Bytes::from(format!(
            r#"{{"id":"t{i:08}","schedule":{{"after":"48h"}},"to":["a"],"body":"x"}}"#
        ))
    });
    create_many(&http, &herald.url, n, 64, body, Arc::new(AtomicU64::new(0))).await;
    println!("3. lateness of 200 probe sends (50 ms apart) with {n} tasks pending");
    let (p50, p99, max) = probe_round(&http, &herald.url, "a", dir.path()).await;
    println!("   alone: p50 {p50} ms, p99 {p99} ms, max {max} ms");
    let stop = Arc::new(AtomicBool::new(false));
    let listed = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..2 {
        let (http, url, stop, listed) = (
            http.clone(),
            format!("{}/v1/tasks?state=paused&limit=100", herald.url),
            stop.clone(),
            listed.clone(),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                get(&http, &url).await;
                listed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let (p50, p99, max) = probe_round(&http, &herald.url, "b", dir.path()).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    println!(
        "   with 2 clients looping filtered listings ({} listings): p50 {p50} ms, p99 {p99} ms, max {max} ms",
        listed.load(Ordering::Relaxed)
    );
}

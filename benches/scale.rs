//! Scale: fill N pending one-shot tasks (one short message each) through the real binary over
//! HTTP, then report RSS, bytes on disk, the create rate at the start and at the end of the
//! fill, and the time from process start to ready (`/healthz` 200) after a `kill -9`.
//!
//! Run: `cargo bench --bench scale` (N = 1 000 000, about 2–4 minutes on 2 cores);
//! `HERALD_SCALE_N=200000 cargo bench --bench scale` for a quicker look. Data on the real
//! disk (under `target/bench-data`), release build, 64 client connections.
//! `HERALD_SCALE_CONFIG` adds TOML to the config (an A/B of a setting, e.g. `[store] cache_mb`).
//! `HERALD_SCALE_KEEP=1` keeps the data directory and prints its path (for
//! `cargo run --release --example tree_bytes -- <dir>/sled`, which tells where its bytes go).

mod support;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::*;

fn main() {
    let n: u64 = std::env::var("HERALD_SCALE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(n));
}

async fn run(n: u64) {
    let dir = disk_dir("scale");
    let data = dir.path().join("data");
    // HERALD_SCALE_CONFIG: TOML added to the config (e.g. `[store]\ncache_mb = 4`), for an A/B.
    let extra = std::env::var("HERALD_SCALE_CONFIG").unwrap_or_default();
    let config = write_config(
        dir.path(),
        &format!("[limits]\nlive_tasks_max = 5000000\nhorizon = \"3650d\"\n{extra}\n"),
    );
    let mut herald = Proc::spawn(&config, &data);
    let http = client();
    let base = herald.url.clone();
    wait_healthy(&http, &base, Duration::from_secs(60))
        .await
        .expect("ready");
    let rss0 = herald.rss_mib();
    println!("scale: N = {n} pending one-shots, 64 connections, data on disk");
    println!("  RSS at start: {rss0:.0} MiB");
    let body: Arc<dyn Fn(u64) -> Bytes + Send + Sync> = Arc::new(|i| {
        Bytes::from(format!(
            r#"{{"id":"t{i:08}","schedule":{{"after":"48h"}},"to":["user{i}"],"body":"Your class starts soon"}}"#
        ))
    });
    let failed = Arc::new(AtomicU64::new(0));
    // Fill in slices, measuring the rate of each slice.
    let slice = (n / 20).max(1);
    let mut done = 0;
    let mut rates = Vec::new();
    while done < n {
        let k = slice.min(n - done);
        let offset = done;
        let b = body.clone();
        let shifted: Arc<dyn Fn(u64) -> Bytes + Send + Sync> = Arc::new(move |i| b(i + offset));
        let (lat, wall) = create_many(&http, &base, k, 64, shifted, failed.clone()).await;
        let rate = k as f64 / wall.as_secs_f64();
        rates.push(rate);
        done += k;
        println!(
            "  filled {done:>8}: {rate:>7.0} creates/s, p50 {:?} p99 {:?}, RSS {:.0} MiB",
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            herald.rss_mib()
        );
    }
    let rss = herald.rss_mib();
    let disk = du(&data) as f64 / (1 << 20) as f64;
    let per_task = |bytes: u64| bytes as f64 / n as f64;
    let first = rates.first().copied().unwrap_or(0.0);
    let last = rates.last().copied().unwrap_or(0.0);
    println!(
        "  failed creates: {}",
        failed.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!(
        "  RSS at {n} pending, right after the fill: {rss:.0} MiB, peak during the fill {:.0} MiB \
         (targets <= 300 and <= 400 MB)",
        herald.peak_rss_mib()
    );
    // The write-behind memtable holds the last writes until the applier has them in sled
    // (at most ~2 s after writes stop): RSS once it is empty is the pending state's own.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let quiet = loop {
        let (_, m) = get(&http, &format!("{base}/metrics")).await;
        let bytes = String::from_utf8_lossy(&m)
            .lines()
            .find_map(|l| l.strip_prefix("herald_store_memtable_bytes "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        if bytes == Some(0.0) || std::time::Instant::now() > deadline {
            break bytes;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "  RSS at {n} pending, memtable written into sled ({}): {:.0} MiB (target <= 300 MB)",
        match quiet {
            Some(0.0) => "empty".to_string(),
            other => format!("not empty after 60 s: {other:?} bytes"),
        },
        herald.rss_mib()
    );
    println!(
        "  data dir: {disk:.0} MiB right after the fill; {:.0} bytes per task once the memtable \
         is in sled (target <= 400)",
        per_task(du(&data))
    );
    println!(
        "  create rate: first slice {first:.0}/s, last slice {last:.0}/s (last/first {:.2}; target >= 0.80)",
        last / first
    );
    herald.kill9();
    // Restart: time from process start to /healthz 200.
    let mut again = Proc::spawn(&config, &data);
    let ready = wait_healthy(&http, &again.url, Duration::from_secs(600))
        .await
        .expect("ready after restart");
    let took = ready.duration_since(again.started);
    println!(
        "  kill -9, restart: ready {:.2} s after process start (target <= 1 s), RSS {:.0} MiB",
        took.as_secs_f64(),
        again.rss_mib()
    );
    // The rest of the live index loads in the background after ready (tasks due within a
    // minute, and running ones, are loaded before).
    let loaded = poll_until(Duration::from_secs(600), || async {
        let (_, m) = get(&http, &format!("{}/metrics", again.url)).await;
        String::from_utf8_lossy(&m).contains("herald_live_index_loading 0")
    })
    .await;
    println!(
        "  live index loaded in the background {} after process start, RSS {:.0} MiB",
        match loaded {
            Some(at) => format!("{:.2} s", at.duration_since(again.started).as_secs_f64()),
            None => "not within 600 s".into(),
        },
        again.rss_mib()
    );
    // The issue's own figure: RSS 10 s after the restart, everything loaded, nothing running.
    let settle = again.started + Duration::from_secs(10);
    tokio::time::sleep_until(settle.into()).await;
    println!(
        "  RSS 10 s after the restart (everything loaded, idle): {:.0} MiB (target <= 300 MB)",
        again.rss_mib()
    );
    println!(
        "  data dir after the restart and the load: {:.0} bytes per task",
        per_task(du(&data))
    );
    let (status, b) = get(&http, &format!("{}/v1/tasks/t{:08}", again.url, n - 1)).await;
    assert_eq!(
        status, 200,
        "the last task is there after the restart: {b:?}"
    );
    again.kill9();
    if std::env::var_os("HERALD_SCALE_KEEP").is_some() {
        println!("  data dir kept: {}", dir.keep().display());
    }
}

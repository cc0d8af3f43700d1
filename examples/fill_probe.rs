//! Where start-up time and memory go, without HTTP in the way: fills N pending one-shots
//! through the engine in-process (64 concurrent creates), or reopens a filled directory and
//! times sled's open, the recovery, and RSS after each.
//!
//! ```sh
//! cargo run --release --example fill_probe -- 1000000 /path/to/dir fill   # fill
//! cargo run --release --example fill_probe -- 1000000 /path/to/dir        # reopen and time
//! CACHE_MB=64 ...   # sled's cache (default: herald's default)
//! SCAN_ONLY=1 ...   # only time reading the live index
//! SETTLE=1 ...      # RSS every 2 s for 10 s once loaded
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use herald::clock::SystemClock;
use herald::config::{Config, Overrides};
use herald::engine::{Engine, EngineConfig};
use herald::request::TaskRequest;
use herald::store::{Store, StoreOptions};

/// herald's own allocator, so RSS reads as the binary's would.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap_or("VmRSS: ?")
        .to_string()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(n), Some(dir)) = (args.next(), args.next()) else {
        eprintln!("usage: fill_probe N DIR [fill]");
        std::process::exit(2);
    };
    let n: u64 = n.parse().expect("N is a number");
    let dir = std::path::PathBuf::from(dir);
    let fill = args.next().is_some();
    let mut opts = StoreOptions::default();
    if let Some(mb) = std::env::var("CACHE_MB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        opts.cache_bytes = mb << 20;
    }
    let t = Instant::now();
    let store = Store::open_with(&dir, &opts).expect("open");
    println!("open {:?} {}", t.elapsed(), rss());
    if std::env::var("SCAN_ONLY").is_ok() {
        let t = Instant::now();
        let count = store.live_entries().count();
        println!("scan of {count} live entries {:?} {}", t.elapsed(), rss());
        return;
    }
    let config = Config::from_toml("", Overrides::default()).expect("config");
    let channels = herald::server::build_channels(&config).expect("channels");
    let mut ec = EngineConfig::default();
    ec.limits.live_tasks_max = 5_000_000;
    let t = Instant::now();
    let engine = Engine::start(store, channels, Arc::new(SystemClock::new()), ec)
        .await
        .expect("engine");
    println!("recover (ready) {:?} {}", t.elapsed(), rss());
    while engine.index_loading() {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    println!(
        "live index loaded in the background {:?} after start {}",
        t.elapsed(),
        rss()
    );
    if std::env::var("SETTLE").is_ok() {
        // Where RSS goes once everything is loaded and nothing runs.
        for _ in 0..5 {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            println!("  {:?} after start {}", t.elapsed(), rss());
        }
    }
    if fill {
        let next = Arc::new(AtomicU64::new(0));
        let t = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..64 {
            let (e, next) = (engine.clone(), next.clone());
            set.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let req: TaskRequest = serde_json::from_value(serde_json::json!({
                        "id": format!("t{i:08}"), "schedule": {"after": "48h"},
                        "to": ["a"], "body": "Your class starts soon"}))
                    .expect("request");
                    e.create(req, None).await.expect("create");
                }
            });
        }
        while set.join_next().await.is_some() {}
        let secs = t.elapsed().as_secs_f64();
        println!(
            "filled {n} in {secs:.1} s ({:.0}/s) {}",
            n as f64 / secs,
            rss()
        );
    }
    println!("live tasks {}", engine.live_tasks());
}

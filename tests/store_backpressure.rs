//! Back-pressure as a slope (issue 29): with the applier slowed far below the writers (a test
//! knob), admission slows every writer a little once the memtable is over its soft mark
//! (`store/pace.rs::admit`), so the memtable never reaches its hard bound and no write waits
//! for a whole layer. Before the slope, the same writers filled the memtable to its bound at
//! full speed and then every write waited seconds for the applier.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald::model::Limits;
use herald::request::{Context, TaskRequest};
use herald::store::embedded::SledBackend;
use herald::store::pace::{ADMIT_DELAY_MAX, ADMIT_FULL_BYTES, ADMIT_SOFT_BYTES};
use herald::store::{Inserted, Store, StoreError};

/// The applier's rate: far below what the writers can put in at full speed.
const APPLIER_BYTES_PER_S: u64 = 8 << 20;
/// Writes in all: twice the memtable's hard bound and then some, so without the slope it must
/// be reached (with a 32 MiB bound and three times it, the second wall, a whole layer of it
/// frozen, lasted seconds: 4.3 s once).
const TOTAL_BYTES: u64 = ADMIT_FULL_BYTES as u64 * 2 + (16 << 20);
const WRITERS: usize = 4;
const BODY: usize = 16_000;
/// What a test on a loaded 2-core box may see for one write: the law's own bound is 50 ms, the
/// group's commit on tmpfs about nothing; the wall this replaced lasted seconds.
const WRITE_MAX: Duration = Duration::from_secs(1);

/// A directory on tmpfs when there is one: the test is about the applier, not the disk's sync.
fn scratch() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

fn task(id: &str, body: &str) -> (herald::model::Task, Vec<herald::model::Message>) {
    let req: TaskRequest = serde_json::from_value(serde_json::json!({
        "id": id, "schedule": {"after": "1h"}, "to": ["a"], "body": body
    }))
    .unwrap();
    req.into_task(&Context {
        now_ms: 1_800_000_000_000,
        limits: &Limits::default(),
        channel_exists: &|_| true,
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_applier_slows_every_writer_evenly_and_no_write_waits_for_it() {
    let dir = scratch();
    let sled = SledBackend::open(&dir.path().join("data"), 8 << 20).unwrap();
    let knobs = sled.knobs();
    knobs
        .applier_bytes_per_s
        .store(APPLIER_BYTES_PER_S, Ordering::SeqCst);
    let store = Arc::new(Store::with_backend(Arc::new(sled)).unwrap());
    let body: Arc<str> = "x".repeat(BODY).into();
    let written = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Samples the memtable's fill: the law must have been in play, the hard bound never.
    let sampler = {
        let (store, peak, stop) = (store.clone(), peak.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                peak.fetch_max(store.memtable_bytes() as u64, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (store, body, written) = (store.clone(), body.clone(), written.clone());
        writers.push(tokio::spawn(async move {
            let (mut n, mut slowest, mut busy) = (0u64, Duration::ZERO, 0u64);
            while written.load(Ordering::SeqCst) < TOTAL_BYTES {
                let (t, m) = task(&format!("w{w}-{n:08}"), &body);
                let t0 = Instant::now();
                match store.insert_new_task(&t, &m, None).await {
                    Ok(Inserted::Created) => {}
                    Err(StoreError::Busy) => busy += 1,
                    other => panic!("write {n} of writer {w}: {other:?}"),
                }
                slowest = slowest.max(t0.elapsed());
                written.fetch_add(BODY as u64, Ordering::SeqCst);
                n += 1;
                assert!(
                    started.elapsed() < Duration::from_secs(180),
                    "the writes did not finish in 3 minutes"
                );
            }
            (n, slowest, busy)
        }));
    }
    let mut counts = Vec::new();
    let (mut slowest, mut busy) = (Duration::ZERO, 0);
    for w in writers {
        let (n, s, b) = w.await.unwrap();
        counts.push(n);
        slowest = slowest.max(s);
        busy += b;
    }
    stop.store(true, Ordering::SeqCst);
    sampler.await.unwrap();
    let stats = store.commit_stats();
    let delayed = stats.admit_delayed.load(Ordering::SeqCst);
    let law_max = Duration::from_micros(stats.admit_delay_max_us.load(Ordering::SeqCst));
    let full = stats.admit_full.load(Ordering::SeqCst);
    let peak = peak.load(Ordering::SeqCst);
    eprintln!(
        "writes per writer {counts:?} in {:?}; slowest write {slowest:?}; delayed {delayed}, longest delay {law_max:?}; memtable peak {} MiB; at the hard bound {full}; refused {busy}",
        started.elapsed(),
        peak >> 20
    );
    assert!(
        peak >= ADMIT_SOFT_BYTES as u64 && delayed > 0,
        "the slowed applier must have put the memtable over its soft mark and the law in play"
    );
    assert!(
        law_max <= ADMIT_DELAY_MAX && ADMIT_DELAY_MAX <= Duration::from_millis(100),
        "the law's delays stay within the bound: {law_max:?}"
    );
    assert_eq!(
        (full, busy),
        (0, 0),
        "the slope keeps the memtable off its hard bound: nothing waits for the applier or is refused"
    );
    assert!(
        slowest < WRITE_MAX,
        "no write waits for the applier: the slowest took {slowest:?}"
    );
    let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    assert!(
        *lo * 2 >= *hi,
        "every writer is slowed alike: writes per writer {counts:?}"
    );
}

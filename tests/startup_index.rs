//! Start-up in two phases (manual clock): herald is ready once the running tasks and those due
//! within a minute are on the wheel; the rest of the live index loads in the background. A
//! command or create that names a task the background load has not reached yet must see it
//! exactly as if it were loaded, and the load must not undo what the command did.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::herald::{poll, utc_ms, ManualHerald};
use common::http;
use herald::clock::ManualClock;
use herald::config::{Config, Overrides};
use herald::engine::{Engine, EngineConfig};
use herald::request::TaskRequest;
use herald::store::backend::{Backend, Kv, KvIter, RawOp, Rejected, TreeId};
use herald::store::embedded::SledBackend;
use herald::store::{Store, StoreError};
use serde_json::json;

#[tokio::test]
async fn commands_reach_tasks_the_background_load_has_not_reached() {
    let t0 = utc_ms("2026-12-01T00:00:00Z");
    let mut h = ManualHerald::start(t0, "").await;
    let one = |id: &str, after: &str| json!({"id": id, "channel": "out", "schedule": {"after": after}, "to": ["a"], "body": id});
    h.post(&one("soon", "30s")).await;
    for id in ["far-cancel", "far-pause", "far-trigger", "far-keep"] {
        h.post(&one(id, "2h")).await;
    }
    for i in 0..50 {
        h.post(&one(&format!("filler-{i:02}"), "3h")).await;
    }
    h.stop().await;

    // Restart with the background load held: only `soon` (due within the minute) is loaded.
    let hold = Arc::new(AtomicBool::new(true));
    h.engine_config.hold_index_load = Some(hold.clone());
    h.clock.set(t0 + 1_000);
    h.restart().await;
    let engine = h.server().engine.clone();
    assert!(engine.is_ready());
    assert!(engine.index_loading());
    assert_eq!(engine.live_tasks(), 1, "only the task due soon is loaded");

    // Reads come from the store.
    assert_eq!(h.task("far-keep").await["state"], "pending");
    // Commands adopt the task from its entry on disk.
    let r = h.action("far-cancel", "cancel").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "cancelled");
    let r = h.action("far-pause", "pause").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "paused");
    let r = h.action("far-trigger", "trigger").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A create with the id of a live task not loaded yet is a conflict, and loses nothing.
    let r = http::post_json(&h.url("/v1/tasks"), &one("far-keep", "1m")).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(engine.index_loading(), "the load was held throughout");

    hold.store(false, Ordering::Release);
    poll(Duration::from_secs(30), || async {
        (!engine.index_loading()).then_some(())
    })
    .await
    .expect("the background load finishes");
    h.run_until(t0 + 4 * 3_600_000).await;

    let mut sent: Vec<String> = h
        .sent()
        .iter()
        .map(|s| s["body"].as_str().unwrap().to_string())
        .collect();
    sent.sort();
    let mut want: Vec<String> = ["soon", "far-trigger", "far-keep"]
        .iter()
        .map(|s| s.to_string())
        .chain((0..50).map(|i| format!("filler-{i:02}")))
        .collect();
    want.sort();
    assert_eq!(
        sent, want,
        "each task sent once; cancelled and paused ones not at all"
    );
    assert_eq!(h.task("far-cancel").await["state"], "cancelled");
    assert_eq!(h.task("far-pause").await["state"], "paused");
    assert_eq!(h.task("far-keep").await["state"], "completed");
    // Every far task was sent at its own instant, not when the load reached it.
    for s in h.sent() {
        let body = s["body"].as_str().unwrap();
        let at = utc_ms(s["sent_at"].as_str().unwrap());
        let due = match body {
            "soon" => t0 + 30_000,
            "far-trigger" => t0 + 1_000,
            b if b.starts_with("filler") => t0 + 3 * 3_600_000,
            _ => t0 + 2 * 3_600_000,
        };
        assert_eq!(at, due, "{body} sent at its due instant");
    }
    // Only the paused task is still live.
    assert_eq!(engine.live_tasks(), 1);
}

#[tokio::test]
async fn a_restart_with_nothing_beyond_the_horizon_loads_everything_before_ready() {
    let t0 = utc_ms("2026-12-01T00:00:00Z");
    let mut h = ManualHerald::start(t0, "").await;
    for i in 0..5 {
        h.post(&json!({"id": format!("t{i}"), "channel": "out",
            "schedule": {"after": "20s"}, "to": ["a"], "body": "x"}))
            .await;
    }
    h.restart().await;
    let engine = h.server().engine.clone();
    assert!(!engine.index_loading());
    assert_eq!(engine.live_tasks(), 5);
    h.run_until(t0 + 60_000).await;
    assert_eq!(h.sent().len(), 5);
}

/// A backend over sled whose scans of the due index wait at a gate before their item
/// [`Gate::at`] while [`Gate::hold`] is set: start-up's first phase is caught part-way.
struct GatedBackend {
    inner: Arc<SledBackend>,
    gate: Arc<Gate>,
}

struct Gate {
    at: usize,
    hold: AtomicBool,
    /// Scans waiting at the gate right now.
    waiting: AtomicUsize,
}

impl Gate {
    fn pass(&self, item: usize) {
        if item != self.at || !self.hold.load(Ordering::SeqCst) {
            return;
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        while self.hold.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Opens the gate when dropped, a failed assertion included: nothing stays blocked.
struct Open(Arc<Gate>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.hold.store(false, Ordering::SeqCst);
    }
}

impl Backend for GatedBackend {
    fn apply(&self, jobs: Vec<Vec<RawOp>>) -> Result<Vec<Result<(), Rejected>>, StoreError> {
        self.inner.apply(jobs)
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.inner.sync()
    }
    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(tree, key)
    }
    fn scan<'a>(&'a self, tree: TreeId, start: &[u8], prefix: Option<&[u8]>) -> KvIter<'a> {
        let scan = self.inner.scan(tree, start, prefix);
        if tree != TreeId::Due {
            return scan;
        }
        let gate = self.gate.clone();
        Box::new(scan.enumerate().map(move |(i, item)| {
            gate.pass(i);
            item
        }))
    }
    fn recover(&self) -> Result<(), StoreError> {
        self.inner.recover()
    }
    fn last_with_prefix(&self, tree: TreeId, prefix: &[u8]) -> Result<Option<Kv>, StoreError> {
        self.inner.last_with_prefix(tree, prefix)
    }
    fn get_atomic(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.inner.get_atomic(keys)
    }
    fn get_many(&self, keys: &[(TreeId, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.inner.get_many(keys)
    }
    fn failing(&self) -> Option<String> {
        self.inner.failing()
    }
    fn memtable_bytes(&self) -> usize {
        self.inner.memtable_bytes()
    }
    fn active_bytes(&self) -> usize {
        self.inner.active_bytes()
    }
}

/// sled on `data`, again after a close (its lock may be let go a moment later).
async fn open_sled(data: &std::path::Path) -> SledBackend {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match SledBackend::open(data, 8 << 20) {
            Ok(b) => return b,
            Err(e) if std::time::Instant::now() < end => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("open sled: {e}"),
        }
    }
}

/// Drops `engine` and waits until its store closed.
async fn close(engine: Engine) {
    let weak = engine.downgrade();
    let closed = engine.store().closed_flag();
    drop(engine);
    poll(Duration::from_secs(10), || async {
        (weak.strong_count() == 0 && closed.load(Ordering::Acquire)).then_some(())
    })
    .await
    .expect("the engine closed");
}

/// The first phase reads the due index without the live map's lock and puts it in the map a
/// chunk per hold (`recovery.rs`). Held across the whole scan, the lock kept every worker
/// that took it (fire steps of the entries armed so far, `/metrics`) waiting for seconds
/// after an outage with many overdue tasks, and `/healthz` with them. Here the scan is held
/// at a gate part-way: the live map answers meanwhile, with the tasks read so far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_phase_does_not_hold_the_live_map_across_its_scan() {
    const TASKS: usize = 2_500;
    let t0 = utc_ms("2026-12-01T00:00:00Z");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = Config::from_toml("[channels.out]\nkind = \"log\"\n", Overrides::default())
        .expect("config");
    let clock = Arc::new(ManualClock::new(t0));
    let sled = open_sled(&data).await;
    let store = Store::with_backend(Arc::new(sled)).unwrap();
    let channels = herald::server::build_channels(&config).unwrap();
    let engine = Engine::start(store, channels, clock.clone(), EngineConfig::default())
        .await
        .unwrap();
    // Due within the minute after the restart: every one is read before ready.
    let mut creates = tokio::task::JoinSet::new();
    for i in 0..TASKS {
        let engine = engine.clone();
        let req: TaskRequest = serde_json::from_value(json!({"id": format!("t{i:04}"),
            "channel": "out", "schedule": {"after": "30s"}, "to": ["a"], "body": "x"}))
        .unwrap();
        creates.spawn(async move { engine.create(req, None).await.map(|_| ()) });
    }
    while let Some(r) = creates.join_next().await {
        r.unwrap().expect("create");
    }
    close(engine).await;

    let gate = Arc::new(Gate {
        at: 2_000,
        hold: AtomicBool::new(true),
        waiting: AtomicUsize::new(0),
    });
    let _open = Open(gate.clone());
    let backend = GatedBackend {
        inner: Arc::new(open_sled(&data).await),
        gate: gate.clone(),
    };
    let store = Store::with_backend(Arc::new(backend)).unwrap();
    let channels = herald::server::build_channels(&config).unwrap();
    let engine = Engine::new(store, channels, clock, EngineConfig::default()).unwrap();
    // On a thread of its own: the gate holds the thread that reads the index.
    let recovering = {
        let engine = engine.clone();
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || rt.block_on(engine.recover()))
    };
    poll(Duration::from_secs(30), || async {
        (gate.waiting.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await
    .expect("the first phase's scan reached the gate");
    let live = {
        let engine = engine.clone();
        tokio::time::timeout(
            Duration::from_secs(5),
            tokio::task::spawn_blocking(move || engine.live_tasks()),
        )
        .await
        .expect("the live map answers while the first phase reads the index")
        .unwrap()
    };
    assert!(
        0 < live && live <= 2_000,
        "{live} tasks in the live map: the entries read so far, in chunks"
    );
    assert!(!engine.is_ready());
    gate.hold.store(false, Ordering::SeqCst);
    recovering.await.unwrap().expect("recovery");
    assert!(engine.is_ready());
    assert!(
        !engine.index_loading(),
        "nothing was left for the background"
    );
    assert_eq!(engine.live_tasks(), TASKS);
}

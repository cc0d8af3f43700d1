//! A sled flush that never returns (sled 0.34's can block for good after an I/O error, issue
//! 29): the applier is stuck in it, and still every read and `/healthz` answer within a
//! bound, and writes keep being taken while the memtable has room. The server runs on a
//! runtime of its own, so a stuck tokio worker there would show as a timeout here.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http;
use herald::api::{serve, ApiState};
use herald::clock::SystemClock;
use herald::config::{Config, Overrides};
use herald::engine::{Engine, EngineConfig};
use herald::store::embedded::SledBackend;
use herald::store::Store;
use serde_json::json;

/// What one read may take while the applier is stuck (a quiet read takes milliseconds).
const ANSWER_MAX: Duration = Duration::from_secs(2);

struct Herald {
    url: String,
    store_bytes: Box<dyn Fn() -> usize + Send>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Herald {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// herald on `sled`, its API served on a runtime of its own thread.
fn start(dir: &std::path::Path, sled: SledBackend) -> Herald {
    let config = Config::from_toml(
        "",
        Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(dir.join("data")),
            token: None,
        },
    )
    .unwrap();
    let (url_tx, url_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let store = Store::with_backend(Arc::new(sled)).unwrap();
            let channels = herald::server::build_channels(&config).unwrap();
            let clock = Arc::new(SystemClock::new());
            let engine = Engine::start(store, channels, clock.clone(), EngineConfig::default())
                .await
                .unwrap();
            let listener = herald::server::listen(config.listen).unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let (tx, rx) = tokio::sync::watch::channel(false);
            let state = Arc::new(ApiState {
                engine: engine.clone(),
                token: None,
                body_bytes_max: config.body_bytes_max,
                body_read_timeout: Duration::from_secs(10),
                header_read_timeout: Duration::from_secs(10),
                metrics: Default::default(),
                conns: herald::api::conns::Conns::new(256),
                clock,
                tracing: Default::default(),
            });
            tokio::spawn(serve(listener, state, rx));
            let e = engine.clone();
            url_tx
                .send((url, Box::new(move || e.store().memtable_bytes()) as Box<_>))
                .unwrap();
            let _ = stop_rx.await;
            let _ = tx.send(true);
        });
    });
    let (url, store_bytes) = url_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    Herald {
        url,
        store_bytes,
        stop: Some(stop_tx),
        thread: Some(thread),
    }
}

fn create(id: &str) -> serde_json::Value {
    json!({"id": id, "schedule": {"after": "1h"}, "channel": "log", "to": ["a"], "body": "hi"})
}

/// GETs `path` and checks it answers `status` within [`ANSWER_MAX`].
async fn answers(base: &str, path: &str, status: u16) -> http::Resp {
    let t0 = Instant::now();
    let r = tokio::time::timeout(
        ANSWER_MAX,
        http::try_request("GET", &format!("{base}{path}"), &[], None),
    )
    .await
    .unwrap_or_else(|_| panic!("GET {path} did not answer within {ANSWER_MAX:?}"))
    .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(r.status, status, "GET {path}: {}", r.text());
    eprintln!("GET {path}: {} in {:?}", r.status, t0.elapsed());
    r
}

struct Release(Arc<herald::store::embedded::Knobs>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.block_sled_flush.store(false, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_healthz_answer_while_a_sled_flush_blocks_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let sled = SledBackend::open(&dir.path().join("data"), 8 << 20).unwrap();
    let knobs = sled.knobs();
    let h = start(dir.path(), sled);
    // Dropped before `h`, also when an assertion fails: the store can only close once the
    // flush lets go.
    let _release = Release(knobs.clone());
    let base = h.url.clone();
    // Tasks that reach sled while flushes work: read back from sled later.
    for i in 0..50 {
        let r = http::post_json(&format!("{base}/v1/tasks"), &create(&format!("old-{i:03}"))).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while (h.store_bytes)() > 0 {
        assert!(
            Instant::now() < deadline,
            "the memtable never went into sled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // From now on sled's flush blocks: the next layer the applier writes never finishes.
    knobs.block_sled_flush.store(true, Ordering::SeqCst);
    for i in 0..50 {
        let r = http::post_json(&format!("{base}/v1/tasks"), &create(&format!("new-{i:03}"))).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    // The idle layer is frozen within a second or two and the applier stops in its flush.
    let deadline = Instant::now() + Duration::from_secs(30);
    while knobs.flushes_blocked.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the applier never reached sled's flush"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Stuck there for good; everything that reads answers, over and over.
    for round in 0..3 {
        answers(&base, "/healthz", 200).await;
        let t = answers(&base, "/v1/tasks/old-007", 200).await;
        assert!(t.text().contains("\"pending\""), "{}", t.text());
        answers(&base, "/v1/tasks/new-042", 200).await;
        answers(&base, "/v1/tasks/none-such", 404).await;
        let page = answers(&base, "/v1/tasks?limit=200", 200).await;
        let v: serde_json::Value = serde_json::from_slice(&page.body).unwrap();
        let n = v["tasks"].as_array().map_or(0, |a| a.len());
        assert_eq!(n, 100 + round, "every task is listed (round {round}): {v}");
        answers(&base, "/v1/tasks/old-007/runs", 200).await;
        answers(&base, "/v1/channels", 200).await;
        answers(&base, "/metrics", 200).await;
        // Writes still go into the memtable: it has room.
        let r = tokio::time::timeout(
            ANSWER_MAX,
            http::try_request(
                "POST",
                &format!("{base}/v1/tasks"),
                &[],
                Some(serde_json::to_vec(&create(&format!("late-{round}"))).unwrap()),
            ),
        )
        .await
        .expect("a create answers while sled's flush is stuck")
        .unwrap();
        assert_eq!(r.status, 201, "{}", r.text());
        answers(&base, &format!("/v1/tasks/late-{round}"), 200).await;
    }
    assert!(
        knobs.flushes_blocked.load(Ordering::SeqCst) >= 1,
        "the flush was still stuck throughout"
    );
}

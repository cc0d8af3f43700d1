//! Load + fire of a per-second cron with no history against the same cron with 100 000
//! finished runs (issue 22: a task's history must never slow its fires; target ratio ≤ 1.2).
//!
//! Each side is a real herald in-process (sled on disk, the file channel, the manual clock).
//! The history is written into the store while that herald is down, as an import of an old
//! task would, and `[store] runs_max` is lifted so that nothing trims it. One measured
//! iteration moves the clock one second and waits until herald is idle again: the task is
//! loaded (its active runs only), fired, its message sent and settled. `runs_of`, the old
//! load, would decode all 100 000 records each time.
//!
//! Run: `cargo bench --bench history`.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use herald::clock::ManualClock;
use herald::config::{Config, Overrides};
use herald::engine::EngineConfig;
use herald::model::{Run, RunState};
use herald::request::TaskRequest;
use herald::server::Server;
use herald::store::{Batch, Store};

const T0: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

struct Side {
    rt: tokio::runtime::Runtime,
    clock: Arc<ManualClock>,
    server: Option<Server>,
    _dir: tempfile::TempDir,
    now: u64,
}

fn config(dir: &std::path::Path) -> Config {
    Config::from_toml(
        &format!(
            "[store]\nruns_max = 1000000\n[channels.out]\nkind = \"file\"\npath = \"{}\"\n",
            dir.join("out.jsonl").display()
        ),
        Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(dir.join("data")),
            token: None,
        },
    )
    .expect("bench config")
}

async fn start(dir: &std::path::Path, clock: Arc<ManualClock>) -> Server {
    // sled lets go of a directory a moment after its store closed: try again for a while.
    for _ in 0..1_000 {
        match herald::server::start_with(config(dir), clock.clone(), EngineConfig::default()).await
        {
            Ok(s) => return s,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    panic!("herald did not start on {}", dir.display());
}

impl Side {
    fn new(history: u32) -> Side {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::Builder::new()
            .prefix("bench-history")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temp dir");
        let clock = Arc::new(ManualClock::new(T0));
        let server = rt.block_on(async {
            let server = start(dir.path(), clock.clone()).await;
            let req: TaskRequest = serde_json::from_value(serde_json::json!({
                "id": "cron", "channel": "out", "schedule": {"cron": "* * * * * *"},
                "to": ["a"], "body": "tick"
            }))
            .expect("request");
            server.engine.create(req, None).await.expect("create");
            if history == 0 {
                return server;
            }
            assert!(server.stop(Duration::from_secs(10)).await, "stopped");
            let store = loop {
                match Store::open(&dir.path().join("data")) {
                    Ok(s) => break s,
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            };
            let mut task = store.get_task("cron").unwrap().expect("stored");
            task.fires = history;
            task.runs = history;
            let mut batch = Batch::new();
            for run in 1..=history {
                let at = T0 - u64::from(history - run + 1) * 1000;
                let mut r = Run::new(run, at, at, 1);
                r.state = RunState::Completed;
                r.finished_at_ms = Some(at + 1);
                r.next_at_ms = None;
                (r.cursor, r.sent) = (1, 1);
                batch.run("cron", &r);
                if batch.ops.len() == 5_000 {
                    store.write(&std::mem::take(&mut batch)).await.unwrap();
                }
            }
            batch.progress(&task);
            store.write(&batch).await.unwrap();
            drop(store);
            start(dir.path(), clock.clone()).await
        });
        Side {
            rt,
            clock,
            server: Some(server),
            _dir: dir,
            now: T0,
        }
    }

    /// One second on: the cron's next fire, loaded, fired, sent and settled.
    fn fire(&mut self) {
        self.now += 1_000;
        let (clock, now) = (self.clock.clone(), self.now);
        let engine = &self.server.as_ref().expect("running").engine;
        self.rt.block_on(async {
            for _ in 0..1_000 {
                match engine.idle().await {
                    Some(d) if d <= now => {
                        clock.set(d);
                        engine.wake();
                    }
                    _ => {
                        clock.set(now);
                        engine.wake();
                        engine.idle().await;
                        return;
                    }
                }
            }
        });
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.rt.block_on(s.stop(Duration::from_secs(10)));
        }
    }
}

fn history(c: &mut Criterion) {
    let mut g = c.benchmark_group("cron_fire_by_history");
    g.sample_size(30).measurement_time(Duration::from_secs(10));
    for runs in [0u32, 100_000] {
        let mut side = Side::new(runs);
        g.bench_function(format!("{runs}_finished_runs"), |b| b.iter(|| side.fire()));
    }
    g.finish();
}

criterion_group!(benches, history);
criterion_main!(benches);

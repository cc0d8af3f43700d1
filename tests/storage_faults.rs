//! Storage faults injected under the real engine (sled wrapped by `FaultyBackend`, manual
//! clock, file channel): no send starts without its own durable in-flight mark, nothing that was
//! acknowledged is lost, writes are refused (and health says why) while storage fails, and
//! herald recovers by itself once it works again.

mod common;

use std::sync::Arc;

use herald::clock::{Clock, ManualClock};
use herald::config::{Config, Overrides};
use herald::engine::{Engine, EngineConfig, EngineError};
use herald::request::TaskRequest;
use herald::store::embedded::SledBackend;
use herald::store::fault::{Faults, FaultyBackend};
use herald::store::Store;
use serde_json::{json, Value};

use common::herald::poll;
use common::receiver::{Behavior, Receiver};

const T0: u64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

struct Rig {
    engine: Engine,
    clock: Arc<ManualClock>,
    faults: Arc<Faults>,
    out: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn rig() -> Rig {
    rig_with(|out| {
        format!(
            "[channels.out]\nkind = \"file\"\npath = \"{}\"\n",
            out.display()
        )
    })
    .await
}

/// [`rig`] with the channels `channels` writes (given the path a file channel may use).
async fn rig_with(channels: impl FnOnce(&std::path::Path) -> String) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    let config = Config::from_toml(
        &channels(&out),
        Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(dir.path().join("data")),
            token: None,
        },
    )
    .unwrap();
    let sled = SledBackend::open(&dir.path().join("data"), 8 << 20).unwrap();
    let faults = Arc::new(Faults::default());
    let backend = FaultyBackend {
        inner: Arc::new(sled),
        faults: faults.clone(),
    };
    let store = Store::with_backend(Arc::new(backend)).unwrap();
    let channels = herald::server::build_channels(&config).unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let engine = Engine::start(store, channels, clock.clone(), EngineConfig::default())
        .await
        .unwrap();
    Rig {
        engine,
        clock,
        faults,
        out,
        _dir: dir,
    }
}

impl Rig {
    async fn run_until(&self, t: u64) {
        for _ in 0..100_000 {
            match self.engine.idle().await {
                Some(d) if d <= t => {
                    self.clock.set(d);
                    self.engine.wake();
                }
                _ => {
                    self.clock.set(t);
                    self.engine.wake();
                    self.engine.idle().await;
                    return;
                }
            }
        }
        panic!("run_until did not converge");
    }

    fn sent(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    async fn create(&self, v: Value) -> Result<(), EngineError> {
        let req: TaskRequest = serde_json::from_value(v).unwrap();
        self.engine.create(req, None).await.map(|_| ())
    }
}

fn seqs(sent: &[Value]) -> Vec<u64> {
    sent.iter().map(|s| s["seq"].as_u64().unwrap()).collect()
}

#[tokio::test]
async fn no_send_without_its_durable_mark_and_recovery_when_storage_works_again() {
    let r = rig().await;
    r.create(json!({"id": "seq", "channel": "out", "schedule": {"after": "1s"},
        "to": ["0","1","2","3","4","5","6","7","8","9"], "body": "x", "pacing": {"interval": "1s"}}))
        .await
        .unwrap();
    r.run_until(T0 + 3_500).await;
    assert_eq!(seqs(&r.sent()), [0, 1, 2]);

    // The disk fills up: every write fails from now on.
    r.faults.set(true, false);
    r.run_until(T0 + 12_000).await;
    assert_eq!(
        seqs(&r.sent()),
        [0, 1, 2],
        "nothing is sent while its in-flight mark cannot be written"
    );
    let failing = r
        .engine
        .storage_failing()
        .expect("health names the storage error");
    assert!(failing.contains("No space left"), "{failing}");
    // Writes are refused with the storage error, and change nothing.
    let e = r
        .create(json!({"id": "new", "channel": "out", "schedule": {"after": "1s"}, "to": ["a"], "body": "b"}))
        .await
        .unwrap_err();
    assert!(matches!(e, EngineError::Storage(_)), "{e:?}");
    assert!(r.engine.get("new").unwrap().is_none());

    // Space is freed: herald goes on by itself, at the cursor.
    r.faults.set(false, false);
    r.run_until(T0 + 30_000).await;
    assert_eq!(seqs(&r.sent()), (0..10).collect::<Vec<_>>());
    assert!(r.engine.storage_failing().is_none());
    let v = r.engine.get("seq").unwrap().unwrap();
    assert_eq!(v.task.state, herald::model::TaskState::Completed);
    r.create(json!({"id": "new", "channel": "out", "schedule": {"after": "1s"}, "to": ["a"], "body": "b"}))
        .await
        .unwrap();
}

/// The rig with task `seq`: six messages 1 s apart from T0 + 1 s, the first two sent (2.5 s).
async fn six_paced_two_sent() -> Rig {
    let r = rig().await;
    r.create(
        json!({"id": "seq", "channel": "out", "schedule": {"after": "1s"},
        "to": ["0","1","2","3","4","5"], "body": "x", "pacing": {"interval": "1s"}}),
    )
    .await
    .unwrap();
    r.run_until(T0 + 2_500).await;
    assert_eq!(seqs(&r.sent()), [0, 1]);
    r
}

#[tokio::test]
async fn a_failed_settle_resends_only_the_in_flight_message_with_its_key() {
    let r = six_paced_two_sent().await;
    // At 2.9 s message 2 is armed (one group), at 3 s it is sent; its settle is the next group:
    // that one fails, and so does everything after it until the fault is cleared.
    r.faults.fail_after(1);
    r.run_until(T0 + 6_000).await;
    assert_eq!(
        seqs(&r.sent()),
        [0, 1, 2],
        "nothing after the unrecorded send"
    );
    r.faults.set(false, false);
    r.run_until(T0 + 20_000).await;
    let sent = r.sent();
    // Message 2 goes again (its outcome never reached the disk), with the same key and the
    // next attempt number; nothing before it is sent again.
    assert_eq!(seqs(&sent), [0, 1, 2, 2, 3, 4, 5]);
    assert_eq!(sent[2]["idempotency_key"], sent[3]["idempotency_key"]);
    assert_eq!(sent[2]["attempt"], 1);
    assert_eq!(sent[3]["attempt"], 2);
    let now = r.clock.now_ms();
    assert!(now >= T0 + 20_000);
}

/// A herd's sends to a file channel go, and settle, a chunk at a time (`engine/chunk.rs`): when
/// the chunk's one settle write fails, every task in it is read back from disk and its in-flight
/// message goes again with the same key and the next attempt; nothing is lost, nothing else is
/// sent twice, and the sequences go on at their cursors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_chunk_settle_resends_each_in_flight_message_once() {
    let r = rig().await;
    let at = "2026-12-01T00:00:10Z";
    for i in 0..40 {
        r.create(
            json!({"id": format!("h{i:02}"), "channel": "out", "schedule": {"at": at},
            "to": ["0", "1"], "body": "x", "pacing": {"interval": "1s"}}),
        )
        .await
        .unwrap();
    }
    // Everything is fired and armed ahead of the instant.
    r.run_until(T0 + 9_999).await;
    assert!(r.sent().is_empty());
    // The instant's settles fail (and everything after them, until the fault is cleared).
    r.faults.fail_after(0);
    r.run_until(T0 + 10_500).await;
    assert_eq!(r.sent().len(), 40, "each first message went once");
    // Due in the same millisecond, they went as one chunk (and failed as one).
    assert!(
        r.engine.chunked_sends() >= 40,
        "chunked: {}",
        r.engine.chunked_sends()
    );
    r.faults.set(false, false);
    r.run_until(T0 + 30_000).await;
    let sent = r.sent();
    let mut per_task: std::collections::BTreeMap<String, Vec<(u64, u64)>> = Default::default();
    for s in &sent {
        assert_eq!(
            s["idempotency_key"],
            format!("{}:1:{}", s["task_id"].as_str().unwrap(), s["seq"])
        );
        per_task
            .entry(s["task_id"].as_str().unwrap().to_string())
            .or_default()
            .push((s["seq"].as_u64().unwrap(), s["attempt"].as_u64().unwrap()));
    }
    assert_eq!(per_task.len(), 40);
    for (id, got) in &per_task {
        // Message 0 twice (its outcome never reached the disk), then message 1 once.
        assert_eq!(got, &[(0, 1), (0, 2), (1, 1)], "{id}");
        let v = r.engine.get(id).unwrap().unwrap();
        assert_eq!(v.task.state, herald::model::TaskState::Completed, "{id}");
    }
}

/// A stalled disk with a small write queue: creates beyond the queue are refused at once with
/// `Busy` (the API's 503 + `Retry-After`), never queued without bound; every create that was
/// acknowledged exists once the disk moves again, and a refused one does not.
#[tokio::test]
async fn a_full_write_queue_refuses_creates_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let sled = SledBackend::open(&dir.path().join("data"), 8 << 20).unwrap();
    let faults = Arc::new(Faults::default());
    let backend = FaultyBackend {
        inner: Arc::new(sled),
        faults: faults.clone(),
    };
    let store = Store::with_backend_queue(Arc::new(backend), 8).unwrap();
    let config = Config::from_toml("", Overrides::default()).unwrap();
    let channels = herald::server::build_channels(&config).unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let engine = Engine::start(store, channels, clock, EngineConfig::default())
        .await
        .unwrap();
    faults
        .stall_sync
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..64 {
        let engine = engine.clone();
        set.spawn(async move {
            let id = format!("t{i:02}");
            let req: TaskRequest = serde_json::from_value(json!({"id": id,
                "schedule": {"after": "1h"}, "to": ["a"], "body": "b"}))
            .unwrap();
            (id, engine.create(req, None).await)
        });
    }
    // Wait until the refusals have come back: the queue (8) plus the group being flushed hold
    // at most a few creates; the rest must be answered at once, while the disk is stalled.
    let mut busy = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while busy.len() < 40 {
        assert!(
            std::time::Instant::now() < deadline,
            "refusals did not come back at once"
        );
        if let Some(Ok((id, r))) = set.try_join_next() {
            match r {
                Err(EngineError::Store(herald::store::StoreError::Busy)) => busy.push(id),
                other => panic!(
                    "{id}: answered while the disk is stalled: {:?}",
                    other.map(|_| ())
                ),
            }
        } else {
            tokio::task::yield_now().await;
        }
    }
    faults
        .stall_sync
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let mut acked = Vec::new();
    while let Some(r) = set.join_next().await {
        let (id, r) = r.unwrap();
        match r {
            Ok(_) => acked.push(id),
            Err(EngineError::Store(herald::store::StoreError::Busy)) => busy.push(id),
            Err(e) => panic!("{id}: {e}"),
        }
    }
    assert!(
        !acked.is_empty() && !busy.is_empty(),
        "{} acked, {} busy",
        acked.len(),
        busy.len()
    );
    assert_eq!(acked.len() + busy.len(), 64);
    for id in &acked {
        assert!(engine.get(id).unwrap().is_some(), "acknowledged {id} lost");
    }
    for id in &busy {
        assert!(
            engine.get(id).unwrap().is_none(),
            "refused {id} was written"
        );
    }
}

/// A cancel that waited for a create of the same id which then failed: the cell it waited
/// for left the live map with the failed create, and the cancel must not act on it. Here the
/// id belongs to a task finished already (not live): the second create is refused at its
/// write, and before the fix the waiting cancel "cancelled" the phantom and wrote the
/// finished task over as `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_waiting_for_a_create_that_fails_leaves_the_finished_task_alone() {
    use std::future::Future;
    use std::sync::atomic::Ordering;
    use std::task::{Context, Poll, Waker};

    let r = rig().await;
    r.create(
        json!({"id": "x", "channel": "out", "schedule": {"at": "2026-12-01T00:00:01Z"},
        "to": ["a"], "body": "once"}),
    )
    .await
    .unwrap();
    r.run_until(T0 + 2_000).await;
    assert_eq!(
        r.engine.get("x").unwrap().unwrap().task.state.to_string(),
        "completed"
    );

    // The commit thread held in a flush (another task's create), so that the second create
    // of x waits in the queue with its cell claimed.
    r.faults.stall_sync.store(true, Ordering::SeqCst);
    let engine = r.engine.clone();
    let other = tokio::spawn(async move {
        let req: TaskRequest = serde_json::from_value(json!({"id": "y", "channel": "out",
            "schedule": {"after": "1h"}, "to": ["a"], "body": "b"}))
        .unwrap();
        engine.create(req, None).await.map(|_| ())
    });
    let held = common::herald::poll(std::time::Duration::from_secs(10), || async {
        (r.faults.syncs_stalled.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    assert!(held.is_some(), "the commit thread is held in a flush");

    // Each polled once: the create until it waits for its write, the cancel until it waits
    // for the create's cell (neither can get further while the flush is held).
    let req: TaskRequest = serde_json::from_value(json!({"id": "x", "channel": "out",
        "schedule": {"after": "1h"}, "to": ["a"], "body": "again"}))
    .unwrap();
    let mut again = Box::pin(r.engine.create(req, None));
    let mut cancel = Box::pin(r.engine.cancel("x"));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(again.as_mut().poll(&mut cx), Poll::Pending));
    assert!(matches!(cancel.as_mut().poll(&mut cx), Poll::Pending));

    r.faults.stall_sync.store(false, Ordering::SeqCst);
    other.await.unwrap().unwrap();
    match again.await {
        Err(EngineError::IdTaken(_)) => {}
        other => panic!("the second create of x: {:?}", other.map(|_| ())),
    }
    match cancel.await {
        Err(EngineError::Conflict(_)) => {}
        other => panic!(
            "the cancel of the finished x: {:?}",
            other.map(|v| v.task.state)
        ),
    }
    let x = r.engine.get("x").unwrap().unwrap();
    assert_eq!(x.task.state.to_string(), "completed", "x is left as it was");
    assert_eq!(r.sent().len(), 1, "x was sent once");
}

/// The run a webhook request was for.
fn run_of(q: &common::receiver::Recorded) -> Option<u64> {
    q.json.as_ref().and_then(|j| j["run"].as_u64())
}

/// Requests that arrived for `run`.
fn sent_for(rx: &Receiver, run: u64) -> Vec<common::receiver::Recorded> {
    rx.requests()
        .into_iter()
        .filter(|q| run_of(q) == Some(run))
        .collect()
}

const WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Moves the manual clock on 100 ms at a time (run sends go on real time) until `done`.
async fn run_clock_until(r: &Rig, what: &str, done: impl Fn() -> bool) {
    poll(WAIT, || async {
        if done() {
            return Some(());
        }
        r.clock.set(r.clock.now_ms() + 100);
        r.engine.wake();
        None
    })
    .await
    .unwrap_or_else(|| panic!("{what}"));
}

/// A task with two runs out at once: a cron with `overlap: allow`, each send to a slow webhook
/// (run 1 answered after 4 s, run 2 after 1 s), outside the task's lock. Run 2's settle write
/// fails, so the task is unloaded (read back from disk at its next use) while run 1's send is
/// still out. Returns with writes still failing and storage reported failing.
async fn two_runs_out_and_a_failed_settle(rx: &Receiver) -> Rig {
    let url = rx.url();
    let r = rig_with(|_| common::herald::webhook_channel("out", &url, "timeout = \"30s\"")).await;
    rx.set_default(Behavior::Ok);
    rx.script(vec![
        Behavior::Slow(std::time::Duration::from_secs(4)),
        Behavior::Slow(std::time::Duration::from_secs(1)),
    ]);
    r.create(json!({"id": "both", "channel": "out",
        "schedule": {"cron": "* * * * * *", "max_runs": 2}, "overlap": "allow",
        "to": ["a"], "body": "x"}))
        .await
        .unwrap();
    let arrived = |run: u64| async move {
        poll(WAIT, || async {
            (!sent_for(rx, run).is_empty()).then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("run {run} was not sent: {:?}", rx.requests()))
    };
    r.clock.set(T0 + 1_000);
    r.engine.wake();
    arrived(1).await;
    r.clock.set(T0 + 2_000);
    r.engine.wake();
    arrived(2).await;
    // Run 2 is out (its mark on disk); its settle is the next write, and it fails.
    r.faults.set(true, false);
    poll(WAIT, || async { r.engine.storage_failing().map(|_| ()) })
        .await
        .expect("run 2's settle fails");
    r
}

/// Both runs of `two_runs_out_and_a_failed_settle`'s task completed.
fn both_completed(r: &Rig) -> bool {
    let runs = r.engine.runs("both").unwrap().unwrap();
    runs.len() == 2
        && runs
            .iter()
            .all(|run| run.state == herald::model::RunState::Completed)
}

/// Run 1's load (after run 2's failed settle unloaded the task) must not arm it to go again
/// while its attempt is under way (a resume steps every run not sending): it is settled by its
/// own step, and its message is sent once. Run 2's message, whose outcome never reached the
/// disk, goes again with its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_settle_does_not_send_again_another_run_still_out() {
    let rx = Receiver::start().await;
    let r = two_runs_out_and_a_failed_settle(&rx).await;
    r.faults.set(false, false);
    // Run 2's step comes back a second later (`STORAGE_RETRY_MS`) and reads the task back;
    // a step that still finds the store failing tries again a second after that.
    run_clock_until(&r, "run 2 was not sent again", || {
        sent_for(&rx, 2).len() >= 2
    })
    .await;
    // A pause and a resume while run 1 is still out: the resume steps every run that is not
    // sending. Run 1 must read as sending, or it goes a second time now.
    r.engine.pause("both").await.unwrap();
    r.engine.resume("both").await.unwrap();
    // Run 1's answer comes at 4 s; then both runs are settled.
    poll(WAIT, || async { both_completed(&r).then_some(()) })
        .await
        .unwrap_or_else(|| panic!("runs not completed: {:?}", r.engine.runs("both")));
    assert_eq!(
        sent_for(&rx, 1).len(),
        1,
        "run 1 was sent again while its attempt was out: {:?}",
        rx.requests()
    );
    let two = sent_for(&rx, 2);
    assert_eq!(two.len(), 2, "{:?}", rx.requests());
    assert_eq!(two[0].idempotency_key(), two[1].idempotency_key());
}

/// As above, but when run 1's send comes back the task cannot be read (reads fail too), so its
/// outcome cannot be settled: its mark must leave the unloaded cell, so that its step's retry
/// finds it interrupted and sends it again with its key, instead of taking it for a send still
/// out for good (the run then never ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_whose_task_cannot_be_read_back_goes_again_once_it_can() {
    let rx = Receiver::start().await;
    let r = two_runs_out_and_a_failed_settle(&rx).await;
    let reads = &r.faults.reads_refused;
    r.faults
        .fail_reads
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // Run 1's answer comes at 4 s; its step then fails to read the task back.
    poll(WAIT, || async {
        let answered = sent_for(&rx, 1).first().and_then(|q| q.done_ms).is_some();
        (answered && reads.load(std::sync::atomic::Ordering::SeqCst) > 0).then_some(())
    })
    .await
    .expect("run 1's step reads the task back after its send");
    r.faults
        .fail_reads
        .store(false, std::sync::atomic::Ordering::SeqCst);
    r.faults.set(false, false);
    run_clock_until(&r, "the runs never completed", || both_completed(&r)).await;
    let one = sent_for(&rx, 1);
    assert_eq!(one.len(), 2, "run 1 goes again, once: {:?}", rx.requests());
    assert_eq!(one[0].idempotency_key(), one[1].idempotency_key());
}

/// The background load of the live index meets a store that cannot be read (a reopen of sled
/// after an I/O error, a full disk's heal): it must read the same chunk again once the store
/// answers, not end there. Ended, every task after that point stayed off the wheel until a
/// restart: created, acknowledged, and never sent.
#[tokio::test]
async fn the_index_load_goes_on_once_the_store_can_be_read_again() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let r = rig().await;
    let data = r._dir.path().join("data");
    r.create(
        json!({"id": "soon", "channel": "out", "schedule": {"after": "30s"},
        "to": ["a"], "body": "soon"}),
    )
    .await
    .unwrap();
    for i in 0..20 {
        let id = format!("far-{i:02}");
        r.create(
            json!({"id": id, "channel": "out", "schedule": {"after": "2h"},
            "to": ["a"], "body": id}),
        )
        .await
        .unwrap();
    }
    // Close the store as the server's stop does: the last engine reference gone, then the
    // store's own word that it closed.
    let Rig {
        engine, out, _dir, ..
    } = r;
    let weak = engine.downgrade();
    let closed = engine.store().closed_flag();
    drop(engine);
    poll(WAIT, || async {
        (weak.strong_count() == 0 && closed.load(Ordering::Acquire)).then_some(())
    })
    .await
    .expect("the first engine closes its store");

    // Again on the same data, with the background load held until reads fail.
    let sled = SledBackend::open(&data, 8 << 20).unwrap();
    let faults = Arc::new(Faults::default());
    let backend: Arc<dyn herald::store::backend::Backend> = Arc::new(FaultyBackend {
        inner: Arc::new(sled),
        faults: faults.clone(),
    });
    let config = Config::from_toml(
        &format!(
            "[channels.out]\nkind = \"file\"\npath = \"{}\"\n",
            out.display()
        ),
        Overrides::default(),
    )
    .unwrap();
    let clock = Arc::new(ManualClock::new(T0 + 1_000));
    // A start whose first read of the index fails must fail, not come up ready without the
    // tasks it could not read.
    let start_fails = |what: &'static str| {
        let store = Store::with_backend(backend.clone()).unwrap();
        let channels = herald::server::build_channels(&config).unwrap();
        let clock = clock.clone();
        async move {
            let r = Engine::start(store, channels, clock, EngineConfig::default()).await;
            assert!(r.is_err(), "a start that could not read {what} came up");
        }
    };
    faults.fail_reads.store(true, Ordering::SeqCst);
    start_fails("the index").await;
    faults.fail_reads.store(false, Ordering::SeqCst);
    // Likewise a start that cannot read the failure list (its retries under way would never
    // be armed again).
    *faults.fail_scans_of.lock() = Some(herald::store::backend::TreeId::Failures);
    start_fails("the failure list").await;
    *faults.fail_scans_of.lock() = None;
    let store = Store::with_backend(backend).unwrap();
    let channels = herald::server::build_channels(&config).unwrap();
    let hold = Arc::new(AtomicBool::new(true));
    let engine = Engine::start(
        store,
        channels,
        clock.clone(),
        EngineConfig {
            hold_index_load: Some(hold.clone()),
            ..EngineConfig::default()
        },
    )
    .await
    .unwrap();
    assert!(engine.index_loading());
    assert_eq!(engine.live_tasks(), 1, "only the task due soon is loaded");
    faults.fail_reads.store(true, Ordering::SeqCst);
    hold.store(false, Ordering::Release);
    // Several refusals: the load met the failing store and came back to it.
    poll(WAIT, || async {
        (faults.reads_refused.load(Ordering::SeqCst) >= 3).then_some(())
    })
    .await
    .expect("the load reads while the store fails");
    assert!(
        engine.index_loading(),
        "the load is still going: it did not end at the failed read"
    );
    faults.fail_reads.store(false, Ordering::SeqCst);
    poll(WAIT, || async { (!engine.index_loading()).then_some(()) })
        .await
        .expect("the load finishes once the store answers");
    assert_eq!(engine.live_tasks(), 21, "every task is on the wheel");
    let r = Rig {
        engine,
        clock,
        faults,
        out,
        _dir,
    };
    r.run_until(T0 + 3 * 3_600_000).await;
    let mut sent: Vec<String> = r
        .sent()
        .iter()
        .map(|s| s["body"].as_str().unwrap().to_string())
        .collect();
    sent.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("far-{i:02}")).collect();
    want.push("soon".into());
    want.sort();
    assert_eq!(sent, want, "every task sent once");
}

/// A task read back after a failed write whose run records cannot be read right now (the
/// store failing: an I/O error, a database outage) stays live and is read again once they
/// can: it was parked `failed` for good, its sequence never finished.
#[tokio::test]
async fn a_task_whose_runs_cannot_be_read_for_a_moment_is_read_again_not_failed() {
    let r = six_paced_two_sent().await;
    // Message 2's settle fails: the task is unloaded, to be read back from disk; and the
    // runs' index cannot be scanned for a while.
    *r.faults.fail_scans_of.lock() = Some(herald::store::backend::TreeId::Active);
    r.faults.fail_after(1);
    r.run_until(T0 + 6_000).await;
    r.faults.set(false, false);
    r.run_until(T0 + 10_000).await;
    let refused = r
        .faults
        .reads_refused
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        refused > 0,
        "the task was read back while its runs could not be"
    );
    *r.faults.fail_scans_of.lock() = None;
    r.run_until(T0 + 30_000).await;
    let v = r.engine.get("seq").unwrap().expect("the task");
    assert_eq!(
        v.task.state,
        herald::model::TaskState::Completed,
        "{:?}",
        v.task.failed_reason
    );
    assert_eq!(seqs(&r.sent()), [0, 1, 2, 2, 3, 4, 5]);
}

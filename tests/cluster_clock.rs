//! Nodes whose clocks are 2 s off the database's (issue 24, HA.md "Time"), under libfaketime:
//! four real nodes on one private PostgreSQL, `a` and `b` on the real clock, `ahead` at +2 s
//! and `behind` at −2 s (`FAKETIME`, the monotonic clock left alone). With
//! `max_clock_offset = 500ms` the two off nodes own no shard and `/healthz` shows their
//! offset; `a` and `b` carry all nine; creates and cancels sent to any of the four are kept,
//! and the history checker holds, "nothing before due − max_clock_offset" included.

mod common;

use std::time::Duration;

use common::cluster::{metric, node, node_command, owned, TEST_TIMING};
use common::herald::{in_ms, ms_of, poll, Proc};
use common::history::{check, Cancel, Expected, History};
use common::http;
use common::pg::PgServer;
use common::receiver::Receiver;
use serde_json::json;

const SHARDS: u32 = 9;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_two_seconds_off_own_nothing_and_the_others_carry_every_shard() {
    let test = "nodes_two_seconds_off_own_nothing_and_the_others_carry_every_shard";
    let Some(lib) = common::tools::faketime_lib(test) else {
        return;
    };
    let Some(pg) = PgServer::start("cluster_clock") else {
        return;
    };
    let url = pg.create_db("clock");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let timing = format!("{TEST_TIMING}max_clock_offset = \"500ms\"\n");
    let good: Vec<Proc> = ["a", "b"]
        .iter()
        .map(|n| node(&url, dir.path(), n, n, SHARDS, &rx.url(), &timing))
        .collect();
    let hook = format!("url = \"{}\"\ntimeout = \"1s\"\n", rx.url());
    let off: Vec<Proc> = [("ahead", "+2s"), ("behind", "-2s")]
        .iter()
        .map(|(n, by)| {
            let mut cmd = node_command(&url, dir.path(), n, n, SHARDS, &hook, &timing);
            cmd.env("LD_PRELOAD", &lib)
                .env("FAKETIME", by)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
            Proc::start(cmd)
        })
        .collect();

    // The two on time carry every shard; the two off hold none, and say how far off they are.
    let carried = poll(Duration::from_secs(30), || async {
        let (a, b) = (owned(&good[0].url).await, owned(&good[1].url).await);
        (a + b == SHARDS as u64 && a > 0 && b > 0).then_some((a, b))
    })
    .await;
    let healths: Vec<_> = off.iter().map(|p| p.url.clone()).collect::<Vec<_>>();
    let mut seen = Vec::new();
    for u in &healths {
        seen.push(http::get(&format!("{u}/healthz")).await.json());
    }
    assert!(
        carried.is_some(),
        "a and b hold all {SHARDS} shards between them while ahead and behind refuse: a {}, b {}, off nodes {seen:?}",
        owned(&good[0].url).await,
        owned(&good[1].url).await
    );
    // How far off each is (the sign's convention is `cluster/offset.rs`'s: only the two
    // opposite ones are asserted here).
    let offsets: Vec<i64> = seen
        .iter()
        .map(|h| {
            assert_eq!(h["cluster"]["shards_owned"], 0, "{h}");
            assert!(
                h["cluster"]["refusing_shards"]
                    .as_str()
                    .is_some_and(|w| w.contains("max_clock_offset")),
                "/healthz says why the node owns nothing: {h}"
            );
            h["cluster"]["clock_offset_ms"].as_i64().unwrap_or(0)
        })
        .collect();
    assert!(
        offsets.iter().all(|o| (1_500..2_500).contains(&o.abs()))
            && offsets[0].signum() == -offsets[1].signum(),
        "the offsets shown, ahead and behind by 2 s: {seen:?}"
    );

    // Creates through every node, one cancel through an off node; the off nodes hand them on.
    let all: Vec<String> = good.iter().chain(&off).map(|p| p.url.clone()).collect();
    let mut hist = History {
        max_clock_offset_ms: 500.0,
        slack_ms: 50.0,
        ..History::default()
    };
    for (i, via) in all.iter().enumerate() {
        for k in 0..2 {
            let id = format!("one-{i}-{k}");
            let at = in_ms(1_000 + 700 * k as i64 + 150 * i as i64);
            let r = http::post_json(
                &format!("{via}/v1/tasks"),
                &json!({"id": id, "channel": "hook", "schedule": {"at": at},
                    "messages": [{"to": "x", "body": id}]}),
            )
            .await;
            assert_eq!(r.status, 201, "create {id} via {via}: {}", r.text());
            hist.expected.push(Expected {
                key: format!("{id}:1:0"),
                due_ms: ms_of(&at),
                shard: herald::store::pg::fence::shard_of_task(&id, SHARDS),
            });
        }
        let id = format!("seq-{i}");
        let at = in_ms(800);
        let r = http::post_json(
            &format!("{via}/v1/tasks"),
            &json!({"id": id, "channel": "hook", "schedule": {"at": at},
                "pacing": {"interval": "300ms"},
                "messages": (0..4).map(|m| json!({"to": format!("r{m}"), "body": "p"})).collect::<Vec<_>>()}),
        )
        .await;
        assert_eq!(r.status, 201, "create {id} via {via}: {}", r.text());
        for seq in 0..4 {
            hist.expected.push(Expected {
                key: format!("{id}:1:{seq}"),
                due_ms: ms_of(&at),
                shard: herald::store::pg::fence::shard_of_task(&id, SHARDS),
            });
        }
    }
    let at = in_ms(4_000);
    let r = http::post_json(
        &format!("{}/v1/tasks", all[0]),
        &json!({"id": "cancelled", "channel": "hook", "schedule": {"at": at},
            "messages": [{"to": "x", "body": "no"}]}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = http::post_json(&format!("{}/v1/tasks/cancelled/cancel", all[2]), &json!({})).await;
    assert_eq!(r.status, 200, "cancel through the node ahead: {}", r.text());
    hist.cancels.push(Cancel {
        task: "cancelled".into(),
        answered_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            * 1000.0,
    });

    let want: Vec<String> = hist.expected.iter().map(|e| e.key.clone()).collect();
    poll(Duration::from_secs(30), || async {
        let got: std::collections::HashSet<String> = rx
            .requests()
            .iter()
            .filter_map(|r| r.idempotency_key().map(str::to_string))
            .collect();
        want.iter().all(|k| got.contains(k)).then_some(())
    })
    .await;
    // Past the cancelled task's due instant, so a send of it would have been seen.
    poll(Duration::from_secs(10), || async {
        (chrono::Utc::now().timestamp_millis() as f64 > ms_of(&at) + 500.0).then_some(())
    })
    .await;
    let view = http::get(&format!("{}/v1/cluster", all[0])).await.json();
    for s in view["leases"].as_array().into_iter().flatten() {
        if let (Some(shard), Some(epoch)) = (s["shard"].as_u64(), s["epoch"].as_u64()) {
            hist.epochs.push((shard as u32, epoch));
        }
    }
    let held = owned(&good[0].url).await + owned(&good[1].url).await;
    assert_eq!(
        held, SHARDS as u64,
        "a and b still hold every shard between them: {view}"
    );
    hist.deliveries = common::cluster::deliveries(&rx);
    let bad = check(&hist);
    assert!(
        bad.is_empty(),
        "{} messages expected, {} delivered:\n{}",
        hist.expected.len(),
        hist.deliveries.len(),
        bad.join("\n")
    );
    for u in &healths {
        assert_eq!(owned(u).await, 0, "{u} still owns nothing at the end");
    }
    for p in &good {
        let h = http::get(&format!("{}/healthz", p.url)).await.json();
        assert!(h["cluster"]["refusing_shards"].is_null(), "{h}");
    }
}

/// A node 400 ms ahead of the database (inside `max_clock_offset`) owns shards and fires at
/// database time (HA.md "Time"), not on its own clock: on its own clock every send would
/// arrive 400 ms before its due instant. Being late is not judged here (a loaded machine is
/// late); being early is never allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_ahead_inside_the_bound_fires_at_database_time() {
    let test = "a_node_ahead_inside_the_bound_fires_at_database_time";
    let Some(lib) = common::tools::faketime_lib(test) else {
        return;
    };
    let Some(pg) = PgServer::start("cluster_clock_ahead") else {
        return;
    };
    let url = pg.create_db("ahead");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let timing = format!("{TEST_TIMING}max_clock_offset = \"500ms\"\n");
    let hook = format!("url = \"{}\"\ntimeout = \"1s\"\n", rx.url());
    let mut cmd = node_command(&url, dir.path(), "ahead", "ahead", SHARDS, &hook, &timing);
    cmd.env("LD_PRELOAD", &lib)
        .env("FAKETIME", "+0.4")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    let n = Proc::start(cmd);
    let all = poll(Duration::from_secs(30), || async {
        (owned(&n.url).await == SHARDS as u64).then_some(())
    })
    .await;
    let h = http::get(&format!("{}/healthz", n.url)).await.json();
    assert!(
        all.is_some(),
        "the node 400 ms ahead takes every shard: {h}"
    );
    let off = h["cluster"]["clock_offset_ms"].as_i64().unwrap_or(0);
    assert!(
        (-600..=-200).contains(&off),
        "database minus node, the node 400 ms ahead: {h}"
    );

    // Due instants named on the test's clock, which is the database's (one machine).
    let mut due = std::collections::HashMap::new();
    for k in 0..6 {
        let id = format!("at-{k}");
        let at = in_ms(1_500 + 250 * k);
        let r = http::post_json(
            &format!("{}/v1/tasks", n.url),
            &json!({"id": id, "channel": "hook", "schedule": {"at": at},
                "messages": [{"to": "x", "body": id}]}),
        )
        .await;
        assert_eq!(r.status, 201, "create {id}: {}", r.text());
        due.insert(format!("{id}:1:0"), ms_of(&at));
    }
    let got = poll(Duration::from_secs(30), || async {
        let d = common::cluster::deliveries(&rx);
        (d.len() >= due.len()).then_some(d)
    })
    .await
    .unwrap_or_else(|| panic!("6 sends, got {:?}", common::cluster::deliveries(&rx)));
    for d in &got {
        let want = due[&d.key];
        // 20 ms: the receiver's and the test's readings of one clock, rounding included.
        assert!(
            d.at_ms >= want - 20.0,
            "{} arrived {:.0} ms before its due instant: the node fired on its own clock",
            d.key,
            want - d.at_ms
        );
    }
}

/// A node's wall clock steps an hour forward while it holds every shard (`date -s`, a VM
/// snapshot restored, chrony's makestep), under libfaketime with its offset in a file re-read
/// on every clock call and the monotonic clock left alone. Database time is read off the
/// monotonic clock (`clock::OffsetClock`), so a one-shot due in 30 minutes is not handed over
/// (it was at once, an hour of fires, when database time followed the wall), the node
/// measures its offset again at once and refuses its shards, and takes them back when its
/// wall is corrected, the task still waiting for its due instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_wall_steps_an_hour_ahead_sends_nothing_early() {
    let test = "a_node_whose_wall_steps_an_hour_ahead_sends_nothing_early";
    let Some(node) = SteppedNode::start(test, "step", 0).await else {
        return;
    };
    let (n, rx) = (&node.n, &node.rx);
    let set_offset = |s: i64| node.set_offset(s);
    let all = poll(Duration::from_secs(30), || async {
        (owned(&n.url).await == u64::from(SHARDS)).then_some(())
    })
    .await;
    assert!(all.is_some(), "the node takes every shard");

    let at = in_ms(30 * 60_000);
    let r = http::post_json(
        &format!("{}/v1/tasks", n.url),
        &json!({"id": "later", "channel": "hook", "schedule": {"at": at},
            "messages": [{"to": "x", "body": "later"}]}),
    )
    .await;
    assert_eq!(r.status, 201, "create: {}", r.text());
    let task = format!("{}/v1/tasks/later", n.url);
    let state = http::get(&task).await.json()["state"].clone();

    set_offset(3_600);
    let stepped = std::time::Instant::now();
    // The step is seen by the next measurement: at once now, within 30 s before.
    let seen = poll(Duration::from_secs(40), || async {
        let h = http::get(&format!("{}/healthz", n.url)).await.json();
        let off = h["cluster"]["clock_offset_ms"].as_i64().unwrap_or(0);
        (off < -3_000_000).then_some(stepped.elapsed())
    })
    .await;
    let d = common::cluster::deliveries(rx);
    assert!(
        d.is_empty(),
        "nothing is due for 30 minutes, yet the node sent {d:?} after its wall stepped an hour"
    );
    let seen = seen.expect("the node measures the stepped offset");
    assert!(
        seen < Duration::from_secs(10),
        "the offset is measured again right after the step, not at the next 30 s round: {seen:?}"
    );
    let refused = poll(Duration::from_secs(10), || async {
        (owned(&n.url).await == 0).then_some(())
    })
    .await;
    assert!(refused.is_some(), "an hour off, the node owns nothing");

    set_offset(0);
    let back = poll(Duration::from_secs(30), || async {
        (owned(&n.url).await == u64::from(SHARDS)).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "the wall corrected, the node takes its shards back"
    );
    // The node's own wall steps, counted also where database time does not follow them.
    let counted = poll(Duration::from_secs(10), || async {
        let jumps = metric(&n.url, "herald_wall_clock_jumps_total").await;
        let back = metric(&n.url, "herald_wall_clock_steps_back_total").await;
        (jumps == 1.0 && back == 1.0).then_some(())
    })
    .await;
    assert!(
        counted.is_some(),
        "one jump and one step back counted: {}",
        http::get(&format!("{}/metrics", n.url)).await.text()
    );
    let v = http::get(&task).await.json();
    assert_eq!(v["state"], state, "the task still waits for its due: {v}");
    let d = common::cluster::deliveries(rx);
    assert!(d.is_empty(), "nothing sent early: {d:?}");
}

/// Review finding: a node started with its wall an hour ahead of the database's read that
/// hour (its clock, before any acceptable measurement, is its own) and refused its shards; once
/// its wall was stepped back the measurement was acceptable and it took every shard while its
/// clock, which never goes back, still read an hour ahead: fires of that hour would go early.
/// It now owns nothing until database time catches up with its reading, and `/healthz` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_ahead_takes_no_shards_after_its_wall_is_stepped_back() {
    let test = "a_node_started_ahead_takes_no_shards_after_its_wall_is_stepped_back";
    let Some(node) = SteppedNode::start(test, "ahead", 3_600).await else {
        return;
    };
    let n = &node.n;
    let refusing = |want: &'static str| {
        let url = n.url.clone();
        async move {
            let h = http::get(&format!("{url}/healthz")).await.json();
            let why = h["cluster"]["refusing_shards"]
                .as_str()
                .unwrap_or("")
                .to_string();
            why.contains(want).then_some(why)
        }
    };
    let far = poll(Duration::from_secs(30), || refusing("beyond")).await;
    assert!(far.is_some(), "an hour ahead, the node refuses its shards");
    assert_eq!(owned(&n.url).await, 0);

    node.set_offset(0);
    let held = poll(Duration::from_secs(15), || {
        refusing("ahead of the database")
    })
    .await;
    assert!(
        held.is_some(),
        "its wall corrected, the node says its clock is held ahead: {}",
        http::get(&format!("{}/healthz", n.url)).await.text()
    );
    // Before the fix it took every shard within a second of the step back.
    let until = std::time::Instant::now() + Duration::from_secs(8);
    while std::time::Instant::now() < until {
        assert_eq!(
            owned(&n.url).await,
            0,
            "a node whose clock reads an hour ahead takes no shard"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One cluster node under libfaketime whose wall the test steps through `offset`'s file (in
/// seconds, `set`), its webhook channel `hook` to `rx`; monotonic time is not faked. `None`:
/// faketime or PostgreSQL missing (skipped with a printed reason).
struct SteppedNode {
    n: Proc,
    rx: Receiver,
    offset_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _pg: PgServer,
}

impl SteppedNode {
    async fn start(test: &str, db: &str, offset_s: i64) -> Option<SteppedNode> {
        let lib = common::tools::faketime_lib(test)?;
        let pg = PgServer::start(&format!("cluster_clock_{db}"))?;
        let url = pg.create_db(db);
        let rx = Receiver::start().await;
        let dir = tempfile::tempdir().unwrap();
        let offset_file = dir.path().join("faketime.rc");
        write_offset(&offset_file, offset_s);
        let timing = format!("{TEST_TIMING}max_clock_offset = \"500ms\"\n");
        let hook = format!("url = \"{}\"\ntimeout = \"1s\"\n", rx.url());
        let mut cmd = node_command(&url, dir.path(), "a", "a", SHARDS, &hook, &timing);
        cmd.env("LD_PRELOAD", &lib)
            .env("FAKETIME_TIMESTAMP_FILE", &offset_file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        let n = Proc::start(cmd);
        Some(SteppedNode {
            n,
            rx,
            offset_file,
            _dir: dir,
            _pg: pg,
        })
    }

    /// Steps the node's wall to `s` seconds from the real time.
    fn set_offset(&self, s: i64) {
        write_offset(&self.offset_file, s);
    }
}

/// libfaketime's offset file: the wall `s` seconds from the real time.
fn write_offset(f: &std::path::Path, s: i64) {
    std::fs::write(f, format!("{s:+}\n")).unwrap();
}

//! The real `herald` binary on a private PostgreSQL that goes away while herald runs: health
//! says `storage_failing` naming the store (without a password), creates are 503 problem+json
//! with `Retry-After`, no send starts while its in-flight mark cannot be written, herald
//! resumes by itself once the server is back, and nothing acknowledged is lost. And a crash
//! of the database (`pg_ctl -m immediate`) in the middle of a paced sequence: every message
//! arrives, each once (at most the one in flight twice).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::herald::{in_ms, poll, wait_state, write_config, Proc};
use common::http;
use common::pg::PgServer;
use common::receiver::Receiver;
use serde_json::json;

fn spawn(url: &str, dir: &std::path::Path, hook: &str) -> Proc {
    // Short: a statement to a dead server fails in seconds, not the default 30 s.
    spawn_with_timeout(url, dir, hook, "3s")
}

fn spawn_with_timeout(url: &str, dir: &std::path::Path, hook: &str, timeout: &str) -> Proc {
    let config = write_config(
        dir,
        &format!("[channels.hook]\nkind = \"webhook\"\nurl = \"{hook}\"\n"),
    );
    let mut cmd = Proc::command(&config, &dir.join("data"));
    cmd.env("HERALD_STORE_URL", url)
        .env("HERALD_STORE_STATEMENT_TIMEOUT", timeout);
    Proc::start(cmd)
}

/// Deliveries per idempotency key.
fn per_key(rx: &Receiver) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for r in rx.requests() {
        *m.entry(r.idempotency_key().unwrap_or("").to_string())
            .or_default() += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_fails_safe_and_herald_resumes_by_itself() {
    let Some(pg) = PgServer::start("a_database_outage_fails_safe") else {
        return;
    };
    let url = pg.create_db("outage");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let p = spawn(&url, dir.path(), &rx.url());
    let base = p.url.clone();
    let create = |id: &str, after_ms: i64| {
        json!({"id": id, "channel": "hook", "schedule": {"at": in_ms(after_ms)},
               "messages": [{"to": "a", "body": id}]})
    };
    let r = http::post_json(&format!("{base}/v1/tasks"), &create("first", 200)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    rx.wait_for(1, Duration::from_secs(20)).await;
    // Acknowledged before the outage, due during it.
    let r = http::post_json(&format!("{base}/v1/tasks"), &create("during", 2_500)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let due_during = Instant::now() + Duration::from_millis(2_500);

    pg.stop_now("fast");
    // The first write to meet the outage finds it; from then on creates are refused up front.
    let refused = poll(Duration::from_secs(30), || async {
        let r = http::post_json(&format!("{base}/v1/tasks"), &create("refused", 60_000)).await;
        (r.status == 503).then_some(r)
    })
    .await
    .expect("a create is refused while the database is down");
    assert!(
        refused
            .header("content-type")
            .is_some_and(|c| c.starts_with("application/problem+json")),
        "{:?}",
        refused.headers
    );
    assert!(
        refused.header("retry-after").is_some(),
        "{:?}",
        refused.headers
    );
    let health = poll(Duration::from_secs(30), || async {
        let h = http::get(&format!("{base}/healthz")).await;
        (h.status == 503).then_some(h)
    })
    .await
    .expect("health says the storage fails");
    let hj = health.json();
    assert_eq!(hj["status"], "storage_failing", "{hj}");
    // Reads that need the database say so as the writes do: 503, try again (not a bug's 500).
    for path in [
        "/v1/tasks/first",
        "/v1/tasks/first/timeline",
        "/v1/failures",
        "/v1/tasks",
    ] {
        let r = http::get(&format!("{base}{path}")).await;
        assert_eq!(r.status, 503, "{path}: {}", r.text());
        assert!(r.header("retry-after").is_some(), "{path}: {:?}", r.headers);
    }
    let shown = url.as_str();
    assert!(
        hj["reason"].as_str().is_some_and(|r| r.contains(shown)),
        "names the store: {hj}"
    );

    // "during" falls due while its in-flight mark cannot be written: nothing may be sent.
    // (Absence needs time to pass: wait until just after its due instant plus a margin.)
    tokio::time::sleep_until((due_during + Duration::from_millis(1_500)).into()).await;
    assert_eq!(
        rx.count(),
        1,
        "a send started without its durable in-flight mark"
    );

    pg.start_again();
    let back = poll(Duration::from_secs(30), || async {
        let h = http::get(&format!("{base}/healthz")).await;
        (h.status == 200).then_some(h)
    })
    .await;
    assert!(back.is_some(), "herald did not resume by itself");
    let got = rx.wait_for(2, Duration::from_secs(30)).await;
    assert_eq!(
        got.len(),
        2,
        "the acknowledged task was delivered after the outage"
    );
    let r = http::post_json(&format!("{base}/v1/tasks"), &create("after", 100)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    wait_state(&base, "after", "completed", Duration::from_secs(20)).await;
    wait_state(&base, "during", "completed", Duration::from_secs(20)).await;
    let keys = per_key(&rx);
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(
        keys.values().all(|n| *n == 1),
        "each message once: {keys:?}"
    );
    // The refused create was never stored.
    let r = http::get(&format!("{base}/v1/tasks/refused")).await;
    assert_eq!(r.status, 404, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_during_a_paced_sequence_sends_every_message_once() {
    let Some(pg) = PgServer::start("a_database_crash_during_a_paced_sequence") else {
        return;
    };
    let url = pg.create_db("paced");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let p = spawn(&url, dir.path(), &rx.url());
    let base = p.url.clone();
    const N: usize = 30;
    let messages: Vec<_> = (0..N)
        .map(|i| json!({"to": format!("u{i}"), "body": format!("m{i}")}))
        .collect();
    let r = http::post_json(
        &format!("{base}/v1/tasks"),
        &json!({"id": "paced", "channel": "hook", "schedule": {"at": in_ms(300)},
                "messages": messages, "pacing": {"interval": "100ms"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    rx.wait_for(8, Duration::from_secs(30)).await;
    // A crash: no shutdown checkpoint, every connection cut; the server recovers from its WAL.
    pg.restart("immediate");
    let done = poll(Duration::from_secs(60), || async {
        let keys = per_key(&rx);
        (keys.len() == N).then_some(keys)
    })
    .await
    .unwrap_or_else(|| panic!("not every message arrived: {:?}", per_key(&rx)));
    let twice: Vec<_> = done.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.len() <= 1 && twice.iter().all(|(_, n)| **n == 2),
        "only the message in flight may come twice: {twice:?}"
    );
    let v = wait_state(&base, "paced", "completed", Duration::from_secs(30)).await;
    assert_eq!(v["progress"]["sent"], N as u64, "{v}");
    // In order: each message's first arrival after the one before it.
    let mut first: Vec<(u64, f64)> = Vec::new();
    for r in rx.requests() {
        let seq = r.json.as_ref().unwrap()["seq"].as_u64().unwrap();
        if !first.iter().any(|(s, _)| *s == seq) {
            first.push((seq, r.at_ms));
        }
    }
    let seqs: Vec<u64> = first.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (0..N as u64).collect::<Vec<_>>(), "in order");
}

/// A stalled database (its processes stopped: statements hang with no answer) holds the
/// commands that need it, not the runtime: with more such commands than herald has workers
/// (each loads its idle task from the database), `/healthz` still answers at once; and every
/// command answers once the server goes on. The commands' loads ran on the workers before:
/// two of them held both, and nothing async ran until the statement timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_waiting_on_a_stalled_database_hold_no_worker() {
    let Some(pg) = PgServer::start("commands_on_a_stalled_database") else {
        return;
    };
    let url = pg.create_db("stall");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Long: the stall must outlast the probes below by far.
    let p = spawn_with_timeout(&url, dir.path(), &rx.url(), "30s");
    let base = p.url.clone();
    const N: usize = 6;
    for i in 0..N {
        let r = http::post_json(
            &format!("{base}/v1/tasks"),
            &json!({"id": format!("idle{i}"), "channel": "hook",
                    "schedule": {"at": in_ms(3_600_000)}, "messages": [{"to": "a", "body": "x"}]}),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    pg.freeze();
    let cancels: Vec<_> = (0..N)
        .map(|i| {
            let url = format!("{base}/v1/tasks/idle{i}/cancel");
            tokio::spawn(async move { http::post_json(&url, &json!({})).await })
        })
        .collect();
    // Probe for 3 s: every /healthz answers within a second while the cancels hang.
    let end = Instant::now() + Duration::from_secs(3);
    let mut probes = 0;
    while Instant::now() < end {
        let h = tokio::time::timeout(
            Duration::from_secs(1),
            http::get(&format!("{base}/healthz")),
        )
        .await;
        pg_thaw_on_fail(
            &pg,
            h.is_ok(),
            "/healthz did not answer within 1 s during the stall",
        );
        probes += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(probes >= 3, "{probes} probes");
    let waiting = cancels.iter().all(|c| !c.is_finished());
    pg_thaw_on_fail(
        &pg,
        waiting,
        "the cancels did not wait for the stalled database",
    );
    // Reads wait on the blocking pool, a bounded number of them: past it a read is 503 at once
    // (clients retrying through an outage must not fill the pool the engine reads on).
    let reads: Vec<_> = (0..70)
        .map(|_| {
            let url = format!("{base}/v1/tasks/idle0");
            tokio::spawn(async move { http::get(&url).await })
        })
        .collect();
    let refused = poll(Duration::from_secs(3), || async {
        reads.iter().any(|r| r.is_finished()).then_some(())
    })
    .await;
    pg_thaw_on_fail(&pg, refused.is_some(), "no read was refused past the cap");
    pg.thaw();
    let mut statuses = Vec::new();
    for r in reads {
        let r = r.await.unwrap();
        if r.status == 503 {
            assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
        }
        statuses.push(r.status);
    }
    let busy = statuses.iter().filter(|s| **s == 503).count();
    assert!((1..=70 - 64).contains(&busy), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 503 || *s == 200),
        "{statuses:?}"
    );
    for c in cancels {
        let r = c.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for i in 0..N {
        wait_state(
            &base,
            &format!("idle{i}"),
            "cancelled",
            Duration::from_secs(10),
        )
        .await;
    }
}

/// The failure list's commands read the store as every other command does: off the runtime's
/// workers. Review finding: a dismissal (or retry) read its entry inline, so on a stalled
/// database it held a worker until the statement timeout; with one worker (as on a one-core
/// machine) nothing async ran, `/healthz` included. The entry asked for need not exist: the
/// read of it is what waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_commands_on_a_stalled_database_hold_no_worker() {
    let Some(pg) = PgServer::start("failure_commands_on_a_stalled_database") else {
        return;
    };
    let url = pg.create_db("stall_failures");
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "[channels.hook]\nkind = \"webhook\"\nurl = \"{}\"\n",
            rx.url()
        ),
    );
    let mut cmd = Proc::command(&config, &dir.path().join("data"));
    cmd.env("HERALD_STORE_URL", &url)
        .env("HERALD_STORE_STATEMENT_TIMEOUT", "30s")
        .env("TOKIO_WORKER_THREADS", "1");
    let p = Proc::start(cmd);
    let base = p.url.clone();
    pg.freeze();
    let commands: Vec<_> = [
        ("DELETE", "/v1/failures/gone:1:0"),
        ("POST", "/v1/failures/gone:1:0/retry"),
    ]
    .into_iter()
    .map(|(method, path)| {
        let url = format!("{base}{path}");
        tokio::spawn(async move { http::request(method, &url, &[], None).await })
    })
    .collect();
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        let h = tokio::time::timeout(
            Duration::from_secs(1),
            http::get(&format!("{base}/healthz")),
        )
        .await;
        pg_thaw_on_fail(
            &pg,
            h.is_ok(),
            "/healthz did not answer within 1 s while a failure command waited for the database",
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waiting = commands.iter().all(|c| !c.is_finished());
    pg_thaw_on_fail(
        &pg,
        waiting,
        "the commands did not wait for the stalled database",
    );
    pg.thaw();
    for c in commands {
        let r = c.await.unwrap();
        assert_eq!(r.status, 404, "{}", r.text());
    }
}

/// Lets the server go on before a failed check panics (a stopped server would outlive the
/// test's cleanup).
fn pg_thaw_on_fail(pg: &PgServer, ok: bool, what: &str) {
    if !ok {
        pg.thaw();
        panic!("{what}");
    }
}

//! A real full disk: the data dir on a small tmpfs that the test mounts (it needs root, as CI
//! runs; elsewhere the tests skip loudly, `tests/common/tools.rs`), a paced sequence sending
//! to a real receiver, and a ballast file that fills the filesystem to the last byte.
//!
//! While full: sends stop, writes answer 503, reads and `/healthz` answer promptly (no store
//! lock is held across a blocking call, `store/backend.rs`). Once the ballast is gone herald
//! heals by itself (`store/commit.rs`'s probe): `/healthz` 200, creates succeed, and the
//! sequence completes with every message sent. SIGTERM while full exits; `kill -9` while full
//! loses nothing acknowledged.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::herald::{poll, wait_state, webhook_channel, write_config, Proc};
use common::http;
use common::receiver::Receiver;
use serde_json::{json, Value};

const MESSAGES: u64 = 10;

/// A tmpfs mounted for one test, unmounted (lazily) on drop.
struct Tmpfs {
    _dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl Tmpfs {
    fn mount(test: &str, mib: u64) -> Option<Tmpfs> {
        let install = "run the tests as root (mount(8) needs it), as CI does";
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            common::tools::skip(test, "mounting a tmpfs needs root", install);
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            common::tools::skip(test, "mount -t tmpfs failed", install);
            return None;
        }
        Some(Tmpfs { _dir: dir, mnt })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// Writes 1 MiB chunks into `path` until the filesystem refuses one, then the rest byte-wise
/// in smaller chunks: the filesystem is full to its last block.
fn fill(path: &Path) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("ballast");
    for chunk in [1 << 20, 4096, 1] {
        let buf = vec![0xA5u8; chunk];
        while f.write_all(&buf).is_ok() {}
    }
    let _ = f.sync_all();
}

/// Grows the ballast at `path` until about `leave` bytes are free on its filesystem.
fn fill_until(path: &Path, leave: u64) {
    let dir = path.parent().expect("ballast dir");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("ballast");
    let buf = vec![0xA5u8; 1 << 20];
    while herald::store::space::free_bytes(dir).is_some_and(|free| free > leave + (1 << 20)) {
        if f.write_all(&buf).is_err() {
            break;
        }
    }
    let _ = f.sync_all();
}

/// herald's memtable (what sled does not have yet), from `/metrics`.
async fn memtable_bytes(base: &str) -> Option<u64> {
    let r = http::try_request("GET", &format!("{base}/metrics"), &[], None)
        .await
        .ok()?;
    r.text()
        .lines()
        .find_map(|l| l.strip_prefix("herald_store_memtable_bytes "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

struct Rig {
    fs: Tmpfs,
    receiver: Receiver,
    config: PathBuf,
    data: PathBuf,
}

impl Rig {
    async fn start(test: &str) -> Option<(Rig, Proc)> {
        let fs = Tmpfs::mount(test, 96)?;
        let receiver = Receiver::start().await;
        let data = fs.mnt.join("data");
        let config = write_config(
            fs._dir.path(),
            &format!(
                "shutdown_timeout = \"2s\"\n{}",
                webhook_channel("hook", &receiver.url(), "")
            ),
        );
        let herald = Proc::spawn(&config, &data);
        Some((
            Rig {
                fs,
                receiver,
                config,
                data,
            },
            herald,
        ))
    }

    fn ballast(&self) -> PathBuf {
        self.fs.mnt.join("ballast")
    }

    /// Deliveries per message seq of task `seq`.
    fn sent_per_seq(&self) -> Vec<usize> {
        let mut n = vec![0; MESSAGES as usize];
        for r in self.receiver.requests() {
            let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            if v["task_id"] == "seq" {
                if let Some(c) = v["seq"].as_u64().and_then(|s| n.get_mut(s as usize)) {
                    *c += 1;
                }
            }
        }
        n
    }
}

async fn create_sequence(base: &str) {
    let to: Vec<String> = (0..MESSAGES).map(|i| format!("r{i}")).collect();
    let r = http::post_json(
        &format!("{base}/v1/tasks"),
        &json!({"id": "seq", "channel": "hook", "schedule": {"after": "1s"},
                "to": to, "body": "hello", "pacing": {"interval": "300ms"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
}

async fn health(base: &str) -> Option<(u16, Value)> {
    let r = http::try_request("GET", &format!("{base}/healthz"), &[], None)
        .await
        .ok()?;
    Some((r.status, r.json()))
}

/// Fills the disk once a few messages went out, and waits for herald to say so. In two steps,
/// so the test is deterministic: first to under herald's write reserve (writes stop, and sled
/// takes what the memtable holds), then to the last byte once nothing of herald's is moving
/// (a byte-full disk arriving while sled writes a layer is the reopen path, not this test's).
async fn fill_and_see_failing(rig: &Rig, base: &str) {
    rig.receiver.wait_for(2, Duration::from_secs(20)).await;
    fill_until(&rig.ballast(), 20 << 20);
    poll(Duration::from_secs(10), || async {
        matches!(health(base).await, Some((503, _))).then_some(())
    })
    .await
    .expect("storage_failing under the write reserve");
    poll(Duration::from_secs(20), || async {
        (memtable_bytes(base).await == Some(0)).then_some(())
    })
    .await
    .expect("the memtable went into sled while writes were refused");
    fill(&rig.ballast());
    let failing = poll(Duration::from_secs(10), || async {
        match health(base).await {
            Some((503, v)) if v["status"] == "storage_failing" => Some(v),
            _ => None,
        }
    })
    .await;
    let v = failing.expect("/healthz did not report storage_failing within 10 s of a full disk");
    assert!(
        v["reason"].as_str().is_some_and(|r| r.contains("full")),
        "the reason names the full disk: {v}"
    );
}

/// A read answers (any status but a hang) within `bound`.
async fn answers_within(method: &str, url: &str, body: Option<Value>, bound: Duration) -> u16 {
    let started = Instant::now();
    let body = body.map(|b| serde_json::to_vec(&b).unwrap());
    let r = http::try_request(method, url, &[], body)
        .await
        .unwrap_or_else(|e| panic!("{method} {url} while the disk is full: {e}"));
    let took = started.elapsed();
    assert!(
        took <= bound,
        "{method} {url} took {took:?} while the disk is full (bound {bound:?})"
    );
    r.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_keeps_reads_and_heals_when_space_returns() {
    let Some((rig, herald)) =
        Rig::start("a_full_disk_refuses_writes_keeps_reads_and_heals_when_space_returns").await
    else {
        return;
    };
    let base = herald.url.clone();
    create_sequence(&base).await;
    fill_and_see_failing(&rig, &base).await;

    // Reads need no disk write: they answer, and promptly.
    let bound = Duration::from_secs(1);
    for path in [
        "/v1/tasks",
        "/v1/tasks/seq",
        "/v1/tasks/seq/runs",
        "/v1/channels",
        "/metrics",
    ] {
        let status = answers_within("GET", &format!("{base}{path}"), None, bound).await;
        assert_eq!(status, 200, "GET {path} while the disk is full");
    }
    let preview = json!({"schedule": {"cron": "0 9 * * *"}, "n": 3});
    let status = answers_within(
        "POST",
        &format!("{base}/v1/schedules/preview"),
        Some(preview),
        bound,
    )
    .await;
    assert_eq!(status, 200);
    let create = json!({"schedule": {"after": "1h"}, "to": ["x"], "body": "refused"});
    let r = http::post_json(&format!("{base}/v1/tasks"), &create).await;
    assert_eq!(
        r.status,
        503,
        "a create while the disk is full: {}",
        r.text()
    );
    assert!(r.header("retry-after").is_some(), "503 carries Retry-After");

    // Sends stop: at most the one that was in flight lands after the failure was seen.
    let stopped_at: usize = rig.sent_per_seq().iter().sum();
    let watch_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < watch_until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after: usize = rig.sent_per_seq().iter().sum();
    assert!(
        after <= stopped_at + 1,
        "sends went on while the disk was full: {stopped_at} then {after}"
    );
    assert!(
        (after as u64) < MESSAGES,
        "the sequence must still be unfinished when the disk fills (got {after})"
    );

    // Space returns: within 5 s herald is healthy again, by itself.
    std::fs::remove_file(rig.ballast()).expect("remove the ballast");
    let freed = Instant::now();
    let healed = poll(Duration::from_secs(5), || async {
        matches!(health(&base).await, Some((200, _))).then_some(())
    })
    .await;
    assert!(
        healed.is_some(),
        "/healthz not 200 within 5 s of space returning: {:?}",
        health(&base).await
    );
    eprintln!("healed {:?} after the space returned", freed.elapsed());
    let r = http::post_json(&format!("{base}/v1/tasks"), &create).await;
    assert_eq!(r.status, 201, "a create after healing: {}", r.text());
    let created = r.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        http::get(&format!("{base}/v1/tasks/{created}"))
            .await
            .status,
        200
    );

    // The stopped sequence continues and completes; every message went out, once.
    wait_state(&base, "seq", "completed", Duration::from_secs(30)).await;
    let per_seq = rig.sent_per_seq();
    assert!(
        per_seq.iter().all(|&n| n == 1),
        "every message once, per seq: {per_seq:?}"
    );
    drop(herald);
    let _ = (&rig.config, &rig.data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_the_disk_is_full_exits_and_kill_9_loses_nothing() {
    let Some((rig, mut herald)) =
        Rig::start("sigterm_while_the_disk_is_full_exits_and_kill_9_loses_nothing").await
    else {
        return;
    };
    create_sequence(&herald.url).await;
    fill_and_see_failing(&rig, &herald.url).await;
    // shutdown_timeout is 2 s; closing gets the watchdog's grace on top at most.
    herald.signal(libc::SIGTERM);
    herald.wait_exit(Duration::from_secs(15)).await;

    // Again, full, and this time kill -9.
    std::fs::remove_file(rig.ballast()).expect("remove the ballast");
    let mut herald = Proc::spawn(&rig.config, &rig.data);
    poll(Duration::from_secs(10), || async {
        matches!(health(&herald.url).await, Some((200, _))).then_some(())
    })
    .await
    .expect("herald ready after the restart");
    let before: usize = rig.sent_per_seq().iter().sum();
    poll(Duration::from_secs(20), || async {
        (rig.sent_per_seq().iter().sum::<usize>() > before).then_some(())
    })
    .await
    .expect("the sequence goes on after the restart");
    fill_and_see_failing(&rig, &herald.url).await;
    herald.kill9();
    std::fs::remove_file(rig.ballast()).expect("remove the ballast");
    let herald = Proc::spawn(&rig.config, &rig.data);
    wait_state(&herald.url, "seq", "completed", Duration::from_secs(30)).await;
    let per_seq = rig.sent_per_seq();
    let extra: usize = per_seq.iter().map(|&n| n.saturating_sub(1)).sum();
    assert!(
        per_seq.iter().all(|&n| n >= 1),
        "every message sent: {per_seq:?}"
    );
    // Each outage may re-send the one message that was in flight (same idempotency key).
    assert!(
        extra <= 2,
        "at most one in-flight duplicate per outage: {per_seq:?}"
    );
}

//! Damaged data directories on the real binary: bytes flipped in each of sled's files, the data
//! file truncated. Start-up must end in bounded time, either serving (everything it can read)
//! or exiting non-zero with one clear line that names the directory and what to do, and it
//! must never loop or print a panic backtrace.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::herald::{write_config, Proc};
use common::http;
use serde_json::json;

/// A data dir with pending tasks, a paused one and a finished one, written by the binary.
async fn make_data(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    let config = write_config(dir, "");
    let mut p = Proc::spawn(&config, &data);
    for i in 0..40 {
        let r = http::post_json(
            &format!("{}/v1/tasks", p.url),
            &json!({"id": format!("t{i:02}"), "schedule": {"after": if i == 0 { "0s" } else { "1h" }},
                    "to": ["a", "b"], "body": "hello"}),
        )
        .await;
        assert_eq!(r.status, 201);
    }
    let r = http::request("POST", &format!("{}/v1/tasks/t01/pause", p.url), &[], None).await;
    assert_eq!(r.status, 200);
    p.kill9();
    data
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

enum Damage {
    Flip(u64),
    Truncate(u64),
}

fn damage(file: &Path, d: &Damage) {
    let mut bytes = std::fs::read(file).unwrap();
    match d {
        Damage::Flip(at) => {
            let at = (*at as usize).min(bytes.len().saturating_sub(16));
            for b in bytes.iter_mut().skip(at).take(16) {
                *b ^= 0xa5;
            }
        }
        Damage::Truncate(to) => bytes.truncate(*to as usize),
    }
    std::fs::write(file, bytes).unwrap();
}

/// What one start on a damaged dir did.
enum Start {
    Served { health: u16, listed: u16 },
    Refused { code: Option<i32>, stderr: String },
}

async fn start_on(config: &Path, data: &Path) -> Start {
    let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .arg("--data")
        .arg(data)
        .env("HERALD_LOG", "warn")
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err_text = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("herald listening on ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(url) = rx.try_recv() {
            let health = http::get(&format!("{url}/healthz")).await.status;
            let listed = http::get(&format!("{url}/v1/tasks?limit=100")).await.status;
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err_text.join().unwrap();
            assert!(
                !stderr.contains("panicked"),
                "a panic while serving:\n{stderr}"
            );
            assert!(
                stderr.len() < 1 << 20,
                "{} bytes of log: a loop?",
                stderr.len()
            );
            return Start::Served { health, listed };
        }
        if let Some(status) = child.try_wait().unwrap() {
            let stderr = err_text.join().unwrap();
            return Start::Refused {
                code: status.code(),
                stderr,
            };
        }
        assert!(
            Instant::now() < deadline,
            "start-up on a damaged data dir neither served nor ended within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_data_dirs_end_start_up_clearly_or_serve() {
    let dir = tempfile::tempdir().unwrap();
    let original = make_data(dir.path()).await;
    let config = write_config(dir.path(), "");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&original)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(files.iter().any(|f| f.ends_with("db")), "{files:?}");
    // The write-ahead log's last segment holds the writes since the last checkpoint.
    assert!(
        files.iter().any(|f| f
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("wal-"))),
        "{files:?}"
    );
    let mut cases = Vec::new();
    for f in &files {
        let len = std::fs::metadata(f).unwrap().len();
        for at in [0, 20, len / 3, len / 2, len.saturating_sub(40)] {
            cases.push((f.file_name().unwrap().to_owned(), Damage::Flip(at)));
        }
        if f.ends_with("db") {
            for to in [len / 2, len.saturating_sub(100), 10] {
                cases.push((f.file_name().unwrap().to_owned(), Damage::Truncate(to)));
            }
        }
    }
    let (mut served, mut refused) = (0, 0);
    for (i, (file, d)) in cases.iter().enumerate() {
        let data = dir.path().join(format!("case{i}"));
        copy_dir(&original, &data);
        damage(&data.join(file), d);
        let what = format!(
            "{} {}",
            file.to_string_lossy(),
            match d {
                Damage::Flip(at) => format!("flipped at {at}"),
                Damage::Truncate(to) => format!("truncated to {to}"),
            }
        );
        match start_on(&config, &data).await {
            Start::Served { health, listed } => {
                served += 1;
                // Serving means answering: healthy, or 503 naming storage; listings answer.
                assert!(health == 200 || health == 503, "{what}: /healthz {health}");
                assert!(listed == 200 || listed == 503, "{what}: list {listed}");
            }
            Start::Refused { code, stderr } => {
                refused += 1;
                assert_ne!(code, Some(0), "{what}: exit 0 without serving");
                assert!(
                    !stderr.contains("panicked"),
                    "{what}: panic output:\n{stderr}"
                );
                assert!(!stderr.contains("stack backtrace"), "{what}:\n{stderr}");
                let last = stderr.lines().last().unwrap_or_default();
                assert!(
                    last.contains(&*data.to_string_lossy()) && last.contains("move it aside"),
                    "{what}: the last line names the directory and what to do: {stderr}"
                );
            }
        }
    }
    eprintln!(
        "{} damaged dirs: {served} served, {refused} refused clearly",
        cases.len()
    );
}

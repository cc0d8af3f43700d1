//! Starting herald for tests: in-process (port 0, temp data dir) or as the real binary (for
//! tests that kill the process). Plus polling helpers that wait with a deadline.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use herald::config::{Config, Overrides};
use herald::server::Server;
use serde_json::Value;

use super::http;

/// A herald running in this process on a fresh temp data dir.
pub struct TestHerald {
    pub server: Server,
    pub dir: tempfile::TempDir,
}

impl TestHerald {
    /// Starts herald with `config` (TOML, channels etc.) on 127.0.0.1:0.
    pub async fn start(config: &str) -> TestHerald {
        let dir = tempfile::tempdir().expect("temp dir");
        let server = start_in(dir.path(), config).await;
        TestHerald { server, dir }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.server.url(), path)
    }
}

/// Starts herald in-process on `data_dir`.
pub async fn start_in(data_dir: &Path, config: &str) -> Server {
    let cfg = Config::from_toml(
        config,
        Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(data_dir.to_path_buf()),
            token: None,
        },
    )
    .expect("test config is valid");
    herald::server::start(cfg).await.expect("herald starts")
}

/// A config with one webhook channel `name` pointing at `url`.
pub fn webhook_channel(name: &str, url: &str, extra: &str) -> String {
    format!("[channels.{name}]\nkind = \"webhook\"\nurl = \"{url}\"\n{extra}\n")
}

/// Polls `check` every 10 ms until it returns `Some` or `deadline` passes.
pub async fn poll<T, F, Fut>(deadline: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the task at `base` reads `state`; panics with the last view otherwise.
pub async fn wait_state(base: &str, id: &str, state: &str, deadline: Duration) -> Value {
    let url = format!("{base}/v1/tasks/{id}");
    let got = poll(deadline, || {
        let url = url.clone();
        async move {
            let r = http::try_request("GET", &url, &[], None).await.ok()?;
            let v = r.json();
            (v["state"] == state).then_some(v)
        }
    })
    .await;
    match got {
        Some(v) => v,
        None => panic!(
            "task {id} did not reach {state} within {deadline:?}; last view: {}",
            http::get(&url).await.text()
        ),
    }
}

/// Unix ms of an RFC 3339 instant.
pub fn ms_of(rfc3339: &str) -> f64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .unwrap_or_else(|e| panic!("bad instant {rfc3339:?}: {e}"))
        .timestamp_millis() as f64
}

/// RFC 3339 of now + `ms`.
pub fn in_ms(ms: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::milliseconds(ms))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The real `herald` binary, for tests that kill it.
pub struct Proc {
    child: Child,
    pub url: String,
}

impl Proc {
    /// Runs `herald serve --config <config> --data <data> --listen 127.0.0.1:0` and waits (with
    /// a deadline) for the line that says where it listens.
    pub fn spawn(config: &Path, data: &Path) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .arg("--data")
            .arg(data)
            .env("HERALD_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn herald");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("herald listening on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("herald printed its address within 30 s");
        Proc { child, url }
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a config file into `dir` and returns its path.
pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("herald.toml");
    std::fs::write(&p, text).expect("write config");
    p
}

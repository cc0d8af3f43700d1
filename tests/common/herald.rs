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

/// The environment variable (ignored by herald) naming a node in its tagged log lines.
pub const LOG_TAG: &str = "HERALD_TEST_LOG_TAG";

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

    /// Like `start`, with an API token: `/v1` and `/metrics` then need `Bearer <token>`.
    pub async fn start_with_token(config: &str, token: &str) -> TestHerald {
        let dir = tempfile::tempdir().expect("temp dir");
        let server = boot(dir.path(), config, Some(token.to_string())).await;
        TestHerald { server, dir }
    }

    /// Like `start`, with the data dir on tmpfs (`/dev/shm`) where there is one. For tests that
    /// measure scheduling precision: on a disk still writing back a fresh build, one fsync can
    /// stall for hundreds of ms, which would measure the disk, not herald. Durability itself is
    /// tested on disk, by the crash tests.
    pub async fn start_on_tmpfs(config: &str) -> TestHerald {
        let dir = tempfile::Builder::new()
            .prefix("herald-test")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("temp dir");
        let server = start_in(dir.path(), config).await;
        TestHerald { server, dir }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.server.url(), path)
    }
}

/// Starts herald in-process on a fresh temp data dir, with `${VAR}` in the config looked up in
/// `env` (not the process environment, which tests running in parallel share).
pub async fn start_with_env(config: &str, env: &[(&str, &str)]) -> TestHerald {
    let dir = tempfile::tempdir().expect("temp dir");
    let vars: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let cfg = Config::from_toml_with_env(
        config,
        Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(dir.path().to_path_buf()),
            token: None,
        },
        &lookup,
    )
    .expect("test config is valid");
    let cfg = on_test_store(cfg);
    let server = herald::server::start(cfg).await.expect("herald starts");
    TestHerald { server, dir }
}

/// `cfg` on the store the run asked for: unchanged on sled; with `HERALD_TEST_STORE=pg`, on
/// the database that stands for its data directory (`common/pg.rs`).
pub fn on_test_store(mut cfg: Config) -> Config {
    if let Some(url) = super::pg::harness_url(&cfg.data_dir) {
        cfg.database = Some(herald::config::DatabaseConfig {
            url,
            password: None,
            pool_size: herald::config::DEFAULT_POOL_SIZE,
            statement_timeout_ms: herald::config::DEFAULT_STATEMENT_TIMEOUT_MS,
        });
    }
    cfg
}

/// Starts herald in-process on `data_dir`.
pub async fn start_in(data_dir: &Path, config: &str) -> Server {
    boot(data_dir, config, None).await
}

async fn boot(data_dir: &Path, config: &str, token: Option<String>) -> Server {
    let cfg = Config::from_toml(
        config,
        Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(data_dir.to_path_buf()),
            token,
        },
    )
    .expect("test config is valid");
    let cfg = on_test_store(cfg);
    // A restart in the same directory may find the last instance's sled lock still held for
    // a moment (`sled_still_locked`): try again on that error only, with a deadline.
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match herald::server::start(cfg.clone()).await {
            Ok(s) => return s,
            Err(e) if sled_still_locked(&e) && Instant::now() < end => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("herald starts: {e:?}"),
        }
    }
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
        Proc::start(Proc::command(config, data))
    }

    /// The command [`Proc::spawn`] runs, to adjust (environment, working directory, limits)
    /// before [`Proc::start`].
    pub fn command(config: &Path, data: &Path) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .arg("--data")
            .arg(data)
            .env("HERALD_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(url) = super::pg::harness_url(data) {
            cmd.env("HERALD_STORE_URL", url);
        }
        cmd
    }

    /// Starts `cmd` (from [`Proc::command`]) and waits for its address. With [`LOG_TAG`]
    /// in its environment and stderr piped, its log lines are printed tagged.
    pub fn start(mut cmd: Command) -> Proc {
        // A node whose log a test shows (`common::cluster`) pipes stderr: each line is
        // printed with the node's name in front, so three nodes' logs can be told apart.
        let tag = cmd
            .get_envs()
            .find(|(k, _)| *k == LOG_TAG)
            .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()));
        let mut child = cmd.spawn().expect("spawn herald");
        if let (Some(tag), Some(err)) = (tag, child.stderr.take()) {
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    eprintln!("[{tag}] {line}");
                }
            });
        }
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("herald listening on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(url) => url,
            Err(_) => {
                let status = child.try_wait().ok().flatten();
                panic!("herald did not print its address within 30 s (exit status: {status:?})");
            }
        };
        Proc { child, url }
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to the process.
    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) on our own child's pid; it has not been reaped (we hold the Child).
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// Waits (polling, up to `deadline`) for the process to exit; its exit code, `None` if a
    /// signal ended it. Panics if it is still running at the deadline.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Option<i32> {
        let end = Instant::now() + deadline;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(
                Instant::now() < end,
                "herald still running {deadline:?} after it was told to stop"
            );
            // Async: the test's receiver runs on this runtime and must keep answering.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

/// Unix ms of an RFC 3339 instant, as an integer.
pub fn utc_ms(rfc3339: &str) -> u64 {
    ms_of(rfc3339) as u64
}

/// herald in-process on a manual clock, with a `file` channel named `out` so every delivery
/// is recorded with herald's own (manual) send time. Time only moves when the test says so.
pub struct ManualHerald {
    pub clock: std::sync::Arc<herald::clock::ManualClock>,
    pub server: Option<Server>,
    pub dir: tempfile::TempDir,
    config: String,
    /// Used by every (re)start.
    pub engine_config: herald::engine::EngineConfig,
}

impl ManualHerald {
    pub async fn start(start_ms: u64, extra_config: &str) -> ManualHerald {
        if let Ok(filter) = std::env::var("HERALD_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("out.jsonl");
        let config = format!(
            "[channels.out]\nkind = \"file\"\npath = \"{}\"\n{extra_config}\n",
            out.display()
        );
        let clock = std::sync::Arc::new(herald::clock::ManualClock::new(start_ms));
        let mut h = ManualHerald {
            clock,
            server: None,
            dir,
            config,
            engine_config: herald::engine::EngineConfig::default(),
        };
        h.boot().await;
        h
    }

    async fn boot(&mut self) {
        let cfg = Config::from_toml(
            &self.config,
            Overrides {
                listen: Some("127.0.0.1:0".into()),
                data_dir: Some(self.dir.path().join("data")),
                token: None,
            },
        )
        .expect("test config is valid");
        let cfg = on_test_store(cfg);
        // The last instance's sled may still hold the directory's lock for a moment after it
        // closed (sled's I/O threads let go of its files on their own): try again, with a
        // deadline, on that error only.
        let end = Instant::now() + Duration::from_secs(10);
        let server = loop {
            match herald::server::start_with(
                cfg.clone(),
                self.clock.clone(),
                self.engine_config.clone(),
            )
            .await
            {
                Ok(s) => break s,
                Err(e) if sled_still_locked(&e) && Instant::now() < end => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => panic!("herald starts: {e:?}"),
            }
        };
        self.server = Some(server);
    }

    pub fn server(&self) -> &Server {
        self.server.as_ref().expect("running")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.server().url(), path)
    }

    pub fn now(&self) -> u64 {
        use herald::clock::Clock;
        self.clock.now_ms()
    }

    /// Replays time up to `t_ms`: the clock jumps from one wheel deadline to the next, and
    /// everything due at each instant finishes before time moves on.
    pub async fn run_until(&self, t_ms: u64) {
        let engine = &self.server().engine;
        for _ in 0..1_000_000 {
            match engine.idle().await {
                Some(d) if d <= t_ms => {
                    self.clock.set(d);
                    engine.wake();
                }
                _ => {
                    self.clock.set(t_ms);
                    engine.wake();
                    engine.idle().await;
                    return;
                }
            }
        }
        panic!("run_until({t_ms}) did not converge");
    }

    /// Stops herald (as if the process were down) and starts it again on the same data.
    /// The clock stays where the test puts it in between.
    pub async fn stop(&mut self) {
        let s = self.server.take().expect("running");
        assert!(s.stop(Duration::from_secs(10)).await, "herald stopped");
    }

    pub async fn restart(&mut self) {
        if self.server.is_some() {
            self.stop().await;
        }
        self.boot().await;
    }

    /// Every delivery so far (lines of the `out` file), in order.
    /// A last line without its newline is a write still in progress: left for the next read.
    pub fn sent(&self) -> Vec<Value> {
        match std::fs::read_to_string(self.dir.path().join("out.jsonl")) {
            Ok(text) => {
                let whole = text.rfind('\n').map_or("", |end| &text[..end]);
                whole
                    .lines()
                    .map(|l| serde_json::from_str(l).expect("JSON line"))
                    .collect()
            }
            Err(_) => Vec::new(),
        }
    }

    pub async fn post(&self, body: &Value) -> Value {
        let r = http::post_json(&self.url("/v1/tasks"), body).await;
        assert_eq!(r.status, 201, "{}", r.text());
        r.json()
    }

    pub async fn task(&self, id: &str) -> Value {
        let r = http::get(&self.url(&format!("/v1/tasks/{id}"))).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    pub async fn runs(&self, id: &str) -> Vec<Value> {
        let r = http::get(&self.url(&format!("/v1/tasks/{id}/runs"))).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["runs"].as_array().cloned().unwrap_or_default()
    }

    /// `n` permits of channel `name`'s concurrency, held until dropped: a send (or a chunk)
    /// that needs one meanwhile waits for it, as behind a busy channel.
    pub async fn hold_permits(&self, name: &str, n: u32) -> tokio::sync::OwnedSemaphorePermit {
        let c = self.server().engine.channels().get(name).expect("channel");
        c.concurrency
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("permits")
    }

    pub async fn action(&self, id: &str, action: &str) -> http::Resp {
        http::request(
            "POST",
            &self.url(&format!("/v1/tasks/{id}/{action}")),
            &[],
            None,
        )
        .await
    }
}

/// Whether `e` is sled's "could not acquire lock" on a directory whose last store was just
/// dropped in this process: sled's I/O threads let go of its files on their own, a moment
/// later. Reopening in-process retries on this error only, with a deadline.
pub fn sled_still_locked(e: &dyn std::fmt::Debug) -> bool {
    format!("{e:?}").contains("could not acquire lock")
}

/// `open()` again until it no longer fails with [`sled_still_locked`] (10 s deadline).
pub fn reopen<T, E: std::fmt::Debug>(mut open: impl FnMut() -> Result<T, E>) -> T {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match open() {
            Ok(v) => return v,
            Err(e) if sled_still_locked(&e) && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("reopening the store: {e:?}"),
        }
    }
}

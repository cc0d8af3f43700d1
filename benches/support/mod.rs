//! Shared by the end-to-end benches (`scale.rs`, `load.rs`, `cluster.rs`): the real `herald`
//! binary started on a data dir on disk, a pooled HTTP client, and readings from `/proc`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub type Http = Client<HttpConnector, Full<Bytes>>;

/// An environment variable's number, or `default` when it is unset or not a number.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The wall clock in Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Unix milliseconds as RFC 3339 in UTC, to the millisecond.
pub fn rfc3339(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .expect("instant")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The real binary, killed when dropped.
pub struct Proc {
    pub child: Child,
    pub url: String,
    pub started: Instant,
}

impl Proc {
    /// `herald serve --config <dir>/herald.toml --data <data> --listen 127.0.0.1:0`.
    /// `HERALD_BENCH_BIN` runs another build's binary instead (an A/B against the same bench
    /// and client).
    pub fn spawn(config: &Path, data: &Path) -> Proc {
        let bin = std::env::var("HERALD_BENCH_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_herald").to_string());
        Proc::spawn_bin(&bin, config, data)
    }

    /// [`Proc::spawn`] of the binary at `bin`.
    pub fn spawn_bin(bin: &str, config: &Path, data: &Path) -> Proc {
        Proc::spawn_env(bin, config, data, &[])
    }

    /// [`Proc::spawn_bin`] with `env` added to the child's environment (e.g. each cluster
    /// node's own `HERALD_STORE_URL`).
    pub fn spawn_env(bin: &str, config: &Path, data: &Path, env: &[(&str, &str)]) -> Proc {
        let started = Instant::now();
        let mut child = Command::new(bin)
            .envs(env.iter().copied())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .arg("--data")
            .arg(data)
            // HERALD_BENCH_LOG=debug (say) shows herald's own logs during a bench.
            .env(
                "HERALD_LOG",
                std::env::var("HERALD_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
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
            .recv_timeout(Duration::from_secs(600))
            .expect("herald printed its address");
        Proc {
            child,
            url,
            started,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Resident set size in MiB.
    pub fn rss_mib(&self) -> f64 {
        self.status_mib("VmRSS:")
    }

    /// The most RSS the process has had so far (its peak, `VmHWM`).
    pub fn peak_rss_mib(&self) -> f64 {
        self.status_mib("VmHWM:")
    }

    fn status_mib(&self, field: &str) -> f64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("herald.toml");
    std::fs::write(&p, text).expect("write config");
    p
}

pub fn client() -> Http {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(c)
}

/// POSTs JSON; returns the status and the time it took.
pub async fn post(http: &Http, url: &str, body: Bytes) -> (u16, Duration) {
    let t = Instant::now();
    let req = Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .expect("request");
    match http.request(req).await {
        Ok(r) => {
            let status = r.status().as_u16();
            let _ = r.into_body().collect().await;
            (status, t.elapsed())
        }
        Err(_) => (0, t.elapsed()),
    }
}

pub async fn get(http: &Http, url: &str) -> (u16, Bytes) {
    let req = Request::get(url)
        .body(Full::new(Bytes::new()))
        .expect("request");
    match http.request(req).await {
        Ok(r) => {
            let status = r.status().as_u16();
            let b = r
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            (status, b)
        }
        Err(_) => (0, Bytes::new()),
    }
}

/// Polls `/healthz` until 200; returns when it answered (None after `deadline`).
pub async fn wait_healthy(http: &Http, base: &str, deadline: Duration) -> Option<Instant> {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if get(http, &format!("{base}/healthz")).await.0 == 200 {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Polls `check` every 20 ms until it holds; the instant it first held.
pub async fn poll_until<F, Fut>(deadline: Duration, mut check: F) -> Option<Instant>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if check().await {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Bytes under `dir`.
pub fn du(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += du(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// Sends `n` creates from `conns` concurrent connections; `body(i)` makes the i-th. Returns
/// per-request latencies (sorted) and the wall time. Non-201 answers are counted in `failed`.
pub async fn create_many(
    http: &Http,
    base: &str,
    n: u64,
    conns: usize,
    body: Arc<dyn Fn(u64) -> Bytes + Send + Sync>,
    failed: Arc<AtomicU64>,
) -> (Vec<Duration>, Duration) {
    let next = Arc::new(AtomicU64::new(0));
    let url = format!("{base}/v1/tasks");
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..conns {
        let (http, url, next, body, failed) = (
            http.clone(),
            url.clone(),
            next.clone(),
            body.clone(),
            failed.clone(),
        );
        set.spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return lat;
                }
                let (status, d) = post(&http, &url, body(i)).await;
                if status != 201 {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                lat.push(d);
            }
        });
    }
    latencies(set, n, t).await
}

/// Every client's latencies, sorted, and the wall time since `t`.
async fn latencies(
    mut set: tokio::task::JoinSet<Vec<Duration>>,
    n: u64,
    t: Instant,
) -> (Vec<Duration>, Duration) {
    // `n` is a cap (a round bounded by time passes a large one), not a count to reserve.
    let mut all = Vec::with_capacity(n.min(1 << 20) as usize);
    while let Some(r) = set.join_next().await {
        all.extend(r.expect("client task"));
    }
    let wall = t.elapsed();
    all.sort();
    (all, wall)
}

pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The disk's raw `fdatasync` rate (small appends), in the directory the bench uses.
pub fn fdatasync_rate(dir: &Path) -> f64 {
    use std::io::Write;
    let p = dir.join("fdatasync-probe");
    let mut f = std::fs::File::create(&p).expect("probe file");
    let n = 300;
    let t = Instant::now();
    for _ in 0..n {
        f.write_all(&[7u8; 256]).expect("write");
        f.sync_data().expect("fdatasync");
    }
    let r = n as f64 / t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(p);
    r
}

/// A competing writer on the same disk (`HERALD_LOAD_COMPETE`), so that any hour can be a slow
/// one. Bounded: it stops when dropped, and by itself after [`Competitor::MAX`] or
/// [`Competitor::SYNCS_MAX`] syncs. It overwrites a ring of [`Competitor::RING`] made once per
/// directory, before its first timed sync, so every sync costs the disk the same (a ring begun
/// afresh each round, as before 2026-12-06, evening, appended for its first syncs, and an
/// append's `fdatasync` also commits ext4's journal).
///
/// Two kinds ([`CompeteKind`]):
/// - `HERALD_LOAD_COMPETE=1` (or `direct`): 1 MiB written with `O_DIRECT` and `fdatasync`ed, in
///   a loop. It loads the disk, not the cores: on this VM it took a small-append `fdatasync`
///   from ~5 800/s to ~2 900/s (the issue's slow hour read 3 061/s) for ~18 % of one core,
///   the data going by DMA with no page-cache copy. Falls back to buffered writes where
///   `O_DIRECT` is refused (tmpfs).
/// - `HERALD_LOAD_COMPETE=4k`: the writer of 2026-12-06 to 12-07 (stop 59), 4 KiB and an
///   `fdatasync` in a loop, kept to compare with the figures taken with it. It hardly slows
///   this disk (small appends 5 500–6 400/s under it) but takes 33–44 % of a core (10 800–12 900
///   syncs/s at 31–34 µs of CPU each): an hour slow in CPU, not in disk, which weighs on
///   whichever contender is bound by CPU.
///
/// Its CPU per second through a round is [`Competitor::cpu_share`], printed beside each figure.
pub struct Competitor {
    stop: Arc<std::sync::atomic::AtomicBool>,
    syncs: Arc<std::sync::atomic::AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
    started: Instant,
    cpu0: u64,
    kind: CompeteKind,
}

/// Which competing writer ([`Competitor`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompeteKind {
    /// 1 MiB `O_DIRECT` writes, each `fdatasync`ed.
    Direct,
    /// 4 KiB buffered writes, each `fdatasync`ed.
    Small,
}

impl CompeteKind {
    /// From `HERALD_LOAD_COMPETE`: unset, empty or `0` is none; `4k` the small writer; anything
    /// else the direct one.
    pub fn from_env() -> Option<CompeteKind> {
        let v = std::env::var("HERALD_LOAD_COMPETE").unwrap_or_default();
        match v.as_str() {
            "" | "0" => None,
            "4k" => Some(CompeteKind::Small),
            _ => Some(CompeteKind::Direct),
        }
    }

    fn block(self) -> usize {
        match self {
            CompeteKind::Direct => 1 << 20,
            CompeteKind::Small => 4096,
        }
    }
}

impl std::fmt::Display for CompeteKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompeteKind::Direct => f.write_str("1 MiB O_DIRECT writes, each fdatasync'ed"),
            CompeteKind::Small => f.write_str("4 KiB writes, each fdatasync'ed"),
        }
    }
}

/// A page-aligned buffer (what `O_DIRECT` asks of the memory it reads from).
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null(), "competitor buffer");
        // SAFETY: `ptr` is valid for `len` bytes, just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0x5a, len) };
        Aligned { ptr, layout }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: allocated and initialized for `layout.size()` bytes, freed only on drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

// SAFETY: the buffer is owned and only read after it is made.
unsafe impl Send for Aligned {}

impl Competitor {
    pub const MAX: Duration = Duration::from_secs(1_800);
    /// The ring it overwrites: 64 MiB.
    pub const RING: u64 = 64 << 20;
    pub const SYNCS_MAX: u64 = 50_000_000;
    /// The name of its thread.
    pub const THREAD: &'static str = "competitor";

    /// Starts one when `HERALD_LOAD_COMPETE` asks for one ([`CompeteKind::from_env`]).
    pub fn from_env(dir: &Path) -> Option<Competitor> {
        CompeteKind::from_env().map(|k| Competitor::start(dir, k))
    }

    pub fn start(dir: &Path, kind: CompeteKind) -> Competitor {
        use std::os::unix::fs::FileExt;
        use std::sync::atomic::Ordering;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let syncs = Arc::new(std::sync::atomic::AtomicU64::new(0));
        // Kept for the directory's life (the bench's temp dir removes it): made whole once.
        let path = dir.join("competing-fdatasync");
        let ring = Competitor::ring(&path, kind).expect("the competing writer's ring");
        let (st, sy) = (stop.clone(), syncs.clone());
        let cpu0 = Competitor::thread_cpu();
        // Named, so that the load generator's CPU can leave it out (`generator_cpu_ns`).
        let thread = std::thread::Builder::new()
            .name(Competitor::THREAD.into())
            .spawn(move || {
                let f = ring;
                let started = Instant::now();
                let block = Aligned::new(kind.block());
                let blocks = Competitor::RING / kind.block() as u64;
                let mut n = 0u64;
                while !st.load(Ordering::Relaxed)
                    && started.elapsed() < Competitor::MAX
                    && n < Competitor::SYNCS_MAX
                {
                    let at = (n % blocks) * kind.block() as u64;
                    if f.write_all_at(block.bytes(), at).is_err() || f.sync_data().is_err() {
                        break;
                    }
                    n += 1;
                    sy.store(n, Ordering::Relaxed);
                }
            })
            .expect("competitor thread");
        Competitor {
            stop,
            syncs,
            thread: Some(thread),
            started: Instant::now(),
            cpu0,
            kind,
        }
    }

    /// The ring at `path`, written whole and made durable if it is not yet [`Competitor::RING`]
    /// long (before the timed loop: its syncs are all overwrites); opened with `O_DIRECT` for
    /// the direct kind where the file system takes it.
    fn ring(path: &Path, kind: CompeteKind) -> std::io::Result<std::fs::File> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if f.metadata()?.len() < Competitor::RING {
            let chunk = vec![0x5au8; 1 << 20];
            for _ in 0..Competitor::RING / chunk.len() as u64 {
                f.write_all(&chunk)?;
            }
            f.sync_all()?;
        }
        if kind == CompeteKind::Direct {
            let direct = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path);
            if let Ok(d) = direct {
                return Ok(d);
            }
        }
        Ok(f)
    }

    /// The competitor thread's CPU so far (ns), 0 if it cannot be read.
    fn thread_cpu() -> u64 {
        thread_cpu_ns(std::process::id())
            .get(Competitor::THREAD)
            .copied()
            .unwrap_or(0)
    }

    /// Its CPU since it started, as a share of one core.
    pub fn cpu_share(&self) -> f64 {
        Competitor::thread_cpu().saturating_sub(self.cpu0) as f64
            / self.started.elapsed().as_nanos().max(1) as f64
    }

    /// Which writer it is.
    pub fn kind(&self) -> CompeteKind {
        self.kind
    }

    /// Its `fdatasync`s per second so far.
    pub fn rate(&self) -> f64 {
        self.syncs.load(std::sync::atomic::Ordering::Relaxed) as f64
            / self.started.elapsed().as_secs_f64().max(1e-9)
    }
}

impl Drop for Competitor {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A temp dir on the real disk (under the target dir), not tmpfs.
pub fn disk_dir(tag: &str) -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-data");
    std::fs::create_dir_all(&base).expect("bench data dir");
    tempfile::Builder::new()
        .prefix(tag)
        .tempdir_in(base)
        .expect("temp dir")
}

/// CPU time (ns) each thread name of process `pid` has used so far, from
/// `/proc/<pid>/task/*/schedstat` (ns, not the 10 ms ticks of `stat`). Threads that share a
/// name (tokio's workers) are summed.
pub fn thread_cpu_ns(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in dir.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        *out.entry(comm.trim().to_string()).or_insert(0) += ns;
    }
    out
}

/// CPU time (user + system, ns) of this process with its ended threads (`RUSAGE_SELF`: the
/// lean client's thread ends before the reading after its round), or of its children that
/// were waited for (`RUSAGE_CHILDREN`: redis-benchmark after its run).
pub fn rusage_cpu_ns(who: libc::c_int) -> u64 {
    // SAFETY: getrusage writes one `rusage` into the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    ns(ru.ru_utime) + ns(ru.ru_stime)
}

/// CPU time (ns) of this process as the load generator: every thread, the ended ones too (the
/// lean client's thread ends before the reading after its round), but the competing writer's.
pub fn generator_cpu_ns() -> u64 {
    rusage_cpu_ns(libc::RUSAGE_SELF).saturating_sub(Competitor::thread_cpu())
}

/// The machine's CPU time by kind since boot (`/proc/stat`'s first line, in clock ticks):
/// user, nice, system, idle, iowait, irq, softirq; then the context switches (`ctxt`). Two
/// readings bracket a round.
pub fn machine_cpu() -> [u64; 8] {
    let mut out = [0u64; 8];
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    if let Some(line) = stat.lines().next() {
        for (o, v) in out.iter_mut().zip(line.split_whitespace().skip(1)) {
            *o = v.parse().unwrap_or(0);
        }
    }
    // The machine's context switches so far (a wake-up of a thread on the other core costs
    // an interrupt between cores, a VM exit on this machine).
    out[7] = stat
        .lines()
        .find_map(|l| l.strip_prefix("ctxt "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    out
}

/// How the machine's cores were used between two [`machine_cpu`] readings, in percent of
/// all of them: the idle share says whether a round was bound by CPU or by waiting.
pub fn machine_split(before: &[u64; 8], after: &[u64; 8]) -> String {
    let d: Vec<f64> = after[..7]
        .iter()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(*b) as f64)
        .collect();
    let total: f64 = d.iter().sum::<f64>().max(1.0);
    let pct = |v: f64| 100.0 * v / total;
    format!(
        "user {:.0}%, system {:.0}%, softirq {:.0}%, iowait {:.0}%, idle {:.0}%",
        pct(d[0] + d[1]),
        pct(d[2] + d[5]),
        pct(d[6]),
        pct(d[4]),
        pct(d[3])
    )
}

/// The machine's busy time per item between two [`machine_cpu`] readings, every process
/// included (server, load generator, competing writer), in µs: `user a, system b, softirq c`,
/// and the machine's context switches per item.
/// Loopback traffic is processed in softirq, which no thread's own CPU time counts.
pub fn machine_per_item(before: &[u64; 8], after: &[u64; 8], n: u64) -> String {
    // `/proc/stat` counts in USER_HZ ticks, 100 per second on Linux.
    let us = |i: &[usize]| -> f64 {
        i.iter()
            .map(|&k| after[k].saturating_sub(before[k]) as f64)
            .sum::<f64>()
            * 10_000.0
            / n.max(1) as f64
    };
    format!(
        "user {:.1}, system {:.1}, softirq {:.1} µs; {:.2} context switches",
        us(&[0, 1]),
        us(&[2, 5]),
        us(&[6]),
        after[7].saturating_sub(before[7]) as f64 / n.max(1) as f64
    )
}

/// CPU per item between two `thread_cpu_ns` readings, by thread name: `name µs, …`, busiest
/// first, with the total.
pub fn cpu_per_item(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
    items: u64,
) -> String {
    let mut rows: Vec<(String, f64)> = after
        .iter()
        .map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (k.clone(), d as f64 / 1e3 / items.max(1) as f64)
        })
        .filter(|(_, us)| *us >= 0.05)
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = rows.iter().map(|r| r.1).sum();
    let parts: Vec<String> = rows.iter().map(|(k, us)| format!("{k} {us:.1}")).collect();
    format!("{total:.1} µs ({})", parts.join(", "))
}

/// Like [`create_many`], through a lean HTTP/1.1 client: one keep-alive connection per
/// concurrent client, each request written whole in one `write`, each response read by its
/// `Content-Length`. The hyper client above spends ~15–19 µs of CPU per request on these same
/// 2 cores (pool checkout, header map, body channel), a quarter of what a create costs
/// herald; this one spends about half that, so the create bench measures herald more than
/// its load generator (the way wrk or redis-benchmark would). A connection that fails counts
/// its request as failed and reconnects.
pub async fn create_many_lean(
    base: &str,
    n: u64,
    conns: usize,
    body: Arc<dyn Fn(u64) -> Bytes + Send + Sync>,
    failed: Arc<AtomicU64>,
) -> (Vec<Duration>, Duration) {
    create_many_lean_spread(&[base.to_string()], n, conns, body, failed).await
}

/// [`create_many_lean`] with the connections spread evenly over `bases` (connection `c` to
/// `bases[c % len]`: several nodes of a cluster). The creates are still drawn from one
/// counter, so a faster node answers more of them, as behind a round-robin balancer.
pub async fn create_many_lean_spread(
    bases: &[String],
    n: u64,
    conns: usize,
    body: Arc<dyn Fn(u64) -> Bytes + Send + Sync>,
    failed: Arc<AtomicU64>,
) -> (Vec<Duration>, Duration) {
    create_many_lean_prefer(bases, n, conns, body, failed, prefer_header()).await
}

/// [`create_many_lean_spread`] with `prefer` (a whole header line, or empty) on every request.
pub async fn create_many_lean_prefer(
    bases: &[String],
    n: u64,
    conns: usize,
    body: Arc<dyn Fn(u64) -> Bytes + Send + Sync>,
    failed: Arc<AtomicU64>,
    prefer: String,
) -> (Vec<Duration>, Duration) {
    let limit = LeanLimit { n, for_: None };
    create_many_lean_limited(bases, limit, conns, body, failed, prefer).await
}

/// When a lean round ends: after `n` creates, or (if `for_` is set) once that long has passed
/// since its start, whichever comes first. A request begun before the end is answered.
#[derive(Clone, Copy)]
pub struct LeanLimit {
    pub n: u64,
    pub for_: Option<Duration>,
}

/// [`create_many_lean_prefer`] ending at `limit`; the latencies' count is the creates made.
pub async fn create_many_lean_limited(
    bases: &[String],
    limit: LeanLimit,
    conns: usize,
    body: Arc<dyn Fn(u64) -> Bytes + Send + Sync>,
    failed: Arc<AtomicU64>,
    prefer: String,
) -> (Vec<Duration>, Duration) {
    let addrs: Vec<String> = bases
        .iter()
        .map(|b| b.trim_start_matches("http://").to_string())
        .collect();
    // The connections run on a thread of their own with a single-threaded runtime, as
    // redis-benchmark (the peer's generator) runs on one: no work stealing and no wake of the
    // other worker per response, so the generator takes less of the 2 cores the server needs.
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("lean-client".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("client runtime");
            let out = rt.block_on(lean_clients(addrs, limit, conns, body, failed, prefer));
            let _ = tx.send(out);
        })
        .expect("client thread");
    rx.await
        .expect("the lean client thread ended without a result")
}

/// The connections of [`create_many_lean_prefer`], on the runtime it runs them on.
async fn lean_clients(
    addrs: Vec<String>,
    limit: LeanLimit,
    conns: usize,
    body: Arc<dyn Fn(u64) -> Bytes + Send + Sync>,
    failed: Arc<AtomicU64>,
    prefer: String,
) -> (Vec<Duration>, Duration) {
    let next = Arc::new(AtomicU64::new(0));
    let prefer = Arc::new(prefer);
    let t = Instant::now();
    let timeline = Timeline::from_env();
    let mut set = tokio::task::JoinSet::new();
    for c in 0..conns {
        let addr = addrs[c % addrs.len()].clone();
        let prefer = prefer.clone();
        let (next, body, failed) = (next.clone(), body.clone(), failed.clone());
        let timeline = timeline.clone();
        set.spawn(async move {
            let mut lat = Vec::new();
            let mut conn: Option<tokio::net::TcpStream> = None;
            let mut req = Vec::with_capacity(512);
            let mut buf = Vec::with_capacity(4096);
            loop {
                if limit.for_.is_some_and(|d| t.elapsed() >= d) {
                    return lat;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= limit.n {
                    return lat;
                }
                let b = body(i);
                req.clear();
                req.extend_from_slice(
                    format!(
                        "POST /v1/tasks HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n{prefer}content-length: {}\r\n\r\n",
                        b.len()
                    )
                    .as_bytes(),
                );
                req.extend_from_slice(&b);
                let started = Instant::now();
                let status = lean_round_trip(&addr, &mut conn, &req, &mut buf).await;
                if status != Some(201) {
                    failed.fetch_add(1, Ordering::Relaxed);
                    conn = None;
                }
                lat.push(started.elapsed());
                if let Some(tl) = &timeline {
                    tl.count(t.elapsed());
                }
            }
        });
    }
    let out = latencies(set, limit.n, t).await;
    if let Some(tl) = timeline {
        println!("       creates/s per 100 ms: {}", tl.rates());
    }
    out
}

/// `HERALD_LOAD_TIMELINE=1`: the lean round's answers counted per 100 ms, printed as rates
/// after it, to tell a round's steady rate from its dips (the first 60 s of a round).
#[derive(Clone)]
struct Timeline(Arc<Vec<AtomicU64>>);

impl Timeline {
    const BINS: usize = 600;

    fn from_env() -> Option<Timeline> {
        std::env::var_os("HERALD_LOAD_TIMELINE").map(|_| {
            Timeline(Arc::new(
                (0..Self::BINS).map(|_| AtomicU64::new(0)).collect(),
            ))
        })
    }

    fn count(&self, at: Duration) {
        let bin = ((at.as_millis() / 100) as usize).min(Self::BINS - 1);
        self.0[bin].fetch_add(1, Ordering::Relaxed);
    }

    fn rates(&self) -> String {
        let counts: Vec<u64> = self.0.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let used = counts.iter().rposition(|&c| c > 0).map_or(0, |i| i + 1);
        counts[..used]
            .iter()
            .map(|c| (c * 10).to_string())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `HERALD_LOAD_PREFER` (e.g. `return=minimal`, RFC 7240): a `Prefer` header line on every
/// lean create, so a run can measure the short answer; empty when unset.
pub fn prefer_header() -> String {
    match std::env::var("HERALD_LOAD_PREFER") {
        Ok(v) if !v.is_empty() => format!("prefer: {v}\r\n"),
        _ => String::new(),
    }
}

/// One request on `conn` (connected first if there is none); the response's status, or
/// `None` if the connection failed or the response could not be read.
async fn lean_round_trip(
    addr: &str,
    conn: &mut Option<tokio::net::TcpStream>,
    req: &[u8],
    buf: &mut Vec<u8>,
) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if conn.is_none() {
        let s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.set_nodelay(true).ok()?;
        *conn = Some(s);
    }
    let s = conn.as_mut()?;
    s.write_all(req).await.ok()?;
    buf.clear();
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).ok()?;
            let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return Some(status);
            }
        }
        if s.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

/// The issue's same-run peer for durable creates: Redis with `appendfsync always` (every write
/// on disk before its reply, as herald's 201), one `EVAL` per create doing a `ZADD` into a due
/// set and an `HSET` of the task, driven by `redis-benchmark`. `None` (and a line saying so)
/// when `redis-server` or `redis-benchmark` is not on this machine (`apt-get install
/// redis-server redis-tools`).
pub struct RedisPeer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl RedisPeer {
    pub fn start() -> Option<RedisPeer> {
        let found = |c: &str| {
            Command::new(c)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !found("redis-server") || !found("redis-benchmark") {
            println!("   (Redis peer skipped: redis-server or redis-benchmark not found)");
            return None;
        }
        let dir = disk_dir("load-redis");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .ok()?
            .port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let peer = RedisPeer {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                println!("   (Redis peer skipped: redis-server did not listen within 10 s)");
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(peer)
    }

    /// `n` creates over `conns` connections: the rate, p50 and p99 (ms) as `redis-benchmark`
    /// reads them, and the CPU per create (µs) of redis-server and of redis-benchmark.
    pub fn creates(&self, n: u64, conns: usize) -> Option<RedisRound> {
        let server0 = thread_cpu_ns(self.child.id()).values().sum::<u64>();
        let client0 = rusage_cpu_ns(libc::RUSAGE_CHILDREN);
        let out = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-n", &n.to_string(), "-c", &conns.to_string()])
            .args(["-r", "100000000", "--csv", "EVAL"])
            .arg("redis.call('ZADD','due',ARGV[1],ARGV[2]); redis.call('HSET','t:'..ARGV[2],'body',ARGV[3]); return 1")
            .args(["0", "__rand_int__", "__rand_int__", "Good morning"])
            .output()
            .ok()?;
        // CSV: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95…","p99…","max…"
        let text = String::from_utf8_lossy(&out.stdout);
        let row = text.lines().last()?;
        let cols: Vec<f64> = row
            .rsplit("\",\"")
            .take(7)
            .map(|c| c.trim_matches('"').parse().unwrap_or(f64::NAN))
            .collect();
        // Reversed: max, p99, p95, p50, min, avg, rps.
        let per = |ns: u64| ns as f64 / 1e3 / n.max(1) as f64;
        let server = per(thread_cpu_ns(self.child.id()).values().sum::<u64>() - server0);
        let client = per(rusage_cpu_ns(libc::RUSAGE_CHILDREN).saturating_sub(client0));
        (cols.len() == 7).then(|| RedisRound {
            rate: cols[6],
            p50: cols[3],
            p99: cols[1],
            server_us: server,
            client_us: client,
        })
    }
}

/// One [`RedisPeer::creates`] round.
pub struct RedisRound {
    pub rate: f64,
    pub p50: f64,
    pub p99: f64,
    /// redis-server's CPU per create, µs.
    pub server_us: f64,
    /// redis-benchmark's CPU per create, µs (the peer's load generator).
    pub client_us: f64,
}

impl Drop for RedisPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! Webhook delivery throughput: herald vs the raw hyper client, in the same run.
//!
//! One receiver for every contender: a hyper 1 HTTP/1.1 server on 127.0.0.1:0 that reads the
//! request body and answers 200 with an empty body. It counts requests in an `AtomicU64` and
//! stamps the arrival of the latest one in another (no recording, no locks). It runs on its own
//! tokio runtime (1 worker thread); herald, the baseline client and the driver share a second
//! runtime (2 worker threads, one per core).
//!
//! One iteration delivers N = 2000 messages, 20 sequences of 100 (`HERALD_DELIVERY_RUNS=k`:
//! k sequences of 100, and k workers for the raw client), and is timed from just
//! before the first create (or the first POST for the baseline) to the arrival of the N-th
//! request at the receiver. The driver polls the counter every 1 ms (with a deadline); the end
//! instant is the receiver's arrival stamp of the N-th request, so the 1 ms poll granularity is
//! not in the figure. Between iterations (untimed) herald is left to go idle, so the last
//! settles of one iteration do not overlap the next one.
//!
//! Each criterion sample (one `iter_custom` call) gets, untimed, a fresh contender (a new
//! herald on a new data dir, or a new client) and one warm-up round that opens its
//! connections. herald's throughput varied by up to ~30 % from one instance to the next when
//! one instance served a whole contender; with an instance per sample that variation is
//! averaged over the samples instead of biasing one contender against another.
//!
//! Run: `cargo bench --bench delivery` (about 1.5 minutes on 2 cores).
//!
//! * `baseline_hyper`: `hyper_util::client::legacy::Client` built like herald's webhook sink
//!   (pooled, `TCP_NODELAY`, same idle timeout), 20 concurrent workers each POSTing its 100
//!   messages one after the other: the same parallelism herald has with 20 runs. Same headers
//!   and same JSON bodies (herald's `Delivery`, serialized once at set-up).
//! * `herald_unsigned` / `herald_signed`: herald in-process (`server::start_with`), data dir on
//!   tmpfs (`/dev/shm`, else the normal temp dir: on this VM one disk fsync costs
//!   milliseconds and would dominate), channel `hook` (webhook, concurrency 64 or one per sequence;
//!   `signed` adds a Standard Webhooks secret). Each iteration creates 20 tasks of 100 messages
//!   (`schedule.after = "0s"`, no pacing) concurrently through `Engine::create` (what the HTTP
//!   API calls, minus HTTP parsing). A run is a sequence: each message's outcome is made
//!   durable with the next message's in-flight mark (one write) before the next one is sent,
//!   so throughput comes from the 20 runs going in parallel and sharing group-committed
//!   flushes.
//! * `herald_templated`: as `herald_unsigned`, the channel a platform channel: a body template
//!   (minijinja, `tojson` on the recipient, body and key) and a JSON success rule
//!   (`/errcode == 0`), so each answer body is read and parsed. The receiver answers every
//!   contender `{"errcode":0,"errmsg":"ok"}`. The ratio to `herald_unsigned` (throughput over
//!   all timed iterations of both) is printed at the end: the template engine's cost.
//! * `herald_unsigned_disk`: as `herald_unsigned` with the data dir on the real disk (under
//!   the target dir), where each group flush is an fsync.
//! * `herald_no_timeline`: as `herald_unsigned` with `[store] timeline_max = 0` (no timeline
//!   events written; issue 25). The ratio to `herald_unsigned` is printed at the end: what
//!   the timeline costs; and after `herald_unsigned`, the timeline's records and bytes (keys
//!   and values, before sled's own overhead) per delivered message.
//! * `herald_no_timeline_disk`: as `herald_unsigned_disk` without the timeline.
//! * `paired_raw_tmpfs` / `paired_raw_disk` (after the criterion contenders): herald against
//!   the raw client in pairs, round for round alternately ([`paired_with_raw`]): the ratio the
//!   criterion contenders give, without the drift of the minutes between them.
//!
//! After every contender, the process's CPU time per message over its timed rounds (user +
//! sys, every thread: the receiver's, herald's commit and apply threads), and each herald
//! contender's as a multiple of the raw client's: with both cores busy, throughput is at most
//! 2 s over that figure, so it says how far CPU alone lets herald come to the raw client.
//! `HERALD_DELIVERY_SAMPLES=1` prints it for each sample (each a fresh herald), by thread
//! name too, with its rate and the connections the receiver has accepted so far. On a quiet
//! machine the samples agree within ~10 %; anything else running (even a shell loop polling
//! `/proc` twice a second) spreads them by 50 % and more, and throughput follows.
//!
//! After each herald contender the number of durable flushes per message is printed, with the
//! share of the timed time the commit thread spent applying and syncing groups. At the end,
//! `herald_unsigned` and `herald_unsigned_disk` as shares of the raw hyper client, and what
//! the disk adds to each message of a sequence, counted in raw `fdatasync`s of the same disk
//! read right after (each message of a sequence waits for one sync: its outcome with the next
//! message's mark).
//!
//! The whole bench runs on mimalloc, the allocator the `herald` binary ships with (and so
//! does the baseline client). On the system allocator glibc's malloc and free were ~10 % of a
//! profile of the templated contender; with mimalloc the template's paired cost read 16.4 %
//! against 17.8 % the run before, so the allocator is not what the template costs.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

use herald::config::{Config, Overrides};
use herald::deliver::Delivery;
use herald::engine::Engine;
use herald::request::TaskRequest;
use herald::server::Server;

/// As in `src/main.rs`: measure herald with the allocator it ships with.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sequences (runs) per round, and the raw client's workers: 20, or `HERALD_DELIVERY_RUNS`.
/// With more of them each sequence's durable write per message is hidden behind the others'
/// sends, and the round shows what the machine can carry rather than one sequence's latency.
fn tasks() -> usize {
    static RUNS: OnceLock<usize> = OnceLock::new();
    *RUNS.get_or_init(|| {
        std::env::var("HERALD_DELIVERY_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &usize| (1..=1000).contains(&n))
            .unwrap_or(20)
    })
}
const PER_TASK: usize = 100;
/// Messages per round.
fn per_round() -> u64 {
    (tasks() * PER_TASK) as u64
}
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// Longest one iteration may take before the bench gives up.
const ROUND_DEADLINE: Duration = Duration::from_secs(120);
const MESSAGE_BODY: &str = "Class starts soon";
/// What the receiver answers (with 200).
const ANSWER: &[u8] = br#"{"errcode":0,"errmsg":"ok"}"#;
/// The templated contender: a WeCom-style body template and a JSON success rule.
const TEMPLATED: &str = r#"
body = '{"msgtype":"text","touser":{{ to | tojson }},"text":{"content":{{ body | tojson }}},"key":{{ idempotency_key | tojson }}}'
success = { status = "2xx", json = "/errcode", equals = 0, message = "/errmsg" }
retry_codes = [-1, 45009]
"#;

// ---------------------------------------------------------------------------------------------
// Receiver

/// The instant arrival stamps count from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

#[derive(Default)]
struct Counter {
    requests: AtomicU64,
    /// Arrival of the latest request, ns since `epoch()`.
    last_ns: AtomicU64,
    /// Connections accepted.
    conns: AtomicU64,
}

struct Receiver {
    addr: SocketAddr,
    counter: Arc<Counter>,
    /// Its own runtime; dropping it stops the server.
    _rt: Runtime,
}

impl Receiver {
    fn start() -> Receiver {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-receiver")
            .enable_all()
            .build()
            .expect("receiver runtime");
        let counter = Arc::new(Counter::default());
        let listener = rt
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("receiver: bind");
        let addr = listener.local_addr().expect("receiver: local_addr");
        let c = counter.clone();
        rt.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                c.conns.fetch_add(1, Ordering::Relaxed);
                let c = c.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let c = c.clone();
                        async move {
                            // Read the body so the connection is reusable.
                            let _ = req.into_body().collect().await;
                            let ns = epoch().elapsed().as_nanos() as u64;
                            // Stamp before counting: whoever sees the count sees the stamp.
                            c.last_ns.store(ns, Ordering::Relaxed);
                            c.requests.fetch_add(1, Ordering::Release);
                            // A platform's answer (WeCom's shape), the same for every
                            // contender: the templated channel's success rule reads it.
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                                ANSWER,
                            ))))
                        }
                    });
                    let _ = http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Receiver {
            addr,
            counter,
            _rt: rt,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }
}

/// Waits (polling every 1 ms, with a deadline) until the receiver counted `target` requests;
/// returns the arrival instant of the latest one.
async fn arrival_of(counter: &Counter, target: u64) -> Instant {
    let end = Instant::now() + ROUND_DEADLINE;
    loop {
        let n = counter.requests.load(Ordering::Acquire);
        if n >= target {
            assert_eq!(n, target, "more requests than messages (retries?)");
            return epoch() + Duration::from_nanos(counter.last_ns.load(Ordering::Relaxed));
        }
        assert!(
            Instant::now() < end,
            "receiver counted {n} of {target} requests within {ROUND_DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Baseline: the raw hyper client

struct Baseline {
    client: Client<HttpConnector, Full<Bytes>>,
    uri: Uri,
    /// Per worker, its messages: (idempotency key, JSON body).
    messages: Arc<Vec<Vec<(String, Bytes)>>>,
}

impl Baseline {
    fn new(url: &str) -> Baseline {
        // As `WebhookSink::new` builds it, minus the https wrapper (the bench is plain http).
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let messages = (0..tasks())
            .map(|t| {
                let task_id = format!("bench-baseline-{t:02}");
                (0..PER_TASK)
                    .map(|i| {
                        let key = herald::model::delivery_key(&task_id, 1, i as u32);
                        let d = Delivery {
                            task_id: task_id.clone(),
                            run: 1,
                            seq: i as u32,
                            to: recipient(t, i),
                            body: MESSAGE_BODY.into(),
                            scheduled_at: now.clone(),
                            attempt: 1,
                            idempotency_key: key.clone(),
                            sent_at: now.clone(),
                            data: None,
                            scheduled_at_ms: 0,
                            minutes_left: None,
                            metadata: Default::default(),
                            kind: None,
                            about: None,
                            trace_id: [0; 16],
                            epoch: None,
                        };
                        (key, Bytes::from(serde_json::to_vec(&d).expect("json")))
                    })
                    .collect()
            })
            .collect();
        Baseline {
            client,
            uri: url.parse().expect("uri"),
            messages: Arc::new(messages),
        }
    }

    async fn round(&self, counter: &Counter) -> Duration {
        let target = counter.requests.load(Ordering::Acquire) + per_round();
        let start = Instant::now();
        let mut workers = JoinSet::new();
        for w in 0..tasks() {
            let client = self.client.clone();
            let uri = self.uri.clone();
            let messages = self.messages.clone();
            workers.spawn(async move {
                for (key, body) in &messages[w] {
                    let req = Request::post(uri.clone())
                        .header("content-type", "application/json")
                        .header("user-agent", "herald/0.1.0")
                        .header("idempotency-key", key.as_str())
                        .body(Full::new(body.clone()))
                        .expect("request");
                    let resp = client.request(req).await.expect("baseline POST");
                    assert!(resp.status().is_success());
                    resp.into_body().collect().await.expect("response body");
                }
            });
        }
        while let Some(r) = workers.join_next().await {
            r.expect("baseline worker");
        }
        arrival_of(counter, target).await - start
    }
}

fn recipient(task: usize, i: usize) -> String {
    format!("user-{task:02}-{i:03}@example.com")
}

// ---------------------------------------------------------------------------------------------
// herald

struct Herald {
    server: Server,
    _dir: tempfile::TempDir,
}

impl Herald {
    async fn start(
        receiver_url: &str,
        signed: bool,
        templated: bool,
        timeline: bool,
        dir: tempfile::TempDir,
    ) -> Herald {
        let mut toml = String::new();
        if !timeline {
            toml.push_str("[store]\ntimeline_max = 0\n");
        }
        toml.push_str(&format!(
            "[channels.hook]\nkind = \"webhook\"\nurl = \"{receiver_url}\"\nconcurrency = {}\n",
            tasks().max(64)
        ));
        if signed {
            toml.push_str(&format!("secret = \"{SECRET}\"\n"));
        }
        if templated {
            toml.push_str(TEMPLATED);
        }
        let config = Config::from_toml(
            &toml,
            Overrides {
                listen: Some("127.0.0.1:0".into()),
                data_dir: Some(dir.path().to_path_buf()),
                token: None,
            },
        )
        .expect("bench config is valid");
        let server = herald::server::start_with(
            config,
            Arc::new(herald::clock::SystemClock::new()),
            herald::engine::EngineConfig::default(),
        )
        .await
        .expect("herald starts");
        Herald { server, _dir: dir }
    }

    fn engine(&self) -> &Engine {
        &self.server.engine
    }

    fn flushes(&self) -> u64 {
        self.engine()
            .store()
            .commit_stats()
            .flushes
            .load(Ordering::Relaxed)
    }

    /// Time the commit thread spent applying and syncing groups, µs.
    fn commit_busy_us(&self) -> u64 {
        self.engine()
            .store()
            .commit_stats()
            .busy_us
            .load(Ordering::Relaxed)
    }

    async fn round(&self, counter: &Counter, requests: &[TaskRequest]) -> Duration {
        let batch: Vec<TaskRequest> = requests.to_vec();
        let target = counter.requests.load(Ordering::Acquire) + per_round();
        let start = Instant::now();
        let mut creates = JoinSet::new();
        for req in batch {
            let engine = self.engine().clone();
            creates.spawn(async move { engine.create(req, None).await.map(|_| ()) });
        }
        while let Some(r) = creates.join_next().await {
            r.expect("create task").expect("create");
        }
        let elapsed = arrival_of(counter, target).await - start;
        // Untimed: let the last settles finish before the next iteration.
        self.engine().idle().await;
        elapsed
    }
}

/// 20 tasks of 100 messages each, due at once, no pacing, on channel `hook`.
fn task_requests() -> Vec<TaskRequest> {
    (0..tasks())
        .map(|t| {
            let to: Vec<String> = (0..PER_TASK).map(|i| recipient(t, i)).collect();
            let mut r: TaskRequest = serde_json::from_value(serde_json::json!({
                "channel": "hook",
                "schedule": {"after": "0s"},
                "to": to,
                "body": MESSAGE_BODY,
            }))
            .expect("task request");
            // As the API gives every create (`api/mod.rs`): without one, each message would
            // derive its task's trace id (a SHA-256), as only tasks made before traces do.
            r.trace_id = Some(herald::trace::new_trace_id());
            r
        })
        .collect()
}

fn tmpfs_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("herald-bench")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::Builder::new().prefix("herald-bench").tempdir())
        .expect("temp dir")
}

fn disk_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("herald-bench")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir on disk")
}

// ---------------------------------------------------------------------------------------------

fn delivery(c: &mut Criterion) {
    let receiver = Receiver::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-herald")
        .enable_all()
        .build()
        .expect("runtime");
    let counter = receiver.counter.clone();
    let requests = task_requests();

    let mut g = c.benchmark_group("delivery");
    g.throughput(Throughput::Elements(per_round()))
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(12));

    let mut baseline_timed = (0u64, Duration::ZERO);
    // Process CPU (user + sys, every thread: the receiver's too) over the timed rounds, per
    // contender: (name, ns, messages).
    let mut cpu: Vec<(&str, u64, u64)> = Vec::new();
    let mut baseline_cpu = 0u64;
    g.bench_function("baseline_hyper", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                // Untimed, as for herald: a fresh client per sample and one round to open its
                // connections.
                let baseline = Baseline::new(&receiver.url());
                baseline.round(&counter).await;
                let mut total = Duration::ZERO;
                let c0 = support::rusage_cpu_ns(libc::RUSAGE_SELF);
                for _ in 0..iters {
                    total += baseline.round(&counter).await;
                }
                baseline_cpu += support::rusage_cpu_ns(libc::RUSAGE_SELF).saturating_sub(c0);
                baseline_timed.0 += iters * per_round();
                baseline_timed.1 += total;
                total
            })
        })
    });

    // (name, signed, templated, data dir on the real disk, timeline on)
    let variants = [
        ("herald_unsigned", false, false, false, true),
        ("herald_no_timeline", false, false, false, false),
        ("herald_templated", false, true, false, true),
        ("herald_signed", true, false, false, true),
        ("herald_unsigned_disk", false, false, true, true),
        ("herald_no_timeline_disk", false, false, true, false),
    ];
    // Timed messages and time per contender, for the templated / plain ratio.
    let mut measured: Vec<(&str, u64, Duration)> = Vec::new();
    for (name, signed, templated, on_disk, timeline) in variants {
        let mut footprint = (0u64, 0u64, 0u64);
        if on_disk {
            // Iterations take ~0.6 s there: a little more time for 10 samples.
            g.measurement_time(Duration::from_secs(15));
        }
        let mut on = String::new();
        let (mut flushes, mut messages, mut busy_us, mut cpu_ns) = (0u64, 0u64, 0u64, 0u64);
        let mut timed = Duration::ZERO;
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    // Untimed: a fresh herald on a fresh data dir for every sample, so that
                    // whatever one instance happens to get (thread placement, store layout)
                    // is spread over the samples instead of biasing a whole contender; then
                    // one round to open its connections and warm the store.
                    let dir = if on_disk { disk_dir() } else { tmpfs_dir() };
                    on = data_dir_kind(dir.path());
                    let herald =
                        Herald::start(&receiver.url(), signed, templated, timeline, dir).await;
                    herald.round(&counter, &requests).await;
                    let (f0, m0, b0) = (
                        herald.flushes(),
                        counter.requests.load(Ordering::Acquire),
                        herald.commit_busy_us(),
                    );
                    let mut total = Duration::ZERO;
                    // Read before the CPU count starts, and only when it is printed.
                    let threads0 = if std::env::var_os("HERALD_DELIVERY_SAMPLES").is_some() {
                        support::thread_cpu_ns(std::process::id())
                    } else {
                        Default::default()
                    };
                    let c0 = support::rusage_cpu_ns(libc::RUSAGE_SELF);
                    for _ in 0..iters {
                        total += herald.round(&counter, &requests).await;
                    }
                    let c1 = support::rusage_cpu_ns(libc::RUSAGE_SELF).saturating_sub(c0);
                    cpu_ns += c1;
                    let m = counter.requests.load(Ordering::Acquire) - m0;
                    print_sample((c1, &threads0), m, total, &counter);
                    flushes += herald.flushes() - f0;
                    busy_us += herald.commit_busy_us() - b0;
                    messages += m;
                    timed += total;
                    // Untimed: the timeline's records and bytes for every message delivered
                    // by this instance (the warm-up round's too).
                    if let Ok((n, bytes)) = herald.engine().store().timeline_footprint() {
                        let delivered = (iters + 1) * per_round();
                        footprint = (
                            footprint.0 + n,
                            footprint.1 + bytes,
                            footprint.2 + delivered,
                        );
                    }
                    assert!(
                        herald.server.stop(Duration::from_secs(30)).await,
                        "herald stopped"
                    );
                    total
                })
            })
        });
        if messages > 0 {
            println!(
                "{name}: data dir on {on}; {messages} timed messages, {:.3} durable flushes per message; \
                 the commit thread applying or syncing {:.0} % of the timed time, {:.0} µs per group",
                flushes as f64 / messages.max(1) as f64,
                busy_us as f64 / 1e4 / timed.as_secs_f64().max(1e-9),
                busy_us as f64 / flushes.max(1) as f64
            );
        }
        if footprint.2 > 0 && footprint.0 > 0 {
            println!(
                "{name}: timeline {:.2} records and {:.0} bytes (keys + values) per delivered message",
                footprint.0 as f64 / footprint.2 as f64,
                footprint.1 as f64 / footprint.2 as f64
            );
        }
        measured.push((name, messages, timed));
        cpu.push((name, cpu_ns, messages));
    }
    cpu.insert(0, ("baseline_hyper", baseline_cpu, baseline_timed.0));
    g.finish();
    print_cpu(&cpu);
    let rate = |name: &str| {
        measured
            .iter()
            .find(|m| m.0 == name)
            .map(|&(_, n, t)| n as f64 / t.as_secs_f64().max(1e-9))
    };
    let rate = |name: &str| rate(name).filter(|r| *r > 0.0);
    if let (Some(tmpfs), Some(disk)) = (rate("herald_unsigned"), rate("herald_unsigned_disk")) {
        what_the_disk_adds(tmpfs, disk, baseline_timed);
    }
    if let (Some(plain), Some(templated)) = (rate("herald_unsigned"), rate("herald_templated")) {
        println!(
            "templated + success rule vs plain webhook: {templated:.0} vs {plain:.0} messages/s \
             over all timed iterations = {:.3} (cost {:.1} % of throughput)",
            templated / plain,
            (1.0 - templated / plain) * 100.0
        );
    }
    if let (Some(on), Some(off)) = (rate("herald_unsigned"), rate("herald_no_timeline")) {
        println!(
            "timeline on vs off (timeline_max = 0): {on:.0} vs {off:.0} messages/s over all timed \
             iterations = {:.3} (cost {:.1} % of throughput)",
            on / off,
            (1.0 - on / off) * 100.0
        );
    }
    // (signed, templated, timeline)
    if criterion_filter_allows("paired_template") {
        let (plain, templated) = ((false, false, true), (false, true, true));
        rt.block_on(paired_cost(
            &receiver,
            &requests,
            "templated / plain",
            plain,
            templated,
        ));
    }
    if criterion_filter_allows("paired_timeline") {
        let (off, on) = ((false, false, false), (false, false, true));
        rt.block_on(paired_cost(
            &receiver,
            &requests,
            "timeline on / off",
            off,
            on,
        ));
    }
    for on_disk in [false, true] {
        let name = if on_disk {
            "paired_raw_disk"
        } else {
            "paired_raw_tmpfs"
        };
        if criterion_filter_allows(name) {
            rt.block_on(paired_with_raw(&receiver, &requests, on_disk));
        }
    }
}

/// herald (`herald_unsigned`, its data dir on the disk or on tmpfs) against the raw hyper
/// client, in pairs as [`paired_cost`] does: the criterion contenders run one after the other,
/// and on this VM everything's CPU per message (the receiver's too) drifted by 50 % within one
/// run, so a ratio of two contenders measured a minute apart says as much about the minute as
/// about herald. Each pair is a fresh client and a fresh herald, run round for round
/// alternately; the figure is the median over pairs of `herald / raw` throughput.
async fn paired_with_raw(receiver: &Receiver, requests: &[TaskRequest], on_disk: bool) {
    const ROUNDS: usize = 6;
    let counter = &receiver.counter;
    let mut ratios = Vec::new();
    for p in 0..pairs() {
        let raw = Baseline::new(&receiver.url());
        let dir = if on_disk { disk_dir() } else { tmpfs_dir() };
        let herald = Herald::start(&receiver.url(), false, false, true, dir).await;
        raw.round(counter).await;
        herald.round(counter, requests).await;
        let (mut t_raw, mut t_herald) = (Duration::ZERO, Duration::ZERO);
        for r in 0..ROUNDS {
            if (p + r) % 2 == 0 {
                t_raw += raw.round(counter).await;
                t_herald += herald.round(counter, requests).await;
            } else {
                t_herald += herald.round(counter, requests).await;
                t_raw += raw.round(counter).await;
            }
        }
        ratios.push(t_raw.as_secs_f64() / t_herald.as_secs_f64().max(1e-9));
        assert!(
            herald.server.stop(Duration::from_secs(30)).await,
            "herald stopped"
        );
    }
    let on = if on_disk { "disk" } else { "tmpfs" };
    print_median(
        &format!("herald_unsigned ({on}) / raw hyper client"),
        ratios,
        ROUNDS,
    );
}

/// Pairs per paired measurement: `HERALD_DELIVERY_PAIRS`, default 9.
fn pairs() -> usize {
    std::env::var("HERALD_DELIVERY_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9)
        .max(1)
}

/// The median and range of per-pair throughput ratios.
fn print_median(what: &str, mut ratios: Vec<f64>, rounds: usize) {
    ratios.sort_by(f64::total_cmp);
    let (Some(first), Some(last)) = (ratios.first(), ratios.last()) else {
        return;
    };
    let median = ratios[ratios.len() / 2];
    println!(
        "paired ({what} throughput, {} pairs x {rounds} alternating rounds): \
         median {median:.3} (cost {:.1} %), range {first:.3}..{last:.3}",
        ratios.len(),
        (1.0 - median) * 100.0,
    );
}

/// With `HERALD_DELIVERY_SAMPLES` set, one sample's CPU per message (and by thread name, from
/// `before`), its rate, and the connections the receiver has accepted since it started.
fn print_sample(
    (cpu_ns, before): (u64, &std::collections::BTreeMap<String, u64>),
    messages: u64,
    timed: Duration,
    counter: &Counter,
) {
    if std::env::var_os("HERALD_DELIVERY_SAMPLES").is_none() {
        return;
    }
    let per_msg = |ns: u64| ns as f64 / messages.max(1) as f64 / 1e3;
    let mut threads = String::new();
    for (name, ns) in support::thread_cpu_ns(std::process::id()) {
        let used = per_msg(ns.saturating_sub(before.get(&name).copied().unwrap_or(0)));
        if used >= 0.1 {
            threads += &format!(" {name} {used:.1}");
        }
    }
    eprintln!(
        "sample: {:.1} µs of CPU per message ({}), {:.0} messages/s, {} connections accepted so far",
        per_msg(cpu_ns),
        threads.trim_start(),
        messages as f64 / timed.as_secs_f64().max(1e-9),
        counter.conns.load(Ordering::Relaxed)
    );
}

/// The process's CPU time (user + sys, all threads, the receiver's included) per message of
/// each contender's timed rounds, and as a multiple of the raw client's: on 2 cores a
/// contender that keeps both busy can deliver at most 2 s / (its CPU per message), so this
/// says how far the CPU alone lets herald come to the raw client, whatever the disk does.
fn print_cpu(cpu: &[(&str, u64, u64)]) {
    let per_msg = |&(_, ns, n): &(&str, u64, u64)| (n > 0).then(|| ns as f64 / n as f64 / 1e3);
    let base = cpu
        .iter()
        .find(|c| c.0 == "baseline_hyper")
        .and_then(per_msg);
    for c in cpu {
        let (Some(us), name) = (per_msg(c), c.0) else {
            continue;
        };
        match base {
            Some(b) if name != "baseline_hyper" => println!(
                "{name}: {us:.1} µs of CPU per message (all threads), {:.2} × the raw client's {b:.1} µs",
                us / b
            ),
            _ => println!("{name}: {us:.1} µs of CPU per message (all threads)"),
        }
    }
}

/// What the disk adds to each message, measured in the same run. Each of the [`tasks()`]
/// sequences has one message in flight, and its next message leaves only once that message's
/// outcome and the next one's mark are durable together: every message of a sequence waits for
/// a sync. So a sequence's time per message on disk, beside the same on tmpfs (no sync), shows
/// what the sync costs it, counted in the disk's raw `fdatasync`s (read right after).
fn what_the_disk_adds(tmpfs: f64, disk: f64, (base_n, base_t): (u64, Duration)) {
    let sync_us = 1e6 / support::fdatasync_rate(disk_dir().path());
    let per_seq = |rate: f64| 1e6 * tasks() as f64 / rate;
    let added = per_seq(disk) - per_seq(tmpfs);
    let hyper = base_n as f64 / base_t.as_secs_f64().max(1e-9);
    if base_n > 0 {
        println!(
            "herald_unsigned vs the raw hyper client ({hyper:.0}/s): tmpfs {:.2}, disk {:.2}",
            tmpfs / hyper,
            disk / hyper
        );
    }
    println!(
        "per sequence, one message every {:.0} µs on disk, {:.0} µs on tmpfs: the disk adds \
         {added:.0} µs per message, {:.1} × this disk's raw fdatasync ({sync_us:.0} µs)",
        per_seq(disk),
        per_seq(tmpfs),
        added / sync_us
    );
}

/// Whether a `cargo bench --bench delivery -- FILTER` run asked for `name` (no filter: yes).
fn criterion_filter_allows(name: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}

/// A contender of a paired cost: `(signed, templated, timeline)` as for [`Herald::start`].
type Shape = (bool, bool, bool);

/// A cost measured in pairs (the template engine's, the timeline's): the criterion contenders
/// above run one after the other, so anything that drifts over the run (page cache, another
/// process, CPU frequency) lands on one of them only; on this 2-core VM that drift was as
/// large as the cost being measured (the template's ratio read 0.81 in one quiet run and 0.93
/// in another). Here each pair is a fresh `base` and a fresh `with` herald, run round for round
/// alternately (which one goes first alternates too), and the figure is the median over pairs
/// of the pair's throughput ratio `with / base`. `HERALD_DELIVERY_PAIRS` sets the number of
/// pairs (default 9), 6 timed rounds per contender.
async fn paired_cost(
    receiver: &Receiver,
    requests: &[TaskRequest],
    what: &str,
    base: Shape,
    with: Shape,
) {
    let pairs = pairs();
    const ROUNDS: usize = 6;
    let counter = &receiver.counter;
    let mut ratios = Vec::with_capacity(pairs);
    for p in 0..pairs {
        let plain = Herald::start(&receiver.url(), base.0, base.1, base.2, tmpfs_dir()).await;
        let other = Herald::start(&receiver.url(), with.0, with.1, with.2, tmpfs_dir()).await;
        plain.round(counter, requests).await;
        other.round(counter, requests).await;
        let (mut t_plain, mut t_other) = (Duration::ZERO, Duration::ZERO);
        for r in 0..ROUNDS {
            if (p + r) % 2 == 0 {
                t_plain += plain.round(counter, requests).await;
                t_other += other.round(counter, requests).await;
            } else {
                t_other += other.round(counter, requests).await;
                t_plain += plain.round(counter, requests).await;
            }
        }
        // Same messages on both sides: the throughput ratio is the inverse time ratio.
        ratios.push(t_plain.as_secs_f64() / t_other.as_secs_f64().max(1e-9));
        for h in [plain, other] {
            assert!(
                h.server.stop(Duration::from_secs(30)).await,
                "herald stopped"
            );
        }
    }
    print_median(what, ratios, ROUNDS);
}

fn data_dir_kind(p: &Path) -> String {
    let kind = if p.starts_with("/dev/shm") {
        "tmpfs"
    } else {
        "disk"
    };
    format!("{kind} ({})", p.display())
}

criterion_group!(benches, delivery);
criterion_main!(benches);

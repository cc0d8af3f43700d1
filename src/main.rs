//! The `herald` command line. Argument handling only; everything else is in the library.
// Issue 22 item 6: no unwrap/expect/indexing and no function over 70 lines in src/ outside
// tests (clippy.toml sets the threshold). A site that must stay carries its own `#[allow]` with
// the reason. Test builds (`cfg(test)`) and tests/, benches/ are not held to it.
#![cfg_attr(
    not(test),
    warn(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::too_many_lines
    )
)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};

use herald::config::{Config, Overrides};

/// sled allocates and frees a node per write; with glibc malloc that was ~30 % of herald's CPU
/// in a herd. mimalloc roughly doubles sled's raw insert rate on this machine (ARCHITECTURE.md,
/// "The write path"). Built with `no_thp`: transparent huge pages under mimalloc's arenas cost
/// ~55 MiB more RSS at 300 k pending tasks (236 vs 181 MiB), for no speed measured.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's own C API, linked through the `mimalloc` crate (which does not wrap it):
/// `mi_option_t` is a C enum, `mi_option_purge_delay` its 16th value in mimalloc 3
/// (`libmimalloc-sys` 0.1.49, `c_src/mimalloc/v3/include/mimalloc.h`).
mod mi {
    pub const PURGE_DELAY: std::ffi::c_int = 15;
    /// mimalloc 3's default for it, in milliseconds: how the index is checked before use.
    pub const PURGE_DELAY_DEFAULT: std::ffi::c_long = 1_000;
    extern "C" {
        pub fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
        pub fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
        pub fn mi_collect(force: bool);
    }
}

/// Freed pages go back to the system 10 ms after they are freed, not mimalloc 3's 1 s. A
/// purge waits for the thread to come back to the allocator, so a thread that frees a lot and
/// then goes idle (the applier after a burst, the live index's load after a restart) kept its
/// pages for good: at 1 000 000 pending tasks RSS read 239–300 MiB 10 s after a restart and
/// 265–280 MiB once the memtable was in sled, run to run; with 10 ms, 227–232 and 247–249
/// (`cargo bench --bench scale`, three runs). Creates at 64 connections paid nothing
/// measurable (A/B, 8 rounds: paired rate 1.06, CPU 0.96); an immediate purge (0) cost ~5 %
/// of their CPU.
/// `MIMALLOC_PURGE_DELAY` in the environment still decides when set.
fn purge_freed_memory_soon() {
    const DELAY_MS: std::ffi::c_long = 10;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: both take an option index and a number, no pointers; any thread, any time.
    unsafe {
        // Another mimalloc whose enum differs would not hold its default at this index:
        // then nothing is set (the setting only saves memory).
        if mi::mi_option_get(mi::PURGE_DELAY) == mi::PURGE_DELAY_DEFAULT {
            mi::mi_option_set(mi::PURGE_DELAY, DELAY_MS);
        }
    }
}

/// A delayed purge is carried out only when some thread next comes back to the allocator
/// (mimalloc 3, `arena.c` `mi_arenas_try_purge`, from the allocation paths): pages freed just
/// before the process went idle, or by a thread that then ended (the live index's loader,
/// `herald-load`, frees its batches and exits), stayed resident while nothing allocated. At
/// 1 000 000 pending tasks RSS 10 s after a restart read 221–309 MiB over six runs (past the
/// 300 MB target twice); with `MIMALLOC_PURGE_DELAY=0` 220–229 MiB over three
/// (`cargo bench --bench scale`). A thread that asks once a second carries those purges out:
/// `mi_collect(true)` (forced: every arena's freed ranges, whatever their delay; `false` only
/// purged ranges past their delay and read 214–268 MiB over four runs) read 226–245 MiB over
/// three, without making every free purge at once as a delay of 0 does. Creates at 64
/// connections against the build without it (`HERALD_LOAD_ONLY=ab`, 6 rounds): paired rate
/// 0.97, CPU per create 1.02, B faster in 3 of 6: inside the noise.
fn purge_on_a_timer() {
    let spawned = std::thread::Builder::new()
        .name("herald-purge".into())
        .spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            // SAFETY: no arguments but a flag; callable from any thread at any time.
            unsafe { mi::mi_collect(true) };
        });
    // Without it memory is only given back later; nothing else depends on it.
    drop(spawned);
}

#[derive(Parser)]
#[command(name = "herald", version, about = "Sends messages at the right time.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the engine and its HTTP API.
    Serve {
        /// TOML config file (see README); without it herald runs on its embedded defaults.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on, e.g. 127.0.0.1:7700 (overrides the config file).
        #[arg(long)]
        listen: Option<String>,
        /// Data directory (overrides the config file).
        #[arg(long)]
        data: Option<PathBuf>,
    },
    #[command(flatten)]
    Client(herald::cli::Command),
    /// Print a shell completion script: `herald completions bash > /etc/bash_completion.d/herald`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn main() {
    purge_freed_memory_soon();
    purge_on_a_timer();
    // One line, no backtrace: a config mistake is a message for the operator, not a crash.
    if let Err(e) = run() {
        eprintln!("herald: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    // Not `Cli::parse()`: clap's own exit panics when `herald --help | head -1` closes the pipe.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            std::process::exit(e.exit_code());
        }
    };
    match cli.command {
        Command::Client(cmd) => return Ok(herald::cli::run(cmd)?),
        Command::Completions { shell } => {
            // Into a buffer first: clap_complete panics on a failed write (`| head -1`).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "herald", &mut script);
            herald::cli::output::write_bytes(&script);
            return Ok(());
        }
        Command::Serve { .. } => {}
    }
    init_logs()?;
    match cli.command {
        Command::Serve {
            config,
            listen,
            data,
        } => {
            // Before anything opens a descriptor: the soft limit up to the hard one.
            let fds = herald::fdlimit::raise_nofile();
            // The environment (HERALD_TOKEN, HERALD_LISTEN, ...) is read by `Config::load`.
            let overrides = Overrides {
                listen,
                data_dir: data,
                token: None,
            };
            let config = Config::load(config.as_deref(), overrides)?;
            match fds {
                Ok(r) if r.before != r.now => {
                    tracing::info!(
                        from = r.before,
                        to = r.now,
                        "raised the file descriptor limit"
                    )
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not raise the file descriptor limit"),
            }
            let drain_timeout = Duration::from_millis(config.shutdown_timeout_ms);
            // The global queue first (`global_queue_interval(1)`): every task woken from a
            // thread outside the runtime waits there, the dispatcher handed due keys by the
            // timer thread as well as the writers answered by the commit thread. Left to
            // tokio's own tuning (one task from that queue per few polls of the workers' own),
            // the dispatcher once waited ~170 ms behind a herd's settles, and the sends due
            // meanwhile with it (docs/performance.md, "a send due while a herd settles").
            // Creates were not slower for it (paired rounds 1.00, 8 of them). The other side:
            // a task spawned or woken on a worker (a connection's next request, a chunk)
            // waits while that queue has tasks, which it has only as long as other threads
            // keep waking tasks faster than two workers poll them.
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .global_queue_interval(1)
                .build()
                .context("starting the tokio runtime")?;
            let served = rt.block_on(serve_until_signalled(config, drain_timeout));
            if served.is_err() {
                // A failed or interrupted start may leave a thread stuck (a store's open
                // waiting for a server that never answers, a storage engine stuck in its
                // drop): nothing below may wait for it for good.
                exit_anyway_after(SHUTDOWN_GRACE);
            }
            // A send still waiting for its receiver, or a start-up still blocked in its
            // store, must not keep the process alive.
            rt.shutdown_timeout(Duration::from_secs(1));
            served
        }
        Command::Client(_) | Command::Completions { .. } => Ok(()),
    }
}

/// Serves until a signal, then drains (a second signal exits at once) and closes.
async fn serve_until_signalled(config: Config, drain_timeout: Duration) -> anyhow::Result<()> {
    // Installed before start: a signal during recovery is not lost. Installing it takes the
    // default action (terminate) away, so start-up is raced against it below.
    let mut signals = Signals::new()?;
    let server = tokio::select! {
        started = start_off_the_workers(config) => started?,
        signal = signals.next() => anyhow::bail!(
            "{signal} during start-up: stopped before ready (nothing was acknowledged)"
        ),
    };
    // Tests and scripts read this line to find the port when listening on :0.
    println!("herald listening on {}", server.url());
    let first = signals.next().await;
    exit_anyway_after(drain_timeout + SHUTDOWN_GRACE);
    tracing::info!(signal = first, timeout_ms = drain_timeout.as_millis() as u64,
        in_flight = server.engine.sends_in_flight(),
        "draining: no new sends or writes; waiting for sends in flight (a second signal exits at once)");
    let drained = tokio::select! {
        d = server.drain(drain_timeout) => d,
        second = signals.next() => {
            tracing::warn!(signal = second, in_flight = server.engine.sends_in_flight(),
                "second signal: exiting now; sends in flight go again after the restart");
            std::process::exit(EXIT_SECOND_SIGNAL);
        }
    };
    if drained {
        tracing::info!("drained: every send in flight settled");
        // Releases the data directory cleanly (the store flushes and closes).
        server.stop(Duration::from_secs(5)).await;
    } else {
        tracing::warn!(in_flight = server.engine.sends_in_flight(),
            "shutdown_timeout passed with sends still waiting for an answer; they stay in flight on disk and go again after the restart with the next attempt number");
        drop(server);
    }
    Ok(())
}

/// `server::start` on a blocking thread of its own: it can block the thread that polls it
/// (PostgreSQL's open waits up to `statement_timeout` for a server that does not answer), and
/// the signal that ends it must still be read meanwhile by the runtime's workers.
async fn start_off_the_workers(config: Config) -> anyhow::Result<herald::server::Server> {
    let handle = tokio::runtime::Handle::current();
    let started =
        tokio::task::spawn_blocking(move || handle.block_on(herald::server::start(config)))
            .await
            .context("start-up panicked")?;
    Ok(started?)
}

/// Beyond the drain timeout, how long closing may take (the store flushes and closes).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Exit status when closing took longer than the drain timeout and [`SHUTDOWN_GRACE`].
const EXIT_STUCK: i32 = 3;

/// A signal must end the process whatever state it is in: a storage engine stuck after an I/O
/// error (sled 0.34 can block for good in its drop) must not keep it alive. Everything
/// acknowledged is durable already, so exiting is safe; what was in flight goes again after the
/// restart.
fn exit_anyway_after(after: Duration) {
    let spawned = std::thread::Builder::new()
        .name("herald-exit-watchdog".into())
        .spawn(move || {
            std::thread::sleep(after);
            tracing::error!(
                after_ms = after.as_millis() as u64,
                "shutdown did not finish in time (storage stuck?): exiting now; nothing acknowledged is lost"
            );
            std::process::exit(EXIT_STUCK);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start the shutdown watchdog");
    }
}

/// Exit status after a second SIGTERM/SIGINT cut a drain short.
const EXIT_SECOND_SIGNAL: i32 = 130;

/// `HERALD_LOG` filters (default `info`); `HERALD_LOG_FORMAT=json` writes one JSON object per
/// line (for log shippers) instead of text.
fn init_logs() -> anyhow::Result<()> {
    // Unset (or empty) is `info`; a filter that does not parse is refused, not ignored.
    let filter = match std::env::var("HERALD_LOG") {
        Err(std::env::VarError::NotPresent) => tracing_subscriber::EnvFilter::new("info"),
        Ok(s) if s.trim().is_empty() => tracing_subscriber::EnvFilter::new("info"),
        Ok(s) => tracing_subscriber::EnvFilter::try_new(&s)
            .map_err(|e| anyhow::anyhow!("HERALD_LOG: {s:?} is not a log filter: {e}"))?,
        Err(std::env::VarError::NotUnicode(s)) => {
            anyhow::bail!("HERALD_LOG: {s:?} is not UTF-8")
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match std::env::var("HERALD_LOG_FORMAT").as_deref() {
        Ok("json") => builder.json().with_current_span(false).init(),
        Ok("text") | Ok("") | Err(_) => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        Ok(other) => anyhow::bail!("HERALD_LOG_FORMAT: {other:?} is not text or json"),
    }
    Ok(())
}

/// SIGINT and SIGTERM, installed once so that no signal is lost between two waits.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// The next SIGTERM or SIGINT, by name.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

#[cfg(test)]
mod tests {
    /// The index [`super::mi::PURGE_DELAY`] is mimalloc's purge delay: this test binary runs
    /// itself again with `MIMALLOC_PURGE_DELAY=777` (read by mimalloc at process start), and
    /// there the option at that index reads 777. Here, without the variable, it holds the
    /// default the start-up check compares with.
    #[test]
    fn the_purge_delay_index_is_mimallocs_purge_delay() {
        if std::env::var_os("HERALD_PURGE_PROBE").is_some() {
            // SAFETY: reads one option by index.
            let got = unsafe { super::mi::mi_option_get(super::mi::PURGE_DELAY) };
            assert_eq!(got, 777, "the option at the index is not the purge delay");
            return;
        }
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            // SAFETY: as above.
            let got = unsafe { super::mi::mi_option_get(super::mi::PURGE_DELAY) };
            assert_eq!(got, super::mi::PURGE_DELAY_DEFAULT);
        }
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "tests::the_purge_delay_index_is_mimallocs_purge_delay",
            ])
            .env("HERALD_PURGE_PROBE", "1")
            .env("MIMALLOC_PURGE_DELAY", "777")
            .output()
            .expect("run the probe");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "the probe failed: {text}");
        assert!(text.contains("1 passed"), "the probe did not run: {text}");
    }
}

//! Putting it together: open the store, build the channels, start the engine (which
//! recovers), then serve the API. Used by `main` and by the in-process integration tests.

use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

use crate::api::{self, conns::Conns, ApiState};
use crate::clock::{Clock, Durations, SystemClock};
use crate::config::{ChannelKind, Config};
use crate::deliver::breaker::Breaker;
use crate::deliver::platform::{Platform, SignKind};
use crate::deliver::ratelimit::Limiter;
use crate::deliver::sign::Signer;
use crate::deliver::{file::FileSink, webhook::WebhookSink, Channel, Channels, Sink};
use crate::engine::cluster::ClusterHooks;
use crate::engine::{Engine, EngineConfig, EngineError};
use crate::fdlimit;
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the data directory {dir}: {error}. If it is damaged: stop herald, move it aside (mv {dir} {dir}.damaged), then restore a backup into {dir} or start empty; README \"When the data directory will not open\" has the steps")]
    Store { dir: String, error: StoreError },
    /// `[store] url`: the database cannot be used (the line names it, without its password).
    #[error("{0}")]
    Database(StoreError),
    #[error("channel {name}: {message}")]
    Channel { name: String, message: String },
    #[error("recovery: {0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Descriptors(String),
    #[error("telemetry.otlp_endpoint: {0}")]
    Telemetry(String),
    /// The data directory (or database) holds an import that did not finish
    /// (`backup/marker.rs`).
    #[error("{0}")]
    Unfinished(String),
    #[error("cannot listen on {addr}: {error}")]
    Listen {
        addr: SocketAddr,
        error: std::io::Error,
    },
}

/// A running herald: the engine and the HTTP server. Dropping it stops the server.
pub struct Server {
    pub addr: SocketAddr,
    pub engine: Engine,
    shutdown: watch::Sender<bool>,
    /// Cluster mode: the lease loop, left (its shards released) after the drain.
    cluster: Mutex<Option<crate::cluster::node::Handle>>,
}

impl Server {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The graceful half of a shutdown (SIGTERM): `/healthz` answers 503 and writes are
    /// refused from now on, no send starts, and sends in flight are waited for (up to
    /// `timeout`) until their outcome is durable. Returns whether they all settled; the API
    /// keeps answering reads until the server is dropped.
    pub async fn drain(&self, timeout: std::time::Duration) -> bool {
        let drained = self.engine.drain(timeout).await;
        // Cluster mode: the shards go free at once for the other nodes (HA.md "Balancing":
        // SIGTERM hands every shard over). After the drain, so that no send of this node is
        // still in flight when another node may take its shard; sends still waiting past
        // the timeout are cut off when the handover lets their shards go (or their trust
        // ends).
        let handle = self.cluster.lock().take();
        if let Some(h) = handle {
            h.leave().await;
        }
        drained
    }

    /// Stops serving and waits (up to `deadline`) until the engine has stopped and released
    /// the data directory, so it can be opened again (tests restart on the same directory).
    /// Returns whether it stopped in time.
    pub async fn stop(self, deadline: std::time::Duration) -> bool {
        let weak = self.engine.downgrade();
        // The last strong reference may be dropped on another thread, where the store is still
        // closing after the count reached 0: wait for the store itself to say it closed.
        let closed = self.engine.store().closed_flag();
        drop(self);
        let end = std::time::Instant::now() + deadline;
        while weak.strong_count() > 0 || !closed.load(std::sync::atomic::Ordering::Acquire) {
            if std::time::Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        true
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// Builds the channel sinks from config (opens files, makes HTTP clients). Rate limits and
/// breakers measure on the wall `now` their callers pass; [`build_channels_with`] puts them
/// on a clock's monotonic reading.
pub fn build_channels(config: &Config) -> Result<Channels, StartError> {
    build_channels_with(config, Durations::default())
}

/// [`build_channels`] with rate-limit windows and breaker cool-downs on `durations`.
pub fn build_channels_with(config: &Config, durations: Durations) -> Result<Channels, StartError> {
    let mut list = Vec::new();
    for c in &config.channels {
        let err = |message: String| StartError::Channel {
            name: c.name.clone(),
            message,
        };
        let sink = match &c.kind {
            ChannelKind::Log => Sink::Log,
            ChannelKind::File { path } => Sink::File(
                FileSink::open(path)
                    .map_err(|e| err(format!("cannot open {}: {e}", path.display())))?,
            ),
            ChannelKind::Webhook {
                url,
                timeout_ms,
                connect_timeout_ms,
                ca_certs,
                secrets,
                platform,
                ..
            } => {
                // Standard Webhooks headers unless the platform settings sign otherwise.
                let standard = platform
                    .as_ref()
                    .is_none_or(|p| p.sign == SignKind::StandardWebhooks);
                let signer = if secrets.is_empty() || !standard {
                    None
                } else {
                    Some(Signer::new(secrets).map_err(err)?)
                };
                let mut sink = WebhookSink::new(
                    url.clone(),
                    *timeout_ms,
                    *connect_timeout_ms,
                    ca_certs,
                    signer,
                )
                .map_err(err)?;
                if let Some(spec) = platform {
                    let p = Platform::new(&c.name, (**spec).clone(), secrets)
                        .map_err(|(k, m)| err(format!("{k}: {m}")))?;
                    sink = sink.with_platform(p);
                }
                Sink::Webhook(Box::new(sink))
            }
        };
        let mut ch = Channel::plain(&c.name, sink, c.retry, c.concurrency as usize);
        ch.limiter = c
            .rate
            .map(|r| Mutex::new(Limiter::new(r).with_durations(durations.clone())));
        ch.breaker = c
            .breaker
            .map(|b| Mutex::new(Breaker::new(b).with_durations(durations.clone())));
        ch.quiet_hours = c.quiet_hours.clone();
        list.push(ch);
    }
    Ok(Channels::new(list))
}

/// The store on PostgreSQL (`[store] url`). Its errors name the URL without its password and
/// say what to do.
fn open_database(
    db: &crate::config::DatabaseConfig,
    cluster: Option<&crate::config::ClusterConfig>,
) -> Result<(Store, Option<ClusterHooks>), StartError> {
    let opts = crate::store::pg::PgOptions {
        pool_size: db.pool_size,
        statement_timeout: std::time::Duration::from_millis(db.statement_timeout_ms),
        password: db.password.clone(),
        shards: cluster.map_or(crate::store::pg::schema::DEFAULT_SHARDS, |c| c.shards),
        // Half the lease: a partitioned node's open group must not hold its shards' lease
        // rows past the point where another node may take them over.
        idle_in_transaction: cluster
            .map(|c| std::time::Duration::from_millis((c.timing.ttl_ms / 2).max(1))),
        // One single-node herald per database, or cluster nodes only (`store/pg/lock.rs`).
        process_lock: Some(if cluster.is_some() {
            crate::store::pg::lock::Mode::Shared
        } else {
            crate::store::pg::lock::Mode::Exclusive
        }),
        ..Default::default()
    };
    let mut backend =
        crate::store::pg::PgBackend::open(&db.url, &opts).map_err(StartError::Database)?;
    if backend.import_unfinished().map_err(StartError::Database)? {
        return Err(StartError::Unfinished(crate::backup::marker::pg_refusal(
            &crate::store::pg::redact(&db.url),
        )));
    }
    let hooks = cluster.map(|c| ClusterHooks {
        node_id: c.node_id.clone(),
        ownership: Arc::new(crate::cluster::node::Ownership::new(c.timing)),
        shards: backend.shards(),
        max_clock_offset_ms: c.max_clock_offset_ms,
        inbox_wake: Arc::default(),
    });
    if let Some(h) = &hooks {
        backend = backend.with_fence(h.ownership.clone());
    }
    let store = Store::with_backend(Arc::new(backend)).map_err(StartError::Database)?;
    Ok((store, hooks))
}

/// Cluster mode's lease loop, its events followed by `engine`, and the inbox's `LISTEN`
/// connection until `stopped` (`None` alone).
fn start_lease_loop(
    engine: &Engine,
    config: &Config,
    hooks: Option<&ClusterHooks>,
    addr: SocketAddr,
    stopped: watch::Receiver<bool>,
) -> Option<crate::cluster::node::Handle> {
    let (hooks, c, db) = (hooks?, config.cluster.as_ref()?, config.database.as_ref()?);
    // Without `advertise`, the address herald listens on (the config refuses an address that
    // names no interface without `advertise`; the warning stays for a config made otherwise).
    let advertise = c.advertise.clone().or_else(|| {
        if addr.ip().is_unspecified() {
            tracing::warn!(%addr, "cluster.advertise is not set and herald listens on every interface: other nodes cannot forward commands here");
            None
        } else {
            Some(format!("http://{addr}"))
        }
    });
    let (events, follow) = tokio::sync::mpsc::unbounded_channel();
    engine.follow_cluster(follow);
    let settings = crate::cluster::node::Settings {
        url: db.url.clone(),
        password: db.password.clone(),
        me: crate::cluster::node::Identity {
            node_id: c.node_id.clone(),
            incarnation: incarnation(&c.node_id),
            advertise,
        },
        timing: c.timing,
        shards: hooks.shards,
        max_clock_offset_ms: c.max_clock_offset_ms,
    };
    // The inbox's wake-up on its own unpooled connection, until the server stops.
    crate::cluster::listen::start(
        crate::cluster::listen::Settings {
            url: db.url.clone(),
            password: db.password.clone(),
        },
        &hooks.inbox_wake,
        stopped,
    );
    tracing::info!(node_id = %c.node_id, shards = hooks.shards, "cluster mode: taking shards");
    Some(crate::cluster::node::start_with(
        settings,
        hooks.ownership.clone(),
        events,
    ))
}

/// A random id for this process in the cluster (HA.md: the incarnation keeps two processes
/// with one node id apart).
fn incarnation(node_id: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{node_id}/{:016x}", h.finish())
}

/// Starts herald with the system clock.
pub async fn start(config: Config) -> Result<Server, StartError> {
    start_with(
        config,
        Arc::new(SystemClock::new()),
        EngineConfig::default(),
    )
    .await
}

/// How many HTTP connections herald serves at once, the descriptor limit and what it keeps
/// back: HTTP clients get what the limit leaves after herald's own work
/// ([`fdlimit::reserve`]).
fn connection_budget(config: &Config) -> Result<(usize, u64, u64), StartError> {
    let reserve = fdlimit::reserve(config);
    let limit = fdlimit::nofile().unwrap_or(1024);
    let (connections_max, warning) =
        fdlimit::connections_max(limit, reserve, config.connections_max)
            .map_err(StartError::Descriptors)?;
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
    Ok((connections_max, limit, reserve))
}

/// The data directory, refused while it holds an import that did not finish.
fn open_data_dir(config: &Config) -> Result<Store, StartError> {
    crate::backup::marker::check_complete(&config.data_dir).map_err(StartError::Unfinished)?;
    Store::open_with(&config.data_dir, &config.store).map_err(|error| StartError::Store {
        dir: config.data_dir.display().to_string(),
        error,
    })
}

/// Starts herald with a given clock and engine settings (tests use a manual clock).
pub async fn start_with(
    config: Config,
    clock: Arc<dyn Clock>,
    mut engine_config: EngineConfig,
) -> Result<Server, StartError> {
    let (store, cluster) = match &config.database {
        Some(db) => open_database(db, config.cluster.as_ref())?,
        None => (open_data_dir(&config)?, None),
    };
    store.set_timeline_max(config.store.timeline_max);
    // Cluster mode fires at database time: the engine reads the clock plus the offset the
    // lease loop measures (HA.md "Time").
    let clock: Arc<dyn Clock> = match &cluster {
        Some(h) => {
            // The lease loop reads this clock's monotonic clock against the database's.
            h.ownership.set_node_clock(clock.clone());
            Arc::new(crate::clock::OffsetClock::sharing(
                clock,
                h.ownership.db_offset(),
                h.ownership.engine_reading(),
            ))
        }
        None => clock,
    };
    let telemetry = match &config.otlp_endpoint {
        Some(e) => crate::trace::otlp::Telemetry::start(e).map_err(StartError::Telemetry)?,
        None => crate::trace::otlp::Telemetry::off(),
    };
    let channels = build_channels_with(&config, Durations::of(clock.clone()))?;
    let tracing = channels.tracing().clone();
    tracing.set_telemetry(telemetry);
    // Bind before recovering so a port clash fails fast.
    let listener = listen(config.listen).map_err(|error| StartError::Listen {
        addr: config.listen,
        error,
    })?;
    let addr = listener.local_addr().map_err(|error| StartError::Listen {
        addr: config.listen,
        error,
    })?;
    let (connections_max, limit, reserve) = connection_budget(&config)?;
    let conns = Conns::new(connections_max);
    engine_config.limits = config.limits.clone();
    engine_config.alerts_channel = config.alerts_channel.clone();
    engine_config.retention_ms = config.store.retention_ms;
    engine_config.runs_max = Some(config.store.runs_max);
    engine_config.failures_max = Some(config.store.failures_max);
    engine_config.cluster = cluster.clone();
    let engine = Engine::new(store, channels, clock.clone(), engine_config)?;
    let (tx, rx) = watch::channel(false);
    let state = Arc::new(ApiState {
        engine: engine.clone(),
        token: config.token.clone(),
        body_bytes_max: config.body_bytes_max,
        body_read_timeout: std::time::Duration::from_millis(config.body_read_timeout_ms),
        header_read_timeout: std::time::Duration::from_millis(config.header_read_timeout_ms),
        metrics: Default::default(),
        conns,
        clock: clock.clone(),
        tracing: tracing.clone(),
    });
    // Serve first: while recovery runs, /healthz and /v1 answer 503 instead of hanging.
    tokio::spawn(api::serve(listener, state, rx));
    engine.recover().await?;
    // Cluster mode: the lease loop starts once the engine can load what it is granted.
    let lease_loop = start_lease_loop(&engine, &config, cluster.as_ref(), addr, tx.subscribe());
    tracing::info!(%addr, data_dir = %config.data_dir.display(), connections_max,
        fd_limit = limit, fd_reserved = reserve, "herald listening");
    Ok(Server {
        addr,
        engine,
        shutdown: tx,
        cluster: Mutex::new(lease_loop),
    })
}

/// Connections the kernel completes before herald accepts them (it caps this at
/// `net.core.somaxconn`). `TcpListener::bind` listened with 128: when 256 clients connected at
/// once the queue overflowed, and a client whose SYN was dropped waited the kernel's 1 s
/// before trying again (`nstat`: 366 `ListenOverflows` and as many `TCPSynRetrans` in six
/// bench rounds; each such round ran at ~29 000 creates/s, pinned to 1 s, against 40 000–
/// 44 000 in the others).
pub const LISTEN_BACKLOG: u32 = 1024;

/// Binds `addr` as `TcpListener::bind` does (`SO_REUSEADDR`), with [`LISTEN_BACKLOG`].
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The backlog is real: 300 connections complete while nobody accepts (with the 128 of
    /// `TcpListener::bind`, the 130th connect timed out). A kernel whose `somaxconn` caps every
    /// backlog at 128 or less (before Linux 5.4) cannot show it: the test says so and stops.
    #[tokio::test]
    async fn the_listener_queues_a_burst_of_connections_nobody_has_accepted_yet() {
        const N: usize = 300;
        let cap = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok());
        if cap.is_some_and(|c| c < N) {
            eprintln!("skipped: net.core.somaxconn {cap:?} caps the backlog under {N}");
            return;
        }
        let listener = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let opened = tokio::task::spawn_blocking(move || {
            let mut streams = Vec::new();
            for i in 0..N {
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                    Ok(s) => streams.push(s),
                    Err(e) => return Err(format!("connection {i}: {e}")),
                }
            }
            Ok(streams.len())
        })
        .await
        .unwrap();
        assert_eq!(opened, Ok(N));
        drop(listener);
    }
}

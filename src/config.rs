//! Operator configuration: the TOML file of API.md, the environment (`HERALD_*`, one variable
//! per key of [`ENV_KEYS`]) for the keys the file does not set, and CLI flags over both, over
//! embedded defaults (data in `./herald-data`, listening on `127.0.0.1:7700`, one channel `log`).
//!
//! Errors name the key they are about (`channels.wechat.url: ...`); unknown keys are errors,
//! so a typo never silently drops a setting.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::deliver::breaker::{parse_breaker, BreakerConfig};
use crate::deliver::platform::{expand_env, resolve_preset, uses_platform, PlatformSpec, SignKind};
use crate::deliver::preset::{PlatformKeys, SuccessKeys, TokenKeys};
use crate::deliver::ratelimit::{parse_rate, Rate};
use crate::deliver::sign::Signer;
use crate::model::{parse_duration_ms, Limits, RetryPolicy};
use crate::request::{validate_retry, RetryRequest};

mod cluster;
mod env;
mod redact;
pub use cluster::ClusterConfig;
pub use env::{var_name, Kind};

/// Every config key an environment variable can set (`HERALD_` + the key upper-cased, `.` →
/// `_`: see [`var_name`]). A key added to the file gets its variable by adding a line here;
/// README's "Environment variables" table lists them. Channels are named by the operator, so
/// they are not here: their values take `${VAR}` instead.
pub const ENV_KEYS: &[(&str, Kind)] = &[
    ("listen", Kind::Str),
    ("data_dir", Kind::Str),
    ("token", Kind::Str),
    ("shutdown_timeout", Kind::Str),
    ("alerts.channel", Kind::Str),
    ("limits.body_bytes_max", Kind::Int),
    ("limits.messages_max", Kind::Int),
    ("limits.message_body_bytes_max", Kind::Int),
    ("limits.live_tasks_max", Kind::Int),
    ("limits.horizon", Kind::Str),
    ("limits.connections_max", Kind::Int),
    ("limits.body_read_timeout", Kind::Str),
    ("limits.header_read_timeout", Kind::Str),
    ("store.cache_mb", Kind::Int),
    ("store.retention", Kind::Str),
    ("store.runs_max", Kind::Int),
    ("store.failures_max", Kind::Int),
    ("store.url", Kind::Str),
    ("store.pool_size", Kind::Int),
    ("store.statement_timeout", Kind::Str),
    ("store.timeline_max", Kind::Int),
    ("telemetry.otlp_endpoint", Kind::Str),
];

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7700";
pub const DEFAULT_DATA_DIR: &str = "herald-data";
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Sends in flight at once on a webhook channel when the config does not say.
pub const DEFAULT_CONCURRENCY: u32 = 4;
/// ... and on a file or log channel: a local append has no peer to spare, and its writer
/// batches lines anyway. With 4, a herd to a file channel drained at the pace of four permits
/// passing through a busy runtime (hundreds of sends/s while fires were being made).
pub const LOCAL_CONCURRENCY: u32 = 10_000;
pub const BODY_BYTES_MAX: usize = 1 << 20;
/// The most `[limits] message_body_bytes_max` may be: what the store can read back. A task's
/// only message is stored inside its spec record, and no record past the decoder's limit
/// (`store::codec::DECODE_LIMIT_BYTES`, 64 MiB) can be read; past it a create was answered 201
/// and its task then read as corrupt for good. The spec's other fields are bounded by limits
/// that are not configurable (name, recipient, 64 metadata entries: well under 1 MiB), and
/// the decoder counts a little more than the bytes (8 per string's length and per integer),
/// so half the limit leaves a wide margin. Messages of a task of several are records of their
/// own, each within this too.
pub const MESSAGE_BODY_BYTES_STORABLE: usize = crate::store::codec::DECODE_LIMIT_BYTES / 2;
/// The most `[limits] body_bytes_max` may be: a create's messages arrive in its body, are
/// held in memory whole and go into the store in one write-ahead log record, whose lengths
/// are 32-bit (`store/wal.rs`); a quarter of that leaves room for the group's other writes.
pub const REQUEST_BODY_BYTES_STORABLE: usize = 1 << 30;
/// How long a drain (SIGTERM) waits for sends in flight to settle before herald exits anyway.
pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = 30_000;
/// How long a client may take to send a request body, and a request head.
pub const DEFAULT_BODY_READ_TIMEOUT_MS: u64 = 30_000;
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 30_000;
/// Shortest API token accepted for a listen address other than loopback.
pub const TOKEN_CHARS_MIN: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// The config file as read. Its `Debug`, and its parts', show no secret (`redact.rs`).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    token: Option<String>,
    shutdown_timeout: Option<String>,
    #[serde(default)]
    channels: BTreeMap<String, ChannelFile>,
    alerts: Option<AlertsFile>,
    limits: Option<LimitsFile>,
    store: Option<StoreFile>,
    telemetry: Option<TelemetryFile>,
    cluster: Option<cluster::ClusterFile>,
}

/// `[telemetry]`: OpenTelemetry export (issue 25).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TelemetryFile {
    /// An OTLP/HTTP collector (`http://127.0.0.1:4318`); absent: no export.
    otlp_endpoint: Option<String>,
}

/// `[store]`: the embedded database.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreFile {
    /// sled's page cache in MiB (default 8; sled's own default would be 1024).
    cache_mb: Option<u64>,
    /// How long finished tasks are kept: a duration, or "off" / "0" to keep them forever.
    retention: Option<String>,
    /// Most run records an unfinished task keeps (default 1000); the oldest finished go first.
    runs_max: Option<u64>,
    /// Most entries the failure list holds (default 100000).
    failures_max: Option<u64>,
    /// A PostgreSQL database instead of the embedded store (`postgres://user@host:port/db`).
    url: Option<String>,
    /// Connections to it (default 8).
    pool_size: Option<u64>,
    /// Longest a statement may run before the server cancels it (default 30s).
    statement_timeout: Option<String>,
    /// Most timeline events a task keeps (default 10000; 0 keeps none).
    timeline_max: Option<u64>,
}

/// `[store] url`: herald on PostgreSQL (`store/pg`). `Debug` shows no password.
#[derive(Clone)]
pub struct DatabaseConfig {
    pub url: String,
    /// From `HERALD_STORE_PASSWORD` or `PGPASSWORD`, used when the URL carries none.
    pub password: Option<String>,
    pub pool_size: usize,
    pub statement_timeout_ms: u64,
}

impl std::fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &crate::store::pg::redact(&self.url))
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("pool_size", &self.pool_size)
            .field("statement_timeout_ms", &self.statement_timeout_ms)
            .finish()
    }
}

/// Never prints the token.
impl std::fmt::Debug for Overrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overrides")
            .field("listen", &self.listen)
            .field("data_dir", &self.data_dir)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// `[store] pool_size` when the config does not say.
pub const DEFAULT_POOL_SIZE: usize = 8;
/// `[store] statement_timeout` when the config does not say.
pub const DEFAULT_STATEMENT_TIMEOUT_MS: u64 = 30_000;

fn database(
    st: &StoreFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<DatabaseConfig>, ConfigError> {
    let Some(url) = st.url.as_deref().filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(invalid(
            "store.url",
            format!(
                "{:?} is not a PostgreSQL URL; write it as postgres://user@host:5432/database",
                crate::store::pg::redact(url)
            ),
        ));
    }
    let pool_size = match st.pool_size {
        None => DEFAULT_POOL_SIZE,
        Some(n @ 1..=1024) => n as usize,
        Some(_) => return Err(invalid("store.pool_size", "must be between 1 and 1024")),
    };
    let statement_timeout_ms = positive_ms(
        "store.statement_timeout",
        &st.statement_timeout,
        DEFAULT_STATEMENT_TIMEOUT_MS,
    )?;
    // Each session's statement_timeout on PostgreSQL, an int of ms: beyond it the start
    // failed naming PostgreSQL's parameter, not this key.
    if statement_timeout_ms > cluster::PG_MS_MAX {
        return Err(invalid(
            "store.statement_timeout",
            format!(
                "at most {} ms (~24.8 days), PostgreSQL's limit for statement_timeout",
                cluster::PG_MS_MAX
            ),
        ));
    }
    let password = ["HERALD_STORE_PASSWORD", "PGPASSWORD"]
        .iter()
        .find_map(|v| env(v).filter(|p| !p.is_empty()));
    Ok(Some(DatabaseConfig {
        url: url.to_string(),
        password,
        pool_size,
        statement_timeout_ms,
    }))
}

/// `[limits]`: the documented defaults of API.md, adjustable.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    body_bytes_max: Option<usize>,
    messages_max: Option<usize>,
    message_body_bytes_max: Option<usize>,
    live_tasks_max: Option<usize>,
    horizon: Option<String>,
    /// HTTP connections served at once (default: from the descriptor limit; see `api::conns`).
    connections_max: Option<usize>,
    body_read_timeout: Option<String>,
    header_read_timeout: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct AlertsFile {
    channel: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelFile {
    kind: String,
    url: Option<String>,
    ca_file: Option<PathBuf>,
    path: Option<PathBuf>,
    timeout: Option<String>,
    connect_timeout: Option<String>,
    concurrency: Option<u32>,
    retry: Option<RetryRequest>,
    secret: Option<String>,
    secrets: Option<Vec<String>>,
    rate: Option<String>,
    breaker: Option<toml::Table>,
    // Platform channels (API.md, "Platform channels"): see `deliver::platform`.
    preset: Option<String>,
    method: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    body: Option<String>,
    success: Option<SuccessKeys>,
    retry_codes: Option<Vec<i64>>,
    retry_after_json: Option<String>,
    token: Option<TokenKeys>,
    sign: Option<String>,
    vars: Option<toml::Table>,
    answer_timeout: Option<String>,
    answer_bytes_max: Option<usize>,
    /// A daily window in which no send of the channel starts (a task's own wins).
    quiet_hours: Option<crate::request::QuietHoursRequest>,
}

/// Where a channel sends.
#[derive(Clone, PartialEq)]
pub enum ChannelKind {
    Log,
    File {
        path: PathBuf,
    },
    Webhook {
        url: hyper::Uri,
        /// Whole attempt: connect, send, read the answer.
        timeout_ms: u64,
        connect_timeout_ms: u64,
        /// `ca_file`, if given: its PEM CA certificates, trusted besides the webpki roots.
        ca_file: Option<PathBuf>,
        ca_certs: Vec<rustls::pki_types::CertificateDer<'static>>,
        /// Signing secrets, newest first (empty: unsigned). Standard Webhooks unless the
        /// platform settings choose another signer.
        secrets: Vec<String>,
        /// Templates, success rule, token, signer (`None`: herald's own body, 2xx = sent).
        platform: Option<Box<PlatformSpec>>,
    },
}

/// Never prints a secret: a webhook's URL as `scheme://host[:port]` (its path and query may
/// hold a key), its secrets and CA certificates as counts.
impl std::fmt::Debug for ChannelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelKind::Log => f.write_str("Log"),
            ChannelKind::File { path } => f.debug_struct("File").field("path", path).finish(),
            ChannelKind::Webhook {
                url,
                timeout_ms,
                connect_timeout_ms,
                ca_file,
                ca_certs,
                secrets,
                platform,
            } => f
                .debug_struct("Webhook")
                .field("url", &crate::logsafe::UriOrigin(url))
                .field("timeout_ms", timeout_ms)
                .field("connect_timeout_ms", connect_timeout_ms)
                .field("ca_file", ca_file)
                .field("ca_certs", &ca_certs.len())
                .field("secrets", &secrets.len())
                .field("platform", platform)
                .finish(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChannelConfig {
    pub name: String,
    pub kind: ChannelKind,
    pub retry: RetryPolicy,
    pub concurrency: u32,
    pub rate: Option<Rate>,
    pub breaker: Option<BreakerConfig>,
    /// `quiet_hours = {from, to, tz}`: sends of tasks without their own wait for its end.
    pub quiet_hours: Option<crate::schedule::quiet::QuietHours>,
}

#[derive(Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub token: Option<String>,
    pub channels: Vec<ChannelConfig>,
    pub limits: Limits,
    pub body_bytes_max: usize,
    /// Channel that alert events are also delivered to.
    pub alerts_channel: Option<String>,
    pub store: crate::store::StoreOptions,
    /// `[store] url`: PostgreSQL instead of the embedded store in `data_dir`.
    pub database: Option<DatabaseConfig>,
    /// How long a drain waits for sends in flight (`shutdown_timeout`).
    pub shutdown_timeout_ms: u64,
    /// HTTP connections served at once; `None`: derived from the descriptor limit at start.
    pub connections_max: Option<usize>,
    pub body_read_timeout_ms: u64,
    pub header_read_timeout_ms: u64,
    /// `[telemetry] otlp_endpoint`: where spans are exported over OTLP/HTTP; `None`: not at all.
    pub otlp_endpoint: Option<String>,
    /// `[cluster]`: this node is one of several on the database (HA.md); `None`: alone.
    pub cluster: Option<ClusterConfig>,
}

/// Never prints the API token (or a channel's secrets: see [`ChannelKind`]'s).
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("data_dir", &self.data_dir)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("channels", &self.channels)
            .field("limits", &self.limits)
            .field("body_bytes_max", &self.body_bytes_max)
            .field("alerts_channel", &self.alerts_channel)
            .field("store", &self.store)
            .field("database", &self.database)
            .field("shutdown_timeout_ms", &self.shutdown_timeout_ms)
            .field("connections_max", &self.connections_max)
            .field("body_read_timeout_ms", &self.body_read_timeout_ms)
            .field("header_read_timeout_ms", &self.header_read_timeout_ms)
            .field("otlp_endpoint", &self.otlp_endpoint)
            .field("cluster", &self.cluster)
            .finish()
    }
}

/// Overrides from the command line and environment.
#[derive(Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub token: Option<String>,
}

impl Config {
    /// The embedded defaults.
    #[allow(
        clippy::expect_used,
        reason = "no input: the defaults are constants, and the unit tests build them"
    )]
    pub fn defaults() -> Config {
        Config::from_parts(FileConfig::default(), Overrides::default(), &process_env)
            .expect("the embedded defaults are valid")
    }

    /// Reads the config file (if any), then the `HERALD_*` variables of [`ENV_KEYS`] from the
    /// process environment, and applies the overrides.
    pub fn load(path: Option<&Path>, overrides: Overrides) -> Result<Config, ConfigError> {
        Config::load_with_env(path, overrides, &process_env)
    }

    /// Like [`Config::load`], with the environment (the `HERALD_*` keys and `${VAR}`) looked up
    /// by `env` (tests).
    pub fn load_with_env(
        path: Option<&Path>,
        overrides: Overrides,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let (text, name) = match path {
            Some(p) => (
                std::fs::read_to_string(p).map_err(|error| ConfigError::Read {
                    path: p.display().to_string(),
                    error,
                })?,
                p.display().to_string(),
            ),
            None => (String::new(), "<defaults>".to_string()),
        };
        // Parsed on its own first, so a mistake in the file is reported with its line.
        let mut file = Config::parse_file(&text, &name)?;
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: name.clone(),
            message: e.to_string(),
        })?;
        let applied = env::apply(&mut table, ENV_KEYS, env)?;
        // Said once at start: a variable that changes nothing would otherwise puzzle whoever
        // set it (the image's and the unit's defaults are such variables under a mounted file).
        for v in &applied.shadowed {
            tracing::info!(variable = %v, file = %name, "the config file sets this key; the variable is not used");
        }
        if applied.set > 0 {
            file = toml::Value::Table(table)
                .try_into::<FileConfig>()
                .map_err(|e| ConfigError::Parse {
                    path: format!("{name} with the HERALD_* environment"),
                    message: e.to_string(),
                })?;
        }
        Config::from_parts(file, overrides, env)
    }

    /// Parses config text (used by `load` and by tests).
    pub fn from_toml(text: &str, overrides: Overrides) -> Result<Config, ConfigError> {
        Config::from_parts(
            Config::parse_file(text, "<inline>")?,
            overrides,
            &process_env,
        )
    }

    /// Like [`Config::from_toml`], with `${VAR}` looked up by `env` instead of in the process
    /// environment (tests; embedding).
    pub fn from_toml_with_env(
        text: &str,
        overrides: Overrides,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Config::from_parts(Config::parse_file(text, "<inline>")?, overrides, env)
    }

    fn parse_file(text: &str, path: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_string(),
            message: e.to_string(),
        })
    }

    fn from_parts(
        file: FileConfig,
        o: Overrides,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let HttpLimits {
            limits,
            body_bytes_max,
            connections_max,
            body_read_timeout_ms,
            header_read_timeout_ms,
        } = http_limits(file.limits.as_ref())?;
        let shutdown_timeout_ms = positive_ms(
            "shutdown_timeout",
            &file.shutdown_timeout,
            DEFAULT_SHUTDOWN_TIMEOUT_MS,
        )?;
        let (listen_key, listen_text) = match (&o.listen, &file.listen) {
            (Some(l), _) => ("--listen", l.clone()),
            (None, Some(l)) => ("listen", l.clone()),
            (None, None) => ("listen", DEFAULT_LISTEN.to_string()),
        };
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            invalid(
                listen_key,
                format!("{listen_text:?} is not an address like 127.0.0.1:7700"),
            )
        })?;
        let token = o.token.or(file.token).filter(|t| !t.is_empty());
        check_token(token.as_deref(), listen, listen_key)?;
        let data_dir = o
            .data_dir
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let channels = channels(file.channels, &limits, env)?;
        let alerts_channel = match file.alerts {
            Some(a) => {
                if !channels.iter().any(|c| c.name == a.channel) {
                    return Err(invalid(
                        "alerts.channel",
                        format!(
                            "unknown channel {:?}; configure it under [channels.{}]",
                            a.channel, a.channel
                        ),
                    ));
                }
                Some(a.channel)
            }
            None => None,
        };
        let (store, database_config) = match &file.store {
            Some(st) => {
                let database = database(st, env)?;
                (store_options(st)?, database)
            }
            None => (crate::store::StoreOptions::default(), None),
        };
        let otlp_endpoint = otlp_endpoint(file.telemetry, env)?;
        Ok(Config {
            cluster: cluster::cluster(file.cluster.as_ref(), database_config.is_some(), listen)?,
            listen,
            data_dir,
            token,
            channels,
            limits,
            body_bytes_max,
            alerts_channel,
            store,
            database: database_config,
            shutdown_timeout_ms,
            connections_max,
            body_read_timeout_ms,
            header_read_timeout_ms,
            otlp_endpoint,
        })
    }
}

/// The HTTP and task limits of `[limits]`, each checked.
struct HttpLimits {
    limits: Limits,
    body_bytes_max: usize,
    connections_max: Option<usize>,
    body_read_timeout_ms: u64,
    header_read_timeout_ms: u64,
}

fn http_limits(file: Option<&LimitsFile>) -> Result<HttpLimits, ConfigError> {
    let mut limits = Limits::default();
    let mut body_bytes_max = BODY_BYTES_MAX;
    let mut connections_max = None;
    let mut body_read_timeout_ms = DEFAULT_BODY_READ_TIMEOUT_MS;
    let mut header_read_timeout_ms = DEFAULT_HEADER_READ_TIMEOUT_MS;
    if let Some(l) = file {
        let positive = |key: &str, v: Option<usize>, current: usize| match v {
            Some(0) => Err(invalid(format!("limits.{key}"), "must be more than 0")),
            Some(n) => Ok(n),
            None => Ok(current),
        };
        body_bytes_max = positive("body_bytes_max", l.body_bytes_max, body_bytes_max)
            .and_then(|v| storable("body_bytes_max", v, REQUEST_BODY_BYTES_STORABLE))?;
        limits.messages_max = positive("messages_max", l.messages_max, limits.messages_max)?;
        limits.message_body_bytes_max = positive(
            "message_body_bytes_max",
            l.message_body_bytes_max,
            limits.message_body_bytes_max,
        )
        .and_then(|v| storable("message_body_bytes_max", v, MESSAGE_BODY_BYTES_STORABLE))?;
        limits.live_tasks_max =
            positive("live_tasks_max", l.live_tasks_max, limits.live_tasks_max)?;
        // 0 would refuse every scheduled create: refused here instead.
        limits.horizon_ms = positive_ms("limits.horizon", &l.horizon, limits.horizon_ms)?;
        connections_max = match l.connections_max {
            Some(0) => return Err(invalid("limits.connections_max", "must be more than 0")),
            v => v,
        };
        body_read_timeout_ms = positive_ms(
            "limits.body_read_timeout",
            &l.body_read_timeout,
            body_read_timeout_ms,
        )?;
        header_read_timeout_ms = positive_ms(
            "limits.header_read_timeout",
            &l.header_read_timeout,
            header_read_timeout_ms,
        )?;
    }
    Ok(HttpLimits {
        limits,
        body_bytes_max,
        connections_max,
        body_read_timeout_ms,
        header_read_timeout_ms,
    })
}

/// `limits.{key}` at most `max`, the size the store can hold (see the constants).
fn storable(key: &str, v: usize, max: usize) -> Result<usize, ConfigError> {
    if v > max {
        return Err(invalid(
            format!("limits.{key}"),
            format!("must be at most {max} bytes: a larger one could not be stored and read back"),
        ));
    }
    Ok(v)
}

/// The configured channels, and `log` when none is named so.
fn channels(
    file: BTreeMap<String, ChannelFile>,
    limits: &Limits,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ChannelConfig>, ConfigError> {
    let mut channels = Vec::new();
    for (name, c) in file {
        channels.push(channel(&name, c, limits, env)?);
    }
    if !channels.iter().any(|c| c.name == "log") {
        channels.push(ChannelConfig {
            name: "log".into(),
            kind: ChannelKind::Log,
            retry: RetryPolicy::default(),
            concurrency: 64,
            rate: None,
            breaker: None,
            quiet_hours: None,
        });
    }
    Ok(channels)
}

/// `[store]` but its database: cache, retention and the bounds.
fn store_options(st: &StoreFile) -> Result<crate::store::StoreOptions, ConfigError> {
    let mut store = crate::store::StoreOptions::default();
    match st.cache_mb {
        Some(0) => return Err(invalid("store.cache_mb", "must be more than 0")),
        Some(mb) if mb > 1 << 20 => {
            return Err(invalid("store.cache_mb", "must be at most 1048576 (1 TiB)"))
        }
        Some(mb) => store.cache_bytes = mb << 20,
        None => {}
    }
    if let Some(r) = &st.retention {
        store.retention_ms = parse_retention(r).map_err(|e| invalid("store.retention", e))?;
    }
    match st.runs_max {
        Some(0) => return Err(invalid("store.runs_max", "must be at least 1")),
        Some(n) => {
            store.runs_max = u32::try_from(n)
                .map_err(|_| invalid("store.runs_max", "must be at most 4294967295"))?
        }
        None => {}
    }
    if let Some(n) = st.timeline_max {
        store.timeline_max = u32::try_from(n)
            .map_err(|_| invalid("store.timeline_max", "must be at most 4294967295"))?;
    }
    match st.failures_max {
        Some(0) => return Err(invalid("store.failures_max", "must be at least 1")),
        Some(n) => store.failures_max = n,
        None => {}
    }
    Ok(store)
}

/// The OTLP collector's endpoint, if one is given.
fn otlp_endpoint(
    telemetry: Option<TelemetryFile>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    // `HERALD_OTLP_ENDPOINT` is the short name API.md gives (the table's own variable,
    // `HERALD_TELEMETRY_OTLP_ENDPOINT`, was merged into the file's table already).
    Ok(
        match telemetry
            .and_then(|t| t.otlp_endpoint)
            .or_else(|| env("HERALD_OTLP_ENDPOINT"))
        {
            Some(e) if e.trim().is_empty() => None,
            Some(e) => {
                crate::trace::otlp::check_endpoint(&e)
                    .map_err(|m| invalid("telemetry.otlp_endpoint", m))?;
                Some(e)
            }
            None => None,
        },
    )
}

/// A duration key that must be more than 0.
fn positive_ms(key: &str, v: &Option<String>, default: u64) -> Result<u64, ConfigError> {
    match v {
        Some(t) => match parse_duration_ms(t).map_err(|e| invalid(key, e))? {
            0 => Err(invalid(key, "must be more than 0")),
            ms => Ok(ms),
        },
        None => Ok(default),
    }
}

/// A public API needs a token worth the name: anyone who can reach the port could otherwise
/// guess it. HTTP trims header values, so a token with whitespace at either end (or a control
/// character) could never be sent back: refused on any address.
fn check_token(
    token: Option<&str>,
    listen: SocketAddr,
    listen_key: &str,
) -> Result<(), ConfigError> {
    let public = !listen.ip().is_loopback();
    let Some(t) = token else {
        if public {
            return Err(invalid(
                listen_key,
                format!("refusing to listen on non-loopback {listen} without a token (set HERALD_TOKEN or token)"),
            ));
        }
        return Ok(());
    };
    if t.trim() != t || t.chars().any(char::is_control) {
        return Err(invalid(
            "token",
            "must not start or end with whitespace or contain control characters",
        ));
    }
    if public && t.chars().count() < TOKEN_CHARS_MIN {
        return Err(invalid(
            "token",
            format!(
                "{} characters is too short for non-loopback {listen}: use at least {TOKEN_CHARS_MIN} (e.g. `openssl rand -hex 24`)",
                t.chars().count()
            ),
        ));
    }
    Ok(())
}

/// `[store] retention`: a duration (at least 1s), or `"off"` / `"0"` for never.
fn parse_retention(s: &str) -> Result<Option<u64>, String> {
    match s.trim() {
        "off" | "0" => Ok(None),
        t => match parse_duration_ms(t)? {
            ms if ms < 1_000 => Err(format!(
                "{t:?} is shorter than 1s; use \"off\" to keep finished tasks forever"
            )),
            ms => Ok(Some(ms)),
        },
    }
}

/// `${VAR}` from the process environment.
fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// A channel's signing secrets (`secret` or `secrets`), `${VAR}`s expanded.
fn channel_secrets(
    secret: Option<String>,
    secrets: Option<Vec<String>>,
    key: &dyn Fn(&str) -> String,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, ConfigError> {
    let (secret_key, secrets) = match (secret, secrets) {
        (Some(_), Some(_)) => {
            return Err(invalid(key("secrets"), "give secret or secrets, not both"))
        }
        (Some(one), None) => ("secret", vec![one]),
        (None, Some(list)) => ("secrets", list),
        (None, None) => ("secrets", vec![]),
    };
    secrets
        .iter()
        .map(|s| expand_env(s, env))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(key(secret_key), e))
}

/// What a webhook channel's own keys need besides the channel file.
struct Webhook<'a> {
    key: &'a dyn Fn(&str) -> String,
    keys: &'a PlatformKeys,
    /// A platform key was given (a preset or a template): the channel is a platform channel.
    platform: bool,
    sign_explicit: bool,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Webhook<'_> {
    /// The webhook's URL checked, its platform spec built and its CA file read.
    fn kind(
        self,
        secrets: Vec<String>,
        (timeout_ms, connect_timeout_ms): (u64, u64),
        ca_file: Option<PathBuf>,
    ) -> Result<ChannelKind, ConfigError> {
        let key = self.key;
        let env = self.env;
        let raw = self
            .keys
            .url
            .clone()
            .ok_or_else(|| invalid(key("url"), "required for kind = \"webhook\""))?;
        let url = expand_env(&raw, env).map_err(|e| invalid(key("url"), e))?;
        let shown = if raw.contains("${") { &raw } else { &url };
        let uri = if self.platform {
            // Checked with the URL as written: the error must not show a secret.
            crate::deliver::platform::check_url(&url).map_err(|e| {
                invalid(
                    key("url"),
                    format!(
                        "{shown:?}: {}",
                        crate::deliver::platform::url_error_unechoed(&e)
                    ),
                )
            })?
        } else {
            let uri: hyper::Uri = url
                .parse()
                .map_err(|e| invalid(key("url"), format!("{shown:?} is not a URL: {e}")))?;
            if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
                return Err(invalid(
                    key("url"),
                    format!("{shown:?}: only http(s)://host[:port]/path URLs are supported"),
                ));
            }
            uri
        };
        let platform = if self.platform {
            Some(Box::new(
                PlatformSpec::build(self.keys, &url, &secrets, self.sign_explicit, env)
                    .map_err(|(k, m)| invalid(key(&k), m))?,
            ))
        } else {
            None
        };
        let standard = platform
            .as_ref()
            .is_none_or(|p| p.sign == SignKind::StandardWebhooks);
        if !secrets.is_empty() && standard {
            Signer::new(&secrets).map_err(|e| invalid(key("secrets"), e))?;
        }
        // A platform's signature (DingTalk, Feishu) with an empty secret fails every send at
        // the platform: refused here, as Standard Webhooks' empty secret is.
        if !standard && secrets.iter().any(String::is_empty) {
            return Err(invalid(
                key("secret"),
                "is empty (is the environment variable it names set?): the platform's signature needs its secret",
            ));
        }
        let ca_certs = match &ca_file {
            Some(path) => crate::deliver::webhook::load_ca_file(path)
                .map_err(|e| invalid(key("ca_file"), e))?,
            None => Vec::new(),
        };
        Ok(ChannelKind::Webhook {
            url: uri,
            timeout_ms,
            connect_timeout_ms,
            ca_file,
            ca_certs,
            secrets,
            platform,
        })
    }
}

/// The platform keys of a channel file (taken out of it: the rest reads the other keys).
fn platform_keys(c: &mut ChannelFile) -> PlatformKeys {
    PlatformKeys {
        preset: c.preset.take(),
        url: c.url.take(),
        rate: c.rate.take(),
        method: c.method.take(),
        headers: c.headers.take(),
        body: c.body.take(),
        success: c.success.take(),
        retry_codes: c.retry_codes.take(),
        retry_after_json: c.retry_after_json.take(),
        token: c.token.take(),
        sign: c.sign.take(),
        vars: c.vars.take(),
        answer_timeout: c.answer_timeout.take(),
        answer_bytes_max: c.answer_bytes_max.take(),
    }
}

/// What a channel sends to: the log, a file, or a webhook.
fn channel_kind(
    kind: &str,
    path: Option<PathBuf>,
    webhook: Webhook<'_>,
    webhook_parts: (Vec<String>, (u64, u64), Option<PathBuf>),
) -> Result<ChannelKind, ConfigError> {
    let key = webhook.key;
    Ok(match kind {
        "log" => ChannelKind::Log,
        "file" => ChannelKind::File {
            path: path.ok_or_else(|| invalid(key("path"), "required for kind = \"file\""))?,
        },
        "webhook" => {
            let (secrets, timing, ca_file) = webhook_parts;
            webhook.kind(secrets, timing, ca_file)?
        }
        other => {
            return Err(invalid(
                key("kind"),
                format!("unknown kind {other:?}; expected webhook, log or file"),
            ))
        }
    })
}

/// Refuses the first webhook key (in `given`, with whether it was given) on another kind.
fn webhook_only(given: &[(&str, bool)], key: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
    match given.iter().find(|(_, g)| *g) {
        Some((k, _)) => Err(invalid(key(k), "only for kind = \"webhook\"")),
        None => Ok(()),
    }
}

/// A channel's quiet hours, read like a task's.
fn channel_quiet(
    quiet: Option<crate::request::QuietHoursRequest>,
    key: &dyn Fn(&str) -> String,
) -> Result<Option<crate::model::QuietHours>, ConfigError> {
    match crate::request::validate_quiet(&Some(quiet)) {
        Ok(crate::model::QuietSetting::Own(q)) => Ok(Some(q)),
        Ok(_) => Ok(None),
        Err(e) => Err(invalid(key(&e.field), e.detail)),
    }
}

/// What a channel name may hold.
const CHANNEL_NAMES: &str = "channel names use A-Z a-z 0-9 . _ : -";

/// A channel's `concurrency`: given, or the default of its kind; 1 to 10 000.
fn concurrency(
    given: Option<u32>,
    kind: &str,
    key: &dyn Fn(&str) -> String,
) -> Result<u32, ConfigError> {
    let n = given.unwrap_or(if kind == "webhook" {
        DEFAULT_CONCURRENCY
    } else {
        LOCAL_CONCURRENCY
    });
    if n == 0 || n > 10_000 {
        return Err(invalid(key("concurrency"), "must be between 1 and 10000"));
    }
    Ok(n)
}

/// A send starts no token fetch with less than `FETCH_BUDGET_MIN` of its attempt left, and an
/// early refresh takes at most half of it: on a channel with a `token` a shorter attempt would
/// never fetch one.
fn token_timeout(
    token: bool,
    timeout_ms: u64,
    key: &dyn Fn(&str) -> String,
) -> Result<(), ConfigError> {
    let token_min_ms = 2 * crate::deliver::token::FETCH_BUDGET_MIN.as_millis() as u64;
    if token && timeout_ms < token_min_ms {
        return Err(invalid(
            key("timeout"),
            format!("must be at least {token_min_ms}ms on a channel with a `token` (the attempt includes fetching it)"),
        ));
    }
    Ok(())
}

fn channel(
    name: &str,
    mut c: ChannelFile,
    limits: &Limits,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ChannelConfig, ConfigError> {
    let key = |k: &str| format!("channels.{name}.{k}");
    if crate::model::check_id(name).is_err() {
        return Err(invalid(format!("channels.{name}"), CHANNEL_NAMES));
    }
    let user = platform_keys(&mut c);
    let platform_key = uses_platform(&user);
    if let (Some(k), false) = (platform_key, c.kind == "webhook") {
        return Err(invalid(key(k), "only for kind = \"webhook\""));
    }
    let sign_explicit = user.sign.is_some();
    let keys = resolve_preset(user).map_err(|(k, m)| invalid(key(&k), m))?;
    let timeout_ms = positive_ms(&key("timeout"), &c.timeout, DEFAULT_TIMEOUT_MS)?;
    token_timeout(keys.token.is_some(), timeout_ms, &key)?;
    let connect_timeout_ms = positive_ms(
        &key("connect_timeout"),
        &c.connect_timeout,
        timeout_ms.min(DEFAULT_CONNECT_TIMEOUT_MS),
    )?;
    let rate = keys
        .rate
        .as_deref()
        .map(parse_rate)
        .transpose()
        .map_err(|e| invalid(key("rate"), e))?;
    let breaker = c
        .breaker
        .as_ref()
        .map(parse_breaker)
        .transpose()
        .map_err(|e| invalid(key("breaker"), e))?;
    let secrets = channel_secrets(c.secret, c.secrets, &key, env)?;
    let concurrency = concurrency(c.concurrency, &c.kind, &key)?;
    let retry = match c.retry {
        Some(r) => {
            validate_retry(r, &key("retry"), limits).map_err(|e| invalid(e.field, e.detail))?
        }
        None => RetryPolicy::default(),
    };
    if c.kind != "webhook" {
        let given = [
            ("secret", !secrets.is_empty()),
            ("url", keys.url.is_some()),
            ("ca_file", c.ca_file.is_some()),
        ];
        webhook_only(&given, &key)?;
    }
    let kind = channel_kind(
        &c.kind,
        c.path.take(),
        Webhook {
            key: &key,
            keys: &keys,
            platform: platform_key.is_some(),
            sign_explicit,
            env,
        },
        (secrets, (timeout_ms, connect_timeout_ms), c.ca_file.take()),
    )?;
    let quiet_hours = channel_quiet(c.quiet_hours, &key)?;
    Ok(ChannelConfig {
        name: name.to_string(),
        kind,
        retry,
        concurrency,
        rate,
        breaker,
        quiet_hours,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = Config::defaults();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.data_dir, PathBuf::from("herald-data"));
        assert_eq!(c.channels.len(), 1);
        assert_eq!(c.channels[0].kind, ChannelKind::Log);
        assert_eq!(c.body_bytes_max, 1 << 20);
    }

    #[test]
    fn a_zero_horizon_is_refused_naming_it() {
        let e = Config::from_toml("[limits]\nhorizon = \"0s\"\n", Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("limits.horizon") && e.contains("more than 0"),
            "{e}"
        );
        let c = Config::from_toml("[limits]\nhorizon = \"30d\"\n", Overrides::default()).unwrap();
        assert_eq!(c.limits.horizon_ms, 30 * 86_400_000);
    }

    #[test]
    fn full_example_parses() {
        let c = Config::from_toml(
            r#"
listen = "127.0.0.1:7701"
data_dir = "d"
[channels.wechat]
kind = "webhook"
url = "http://127.0.0.1:9000/send"
timeout = "10s"
concurrency = 4
rate = "1/3s"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "old-secret"]
retry = { max_attempts = 4, backoff = "exponential", initial = "30s", max = "30m" }
breaker = { window = "60s", min_requests = 20, failure_ratio = 0.5, cool_down = "30s" }
[alerts]
channel = "audit"
[channels.audit]
kind = "file"
path = "d/sent.jsonl"
"#,
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.listen.port(), 7701);
        let w = c.channels.iter().find(|c| c.name == "wechat").unwrap();
        assert_eq!(w.retry.max_attempts, 4);
        assert_eq!(w.retry.initial_ms, 30_000);
        assert!(matches!(
            w.kind,
            ChannelKind::Webhook {
                timeout_ms: 10_000,
                connect_timeout_ms: 5_000,
                ..
            }
        ));
        assert_eq!(w.rate.map(|r| (r.count, r.period_ms)), Some((1, 3_000)));
        assert_eq!(w.breaker.map(|b| b.min_requests), Some(20));
        assert_eq!(c.alerts_channel.as_deref(), Some("audit"));
        assert!(c.channels.iter().any(|c| c.name == "log"));
    }

    #[test]
    fn https_urls_are_accepted() {
        let c = Config::from_toml(
            "[channels.w]\nkind = \"webhook\"\nurl = \"https://example.com/hook\"",
            Overrides::default(),
        )
        .unwrap();
        let w = c.channels.iter().find(|c| c.name == "w").unwrap();
        assert!(matches!(&w.kind, ChannelKind::Webhook { url, ca_certs, .. }
            if url.scheme_str() == Some("https") && ca_certs.is_empty()));
    }

    #[test]
    fn overrides_win() {
        let c = Config::from_toml(
            "listen = \"127.0.0.1:1\"",
            Overrides {
                listen: Some("127.0.0.1:2".into()),
                data_dir: Some("x".into()),
                token: None,
            },
        )
        .unwrap();
        assert_eq!(c.listen.port(), 2);
        assert_eq!(c.data_dir, PathBuf::from("x"));
    }

    fn err(text: &str) -> String {
        Config::from_toml(text, Overrides::default())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn store_url_selects_postgres_and_never_shows_its_password() {
        assert!(
            Config::defaults().database.is_none(),
            "sled stays the default"
        );
        let env = |n: &str| (n == "PGPASSWORD").then(|| "from-env".to_string());
        let c = Config::from_toml_with_env(
            "[store]\nurl = \"postgres://herald:s3cret@db:5432/herald\"\npool_size = 3\nstatement_timeout = \"2s\"",
            Overrides::default(),
            &env,
        )
        .unwrap();
        let db = c.database.clone().unwrap();
        assert_eq!((db.pool_size, db.statement_timeout_ms), (3, 2_000));
        assert_eq!(db.password.as_deref(), Some("from-env"));
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("from-env"),
            "{shown}"
        );
        // Nor the API token, a channel's secrets or a key in its URL.
        let c = Config::from_toml(
            "token = \"T0K\"\n[channels.w]\nkind = \"webhook\"\nurl = \"https://gw.example:8443/hook/P4TH?key=K3Y\"\nsecret = \"S3C\"",
            Overrides::default(),
        )
        .unwrap();
        let shown = format!("{c:?}");
        for secret in ["T0K", "S3C", "K3Y", "P4TH"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("https://gw.example:8443"), "{shown}");
        let o = Overrides {
            token: Some("T0K".into()),
            ..Overrides::default()
        };
        assert!(!format!("{o:?}").contains("T0K"));
        let e = err("[store]\nurl = \"mysql://u:s3cret@db/x\"");
        assert!(e.starts_with("store.url:") && !e.contains("s3cret"), "{e}");
        assert!(err("[store]\nurl = \"postgres://db/x\"\npool_size = 0")
            .starts_with("store.pool_size:"));
        assert!(
            err("[store]\nurl = \"postgres://db/x\"\nstatement_timeout = \"0s\"")
                .starts_with("store.statement_timeout:")
        );
        // PostgreSQL takes it as an int of ms: 2^31 - 1 at most (~24.8 days).
        let e = err("[store]\nurl = \"postgres://db/x\"\nstatement_timeout = \"25d\"");
        assert!(e.starts_with("store.statement_timeout:"), "{e}");
        let c = Config::from_toml(
            "[store]\nurl = \"postgres://db/x\"\nstatement_timeout = \"2147483647ms\"",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.database.unwrap().statement_timeout_ms, 2_147_483_647);
    }

    #[test]
    fn errors_name_the_key() {
        assert!(err("[channels.w]\nkind = \"webhook\"").starts_with("channels.w.url:"));
        assert!(err("[channels.w]\nkind = \"webhook\"\nurl = \"ftp://x\"")
            .starts_with("channels.w.url:"));
        assert!(err("[channels.w]\nkind = \"pigeon\"").starts_with("channels.w.kind:"));
        assert!(err("[channels.w]\nkind = \"log\"\ntimeout = \"3 s\"")
            .starts_with("channels.w.timeout:"));
        assert!(err("[channels.w]\nkind = \"log\"\nrate = \"3s\"").starts_with("channels.w.rate:"));
        assert!(
            err("[channels.w]\nkind = \"log\"\nbreaker = { failure_ratio = 2.0 }")
                .starts_with("channels.w.breaker:")
        );
        assert!(err("[channels.w]\nkind = \"log\"\nsecret = \"whsec_x\"")
            .starts_with("channels.w.secret:"));
        assert!(err(
            "[channels.w]\nkind = \"webhook\"\nurl = \"http://h/\"\nsecret = \"whsec_!!\""
        )
        .starts_with("channels.w.secrets:"));
        assert!(err(
            "[channels.w]\nkind = \"webhook\"\nurl = \"https://h/\"\nca_file = \"/nonexistent/ca.pem\""
        )
        .starts_with("channels.w.ca_file:"));
        assert!(err("[channels.w]\nkind = \"log\"\nca_file = \"ca.pem\"")
            .starts_with("channels.w.ca_file:"));
        assert!(err("[alerts]\nchannel = \"ops\"").starts_with("alerts.channel:"));
        assert!(
            err("[channels.w]\nkind = \"log\"\nretry = { max_attempts = 0 }")
                .starts_with("channels.w.retry.max_attempts:")
        );
        assert!(err("listen = \"0.0.0.0:7700\"").starts_with("listen:"));
        assert!(err("colour = 1").contains("unknown field"));
        assert!(err("[channels.w]\nkind = \"file\"").starts_with("channels.w.path:"));
    }

    fn env(name: &str) -> Option<String> {
        match name {
            "WECOM_KEY" => Some("k-123".into()),
            "DT_SECRET" => Some("SECabc".into()),
            _ => None,
        }
    }

    fn platform_err(text: &str) -> String {
        Config::from_toml_with_env(text, Overrides::default(), &env)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn platform_channels_parse_with_presets_and_env() {
        let c = Config::from_toml_with_env(
            r#"
[channels.team]
kind = "webhook"
preset = "wecom-robot"
url = "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=${WECOM_KEY}"
headers = { "X-Trace" = "{{ idempotency_key }}" }
success = { message = "/errmsg" }
[channels.ding]
kind = "webhook"
preset = "dingtalk-robot"
url = "https://oapi.dingtalk.com/robot/send?access_token=t"
secret = "${DT_SECRET}"
"#,
            Overrides::default(),
            &env,
        )
        .unwrap();
        let team = c.channels.iter().find(|c| c.name == "team").unwrap();
        assert_eq!(
            team.rate.map(|r| (r.count, r.period_ms)),
            Some((20, 60_000))
        );
        let ChannelKind::Webhook {
            platform: Some(p),
            url,
            ..
        } = &team.kind
        else {
            panic!("{:?}", team.kind)
        };
        assert_eq!(
            p.url,
            "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k-123"
        );
        assert_eq!(url.host(), Some("qyapi.weixin.qq.com"));
        assert_eq!(p.success.retry_codes, vec![-1, 45009, 45033]);
        assert_eq!(
            p.success.json.as_ref().map(|j| j.pointer.as_str()),
            Some("/errcode")
        );
        assert!(!format!("{p:?}").contains("k-123"), "Debug hides secrets");
        let ding = c.channels.iter().find(|c| c.name == "ding").unwrap();
        let ChannelKind::Webhook {
            platform: Some(p),
            secrets,
            ..
        } = &ding.kind
        else {
            panic!()
        };
        assert_eq!(p.sign, SignKind::DingTalk);
        assert_eq!(secrets, &vec!["SECabc".to_string()]);
    }

    #[test]
    fn platform_errors_name_the_key() {
        let base = "[channels.team]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/x\"\n";
        let cases = [
            (
                "preset = \"wechat\"",
                "channels.team.preset: unknown preset \"wechat\"",
            ),
            (
                "body = '{{ body | tojson '",
                "channels.team.body: syntax error",
            ),
            (
                "body = '{{ bdy }}'",
                "channels.team.body: unknown variable bdy",
            ),
            (
                "body = '{{ body | tojsn }}'",
                "channels.team.body: unknown filter",
            ),
            (
                "headers = { \"X-A\" = \"{% if %}\" }",
                "channels.team.headers.x-a: syntax error",
            ),
            ("method = \"post me\"", "channels.team.method:"),
            (
                "success = { json = \"errcode\", equals = 0 }",
                "channels.team.success.json:",
            ),
            (
                "success = { json = \"/errcode\" }",
                "channels.team.success.equals: required",
            ),
            (
                "success = { status = \"2x\" }",
                "channels.team.success.status:",
            ),
            (
                "sign = \"dingtalk\"",
                "channels.team.secret: required by sign = \"dingtalk\"",
            ),
            ("sign = \"md5\"", "channels.team.sign: unknown signer"),
            (
                "sign = \"dingtalk\"\nsecret = \"\"",
                "channels.team.secret: is empty",
            ),
            (
                "token = { json = \"/access_token\" }",
                "channels.team.token.url: required",
            ),
            (
                "token = { url = \"http://h/t?s=${NOPE}\", json = \"/t\" }",
                "channels.team.token.url: environment variable NOPE is not set",
            ),
            (
                "preset = \"wecom-app\"\ntoken = { url = \"http://h/t\" }",
                "channels.team.vars.agentid: required",
            ),
            (
                "preset = \"wecom-app\"\nvars = { agentid = 1 }",
                "channels.team.token.url: environment variable WECOM_CORP_ID is not set",
            ),
            ("answer_timeout = \"0s\"", "channels.team.answer_timeout:"),
            (
                "token = { url = \"http://h/t\" }\ntimeout = \"20ms\"",
                "channels.team.timeout: must be at least 100ms on a channel with a `token`",
            ),
        ];
        for (extra, want) in cases {
            let e = platform_err(&format!("{base}{extra}"));
            assert!(e.starts_with(want), "{extra}: got {e:?}, want {want:?}");
        }
        let e = platform_err("[channels.t]\nkind = \"webhook\"\nurl = \"http://h/?k=${NOPE}\"");
        assert_eq!(e, "channels.t.url: environment variable NOPE is not set");
        let e = platform_err(
            "[channels.t]\nkind = \"webhook\"\nurl = \"https://{{ to }}/x\"\nbody = \"{}\"",
        );
        assert!(e.starts_with("channels.t.url:"), "{e}");
        // A template's own dot segment is named as such (it was the general URL shape's text).
        let e = platform_err(
            "[channels.t]\nkind = \"webhook\"\nurl = \"http://h/{{ to }}/../x\"\nbody = \"{}\"",
        );
        assert!(
            e.starts_with("channels.t.url:") && e.ends_with(crate::deliver::platform::DOT_SEGMENT),
            "{e}"
        );
        let e = platform_err("[channels.t]\nkind = \"log\"\npreset = \"slack-webhook\"");
        assert_eq!(e, "channels.t.preset: only for kind = \"webhook\"");
        // A secret from the environment never shows in an error.
        let e = platform_err("[channels.t]\nkind = \"webhook\"\nurl = \"ftp://h/${WECOM_KEY}\"");
        assert!(
            e.starts_with("channels.t.url:") && !e.contains("k-123"),
            "{e}"
        );
    }

    /// A message body the store could not read back once written (a task's only message is
    /// stored inside its spec, and a record past the decoder's limit answers "corrupt" for
    /// good) is refused at start, naming the key; so is a request body past what one log
    /// record frames.
    #[test]
    fn body_limits_the_store_cannot_hold_are_refused_naming_the_key() {
        let e = err("[limits]\nbody_bytes_max = 200000000\nmessage_body_bytes_max = 100000000");
        assert!(e.starts_with("limits.message_body_bytes_max:"), "{e}");
        let at = |key: &str, v: usize| format!("[limits]\n{key} = {v}");
        let c = Config::from_toml(
            &at("message_body_bytes_max", MESSAGE_BODY_BYTES_STORABLE),
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.limits.message_body_bytes_max, MESSAGE_BODY_BYTES_STORABLE);
        let e = err(&at(
            "message_body_bytes_max",
            MESSAGE_BODY_BYTES_STORABLE + 1,
        ));
        assert!(e.starts_with("limits.message_body_bytes_max:"), "{e}");
        assert!(e.contains(&MESSAGE_BODY_BYTES_STORABLE.to_string()), "{e}");
        assert!(Config::from_toml(
            &at("body_bytes_max", REQUEST_BODY_BYTES_STORABLE),
            Overrides::default()
        )
        .is_ok());
        let e = err(&at("body_bytes_max", REQUEST_BODY_BYTES_STORABLE + 1));
        assert!(e.starts_with("limits.body_bytes_max:"), "{e}");
    }

    #[test]
    fn limits_are_configurable() {
        let c = Config::from_toml(
            "[limits]\nbody_bytes_max = 2048\nmessages_max = 10\nhorizon = \"30d\"",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.body_bytes_max, 2048);
        assert_eq!(c.limits.messages_max, 10);
        assert_eq!(c.limits.horizon_ms, 30 * 86_400_000);
        assert!(err("[limits]\nmessages_max = 0").starts_with("limits.messages_max:"));
        assert!(err("[store]\ncache_mb = 0").starts_with("store.cache_mb:"));
        assert!(err("[store]\ncache = 5").contains("unknown field"));
        assert!(err("[store]\nretention = \"soon\"").starts_with("store.retention:"));
        assert!(err("[store]\nretention = \"10ms\"").starts_with("store.retention:"));
        let retention = |t: &str| {
            Config::from_toml(t, Overrides::default())
                .unwrap()
                .store
                .retention_ms
        };
        assert_eq!(retention(""), Some(7 * 86_400_000), "default 7d");
        assert_eq!(
            retention("[store]\nretention = \"36h\""),
            Some(36 * 3_600_000)
        );
        assert_eq!(retention("[store]\nretention = \"off\""), None);
        assert_eq!(retention("[store]\nretention = \"0\""), None);
        assert!(err("[limits]\nhorizon = \"soon\"").starts_with("limits.horizon:"));
    }

    #[test]
    fn public_listen_needs_a_token() {
        let c = Config::from_toml(
            "listen = \"0.0.0.0:7700\"\ntoken = \"s3cret-s3cret-s3cret\"",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.token.as_deref(), Some("s3cret-s3cret-s3cret"));
        // Short or blank tokens are refused for a public address, with the key named.
        for t in ["s3cret", "x", "                "] {
            let e = err(&format!("listen = \"0.0.0.0:7700\"\ntoken = \"{t}\""));
            assert!(e.starts_with("token:"), "{t:?}: {e}");
        }
        // On loopback a short token is the operator's choice; a padded one is never valid.
        assert!(Config::from_toml("token = \"x\"", Overrides::default()).is_ok());
        assert!(err("token = \" padded \"").starts_with("token:"));
    }

    #[test]
    fn every_key_of_the_env_table_is_read_from_its_variable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(&path, "[limits]\nhorizon = \"10d\"\n").unwrap();
        let env = |n: &str| -> Option<String> {
            Some(
                match n {
                    "HERALD_LISTEN" => "127.0.0.1:2",
                    "HERALD_DATA_DIR" => "from-env",
                    "HERALD_TOKEN" => "0123456789abcdef",
                    "HERALD_SHUTDOWN_TIMEOUT" => "2s",
                    "HERALD_LIMITS_MESSAGES_MAX" => "7",
                    "HERALD_LIMITS_CONNECTIONS_MAX" => "300",
                    "HERALD_LIMITS_BODY_READ_TIMEOUT" => "5s",
                    "HERALD_STORE_CACHE_MB" => "8",
                    _ => return None,
                }
                .to_string(),
            )
        };
        let c = Config::load_with_env(Some(&path), Overrides::default(), &env).unwrap();
        assert_eq!(
            c.listen.port(),
            2,
            "the environment fills what the file leaves out"
        );
        assert_eq!(c.data_dir, PathBuf::from("from-env"));
        assert_eq!(c.token.as_deref(), Some("0123456789abcdef"));
        assert_eq!(c.shutdown_timeout_ms, 2_000);
        assert_eq!(c.limits.messages_max, 7);
        assert_eq!(c.connections_max, Some(300));
        assert_eq!(c.body_read_timeout_ms, 5_000);
        assert_eq!(c.store.cache_bytes, 8 << 20);
        let flags = Overrides {
            listen: Some("127.0.0.1:3".into()),
            ..Overrides::default()
        };
        let c = Config::load_with_env(Some(&path), flags, &env).unwrap();
        assert_eq!(c.listen.port(), 3, "flags beat the environment");
        let bad = |n: &str| (n == "HERALD_LIMITS_MESSAGES_MAX").then(|| "many".to_string());
        let e = Config::load_with_env(Some(&path), Overrides::default(), &bad).unwrap_err();
        assert!(
            e.to_string().starts_with("HERALD_LIMITS_MESSAGES_MAX:"),
            "{e}"
        );
        let bad = |n: &str| (n == "HERALD_SHUTDOWN_TIMEOUT").then(|| "soon".to_string());
        let e = Config::load_with_env(Some(&path), Overrides::default(), &bad).unwrap_err();
        assert!(e.to_string().starts_with("shutdown_timeout:"), "{e}");
        // A key the file sets is the file's, whatever the variable says.
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:1\"\n[limits]\nmessages_max = 5\n",
        )
        .unwrap();
        let c = Config::load_with_env(Some(&path), Overrides::default(), &env).unwrap();
        assert_eq!(c.listen.port(), 1, "the file beats the environment");
        assert_eq!(c.limits.messages_max, 5);
        assert_eq!(
            c.data_dir,
            PathBuf::from("from-env"),
            "a key the file leaves out"
        );
        let flags = Overrides {
            listen: Some("127.0.0.1:3".into()),
            ..Overrides::default()
        };
        let c = Config::load_with_env(Some(&path), flags, &env).unwrap();
        assert_eq!(c.listen.port(), 3, "flags beat the file");
        // Every key of the table is one the file knows: its variable parses into the config.
        for (key, kind) in ENV_KEYS {
            let value = match (key, kind) {
                (_, Kind::Int) => "3",
                (&"listen", _) => "127.0.0.1:4",
                (&"alerts.channel", _) => "log",
                (&"token", _) => "0123456789abcdef",
                (&"data_dir", _) => "d",
                (&"store.url", _) => "postgres://herald@127.0.0.1:5432/herald",
                (&"telemetry.otlp_endpoint", _) => "http://127.0.0.1:4318",
                _ => "3s",
            };
            let name = var_name(key);
            let one = |n: &str| (n == name).then(|| value.to_string());
            Config::load_with_env(None, Overrides::default(), &one)
                .unwrap_or_else(|e| panic!("{name}={value}: {e}"));
        }
    }

    #[test]
    fn telemetry_and_timeline_keys_are_read_and_checked() {
        let c = Config::from_toml("", Overrides::default()).unwrap();
        assert_eq!((c.otlp_endpoint, c.store.timeline_max), (None, 10_000));
        let c = Config::from_toml(
            "[store]\ntimeline_max = 0\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.store.timeline_max, 0);
        assert_eq!(c.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318"));
        let e = Config::from_toml(
            "[telemetry]\notlp_endpoint = \"https://x\"",
            Overrides::default(),
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("telemetry.otlp_endpoint:"), "{e}");
        // An IPv6 literal without a port is taken as a host name or IPv4 address is; a
        // malformed one is refused naming the key.
        let c = Config::from_toml(
            "[telemetry]\notlp_endpoint = \"http://[::1]/v1/traces\"",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.otlp_endpoint.as_deref(), Some("http://[::1]/v1/traces"));
        let e = Config::from_toml(
            "[telemetry]\notlp_endpoint = \"http://[::1\"",
            Overrides::default(),
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("telemetry.otlp_endpoint:"), "{e}");
        assert!(e.to_string().contains("closing ']'"), "{e}");
        // API.md's short variable.
        let env = |n: &str| (n == "HERALD_OTLP_ENDPOINT").then(|| "http://c:4318".to_string());
        let c = Config::load_with_env(None, Overrides::default(), &env).unwrap();
        assert_eq!(c.otlp_endpoint.as_deref(), Some("http://c:4318"));
    }
}

//! Operator configuration: the TOML file of API.md, the environment (`HERALD_TOKEN`), and CLI
//! flags, in that order of increasing precedence, over embedded defaults (data in
//! `./herald-data`, listening on `127.0.0.1:7700`, one channel `log`).
//!
//! Errors name the key they are about (`channels.wechat.url: ...`). Settings that this version
//! does not implement yet are rejected by name rather than silently ignored, so an operator
//! never believes a rate limit is in force when it is not.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::model::request::{validate_retry, RetryRequest};
use crate::model::{parse_duration_ms, Limits, RetryPolicy};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7700";
pub const DEFAULT_DATA_DIR: &str = "herald-data";
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_CONCURRENCY: u32 = 4;
pub const BODY_BYTES_MAX: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
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

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    token: Option<String>,
    #[serde(default)]
    channels: BTreeMap<String, ChannelFile>,
    alerts: Option<toml::Table>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct ChannelFile {
    kind: String,
    url: Option<String>,
    path: Option<PathBuf>,
    timeout: Option<String>,
    concurrency: Option<u32>,
    retry: Option<RetryRequest>,
    // In API.md; implemented by a later version. Parsed so they can be refused by name.
    secret: Option<String>,
    secrets: Option<Vec<String>>,
    rate: Option<String>,
    breaker: Option<toml::Table>,
}

/// Where a channel sends.
#[derive(Debug, Clone, PartialEq)]
pub enum ChannelKind {
    Log,
    File { path: PathBuf },
    Webhook { url: hyper::Uri, timeout_ms: u64 },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChannelConfig {
    pub name: String,
    pub kind: ChannelKind,
    pub retry: RetryPolicy,
    pub concurrency: u32,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub token: Option<String>,
    pub channels: Vec<ChannelConfig>,
    pub limits: Limits,
    pub body_bytes_max: usize,
}

/// Overrides from the command line and environment.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub token: Option<String>,
}

impl Config {
    /// The embedded defaults.
    pub fn defaults() -> Config {
        Config::from_parts(FileConfig::default(), Overrides::default())
            .expect("the embedded defaults are valid")
    }

    /// Reads the config file (if any) and applies the overrides.
    pub fn load(path: Option<&Path>, overrides: Overrides) -> Result<Config, ConfigError> {
        let file = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                Config::parse_file(&text, &p.display().to_string())?
            }
            None => FileConfig::default(),
        };
        Config::from_parts(file, overrides)
    }

    /// Parses config text (used by `load` and by tests).
    pub fn from_toml(text: &str, overrides: Overrides) -> Result<Config, ConfigError> {
        Config::from_parts(Config::parse_file(text, "<inline>")?, overrides)
    }

    fn parse_file(text: &str, path: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_string(),
            message: e.to_string(),
        })
    }

    fn from_parts(file: FileConfig, o: Overrides) -> Result<Config, ConfigError> {
        let limits = Limits::default();
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
        if !listen.ip().is_loopback() && token.is_none() {
            return Err(invalid(
                listen_key,
                format!("refusing to listen on non-loopback {listen} without a token (set HERALD_TOKEN or token)"),
            ));
        }
        let data_dir = o
            .data_dir
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        if file.alerts.is_some() {
            return Err(invalid(
                "alerts",
                "alert channels are not supported by this version yet",
            ));
        }
        let mut channels = Vec::new();
        for (name, c) in file.channels {
            channels.push(channel(&name, c, &limits)?);
        }
        if !channels.iter().any(|c| c.name == "log") {
            channels.push(ChannelConfig {
                name: "log".into(),
                kind: ChannelKind::Log,
                retry: RetryPolicy::default(),
                concurrency: 64,
            });
        }
        Ok(Config {
            listen,
            data_dir,
            token,
            channels,
            limits,
            body_bytes_max: BODY_BYTES_MAX,
        })
    }
}

fn channel(name: &str, c: ChannelFile, limits: &Limits) -> Result<ChannelConfig, ConfigError> {
    let key = |k: &str| format!("channels.{name}.{k}");
    if crate::model::check_id(name).is_err() {
        return Err(invalid(
            format!("channels.{name}"),
            "channel names use A-Z a-z 0-9 . _ : -",
        ));
    }
    for (k, present) in [
        ("secret", c.secret.is_some()),
        ("secrets", c.secrets.is_some()),
        ("rate", c.rate.is_some()),
        ("breaker", c.breaker.is_some()),
    ] {
        if present {
            return Err(invalid(key(k), "not supported by this version yet"));
        }
    }
    let timeout_ms = match &c.timeout {
        Some(t) => {
            let ms = parse_duration_ms(t).map_err(|e| invalid(key("timeout"), e))?;
            if ms == 0 {
                return Err(invalid(key("timeout"), "must be more than 0"));
            }
            ms
        }
        None => DEFAULT_TIMEOUT_MS,
    };
    let concurrency = c.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
    if concurrency == 0 || concurrency > 10_000 {
        return Err(invalid(key("concurrency"), "must be between 1 and 10000"));
    }
    let retry = match c.retry {
        Some(r) => {
            validate_retry(r, &key("retry"), limits).map_err(|e| invalid(e.field, e.detail))?
        }
        None => RetryPolicy::default(),
    };
    if c.kind != "webhook" && c.url.is_some() {
        return Err(invalid(key("url"), "only for kind = \"webhook\""));
    }
    let kind = match c.kind.as_str() {
        "log" => ChannelKind::Log,
        "file" => ChannelKind::File {
            path: c
                .path
                .ok_or_else(|| invalid(key("path"), "required for kind = \"file\""))?,
        },
        "webhook" => {
            let url = c
                .url
                .ok_or_else(|| invalid(key("url"), "required for kind = \"webhook\""))?;
            let uri: hyper::Uri = url
                .parse()
                .map_err(|e| invalid(key("url"), format!("{url:?} is not a URL: {e}")))?;
            if uri.scheme_str() != Some("http") || uri.host().is_none() {
                return Err(invalid(
                    key("url"),
                    format!("{url:?}: only http://host[:port]/path URLs are supported"),
                ));
            }
            ChannelKind::Webhook {
                url: uri,
                timeout_ms,
            }
        }
        other => {
            return Err(invalid(
                key("kind"),
                format!("unknown kind {other:?}; expected webhook, log or file"),
            ))
        }
    };
    Ok(ChannelConfig {
        name: name.to_string(),
        kind,
        retry,
        concurrency,
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
retry = { max_attempts = 4, backoff = "exponential", initial = "30s", max = "30m" }
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
                ..
            }
        ));
        assert!(c.channels.iter().any(|c| c.name == "log"));
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
    fn errors_name_the_key() {
        assert!(err("[channels.w]\nkind = \"webhook\"").starts_with("channels.w.url:"));
        assert!(err("[channels.w]\nkind = \"webhook\"\nurl = \"ftp://x\"")
            .starts_with("channels.w.url:"));
        assert!(err("[channels.w]\nkind = \"pigeon\"").starts_with("channels.w.kind:"));
        assert!(err("[channels.w]\nkind = \"log\"\ntimeout = \"3 s\"")
            .starts_with("channels.w.timeout:"));
        assert!(
            err("[channels.w]\nkind = \"log\"\nrate = \"1/3s\"").starts_with("channels.w.rate:")
        );
        assert!(
            err("[channels.w]\nkind = \"log\"\nretry = { max_attempts = 0 }")
                .starts_with("channels.w.retry.max_attempts:")
        );
        assert!(err("listen = \"0.0.0.0:7700\"").starts_with("listen:"));
        assert!(err("colour = 1").contains("unknown field"));
        assert!(err("[channels.w]\nkind = \"file\"").starts_with("channels.w.path:"));
    }

    #[test]
    fn public_listen_needs_a_token() {
        let c = Config::from_toml(
            "listen = \"0.0.0.0:7700\"\ntoken = \"s3cret\"",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.token.as_deref(), Some("s3cret"));
    }
}

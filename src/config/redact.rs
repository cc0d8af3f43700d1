//! `Debug` of the config file as read, which holds secrets as written: the API token, a
//! PostgreSQL URL's password, an OTLP endpoint's user info (refused later, but read first),
//! a channel's URL (a key in its query or path), signing secrets, header values, body and
//! token templates, `vars`. Each shows whether it is set
//! ([`REDACTED`](crate::logsafe::REDACTED)), headers and vars by name (`TokenKeys` and
//! `PlatformKeys` do the same in `deliver/preset.rs`). Each impl takes its struct apart without
//! `..`, so a field added later does not compile until it is written here, shown or redacted.

use std::fmt;

use super::{ChannelFile, FileConfig, StoreFile, TelemetryFile};
use crate::logsafe::redacted;

impl fmt::Debug for FileConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let FileConfig {
            listen,
            data_dir,
            token,
            shutdown_timeout,
            channels,
            alerts,
            limits,
            store,
            telemetry,
            cluster,
        } = self;
        f.debug_struct("FileConfig")
            .field("listen", listen)
            .field("data_dir", data_dir)
            .field("token", &redacted(token))
            .field("shutdown_timeout", shutdown_timeout)
            .field("channels", channels)
            .field("alerts", alerts)
            .field("limits", limits)
            .field("store", store)
            .field("telemetry", telemetry)
            .field("cluster", cluster)
            .finish()
    }
}

impl fmt::Debug for TelemetryFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let TelemetryFile { otlp_endpoint } = self;
        f.debug_struct("TelemetryFile")
            .field("otlp_endpoint", &redacted(otlp_endpoint))
            .finish()
    }
}

impl fmt::Debug for StoreFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let StoreFile {
            cache_mb,
            retention,
            runs_max,
            failures_max,
            url,
            pool_size,
            statement_timeout,
            timeline_max,
        } = self;
        // Not `store::pg::redact`: the URL is not checked yet, and its password may hold the
        // `/` or `?` that end the authority there.
        f.debug_struct("StoreFile")
            .field("cache_mb", cache_mb)
            .field("retention", retention)
            .field("runs_max", runs_max)
            .field("failures_max", failures_max)
            .field("url", &redacted(url))
            .field("pool_size", pool_size)
            .field("statement_timeout", statement_timeout)
            .field("timeline_max", timeline_max)
            .finish()
    }
}

impl fmt::Debug for ChannelFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[rustfmt::skip]
        let ChannelFile {
            kind, url, ca_file, path, timeout, connect_timeout, concurrency, retry, secret,
            secrets, rate, breaker, preset, method, headers, body, success, retry_codes,
            retry_after_json, token, sign, vars, answer_timeout, answer_bytes_max, quiet_hours,
        } = self;
        f.debug_struct("ChannelFile")
            .field("kind", kind)
            .field("url", &redacted(url))
            .field("ca_file", ca_file)
            .field("path", path)
            .field("timeout", timeout)
            .field("connect_timeout", connect_timeout)
            .field("concurrency", concurrency)
            .field("retry", retry)
            .field("secret", &redacted(secret))
            .field("secrets", &secrets.as_ref().map(Vec::len))
            .field("rate", rate)
            .field("breaker", breaker)
            .field("preset", preset)
            .field("method", method)
            .field(
                "headers",
                &headers.as_ref().map(|h| h.keys().collect::<Vec<_>>()),
            )
            .field("body", &redacted(body))
            .field("success", success)
            .field("retry_codes", retry_codes)
            .field("retry_after_json", retry_after_json)
            .field("token", token)
            .field("sign", sign)
            .field("vars", &vars.as_ref().map(|v| v.keys().collect::<Vec<_>>()))
            .field("answer_timeout", answer_timeout)
            .field("answer_bytes_max", answer_bytes_max)
            .field("quiet_hours", quiet_hours)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    /// Every secret a config file can hold, each distinct, and none in the file's `Debug`.
    #[test]
    fn the_file_s_debug_shows_no_secret() {
        let text = r#"
token = "SECRET-api-token"
[store]
url = "postgres://herald:SECRET-pg/pw@db:5432/herald"
[telemetry]
otlp_endpoint = "http://u:SECRET-otlp@collector:4318"
[channels.wecom]
kind = "webhook"
url = "https://qyapi.example/send?key=SECRET-url-key&x={{ to | urlencode }}"
secrets = ["SECRET-newest", "SECRET-older"]
headers = { Authorization = "Bearer SECRET-header" }
body = '{"pw":"SECRET-body","text":{{ body | tojson }}}'
token = { url = "https://t.example/gettoken?secret=SECRET-token-url", method = "POST", body = '{"s":"SECRET-token-body"}', json = "/access_token" }
vars = { agentid = "SECRET-var" }
[channels.hook]
kind = "webhook"
url = "https://h.example/SECRET-path/in"
secret = "SECRET-single"
"#;
        let file = Config::parse_file(text, "<inline>").unwrap();
        let shown = format!("{file:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        for name in [
            "FileConfig",
            "StoreFile",
            "TelemetryFile",
            "ChannelFile",
            "TokenKeys",
        ] {
            assert!(shown.contains(name), "{name}: {shown}");
        }
        // What is not secret is still there: header and var names, the token's pointer.
        for kept in ["Authorization", "agentid", "/access_token", "wecom"] {
            assert!(shown.contains(kept), "{kept}: {shown}");
        }
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}

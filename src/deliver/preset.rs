//! Presets: the documented defaults of each messaging platform, written as the channel keys an
//! operator would write (API.md, "Platform channels"). A channel's own keys override a preset key
//! by key (`success` and `token` sub-key by sub-key, `headers` and `vars` entry by entry).
//!
//! Sources (request and answer shapes):
//! - `wecom-robot`: WeCom group robot, `POST /cgi-bin/webhook/send?key=KEY`,
//!   `{"msgtype":"text","text":{"content":...}}`, answer `{"errcode":0,"errmsg":"ok"}`;
//!   20 messages per minute per robot; `45009` = API frequency limit, `-1` = system busy.
//! - `wecom-app`: WeCom app message, `GET /cgi-bin/gettoken?corpid=&corpsecret=` →
//!   `{"errcode":0,"access_token":"...","expires_in":7200}`, then
//!   `POST /cgi-bin/message/send?access_token=TOKEN` with `touser`, `msgtype`, `agentid`, `text`;
//!   `42001` = token expired, `40014` = invalid token.
//! - `dingtalk-robot`: `POST /robot/send?access_token=T[&timestamp=&sign=]`, same text shape,
//!   answer `{"errcode":0,"errmsg":"ok"}`; 20 messages per minute; `130101` = sending too fast.
//! - `feishu-bot`: `POST /open-apis/bot/v2/hook/ID`, `{"msg_type":"text","content":{"text":...}}`
//!   (+ `timestamp`, `sign` when signed), answer `{"code":0,"msg":"success"}`; `9499`/`11232`
//!   = rate limited.
//! - `slack-webhook`: `POST` `{"text":...}`, answer `200 ok` (plain text), `429` + `Retry-After`.
//! - `telegram-bot`: `POST /bot<token>/sendMessage` `{"chat_id":...,"text":...}`, answer
//!   `{"ok":true,...}` or `{"ok":false,"error_code":429,"description":...,
//!   "parameters":{"retry_after":N}}`.
//! - `generic-json`: a JSON API of your own (e.g. a personal-WeChat gateway):
//!   `{"to":...,"body":...,"data":...,"idempotency_key":...}`, any 2xx is success.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::logsafe::redacted;

/// The platform keys of a channel (all optional), as written in the config file. Its `Debug`
/// shows no secret (see its impl).
#[derive(Deserialize, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PlatformKeys {
    pub preset: Option<String>,
    pub url: Option<String>,
    pub rate: Option<String>,
    pub method: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub body: Option<String>,
    pub success: Option<SuccessKeys>,
    pub retry_codes: Option<Vec<i64>>,
    pub retry_after_json: Option<String>,
    pub token: Option<TokenKeys>,
    pub sign: Option<String>,
    pub vars: Option<toml::Table>,
    pub answer_timeout: Option<String>,
    pub answer_bytes_max: Option<usize>,
}

/// `success = { status = "2xx", json = "/errcode", equals = 0, code = "...", message = "..." }`
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SuccessKeys {
    pub status: Option<String>,
    pub json: Option<String>,
    pub equals: Option<toml::Value>,
    /// Where the platform's code is, when not at `json` (Telegram: `/error_code`).
    pub code: Option<String>,
    /// Where the platform's message is (`/errmsg`, `/msg`, `/description`).
    pub message: Option<String>,
}

/// `token = { url = "...", json = "/access_token", expires_json = "/expires_in", refresh_codes = [...] }`
/// Its `Debug` shows no secret (see its impl).
#[derive(Deserialize, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TokenKeys {
    pub url: Option<String>,
    pub method: Option<String>,
    /// Request body (JSON text) for token endpoints that take a POST.
    pub body: Option<String>,
    pub json: Option<String>,
    pub expires_json: Option<String>,
    pub refresh_codes: Option<Vec<i64>>,
    /// Lifetime assumed when the answer gives none (default 1h).
    pub lifetime: Option<String>,
}

/// The URL, header values, body and `vars` values may hold secrets as written (a key in the
/// URL, a bearer token, an app secret): shown as set or not, headers and vars by name. Taken
/// apart without `..`, so a field added later must be placed here.
impl std::fmt::Debug for PlatformKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        #[rustfmt::skip]
        let PlatformKeys {
            preset, url, rate, method, headers, body, success, retry_codes, retry_after_json,
            token, sign, vars, answer_timeout, answer_bytes_max,
        } = self;
        f.debug_struct("PlatformKeys")
            .field("preset", preset)
            .field("url", &redacted(url))
            .field("rate", rate)
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
            .finish()
    }
}

/// The URL and body carry the app's credentials (`corpsecret=...`): shown as set or not.
impl std::fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        #[rustfmt::skip]
        let TokenKeys { url, method, body, json, expires_json, refresh_codes, lifetime } = self;
        f.debug_struct("TokenKeys")
            .field("url", &redacted(url))
            .field("method", method)
            .field("body", &redacted(body))
            .field("json", json)
            .field("expires_json", expires_json)
            .field("refresh_codes", refresh_codes)
            .field("lifetime", lifetime)
            .finish()
    }
}

pub const PRESETS: &[&str] = &[
    "wecom-robot",
    "wecom-app",
    "dingtalk-robot",
    "feishu-bot",
    "slack-webhook",
    "telegram-bot",
    "generic-json",
];

const WECOM_ROBOT: &str = r#"
rate = "20/1m"
method = "POST"
body = '{"msgtype":"text","text":{"content":{{ body | tojson }}{% if data.mentioned_list %},"mentioned_list":{{ data.mentioned_list | tojson }}{% endif %}{% if data.mentioned_mobile_list %},"mentioned_mobile_list":{{ data.mentioned_mobile_list | tojson }}{% endif %}}}'
success = { status = "2xx", json = "/errcode", equals = 0, message = "/errmsg" }
retry_codes = [-1, 45009, 45033]
"#;

const WECOM_APP: &str = r#"
method = "POST"
url = "https://qyapi.weixin.qq.com/cgi-bin/message/send?access_token={{ token | urlencode }}"
body = '{"touser":{{ to | tojson }},"msgtype":"text","agentid":{{ vars.agentid | tojson }},"text":{"content":{{ body | tojson }}}}'
success = { status = "2xx", json = "/errcode", equals = 0, message = "/errmsg" }
retry_codes = [-1, 45009, 45033]
token = { url = "https://qyapi.weixin.qq.com/cgi-bin/gettoken?corpid=${WECOM_CORP_ID}&corpsecret=${WECOM_CORP_SECRET}", method = "GET", json = "/access_token", expires_json = "/expires_in", refresh_codes = [42001, 40014] }
"#;

const DINGTALK_ROBOT: &str = r#"
rate = "20/1m"
method = "POST"
body = '{"msgtype":"text","text":{"content":{{ body | tojson }}}{% if data.at_mobiles or data.at_all %},"at":{"atMobiles":{{ (data.at_mobiles or []) | tojson }},"isAtAll":{{ (data.at_all or false) | tojson }}}{% endif %}}'
success = { status = "2xx", json = "/errcode", equals = 0, message = "/errmsg" }
retry_codes = [-1, 130101]
sign = "dingtalk"
"#;

const FEISHU_BOT: &str = r#"
rate = "5/1s"
method = "POST"
body = '{"msg_type":"text","content":{"text":{{ body | tojson }}}}'
success = { status = "2xx", json = "/code", equals = 0, message = "/msg" }
retry_codes = [9499, 11232, 11233]
sign = "feishu"
"#;

const SLACK_WEBHOOK: &str = r#"
method = "POST"
body = '{"text":{{ body | tojson }}}'
success = { status = "2xx" }
"#;

const TELEGRAM_BOT: &str = r#"
rate = "30/1s"
method = "POST"
body = '{"chat_id":{{ to | tojson }},"text":{{ body | tojson }}{% if data.parse_mode %},"parse_mode":{{ data.parse_mode | tojson }}{% endif %}}'
success = { status = "2xx", json = "/ok", equals = true, code = "/error_code", message = "/description" }
retry_codes = [429]
retry_after_json = "/parameters/retry_after"
"#;

const GENERIC_JSON: &str = r#"
method = "POST"
body = '{"to":{{ to | tojson }},"body":{{ body | tojson }},"data":{{ data | tojson }},"task_id":{{ task_id | tojson }},"idempotency_key":{{ idempotency_key | tojson }},"scheduled_at":{{ scheduled_at | tojson }}}'
success = { status = "2xx" }
"#;

/// The defaults of preset `name`, or `None` if there is no such preset.
pub fn preset(name: &str) -> Option<Result<PlatformKeys, String>> {
    let text = match name {
        "wecom-robot" => WECOM_ROBOT,
        "wecom-app" => WECOM_APP,
        "dingtalk-robot" => DINGTALK_ROBOT,
        "feishu-bot" => FEISHU_BOT,
        "slack-webhook" => SLACK_WEBHOOK,
        "telegram-bot" => TELEGRAM_BOT,
        "generic-json" => GENERIC_JSON,
        _ => return None,
    };
    Some(toml::from_str(text).map_err(|e| format!("preset {name} is broken: {e}")))
}

fn or<T>(user: Option<T>, preset: Option<T>) -> Option<T> {
    user.or(preset)
}

/// The channel's keys over the preset's, key by key.
pub fn merge(preset: PlatformKeys, user: PlatformKeys) -> PlatformKeys {
    let success = match (preset.success, user.success) {
        (Some(p), Some(u)) => Some(SuccessKeys {
            status: or(u.status, p.status),
            // A channel that names its own `json` rule does not inherit the preset's code
            // and expected value for another pointer.
            equals: if u.json.is_some() {
                u.equals
            } else {
                or(u.equals, p.equals)
            },
            code: if u.json.is_some() {
                u.code
            } else {
                or(u.code, p.code)
            },
            json: or(u.json, p.json),
            message: or(u.message, p.message),
        }),
        (p, u) => u.or(p),
    };
    let token = match (preset.token, user.token) {
        (Some(p), Some(u)) => Some(TokenKeys {
            url: or(u.url, p.url),
            method: or(u.method, p.method),
            body: or(u.body, p.body),
            json: or(u.json, p.json),
            expires_json: or(u.expires_json, p.expires_json),
            refresh_codes: or(u.refresh_codes, p.refresh_codes),
            lifetime: or(u.lifetime, p.lifetime),
        }),
        (p, u) => u.or(p),
    };
    let map_merge =
        |p: Option<BTreeMap<String, String>>, u: Option<BTreeMap<String, String>>| match (p, u) {
            (Some(mut p), Some(u)) => {
                p.extend(u);
                Some(p)
            }
            (p, u) => u.or(p),
        };
    let vars = match (preset.vars, user.vars) {
        (Some(mut p), Some(u)) => {
            p.extend(u);
            Some(p)
        }
        (p, u) => u.or(p),
    };
    PlatformKeys {
        preset: user.preset,
        url: or(user.url, preset.url),
        rate: or(user.rate, preset.rate),
        method: or(user.method, preset.method),
        headers: map_merge(preset.headers, user.headers),
        body: or(user.body, preset.body),
        success,
        retry_codes: or(user.retry_codes, preset.retry_codes),
        retry_after_json: or(user.retry_after_json, preset.retry_after_json),
        token,
        sign: or(user.sign, preset.sign),
        vars,
        answer_timeout: or(user.answer_timeout, preset.answer_timeout),
        answer_bytes_max: or(user.answer_bytes_max, preset.answer_bytes_max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Secrets written in a channel's platform keys are not in their `Debug`, merged with a
    /// preset or not; what is not secret still is.
    #[test]
    fn the_debug_of_platform_keys_shows_no_secret() {
        let user: PlatformKeys = toml::from_str(
            r#"
preset = "wecom-app"
url = "https://gw.example/SECRET-path/send?key=SECRET-url-key"
headers = { Authorization = "Bearer SECRET-header" }
body = '{"pw":"SECRET-body"}'
token = { url = "https://t.example/gettoken?corpsecret=SECRET-token-url", body = '{"s":"SECRET-token-body"}' }
vars = { agentid = "SECRET-var" }
"#,
        )
        .unwrap();
        let wecom = preset("wecom-app").unwrap().unwrap();
        for keys in [user.clone(), merge(wecom, user)] {
            let shown = format!("{keys:?}");
            assert!(!shown.contains("SECRET"), "{shown}");
            for kept in [
                "PlatformKeys",
                "TokenKeys",
                "Authorization",
                "agentid",
                "wecom-app",
                "<redacted>",
            ] {
                assert!(shown.contains(kept), "{kept}: {shown}");
            }
        }
    }

    #[test]
    fn every_preset_parses() {
        for name in PRESETS {
            let p = preset(name).expect("known").expect("parses");
            assert!(p.body.is_some(), "{name} has a body template");
            assert_eq!(p.method.as_deref(), Some("POST"), "{name}");
        }
        assert!(preset("wecom").is_none());
    }

    #[test]
    fn user_keys_win_key_by_key() {
        let p = preset("wecom-app").unwrap().unwrap();
        let user = PlatformKeys {
            token: Some(TokenKeys {
                url: Some("http://127.0.0.1:1/gettoken".into()),
                ..TokenKeys::default()
            }),
            success: Some(SuccessKeys {
                message: Some("/msg".into()),
                ..SuccessKeys::default()
            }),
            retry_codes: Some(vec![1]),
            ..PlatformKeys::default()
        };
        let m = merge(p, user);
        let t = m.token.unwrap();
        assert_eq!(t.url.as_deref(), Some("http://127.0.0.1:1/gettoken"));
        assert_eq!(t.json.as_deref(), Some("/access_token"));
        assert_eq!(t.refresh_codes, Some(vec![42001, 40014]));
        let s = m.success.unwrap();
        assert_eq!(s.json.as_deref(), Some("/errcode"));
        assert_eq!(s.message.as_deref(), Some("/msg"));
        assert_eq!(m.retry_codes, Some(vec![1]));
    }
}

//! Platform channels: a webhook channel that speaks a messaging platform's own API
//! (API.md, "Platform channels"). [`PlatformSpec`] is the validated configuration (built from
//! the channel's keys over its preset, with `${VAR}` taken from the environment);
//! [`Platform`] is its running form: compiled templates, the success rule, the token cache and
//! the DingTalk/Feishu signer. Turning one delivery into one HTTP request is
//! [`Platform::prepare`]; sending it and judging the answer is the webhook sink's job.

use std::collections::BTreeMap;

use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Uri};
use serde_json::Value;

use super::preset::{self, PlatformKeys, PRESETS};
use super::sign::{dingtalk_sign, feishu_sign};
use super::success::{check_pointer, JsonRule, StatusSet, SuccessRule};
use super::template::{is_template, Context, Templates, Tpl};
use super::token::{TokenCache, TokenSpec};
use super::{Alert, Delivery};
use crate::model::parse_duration_ms;

/// Default bound on the answer body read for a success rule.
pub const ANSWER_BYTES_MAX: usize = 64 * 1024;
/// Default time allowed to read that body, after the status line arrived.
pub const ANSWER_TIMEOUT_MS: u64 = 5_000;
/// Lifetime of a token whose answer gives none.
pub const TOKEN_LIFETIME_MS: u64 = 3_600_000;

/// How requests are signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignKind {
    None,
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature` headers (with `secret`).
    StandardWebhooks,
    /// `timestamp` and `sign` in the query.
    DingTalk,
    /// `timestamp` and `sign` in the JSON body.
    Feishu,
}

impl SignKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SignKind::None => "none",
            SignKind::StandardWebhooks => "standard-webhooks",
            SignKind::DingTalk => "dingtalk",
            SignKind::Feishu => "feishu",
        }
    }
}

/// A config error: the key (relative to the channel, e.g. `body`, `token.url`) and why.
pub type KeyError = (String, String);

fn kerr(key: &str, msg: impl Into<String>) -> KeyError {
    (key.to_string(), msg.into())
}

/// Replaces `${NAME}` with the environment variable `NAME` (`$${` stands for a literal `${`).
/// A variable that is not set is an error naming it (never its value).
pub fn expand_env(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        if let Some(r) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = r;
        } else if let Some(r) = after.strip_prefix("${") {
            let Some(end) = r.find('}') else {
                return Err("unclosed ${ (write $${ for a literal ${)".into());
            };
            let name = &r[..end];
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!("${{{name}}} is not an environment variable name"));
            }
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => return Err(format!("environment variable {name} is not set")),
            }
            rest = &r[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The validated platform settings of one channel. Its URL, headers, body, vars and token
/// endpoint may hold secrets from the environment: `Debug` does not print them.
#[derive(Clone, PartialEq)]
pub struct PlatformSpec {
    pub preset: Option<String>,
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    /// `None`: herald's own JSON body.
    pub body: Option<String>,
    pub success: SuccessRule,
    pub token: Option<TokenSpec>,
    pub sign: SignKind,
    pub vars: Value,
    pub answer_timeout_ms: u64,
    pub answer_bytes_max: usize,
}

impl std::fmt::Debug for PlatformSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlatformSpec")
            .field("preset", &self.preset)
            .field("method", &self.method)
            .field("success", &self.success)
            .field("token", &self.token)
            .field("sign", &self.sign)
            .finish_non_exhaustive()
    }
}

/// Does the channel use any platform key?
pub fn uses_platform(k: &PlatformKeys) -> Option<&'static str> {
    [
        (k.preset.is_some(), "preset"),
        (k.method.is_some(), "method"),
        (k.headers.is_some(), "headers"),
        (k.body.is_some(), "body"),
        (k.success.is_some(), "success"),
        (k.retry_codes.is_some(), "retry_codes"),
        (k.retry_after_json.is_some(), "retry_after_json"),
        (k.token.is_some(), "token"),
        (k.sign.is_some(), "sign"),
        (k.vars.is_some(), "vars"),
        (k.answer_timeout.is_some(), "answer_timeout"),
        (k.answer_bytes_max.is_some(), "answer_bytes_max"),
    ]
    .into_iter()
    .find_map(|(used, key)| used.then_some(key))
}

/// The channel's keys over its preset's. Errors name the key.
pub fn resolve_preset(user: PlatformKeys) -> Result<PlatformKeys, KeyError> {
    let Some(name) = user.preset.clone() else {
        return Ok(user);
    };
    match preset::preset(&name) {
        None => Err(kerr(
            "preset",
            format!(
                "unknown preset {name:?}; expected one of {}",
                PRESETS.join(", ")
            ),
        )),
        Some(Err(e)) => Err(kerr("preset", e)),
        Some(Ok(p)) => Ok(preset::merge(p, user)),
    }
}

/// Checks a URL (after `${VAR}` expansion) and returns what can be known before rendering:
/// its scheme and host, which a template may not compute (the operator fixes where messages
/// go, never the message data).
pub fn check_url(url: &str) -> Result<Uri, String> {
    let fixed = match url.find("{{").into_iter().chain(url.find("{%")).min() {
        Some(i) => &url[..i],
        None => url,
    };
    let bad = || {
        format!("{url:?}: only http(s)://host[:port]/path URLs are supported, with the scheme and host written out")
    };
    let (scheme, rest) = fixed.split_once("://").ok_or_else(bad)?;
    if !matches!(scheme, "http" | "https") {
        return Err(bad());
    }
    let host_end = rest.find(['/', '?']);
    if is_template(url) && host_end.is_none() {
        return Err(format!(
            "{url:?}: a URL template must write out the scheme and host (http(s)://host/...) before any {{{{ }}}}"
        ));
    }
    if is_template(url) && has_dot_segment(url, host_end) {
        // Renders are refused a dot segment (`Platform::check_dot_segments`): say so now.
        return Err(format!("{url:?}: {DOT_SEGMENT}"));
    }
    let base = if is_template(url) {
        format!("{scheme}://{}/", &rest[..host_end.unwrap_or(rest.len())])
    } else {
        url.to_string()
    };
    let uri: Uri = base
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if uri.host().is_none() {
        return Err(bad());
    }
    Ok(uri)
}

/// [`check_url`]'s refusal of a template's own dot segment: the callers, which do not echo a
/// URL that may hold a secret, say this one as it is.
pub const DOT_SEGMENT: &str = "a URL template may not have a \".\" or \"..\" path segment";

/// Whether a URL template's own text has a `.` or `..` path segment, whole or before a `;`
/// (one whose part up to the `;` has no `{{ }}`/`{% %}` in it: what a value renders there is
/// checked at render time), up to the query. `host_end`: where the path starts after `://`.
fn has_dot_segment(url: &str, host_end: Option<usize>) -> bool {
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let path = host_end.and_then(|i| rest.get(i..)).unwrap_or("");
    for seg in path.split('/') {
        let own = seg.split(['?', '#']).next().unwrap_or("");
        let head = own.split(';').next().unwrap_or("");
        if !head.contains(['{', '}']) && is_dot_segment(head) {
            return true;
        }
        if seg.contains(['?', '#']) {
            break;
        }
    }
    false
}

/// A URL error for a caller that must not echo the URL: the dot-segment refusal as it is,
/// anything else as the general shape the URL must have.
pub fn url_error_unechoed(e: &str) -> &'static str {
    if e.ends_with(DOT_SEGMENT) {
        DOT_SEGMENT
    } else {
        "only http(s)://host[:port]/path URLs are supported, with the scheme and host written out"
    }
}

fn check_method(m: &str) -> Result<(), String> {
    match Method::from_bytes(m.as_bytes()) {
        Ok(_) if !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) => Ok(()),
        _ => Err(format!("{m:?} is not an HTTP method like POST")),
    }
}

fn toml_to_json(v: &toml::Value) -> Result<Value, String> {
    serde_json::to_value(v).map_err(|e| format!("cannot be used as JSON: {e}"))
}

impl PlatformSpec {
    /// Validates merged keys (see [`resolve_preset`]). `url` is already expanded; `secrets` are
    /// the channel's (expanded) secrets; `sign_explicit` says whether the channel itself (not
    /// its preset) chose the signer.
    pub fn build(
        keys: &PlatformKeys,
        url: &str,
        secrets: &[String],
        sign_explicit: bool,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<PlatformSpec, KeyError> {
        let expand = |key: &str, text: &str| expand_env(text, env).map_err(|e| kerr(key, e));
        let (method, headers, body) = request_keys(keys, &expand)?;
        let (success, token) = success_and_token(keys, &expand)?;
        let sign = sign_kind(keys.sign.as_deref(), secrets, sign_explicit)?;
        let vars = vars(keys, &expand)?;
        let (answer_timeout_ms, answer_bytes_max) = answer_limits(keys)?;
        let spec = PlatformSpec {
            preset: keys.preset.clone(),
            method,
            url: url.to_string(),
            headers,
            body,
            success,
            token,
            sign,
            vars: Value::Object(vars),
            answer_timeout_ms,
            answer_bytes_max,
        };
        // Compile once now, so that a template error stops start-up and names its key.
        Platform::new("check", spec.clone(), secrets)?;
        Ok(spec)
    }
}

/// Expands `${VAR}`s in a key's text; errors name the key.
type Expand<'a> = dyn Fn(&str, &str) -> Result<String, KeyError> + 'a;

/// A JSON pointer key, checked.
fn pointer(key: &str, p: &Option<String>) -> Result<Option<String>, KeyError> {
    if let Some(p) = p {
        check_pointer(p).map_err(|e| kerr(key, e))?;
    }
    Ok(p.clone())
}

/// Header names (lowercase) and their values or templates.
type Headers = Vec<(String, String)>;

/// The request's `method`, `headers` and `body`, expanded and checked where not templates.
fn request_keys(
    keys: &PlatformKeys,
    expand: &Expand<'_>,
) -> Result<(String, Headers, Option<String>), KeyError> {
    let method = expand("method", keys.method.as_deref().unwrap_or("POST"))?;
    if !is_template(&method) {
        check_method(&method).map_err(|e| kerr("method", e))?;
    }
    let mut headers = Vec::new();
    for (name, value) in keys.headers.iter().flatten() {
        let key = format!("headers.{name}");
        HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| kerr(&key, format!("{name:?} is not a header name")))?;
        let value = expand(&key, value)?;
        if !is_template(&value) {
            HeaderValue::from_str(&value).map_err(|_| kerr(&key, "not a valid header value"))?;
        }
        headers.push((name.to_ascii_lowercase(), value));
    }
    let body = keys
        .body
        .as_deref()
        .map(|b| expand("body", b))
        .transpose()?;

    Ok((method, headers, body))
}

/// The `success` rule and the `token` it may refresh.
fn success_and_token(
    keys: &PlatformKeys,
    expand: &Expand<'_>,
) -> Result<(SuccessRule, Option<TokenSpec>), KeyError> {
    let s = keys.success.clone().unwrap_or_default();
    let status = match &s.status {
        Some(t) => StatusSet::parse(t).map_err(|e| kerr("success.status", e))?,
        None => StatusSet::default(),
    };
    let json_rule = match (pointer("success.json", &s.json)?, &s.equals) {
        (Some(p), Some(eq)) => Some(JsonRule {
            pointer: p,
            equals: toml_to_json(eq).map_err(|e| kerr("success.equals", e))?,
        }),
        (Some(_), None) => {
            return Err(kerr(
                "success.equals",
                "required with success.json (the value that means success, e.g. 0)",
            ))
        }
        (None, Some(_)) => {
            return Err(kerr(
                "success.json",
                "required with success.equals (a JSON pointer, e.g. \"/errcode\")",
            ))
        }
        (None, None) => None,
    };
    let code = pointer("success.code", &s.code)?;
    let message = pointer("success.message", &s.message)?;
    let retry_after_json = pointer("retry_after_json", &keys.retry_after_json)?;
    let code_pointer = code
        .clone()
        .or(json_rule.as_ref().map(|j| j.pointer.clone()));

    let token = match &keys.token {
        None => None,
        Some(t) => Some(token_spec(t, expand, code_pointer, message.clone())?),
    };
    let success = SuccessRule {
        status,
        json: json_rule,
        code,
        message,
        retry_codes: keys.retry_codes.clone().unwrap_or_default(),
        refresh_codes: token
            .as_ref()
            .map(|t| t.refresh_codes.clone())
            .unwrap_or_default(),
        retry_after_json,
    };

    Ok((success, token))
}

/// A `token` block: where and how to fetch the access token, and where the answer holds it.
fn token_spec(
    t: &crate::deliver::preset::TokenKeys,
    expand: &Expand<'_>,
    code_json: Option<String>,
    message_json: Option<String>,
) -> Result<TokenSpec, KeyError> {
    let url = t
        .url
        .as_deref()
        .ok_or_else(|| kerr("token.url", "required with token"))?;
    let url = expand("token.url", url)?;
    if is_template(&url) {
        return Err(kerr(
            "token.url",
            "is not a template: give the URL (with ${VAR} for secrets)",
        ));
    }
    check_url(&url).map_err(|e| {
        // The URL may hold a secret: do not echo it.
        let _ = e;
        kerr(
            "token.url",
            "only http(s)://host[:port]/path URLs are supported",
        )
    })?;
    let method = t.method.clone().unwrap_or_else(|| "GET".into());
    check_method(&method).map_err(|e| kerr("token.method", e))?;
    let json = pointer("token.json", &t.json)?
        .ok_or_else(|| kerr("token.json", "required with token (e.g. \"/access_token\")"))?;
    let lifetime_ms = match &t.lifetime {
        Some(d) => parse_duration_ms(d)
            .map_err(|e| kerr("token.lifetime", e))?
            .max(1_000),
        None => TOKEN_LIFETIME_MS,
    };
    Ok(TokenSpec {
        method,
        url,
        body: t
            .body
            .as_deref()
            .map(|b| expand("token.body", b))
            .transpose()?,
        json,
        expires_json: pointer("token.expires_json", &t.expires_json)?,
        refresh_codes: t.refresh_codes.clone().unwrap_or_default(),
        lifetime_ms,
        code_json,
        message_json,
    })
}

/// The signer: the one chosen, the preset's when a secret is given, or none.
fn sign_kind(
    sign: Option<&str>,
    secrets: &[String],
    sign_explicit: bool,
) -> Result<SignKind, KeyError> {
    let sign = match sign {
        None if secrets.is_empty() => SignKind::None,
        None | Some("standard-webhooks") => SignKind::StandardWebhooks,
        Some("none") => SignKind::None,
        Some("dingtalk") => SignKind::DingTalk,
        Some("feishu") => SignKind::Feishu,
        Some(other) => {
            return Err(kerr(
                "sign",
                format!(
                "unknown signer {other:?}; expected standard-webhooks, dingtalk, feishu or none"
            ),
            ))
        }
    };
    let sign = match sign {
        SignKind::None => SignKind::None,
        // A preset's signer applies when a secret is given (DingTalk and Feishu robots
        // may run without signing); one the channel chose needs its secret.
        s if secrets.is_empty() && !sign_explicit => {
            let _ = s;
            SignKind::None
        }
        s if secrets.is_empty() => {
            return Err(kerr(
                "secret",
                format!("required by sign = {:?}", s.as_str()),
            ))
        }
        s => s,
    };
    if matches!(sign, SignKind::DingTalk | SignKind::Feishu) && secrets.len() > 1 {
        return Err(kerr(
            "secrets",
            "dingtalk and feishu signing take one secret",
        ));
    }

    Ok(sign)
}

/// `vars`, with `${VAR}`s in their strings expanded.
fn vars(
    keys: &PlatformKeys,
    expand: &Expand<'_>,
) -> Result<serde_json::Map<String, Value>, KeyError> {
    let mut vars = serde_json::Map::new();
    for (k, v) in keys.vars.iter().flatten() {
        let key = format!("vars.{k}");
        let v = match v {
            toml::Value::String(s) => Value::String(expand(&key, s)?),
            other => toml_to_json(other).map_err(|e| kerr(&key, e))?,
        };
        vars.insert(k.clone(), v);
    }
    Ok(vars)
}

/// How long an answer may take and how large it may be.
fn answer_limits(keys: &PlatformKeys) -> Result<(u64, usize), KeyError> {
    let answer_timeout_ms = match &keys.answer_timeout {
        Some(d) => match parse_duration_ms(d).map_err(|e| kerr("answer_timeout", e))? {
            0 => return Err(kerr("answer_timeout", "must be more than 0")),
            ms => ms,
        },
        None => ANSWER_TIMEOUT_MS,
    };
    let answer_bytes_max = match keys.answer_bytes_max {
        Some(n) if n == 0 || n > 16 << 20 => {
            return Err(kerr("answer_bytes_max", "must be between 1 and 16777216"))
        }
        Some(n) => n,
        None => ANSWER_BYTES_MAX,
    };
    Ok((answer_timeout_ms, answer_bytes_max))
}

/// One request, ready to send.
pub struct Prepared {
    pub method: Method,
    pub uri: Uri,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Vec<u8>,
    /// Whether the headers set `content-type`.
    pub has_content_type: bool,
}

/// Never prints a secret: the URL as `scheme://host[:port]` (a token or key may be in its
/// query), headers by name only, the body by its length.
impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Prepared")
            .field("method", &self.method)
            .field("uri", &crate::logsafe::UriOrigin(&self.uri))
            .field("headers", &names)
            .field("body_bytes", &self.body.len())
            .field("has_content_type", &self.has_content_type)
            .finish()
    }
}

/// A platform channel, running.
pub struct Platform {
    pub spec: PlatformSpec,
    channel: String,
    templates: Templates,
    method: Tpl,
    url: Tpl,
    headers: Vec<(HeaderName, Tpl)>,
    body: Option<Tpl>,
    /// The body is JSON (default content type, or a `*json*` one): check what renders.
    json_body: bool,
    /// `scheme://host[:port]` every rendered URL must keep.
    origin: String,
    pub token: Option<TokenCache>,
    sign_secret: Option<String>,
}

/// Every `vars.NAME` a template uses must be configured.
fn check_vars_configured(spec: &PlatformSpec, used: Vec<String>) -> Result<(), KeyError> {
    for name in used {
        if spec.vars.get(&name).is_none() {
            return Err(kerr(
                &format!("vars.{name}"),
                format!(
                    "required: the templates use vars.{name}{}",
                    spec.preset
                        .as_deref()
                        .map(|p| format!(" (preset {p})"))
                        .unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

static EMPTY_OBJECT: std::sync::LazyLock<Value> =
    std::sync::LazyLock::new(|| Value::Object(serde_json::Map::new()));
static NO_METADATA: BTreeMap<String, String> = BTreeMap::new();

impl Platform {
    /// Compiles the templates of `spec`. Errors name the key relative to the channel.
    pub fn new(
        channel: &str,
        spec: PlatformSpec,
        secrets: &[String],
    ) -> Result<Platform, KeyError> {
        let mut templates = Templates::new();
        let mut add = |key: &str, source: &str| -> Result<Tpl, KeyError> {
            templates
                .add(&format!("channels.{channel}.{key}"), source)
                .map_err(|e| kerr(key, e))
        };
        let method = add("method", &spec.method)?;
        let base = check_url(&spec.url).map_err(|e| kerr("url", url_error_unechoed(&e)))?;
        let url = add("url", &spec.url)?;
        let mut headers = Vec::new();
        let mut content_type = None;
        for (name, value) in &spec.headers {
            let key = format!("headers.{name}");
            let hn = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| kerr(&key, "not a header name"))?;
            if hn == hyper::header::CONTENT_TYPE {
                content_type = Some(value.to_ascii_lowercase());
            }
            headers.push((hn, add(&key, value)?));
        }
        let body = spec.body.as_deref().map(|b| add("body", b)).transpose()?;
        let mut used = Vec::new();
        for t in [&method, &url]
            .into_iter()
            .chain(headers.iter().map(|(_, t)| t))
            .chain(body.iter())
        {
            used.extend(templates.vars_used(t));
        }
        check_vars_configured(&spec, used)?;
        if spec.sign == SignKind::Feishu && body.is_none() {
            return Err(kerr(
                "sign",
                "feishu signing needs a body template (it signs inside the JSON body)",
            ));
        }
        let json_body = content_type.as_deref().is_none_or(|ct| ct.contains("json"));
        if spec.sign == SignKind::Feishu && !json_body {
            return Err(kerr("sign", "feishu signing needs a JSON body"));
        }
        let origin = format!(
            "{}://{}",
            base.scheme_str().unwrap_or("http"),
            base.authority().map(|a| a.as_str()).unwrap_or("")
        );
        let sign_secret = match spec.sign {
            SignKind::DingTalk | SignKind::Feishu => secrets.first().cloned(),
            _ => None,
        };
        let token = spec.token.clone().map(TokenCache::new);
        Ok(Platform {
            spec,
            channel: channel.to_string(),
            templates,
            method,
            url,
            headers,
            body,
            json_body,
            origin,
            token,
            sign_secret,
        })
    }

    /// The keys whose values are templates (for the channel view).
    pub fn templated_fields(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (k, t) in [("method", &self.method), ("url", &self.url)] {
            if !t.is_static() {
                out.push(k.to_string());
            }
        }
        for (name, t) in &self.headers {
            if !t.is_static() {
                out.push(format!("headers.{name}"));
            }
        }
        if self.body.as_ref().is_some_and(|t| !t.is_static()) {
            out.push("body".into());
        }
        out
    }

    /// The request for one delivery. An error is the message's permanent failure.
    pub fn prepare(
        &self,
        d: &Delivery,
        traceparent: &str,
        token: Option<&str>,
        now_ms: u64,
    ) -> Result<Prepared, String> {
        let parsed;
        let data = match d.data.as_deref() {
            Some(text) => {
                parsed = serde_json::from_str::<Value>(text)
                    .map_err(|e| format!("message data is not JSON: {e}"))?;
                &parsed
            }
            None => &*EMPTY_OBJECT,
        };
        let ctx = Context {
            to: &d.to,
            body: &d.body,
            data,
            task_id: &d.task_id,
            run: d.run,
            seq: d.seq,
            attempt: d.attempt,
            idempotency_key: &d.idempotency_key,
            traceparent,
            scheduled_at: &d.scheduled_at,
            scheduled_at_ms: d.scheduled_at_ms,
            minutes_left: d.minutes_left,
            metadata: &d.metadata,
            token,
            vars: &self.spec.vars,
            channel: &self.channel,
        };
        self.render(&ctx, || serde_json::to_vec(d), now_ms)
    }

    /// The request for an alert: templates see a one-line description as `body` (so a WeCom
    /// or Slack channel can carry alerts), `to` empty, the alert id as `idempotency_key`.
    pub fn prepare_alert(
        &self,
        a: &Alert,
        token: Option<&str>,
        now_ms: u64,
    ) -> Result<Prepared, String> {
        let mut text = format!("herald alert: {} on channel {}", a.event, a.channel);
        if let Some(t) = &a.task_id {
            text.push_str(&format!(", task {t}"));
        }
        if let Some(to) = &a.to {
            text.push_str(&format!(", to {to}"));
        }
        if let Some(e) = &a.error {
            text.push_str(&format!(": {e}"));
        }
        let data = serde_json::to_value(a).unwrap_or_else(|_| EMPTY_OBJECT.clone());
        let ctx = Context {
            to: "",
            body: &text,
            data: &data,
            task_id: a.task_id.as_deref().unwrap_or(""),
            run: 0,
            seq: 0,
            attempt: 1,
            idempotency_key: &a.id,
            traceparent: "",
            scheduled_at: &a.at,
            scheduled_at_ms: now_ms,
            minutes_left: None,
            metadata: &NO_METADATA,
            token,
            vars: &self.spec.vars,
            channel: &self.channel,
        };
        self.render(&ctx, || serde_json::to_vec(a), now_ms)
    }

    fn render(
        &self,
        ctx: &Context<'_>,
        default_body: impl FnOnce() -> Result<Vec<u8>, serde_json::Error>,
        now_ms: u64,
    ) -> Result<Prepared, String> {
        let all_static = self.method.is_static()
            && self.url.is_static()
            && self.headers.iter().all(|(_, t)| t.is_static())
            && self.body.as_ref().is_none_or(Tpl::is_static);
        let value = if all_static {
            minijinja::Value::UNDEFINED
        } else {
            ctx.value()
        };
        let method = self.templates.render(&self.method, &value)?;
        let method = Method::from_bytes(method.trim().as_bytes()).map_err(|_| {
            format!(
                "template channels.{}.method rendered {method:?}, not an HTTP method",
                self.channel
            )
        })?;
        let mut url = self.templates.render(&self.url, &value)?.into_owned();
        let mut body = match &self.body {
            Some(t) => self.templates.render(t, &value)?.into_owned().into_bytes(),
            None => default_body().map_err(|e| format!("encode: {e}"))?,
        };
        if self.json_body && self.body.is_some() {
            if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
                return Err(format!(
                    "template channels.{}.body rendered invalid JSON ({e}); use the tojson filter for values",
                    self.channel
                ));
            }
        }
        self.sign(&mut url, &mut body, now_ms)?;
        let uri: Uri = url.parse().map_err(|e| {
            format!(
                "template channels.{}.url rendered an invalid URL: {e}",
                self.channel
            )
        })?;
        self.check_origin(&uri)?;
        if !self.url.is_static() {
            self.check_dot_segments(&uri)?;
        }
        let mut headers = Vec::with_capacity(self.headers.len());
        let mut has_content_type = false;
        for (name, t) in &self.headers {
            let v = self.templates.render(t, &value)?;
            let hv = HeaderValue::from_str(&v).map_err(|_| {
                format!(
                    "template channels.{}.headers.{name} rendered an invalid header value",
                    self.channel
                )
            })?;
            has_content_type |= name == hyper::header::CONTENT_TYPE;
            headers.push((name.clone(), hv));
        }
        Ok(Prepared {
            method,
            uri,
            headers,
            body,
            has_content_type,
        })
    }

    /// Signs a rendered request the platform's way: DingTalk in the query, Feishu in the body.
    fn sign(&self, url: &mut String, body: &mut Vec<u8>, now_ms: u64) -> Result<(), String> {
        match (self.spec.sign, &self.sign_secret) {
            (SignKind::DingTalk, Some(secret)) => {
                let sign = dingtalk_sign(secret, now_ms);
                let sep = if url.contains('?') { '&' } else { '?' };
                url.push_str(&format!(
                    "{sep}timestamp={now_ms}&sign={}",
                    percent_encode(&sign)
                ));
            }
            (SignKind::Feishu, Some(secret)) => {
                let ts = now_ms / 1_000;
                let mut v: Value = serde_json::from_slice(body)
                    .map_err(|e| format!("sign = feishu: the body is not JSON: {e}"))?;
                let Some(obj) = v.as_object_mut() else {
                    return Err("sign = feishu: the body must be a JSON object".into());
                };
                obj.insert("timestamp".into(), Value::String(ts.to_string()));
                obj.insert("sign".into(), Value::String(feishu_sign(secret, ts)));
                *body = serde_json::to_vec(&v).map_err(|e| format!("encode: {e}"))?;
            }
            _ => {}
        }
        Ok(())
    }

    /// A rendered URL must keep the configured scheme and host (a template may not send
    /// elsewhere).
    fn check_origin(&self, uri: &Uri) -> Result<(), String> {
        let origin_ok = match (uri.scheme_str(), uri.authority()) {
            (Some(s), Some(a)) => {
                self.origin
                    .strip_prefix(s)
                    .and_then(|rest| rest.strip_prefix("://"))
                    == Some(a.as_str())
            }
            _ => false,
        };
        if !origin_ok {
            return Err(format!(
                "template channels.{}.url rendered a URL for another host",
                self.channel
            ));
        }
        Ok(())
    }

    /// A rendered URL's path may not have a `.` or `..` segment: `http::Uri` keeps them, the
    /// receiver resolves them, so a value rendered into the path (`../../admin`, or `..` alone,
    /// which `urlencode` leaves as it is) would reach another path on the host with the
    /// channel's headers. The message's data is at fault: a permanent failure of that message.
    /// (A URL template whose own text has such a segment is refused with the config.)
    fn check_dot_segments(&self, uri: &Uri) -> Result<(), String> {
        if uri.path().split('/').any(is_dot_segment) {
            return Err(format!(
                "template channels.{}.url rendered a path with a \".\" or \"..\" segment (from a value in the path; use the urlencode filter, and no \".\" or \"..\" values)",
                self.channel
            ));
        }
        Ok(())
    }
}

/// Whether a path segment is `.` or `..`, also percent-encoded (receivers normalize both),
/// also before a `;`: Tomcat and Jetty drop a segment's `;params` before they resolve dot
/// segments, so `..;x` climbs as `..` does there.
fn is_dot_segment(segment: &str) -> bool {
    let head = segment.split(';').next().unwrap_or("");
    let s = head.to_ascii_lowercase().replace("%2e", ".");
    s == "." || s == ".."
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub fn percent_encode(s: &str) -> String {
    percent_encode_bytes(s.as_bytes())
}

/// [`percent_encode`] of bytes (UTF-8 or not).
pub fn percent_encode_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "KEY" => Some("k-123".into()),
            "SECRET" => Some("s3cr3t".into()),
            _ => None,
        }
    }

    #[test]
    fn env_expansion() {
        assert_eq!(expand_env("a${KEY}b", &env).unwrap(), "ak-123b");
        assert_eq!(expand_env("$${KEY} $5 $", &env).unwrap(), "${KEY} $5 $");
        assert_eq!(
            expand_env("${NOPE}", &env).unwrap_err(),
            "environment variable NOPE is not set"
        );
        assert!(expand_env("${KEY", &env).unwrap_err().contains("unclosed"));
        assert!(expand_env("${A-B}", &env).is_err());
    }

    #[test]
    fn urls() {
        assert_eq!(
            check_url("https://h:8/x?a={{ token }}")
                .unwrap()
                .to_string(),
            "https://h:8/"
        );
        assert!(check_url("https://{{ vars.host }}/x").is_err());
        assert!(check_url("http://h{{ x }}").is_err());
        assert!(check_url("ftp://h/").is_err());
        assert_eq!(
            check_url("http://h/send?k=v").unwrap().to_string(),
            "http://h/send?k=v"
        );
    }

    fn delivery(data: Option<&str>) -> Delivery {
        Delivery {
            task_id: "t".into(),
            run: 1,
            seq: 0,
            to: "u1".into(),
            body: "hi \"there\"".into(),
            scheduled_at: "2026-12-01T01:00:00Z".into(),
            attempt: 1,
            idempotency_key: "t:1:0".into(),
            sent_at: "2026-12-01T01:00:00Z".into(),
            data: data.map(str::to_string),
            scheduled_at_ms: 1_796_086_800_000,
            minutes_left: None,
            metadata: BTreeMap::new(),
            kind: None,
            about: None,
            trace_id: [0; 16],
            epoch: None,
        }
    }

    fn platform(toml_keys: &str, url: &str, secrets: &[String]) -> Platform {
        let user: PlatformKeys = toml::from_str(toml_keys).unwrap();
        let explicit = user.sign.is_some();
        let keys = resolve_preset(user).unwrap();
        let spec = PlatformSpec::build(&keys, url, secrets, explicit, &env).unwrap();
        Platform::new("c", spec, secrets).unwrap()
    }

    #[test]
    fn dingtalk_signs_in_the_query_and_feishu_in_the_body() {
        let now = 1_700_000_000_123;
        let p = platform(
            "preset = \"dingtalk-robot\"",
            "https://oapi.dingtalk.com/robot/send?access_token=abc",
            &["SECxyz".into()],
        );
        let r = p.prepare(&delivery(None), "", None, now).unwrap();
        let sign = percent_encode(&dingtalk_sign("SECxyz", now));
        assert_eq!(
            r.uri.to_string(),
            format!(
                "https://oapi.dingtalk.com/robot/send?access_token=abc&timestamp={now}&sign={sign}"
            )
        );
        let p = platform(
            "preset = \"feishu-bot\"",
            "https://open.feishu.cn/open-apis/bot/v2/hook/x",
            &["fs".into()],
        );
        let r = p.prepare(&delivery(None), "", None, now).unwrap();
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["timestamp"], "1700000000");
        assert_eq!(body["sign"], feishu_sign("fs", 1_700_000_000));
        assert_eq!(body["content"]["text"], "hi \"there\"");
        // A preset's signer without a secret: unsigned (keyword-secured robots).
        let p = platform("preset = \"feishu-bot\"", "https://open.feishu.cn/h/x", &[]);
        assert_eq!(p.spec.sign, SignKind::None);
    }

    #[test]
    fn render_errors_are_the_messages_not_the_channels() {
        let p = platform(
            "body = '{\"x\": {{ body }}}'",
            "http://h/{{ data.path }}",
            &[],
        );
        let e = p
            .prepare(&delivery(Some(r#"{"path":"ok"}"#)), "", None, 0)
            .unwrap_err();
        assert!(e.contains("rendered invalid JSON"), "{e}");
        let e = p.prepare(&delivery(None), "", None, 0).unwrap_err();
        assert_eq!(
            e,
            "template channels.c.url: undefined variable data.path (line 1)"
        );
        let p = platform("body = '{}'", "http://h/{{ data.path }}", &[]);
        // Message data lands in the path, never in the host the operator wrote.
        let r = p
            .prepare(
                &delivery(Some(r#"{"path":"@evil.example/x"}"#)),
                "",
                None,
                0,
            )
            .unwrap();
        assert_eq!(r.uri.host(), Some("h"));
        // Method and headers render too; a header may not carry a newline.
        let p = platform(
            "method = \"{{ vars.m }}\"\nvars = { m = \"PUT\" }\nheaders = { \"X-To\" = \"{{ to }}\" }",
            "http://h/x",
            &[],
        );
        let r = p.prepare(&delivery(None), "", None, 0).unwrap();
        assert_eq!(r.method, Method::PUT);
        assert_eq!(r.headers[0].1, "u1");
        let mut d = delivery(None);
        d.to = "a\r\nX-Evil: 1".into();
        assert!(p
            .prepare(&d, "", None, 0)
            .unwrap_err()
            .contains("invalid header value"));
    }

    /// A value in the URL's path stays one segment: `urlencode` escapes `/`, and a rendered
    /// `.` or `..` segment is refused (the receiver would resolve it to another path).
    #[test]
    fn a_value_in_the_path_cannot_climb_out_of_it() {
        let p = platform(
            "body = '{}'",
            "http://gw/api/users/{{ to | urlencode }}/send",
            &[],
        );
        let mut d = delivery(None);
        d.to = "../../admin/purge".into();
        let r = p.prepare(&d, "", None, 0).unwrap();
        assert_eq!(r.uri.path(), "/api/users/..%2F..%2Fadmin%2Fpurge/send");
        // Its Debug shows neither the path nor the query (a token may be there).
        let shown = format!("{r:?}");
        assert!(
            !shown.contains("admin") && shown.contains("http://gw"),
            "{shown}"
        );
        for to in ["..", "."] {
            d.to = to.into();
            let e = p.prepare(&d, "", None, 0).unwrap_err();
            assert!(e.contains("segment"), "{to}: {e}");
        }
        // An encoded dot is encoded again: one harmless segment.
        d.to = "%2e%2E".into();
        let r = p.prepare(&d, "", None, 0).unwrap();
        assert_eq!(r.uri.path(), "/api/users/%252e%252E/send");
        // Without the filter, a value's `/` makes segments; a dot segment is still refused.
        let p = platform("body = '{}'", "http://gw/api/users/{{ to }}/send", &[]);
        for to in ["%2e%2E", ".%2E/x", "x/./y"] {
            d.to = to.into();
            let e = p.prepare(&d, "", None, 0).unwrap_err();
            assert!(e.contains("segment"), "{to}: {e}");
        }
        d.to = "x/../../admin".into();
        let e = p.prepare(&d, "", None, 0).unwrap_err();
        assert_eq!(
            e,
            "template channels.c.url rendered a path with a \".\" or \"..\" segment (from a value in the path; use the urlencode filter, and no \".\" or \"..\" values)"
        );
        d.to = "a..b".into();
        assert_eq!(
            p.prepare(&d, "", None, 0).unwrap().uri.path(),
            "/api/users/a..b/send"
        );
        // A static URL is the operator's; a template's own text may not have a dot segment.
        assert!(check_url("http://gw/a/../{{ to }}").is_err());
        assert!(check_url("http://gw/a/..x/{{ to }}?p=../").is_ok());
        // A segment after a template is the template's own text too; one a value begins
        // is checked when it is rendered.
        let e = check_url("http://gw/{{ vars.v }}/./send").unwrap_err();
        assert_eq!(url_error_unechoed(&e), DOT_SEGMENT);
        assert!(check_url("http://gw/.{{ name }}").is_ok());
    }

    /// `..;x` is `..` to Tomcat and Jetty, which drop a segment's `;params` before they resolve
    /// dot segments: refused when rendered and in a template's own text, in any case of
    /// percent-encoding. A `;` after other text, or an encoded one, is an ordinary segment.
    #[test]
    fn a_dot_segment_with_path_parameters_is_refused() {
        let p = platform("body = '{}'", "http://gw/api/users/{{ to }}/send", &[]);
        let mut d = delivery(None);
        for to in [
            "..;x",
            ".;x",
            "..;",
            "%2e%2e;x",
            "%2E.;jsessionid=1",
            ".%2e;",
            "x/..;/admin",
        ] {
            d.to = to.into();
            let e = p.prepare(&d, "", None, 0).unwrap_err();
            assert!(e.contains("segment"), "{to}: {e}");
        }
        for to in ["a..;x", "x;..", "..x;y", "..%3Bx"] {
            d.to = to.into();
            assert!(p.prepare(&d, "", None, 0).is_ok(), "{to}");
        }
        // With the filter `;` is encoded: `..%3Bx` is one harmless segment.
        let p = platform("body = '{}'", "http://gw/u/{{ to | urlencode }}", &[]);
        d.to = "..;x".into();
        assert_eq!(p.prepare(&d, "", None, 0).unwrap().uri.path(), "/u/..%3Bx");
        for url in [
            "http://gw/a/..;x/{{ to }}",
            "http://gw/a/.;/{{ to }}",
            "http://gw/{{ to }}/%2E%2e;p=1/send",
            "http://gw/a/..;{{ to }}",
            "http://gw/a/..?p={{ to }}",
        ] {
            let e = check_url(url).unwrap_err();
            assert_eq!(url_error_unechoed(&e), DOT_SEGMENT, "{url}");
        }
        assert!(check_url("http://gw/a..;x/{{ to }}").is_ok());
        assert!(check_url("http://gw/.{{ to }};x").is_ok());
    }

    #[test]
    fn percent() {
        assert_eq!(percent_encode("a+b/c=="), "a%2Bb%2Fc%3D%3D");
    }
}

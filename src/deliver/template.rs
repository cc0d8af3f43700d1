//! Request templates of platform channels, on minijinja.
//!
//! A channel's method, URL, header values and body are templates rendered per attempt. Text
//! without template syntax is kept as it is and costs nothing to "render". Values are escaped
//! where they land by filters: `tojson` for JSON bodies, `urlencode` for URLs; nothing is
//! escaped implicitly (auto-escape is off), and undefined values fail loudly when printed
//! (`SemiStrict`: `{% if data.x %}` is fine, `{{ data.x }}` without `x` is an error).
//!
//! A template that cannot parse, or names a variable herald never provides, is refused when
//! the config is read; a template that fails for one message is that message's permanent
//! failure, with a reason that names the template and the variable.

use std::borrow::Cow;
use std::collections::BTreeMap;

use minijinja::value::Kwargs;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior, Value};
use serde::Serialize;

/// herald's `urlencode`: everything but RFC 3986 unreserved characters percent-encoded, `/`
/// included (minijinja's leaves `/` as it is, so a value in a URL path could add segments and
/// climb out of it: `../../admin`); a map becomes `k=v&...` of encoded keys and values, its
/// `none` values left out, as minijinja does. A value that is just `.` or `..` stays as it is:
/// a rendered URL with such a path segment is refused (`Platform::check_dot_segments`).
fn urlencode(v: &Value) -> String {
    use super::platform::{percent_encode, percent_encode_bytes};
    if v.is_none() || v.is_undefined() {
        return String::new();
    }
    if let Some(b) = v.as_bytes().filter(|_| v.as_str().is_none()) {
        return percent_encode_bytes(b);
    }
    if v.kind() != minijinja::value::ValueKind::Map {
        return match v.as_str() {
            Some(s) => percent_encode(s),
            None => percent_encode(&v.to_string()),
        };
    }
    let mut out = String::new();
    for k in v.try_iter().into_iter().flatten() {
        let item = v.get_item(&k).unwrap_or_default();
        if item.is_none() || item.is_undefined() {
            continue;
        }
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(&percent_encode(&k.to_string()));
        out.push('=');
        out.push_str(&percent_encode(&item.to_string()));
    }
    out
}

/// The variables a template may use.
pub const VARIABLES: &[&str] = &[
    "to",
    "body",
    "data",
    "task_id",
    "run",
    "seq",
    "attempt",
    "idempotency_key",
    "traceparent",
    "scheduled_at",
    "scheduled_at_ms",
    "minutes_left",
    "metadata",
    "token",
    "vars",
    "channel",
];

/// Names minijinja itself provides (globals and loop/block helpers).
const BUILTINS: &[&str] = &[
    "range",
    "dict",
    "namespace",
    "debug",
    "lipsum",
    "cycler",
    "joiner",
    "loop",
    "self",
    "super",
    "varargs",
    "kwargs",
    "caller",
    "true",
    "false",
    "none",
];

/// One templated field: fixed text, or the name of a template in [`Templates`].
#[derive(Clone, Debug)]
pub enum Tpl {
    Static(String),
    /// Named by its config key (`channels.team.body`).
    Template(String),
}

impl Tpl {
    pub fn is_static(&self) -> bool {
        matches!(self, Tpl::Static(_))
    }
}

/// The compiled templates of one channel.
pub struct Templates {
    env: Environment<'static>,
}

impl Default for Templates {
    fn default() -> Templates {
        Templates::new()
    }
}

/// True if `text` uses template syntax.
pub fn is_template(text: &str) -> bool {
    text.contains("{{") || text.contains("{%") || text.contains("{#")
}

impl Templates {
    pub fn new() -> Templates {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_keep_trailing_newline(true);
        // A template is written by the operator, but its loops may run over message data:
        // bound the work one render may do.
        env.set_recursion_limit(64);
        // The escaping filters refuse an undefined value (the built-ins would turn it into
        // `null` or ""): `{{ data.template_id | tojson }}` without a template id is an error
        // that names it, not a message sent with a null.
        env.add_filter(
            "tojson",
            |v: &Value, indent: Option<Value>, kwargs: Kwargs| -> Result<Value, Error> {
                if v.is_undefined() {
                    return Err(Error::from(ErrorKind::UndefinedError));
                }
                minijinja::filters::tojson(v, indent, kwargs)
            },
        );
        env.add_filter("urlencode", |v: &Value| -> Result<String, Error> {
            if v.is_undefined() {
                return Err(Error::from(ErrorKind::UndefinedError));
            }
            Ok(urlencode(v))
        });
        Templates { env }
    }

    /// Compiles `source` as the template for config key `key`. Errors say what is wrong
    /// (syntax, or a variable herald does not provide); the caller prefixes the key.
    pub fn add(&mut self, key: &str, source: &str) -> Result<Tpl, String> {
        if !is_template(source) {
            return Ok(Tpl::Static(source.to_string()));
        }
        self.env
            .add_template_owned(key.to_string(), source.to_string())
            .map_err(|e| describe(&e))?;
        let tmpl = self
            .env
            .get_template(key)
            .map_err(|e| format!("template: {}", describe(&e)))?;
        let mut unknown: Vec<String> = tmpl
            .undeclared_variables(false)
            .into_iter()
            .filter(|v| !VARIABLES.contains(&v.as_str()) && !BUILTINS.contains(&v.as_str()))
            .collect();
        if !unknown.is_empty() {
            unknown.sort();
            return Err(format!(
                "unknown variable{} {}; templates can use {}",
                if unknown.len() > 1 { "s" } else { "" },
                unknown.join(", "),
                VARIABLES.join(", ")
            ));
        }
        // Filters, tests and functions are looked up when rendering: a trial render with
        // sample values catches a misspelt one now rather than on every message.
        let sample_data = serde_json::json!({});
        let metadata = BTreeMap::new();
        let sample = Context {
            to: "to",
            body: "body",
            data: &sample_data,
            task_id: "task",
            run: 1,
            seq: 0,
            attempt: 1,
            idempotency_key: "task:1:0",
            traceparent: "",
            scheduled_at: "2026-01-01T00:00:00Z",
            scheduled_at_ms: 1_767_225_600_000,
            minutes_left: Some(5),
            metadata: &metadata,
            token: Some("token"),
            vars: &sample_data,
            channel: "channel",
        };
        if let Err(e) = tmpl.render(sample.value()) {
            if matches!(
                e.kind(),
                ErrorKind::UnknownFilter
                    | ErrorKind::UnknownTest
                    | ErrorKind::UnknownFunction
                    | ErrorKind::UnknownMethod
                    | ErrorKind::SyntaxError
            ) {
                return Err(describe(&e));
            }
        }
        Ok(Tpl::Template(key.to_string()))
    }

    /// The `vars.NAME` paths a template uses (to check them against the channel's `vars`).
    pub fn vars_used(&self, t: &Tpl) -> Vec<String> {
        let Tpl::Template(name) = t else {
            return Vec::new();
        };
        let Ok(tmpl) = self.env.get_template(name) else {
            return Vec::new();
        };
        let mut v: Vec<String> = tmpl
            .undeclared_variables(true)
            .into_iter()
            .filter_map(|p| {
                p.strip_prefix("vars.")
                    .map(|r| r.split('.').next().unwrap_or(r).to_string())
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Renders one field. Errors name the template and, for undefined values, the variables
    /// that could not be resolved.
    pub fn render<'a>(&self, t: &'a Tpl, ctx: &Value) -> Result<Cow<'a, str>, String> {
        let name = match t {
            Tpl::Static(s) => return Ok(Cow::Borrowed(s.as_str())),
            Tpl::Template(name) => name,
        };
        let tmpl = self
            .env
            .get_template(name)
            .map_err(|e| format!("template {name}: {}", describe(&e)))?;
        tmpl.render(ctx).map(Cow::Owned).map_err(|e| {
            if e.kind() == ErrorKind::UndefinedError {
                let mut missing: Vec<String> = tmpl
                    .undeclared_variables(true)
                    .into_iter()
                    .filter(|path| !resolves(ctx, path))
                    .collect();
                missing.sort();
                // Some of those may only be tested (`{% if data.x %}`), which is fine: name the
                // ones whose absence is the error, found by defining each in turn.
                if missing.len() > 1 {
                    if let Ok(base) = serde_json::to_value(ctx) {
                        let culprits: Vec<String> = missing
                            .iter()
                            .filter(|path| {
                                let mut v = base.clone();
                                define(&mut v, path);
                                match tmpl.render(&v) {
                                    Ok(_) => true,
                                    Err(e2) => {
                                        e2.kind() != ErrorKind::UndefinedError
                                            || e2.line() != e.line()
                                    }
                                }
                            })
                            .cloned()
                            .collect();
                        if !culprits.is_empty() {
                            missing = culprits;
                        }
                    }
                }
                if !missing.is_empty() {
                    return format!(
                        "template {name}: undefined variable {} (line {})",
                        missing.join(", "),
                        e.line().unwrap_or(0)
                    );
                }
            }
            format!("template {name}: {}", describe(&e))
        })
    }
}

/// One line: minijinja's message and where, never the template source (which may hold a
/// secret from the environment).
fn describe(e: &minijinja::Error) -> String {
    let mut s = e.kind().to_string();
    if let Some(d) = e.detail() {
        s.push_str(": ");
        s.push_str(d);
    }
    if let Some(line) = e.line() {
        s.push_str(&format!(" (line {line})"));
    }
    s
}

/// Sets the dotted `path` to a placeholder string, making objects on the way.
fn define(v: &mut serde_json::Value, path: &str) {
    let mut cur = v;
    for part in path.split('.') {
        if !cur.is_object() {
            *cur = serde_json::Value::Object(serde_json::Map::new());
        }
        let Some(obj) = cur.as_object_mut() else {
            return;
        };
        cur = obj
            .entry(part.to_string())
            .or_insert(serde_json::Value::Null);
    }
    *cur = serde_json::Value::String("x".into());
}

/// Does the dotted `path` (`data.template_id`) lead to a defined value in `ctx`?
fn resolves(ctx: &Value, path: &str) -> bool {
    let mut cur = ctx.clone();
    for part in path.split('.') {
        match cur.get_attr(part) {
            Ok(v) if !v.is_undefined() => cur = v,
            _ => return false,
        }
    }
    true
}

/// The variables of one attempt.
#[derive(Serialize)]
pub struct Context<'a> {
    pub to: &'a str,
    pub body: &'a str,
    /// The message's `data` object (an empty object when it has none).
    pub data: &'a serde_json::Value,
    pub task_id: &'a str,
    pub run: u32,
    pub seq: u32,
    pub attempt: u32,
    pub idempotency_key: &'a str,
    /// The attempt's W3C `traceparent` (empty for alerts).
    pub traceparent: &'a str,
    pub scheduled_at: &'a str,
    pub scheduled_at_ms: u64,
    pub minutes_left: Option<u64>,
    pub metadata: &'a BTreeMap<String, String>,
    pub token: Option<&'a str>,
    /// The channel's own `vars` (e.g. a WeCom `agentid`).
    pub vars: &'a serde_json::Value,
    pub channel: &'a str,
}

impl Context<'_> {
    pub fn value(&self) -> Value {
        Value::from_serialize(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx_value(data: &serde_json::Value, body: &str) -> Value {
        let metadata = BTreeMap::from([("source".to_string(), "crm".to_string())]);
        Context {
            to: "wxid_a",
            body,
            data,
            task_id: "t1",
            run: 2,
            seq: 3,
            attempt: 1,
            idempotency_key: "t1:2:3",
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            scheduled_at: "2026-12-01T01:00:00Z",
            scheduled_at_ms: 1_796_086_800_000,
            minutes_left: Some(15),
            metadata: &metadata,
            token: Some("tok/en+1"),
            vars: &json!({"agentid": 1000002}),
            channel: "team",
        }
        .value()
    }

    #[test]
    fn renders_with_escaping_filters() {
        let mut t = Templates::new();
        let body = t
            .add(
                "channels.c.body",
                r#"{"touser":{{ to | tojson }},"agentid":{{ vars.agentid }},"text":{"content":{{ body | tojson }}},"tpl":{{ data.template_id | tojson }},"m":{{ minutes_left }},"src":{{ metadata.source | tojson }}}"#,
            )
            .unwrap();
        let url = t
            .add("channels.c.url", "http://h/send?access_token={{ token | urlencode }}&k={{ idempotency_key | urlencode }}")
            .unwrap();
        let fixed = t.add("channels.c.method", "POST").unwrap();
        assert!(fixed.is_static());
        let data = json!({"template_id": "T\"1"});
        let v = ctx_value(&data, "say \"hi\"\n<b>&");
        let out = t.render(&body, &v).unwrap();
        let parsed: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
        assert_eq!(parsed["text"]["content"], "say \"hi\"\n<b>&");
        assert_eq!(parsed["tpl"], "T\"1");
        assert_eq!(parsed["touser"], "wxid_a");
        assert_eq!(parsed["agentid"], 1000002);
        assert_eq!(parsed["m"], 15);
        assert_eq!(parsed["src"], "crm");
        assert_eq!(
            t.render(&url, &v).unwrap(),
            "http://h/send?access_token=tok%2Fen%2B1&k=t1%3A2%3A3"
        );
        assert_eq!(t.render(&fixed, &v).unwrap(), "POST");
    }

    /// herald's `urlencode` escapes `/` (a value in a path stays one segment) and everything
    /// else but RFC 3986 unreserved characters; maps become query strings.
    #[test]
    fn urlencode_escapes_slashes() {
        let mut t = Templates::new();
        let url = t
            .add(
                "channels.c.url",
                "http://gw/api/users/{{ to | urlencode }}/send",
            )
            .unwrap();
        let v = Value::from_serialize(json!({"to": "../../x"}));
        assert_eq!(
            t.render(&url, &v).unwrap(),
            "http://gw/api/users/..%2F..%2Fx/send"
        );
        let q = t
            .add(
                "channels.c.body",
                "{{ {'a b': 'c/d', 'n': none, 'k': 1} | urlencode }}|{{ 'é~-._' | urlencode }}|{{ none | urlencode }}",
            )
            .unwrap();
        assert_eq!(t.render(&q, &v).unwrap(), "a%20b=c%2Fd&k=1|%C3%A9~-._|");
    }

    #[test]
    fn a_missing_variable_is_named() {
        let mut t = Templates::new();
        let body = t
            .add(
                "channels.c.body",
                "{% if data.flag %}x{% endif %}{{ data.template_id | tojson }}",
            )
            .unwrap();
        let e = t.render(&body, &ctx_value(&json!({}), "b")).unwrap_err();
        assert_eq!(
            e,
            "template channels.c.body: undefined variable data.template_id (line 1)"
        );
    }

    #[test]
    fn bad_templates_are_refused() {
        let mut t = Templates::new();
        let e = t.add("k", "{{ body | tojson ").unwrap_err();
        assert!(e.starts_with("syntax error"), "{e}");
        let e = t.add("k2", "{{ bdy }} {{ tokn }}").unwrap_err();
        assert!(
            e.starts_with("unknown variables bdy, tokn; templates can use to, body"),
            "{e}"
        );
        let e = t.add("k3", "{{ body | nosuchfilter }}").unwrap_err();
        assert!(e.contains("unknown filter"), "{e}");
        // Loops and globals are fine.
        t.add("k4", "{% for x in range(3) %}{{ loop.index }}{% endfor %}")
            .unwrap();
    }
}

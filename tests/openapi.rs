//! The OpenAPI document (`src/api/openapi.json`, served at `/v1/openapi.json`): it is valid
//! JSON for OpenAPI 3.1.0, every `$ref` resolves, it is what the server serves, it documents
//! exactly the routes the router serves, and what the server really answers (status, content
//! type, JSON shape) is what it documents.

mod common;

use std::time::Duration;

use common::herald::{poll, wait_state, TestHerald};
use common::http::{self, Resp};
use serde_json::{json, Value};

/// Every (method, path) the router in `src/api/mod.rs` serves. `/healthz` answers any method;
/// GET is the documented one.
const SERVED: &[(&str, &str)] = &[
    ("GET", "/v1/tasks"),
    ("POST", "/v1/tasks"),
    ("GET", "/v1/tasks/{id}"),
    ("PATCH", "/v1/tasks/{id}"),
    ("DELETE", "/v1/tasks/{id}"),
    ("POST", "/v1/tasks/{id}/cancel"),
    ("POST", "/v1/tasks/{id}/pause"),
    ("POST", "/v1/tasks/{id}/resume"),
    ("POST", "/v1/tasks/{id}/trigger"),
    ("POST", "/v1/tasks/{id}/backfill"),
    ("GET", "/v1/tasks/{id}/runs"),
    ("GET", "/v1/tasks/{id}/timeline"),
    ("GET", "/v1/failures"),
    ("POST", "/v1/failures/{id}/retry"),
    ("DELETE", "/v1/failures/{id}"),
    ("GET", "/v1/channels"),
    ("GET", "/v1/cluster"),
    ("POST", "/v1/schedules/preview"),
    ("GET", "/v1/events"),
    ("GET", "/v1/export"),
    ("GET", "/v1/openapi.json"),
    ("GET", "/metrics"),
    ("GET", "/healthz"),
    ("GET", "/"),
    ("GET", "/dashboard/app.js"),
    ("GET", "/dashboard/format.js"),
    ("GET", "/dashboard/metrics.js"),
    ("GET", "/dashboard/chart.js"),
    ("GET", "/dashboard/timeline.js"),
    ("GET", "/dashboard/cluster.js"),
    ("GET", "/dashboard/app.css"),
];

/// Paths open without a token: health, and the dashboard page and its assets (no data).
const OPEN: &[&str] = &[
    "/healthz",
    "/",
    "/dashboard/app.js",
    "/dashboard/format.js",
    "/dashboard/metrics.js",
    "/dashboard/chart.js",
    "/dashboard/timeline.js",
    "/dashboard/cluster.js",
    "/dashboard/app.css",
];

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

fn doc() -> Value {
    serde_json::from_str(herald::api::OPENAPI).expect("openapi.json is valid JSON")
}

fn operation<'a>(doc: &'a Value, method: &str, path: &str) -> &'a Value {
    let op = &doc["paths"][path][method.to_ascii_lowercase()];
    assert!(op.is_object(), "{method} {path} is not documented");
    op
}

/// Follows a local `$ref` (`#/components/...`).
fn resolve<'a>(doc: &'a Value, r: &str) -> &'a Value {
    let pointer = r
        .strip_prefix('#')
        .unwrap_or_else(|| panic!("$ref {r:?} is not local"));
    doc.pointer(pointer)
        .unwrap_or_else(|| panic!("$ref {r:?} does not resolve"))
}

fn deref<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => deref(doc, resolve(doc, r)),
        None => v,
    }
}

fn collect_refs(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref" {
                    out.push((at.to_string(), x.as_str().expect("$ref is a string").into()));
                } else {
                    collect_refs(x, &format!("{at}/{k}"), out);
                }
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                collect_refs(x, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn document_is_openapi_3_1_0() {
    let d = doc();
    assert_eq!(d["openapi"], "3.1.0");
    assert_eq!(d["info"]["title"], "herald");
    assert_eq!(d["info"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(d["servers"][0]["url"], "http://127.0.0.1:7700");
    let bearer = &d["components"]["securitySchemes"]["bearerAuth"];
    assert_eq!(
        (&bearer["type"], &bearer["scheme"]),
        (&json!("http"), &json!("bearer"))
    );
    assert_eq!(d["security"], json!([{"bearerAuth": []}]));
}

#[test]
fn every_ref_resolves() {
    let d = doc();
    let mut refs = Vec::new();
    collect_refs(&d, "#", &mut refs);
    assert!(refs.len() > 50, "only {} $refs?", refs.len());
    for (at, r) in &refs {
        assert!(
            r.starts_with("#/components/"),
            "{at}: $ref {r:?} is not under #/components/"
        );
        let target = d.pointer(&r[1..]);
        assert!(
            target.is_some_and(Value::is_object),
            "{at}: $ref {r:?} does not resolve"
        );
    }
}

#[test]
fn documents_exactly_the_served_routes() {
    let d = doc();
    for (method, path) in SERVED {
        let op = operation(&d, method, path);
        assert!(
            op["operationId"].is_string(),
            "{method} {path}: operationId"
        );
        let responses = op["responses"].as_object().expect("responses");
        assert!(!responses.is_empty(), "{method} {path}: no responses");
        for (status, r) in responses {
            assert!(
                deref(&d, r)["description"].is_string(),
                "{method} {path} {status}: description"
            );
        }
        // Path parameters are declared.
        if path.contains("{id}") {
            let params = d["paths"][path]["parameters"].as_array().expect("params");
            let id = params
                .iter()
                .map(|p| deref(&d, p))
                .find(|p| p["name"] == "id" && p["in"] == "path")
                .unwrap_or_else(|| panic!("{path}: no path parameter id"));
            assert_eq!(id["required"], true);
            // Failure ids are a task id plus `:{run}:{seq}`.
            let max = if path.starts_with("/v1/failures") {
                150
            } else {
                128
            };
            assert_eq!(
                deref(&d, &id["schema"])["pattern"],
                format!("^[A-Za-z0-9._:-]{{1,{max}}}$").as_str()
            );
        }
        // Auth: everything but the open paths inherits the bearer requirement.
        if OPEN.contains(path) {
            assert_eq!(op["security"], json!([]), "{path} is open");
        } else {
            assert!(op.get("security").is_none(), "{method} {path}: security");
            assert!(responses.contains_key("401"), "{method} {path}: 401");
        }
        // Every error answer is a problem document (except /healthz's JSON 503).
        for (status, r) in responses {
            if status.starts_with('4') || status.starts_with('5') {
                let content = &deref(&d, r)["content"];
                let media = if *path == "/healthz" {
                    "application/json"
                } else {
                    "application/problem+json"
                };
                assert!(
                    content[media]["schema"].is_object(),
                    "{method} {path} {status}: not {media}"
                );
            }
        }
    }
    // And nothing the router does not serve.
    let paths = d["paths"].as_object().expect("paths");
    for (path, item) in paths {
        for m in METHODS {
            if item.get(*m).is_some() {
                let up = m.to_ascii_uppercase();
                assert!(
                    SERVED.contains(&(up.as_str(), path.as_str())),
                    "{up} {path} is documented but not served"
                );
            }
        }
    }
    let ids: Vec<&str> = paths
        .values()
        .flat_map(|item| METHODS.iter().filter_map(|m| item.get(*m)))
        .map(|op| op["operationId"].as_str().unwrap())
        .collect();
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "operationIds are unique");
    assert_eq!(
        doc()["components"]["responses"]["MethodNotAllowed"]["content"]["application/problem+json"]
            ["schema"]["$ref"],
        "#/components/schemas/Problem"
    );
}

#[test]
fn idempotency_key_header_is_documented_on_create() {
    let d = doc();
    let op = operation(&d, "POST", "/v1/tasks");
    let key = op["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| deref(&d, p))
        .find(|p| p["name"] == "Idempotency-Key")
        .expect("Idempotency-Key parameter");
    assert_eq!(key["in"], "header");
    for status in ["200", "201", "400", "409", "413", "422"] {
        assert!(op["responses"].get(status).is_some(), "create: {status}");
    }
    // Request bodies refuse unknown fields, as the server does.
    for name in [
        "TaskRequest",
        "PatchRequest",
        "ScheduleAt",
        "ScheduleAfter",
        "ScheduleCron",
        "ScheduleReminders",
        "RemindersRequest",
        "DstRequest",
        "MessageRequest",
        "PacingRequest",
        "RetryRequest",
    ] {
        assert_eq!(
            d["components"]["schemas"][name]["additionalProperties"], false,
            "{name}"
        );
    }
}

// ---- what the server answers is what the document says ----------------------------------

/// Checks `v` against `schema`: `$ref`, `type`, `enum`, `required`, `properties`,
/// `additionalProperties`, `items`, `oneOf`/`anyOf`, `minimum`/`maximum`. Stricter than JSON
/// Schema on purpose: an object key not in `properties` is an error even without
/// `additionalProperties: false`, so a field the server adds must be documented.
fn conforms(d: &Value, schema: &Value, v: &Value, at: &str, errs: &mut Vec<String>) {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        conforms(d, resolve(d, r), v, at, errs);
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(branches) = schema.get(key).and_then(Value::as_array) {
            let mut failures = Vec::new();
            let ok = branches
                .iter()
                .filter(|b| {
                    let mut e = Vec::new();
                    conforms(d, b, v, at, &mut e);
                    let pass = e.is_empty();
                    failures.extend(e);
                    pass
                })
                .count();
            if ok == 0 || (key == "oneOf" && ok > 1) {
                errs.push(format!(
                    "{at}: {ok} branches of {key} match {v}; {failures:?}"
                ));
            }
        }
    }
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => panic!("{at}: bad type {t}"),
        };
        let is = |t: &str| match t {
            "null" => v.is_null(),
            "boolean" => v.is_boolean(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "string" => v.is_string(),
            "array" => v.is_array(),
            "object" => v.is_object(),
            _ => panic!("{at}: unknown type {t}"),
        };
        if !types.iter().any(|t| is(t)) {
            errs.push(format!("{at}: {v} is not {types:?}"));
            return;
        }
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            errs.push(format!("{at}: {v} not in {e:?}"));
        }
    }
    if let Some(n) = v.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
            if n < min {
                errs.push(format!("{at}: {n} < {min}"));
            }
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
            if n > max {
                errs.push(format!("{at}: {n} > {max}"));
            }
        }
    }
    if let Some(obj) = v.as_object() {
        if let Some(req) = schema.get("required").and_then(Value::as_array) {
            for k in req.iter().filter_map(Value::as_str) {
                if !obj.contains_key(k) {
                    errs.push(format!("{at}: missing {k}"));
                }
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        let extra = schema.get("additionalProperties");
        for (k, x) in obj {
            let here = format!("{at}.{k}");
            match (props.and_then(|p| p.get(k)), extra) {
                (Some(s), _) => conforms(d, s, x, &here, errs),
                (None, Some(s)) if s.is_object() => conforms(d, s, x, &here, errs),
                (None, Some(Value::Bool(true))) => {}
                (None, _) if props.is_some() => errs.push(format!("{here}: not documented")),
                (None, _) => {}
            }
        }
    }
    if let (Some(items), Some(a)) = (schema.get("items"), v.as_array()) {
        for (i, x) in a.iter().enumerate() {
            conforms(d, items, x, &format!("{at}[{i}]"), errs);
        }
    }
}

/// `resp` is documented for `method template`: its status is listed, its content type is the
/// documented one, and a JSON body conforms to the documented schema.
fn check(d: &Value, method: &str, template: &str, resp: &Resp) {
    let what = format!("{method} {template} -> {}", resp.status);
    let op = operation(d, method, template);
    let documented = op["responses"]
        .get(resp.status.to_string())
        .unwrap_or_else(|| panic!("{what}: status not documented; body {}", resp.text()));
    let documented = deref(d, documented);
    let ct = resp.header("content-type").unwrap_or_default();
    let content = documented["content"].as_object().expect("content");
    let media = content
        .get(ct)
        .unwrap_or_else(|| panic!("{what}: content type {ct:?} not documented"));
    // One JSON document (not JSON lines, `application/jsonl`).
    if ct == "application/json" || ct.ends_with("+json") {
        let body = resp.json();
        let mut errs = Vec::new();
        conforms(d, &media["schema"], &body, "$", &mut errs);
        assert!(errs.is_empty(), "{what}: {body}\n{}", errs.join("\n"));
    }
}

async fn send(h: &TestHerald, method: &str, path: &str, body: Option<Value>) -> Resp {
    http::request(
        method,
        &h.url(path),
        &[],
        body.map(|b| b.to_string().into_bytes()),
    )
    .await
}

/// `POST /v1/tasks` with `Idempotency-Key: k-1`.
async fn create(h: &TestHerald, body: &Value) -> Resp {
    let url = h.url("/v1/tasks");
    let key = [("idempotency-key", "k-1")];
    http::request("POST", &url, &key, Some(body.to_string().into_bytes())).await
}

const CONFIG: &str = r#"
[channels.dead]
kind = "webhook"
url = "http://127.0.0.1:1/send"
timeout = "2s"
rate = "100/1s"
retry = { max_attempts = 1 }
breaker = { window = "60s", min_requests = 20, failure_ratio = 0.5, cool_down = "30s" }

[channels.robot]
kind = "webhook"
preset = "wecom-robot"
url = "http://127.0.0.1:1/cgi-bin/webhook/send?key=k"

[channels.app]
kind = "webhook"
preset = "wecom-app"
url = "http://127.0.0.1:1/cgi-bin/message/send?access_token={{ token | urlencode }}"
token = { url = "http://127.0.0.1:1/cgi-bin/gettoken?corpid=c&corpsecret=s" }
vars = { agentid = 1000002 }
"#;

#[tokio::test]
async fn served_document_is_the_constant() {
    let h = TestHerald::start("").await;
    let r = http::get(&h.url("/v1/openapi.json")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.text(), herald::api::OPENAPI);
    check(&doc(), "GET", "/v1/openapi.json", &r);
}

#[tokio::test]
async fn answers_match_the_document() {
    let d = doc();
    let h = TestHerald::start(CONFIG).await;

    // Create: 201, idempotent replay 200, key reuse 409, bad input 400/422, too large 413.
    let t1 = json!({"id": "t1", "name": "first", "schedule": {"after": "1h"},
                    "to": ["a", "b"], "body": "hi", "pacing": {"interval": "1ms"},
                    "metadata": {"k": "v"}});
    let r = create(&h, &t1).await;
    assert_eq!(r.status, 201, "{}", r.text());
    check(&d, "POST", "/v1/tasks", &r);
    let r = create(&h, &t1).await;
    assert_eq!(r.status, 200);
    check(&d, "POST", "/v1/tasks", &r);
    let r = create(
        &h,
        &json!({"id": "t9", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"}),
    )
    .await;
    assert_eq!(r.status, 409);
    check(&d, "POST", "/v1/tasks", &r);
    let r = http::request("POST", &h.url("/v1/tasks"), &[], Some(b"{nope".to_vec())).await;
    assert_eq!(r.status, 400);
    check(&d, "POST", "/v1/tasks", &r);
    let r = send(
        &h,
        "POST",
        "/v1/tasks",
        Some(json!({"schedule": {"after": "1h", "every": "1s"}})),
    )
    .await;
    assert_eq!(r.status, 422);
    check(&d, "POST", "/v1/tasks", &r);
    let big = json!({"schedule": {"after": "1h"}, "to": ["a"], "body": "x".repeat(2 << 20)});
    let r = send(&h, "POST", "/v1/tasks", Some(big)).await;
    assert_eq!(r.status, 413);
    check(&d, "POST", "/v1/tasks", &r);

    // Every schedule kind round-trips through the view's documented shape.
    let schedules = [
        json!({"at": "2030-12-02T09:00:00", "tz": "Asia/Shanghai", "dst": {"gap": "skip"}}),
        json!({"cron": "0 9 * * 1-5", "tz": "Europe/Paris", "start": "2030-01-01T00:00:00Z",
               "end": "2031-01-01T00:00:00Z", "max_runs": 3}),
        json!({"cron": "*/10 * * * * *"}),
        json!({"reminders": {"event_at": "2030-12-01T10:00:00", "tz": "Asia/Shanghai",
                             "before": ["30m", "15m", "5m"]}}),
    ];
    for (i, s) in schedules.iter().enumerate() {
        let mut body = json!({"id": format!("s{i}"), "schedule": s,
        "messages": [{"to": "a", "body": "in {{minutes_left}}"}],
        "retry": {"max_attempts": 2, "backoff": "exponential", "initial": "1s", "max": "1m"},
        "pacing": {"interval": "1s", "batch_size": 10, "batch_pause": "1m"},
        "misfire": "skip", "misfire_grace": "1m"});
        // `overlap` is for crons only (422 with another schedule).
        if s.get("cron").is_some() {
            body["overlap"] = json!("queue");
        }
        let r = send(&h, "POST", "/v1/tasks", Some(body)).await;
        assert_eq!(r.status, 201, "{s}: {}", r.text());
        check(&d, "POST", "/v1/tasks", &r);
    }

    // List, get.
    let r = send(
        &h,
        "GET",
        "/v1/tasks?limit=2&state=pending&channel=log",
        None,
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.json()["next"].is_string());
    check(&d, "GET", "/v1/tasks", &r);
    let r = send(&h, "GET", "/v1/tasks?colour=red", None).await;
    assert_eq!(r.status, 400);
    check(&d, "GET", "/v1/tasks", &r);
    for (path, status) in [
        ("/v1/tasks/t1", 200),
        ("/v1/tasks/none", 404),
        ("/v1/tasks/a%20b", 400),
    ] {
        let r = send(&h, "GET", path, None).await;
        assert_eq!(r.status, status, "{path}");
        check(&d, "GET", "/v1/tasks/{id}", &r);
    }

    // Control: pause, patch, resume, trigger; then the finished task refuses changes.
    let action = |a: &str| format!("/v1/tasks/{{id}}/{a}");
    let r = send(&h, "POST", "/v1/tasks/t1/pause", None).await;
    assert_eq!(r.status, 200);
    check(&d, "POST", &action("pause"), &r);
    let r = send(
        &h,
        "PATCH",
        "/v1/tasks/t1",
        Some(json!({"name": "renamed", "schedule": {"after": "2h"}})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    check(&d, "PATCH", "/v1/tasks/{id}", &r);
    let r = send(
        &h,
        "PATCH",
        "/v1/tasks/t1",
        Some(json!({"channel": "dead"})),
    )
    .await;
    assert_eq!(r.status, 422);
    check(&d, "PATCH", "/v1/tasks/{id}", &r);
    let r = send(&h, "POST", "/v1/tasks/t1/resume", None).await;
    assert_eq!(r.status, 200);
    check(&d, "POST", &action("resume"), &r);
    let r = send(&h, "POST", "/v1/tasks/t1/trigger", None).await;
    assert_eq!(r.status, 200);
    check(&d, "POST", &action("trigger"), &r);
    let v = wait_state(&h.server.url(), "t1", "completed", Duration::from_secs(10)).await;
    assert!(v["progress"].is_object());
    let r = send(&h, "GET", "/v1/tasks/t1", None).await;
    check(&d, "GET", "/v1/tasks/{id}", &r);
    for a in ["cancel", "pause", "resume", "trigger"] {
        let r = send(&h, "POST", &format!("/v1/tasks/t1/{a}"), None).await;
        assert_eq!(r.status, 409, "{a}");
        check(&d, "POST", &action(a), &r);
        let r = send(&h, "POST", &format!("/v1/tasks/none/{a}"), None).await;
        assert_eq!(r.status, 404, "{a}");
        check(&d, "POST", &action(a), &r);
    }
    let r = send(&h, "PATCH", "/v1/tasks/t1", Some(json!({"name": "x"}))).await;
    assert_eq!(r.status, 409);
    check(&d, "PATCH", "/v1/tasks/{id}", &r);
    // DELETE cancels an unfinished task and deletes a finished one.
    let r = send(&h, "DELETE", "/v1/tasks/s1", None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "cancelled");
    check(&d, "DELETE", "/v1/tasks/{id}", &r);
    let r = send(&h, "DELETE", "/v1/tasks/s1", None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    check(&d, "DELETE", "/v1/tasks/{id}", &r);
    let r = send(&h, "DELETE", "/v1/tasks/s1", None).await;
    assert_eq!(r.status, 404);
    check(&d, "DELETE", "/v1/tasks/{id}", &r);

    // Runs.
    let r = send(&h, "GET", "/v1/tasks/t1/runs", None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["runs"].as_array().unwrap().len(), 1);
    check(&d, "GET", "/v1/tasks/{id}/runs", &r);
    let r = send(&h, "GET", "/v1/tasks/t1/runs?limit=1&after=0", None).await;
    assert_eq!(r.status, 200);
    check(&d, "GET", "/v1/tasks/{id}/runs", &r);
    let r = send(&h, "GET", "/v1/tasks/t1/runs?after=first", None).await;
    assert_eq!(r.status, 400);
    check(&d, "GET", "/v1/tasks/{id}/runs", &r);
    let r = send(&h, "GET", "/v1/tasks/none/runs", None).await;
    assert_eq!(r.status, 404);
    check(&d, "GET", "/v1/tasks/{id}/runs", &r);

    // Failures: a webhook nobody listens on, one attempt.
    let r = send(
        &h,
        "POST",
        "/v1/tasks",
        Some(json!({"id": "f", "channel": "dead",
        "schedule": {"after": "1ms"}, "to": ["x"], "body": "y"})),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let url = h.url("/v1/failures?task=f");
    let list = poll(Duration::from_secs(20), || {
        let url = url.clone();
        async move {
            let r = http::get(&url).await;
            (r.json()["failures"]
                .as_array()
                .is_some_and(|a| !a.is_empty()))
            .then_some(r)
        }
    })
    .await
    .expect("the failed message reaches the failure list");
    assert_eq!(list.status, 200);
    check(&d, "GET", "/v1/failures", &list);
    let fid = list.json()["failures"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = send(&h, "GET", "/v1/failures?limit=0", None).await;
    assert_eq!(r.status, 400);
    check(&d, "GET", "/v1/failures", &r);
    let r = send(&h, "POST", &format!("/v1/failures/{fid}/retry"), None).await;
    assert_eq!(r.status, 202);
    check(&d, "POST", "/v1/failures/{id}/retry", &r);
    let r = send(&h, "DELETE", &format!("/v1/failures/{fid}"), None).await;
    assert_eq!(r.status, 200);
    check(&d, "DELETE", "/v1/failures/{id}", &r);
    let r = send(&h, "DELETE", "/v1/failures/none", None).await;
    assert_eq!(r.status, 404);
    check(&d, "DELETE", "/v1/failures/{id}", &r);
    let r = send(&h, "POST", "/v1/failures/none/retry", None).await;
    assert_eq!(r.status, 404);
    check(&d, "POST", "/v1/failures/{id}/retry", &r);

    // Channels (one with a rate limit and a breaker), metrics, health.
    let r = send(&h, "GET", "/v1/channels", None).await;
    assert_eq!(r.status, 200);
    let channels = r.json();
    let dead = channels["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "dead")
        .expect("channel dead");
    assert!(dead["rate"].is_object() && dead["breaker"].is_object());
    let app = channels["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "app")
        .expect("channel app");
    assert_eq!(app["preset"], "wecom-app");
    assert_eq!(app["token"]["state"], "none");
    assert_eq!(app["success"]["json"], "/errcode");
    check(&d, "GET", "/v1/channels", &r);
    let r = send(&h, "GET", "/metrics", None).await;
    assert_eq!(r.status, 200);
    check(&d, "GET", "/metrics", &r);
    let r = send(&h, "GET", "/healthz", None).await;
    assert_eq!(r.status, 200);
    check(&d, "GET", "/healthz", &r);

    // Schedule preview: the fires, and the same 422 as a create.
    let body = json!({"schedule": {"cron": "30 2 * * *", "tz": "America/New_York"},
                      "dst": {"gap": "skip"}, "n": 3});
    let r = send(&h, "POST", "/v1/schedules/preview", Some(body)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    check(&d, "POST", "/v1/schedules/preview", &r);
    let r = send(
        &h,
        "POST",
        "/v1/schedules/preview",
        Some(json!({"schedule": {"cron": "0 9 *"}})),
    )
    .await;
    assert_eq!(r.status, 422);
    check(&d, "POST", "/v1/schedules/preview", &r);
    let r = send(&h, "GET", "/v1/events?colour=red", None).await;
    assert_eq!(r.status, 400);
    check(&d, "GET", "/v1/events", &r);
    let r = send(&h, "GET", "/v1/export", None).await;
    assert_eq!(r.status, 200);
    check(&d, "GET", "/v1/export", &r);
    let r = send(&h, "GET", "/v1/export?full=1", None).await;
    assert_eq!(r.status, 400);
    check(&d, "GET", "/v1/export", &r);
    for page in [
        "/",
        "/dashboard/app.js",
        "/dashboard/format.js",
        "/dashboard/metrics.js",
        "/dashboard/chart.js",
        "/dashboard/app.css",
    ] {
        let r = send(&h, "GET", page, None).await;
        assert_eq!(r.status, 200);
        check(&d, "GET", page, &r);
        let r = send(&h, "DELETE", page, None).await;
        assert_eq!(r.status, 405);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
    }

    // A method a path does not serve: a problem document, as components/responses says.
    let r = send(&h, "PUT", "/v1/tasks", Some(json!({}))).await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let mut errs = Vec::new();
    conforms(
        &d,
        &json!({"$ref": "#/components/schemas/Problem"}),
        &r.json(),
        "$",
        &mut errs,
    );
    assert!(errs.is_empty(), "{errs:?}");
}

#[tokio::test]
async fn auth_answers_match_the_document() {
    let d = doc();
    let h = TestHerald::start_with_token("", "s3cret").await;
    let base = h.server.url();
    for (method, path) in SERVED {
        let concrete = path.replace("{id}", "x");
        let r = http::request(method, &format!("{base}{concrete}"), &[], None).await;
        if OPEN.contains(path) {
            assert_eq!(r.status, 200, "{path}");
        } else {
            assert_eq!(r.status, 401, "{method} {path}");
        }
        check(&d, method, path, &r);
    }
    let r = http::request(
        "GET",
        &format!("{base}/v1/openapi.json"),
        &[("authorization", "Bearer s3cret")],
        None,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), herald::api::OPENAPI);
}

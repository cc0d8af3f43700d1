//! Platform channels end to end (issue 9): herald in-process against fake platforms on
//! 127.0.0.1 that answer as each platform documents. Per preset, the request herald sends is
//! checked field by field (method, path, query, headers, JSON body); answers with an error code
//! inside a 200 go to retry or the failure list as the rules say; rate-limit codes are retried
//! after the right delay; WeCom's token expiry triggers exactly one refresh for many concurrent
//! sends; DingTalk and Feishu signatures are verified with an HMAC written out in the test;
//! template errors, slow 2xx bodies and config errors behave as documented.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use common::herald::{in_ms, start_with_env, wait_state, TestHerald};
use common::http;
use common::platform::{query_map, reference_hmac, FakePlatform, Reply};
use common::receiver::Recorded;
use parking_lot::Mutex;
use serde_json::{json, Value};

const DEADLINE: Duration = Duration::from_secs(20);

async fn create(h: &TestHerald, body: Value) {
    let r = http::post_json(&h.url("/v1/tasks"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
}

async fn failures(h: &TestHerald, task: &str) -> Vec<Value> {
    let r = http::get(&h.url(&format!("/v1/failures?task={task}"))).await;
    assert_eq!(r.status, 200);
    r.json()["failures"].as_array().cloned().unwrap_or_default()
}

async fn channels(h: &TestHerald) -> (String, Vec<Value>) {
    let r = http::get(&h.url("/v1/channels")).await;
    assert_eq!(r.status, 200);
    let list = r.json()["channels"].as_array().cloned().unwrap_or_default();
    (r.text(), list)
}

fn channel<'a>(list: &'a [Value], name: &str) -> &'a Value {
    list.iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("channel {name} in {list:?}"))
}

/// Counts answers per key (e.g. message text): the n-th time a key is seen.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashMap<String, u32>>>);

impl Seen {
    fn next(&self, key: &str) -> u32 {
        let mut m = self.0.lock();
        let n = m.entry(key.to_string()).or_default();
        *n += 1;
        *n
    }
}

fn json_of(r: &Recorded) -> &Value {
    r.json
        .as_ref()
        .unwrap_or_else(|| panic!("request body is not JSON: {:?}", r.body))
}

fn assert_json_post(r: &Recorded) {
    assert_eq!(r.method, "POST");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.header("idempotency-key").is_some());
    assert!(r.header("user-agent").unwrap_or("").starts_with("herald/"));
}

// ---- WeCom group robot ----------------------------------------------------------------------

#[tokio::test]
async fn wecom_robot_request_shape_and_errcode_rules() {
    let seen = Seen::default();
    let fake = FakePlatform::start({
        let seen = seen.clone();
        move |r| {
            let content = r
                .json
                .as_ref()
                .and_then(|j| j["text"]["content"].as_str())
                .unwrap_or("")
                .to_string();
            match (content.as_str(), seen.next(&content)) {
                // WeCom's documented answers: 45009 = API frequency limit (retry later),
                // 93000 = invalid webhook URL (permanent), 0 = sent.
                ("busy", 1) => Reply::json(
                    200,
                    json!({"errcode": 45009, "errmsg": "api freq out of limit"}),
                ),
                ("broken", _) => Reply::json(
                    200,
                    json!({"errcode": 93000, "errmsg": "invalid webhook url, hint: [1700000000_1]"}),
                ),
                _ => Reply::json(200, json!({"errcode": 0, "errmsg": "ok"})),
            }
        }
    })
    .await;
    let base = fake.base_url();
    let config = format!(
        r#"
[channels.team]
kind = "webhook"
preset = "wecom-robot"
url = "{base}/cgi-bin/webhook/send?key=${{WECOM_KEY}}"
"#
    );
    let h = start_with_env(
        &config,
        &[("WECOM_KEY", "693a91f6-7xxx-4bc4-97a0-0ec2sifa5aaa")],
    )
    .await;
    create(
        &h,
        json!({"id": "w", "channel": "team", "schedule": {"after": "0s"},
               "messages": [
                   {"to": "room", "body": "Class starts in 15 min: \"Maths\" <b>&",
                    "data": {"mentioned_list": ["wangqing", "@all"]}},
                   {"to": "room", "body": "busy"},
                   {"to": "room", "body": "broken"}],
               "retry": {"max_attempts": 3, "backoff": "fixed", "initial": "300ms"}}),
    )
    .await;
    let v = wait_state(&h.server.url(), "w", "completed", DEADLINE).await;
    assert_eq!(
        (
            v["progress"]["sent"].as_u64(),
            v["progress"]["failed"].as_u64()
        ),
        (Some(2), Some(1))
    );

    let reqs = fake.requests_to("/cgi-bin/webhook/send");
    assert_eq!(reqs.len(), 4, "one, busy twice, broken once");
    for r in &reqs {
        assert_json_post(r);
        assert_eq!(
            query_map(r.query.as_deref()),
            BTreeMap::from([(
                "key".to_string(),
                "693a91f6-7xxx-4bc4-97a0-0ec2sifa5aaa".to_string()
            )])
        );
    }
    assert_eq!(
        json_of(&reqs[0]),
        &json!({"msgtype": "text", "text": {"content": "Class starts in 15 min: \"Maths\" <b>&",
                 "mentioned_list": ["wangqing", "@all"]}})
    );
    assert_eq!(
        json_of(&reqs[1]),
        &json!({"msgtype": "text", "text": {"content": "busy"}})
    );
    assert_eq!(json_of(&reqs[2]), json_of(&reqs[1]));
    assert_eq!(reqs[1].header("idempotency-key"), Some("w:1:1"));
    assert_eq!(reqs[2].header("idempotency-key"), Some("w:1:1"));
    // The rate-limit code was retried after the task's backoff (fixed 300 ms), then delivered.
    let gap = reqs[2].at_ms - reqs[1].at_ms;
    assert!(gap >= 295.0, "retried after {gap} ms");
    assert_eq!(
        json_of(&reqs[3]),
        &json!({"msgtype": "text", "text": {"content": "broken"}})
    );

    let f = failures(&h, "w").await;
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0]["seq"], 2);
    assert_eq!(f[0]["attempts"], 1, "a permanent code is not retried");
    assert_eq!(
        f[0]["last_error"],
        "platform code 93000: invalid webhook url, hint: [1700000000_1] (HTTP 200)"
    );

    let (text, list) = channels(&h).await;
    let team = channel(&list, "team");
    assert_eq!(team["preset"], "wecom-robot");
    assert_eq!(team["success"]["json"], "/errcode");
    assert_eq!(team["success"]["equals"], 0);
    assert_eq!(team["success"]["retry_codes"], json!([-1, 45009, 45033]));
    assert_eq!(
        team["rate"]["limit"], "20/1m",
        "the robot's documented limit is the default"
    );
    assert_eq!(team["sign"], "none");
    assert_eq!(team["templates"], json!(["body"]));
    assert_eq!(team["token"], Value::Null);
    assert!(
        !text.contains("693a91f6"),
        "the webhook key is a secret: {text}"
    );
}

// ---- WeCom app message: access token --------------------------------------------------------

#[tokio::test]
async fn wecom_app_token_expiry_refreshes_once_for_many_concurrent_sends() {
    let fetches = Arc::new(AtomicU32::new(0));
    let fake = FakePlatform::start({
        let fetches = fetches.clone();
        move |r| match r.path.as_str() {
            "/cgi-bin/gettoken" => {
                let n = fetches.fetch_add(1, Ordering::SeqCst) + 1;
                // Slow enough that every concurrent send is waiting for this one fetch.
                Reply::json(
                    200,
                    json!({"errcode": 0, "errmsg": "ok", "access_token": format!("ACCESS-{n}"),
                           "expires_in": 7200}),
                )
                .delay(Duration::from_millis(300))
            }
            "/cgi-bin/message/send" => {
                let q = query_map(r.query.as_deref());
                if q.get("access_token").map(String::as_str) == Some("ACCESS-2") {
                    Reply::json(200, json!({"errcode": 0, "errmsg": "ok", "invaliduser": ""}))
                } else {
                    // The first token "expired": every send with it is refused, slowly enough
                    // that the refusals overlap.
                    Reply::json(
                        200,
                        json!({"errcode": 42001, "errmsg": "access_token expired, hint: [1700000000_2]"}),
                    )
                    .delay(Duration::from_millis(100))
                }
            }
            _ => Reply::json(404, json!({"errcode": 404})),
        }
    })
    .await;
    let base = fake.base_url();
    let config = format!(
        r#"
[channels.app]
kind = "webhook"
preset = "wecom-app"
url = "{base}/cgi-bin/message/send?access_token={{{{ token | urlencode }}}}"
token = {{ url = "{base}/cgi-bin/gettoken?corpid=ww1234567890&corpsecret=${{CORP_SECRET}}" }}
vars = {{ agentid = 1000002 }}
concurrency = 16
"#
    );
    let h = start_with_env(&config, &[("CORP_SECRET", "corp-s3cr3t")]).await;
    const N: usize = 12;
    // Far enough ahead that all twelve are created before they fire together.
    let at = in_ms(2_500);
    for i in 0..N {
        create(
            &h,
            json!({"id": format!("app-{i}"), "channel": "app", "schedule": {"at": at},
                   "messages": [{"to": format!("user{i}"), "body": format!("Exam at 9:00 ({i})")}],
                   "retry": {"max_attempts": 2, "backoff": "fixed", "initial": "5s"}}),
        )
        .await;
    }
    for i in 0..N {
        wait_state(&h.server.url(), &format!("app-{i}"), "completed", DEADLINE).await;
        assert!(failures(&h, &format!("app-{i}")).await.is_empty());
    }
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        2,
        "one fetch, then exactly one refresh for all the refused sends"
    );
    let tokens = fake.requests_to("/cgi-bin/gettoken");
    for t in &tokens {
        assert_eq!(t.method, "GET");
        assert_eq!(
            query_map(t.query.as_deref()),
            BTreeMap::from([
                ("corpid".to_string(), "ww1234567890".to_string()),
                ("corpsecret".to_string(), "corp-s3cr3t".to_string())
            ])
        );
    }
    let sends = fake.requests_to("/cgi-bin/message/send");
    let with = |tok: &str| {
        sends
            .iter()
            .filter(|r| {
                query_map(r.query.as_deref())
                    .get("access_token")
                    .map(String::as_str)
                    == Some(tok)
            })
            .count()
    };
    assert!(
        with("ACCESS-1") >= 2,
        "the refusals were concurrent: {}",
        with("ACCESS-1")
    );
    assert_eq!(with("ACCESS-1") + with("ACCESS-2"), sends.len());
    assert_eq!(
        with("ACCESS-2"),
        N,
        "every message delivered once with the new token"
    );
    for i in 0..N {
        let r = sends
            .iter()
            .find(|r| {
                query_map(r.query.as_deref())["access_token"] == "ACCESS-2"
                    && json_of(r)["touser"] == format!("user{i}")
            })
            .unwrap_or_else(|| panic!("user{i} delivered"));
        assert_json_post(r);
        assert_eq!(
            json_of(r),
            &json!({"touser": format!("user{i}"), "msgtype": "text", "agentid": 1000002,
                    "text": {"content": format!("Exam at 9:00 ({i})")}})
        );
        assert_eq!(
            r.header("idempotency-key"),
            Some(format!("app-{i}:1:0").as_str())
        );
    }

    let (text, list) = channels(&h).await;
    let app = channel(&list, "app");
    assert_eq!(app["preset"], "wecom-app");
    assert_eq!(app["token"]["state"], "valid");
    assert_eq!(app["token"]["refreshes"], 2);
    assert_eq!(app["token"]["last_refresh_error"], Value::Null);
    assert!(app["token"]["valid_until"].is_string());
    assert_eq!(app["success"]["refresh_codes"], json!([42001, 40014]));
    assert!(
        !text.contains("corp-s3cr3t") && !text.contains("ACCESS-"),
        "{text}"
    );
}

/// A `wecom-app` channel `app` on the fake platform at `base`, its secret from `CORP_SECRET`,
/// with `extra` lines.
fn wecom_app(base: &str, extra: &str) -> String {
    format!(
        r#"
[channels.app]
kind = "webhook"
preset = "wecom-app"
url = "{base}/cgi-bin/message/send?access_token={{{{ token | urlencode }}}}"
token = {{ url = "{base}/cgi-bin/gettoken?corpid=c&corpsecret=${{CORP_SECRET}}" }}
vars = {{ agentid = 7 }}
{extra}
"#
    )
}

/// The channel's `timeout` bounds a platform attempt's requests all together: a slow token
/// fetch and a refused token's refresh do not let one attempt send again long after it (the
/// drain and cluster mode's wait for an inherited mark count on that bound).
#[tokio::test]
async fn a_platform_attempt_keeps_to_the_channel_timeout_with_its_token_fetches() {
    let fake = FakePlatform::start(|r| match r.path.as_str() {
        "/cgi-bin/gettoken" => Reply::json(
            200,
            json!({"errcode": 0, "errmsg": "ok", "access_token": "T", "expires_in": 7200}),
        )
        .delay(Duration::from_millis(600)),
        // Refuses the token, as if it had expired.
        _ => Reply::json(
            200,
            json!({"errcode": 42001, "errmsg": "access_token expired"}),
        )
        .delay(Duration::from_millis(600)),
    })
    .await;
    let base = fake.base_url();
    let config = wecom_app(&base, "timeout = \"1s\"");
    let h = start_with_env(&config, &[("CORP_SECRET", "s")]).await;
    create(
        &h,
        json!({"id": "slow", "channel": "app", "schedule": {"after": "0s"},
               "messages": [{"to": "u", "body": "hi"}], "retry": {"max_attempts": 1}}),
    )
    .await;
    wait_state(&h.server.url(), "slow", "completed", DEADLINE).await;
    let f = failures(&h, "slow").await;
    assert_eq!(f.len(), 1);
    assert!(
        f[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("timed out after 1000 ms")),
        "{}",
        f[0]
    );
    assert_eq!(
        fake.requests_to("/cgi-bin/message/send").len(),
        1,
        "no second send after the attempt's timeout"
    );
    assert_eq!(fake.requests_to("/cgi-bin/gettoken").len(), 1);
}

#[tokio::test]
async fn wecom_app_token_endpoint_errors_are_shown_and_retried() {
    let fake = FakePlatform::start(|r| match r.path.as_str() {
        "/cgi-bin/gettoken" => Reply::json(
            200,
            json!({"errcode": 40001, "errmsg": "invalid credential, hint: [x]"}),
        ),
        _ => Reply::json(200, json!({"errcode": 0, "errmsg": "ok"})),
    })
    .await;
    let base = fake.base_url();
    let config = wecom_app(&base, "");
    let h = start_with_env(&config, &[("CORP_SECRET", "wrong-secret")]).await;
    create(
        &h,
        json!({"id": "bad", "channel": "app", "schedule": {"after": "0s"},
               "messages": [{"to": "u", "body": "hi"}],
               "retry": {"max_attempts": 2, "backoff": "fixed", "initial": "1200ms"}}),
    )
    .await;
    wait_state(&h.server.url(), "bad", "completed", DEADLINE).await;
    let f = failures(&h, "bad").await;
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["attempts"], 2, "a token failure is retryable");
    assert_eq!(
        f[0]["last_error"],
        "access token: token endpoint answered HTTP 200: platform code 40001: invalid credential, hint: [x]"
    );
    assert!(fake.requests_to("/cgi-bin/message/send").is_empty());
    let (text, list) = channels(&h).await;
    let tok = &channel(&list, "app")["token"];
    assert_eq!(tok["state"], "error");
    assert!(tok["last_refresh_error"]
        .as_str()
        .unwrap_or("")
        .contains("40001"));
    assert!(!text.contains("wrong-secret"));
}

// ---- DingTalk robot -------------------------------------------------------------------------

#[tokio::test]
async fn dingtalk_robot_signature_and_codes() {
    const SECRET: &str = "SEC1f1b0cdc7d2a3d4f7a7f61f1d20b1c0f3c0b2a1e9d8c7b6a5f4e3d2c1b0a9f8";
    let seen = Seen::default();
    let fake = FakePlatform::start({
        let seen = seen.clone();
        move |r| {
            let content = r
                .json
                .as_ref()
                .and_then(|j| j["text"]["content"].as_str())
                .unwrap_or("")
                .to_string();
            match (content.as_str(), seen.next(&content)) {
                ("fast", 1) => Reply::json(
                    200,
                    json!({"errcode": 130101, "errmsg": "send too fast, exceed 20 times per minute"}),
                ),
                _ => Reply::json(200, json!({"errcode": 0, "errmsg": "ok"})),
            }
        }
    })
    .await;
    let base = fake.base_url();
    let config = format!(
        r#"
[channels.ding]
kind = "webhook"
preset = "dingtalk-robot"
url = "{base}/robot/send?access_token=${{DT_TOKEN}}"
secret = "${{DT_SECRET}}"
"#
    );
    let h = start_with_env(
        &config,
        &[("DT_TOKEN", "dt-access-token"), ("DT_SECRET", SECRET)],
    )
    .await;
    create(
        &h,
        json!({"id": "d", "channel": "ding", "schedule": {"after": "0s"},
               "messages": [{"to": "group", "body": "hello", "data": {"at_mobiles": ["13800000000"]}},
                            {"to": "group", "body": "fast"}],
               "retry": {"max_attempts": 3, "backoff": "fixed", "initial": "200ms"}}),
    )
    .await;
    wait_state(&h.server.url(), "d", "completed", DEADLINE).await;
    assert!(failures(&h, "d").await.is_empty());
    let reqs = fake.requests_to("/robot/send");
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_json_post(r);
        let q = query_map(r.query.as_deref());
        assert_eq!(
            q.keys().collect::<Vec<_>>(),
            ["access_token", "sign", "timestamp"]
        );
        assert_eq!(q["access_token"], "dt-access-token");
        let ts: u64 = q["timestamp"].parse().expect("timestamp in ms");
        assert!(
            (ts as f64 - r.at_ms).abs() < 60_000.0,
            "timestamp {ts} near {}",
            r.at_ms
        );
        // sign = base64(HMAC-SHA256(secret, "{timestamp}\n{secret}")), URL-encoded.
        let want = STANDARD.encode(reference_hmac(
            SECRET.as_bytes(),
            format!("{ts}\n{SECRET}").as_bytes(),
        ));
        assert_eq!(q["sign"], want, "DingTalk signature");
        let raw_sign = r
            .query
            .as_deref()
            .unwrap_or("")
            .split("sign=")
            .nth(1)
            .unwrap_or("");
        assert!(
            !raw_sign.contains(['+', '/', '=']),
            "sign is URL-encoded: {raw_sign}"
        );
    }
    assert_eq!(
        json_of(&reqs[0]),
        &json!({"msgtype": "text", "text": {"content": "hello"},
                "at": {"atMobiles": ["13800000000"], "isAtAll": false}})
    );
    assert_eq!(
        json_of(&reqs[1]),
        &json!({"msgtype": "text", "text": {"content": "fast"}})
    );
    assert!(
        reqs[2].at_ms - reqs[1].at_ms >= 195.0,
        "130101 retried after the backoff"
    );
    let (text, list) = channels(&h).await;
    assert_eq!(channel(&list, "ding")["sign"], "dingtalk");
    assert!(!text.contains(SECRET) && !text.contains("dt-access-token"));
}

// ---- Feishu bot -----------------------------------------------------------------------------

#[tokio::test]
async fn feishu_bot_signature_and_codes() {
    const SECRET: &str = "qVxGkR1x7Y2z3w4v5u6t7s";
    let seen = Seen::default();
    let fake = FakePlatform::start({
        let seen = seen.clone();
        move |r| {
            let text = r
                .json
                .as_ref()
                .and_then(|j| j["content"]["text"].as_str())
                .unwrap_or("")
                .to_string();
            match (text.as_str(), seen.next(&text)) {
                ("limited", 1) => Reply::json(200, json!({"code": 9499, "msg": "too many request", "data": {}})),
                ("stale", _) => Reply::json(
                    200,
                    json!({"code": 19021, "msg": "sign match fail or timestamp is not within one hour from current time", "data": {}}),
                ),
                _ => Reply::json(
                    200,
                    json!({"StatusCode": 0, "StatusMessage": "success", "code": 0, "data": {}, "msg": "success"}),
                ),
            }
        }
    })
    .await;
    let base = fake.base_url();
    let config = format!(
        r#"
[channels.lark]
kind = "webhook"
preset = "feishu-bot"
url = "{base}/open-apis/bot/v2/hook/${{FEISHU_HOOK}}"
secret = "${{FEISHU_SECRET}}"
"#
    );
    let h = start_with_env(
        &config,
        &[("FEISHU_HOOK", "3f2e1d0c-b9a8"), ("FEISHU_SECRET", SECRET)],
    )
    .await;
    create(
        &h,
        json!({"id": "f", "channel": "lark", "schedule": {"after": "0s"},
               "messages": [{"to": "chat", "body": "hello"}, {"to": "chat", "body": "limited"},
                            {"to": "chat", "body": "stale"}],
               "retry": {"max_attempts": 3, "backoff": "fixed", "initial": "200ms"}}),
    )
    .await;
    wait_state(&h.server.url(), "f", "completed", DEADLINE).await;
    let reqs = fake.requests_to("/open-apis/bot/v2/hook/3f2e1d0c-b9a8");
    assert_eq!(reqs.len(), 4, "hello, limited twice, stale once");
    for r in &reqs {
        assert_json_post(r);
        assert_eq!(r.query, None);
        let j = json_of(r);
        let ts = j["timestamp"]
            .as_str()
            .expect("timestamp is a string of seconds");
        let secs: u64 = ts.parse().expect("seconds");
        assert!(((secs * 1000) as f64 - r.at_ms).abs() < 60_000.0);
        // sign = base64(HMAC-SHA256(key = "{timestamp}\n{secret}", message = "")).
        let want = STANDARD.encode(reference_hmac(format!("{ts}\n{SECRET}").as_bytes(), b""));
        assert_eq!(j["sign"], want, "Feishu signature");
        assert_eq!(j["msg_type"], "text");
        let mut rest = j.clone();
        let obj = rest.as_object_mut().unwrap();
        obj.remove("timestamp");
        obj.remove("sign");
        assert_eq!(obj.len(), 2, "msg_type and content only: {j}");
    }
    assert_eq!(json_of(&reqs[0])["content"], json!({"text": "hello"}));
    let f = failures(&h, "f").await;
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["seq"], 2);
    assert_eq!(
        f[0]["last_error"],
        "platform code 19021: sign match fail or timestamp is not within one hour from current time (HTTP 200)"
    );
    let (text, list) = channels(&h).await;
    assert_eq!(channel(&list, "lark")["sign"], "feishu");
    assert_eq!(channel(&list, "lark")["success"]["json"], "/code");
    assert!(!text.contains(SECRET));
}

// ---- Telegram -------------------------------------------------------------------------------

#[tokio::test]
async fn telegram_retry_after_in_the_body_is_honoured() {
    let seen = Seen::default();
    let fake = FakePlatform::start({
        let seen = seen.clone();
        move |r| {
            let chat = r
                .json
                .as_ref()
                .map(|j| j["chat_id"].to_string())
                .unwrap_or_default();
            match (chat.as_str(), seen.next(&chat)) {
                ("\"-100200300\"", 1) => Reply::json(
                    429,
                    json!({"ok": false, "error_code": 429,
                           "description": "Too Many Requests: retry after 1",
                           "parameters": {"retry_after": 1}}),
                ),
                ("\"nochat\"", _) => Reply::json(
                    400,
                    json!({"ok": false, "error_code": 400, "description": "Bad Request: chat not found"}),
                ),
                _ => Reply::json(
                    200,
                    json!({"ok": true, "result": {"message_id": 7, "date": 1700000000,
                           "chat": {"id": -100200300, "type": "supergroup"}, "text": "x"}}),
                ),
            }
        }
    })
    .await;
    let base = fake.base_url();
    let config = format!(
        r#"
[channels.tg]
kind = "webhook"
preset = "telegram-bot"
url = "{base}/bot${{TG_TOKEN}}/sendMessage"
"#
    );
    let h = start_with_env(&config, &[("TG_TOKEN", "123456:ABC-DEF1234ghIkl")]).await;
    create(
        &h,
        json!({"id": "t", "channel": "tg", "schedule": {"after": "0s"},
               "messages": [{"to": "-100200300", "body": "Lesson in 5 minutes",
                             "data": {"parse_mode": "HTML"}},
                            {"to": "nochat", "body": "x"}],
               "retry": {"max_attempts": 3, "backoff": "fixed", "initial": "50ms"}}),
    )
    .await;
    wait_state(&h.server.url(), "t", "completed", DEADLINE).await;
    let reqs = fake.requests_to("/bot123456:ABC-DEF1234ghIkl/sendMessage");
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_json_post(r);
    }
    assert_eq!(
        json_of(&reqs[0]),
        &json!({"chat_id": "-100200300", "text": "Lesson in 5 minutes", "parse_mode": "HTML"})
    );
    assert_eq!(json_of(&reqs[1]), json_of(&reqs[0]));
    // retry_after = 1 s from the body, not the task's 50 ms backoff.
    let gap = reqs[1].at_ms - reqs[0].at_ms;
    assert!(gap >= 995.0, "retried after {gap} ms");
    assert_eq!(
        json_of(&reqs[2]),
        &json!({"chat_id": "nochat", "text": "x"})
    );
    let f = failures(&h, "t").await;
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["attempts"], 1);
    assert_eq!(
        f[0]["last_error"],
        "platform code 400: Bad Request: chat not found (HTTP 400)"
    );
    let (text, _) = channels(&h).await;
    assert!(!text.contains("ABC-DEF1234ghIkl"));
}

// ---- Slack ----------------------------------------------------------------------------------

#[tokio::test]
async fn slack_webhook_shape_and_retry_after_header() {
    let seen = Seen::default();
    let fake = FakePlatform::start({
        let seen = seen.clone();
        move |r| {
            let text = r
                .json
                .as_ref()
                .and_then(|j| j["text"].as_str())
                .unwrap_or("")
                .to_string();
            match (text.as_str(), seen.next(&text)) {
                ("hello", 1) => Reply::text(429, "rate_limited").header("retry-after", "1"),
                ("bad", _) => Reply::text(400, "invalid_payload"),
                _ => Reply::text(200, "ok"),
            }
        }
    })
    .await;
    let base = fake.base_url();
    let config = format!(
        "[channels.slack]\nkind = \"webhook\"\npreset = \"slack-webhook\"\nurl = \"{base}/services/T000/B000/XXXX\"\n"
    );
    let h = start_with_env(&config, &[]).await;
    create(
        &h,
        json!({"id": "s", "channel": "slack", "schedule": {"after": "0s"},
               "messages": [{"to": "#general", "body": "hello"}, {"to": "#general", "body": "bad"}],
               "retry": {"max_attempts": 3, "backoff": "fixed", "initial": "50ms"}}),
    )
    .await;
    wait_state(&h.server.url(), "s", "completed", DEADLINE).await;
    let reqs = fake.requests_to("/services/T000/B000/XXXX");
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_json_post(r);
    }
    assert_eq!(json_of(&reqs[0]), &json!({"text": "hello"}));
    assert!(
        reqs[1].at_ms - reqs[0].at_ms >= 995.0,
        "Retry-After: 1 honoured"
    );
    let f = failures(&h, "s").await;
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["last_error"], "HTTP 400: invalid_payload");
}

// ---- generic JSON, custom templates, template errors ----------------------------------------

#[tokio::test]
async fn generic_json_and_custom_templates_with_data_metadata_and_errors() {
    let fake = FakePlatform::start(|r| {
        if r.path == "/api/send" && r.json.as_ref().is_some_and(|j| j["to"] == "nobody") {
            return Reply::json(200, json!({"code": 1001, "msg": "bad recipient"}));
        }
        Reply::json(200, json!({"code": 0, "msg": "ok"}))
    })
    .await;
    let base = fake.base_url();
    let config = format!(
        r#"
[channels.gw]
kind = "webhook"
preset = "generic-json"
url = "{base}/api/send"
headers = {{ "X-Trace" = "{{{{ idempotency_key }}}}", "Authorization" = "Bearer ${{GW_TOKEN}}" }}
success = {{ json = "/code", equals = 0, message = "/msg" }}

[channels.tpl]
kind = "webhook"
url = "{base}/api/template/{{{{ data.template_id | urlencode }}}}"
body = '{{"to":{{{{ to | tojson }}}},"params":{{{{ data.params | tojson }}}},"minutes_left":{{{{ minutes_left }}}},"source":{{{{ metadata.source | tojson }}}},"at":{{{{ scheduled_at_ms }}}}}}'
"#
    );
    let h = start_with_env(&config, &[("GW_TOKEN", "gw-secret")]).await;
    create(
        &h,
        json!({"id": "g", "channel": "gw", "schedule": {"after": "0s"},
               "messages": [{"to": "wxid_a", "body": "hi", "data": {"k": [1, "two"]}},
                            {"to": "nobody", "body": "x"}]}),
    )
    .await;
    let event = in_ms(60_000 + 500);
    create(
        &h,
        json!({"id": "r", "channel": "tpl", "metadata": {"source": "crm"},
               "schedule": {"reminders": {"event_at": event, "before": ["1m"]}},
               "messages": [{"to": "wxid_b", "body": "b", "data": {"template_id": "T 1", "params": {"x": 1}}},
                            {"to": "wxid_c", "body": "b"}]}),
    )
    .await;
    wait_state(&h.server.url(), "g", "completed", DEADLINE).await;
    wait_state(&h.server.url(), "r", "completed", DEADLINE).await;

    let sends = fake.requests_to("/api/send");
    assert_eq!(sends.len(), 2);
    let r = &sends[0];
    assert_json_post(r);
    assert_eq!(r.header("x-trace"), Some("g:1:0"));
    assert_eq!(r.header("authorization"), Some("Bearer gw-secret"));
    let j = json_of(r);
    assert_eq!(j["to"], "wxid_a");
    assert_eq!(j["body"], "hi");
    assert_eq!(j["data"], json!({"k": [1, "two"]}));
    assert_eq!(j["task_id"], "g");
    assert_eq!(j["idempotency_key"], "g:1:0");
    assert!(j["scheduled_at"].as_str().unwrap_or("").ends_with('Z'));
    assert_eq!(j.as_object().map(|o| o.len()), Some(6));
    let f = failures(&h, "g").await;
    assert_eq!(f.len(), 1);
    assert_eq!(
        f[0]["last_error"],
        "platform code 1001: bad recipient (HTTP 200)"
    );

    // The reminder: URL and body from templates; the message without data fails for good,
    // with a reason that names the template and the variable, and is never sent.
    let tpl = fake.requests();
    let tpl: Vec<&Recorded> = tpl
        .iter()
        .filter(|r| r.path.starts_with("/api/template"))
        .collect();
    assert_eq!(tpl.len(), 1, "only the message that renders is sent");
    assert_eq!(tpl[0].path, "/api/template/T%201");
    let j = json_of(tpl[0]);
    assert_eq!(j["to"], "wxid_b");
    assert_eq!(j["params"], json!({"x": 1}));
    assert_eq!(j["minutes_left"], 1);
    assert_eq!(j["source"], "crm");
    assert!(j["at"].as_u64().is_some());
    let f = failures(&h, "r").await;
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0]["seq"], 1);
    assert_eq!(f[0]["attempts"], 1, "a template error is permanent");
    let e = f[0]["last_error"].as_str().unwrap_or("");
    assert!(
        e.starts_with("template channels.tpl.")
            && e.contains("undefined variable")
            && e.contains("data.template_id"),
        "{e}"
    );
    let (text, _) = channels(&h).await;
    assert!(!text.contains("gw-secret"));
}

// ---- classification on the status line ------------------------------------------------------

#[tokio::test]
async fn a_2xx_with_a_slow_trickling_body_is_not_a_timeout() {
    // Head at once, body in 4 pieces 250 ms apart: the whole answer takes 1 s, more than the
    // channel's 300 ms timeout.
    let fake = FakePlatform::start(|_| {
        Reply::json(200, json!({"ok": true, "note": "a slow body"}))
            .trickle(4, Duration::from_millis(250))
    })
    .await;
    let base = fake.base_url();
    let config = format!(
        r#"
[channels.plain]
kind = "webhook"
url = "{base}/plain"
timeout = "300ms"

[channels.ruled]
kind = "webhook"
url = "{base}/ruled"
timeout = "300ms"
answer_timeout = "5s"
success = {{ json = "/ok", equals = true }}
"#
    );
    let h = start_with_env(&config, &[]).await;
    for (id, ch) in [("p", "plain"), ("q", "ruled")] {
        create(
            &h,
            json!({"id": id, "channel": ch, "schedule": {"after": "0s"},
                   "messages": [{"to": "a", "body": "x"}],
                   "retry": {"max_attempts": 3, "backoff": "fixed", "initial": "50ms"}}),
        )
        .await;
    }
    for id in ["p", "q"] {
        let v = wait_state(&h.server.url(), id, "completed", DEADLINE).await;
        assert_eq!(v["progress"]["sent"], 1, "{id}");
        assert!(failures(&h, id).await.is_empty(), "{id}");
    }
    assert_eq!(
        fake.requests_to("/plain").len(),
        1,
        "sent once, not retried as a timeout"
    );
    assert_eq!(
        fake.requests_to("/ruled").len(),
        1,
        "the rule read the body within answer_timeout"
    );
    let (_, list) = channels(&h).await;
    for name in ["plain", "ruled"] {
        assert_eq!(channel(&list, name)["retryable_failures"], 0, "{name}");
        assert_eq!(channel(&list, name)["sent"], 1, "{name}");
    }
}

// ---- config errors stop start-up ------------------------------------------------------------

#[test]
fn bad_templates_and_unknown_presets_stop_start_up_naming_the_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        (
            "[channels.team]\nkind = \"webhook\"\npreset = \"wechat-work\"\nurl = \"http://127.0.0.1:1/x\"\n",
            "herald: channels.team.preset: unknown preset \"wechat-work\"",
        ),
        (
            "[channels.team]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:1/x\"\nbody = '{\"text\":{{ body | tojson }'\n",
            "herald: channels.team.body: syntax error",
        ),
        (
            "[channels.team]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:1/x?k=${HERALD_TEST_SURELY_UNSET_VAR}\"\n",
            "herald: channels.team.url: environment variable HERALD_TEST_SURELY_UNSET_VAR is not set",
        ),
    ];
    for (i, (config, want)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("bad-{i}.toml"));
        std::fs::write(&path, config).expect("write config");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .arg("--data")
            .arg(dir.path().join(format!("data-{i}")))
            .env_remove("HERALD_TEST_SURELY_UNSET_VAR")
            .output()
            .expect("run herald");
        assert!(!out.status.success(), "herald refused to start");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr.lines().last().unwrap_or("");
        assert!(line.starts_with(want), "got {stderr:?}, want {want:?}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr:?}");
    }
}

// ---- alerts through a platform channel ------------------------------------------------------

#[tokio::test]
async fn alerts_go_out_through_a_platform_channel() {
    let fake = FakePlatform::start(|r| match r.path.as_str() {
        "/hook" => Reply::json(400, json!({"error": "unknown recipient"})),
        _ => Reply::json(200, json!({"errcode": 0, "errmsg": "ok"})),
    })
    .await;
    let base = fake.base_url();
    let config = format!(
        r#"
[alerts]
channel = "ops"

[channels.ops]
kind = "webhook"
preset = "wecom-robot"
url = "{base}/cgi-bin/webhook/send?key=ops"

[channels.hook]
kind = "webhook"
url = "{base}/hook"
"#
    );
    let h = start_with_env(&config, &[]).await;
    create(
        &h,
        json!({"id": "x", "channel": "hook", "schedule": {"after": "0s"},
               "messages": [{"to": "a", "body": "b"}]}),
    )
    .await;
    wait_state(&h.server.url(), "x", "completed", DEADLINE).await;
    let alerts = fake.wait_for("/cgi-bin/webhook/send", 1, DEADLINE).await;
    assert_eq!(alerts.len(), 1);
    assert_json_post(&alerts[0]);
    assert_eq!(
        json_of(&alerts[0]),
        &json!({"msgtype": "text", "text": {"content":
            "herald alert: failure on channel hook, task x, to a: HTTP 400: {\"error\":\"unknown recipient\"}"}})
    );
}

// ---- A cancel or pause answered while the send waits for its access token -------------------

/// A `wecom-app` channel whose token endpoint answers after `TOKEN_DELAY`: a send due now is
/// prepared, its lock let go, and it waits for the token. Returns the fake platform and herald
/// with task `id` created, once the token request has arrived (the send is under way).
async fn waiting_for_the_token(id: &str) -> (FakePlatform, TestHerald) {
    const TOKEN_DELAY: Duration = Duration::from_millis(1_500);
    let fake = FakePlatform::start(|r| match r.path.as_str() {
        "/cgi-bin/gettoken" => Reply::json(
            200,
            json!({"errcode": 0, "errmsg": "ok", "access_token": "T", "expires_in": 7200}),
        )
        .delay(TOKEN_DELAY),
        _ => Reply::json(200, json!({"errcode": 0, "errmsg": "ok"})),
    })
    .await;
    let config = wecom_app(&fake.base_url(), "");
    let h = start_with_env(&config, &[("CORP_SECRET", "s")]).await;
    create(
        &h,
        json!({"id": id, "channel": "app", "schedule": {"after": "0s"},
               "messages": [{"to": "u", "body": "hi"}]}),
    )
    .await;
    let tokens = fake.wait_for("/cgi-bin/gettoken", 1, DEADLINE).await;
    assert_eq!(tokens.len(), 1, "the send asked for its token");
    (fake, h)
}

/// Waits until the send under way came back from its token: the task's timeline holds the
/// `held` event of a send its cancel or pause stopped (`why: stopped`), or a message request
/// arrived. Returns the message requests that arrived after `answered`, then checks that the
/// send was stopped.
async fn sends_after(
    fake: &FakePlatform,
    h: &TestHerald,
    id: &str,
    answered: std::time::Instant,
) -> usize {
    let url = h.url(&format!("/v1/tasks/{id}/timeline"));
    let stopped = || async {
        let v = http::get(&url).await.json();
        let events = v["events"].as_array().cloned().unwrap_or_default();
        events
            .iter()
            .any(|e| e["kind"] == "held" && e["detail"]["why"] == "stopped")
    };
    common::herald::poll(DEADLINE, || async {
        let sent = !fake.requests_to("/cgi-bin/message/send").is_empty();
        (sent || stopped().await).then_some(())
    })
    .await
    .expect("the send came back from its token");
    let after = fake
        .requests_to("/cgi-bin/message/send")
        .into_iter()
        .filter(|r| r.at > answered)
        .count();
    if after == 0 {
        assert!(
            stopped().await,
            "no stopped send in the timeline: {}",
            http::get(&url).await.text()
        );
    }
    after
}

/// API.md, cancel: "no send of this task starts after the answer", also for a send whose
/// access token was still on its way when the cancel was answered.
#[tokio::test]
async fn a_cancel_answered_while_the_send_waits_for_its_token_sends_nothing() {
    let (fake, h) = waiting_for_the_token("cancel-me").await;
    let r = http::request("POST", &h.url("/v1/tasks/cancel-me/cancel"), &[], None).await;
    let answered = std::time::Instant::now();
    assert_eq!(r.status, 200, "{}", r.text());
    let after = sends_after(&fake, &h, "cancel-me", answered).await;
    assert_eq!(after, 0, "sends after the cancel was answered");
    let v = http::get(&h.url("/v1/tasks/cancel-me")).await.json();
    assert_eq!(v["state"], "cancelled", "{v}");
    assert_eq!(v["progress"]["sent"], 0, "{v}");
    assert!(failures(&h, "cancel-me").await.is_empty());
}

/// The same for a pause: nothing goes until the resume, then the message goes once.
#[tokio::test]
async fn a_pause_answered_while_the_send_waits_for_its_token_holds_it_until_resumed() {
    let (fake, h) = waiting_for_the_token("pause-me").await;
    let r = http::request("POST", &h.url("/v1/tasks/pause-me/pause"), &[], None).await;
    let answered = std::time::Instant::now();
    assert_eq!(r.status, 200, "{}", r.text());
    let after = sends_after(&fake, &h, "pause-me", answered).await;
    assert_eq!(after, 0, "sends after the pause was answered");
    let r = http::request("POST", &h.url("/v1/tasks/pause-me/resume"), &[], None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_state(&h.server.url(), "pause-me", "completed", DEADLINE).await;
    assert_eq!(v["progress"]["sent"], 1, "{v}");
    let sends = fake.requests_to("/cgi-bin/message/send");
    assert_eq!(sends.len(), 1, "sent once, after the resume");
    assert_eq!(sends[0].header("idempotency-key"), Some("pause-me:1:0"));
    assert!(failures(&h, "pause-me").await.is_empty());
}

/// A failure-list retry is a send of its task too: its platform refused the token, and the
/// cancel is answered while the refresh is on its way; the second try is not written.
#[tokio::test]
async fn a_cancel_answered_while_a_failure_retry_refreshes_its_token_sends_nothing() {
    let fetches = Arc::new(AtomicU32::new(0));
    let with_t1 = Arc::new(AtomicU32::new(0));
    let fake = FakePlatform::start({
        let (fetches, with_t1) = (fetches.clone(), with_t1.clone());
        move |r| match r.path.as_str() {
            "/cgi-bin/gettoken" => {
                let n = fetches.fetch_add(1, Ordering::SeqCst) + 1;
                let reply = Reply::json(
                    200,
                    json!({"errcode": 0, "errmsg": "ok", "access_token": format!("T{n}"),
                           "expires_in": 7200}),
                );
                // The refresh is slow: the cancel is answered while it is on its way.
                if n == 1 {
                    reply
                } else {
                    reply.delay(Duration::from_millis(1_500))
                }
            }
            _ if query_map(r.query.as_deref())
                .get("access_token")
                .map(String::as_str)
                == Some("T1") =>
            {
                if with_t1.fetch_add(1, Ordering::SeqCst) == 0 {
                    // The run's own send: refused for good (into the failure list).
                    Reply::json(200, json!({"errcode": 40003, "errmsg": "invalid userid"}))
                } else {
                    // The retry's first try: the token "expired".
                    Reply::json(
                        200,
                        json!({"errcode": 42001, "errmsg": "access_token expired"}),
                    )
                }
            }
            _ => Reply::json(200, json!({"errcode": 0, "errmsg": "ok"})),
        }
    })
    .await;
    let h = start_with_env(&wecom_app(&fake.base_url(), ""), &[("CORP_SECRET", "s")]).await;
    // The second message is 30 s later: the task is still running when the first fails.
    create(
        &h,
        json!({"id": "k", "channel": "app", "schedule": {"after": "0s"},
               "messages": [{"to": "a", "body": "x"}, {"to": "b", "body": "y"}],
               "pacing": {"interval": "30s"}}),
    )
    .await;
    let listed = common::herald::poll(DEADLINE, || async {
        (failures(&h, "k").await.len() == 1).then_some(())
    })
    .await;
    assert!(
        listed.is_some(),
        "the refused message is in the failure list"
    );
    let r = http::request("POST", &h.url("/v1/failures/k:1:0/retry"), &[], None).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let tokens = fake.wait_for("/cgi-bin/gettoken", 2, DEADLINE).await;
    assert_eq!(
        tokens.len(),
        2,
        "the retry's token refused and being refreshed"
    );
    let r = http::request("POST", &h.url("/v1/tasks/k/cancel"), &[], None).await;
    let answered = std::time::Instant::now();
    assert_eq!(r.status, 200, "{}", r.text());
    let after = || {
        fake.requests_to("/cgi-bin/message/send")
            .into_iter()
            .filter(|r| r.at > answered)
            .count()
    };
    // The retry comes back from the refresh: stopped (the entry says the task was
    // cancelled), or sent.
    let entry = common::herald::poll(DEADLINE, || async {
        let list = failures(&h, "k").await;
        let stopped = list.len() == 1 && list[0]["retrying"] == false;
        (stopped || after() > 0).then_some(list)
    })
    .await
    .expect("the retry came back from its token");
    assert_eq!(after(), 0, "retry sends after the cancel was answered");
    assert!(
        entry[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("cancelled")),
        "{entry:?}"
    );
}

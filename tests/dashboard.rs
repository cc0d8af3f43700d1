//! The dashboard in a real browser: headless Chromium driven over WebDriver (Debian's
//! `chromium` and `chromium-driver`), against a real herald with a token and a real webhook
//! receiver. It is refused a wrong token and says so, signs in, creates a paced sequence from
//! the page with one message that fails for good, watches the list's bar and the open detail
//! move live (without reloading) to a bar with a failed share, sees the overview's charts draw
//! the traffic and the channel's success ratio count it, retries the failed message, checks
//! the page at 1024 px (Actions visible), and cancels a task with the confirmation dialog.
//! Then (`dashboard_follows_a_busy_server`) the page keeps up with what happens on the server:
//! a deleted task leaves the list and the detail, a held send shows in the timeline, and a
//! paused task shows paused while creates go on at ~40/s. One browser at a time (`BROWSER`).
//! Screenshots go to `target/tmp/` (`dashboard.png` at 1400 px, `dashboard-detail.png`,
//! `dashboard-1024.png`; `dashboard-failure.png` when a step fails).
//!
//! Without chromium or chromedriver the test is skipped loudly (`common::tools::require`), and
//! fails under `CI=true`.

mod common;

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::herald::{webhook_channel, TestHerald};
use common::http;
use common::receiver::{Behavior, Receiver};
use common::tools;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

const TOKEN: &str = "dash-board-token";

fn artifact(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// chromedriver on a free loopback port, with a fresh Chromium profile.
struct Driver {
    child: Child,
    url: String,
    chromium: PathBuf,
    profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TEST: &str = "dashboard_in_headless_chromium";
const INSTALL: &str = "apt-get update && apt-get install -y chromium chromium-driver";

/// chromedriver started, or `None` when it or chromium is missing (the skip is recorded).
async fn start_driver() -> Option<Driver> {
    let driver = tools::require("chromedriver", INSTALL, TEST)?;
    let chromium = tools::which("chromium")
        .or_else(|| tools::which("chromium-browser"))
        .or_else(|| tools::require("chromium", INSTALL, TEST))?;
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(&driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", driver.display()));
    let url = format!("http://127.0.0.1:{port}");
    let d = Driver {
        child,
        url,
        chromium,
        profile: tempfile::tempdir().expect("profile dir"),
    };
    let status = format!("{}/status", d.url);
    let ready = common::herald::poll(Duration::from_secs(30), || {
        let status = status.clone();
        async move {
            let r = http::try_request("GET", &status, &[], None).await.ok()?;
            (r.status == 200 && r.json()["value"]["ready"] == true).then_some(())
        }
    })
    .await;
    assert!(
        ready.is_some(),
        "chromedriver did not get ready on port {port} within 30 s"
    );
    Some(d)
}

async fn browser(d: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert("browserName".into(), json!("chrome"));
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": d.chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1400,1000", "--lang=en-US",
                format!("--user-data-dir={}", d.profile.path().display()),
            ],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&d.url)
        .await
        .unwrap_or_else(|e| panic!("starting headless chromium through chromedriver: {e}"))
}

/// Runs `script` in the page and returns its value.
async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, vec![])
        .await
        .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
}

/// Polls `check` every 25 ms until it returns `Some` or `deadline` passes; on timeout saves a
/// screenshot and fails with `what`.
async fn until<T, F, Fut>(c: &Client, what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= end {
            if let Ok(png) = c.screenshot().await {
                let _ = std::fs::write(artifact("dashboard-failure.png"), png);
            }
            let body = js(c, "return document.body.innerText").await;
            panic!(
                "dashboard: {what} did not happen within {deadline:?}; page text:\n{}",
                body.as_str().unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Clicks the element matched by `css` (found fresh each time).
async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no element {css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("clicking {css}: {e}"));
}

/// A progress bar's shares, read from the page.
#[derive(Debug, Clone, PartialEq)]
struct Bar {
    sent: u64,
    failed: u64,
    total: u64,
    /// Drawn width of the failed share in px (0 when it has none).
    failed_px: f64,
}

impl Bar {
    fn done(&self) -> u64 {
        self.sent + self.failed
    }
}

/// The first `.bar` inside the element matched by `css`, if there is one.
async fn bar(c: &Client, css: &str) -> Option<Bar> {
    let v = js(
        c,
        &format!(
            r#"const b = document.querySelector({css:?} + ' .bar');
               if (!b) return null;
               const f = b.querySelector('.seg.failed');
               return [Number(b.dataset.sent), Number(b.dataset.failed), Number(b.dataset.total),
                       f ? f.getBoundingClientRect().width : 0];"#
        ),
    )
    .await;
    let a = v.as_array()?;
    Some(Bar {
        sent: a[0].as_u64()?,
        failed: a[1].as_u64()?,
        total: a[2].as_u64()?,
        failed_px: a[3].as_f64()?,
    })
}

async fn text_of(c: &Client, css: &str) -> String {
    js(
        c,
        &format!("const e = document.querySelector({css:?}); return e ? e.textContent : null"),
    )
    .await
    .as_str()
    .unwrap_or_default()
    .to_string()
}

async fn dialog_open(c: &Client, css: &str) -> bool {
    js(c, &format!("return document.querySelector({css:?}).open")).await == true
}

async fn task_state(h: &TestHerald, id: &str) -> String {
    let r = http::request(
        "GET",
        &h.url(&format!("/v1/tasks/{id}")),
        &[("authorization", &format!("Bearer {TOKEN}"))],
        None,
    )
    .await;
    r.json()["state"].as_str().unwrap_or_default().to_string()
}

/// Whether `s` holds a date-time as RFC 3339 or herald's descriptions write it
/// (`2026-12-01T09:00`, `2026-12-01 09:00`).
fn is_iso(s: &str) -> bool {
    s.as_bytes().windows(11).any(|w| {
        w[4] == b'-'
            && w[7] == b'-'
            && (w[10] == b'T' || w[10] == b' ')
            && [0, 1, 2, 3, 5, 6, 8, 9]
                .iter()
                .all(|&i| w[i].is_ascii_digit())
    })
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    std::fs::write(artifact(name), &png).expect("save the screenshot");
}

/// Types `token` into the token dialog and submits it.
async fn give_token(c: &Client, token: &str) {
    let input = c.find(Locator::Css("#token-input")).await.unwrap();
    input.clear().await.unwrap();
    input.send_keys(token).await.unwrap();
    click(c, "#token-save").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_headless_chromium() {
    let _one = BROWSER.lock().await;
    let Some(driver) = start_driver().await else {
        return;
    };
    let rx = Receiver::start().await;
    // The third message of the sequence is refused once for good (400): it lands in the
    // failure list; its retry from the page is accepted.
    rx.script_key("seq:1:2", vec![Behavior::Status(400)]);
    let h = TestHerald::start_with_token(&webhook_channel("hook", &rx.url(), ""), TOKEN).await;
    let c = browser(&driver).await;
    let t = Duration::from_secs(30);

    // ---- load; the page asks for the token, refuses a wrong one visibly, takes the right one
    c.goto(&h.url("/")).await.expect("load the dashboard");
    assert_eq!(c.title().await.unwrap(), "herald");
    until(&c, "the token dialog", t, || async {
        dialog_open(&c, "#token-dialog").await.then_some(())
    })
    .await;
    assert_eq!(
        js(&c, "return document.querySelector('#token-error').hidden").await,
        true,
        "no refusal before a token was given"
    );
    give_token(&c, "not-the-token").await;
    let refusal = until(&c, "the refusal of a wrong token", t, || async {
        let shown = js(&c, "return !document.querySelector('#token-error').hidden").await == true;
        let text = text_of(&c, "#token-error").await;
        (shown && dialog_open(&c, "#token-dialog").await && text.contains("refused"))
            .then_some(text)
    })
    .await;
    assert!(refusal.contains("401"), "{refusal}");
    assert!(
        text_of(&c, "#notice").await.contains("refused"),
        "the page says it too"
    );
    assert_eq!(
        js(&c, "return sessionStorage.getItem('herald.token')").await,
        Value::Null,
        "a refused token is not kept"
    );
    give_token(&c, TOKEN).await;
    until(&c, "the live event stream", t, || async {
        (text_of(&c, "#live-text").await == "live").then_some(())
    })
    .await;
    assert_eq!(
        js(&c, "return sessionStorage.getItem('herald.token')").await,
        TOKEN,
        "the token is kept for the browser session"
    );
    assert!(js(&c, "return document.querySelector('#token-error').hidden").await == true);
    // The channels table is there, with the webhook channel.
    until(&c, "the channels table", t, || async {
        c.find(Locator::Css("#channel-rows tr[data-channel='hook']"))
            .await
            .ok()
    })
    .await;
    // The overview's arithmetic on known input (metrics.js is pure).
    let q = js(
        &c,
        r#"const M = window.Herald.metrics;
           const s = M.sample('herald_send_lateness_seconds_bucket{le="0.001"} 5\nherald_send_lateness_seconds_bucket{le="0.01"} 9\nherald_send_lateness_seconds_bucket{le="+Inf"} 10\nherald_channel_attempts_total{channel="a\\"b",outcome="sent"} 3\n', 0);
           return [M.quantile(0.5, s.lateness.bounds, s.lateness.cum), M.quantile(0.99, s.lateness.bounds, s.lateness.cum),
                   s.attempts['a"b'].sent];"#,
    )
    .await;
    assert_eq!(
        q,
        json!([0.001, 0.01, 3]),
        "p50, p99 (capped at the last finite bound), an escaped label"
    );
    // Marks this page load: if the page reloaded, the mark would be gone.
    js(&c, "window.__heraldMark = 42; return null").await;

    // ---- a preview in the task's zone; a failed create leaves no stale preview under it
    let bad = json!({"channel": "nope", "schedule": {"cron": "0 9 * * *", "tz": "Asia/Shanghai"},
                     "to": ["a"], "body": "x"});
    let area = c.find(Locator::Css("#create-body")).await.unwrap();
    area.clear().await.unwrap();
    area.send_keys(&bad.to_string()).await.unwrap();
    click(&c, "#preview-button").await;
    let fires = until(&c, "the schedule preview", t, || async {
        let v = js(
            &c,
            "return [...document.querySelectorAll('#preview-list time')].map(t => t.textContent)",
        )
        .await;
        let v: Vec<String> = serde_json::from_value(v).ok()?;
        (v.len() == 5).then_some(v)
    })
    .await;
    assert!(
        fires
            .iter()
            .all(|f| f.contains("09:00:00") && f.ends_with("GMT+8")),
        "fires in the task's zone with its label: {fires:?}"
    );
    click(&c, "#create-submit").await;
    until(&c, "the refused create", t, || async {
        text_of(&c, "#create-result")
            .await
            .starts_with("Not created")
            .then_some(())
    })
    .await;
    assert_eq!(
        js(
            &c,
            "return document.querySelectorAll('#preview-list li').length"
        )
        .await,
        0,
        "no stale preview under a failed create"
    );

    // ---- create a paced sequence from the page; its detail opens
    let to: Vec<String> = (0..8).map(|i| format!("r{i}")).collect();
    let request = json!({"id": "seq", "channel": "hook", "schedule": {"after": "1s"},
                         "pacing": {"interval": "300ms"}, "to": to, "body": "hello"});
    let area = c.find(Locator::Css("#create-body")).await.unwrap();
    area.clear().await.unwrap();
    area.send_keys(&request.to_string()).await.unwrap();
    click(&c, "#create-submit").await;
    until(&c, "the created task's row", t, || async {
        c.find(Locator::Css("#task-rows tr[data-task='seq']"))
            .await
            .ok()
    })
    .await;
    let result = text_of(&c, "#create-result").await;
    assert!(result.starts_with("Created task seq"), "{result}");
    until(&c, "the detail of seq", t, || async {
        (text_of(&c, "#detail-id").await == "seq"
            && js(&c, "return document.querySelector('#detail').hidden").await == false)
            .then_some(())
    })
    .await;
    assert_eq!(
        text_of(&c, "#detail-fields dd[data-field='pacing']").await,
        "one message every 300 ms",
        "pacing in words"
    );
    let retry = text_of(&c, "#detail-fields dd[data-field='retry']").await;
    assert!(
        retry.starts_with("up to ") && retry.contains("attempts") && !retry.contains('{'),
        "retry in words: {retry}"
    );

    // ---- the list's bar and the open detail (its bar and its run's row) move live to done
    let (mut list_seen, mut detail_seen, mut run_seen) = (vec![], vec![], vec![]);
    let end = Instant::now() + t;
    loop {
        let list = bar(&c, "#task-rows tr[data-task='seq']").await;
        let detail = bar(&c, "#detail-fields dd[data-field='progress']").await;
        let run = bar(&c, "#run-rows tr[data-run='1']").await;
        for (seen, b) in [
            (&mut list_seen, &list),
            (&mut detail_seen, &detail),
            (&mut run_seen, &run),
        ] {
            if let Some(b) = b {
                if seen.last() != Some(b) {
                    seen.push(b.clone());
                }
            }
        }
        let row_state = js(
            &c,
            "const r = document.querySelector('#task-rows tr[data-task=\"seq\"]'); return r && r.dataset.state",
        )
        .await;
        let finished = |b: &Option<Bar>| b.as_ref().is_some_and(|b| b.total == 8 && b.done() == 8);
        if finished(&list) && finished(&detail) && finished(&run) && row_state == "completed" {
            break;
        }
        if Instant::now() >= end {
            // Fails with a screenshot and the page text.
            until(
                &c,
                &format!(
                    "the bars reaching 8 of 8 (list {list_seen:?}, detail {detail_seen:?}, run {run_seen:?})"
                ),
                Duration::ZERO,
                || async { None::<()> },
            )
            .await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (what, seen) in [
        ("list", &list_seen),
        ("detail", &detail_seen),
        ("run row", &run_seen),
    ] {
        assert!(
            seen.iter().any(|b| b.done() > 0 && b.done() < 8),
            "the {what} bar moved through intermediate values: {seen:?}"
        );
        let done: Vec<u64> = seen.iter().map(Bar::done).collect();
        assert!(done.windows(2).all(|w| w[0] <= w[1]), "{what}: {done:?}");
        let last = seen.last().unwrap();
        assert_eq!((last.sent, last.failed), (7, 1), "{what}: {last:?}");
        assert!(
            last.failed_px >= 3.0,
            "{what}: the failed share is drawn: {last:?}"
        );
    }
    assert_eq!(js(&c, "return window.__heraldMark").await, 42, "no reload");
    assert_eq!(task_state(&h, "seq").await, "completed");
    until(&c, "run 1 shown completed in the detail", t, || async {
        let v = js(
            &c,
            "const r = document.querySelector('#run-rows tr[data-run=\"1\"]'); return r && r.dataset.state",
        )
        .await;
        (v == "completed").then_some(())
    })
    .await;

    // ---- every instant in one format, with a zone label, none in ISO
    let times = js(
        &c,
        "return [...document.querySelectorAll('main time')].map(t => t.textContent)",
    )
    .await;
    let times: Vec<String> = serde_json::from_value(times).unwrap();
    assert!(!times.is_empty());
    for s in &times {
        let zone = s.rsplit(' ').next().unwrap_or_default();
        assert!(!is_iso(s), "not ISO: {s}");
        assert!(
            zone == "UTC"
                || zone.starts_with("GMT")
                || (zone.len() >= 3 && zone.chars().all(|c| c.is_ascii_uppercase())),
            "a zone label ends {s:?}"
        );
    }

    let shown = js(
        &c,
        "return ['#task-table', '#detail-fields', '#run-table', '#failure-table'].map(s => document.querySelector(s).innerText).join('\\n')",
    )
    .await;
    let shown = shown.as_str().unwrap_or_default();
    assert!(!is_iso(shown), "no ISO date-time in the tables: {shown}");
    assert!(
        !shown.contains("2026-") && !shown.contains("(UTC)"),
        "{shown}"
    );

    // ---- the failed message appears in the failure list; the overview counts the traffic
    let failed = "#failure-rows tr[data-failure='seq:1:2']";
    until(&c, "the failed message in the failure list", t, || async {
        c.find(Locator::Css(failed)).await.ok()
    })
    .await;
    let row_text = c
        .find(Locator::Css(failed))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        row_text.contains("r2") && row_text.contains("HTTP 400"),
        "{row_text}"
    );

    // ---- the failure's link opens its task's timeline (the engine's events of the run):
    // newest first, attempts expandable
    click(&c, &format!("{failed} button[data-action='timeline']")).await;
    let order = until(&c, "the timeline of seq", t, || async {
        let v = js(
            &c,
            "return [...document.querySelectorAll('#timeline li[data-seq]')].map(li => [Number(li.dataset.seq), li.dataset.kind])",
        )
        .await;
        let v: Vec<(u64, String)> = serde_json::from_value(v).unwrap_or_default();
        v.iter().any(|(_, k)| k == "failed").then_some(v)
    })
    .await;
    assert!(
        order.windows(2).all(|w| w[0].0 > w[1].0),
        "newest first: {order:?}"
    );
    let opened = js(
        &c,
        r#"const li = [...document.querySelectorAll('#timeline li[data-kind="attempt"]')]
             .find(li => li.textContent.includes('message 2'));
           const d = li && li.querySelector('details');
           if (!d) return null;
           d.open = true;
           return [d.querySelector('summary').textContent, d.querySelector('dl').innerText];"#,
    )
    .await;
    let opened: Vec<String> = serde_json::from_value(opened.clone())
        .unwrap_or_else(|_| panic!("an attempt is expandable: {opened}"));
    assert!(opened[0].contains("HTTP 400"), "{opened:?}");
    assert!(
        opened[1].contains("duration_ms") && opened[1].contains("permanent"),
        "{opened:?}"
    );
    let progress_text = text_of(&c, "#task-rows tr[data-task='seq'] .progress .text").await;
    assert!(progress_text.contains("1 failed"), "{progress_text}");
    until(&c, "the overview's charts drawing the sends and their lateness", t, || async {
        let v = js(
            &c,
            r#"const s = document.querySelector('#chart-sends'), l = document.querySelector('#chart-lateness');
               const ys = [...s.querySelectorAll('.line.sends, .dot.sends')];
               return [Number(s.dataset.pointsSends || 0), Number(l.dataset.pointsP99 || 0), ys.length,
                       document.querySelector('#now-p99').textContent];"#,
        )
        .await;
        let a = v.as_array()?;
        (a[0].as_u64()? >= 2 && a[1].as_u64()? >= 1 && a[2].as_u64()? >= 1 && a[3] != "—")
            .then_some(())
    })
    .await;
    // Some interval drew a rate above zero.
    let peak = js(
        &c,
        r#"return Math.max(...window.Herald.metrics.series(window.Herald.overview.samples()).sends.map(p => p.v))"#,
    )
    .await;
    assert!(
        peak.as_f64().unwrap_or(0.0) > 0.0,
        "a send rate above 0: {peak}"
    );
    until(&c, "the task and failure counts", t, || async {
        let n = text_of(&c, "#count-failures").await;
        let p = text_of(&c, "#count-pending").await;
        (n == "1" && p.chars().all(|c| c.is_ascii_digit()) && !p.is_empty()).then_some(())
    })
    .await;
    let ratio = until(&c, "the channel's success ratio over its window", t, || async {
        let v = js(
            &c,
            "const r = document.querySelector('#channel-rows tr[data-channel=\"hook\"] .ratio'); return r && [r.dataset.attempts, r.textContent]",
        )
        .await;
        let a = v.as_array()?;
        let attempts: u64 = a[0].as_str()?.parse().ok()?;
        (attempts == 8).then(|| a[1].as_str().unwrap_or_default().to_string())
    })
    .await;
    assert_eq!(ratio, "88 % of 8 attempts", "7 of 8 attempts were sent");
    assert!(
        text_of(&c, "#channels-note")
            .await
            .contains("over the last"),
        "the window is stated"
    );
    js(&c, "window.scrollTo(0, 0); return null").await;
    screenshot(&c, "dashboard.png").await;

    // ---- at 1024 px everything fits: the Actions column is on the screen
    c.set_window_size(1024, 1000)
        .await
        .expect("resize to 1024 px");
    let later = http::request(
        "POST",
        &h.url("/v1/tasks"),
        &[("authorization", &format!("Bearer {TOKEN}"))],
        Some(
            json!({"id": "later", "name": "Reminder for the quarterly planning meeting", "schedule": {"cron": "0 9 * * 1-5", "tz": "Asia/Shanghai"}, "to": ["a"], "body": "x"})
                .to_string()
                .into_bytes(),
        ),
    )
    .await;
    assert_eq!(later.status, 201, "{}", later.text());
    let cancel = "#task-rows tr[data-task='later'] button[data-action='cancel']";
    until(
        &c,
        "the new task's row (from the event stream)",
        t,
        || async { c.find(Locator::Css(cancel)).await.ok() },
    )
    .await;
    let fit = js(
        &c,
        r#"const w = document.documentElement.clientWidth;
           const head = [...document.querySelectorAll('#task-table th')].pop().getBoundingClientRect();
           const buttons = [...document.querySelectorAll('#task-rows button[data-action]')].map(b => b.getBoundingClientRect().right);
           const over = [...document.querySelectorAll('.scroll')].map(s => s.scrollWidth - s.clientWidth);
           return [w, head.right, Math.max(...buttons), Math.max(...over)];"#,
    )
    .await;
    let f: Vec<f64> = serde_json::from_value(fit.clone()).unwrap();
    assert!(
        f[1] <= f[0] && f[2] <= f[0] && f[3] <= 0.0,
        "at 1024 px the Actions column is on screen and no table overflows (viewport, header right, buttons right, widest overflow): {fit}"
    );
    js(&c, "window.scrollTo(0, 0); return null").await;
    screenshot(&c, "dashboard-1024.png").await;

    // ---- retry the failed message from the page
    click(&c, &format!("{failed} button[data-action='retry']")).await;
    until(
        &c,
        "the retried message leaving the failure list",
        t,
        || async { c.find(Locator::Css(failed)).await.is_err().then_some(()) },
    )
    .await;
    let sent_twice = rx
        .requests()
        .iter()
        .filter(|r| r.idempotency_key() == Some("seq:1:2"))
        .count();
    assert_eq!(sent_twice, 2, "refused once, then delivered by the retry");

    // ---- cancel a task from the page, through the confirmation dialog
    c.set_window_size(1400, 1000)
        .await
        .expect("resize to 1400 px");
    click(&c, cancel).await;
    until(&c, "the confirmation dialog", t, || async {
        dialog_open(&c, "#confirm-dialog").await.then_some(())
    })
    .await;
    let question = text_of(&c, "#confirm-text").await;
    assert!(question.starts_with("Cancel task later?"), "{question}");
    // Saying no changes nothing.
    click(&c, "#confirm-no").await;
    assert_eq!(task_state(&h, "later").await, "pending");
    click(&c, cancel).await;
    until(&c, "the confirmation dialog, again", t, || async {
        dialog_open(&c, "#confirm-dialog").await.then_some(())
    })
    .await;
    click(&c, "#confirm-yes").await;
    until(&c, "the row showing cancelled", t, || async {
        let b = js(
            &c,
            "const r = document.querySelector('#task-rows tr[data-task=\"later\"]'); return r && r.dataset.state",
        )
        .await;
        (b == "cancelled").then_some(())
    })
    .await;
    assert_eq!(task_state(&h, "later").await, "cancelled");

    // ---- the state filter pages only what matches
    let select = c.find(Locator::Css("#f-state")).await.unwrap();
    select.select_by_value("cancelled").await.unwrap();
    until(&c, "the filtered list", t, || async {
        let ids = js(
            &c,
            "return [...document.querySelectorAll('#task-rows tr[data-task]')].map(r => r.dataset.task)",
        )
        .await;
        (ids == json!(["later"])).then_some(())
    })
    .await;
    js(
        &c,
        "document.querySelector('#detail').scrollIntoView(); return null",
    )
    .await;
    screenshot(&c, "dashboard-detail.png").await;
    c.close().await.expect("close the browser");
}

/// One browser at a time: the machine may have two cores, and a test that measures how soon
/// the page follows the server must not share them with another Chromium.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `method path` over the API with the token; the answer.
async fn call(h: &TestHerald, method: &str, path: &str, body: Option<Value>) -> http::Resp {
    http::request(
        method,
        &h.url(path),
        &[("authorization", &format!("Bearer {TOKEN}"))],
        body.map(|b| b.to_string().into_bytes()),
    )
    .await
}

/// Loads the page and gives it the token; returns once its event stream is live.
async fn sign_in(c: &Client, h: &TestHerald, t: Duration) {
    c.goto(&h.url("/")).await.expect("load the dashboard");
    until(c, "the token dialog", t, || async {
        dialog_open(c, "#token-dialog").await.then_some(())
    })
    .await;
    give_token(c, TOKEN).await;
    until(c, "the live event stream", t, || async {
        (text_of(c, "#live-text").await == "live").then_some(())
    })
    .await;
}

/// The `data-state` of task `id`'s row in the list (`null` when it has no row).
async fn row_state(c: &Client, id: &str) -> Value {
    js(
        c,
        &format!(
            "const r = document.querySelector('#task-rows tr[data-task=\"' + CSS.escape({id:?}) + '\"]'); return r ? r.dataset.state : null"
        ),
    )
    .await
}

/// The page follows a busy server: a task deleted over the API (`DELETE` of a finished task)
/// leaves the list and its open detail (the `deleted` event: the page reloads nothing on a timer); a send held by its
/// channel's rate limit, a step with a `timeline` event and nothing else, shows in the open
/// detail's timeline; and while one-shots are created at ~40/s — a `task` event every ~25 ms,
/// never the 100 ms of quiet a trailing-only debounce waits for — a task paused over the API
/// shows paused while the storm goes on (the debounce waits at most 3 s; a trailing-only one
/// would wait out the storm's 8 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_follows_a_busy_server() {
    let _one = BROWSER.lock().await;
    let Some(driver) = start_driver().await else {
        return;
    };
    // `slow` sends one message a minute: a second one is held (a `held` timeline event, its
    // own write, with no task or progress event).
    let h =
        TestHerald::start_with_token("[channels.slow]\nkind = \"log\"\nrate = \"1/1m\"\n", TOKEN)
            .await;
    let t = Duration::from_secs(30);
    // `p` waits for its cron; `done` is finished (cancelled), so `DELETE` deletes it.
    let p = json!({"id": "p", "schedule": {"cron": "0 9 * * *", "tz": "UTC"}, "to": ["a"], "body": "x"});
    let done = json!({"id": "done", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"});
    for body in [p, done] {
        let r = call(&h, "POST", "/v1/tasks", Some(body)).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = call(&h, "POST", "/v1/tasks/done/cancel", None).await;
    assert_eq!(r.status, 200, "{}", r.text());

    let c = browser(&driver).await;
    sign_in(&c, &h, t).await;
    until(&c, "the rows of p and done", t, || async {
        (row_state(&c, "p").await == "pending" && row_state(&c, "done").await == "cancelled")
            .then_some(())
    })
    .await;

    // ---- a deleted task leaves the list and its open detail
    click(&c, "#task-rows tr[data-task='done'] button.link").await;
    until(&c, "the detail of done", t, || async {
        (text_of(&c, "#detail-id").await == "done"
            && js(&c, "return document.querySelector('#detail').hidden").await == false)
            .then_some(())
    })
    .await;
    let r = call(&h, "DELETE", "/v1/tasks/done", None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(call(&h, "GET", "/v1/tasks/done", None).await.status, 404);
    // The page reloads nothing on a timer: without the `deleted` event it never goes.
    until(
        &c,
        "the deleted task's row and detail gone",
        Duration::from_secs(10),
        || async {
            (row_state(&c, "done").await == Value::Null
                && js(&c, "return document.querySelector('#detail').hidden").await == true)
                .then_some(())
        },
    )
    .await;
    assert_eq!(row_state(&c, "p").await, "pending", "the other row stays");

    // ---- made again with the same id, its detail shows its own timeline (its seqs start
    // anew), not the deleted task's: a refresh reads only what is new after the last seq
    // drawn, which must not be taken from another task of this id.
    let again = json!({"id": "done", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"});
    let r = call(&h, "POST", "/v1/tasks", Some(again)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    until(&c, "the row of done made again", t, || async {
        (row_state(&c, "done").await == "pending").then_some(())
    })
    .await;
    click(&c, "#task-rows tr[data-task='done'] button.link").await;
    // Converges to the new task's one event; the deleted one's `cancelled` never goes away
    // when its events are kept.
    until(&c, "done's own timeline: only its `created`", t, || async {
        let v = js(
            &c,
            "return [...document.querySelectorAll('#timeline li[data-kind]')].map(li => li.dataset.kind)",
        )
        .await;
        let k: Vec<String> = serde_json::from_value(v).unwrap_or_default();
        (text_of(&c, "#detail-id").await == "done" && k == ["created"]).then_some(())
    })
    .await;
    click(&c, "#detail-close").await;

    // ---- a step with only a timeline event (`held`) shows in the open detail's timeline
    // `x` takes `slow`'s slot for the minute.
    let x = json!({"id": "x", "channel": "slow", "schedule": {"after": "0s"}, "to": ["a"], "body": "x"});
    let r = call(&h, "POST", "/v1/tasks", Some(x)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let sent = common::herald::poll(t, || async {
        (task_state(&h, "x").await == "completed").then_some(())
    })
    .await;
    assert!(sent.is_some(), "x sent");
    // `y` fires ~2 s before its instant (its run starts then, with a progress event and a
    // read of the detail), and its send, at its instant, is held. 10 s leaves a loaded
    // machine time to show the row and open the detail before the hold.
    let y = json!({"id": "y", "channel": "slow", "schedule": {"after": "10s"}, "to": ["a"], "body": "y"});
    let r = call(&h, "POST", "/v1/tasks", Some(y)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let open_y = "#task-rows tr[data-task='y'] button.link";
    until(&c, "the row of y", t, || async {
        c.find(Locator::Css(open_y)).await.ok()
    })
    .await;
    click(&c, open_y).await;
    let kinds = || async {
        let v = js(
            &c,
            "return [...document.querySelectorAll('#timeline li[data-kind]')].map(li => li.dataset.kind)",
        )
        .await;
        serde_json::from_value::<Vec<String>>(v).unwrap_or_default()
    };
    let fired = until(&c, "y's timeline showing it fired", t, || async {
        let k = kinds().await;
        (text_of(&c, "#detail-id").await == "y" && k.iter().any(|k| k == "fired")).then_some(k)
    })
    .await;
    assert!(
        !fired.iter().any(|k| k == "held"),
        "the detail read y's timeline before its send was held: {fired:?}"
    );
    // Held at y's instant, a few seconds from here.
    until(
        &c,
        "y's held send in its timeline",
        Duration::from_secs(20),
        || async { kinds().await.iter().any(|k| k == "held").then_some(()) },
    )
    .await;
    let r = call(&h, "GET", "/v1/tasks/y/timeline", None).await;
    assert!(
        r.json()["events"].as_array().is_some_and(|e| e
            .iter()
            .any(|e| e["kind"] == "held" && e["detail"]["why"] == "rate_limit")),
        "held by the rate limit: {}",
        r.text()
    );

    // ---- one-shots created at ~40/s for up to 8 s (ids after `p`: it stays on page 1)
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let created = std::sync::Arc::new(AtomicU32::new(0));
    let storm = {
        let (stop, created) = (stop.clone(), created.clone());
        let url = h.url("/v1/tasks");
        tokio::spawn(async move {
            // Each create on its own, so that one slow answer does not leave a gap.
            let mut tick = tokio::time::interval(Duration::from_millis(25));
            let mut creates = Vec::new();
            for i in 0..320u32 {
                tick.tick().await;
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let (url, created) = (url.clone(), created.clone());
                creates.push(tokio::spawn(async move {
                    let body = json!({"id": format!("s{i:04}"), "schedule": {"after": "1h"},
                                      "to": ["a"], "body": "x"});
                    let r = http::request(
                        "POST",
                        &url,
                        &[("authorization", &format!("Bearer {TOKEN}"))],
                        Some(body.to_string().into_bytes()),
                    )
                    .await;
                    assert_eq!(r.status, 201, "{}", r.text());
                    created.fetch_add(1, Ordering::SeqCst);
                }));
            }
            for c in creates {
                c.await.expect("a create");
            }
        })
    };
    // The storm is under way before `p` is paused.
    let under_way = common::herald::poll(t, || async {
        (created.load(Ordering::SeqCst) >= 10).then_some(())
    })
    .await;
    assert!(under_way.is_some(), "10 one-shots created");
    let r = call(&h, "POST", "/v1/tasks/p/pause", None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    until(
        &c,
        "p shown paused while the creates go on",
        Duration::from_secs(6),
        || async { (row_state(&c, "p").await == "paused").then_some(()) },
    )
    .await;
    assert!(
        !storm.is_finished(),
        "the creates were still going on when p showed paused"
    );
    // The page kept up with the new tasks too (the list reloaded during the storm).
    until(&c, "created one-shots on the page", t, || async {
        (row_state(&c, "s0000").await == "pending").then_some(())
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    storm.await.expect("the creates");
    c.close().await.expect("close the browser");
}

#[tokio::test]
async fn page_and_assets_are_embedded_and_locked_down() {
    let h = TestHerald::start_with_token("", TOKEN).await;
    // Open without the token (they hold no data), with a strict content security policy.
    for (path, ty) in [
        ("/", "text/html; charset=utf-8"),
        ("/dashboard/app.js", "text/javascript; charset=utf-8"),
        ("/dashboard/app.css", "text/css; charset=utf-8"),
        ("/dashboard/format.js", "text/javascript; charset=utf-8"),
        ("/dashboard/metrics.js", "text/javascript; charset=utf-8"),
        ("/dashboard/chart.js", "text/javascript; charset=utf-8"),
        ("/dashboard/timeline.js", "text/javascript; charset=utf-8"),
    ] {
        let r = http::get(&h.url(path)).await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some(ty), "{path}");
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(
            csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
            "{csp}"
        );
        // The SVG namespace is a name, not a download.
        let text = r.text().replace("http://www.w3.org/2000/svg", "");
        assert!(
            !text.contains("http://") && !text.contains("https://"),
            "{path}: no CDN"
        );
    }
    let page = http::get(&h.url("/")).await.text();
    for asset in [
        "app.js",
        "app.css",
        "format.js",
        "metrics.js",
        "chart.js",
        "timeline.js",
    ] {
        assert!(page.contains(&format!("/dashboard/{asset}")), "{asset}");
    }
    // Every form control has a label.
    for id in [
        "f-state",
        "f-channel",
        "f-limit",
        "create-body",
        "token-input",
    ] {
        assert!(page.contains(&format!("for=\"{id}\"")), "label for {id}");
    }
    let r = http::request("POST", &h.url("/"), &[], None).await;
    assert_eq!(r.status, 405);
    // The API behind it still needs the token.
    assert_eq!(http::get(&h.url("/v1/tasks")).await.status, 401);
}

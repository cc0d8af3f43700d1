//! The dashboard in a real browser: headless Chromium driven over WebDriver (Debian's
//! `chromium` and `chromium-driver`; `.ci/run` installs them), against a real herald with a
//! token and a real webhook receiver. It signs in, creates a paced sequence from the page,
//! watches its progress bar move to done (live, without reloading), sees a failed message
//! appear and retries it, and cancels a task with the confirmation dialog. A screenshot is
//! saved as `target/tmp/dashboard.png` (`dashboard-failure.png` when a step fails).
//!
//! Without chromium or chromedriver this test FAILS, saying what to install.

mod common;

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::herald::{webhook_channel, TestHerald};
use common::http;
use common::receiver::{Behavior, Receiver};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

const TOKEN: &str = "dash-board-token";

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

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

async fn start_driver() -> Driver {
    const INSTALL: &str = "install Debian's chromium and chromium-driver: \
         apt-get update && apt-get install -y chromium chromium-driver (.ci/run does this)";
    let driver = which("chromedriver").unwrap_or_else(|| {
        panic!("the dashboard test needs chromedriver, not found on PATH; {INSTALL}")
    });
    let chromium = which("chromium")
        .or_else(|| which("chromium-browser"))
        .unwrap_or_else(|| {
            panic!("the dashboard test needs chromium, not found on PATH; {INSTALL}")
        });
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
    d
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
                "--disable-dev-shm-usage", "--window-size=1280,1100",
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

/// The progress bar of a task row: (value, max, row state), if the row has one.
async fn bar(c: &Client, id: &str) -> Option<(u64, u64, String)> {
    let v = js(
        c,
        &format!(
            r#"const tr = document.querySelector('#task-rows tr[data-task="{id}"]');
               if (!tr) return null;
               const p = tr.querySelector('progress');
               return [p ? Number(p.getAttribute('value')) : -1, p ? Number(p.getAttribute('max')) : -1, tr.dataset.state];"#
        ),
    )
    .await;
    let a = v.as_array()?;
    Some((
        a[0].as_i64().filter(|x| *x >= 0)? as u64,
        a[1].as_u64()?,
        a[2].as_str()?.to_string(),
    ))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_headless_chromium() {
    let driver = start_driver().await;
    let rx = Receiver::start().await;
    // The third message of the sequence is refused once for good (400): it lands in the
    // failure list; its retry from the page is accepted.
    rx.script_key("seq:1:2", vec![Behavior::Status(400)]);
    let h = TestHerald::start_with_token(&webhook_channel("hook", &rx.url(), ""), TOKEN).await;
    let c = browser(&driver).await;
    let t = Duration::from_secs(30);

    // ---- load; the page asks for the token once
    c.goto(&h.url("/")).await.expect("load the dashboard");
    assert_eq!(c.title().await.unwrap(), "herald");
    until(&c, "the token dialog", t, || async {
        (js(&c, "return document.querySelector('#token-dialog').open").await == true).then_some(())
    })
    .await;
    let input = c.find(Locator::Css("#token-input")).await.unwrap();
    input.send_keys(TOKEN).await.unwrap();
    click(&c, "#token-save").await;
    until(&c, "the live event stream", t, || async {
        (js(
            &c,
            "return document.querySelector('#live-text').textContent",
        )
        .await
            == "live")
            .then_some(())
    })
    .await;
    assert_eq!(
        js(&c, "return sessionStorage.getItem('herald.token')").await,
        TOKEN,
        "the token is kept for the browser session"
    );
    // The channels table is there, with the webhook channel.
    until(&c, "the channels table", t, || async {
        c.find(Locator::Css("#channel-rows tr[data-channel='hook']"))
            .await
            .ok()
    })
    .await;
    // Marks this page load: if the page reloaded, the mark would be gone.
    js(&c, "window.__heraldMark = 42; return null").await;

    // ---- create a paced sequence from the page
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
    let result = js(
        &c,
        "return document.querySelector('#create-result').textContent",
    )
    .await;
    assert!(
        result
            .as_str()
            .unwrap_or_default()
            .starts_with("Created task seq"),
        "{result}"
    );

    // ---- its progress bar advances to done, live
    let mut seen: Vec<(u64, u64)> = Vec::new();
    let end = Instant::now() + t;
    loop {
        let b = bar(&c, "seq").await;
        if let Some((v, max, state)) = &b {
            if seen.last() != Some(&(*v, *max)) {
                seen.push((*v, *max));
            }
            if *max == 8 && v == max && state == "completed" {
                break;
            }
        }
        if Instant::now() >= end {
            // Fails with a screenshot and the page text.
            until(
                &c,
                &format!("the progress bar reaching 8/8 (seen {seen:?})"),
                Duration::ZERO,
                || async { None::<()> },
            )
            .await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        seen.iter().any(|(v, max)| *max == 8 && *v > 0 && v < max),
        "the bar moved through intermediate values: {seen:?}"
    );
    let values: Vec<u64> = seen.iter().map(|(v, _)| *v).collect();
    assert!(values.windows(2).all(|w| w[0] <= w[1]), "{values:?}");
    assert_eq!(js(&c, "return window.__heraldMark").await, 42, "no reload");
    assert_eq!(task_state(&h, "seq").await, "completed");

    // ---- the failed message appears in the failure list; retry it from the page
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
    let progress_text = js(
        &c,
        "return document.querySelector('#task-rows tr[data-task=\"seq\"] .progress .text').textContent",
    )
    .await;
    assert!(
        progress_text
            .as_str()
            .unwrap_or_default()
            .contains("1 failed"),
        "{progress_text}"
    );
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

    // ---- a task's runs
    click(&c, "#task-rows tr[data-task='seq'] button.link").await;
    until(&c, "the runs of seq", t, || async {
        let v = js(
            &c,
            "const r = document.querySelector('#run-rows tr[data-run=\"1\"]'); return r && r.innerText",
        )
        .await;
        v.as_str()
            .filter(|s| s.contains("completed"))
            .map(str::to_string)
    })
    .await;

    // ---- cancel a task from the page, through the confirmation dialog
    let r = http::request(
        "POST",
        &h.url("/v1/tasks"),
        &[("authorization", &format!("Bearer {TOKEN}"))],
        Some(
            json!({"id": "later", "schedule": {"after": "1h"}, "to": ["a"], "body": "x"})
                .to_string()
                .into_bytes(),
        ),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let cancel = "#task-rows tr[data-task='later'] button[data-action='cancel']";
    until(
        &c,
        "the new task's row (from the event stream)",
        t,
        || async { c.find(Locator::Css(cancel)).await.ok() },
    )
    .await;
    click(&c, cancel).await;
    until(&c, "the confirmation dialog", t, || async {
        (js(&c, "return document.querySelector('#confirm-dialog').open").await == true)
            .then_some(())
    })
    .await;
    let question = js(
        &c,
        "return document.querySelector('#confirm-text').textContent",
    )
    .await;
    assert!(
        question
            .as_str()
            .unwrap_or_default()
            .starts_with("Cancel task later?"),
        "{question}"
    );
    // Saying no changes nothing.
    click(&c, "#confirm-no").await;
    assert_eq!(task_state(&h, "later").await, "pending");
    click(&c, cancel).await;
    until(&c, "the confirmation dialog, again", t, || async {
        (js(&c, "return document.querySelector('#confirm-dialog').open").await == true)
            .then_some(())
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

    let png = c.screenshot().await.expect("screenshot");
    std::fs::write(artifact("dashboard.png"), &png).expect("save the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
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
    ] {
        let r = http::get(&h.url(path)).await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some(ty), "{path}");
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(
            csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
            "{csp}"
        );
        assert!(
            !r.text().contains("http://") && !r.text().contains("https://"),
            "{path}: no CDN"
        );
    }
    let page = http::get(&h.url("/")).await.text();
    assert!(page.contains("/dashboard/app.js") && page.contains("/dashboard/app.css"));
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

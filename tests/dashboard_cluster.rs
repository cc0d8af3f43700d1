//! The dashboard's Cluster panel in headless Chromium over WebDriver (as `tests/dashboard.rs`):
//! against a plain herald (no `[cluster]`) `GET /v1/cluster` is 404 and the panel stays hidden
//! with no error shown; `cluster.js` (pure) is checked on a known view: held shards, the clock
//! offset in words, nodes this node first (with their last heartbeat and clock offset), shard
//! cells (`leases`) coloured by owner with epoch and lease expiry in their title. Also: the
//! asset is served like the others.
//!
//! Without chromium or chromedriver the browser test is skipped loudly
//! (`common::tools::require`), and fails under `CI=true`.

mod common;

use std::future::Future;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::herald::TestHerald;
use common::http;
use common::tools;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

const TOKEN: &str = "dash-cluster-token";
const TEST: &str = "cluster_panel_in_headless_chromium";
const INSTALL: &str = "apt-get update && apt-get install -y chromium chromium-driver";

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
    let d = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
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
        "chromedriver did not get ready within 30 s"
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
                "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
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

async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, vec![])
        .await
        .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
}

/// Polls `check` every 25 ms until it returns `Some` or `deadline` passes.
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
            let body = js(c, "return document.body.innerText").await;
            panic!(
                "dashboard: {what} did not happen within {deadline:?}; page text:\n{}",
                body.as_str().unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_panel_in_headless_chromium() {
    let Some(driver) = start_driver().await else {
        return;
    };
    let h = TestHerald::start_with_token("", TOKEN).await;
    let c = browser(&driver).await;
    let t = Duration::from_secs(30);
    c.goto(&h.url("/")).await.expect("load the dashboard");
    let input = c.find(Locator::Css("#token-input")).await.unwrap();
    until(&c, "the token dialog", t, || async {
        (js(&c, "return document.querySelector('#token-dialog').open").await == true).then_some(())
    })
    .await;
    input.send_keys(TOKEN).await.unwrap();
    c.find(Locator::Css("#token-save"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();

    // (a) Not in cluster mode: GET /v1/cluster is 404, so the panel stays hidden, no error.
    let r = http::request(
        "GET",
        &h.url("/v1/cluster"),
        &[("authorization", &format!("Bearer {TOKEN}"))],
        None,
    )
    .await;
    assert_eq!(r.status, 404, "plain herald: no cluster view");
    // Two overview beats (each ends with the cluster read) have passed once two samples exist.
    until(&c, "two overview samples", t, || async {
        (js(&c, "return window.Herald.overview.samples().length")
            .await
            .as_u64()?
            >= 2)
            .then_some(())
    })
    .await;
    assert_eq!(
        js(&c, "return document.querySelector('#cluster').hidden").await,
        true,
        "the cluster panel is hidden outside cluster mode"
    );
    let notice = js(&c, "return document.querySelector('#notice').textContent").await;
    assert!(
        !notice.as_str().unwrap_or_default().contains("cluster"),
        "no error shown for the 404: {notice}"
    );
    assert_eq!(
        js(
            &c,
            "return document.querySelectorAll('#cluster-shards .shard').length"
        )
        .await,
        0
    );

    // (b) cluster.js on a known view.
    let v = js(
        &c,
        r#"const C = window.Herald.cluster;
           const view = {shards: 4, epochs: {"0": 7, "1": 3, "2": 2, "3": 5},
             node_id: "b", shards_total: 4, shards_owned: 2, clock_offset_ms: -1250,
             read_at: "2026-12-01T10:00:00Z",
             nodes: [{node_id: "a", incarnation: "i1", advertise: "http://10.0.0.1:8080", shards: [0],
                      heartbeat_at: "2026-12-01T09:59:59Z", clock_offset_ms: 12, live: true, shards_owned: 1},
                     {node_id: "b", incarnation: "i2", advertise: "http://10.0.0.2:8080", shards: [1, 2],
                      heartbeat_at: "2026-12-01T10:00:00Z", clock_offset_ms: -1250, live: true, shards_owned: 2},
                     {node_id: "c", incarnation: "i3", advertise: null, shards: [],
                      heartbeat_at: "2026-12-01T09:58:00Z", clock_offset_ms: null, live: false, shards_owned: 0}],
             leases: [{shard: 1, epoch: 3, owner_node: "b", lease_expires: "2026-12-01T10:00:09Z", free: false},
                      {shard: 0, epoch: 7, owner_node: "a", lease_expires: "2026-12-01T10:00:08Z", free: false},
                      {shard: 2, epoch: 2, owner_node: "b", lease_expires: "2026-12-01T10:00:09Z", free: false},
                      {shard: 3, epoch: 5, owner_node: "c", lease_expires: "2026-12-01T09:59:00Z", free: true}]};
           return {held: C.held(view), off: [C.offset(-1250), C.offset(12), C.offset(0), C.offset(null)],
                   one: C.held({shards_owned: 1, shards_total: 1}),
                   nodes: C.nodes(view), cells: C.cells(view)};"#,
    )
    .await;
    assert_eq!(v["held"], "holds 2 of 4 shards");
    assert_eq!(v["one"], "holds 1 of 1 shard");
    assert_eq!(
        v["off"],
        json!(["−1,250 ms", "+12 ms", "0 ms", "not measured yet"])
    );
    let ids: Vec<&str> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["b", "a", "c"], "this node first, then by id");
    assert_eq!(v["nodes"][0]["self"], true);
    assert_eq!(v["nodes"][0]["shards"], "2 shards");
    assert_eq!(v["nodes"][1]["shards"], "1 shard");
    assert_eq!(v["nodes"][2]["state"], "not live");
    assert_eq!(v["nodes"][2]["advertise"], "—");
    assert_eq!(v["nodes"][0]["heartbeat"], "2026-12-01T10:00:00Z");
    assert_eq!(v["nodes"][0]["offset"], "−1,250 ms");
    assert_eq!(v["nodes"][1]["offset"], "+12 ms");
    assert_eq!(v["nodes"][2]["offset"], "not measured yet");
    assert_eq!(v["nodes"][1]["cls"], "owner-0", "colours by node id order");
    assert_eq!(v["nodes"][0]["cls"], "owner-1");
    let cells = v["cells"].as_array().unwrap();
    let order: Vec<u64> = cells.iter().map(|x| x["shard"].as_u64().unwrap()).collect();
    assert_eq!(order, [0, 1, 2, 3], "shard order");
    assert_eq!(cells[0]["cls"], "owner-0");
    assert_eq!(cells[1]["cls"], "owner-1");
    assert_eq!(cells[2]["cls"], cells[1]["cls"], "same owner, same colour");
    assert_eq!(
        cells[0]["title"],
        "shard 0 · owner a · epoch 7 · lease until 2026-12-01T10:00:08Z"
    );
    assert_eq!(cells[3]["cls"], "free");
    assert_eq!(cells[3]["owner"], Value::Null);
    assert_eq!(
        cells[3]["title"],
        "shard 3 · free · epoch 5 · lease expired 2026-12-01T09:59:00Z"
    );
    c.close().await.expect("close the browser");
}

#[tokio::test]
async fn cluster_script_is_served_like_the_others() {
    let h = TestHerald::start_with_token("", TOKEN).await;
    let r = http::get(&h.url("/dashboard/cluster.js")).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert!(r
        .header("content-security-policy")
        .unwrap_or_default()
        .contains("script-src 'self'"));
    assert!(http::get(&h.url("/"))
        .await
        .text()
        .contains("/dashboard/cluster.js"));
}

//! The documentation a newcomer follows is checked against the code: docs/API.md names every
//! path and method of the OpenAPI document and no other, README's links stay inside the
//! repository, and README's example config starts the real binary.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::herald::{poll, Proc};
use common::http;

const METHODS: [&str; 6] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"];

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `METHOD /path` pairs written in backticks (`` `GET /v1/tasks?limit=` ``), query dropped.
fn documented(md: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for chunk in md.split('`').skip(1).step_by(2) {
        let Some((m, path)) = chunk.split_once(' ') else {
            continue;
        };
        if METHODS.contains(&m) && path.starts_with('/') {
            let path = path.split(['?', ' ']).next().unwrap_or(path);
            out.insert((m.to_string(), path.to_string()));
        }
    }
    out
}

#[test]
fn docs_api_md_and_the_openapi_document_name_the_same_operations() {
    let doc: serde_json::Value = serde_json::from_str(herald::api::OPENAPI).unwrap();
    let mut spec = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in item.as_object().unwrap().keys() {
            let m = m.to_ascii_uppercase();
            if METHODS.contains(&m.as_str()) {
                spec.insert((m, path.clone()));
            }
        }
    }
    let md = documented(&read("docs/API.md"));
    let missing: Vec<_> = spec.difference(&md).collect();
    let extra: Vec<_> = md.difference(&spec).collect();
    assert!(
        missing.is_empty(),
        "in openapi.json, not in docs/API.md: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "in docs/API.md, not in openapi.json: {extra:?}"
    );
}

#[test]
fn readme_links_point_inside_the_repository() {
    let readme = read("README.md");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut links = 0;
    for part in readme.split("](").skip(1) {
        let target = part.split(')').next().unwrap_or("");
        if target.starts_with("http://")
            || target.starts_with("https://")
            || target.starts_with('#')
        {
            continue;
        }
        links += 1;
        let file = target.split('#').next().unwrap_or(target);
        assert!(
            !file.starts_with("../"),
            "README links outside the repository: {target}"
        );
        assert!(
            root.join(file).exists(),
            "README links to a missing file: {target}"
        );
    }
    assert!(links > 0, "README has relative links");
    assert!(
        readme.contains("](docs/API.md)"),
        "README links the API reference"
    );
}

/// The first TOML block of README's "## Configuration" section.
fn readme_config() -> String {
    let readme = read("README.md");
    let section = readme
        .split_once("\n## Configuration\n")
        .expect("README has a Configuration section")
        .1;
    let block = section.split_once("```toml\n").expect("a toml block").1;
    block.split_once("```").expect("closed").0.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_example_config_starts_herald() {
    let text = readme_config();
    assert!(text.contains("[channels."), "the example config: {text}");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("herald.toml");
    std::fs::write(&cfg, &text).unwrap();
    // As written: relative paths (data_dir, the file channel) from the working directory. Only
    // the port is overridden, so that tests may run side by side.
    let mut cmd = Proc::command(&cfg, &dir.path().join("herald-data"));
    cmd.current_dir(dir.path());
    let p = Proc::start(cmd);
    let url = format!("{}/healthz", p.url);
    let ok = poll(Duration::from_secs(30), || {
        let url = url.clone();
        async move {
            let r = http::try_request("GET", &url, &[], None).await.ok()?;
            (r.status == 200).then_some(())
        }
    })
    .await;
    assert!(
        ok.is_some(),
        "/healthz did not answer 200 with README's config"
    );
    let channels = http::get(&format!("{}/v1/channels", p.url)).await;
    assert_eq!(channels.status, 200);
    let names: Vec<String> = channels.json()["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(names.iter().any(|n| n == "wechat"), "{names:?}");
}

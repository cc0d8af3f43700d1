//! Cluster-mode nodes for the tests: a real `herald` process with a `[cluster]` section on a
//! given PostgreSQL URL, and what its `/healthz` says it holds.

use std::path::Path;

use super::herald::{write_config, Proc};
use super::http;

/// The tests' lease timing: short, so that a failover takes seconds.
pub const TEST_TIMING: &str = "lease = \"2s\"\nrenew = \"400ms\"\nsafety = \"500ms\"\n";

/// Starts a node named `name` (its files in `dir/name`) with node id `id`, `shards` shards,
/// a webhook channel `hook` to `hook_url`, and `timing` (`lease`/`renew`/`safety` lines).
/// `HERALD_TEST_NODE_LOG` sets its log filter.
pub fn node(
    url: &str,
    dir: &Path,
    name: &str,
    id: &str,
    shards: u32,
    hook_url: &str,
    timing: &str,
) -> Proc {
    let hook = format!("url = \"{hook_url}\"\ntimeout = \"1s\"\n");
    Proc::start(node_command(url, dir, name, id, shards, &hook, timing))
}

/// [`node`]'s command, not started yet, with the `hook` channel's own lines (`url`,
/// `timeout`, ...): a test adds its environment before `Proc::start`.
pub fn node_command(
    url: &str,
    dir: &Path,
    name: &str,
    id: &str,
    shards: u32,
    hook: &str,
    timing: &str,
) -> std::process::Command {
    let nd = dir.join(name);
    std::fs::create_dir_all(&nd).unwrap();
    let config = write_config(
        &nd,
        &format!(
            "[channels.hook]\nkind = \"webhook\"\n{hook}\
             [cluster]\nnode_id = \"{id}\"\nshards = {shards}\n{timing}"
        ),
    );
    let mut cmd = Proc::command(&config, &nd.join("data"));
    cmd.env("HERALD_STORE_URL", url)
        .env("HERALD_STORE_STATEMENT_TIMEOUT", "3s");
    if let Ok(l) = std::env::var("HERALD_TEST_NODE_LOG") {
        cmd.env("HERALD_LOG", l)
            .env(super::herald::LOG_TAG, name)
            .stderr(std::process::Stdio::piped());
    }
    cmd
}

/// A lone node `a` with `shards` shards and a webhook channel `hook` to `hook_url`, the test
/// knob `knob_env` pointing at `knob_file` (the knob acts while that file exists), once it
/// holds every shard.
pub async fn lone_node_with_knob(
    url: &str,
    dir: &Path,
    shards: u32,
    hook_url: &str,
    knob_env: &str,
    knob_file: &Path,
) -> Proc {
    let hook = format!("url = \"{hook_url}\"\ntimeout = \"1s\"\n");
    let mut cmd = node_command(url, dir, "a", "a", shards, &hook, TEST_TIMING);
    cmd.env(knob_env, knob_file);
    let a = Proc::start(cmd);
    super::herald::poll(std::time::Duration::from_secs(30), || async {
        (owned(&a.url).await == u64::from(shards)).then_some(())
    })
    .await
    .expect("a takes every shard");
    a
}

/// The shards `node` owns, from `base`'s `GET /v1/cluster`.
pub async fn shards_of(base: &str, node: &str) -> Vec<u32> {
    let view = http::get(&format!("{base}/v1/cluster")).await.json();
    view["leases"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["owner_node"] == node)
        .filter_map(|s| s["shard"].as_u64().map(|n| n as u32))
        .collect()
}

/// How many shards the node at `base` holds now (0 when it does not answer).
pub async fn owned(base: &str) -> u64 {
    http::get(&format!("{base}/healthz")).await.json()["cluster"]["shards_owned"]
        .as_u64()
        .unwrap_or(0)
}

/// Waits (up to `deadline`) until the nodes at `urls` hold `each` shards apiece.
pub async fn balanced(urls: &[&str], each: u64, deadline: std::time::Duration, what: &str) {
    super::herald::poll(deadline, || async {
        for u in urls {
            if owned(u).await != each {
                return None;
            }
        }
        Some(())
    })
    .await
    .unwrap_or_else(|| panic!("{what}: the nodes do not hold {each} shards each"));
}

/// One run's `n` messages (idempotency keys `task:run:seq`) at the receiver after a fault:
/// waits up to `deadline` for every one, then asserts each arrived at most twice, at most one
/// twice (`what` names the message in flight at the fault), and in seq order. Answers every
/// key received, in arrival order.
pub async fn sequence_delivered(
    rx: &super::receiver::Receiver,
    n: usize,
    deadline: std::time::Duration,
    what: &str,
) -> Vec<String> {
    let keys = || -> Vec<String> {
        rx.requests()
            .iter()
            .filter_map(|r| r.idempotency_key().map(str::to_string))
            .collect()
    };
    let done = super::herald::poll(deadline, || async {
        (keys()
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len()
            == n)
            .then_some(())
    })
    .await;
    let keys = keys();
    assert!(done.is_some(), "not every message arrived: {keys:?}");
    let mut per: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for k in &keys {
        *per.entry(k.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = per.iter().filter(|(_, c)| **c > 1).collect();
    assert!(
        per.values().all(|c| *c <= 2) && twice.len() <= 1,
        "only the message in flight at {what} may arrive twice: {twice:?}"
    );
    let seqs: Vec<u32> = keys
        .iter()
        .filter_map(|k| k.rsplit(':').next()?.parse().ok())
        .collect();
    let mut dedup = seqs.clone();
    dedup.dedup();
    assert!(dedup.windows(2).all(|w| w[0] < w[1]), "order: {seqs:?}");
    keys
}

/// Every request the receiver saw that carried an idempotency key, as the history checker
/// (`history.rs`) reads deliveries: key, `herald-epoch`, arrival and when its answer went
/// back (so the checker's no-overlap rule runs).
pub fn deliveries(rx: &super::receiver::Receiver) -> Vec<super::history::Delivery> {
    rx.requests()
        .iter()
        .filter_map(|r| {
            Some(super::history::Delivery {
                key: r.idempotency_key()?.to_string(),
                epoch: r.header("herald-epoch").and_then(|e| e.parse().ok()),
                at_ms: r.at_ms,
                done_ms: r.done_ms,
            })
        })
        .collect()
}

/// The value of the unlabelled sample `name` in the node's `/metrics` (0 when absent).
pub async fn metric(base: &str, name: &str) -> f64 {
    let text = http::get(&format!("{base}/metrics")).await.text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The first id `{prefix}-{i}` whose shard (of `shards`) is one of `among`.
pub fn id_in(prefix: &str, among: &[u32], shards: u32) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|id| among.contains(&herald::store::pg::fence::shard_of_task(id, shards)))
        .unwrap_or_else(|| panic!("no id {prefix}-… in shards {among:?}"))
}

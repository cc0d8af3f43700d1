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
    let nd = dir.join(name);
    std::fs::create_dir_all(&nd).unwrap();
    let config = write_config(
        &nd,
        &format!(
            "[channels.hook]\nkind = \"webhook\"\nurl = \"{hook_url}\"\ntimeout = \"1s\"\n\
             [cluster]\nnode_id = \"{id}\"\nshards = {shards}\n{timing}"
        ),
    );
    let mut cmd = Proc::command(&config, &nd.join("data"));
    cmd.env("HERALD_STORE_URL", url)
        .env("HERALD_STORE_STATEMENT_TIMEOUT", "3s");
    if let Ok(l) = std::env::var("HERALD_TEST_NODE_LOG") {
        cmd.env("HERALD_LOG", l);
    }
    Proc::start(cmd)
}

/// How many shards the node at `base` holds now (0 when it does not answer).
pub async fn owned(base: &str) -> u64 {
    http::get(&format!("{base}/healthz")).await.json()["cluster"]["shards_owned"]
        .as_u64()
        .unwrap_or(0)
}

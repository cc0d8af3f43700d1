//! `herald cluster`: the cluster as the node asked sees it (`GET /v1/cluster`): its nodes
//! (the shards each owns now, its last heartbeat and clock offset), and per shard its epoch,
//! owner and lease expiry (`leases`).

use serde_json::Value;

use crate::cli::output::{out, outln};

use super::client::{CliError, Client};
use super::print_json;
use super::table::{self, Table};

#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
pub async fn show(c: &Client, json: bool) -> Result<(), CliError> {
    let v = c.get("/v1/cluster").await?;
    if json {
        print_json(&v);
        return Ok(());
    }
    outln!(
        "node {} holds {} of {} shards (clock offset to the database: {} ms; read {})",
        table::cell(&v["node_id"]),
        table::cell(&v["shards_owned"]),
        table::cell(&v["shards"]),
        table::cell(&v["clock_offset_ms"]),
        table::cell(&v["read_at"]),
    );
    let mut nodes = Table::new(&[
        "NODE",
        "LIVE",
        "SHARDS",
        "HEARTBEAT",
        "OFFSET MS",
        "ADVERTISE",
        "INCARNATION",
    ]);
    for n in v["nodes"].as_array().into_iter().flatten() {
        nodes.row(vec![
            table::cell(&n["node_id"]),
            if n["live"] == Value::Bool(true) {
                "yes"
            } else {
                "no"
            }
            .to_string(),
            table::cell(&n["shards_owned"]),
            table::cell(&n["heartbeat_at"]),
            table::cell(&n["clock_offset_ms"]),
            table::cell(&n["advertise"]),
            table::cell(&n["incarnation"]),
        ]);
    }
    out!("{}", nodes.render());
    let mut shards = Table::new(&["SHARD", "EPOCH", "OWNER", "LEASE EXPIRES"]);
    for s in v["leases"].as_array().into_iter().flatten() {
        let owner = if s["free"] == Value::Bool(true) {
            "(free)".to_string()
        } else {
            table::cell(&s["owner_node"])
        };
        shards.row(vec![
            table::cell(&s["shard"]),
            table::cell(&s["epoch"]),
            owner,
            table::cell(&s["lease_expires"]),
        ]);
    }
    out!("{}", shards.render());
    Ok(())
}

//! `herald failures ...` and `herald channels`.

use crate::cli::output::{out, outln};
use chrono::Utc;
use serde_json::Value;

use super::client::{enc, CliError, Client};
use super::table::{self, Table};
use super::{print_json, FailuresCmd};

#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
pub async fn run(c: &Client, json: bool, cmd: FailuresCmd) -> Result<(), CliError> {
    match cmd {
        FailuresCmd::List { task, limit, after } => {
            let mut q = vec![format!("limit={limit}")];
            if let Some(t) = &task {
                q.push(format!("task={}", enc(t)));
            }
            if let Some(a) = after {
                q.push(format!("after={}", enc(&a)));
            }
            let v = c.get(&format!("/v1/failures?{}", q.join("&"))).await?;
            if json {
                print_json(&v);
                return Ok(());
            }
            let now = Utc::now();
            let mut t = Table::new(&["ID", "TO", "ATTEMPTS", "FAILED", "RETRYING", "LAST ERROR"]);
            for f in v["failures"].as_array().into_iter().flatten() {
                t.row(vec![
                    table::cell(&f["id"]),
                    table::cell(&f["to"]),
                    table::cell(&f["attempts"]),
                    table::when(&f["failed_at"], now),
                    table::cell(&f["retrying"]),
                    table::cell(&f["last_error"]),
                ]);
            }
            if t.is_empty() {
                outln!("no failures");
            } else {
                out!("{}", t.render());
            }
            if let Some(next) = v["next"].as_str() {
                let filters = super::output::hint_flag("task", task.as_deref());
                outln!("more: herald failures list{filters} --after {next}");
            }
            Ok(())
        }
        FailuresCmd::Retry { id } => {
            let v = c.post(&format!("/v1/failures/{}/retry", enc(&id))).await?;
            if json {
                print_json(&v);
            } else {
                outln!(
                    "retrying {} (to {})",
                    table::cell(&v["id"]),
                    table::cell(&v["to"])
                );
            }
            Ok(())
        }
        FailuresCmd::Dismiss { id } => {
            let v = c.delete(&format!("/v1/failures/{}", enc(&id))).await?;
            if json {
                print_json(&v);
            } else {
                outln!("dismissed {}", table::cell(&v["id"]));
            }
            Ok(())
        }
    }
}

#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
pub async fn channels(c: &Client, json: bool) -> Result<(), CliError> {
    let v = c.get("/v1/channels").await?;
    if json {
        print_json(&v);
        return Ok(());
    }
    let mut t = Table::new(&[
        "NAME",
        "KIND",
        "BREAKER",
        "SUCCESS",
        "RATE LIMIT",
        "IN FLIGHT",
        "SENT",
        "FAILED",
        "HELD",
    ]);
    for ch in v["channels"].as_array().into_iter().flatten() {
        let n = |k: &str| ch[k].as_u64().unwrap_or(0);
        let (breaker, ratio) = match &ch["breaker"] {
            Value::Null => ("-".to_string(), "-".to_string()),
            b => (
                table::cell(&b["state"]),
                b["success_ratio"]
                    .as_f64()
                    .map(|r| format!("{:.0}%", r * 100.0))
                    .unwrap_or_else(|| "-".into()),
            ),
        };
        t.row(vec![
            table::cell(&ch["name"]),
            table::cell(&ch["kind"]),
            breaker,
            ratio,
            table::cell(&ch["rate"]["limit"]),
            format!("{}/{}", n("in_flight"), n("concurrency")),
            n("sent").to_string(),
            (n("retryable_failures") + n("permanent_failures")).to_string(),
            n("held").to_string(),
        ]);
    }
    out!("{}", t.render());
    Ok(())
}

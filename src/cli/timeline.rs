//! `herald tasks timeline ID`: a task's timeline (API.md "Trace and timeline"), oldest first,
//! one line per event: its seq, when, what, which run/message/attempt, and the detail in words
//! (`--json`: the API's page as it came).

use crate::cli::output::{out, outln};

use chrono::Utc;
use serde_json::Value;

use super::client::{enc, CliError, Client};
use super::print_json;
use super::table::{self, Table};

#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
pub async fn run(
    c: &Client,
    json: bool,
    id: &str,
    run: Option<u32>,
    limit: u32,
    after: Option<u64>,
) -> Result<(), CliError> {
    let mut path = format!("/v1/tasks/{}/timeline?limit={limit}", enc(id));
    if let Some(r) = run {
        path.push_str(&format!("&run={r}"));
    }
    if let Some(a) = after {
        path.push_str(&format!("&after={a}"));
    }
    let v = c.get(&path).await?;
    if json {
        print_json(&v);
        return Ok(());
    }
    let now = Utc::now();
    let mut t = Table::new(&["SEQ", "AT", "EVENT", "RUN", "MSG", "ATTEMPT", "DETAIL"]);
    for e in v["events"].as_array().into_iter().flatten() {
        t.row(vec![
            table::cell(&e["seq"]),
            table::when(&e["at"], now),
            table::cell(&e["kind"]),
            table::cell(&e["run"]),
            table::cell(&e["msg"]),
            table::cell(&e["attempt"]),
            detail(&e["detail"]),
        ]);
    }
    if t.is_empty() {
        outln!("no events");
    } else {
        out!("{}", t.render());
    }
    if let Some(next) = v["next"].as_str() {
        let run = run.map(|r| format!(" --run {r}")).unwrap_or_default();
        outln!("more: herald tasks timeline {id}{run} --after {next}");
    }
    Ok(())
}

/// `status=500 duration_ms=12 outcome=retry`: the detail's fields in their order, strings
/// without quotes; `-` for none.
fn detail(d: &Value) -> String {
    let Some(o) = d.as_object().filter(|o| !o.is_empty()) else {
        return "-".into();
    };
    o.iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={}", table::cell(&Value::String(s.clone()))),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn details_read_as_key_value_pairs() {
        assert_eq!(detail(&json!({})), "-");
        assert_eq!(detail(&Value::Null), "-");
        assert_eq!(
            detail(&json!({"status": 429, "outcome": "retry", "platform_code": null})),
            "outcome=retry status=429"
        );
    }
}

//! `herald tasks ...`: list, show, create, control, runs (watch is in `watch.rs`).

use std::io::Read;

use chrono::Utc;
use hyper::Method;
use serde_json::Value;

use super::client::{enc, CliError, Client};
use super::table::{self, Table};
use super::{print_json, TasksCmd};

pub async fn run(c: &Client, json: bool, cmd: TasksCmd) -> Result<(), CliError> {
    match cmd {
        TasksCmd::List {
            state,
            channel,
            limit,
            after,
        } => {
            let mut q = vec![format!("limit={limit}")];
            if let Some(s) = state {
                q.push(format!("state={}", enc(&s)));
            }
            if let Some(ch) = channel {
                q.push(format!("channel={}", enc(&ch)));
            }
            if let Some(a) = after {
                q.push(format!("after={}", enc(&a)));
            }
            let v = c.get(&format!("/v1/tasks?{}", q.join("&"))).await?;
            if json {
                print_json(&v);
            } else {
                print_list(&v);
            }
            Ok(())
        }
        TasksCmd::Show { id } => {
            let v = c.get(&format!("/v1/tasks/{}", enc(&id))).await?;
            if json {
                print_json(&v);
            } else {
                print!("{}", show(&v));
            }
            Ok(())
        }
        TasksCmd::Watch { id } => super::watch::watch(c, json, &id).await,
        TasksCmd::Create {
            file,
            idempotency_key,
        } => {
            let body = read_input(&file)?;
            // Refuse what is not JSON here, with the file's name; herald checks the rest.
            serde_json::from_slice::<Value>(&body)
                .map_err(|e| CliError::Local(format!("{file}: not JSON: {e}")))?;
            let headers: Vec<(&str, &str)> = idempotency_key
                .as_deref()
                .map(|k| vec![("idempotency-key", k)])
                .unwrap_or_default();
            let v = c
                .json(Method::POST, "/v1/tasks", Some(body), &headers)
                .await?;
            if json {
                print_json(&v);
            } else {
                println!(
                    "created {} ({}): {}; next fire {}",
                    table::cell(&v["id"]),
                    table::cell(&v["state"]),
                    table::cell(&v["description"]),
                    table::when(&v["next_fire_at"], Utc::now())
                );
            }
            Ok(())
        }
        TasksCmd::Cancel { id } => action(c, json, &id, "cancel").await,
        TasksCmd::Pause { id } => action(c, json, &id, "pause").await,
        TasksCmd::Resume { id } => action(c, json, &id, "resume").await,
        TasksCmd::Trigger { id } => action(c, json, &id, "trigger").await,
        TasksCmd::Runs { id, limit, after } => {
            let mut path = format!("/v1/tasks/{}/runs?limit={limit}", enc(&id));
            if let Some(a) = after {
                path.push_str(&format!("&after={a}"));
            }
            let v = c.get(&path).await?;
            if json {
                print_json(&v);
            } else {
                print_runs(&v);
                if let Some(next) = v["next"].as_str() {
                    println!("more: herald tasks runs {id} --after {next}");
                }
            }
            Ok(())
        }
        TasksCmd::Delete { id } => {
            // DELETE of an unfinished task cancels it (the API's first meaning); this command
            // only deletes, so it looks first.
            let path = format!("/v1/tasks/{}", enc(&id));
            let state = c.get(&path).await?["state"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if !matches!(state.as_str(), "completed" | "cancelled" | "failed") {
                return Err(CliError::Local(format!(
                    "task {id} is {state}: only a finished task can be deleted; cancel it first (herald tasks cancel {id})"
                )));
            }
            let v = c.delete(&path).await?;
            if json {
                print_json(&v);
            } else {
                println!(
                    "deleted {} ({})",
                    table::cell(&v["id"]),
                    table::cell(&v["state"])
                );
            }
            Ok(())
        }
    }
}

fn read_input(file: &str) -> Result<Vec<u8>, CliError> {
    let mut buf = Vec::new();
    if file == "-" {
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|e| CliError::Local(format!("reading standard input: {e}")))?;
    } else {
        buf = std::fs::read(file).map_err(|e| CliError::Local(format!("{file}: {e}")))?;
    }
    Ok(buf)
}

async fn action(c: &Client, json: bool, id: &str, what: &str) -> Result<(), CliError> {
    let v = c.post(&format!("/v1/tasks/{}/{what}", enc(id))).await?;
    if json {
        print_json(&v);
    } else {
        let done = match what {
            "cancel" => "cancelled",
            "pause" => "paused",
            "resume" => "resumed",
            _ => "triggered",
        };
        println!(
            "{done} {}: state {}, next fire {}",
            table::cell(&v["id"]),
            table::cell(&v["state"]),
            table::when(&v["next_fire_at"], Utc::now())
        );
    }
    Ok(())
}

fn print_list(v: &Value) {
    let now = Utc::now();
    let mut t = Table::new(&["ID", "STATE", "SCHEDULE", "NEXT FIRE", "PROGRESS"]);
    for task in v["tasks"].as_array().into_iter().flatten() {
        t.row(vec![
            table::cell(&task["id"]),
            table::cell(&task["state"]),
            table::cell(&task["description"]),
            table::when(&task["next_fire_at"], now),
            table::progress(&task["progress"]),
        ]);
    }
    if t.is_empty() {
        println!("no tasks");
    } else {
        print!("{}", t.render());
    }
    if let Some(next) = v["next"].as_str() {
        println!("more: herald tasks list --after {next}");
    }
}

/// The detail view of one task.
pub fn show(v: &Value) -> String {
    let now = Utc::now();
    let mut out = String::new();
    let mut line = |k: &str, val: String| out.push_str(&format!("{k:<11} {val}\n"));
    line("id:", table::cell(&v["id"]));
    if !v["name"].is_null() {
        line("name:", table::cell(&v["name"]));
    }
    line("state:", table::cell(&v["state"]));
    line("channel:", table::cell(&v["channel"]));
    line("schedule:", table::cell(&v["description"]));
    line("next fire:", table::when(&v["next_fire_at"], now));
    line("messages:", table::cell(&v["messages"]));
    line("runs:", table::cell(&v["runs"]));
    let p = &v["progress"];
    if !p.is_null() {
        let n = |k: &str| p[k].as_u64().unwrap_or(0);
        line(
            "progress:",
            format!(
                "{} run {}: {} sent, {} failed, {} in flight of {}; eta {}",
                table::bar(n("sent") + n("failed"), n("total"), 20),
                n("run"),
                n("sent"),
                n("failed"),
                n("in_flight"),
                n("total"),
                table::when(&p["eta"], now)
            ),
        );
    }
    line("pacing:", v["pacing"].to_string());
    line("retry:", v["retry"].to_string());
    line("created:", table::when(&v["created_at"], now));
    line("updated:", table::when(&v["updated_at"], now));
    out
}

fn print_runs(v: &Value) {
    let now = Utc::now();
    let mut t = Table::new(&[
        "RUN",
        "STATE",
        "SCHEDULED",
        "SENT",
        "FAILED",
        "TOTAL",
        "FINISHED",
        "REASON",
    ]);
    for r in v["runs"].as_array().into_iter().flatten() {
        t.row(vec![
            table::cell(&r["run"]),
            table::cell(&r["state"]),
            table::when(&r["scheduled_at"], now),
            table::cell(&r["sent"]),
            table::cell(&r["failed"]),
            table::cell(&r["total"]),
            table::when(&r["finished_at"], now),
            table::cell(&r["reason"]),
        ]);
    }
    if t.is_empty() {
        println!("no runs yet");
    } else {
        print!("{}", t.render());
    }
}

//! `herald tasks ...`: list, show, create, control, runs (watch is in `watch.rs`).

use crate::cli::output::{hint_flag, out, outln};
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
        } => list(c, json, state, channel, limit, after).await,
        TasksCmd::Show { id } => show_one(c, json, id).await,
        TasksCmd::Watch { id } => super::watch::watch(c, json, &id).await,
        TasksCmd::Create {
            file,
            idempotency_key,
        } => create(c, json, file, idempotency_key).await,
        TasksCmd::Reschedule { id, at, tz, force } => {
            if !force {
                one_shot_only(c, &id).await?;
            }
            reschedule(c, json, id, at, tz).await
        }
        TasksCmd::Backfill { id, from, to } => backfill(c, json, id, from, to).await,
        TasksCmd::Cancel { id } => action(c, json, &id, "cancel").await,
        TasksCmd::Pause { id } => action(c, json, &id, "pause").await,
        TasksCmd::Resume { id } => action(c, json, &id, "resume").await,
        TasksCmd::Trigger { id } => action(c, json, &id, "trigger").await,
        TasksCmd::Runs { id, limit, after } => runs(c, json, id, limit, after).await,
        TasksCmd::Timeline {
            id,
            run,
            limit,
            after,
        } => super::timeline::run(c, json, &id, run, limit, after).await,
        TasksCmd::Delete { id } => delete(c, json, id).await,
    }
}

/// `herald tasks list`.
async fn list(
    c: &Client,
    json: bool,
    state: Option<String>,
    channel: Option<String>,
    limit: u32,
    after: Option<String>,
) -> Result<(), CliError> {
    let mut q = vec![format!("limit={limit}")];
    if let Some(s) = &state {
        q.push(format!("state={}", enc(s)));
    }
    if let Some(ch) = &channel {
        q.push(format!("channel={}", enc(ch)));
    }
    if let Some(a) = after {
        q.push(format!("after={}", enc(&a)));
    }
    let v = c.get(&format!("/v1/tasks?{}", q.join("&"))).await?;
    if json {
        print_json(&v);
    } else {
        let filters = format!(
            "{}{}",
            hint_flag("state", state.as_deref()),
            hint_flag("channel", channel.as_deref())
        );
        print_list(&v, &filters);
    }
    Ok(())
}

/// `herald tasks show`.
async fn show_one(c: &Client, json: bool, id: String) -> Result<(), CliError> {
    let v = c.get(&format!("/v1/tasks/{}", enc(&id))).await?;
    if json {
        print_json(&v);
    } else {
        out!("{}", show(&v));
    }
    Ok(())
}

/// `herald tasks create`.
#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
async fn create(
    c: &Client,
    json: bool,
    file: String,
    idempotency_key: Option<String>,
) -> Result<(), CliError> {
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
        outln!(
            "created {} ({}): {}; next fire {}",
            table::cell(&v["id"]),
            table::cell(&v["state"]),
            table::cell(&v["description"]),
            table::when(&v["next_fire_at"], Utc::now())
        );
    }
    Ok(())
}

/// `herald tasks reschedule` without `--force`: the task is read first, and a schedule that is
/// not a one-shot (`at`, `after`) is refused, since the PATCH replaces the whole schedule with
/// an `at` and would turn a cron or reminders task into a single fire without a word.
async fn one_shot_only(c: &Client, id: &str) -> Result<(), CliError> {
    let v = c.get(&format!("/v1/tasks/{}", enc(id))).await?;
    let schedule = v.get("schedule");
    let kind = ["at", "after", "cron", "reminders"]
        .into_iter()
        .find(|k| schedule.and_then(|s| s.get(*k)).is_some());
    match kind {
        Some("at" | "after") => Ok(()),
        other => Err(CliError::Local(format!(
            "task {id} has a {} schedule, not a one-shot: reschedule would replace it with a single fire at --at; give --force to do that",
            other.unwrap_or("different")
        ))),
    }
}

/// `herald tasks reschedule`.
#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
async fn reschedule(
    c: &Client,
    json: bool,
    id: String,
    at: String,
    tz: Option<String>,
) -> Result<(), CliError> {
    let schedule = match tz {
        Some(tz) => serde_json::json!({ "at": at, "tz": tz }),
        None => serde_json::json!({ "at": at }),
    };
    let body = serde_json::to_vec(&serde_json::json!({ "schedule": schedule }))
        .map_err(|e| CliError::Local(format!("encoding the request: {e}")))?;
    let v = c
        .json(
            Method::PATCH,
            &format!("/v1/tasks/{}", enc(&id)),
            Some(body),
            &[],
        )
        .await?;
    if json {
        print_json(&v);
    } else {
        outln!(
            "rescheduled {}: state {}, next fire {}",
            table::cell(&v["id"]),
            table::cell(&v["state"]),
            table::when(&v["next_fire_at"], Utc::now())
        );
    }
    Ok(())
}

/// `herald tasks backfill`.
#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
async fn backfill(
    c: &Client,
    json: bool,
    id: String,
    from: String,
    to: String,
) -> Result<(), CliError> {
    let body = serde_json::to_vec(&serde_json::json!({ "from": from, "to": to }))
        .map_err(|e| CliError::Local(format!("encoding the request: {e}")))?;
    let v = c
        .json(
            Method::POST,
            &format!("/v1/tasks/{}/backfill", enc(&id)),
            Some(body),
            &[],
        )
        .await?;
    if json {
        print_json(&v);
    } else {
        let runs: Vec<String> = v["runs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(table::cell)
            .collect();
        if runs.is_empty() {
            outln!("nothing to backfill: every slot of the range has a completed run");
        } else {
            outln!("backfilling {id}: runs {}", runs.join(", "));
        }
    }
    Ok(())
}

/// `herald tasks runs`.
#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
async fn runs(
    c: &Client,
    json: bool,
    id: String,
    limit: u32,
    after: Option<u32>,
) -> Result<(), CliError> {
    let mut path = format!("/v1/tasks/{}/runs?limit={limit}", enc(&id));
    if let Some(a) = after {
        path.push_str(&format!("&after={a}"));
    }
    let v = c.get(&path).await?;
    if json {
        print_json(&v);
    } else {
        // A run's record says `running` while its task is paused (the run is not over:
        // resume continues it at its cursor); show the run as it is.
        let has_running = v["runs"]
            .as_array()
            .is_some_and(|rs| rs.iter().any(|r| r["state"] == "running"));
        let paused =
            has_running && c.get(&format!("/v1/tasks/{}", enc(&id))).await?["state"] == "paused";
        print_runs(&v, paused);
        if let Some(next) = v["next"].as_str() {
            outln!("more: herald tasks runs {id} --after {next}");
        }
    }
    Ok(())
}

/// `herald tasks delete`.
#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
async fn delete(c: &Client, json: bool, id: String) -> Result<(), CliError> {
    // The API's DELETE: an unfinished task is cancelled (and stays readable), a
    // finished one is deleted. The state is read first only to say which happened.
    let path = format!("/v1/tasks/{}", enc(&id));
    let before = c.get(&path).await?["state"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let v = c.delete(&path).await?;
    // The answer decides: a task that finished between the look and the DELETE was deleted,
    // and is answered in its finished state (not `cancelled`).
    let after = v["state"].as_str().unwrap_or("");
    if json {
        print_json(&v);
    } else if finished(&before) || (finished(after) && after != "cancelled") {
        outln!("deleted {} (it was {before})", table::cell(&v["id"]));
    } else {
        outln!(
            "cancelled {} (it was {before}; it stays readable; delete it again to remove it)",
            table::cell(&v["id"])
        );
    }
    Ok(())
}

/// A state no run follows (the API's DELETE deletes such a task instead of cancelling it).
fn finished(state: &str) -> bool {
    matches!(state, "completed" | "cancelled" | "failed" | "expired")
}

/// A run's state for people: `running` reads `paused` while its task is paused.
fn run_state(state: &Value, task_paused: bool) -> String {
    if task_paused && state == "running" {
        "paused".into()
    } else {
        table::cell(state)
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

#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
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
        outln!(
            "{done} {}: state {}, next fire {}",
            table::cell(&v["id"]),
            table::cell(&v["state"]),
            table::when(&v["next_fire_at"], Utc::now())
        );
    }
    Ok(())
}

/// `filters`: the list's own flags, repeated in the "more:" hint.
fn print_list(v: &Value, filters: &str) {
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
        outln!("no tasks");
    } else {
        out!("{}", t.render());
    }
    if let Some(next) = v["next"].as_str() {
        outln!("more: herald tasks list{filters} --after {next}");
    }
}

/// The detail view of one task.
#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
pub fn show(v: &Value) -> String {
    let now = Utc::now();
    let mut out = String::new();
    let mut line = |k: &str, val: String| out.push_str(&format!("{k:<11} {val}\n"));
    line("id:", table::cell(&v["id"]));
    if !v["name"].is_null() {
        line("name:", table::cell(&v["name"]));
    }
    line("state:", table::cell(&v["state"]));
    if v["state"] == "expired" {
        // What the seed asks a person be told: it was not sent, and it can be set again.
        line(
            "",
            format!(
                "nothing was sent: every fire was missed by more than its misfire_grace; set a new time with `herald tasks reschedule {} --at TIME`, or send it now with `herald tasks trigger {}`",
                table::cell(&v["id"]),
                table::cell(&v["id"])
            ),
        );
    }
    line("channel:", table::cell(&v["channel"]));
    line("schedule:", table::cell(&v["description"]));
    line("next fire:", table::when(&v["next_fire_at"], now));
    // The schedule's own zone, when it has one: "09:00 in Shanghai" is what was asked for.
    let sched = &v["schedule"];
    let tz = sched["tz"].as_str().or(sched["reminders"]["tz"].as_str());
    if let (Some(tz), Some(t)) = (tz, v["next_fire_at"].as_str().and_then(table::parse)) {
        if let Some(there) = table::in_zone(t, tz) {
            line("", format!("{there} in {tz}"));
        }
    }
    line("messages:", table::cell(&v["messages"]));
    line("runs:", table::cell(&v["runs"]));
    let p = &v["progress"];
    if !p.is_null() {
        let n = |k: &str| p[k].as_u64().unwrap_or(0);
        line(
            "progress:",
            format!(
                "{} run {}{}: {} sent, {} failed, {} in flight of {}; eta {}",
                table::bar(n("sent") + n("failed"), n("total"), 20),
                n("run"),
                if v["state"] == "paused" {
                    " (paused)"
                } else {
                    ""
                },
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

/// `paused`: the task is paused, so a run recorded `running` is shown as `paused`.
fn print_runs(v: &Value, paused: bool) {
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
            run_state(&r["state"], paused),
            table::when(&r["scheduled_at"], now),
            table::cell(&r["sent"]),
            table::cell(&r["failed"]),
            table::cell(&r["total"]),
            table::when(&r["finished_at"], now),
            table::cell(&r["reason"]),
        ]);
    }
    if t.is_empty() {
        outln!("no runs yet");
    } else {
        out!("{}", t.render());
    }
}

//! `herald next "CRON" [--tz ZONE] [-n 5]` and `herald next --at INSTANT [--tz ZONE]`: the next
//! fires of a schedule, offline, from the same code the server uses (validation included, so a
//! schedule `herald next` accepts is one a task creation accepts).

use crate::cli::output::{out, outln};
use chrono::TimeZone;
use clap::Args;
use serde_json::json;

use super::client::CliError;
use super::print_json;
use super::table::{self, Table};
use crate::model::Limits;
use crate::request::{DstRequest, ScheduleRequest};
use crate::schedule::parse_instant;
use crate::schedule::preview::{preview, PreviewRequest};

#[derive(Args, Debug)]
pub struct NextArgs {
    /// A cron expression: 5 fields (minute hour day-of-month month day-of-week) or 6 (leading
    /// seconds).
    #[arg(required_unless_present = "at", conflicts_with = "at")]
    pub cron: Option<String>,
    /// A one-shot instant instead: RFC 3339, or a local time like 2026-12-01T09:00 with --tz.
    #[arg(long)]
    pub at: Option<String>,
    /// IANA time zone the schedule is read in (default UTC).
    #[arg(long)]
    pub tz: Option<String>,
    /// How many fires to show (1-100).
    #[arg(short = 'n', long = "count", default_value_t = 5)]
    pub n: u32,
    /// A local time that does not exist (spring forward): shift (default) or skip.
    #[arg(long)]
    pub gap: Option<String>,
    /// A local time that exists twice (fall back): first (default), last or both.
    #[arg(long)]
    pub repeat: Option<String>,
    /// Compute from this instant instead of now (RFC 3339).
    #[arg(long)]
    pub from: Option<String>,
    /// Print JSON (the shape of `POST /v1/schedules/preview`).
    #[arg(long)]
    pub json: bool,
    /// Language of the description: en or zh (default: the locale, LC_ALL / LC_MESSAGES /
    /// LANG; English when it is neither).
    #[arg(long)]
    pub lang: Option<String>,
}

/// A preview's error naming the flag the user typed rather than the API's field path.
fn flag_error(e: crate::request::FieldError) -> CliError {
    let flag = match e.field.as_str() {
        "schedule.cron" => "CRON",
        "schedule.at" => "--at",
        "schedule.tz" => "--tz",
        "schedule.dst.gap" => "--gap",
        "schedule.dst.repeat" => "--repeat",
        "n" => "-n",
        f => f,
    };
    CliError::Local(format!("{flag}: {}", e.detail))
}

pub fn run(a: NextArgs) -> Result<(), CliError> {
    let lang = super::lang::from_env(a.lang.as_deref())?.unwrap_or_default();
    let now_ms = match &a.from {
        Some(f) => *parse_instant(f, None, Default::default())
            .map_err(|e| CliError::Local(format!("--from: {e}")))?
            .first()
            .ok_or_else(|| CliError::Local("--from: not an instant".into()))?,
        None => chrono::Utc::now().timestamp_millis().max(0) as u64,
    };
    let dst = (a.gap.is_some() || a.repeat.is_some()).then(|| DstRequest {
        gap: a.gap.clone(),
        repeat: a.repeat.clone(),
    });
    let schedule = ScheduleRequest {
        at: a.at.clone(),
        cron: a.cron.clone(),
        tz: a.tz.clone(),
        dst,
        ..Default::default()
    };
    let req = PreviewRequest {
        schedule,
        dst: None,
        n: Some(a.n),
    };
    let p = preview(req, now_ms, &Limits::default()).map_err(flag_error)?;
    if a.json {
        let fires: Vec<_> = p
            .fires
            .iter()
            .map(|&ms| json!({ "at": p.utc(ms), "local": p.local(ms), "human": p.human(ms, lang) }))
            .collect();
        print_json(
            &json!({ "description": p.description_in(lang), "tz": p.tz.name(), "fires": fires }),
        );
        return Ok(());
    }
    outln!("{}", p.description_in(lang));
    let from = chrono::DateTime::from_timestamp_millis(now_ms as i64).unwrap_or_default();
    let zone = p.tz.name().to_string();
    let mut t = Table::new(&["#", "UTC", zone.as_str(), "YOUR TIME", "FROM NOW"]);
    for (i, &ms) in p.fires.iter().enumerate() {
        let utc = chrono::DateTime::from_timestamp_millis(ms as i64).unwrap_or_default();
        let local = match p.tz.timestamp_millis_opt(ms as i64) {
            chrono::LocalResult::Single(l) => l.format("%Y-%m-%d %H:%M:%S %Z (%:z)").to_string(),
            _ => p.local(ms),
        };
        t.row(vec![
            (i + 1).to_string(),
            p.utc(ms),
            local,
            table::local(utc),
            table::relative(utc, from),
        ]);
    }
    if t.is_empty() {
        outln!("no fires within the horizon");
    } else {
        out!("{}", t.render());
    }
    Ok(())
}

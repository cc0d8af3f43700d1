//! `herald tasks watch ID`: one live progress bar per running run of a task (sent + failed of
//! total, rate, ETA), from `GET /v1/events?task=ID`, until the run finishes.
//!
//! The stream is opened first and the task read once it is live (the `ready` event), so no
//! change falls between the two. A `resync` (this client fell behind) re-reads the task. With
//! `--json` every event is printed as one JSON line `{"event": ..., "data": ...}` instead.
//!
//! It ends (exit 0) when the run it watched finishes and no other run of the task is active, or
//! at once when the task is already finished; a task waiting for its next fire is waited for.
//!
//! Events are node-local: in cluster mode a node that does not own the task publishes none of
//! its changes, only `ready` and keep-alives. So when no event has come for [`REFRESH_EVERY`]
//! the task is read again and taken as a snapshot, as after a `resync`: a watch through any
//! node follows the task (in steps of that period) and ends with it.

use crate::cli::output::{out, outln};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

use super::client::{enc, CliError, Client};
use super::table;

/// No byte for this long (herald sends a keep-alive every 15 s) means the stream is dead.
const IDLE_MAX: Duration = Duration::from_secs(45);

/// No event of the task for this long: read the task again (events are node-local, see the
/// top of this file).
const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// Test knob, not configuration: [`REFRESH_EVERY`] in milliseconds (`tests/cli.rs`).
pub const REFRESH_ENV: &str = "HERALD_TEST_WATCH_REFRESH_MS";

/// Server-sent events cut out of the bytes as they come, whatever frames they come in.
///
/// The bytes are kept as bytes until an event's blank line has come: a frame may end inside a
/// multi-byte UTF-8 character (a task named `每日提醒`), and decoding each frame by itself would
/// turn both halves into U+FFFD. A `\n` byte never occurs inside a multi-byte character, so a
/// block cut at `\n\n` holds whole characters only.
///
/// The bytes of an event still coming are bounded ([`EVENT_BYTES_MAX`]: herald's events are
/// small, a stream without a blank line is not herald's), and each byte is searched for the
/// blank line once, not again with every frame that adds to the event.
#[derive(Default)]
struct SseDecoder {
    buf: Vec<u8>,
    /// How far `buf` has been searched for `\n\n` without finding one.
    scanned: usize,
}

/// The longest event the watch takes.
const EVENT_BYTES_MAX: usize = 4 << 20;

impl SseDecoder {
    /// Adds the bytes of one frame.
    fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Where the next `\n\n` starts, searching only what was not searched before (from one
    /// byte back: a pair may straddle two frames).
    fn blank_line(&mut self) -> Option<usize> {
        let from = self.scanned.saturating_sub(1);
        let found = self
            .buf
            .get(from..)
            .and_then(|rest| rest.windows(2).position(|w| w == b"\n\n"))
            .map(|i| from + i);
        self.scanned = if found.is_some() { 0 } else { self.buf.len() };
        found
    }

    /// The next complete event as (name, data), or `None` until more bytes have come; an
    /// error once an event's bytes pass [`EVENT_BYTES_MAX`].
    fn next_event(&mut self) -> Result<Option<(String, String)>, String> {
        while let Some(end) = self.blank_line() {
            let block: Vec<u8> = self.buf.drain(..end + 2).collect();
            // Whole characters by construction; only bytes herald never sends are replaced.
            let block = String::from_utf8_lossy(&block);
            let mut name = String::from("message");
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
                }
            }
            if !data.is_empty() {
                return Ok(Some((name, data.join("\n"))));
            }
            // a comment (keep-alive) or a `retry:` line: on to the next block
        }
        if self.buf.len() > EVENT_BYTES_MAX {
            return Err(format!(
                "an event larger than {} MiB",
                EVENT_BYTES_MAX >> 20
            ));
        }
        Ok(None)
    }
}

/// Server-sent events read off a response body.
struct Sse {
    body: Incoming,
    decoder: SseDecoder,
    /// When the last frame came: [`IDLE_MAX`] counts from it, not from each call of
    /// [`Sse::next`], which the watch cuts short every [`REFRESH_EVERY`].
    last_frame: tokio::time::Instant,
}

impl Sse {
    fn new(body: Incoming) -> Sse {
        Sse {
            body,
            decoder: SseDecoder::default(),
            last_frame: tokio::time::Instant::now(),
        }
    }

    /// The next event as (name, data), or `None` when the stream ended. Cancel-safe: a frame
    /// is either not taken from the body yet or already in the decoder.
    async fn next(&mut self) -> Result<Option<(String, String)>, String> {
        loop {
            if let Some(event) = self.decoder.next_event()? {
                return Ok(Some(event));
            }
            let idle_end = self.last_frame + IDLE_MAX;
            let frame = match tokio::time::timeout_at(idle_end, self.body.frame()).await {
                Err(_) => return Err(format!("no data for {}s", IDLE_MAX.as_secs())),
                Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => return Err(e.to_string()),
                Ok(Some(Ok(f))) => f,
            };
            self.last_frame = tokio::time::Instant::now();
            if let Ok(data) = frame.into_data() {
                self.decoder.push(&data);
            }
        }
    }
}

/// [`REFRESH_EVERY`], or the test knob [`REFRESH_ENV`].
fn refresh_every() -> Duration {
    std::env::var(REFRESH_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(REFRESH_EVERY, Duration::from_millis)
}

fn finished(state: &str) -> bool {
    matches!(state, "completed" | "cancelled" | "failed" | "expired")
}

struct Bars {
    json: bool,
    multi: MultiProgress,
    /// Running runs and their bars.
    bars: BTreeMap<u64, ProgressBar>,
    /// Runs seen running since the watch began.
    watched: usize,
    tty: bool,
}

impl Bars {
    fn new(json: bool) -> Bars {
        let tty = std::io::stderr().is_terminal() && !json;
        let target = if tty {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Bars {
            json,
            multi: MultiProgress::with_draw_target(target),
            bars: BTreeMap::new(),
            watched: 0,
            tty,
        }
    }

    /// Applies one run's progress (from an event or a task view).
    fn update(&mut self, task: &str, p: &Value) {
        let n = |k: &str| p[k].as_u64().unwrap_or(0);
        let run = n("run");
        let total = n("total");
        let done = n("sent") + n("failed");
        let state = p["state"].as_str().unwrap_or("running");
        let mut msg = format!("sent {} · failed {}", n("sent"), n("failed"));
        // The run stays `running` while its task is paused (resume continues it): say paused.
        if p["task_state"] == "paused" {
            msg.push_str(" · paused");
        }
        if state == "running" {
            let bar = self.bars.entry(run).or_insert_with(|| {
                self.watched += 1;
                let b = self.multi.add(ProgressBar::new(total));
                b.set_style(
                    ProgressStyle::with_template(
                        "{prefix} [{bar:32.green/red}] {pos}/{len} {msg} · {rate} · eta {eta}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .with_key(
                        "rate",
                        |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                            let _ = write!(w, "{:.1}/s", s.per_sec());
                        },
                    )
                    .progress_chars("=> "),
                );
                b.set_prefix(format!("{task} run {run}"));
                if !self.tty && !self.json {
                    outln!("{task} run {run}: started, {total} messages");
                }
                b
            });
            bar.set_length(total);
            bar.set_position(done);
            bar.set_message(msg);
        } else if let Some(bar) = self.bars.remove(&run) {
            bar.set_position(done);
            bar.finish_with_message(format!("{msg} · {state}"));
            if !self.json {
                outln!(
                    "{task} run {run}: {state}, {} sent, {} failed of {total}",
                    n("sent"),
                    n("failed")
                );
            }
        }
    }
}

/// A snapshot's progress for its bar: `running`, or `stopped` when the task's run is not.
#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
fn snapshot_progress(t: &Value, state: &str) -> Value {
    let mut p = t["progress"].clone();
    if let Some(o) = p.as_object_mut() {
        let shown = if state == "running" {
            "running"
        } else {
            "stopped"
        };
        o.insert("state".into(), json!(shown));
    }
    p
}

/// What the watch took from the task's view (`ready`, `resync`, or a refresh).
enum Snapshot {
    /// The task is finished and no bar was open: it was shown, the watch is over.
    Shown,
    /// The task's state, for the end conditions.
    State(String),
}

/// Reads the task and applies it to the bars. `why` is the event that asked for it, or
/// `"refresh"` (no event for a while): a refresh prints its snapshot with `--json` only when
/// the view changed since the last one printed (`last`).
#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
async fn snapshot(
    c: &Client,
    id: &str,
    why: &str,
    bars: &mut Bars,
    last: &mut Value,
) -> Result<Snapshot, CliError> {
    let t = c.get(&format!("/v1/tasks/{}", enc(id))).await?;
    let state = t["state"].as_str().unwrap_or("").to_string();
    if bars.json && (why != "refresh" || t != *last) {
        outln!("{}", json!({ "event": "snapshot", "data": t }));
    }
    if finished(&state) && bars.bars.is_empty() {
        if !bars.json {
            out!("{}", super::tasks::show(&t));
        }
        return Ok(Snapshot::Shown);
    }
    if !t["progress"].is_null() && (state == "running" || !bars.bars.is_empty()) {
        bars.update(id, &snapshot_progress(&t, &state));
    }
    if why == "ready" && state != "running" && !bars.json {
        outln!(
            "{id} is {state}; waiting for its next run (next fire {})",
            table::when(&t["next_fire_at"], chrono::Utc::now())
        );
    }
    *last = t;
    Ok(Snapshot::State(state))
}

#[allow(
    clippy::indexing_slicing,
    reason = "reads herald's JSON answer with serde_json::Value's Index, which gives Null for a missing key and never panics"
)]
pub async fn watch(c: &Client, json: bool, id: &str) -> Result<(), CliError> {
    let body = c.stream(&format!("/v1/events?task={}", enc(id))).await?;
    let mut sse = Sse::new(body);
    let mut bars = Bars::new(json);
    let mut last = Value::Null;
    let refresh = refresh_every();
    let lost = |e: String| CliError::Unreachable {
        url: c.base().to_string(),
        reason: format!("the event stream broke: {e}"),
    };
    loop {
        // Cut short when no event came for a while: the task is read again instead.
        let (name, data) = match tokio::time::timeout(refresh, sse.next()).await {
            Err(_) => ("refresh".to_string(), String::new()),
            Ok(next) => next
                .map_err(lost)?
                .ok_or_else(|| lost("herald closed it".into()))?,
        };
        let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
        if json && name != "refresh" {
            outln!("{}", json!({ "event": name, "data": v }));
        }
        let task_state = match name.as_str() {
            "ready" | "resync" | "refresh" => {
                match snapshot(c, id, &name, &mut bars, &mut last).await? {
                    Snapshot::Shown => return Ok(()),
                    Snapshot::State(s) => s,
                }
            }
            "progress" => {
                bars.update(id, &v);
                v["task_state"].as_str().unwrap_or("").to_string()
            }
            "task" => v["state"].as_str().unwrap_or("").to_string(),
            _ => continue,
        };
        // Done: the watched run(s) finished, or the task did.
        let all_done = bars.bars.is_empty() && bars.watched > 0;
        if finished(&task_state) || (all_done && task_state != "running") {
            for (_, b) in std::mem::take(&mut bars.bars) {
                b.abandon();
            }
            if !json && finished(&task_state) {
                outln!("{id} is {task_state}");
            }
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{SseDecoder, EVENT_BYTES_MAX};

    /// A frame boundary inside a character of a Chinese task name: the event comes out whole,
    /// not with U+FFFD for the two halves.
    #[test]
    fn an_event_split_inside_a_character_decodes_whole() {
        let event = "event: task\ndata: {\"id\":\"每日提醒\",\"state\":\"running\"}\n\n";
        let bytes = event.as_bytes();
        // `每` is 3 bytes (E6 AF 8F): cut after its first byte.
        let cut = event.find('每').unwrap() + 1;
        assert!(!event.is_char_boundary(cut));
        let mut d = SseDecoder::default();
        d.push(&bytes[..cut]);
        assert_eq!(d.next_event(), Ok(None));
        d.push(&bytes[cut..]);
        assert_eq!(
            d.next_event(),
            Ok(Some((
                "task".to_string(),
                "{\"id\":\"每日提醒\",\"state\":\"running\"}".to_string()
            )))
        );
        assert_eq!(d.next_event(), Ok(None));
    }

    /// Every cut of a stream (keep-alive, two events, one of them in Chinese) gives the same
    /// events; a keep-alive gives none.
    #[test]
    fn every_cut_gives_the_same_events() {
        let stream = "retry: 2000\n\nevent: ready\ndata: {}\n\n: keep-alive\n\nevent: progress\ndata: {\"msg\":\"提醒 · 日\"}\n\n";
        let want = vec![
            ("ready".to_string(), "{}".to_string()),
            (
                "progress".to_string(),
                "{\"msg\":\"提醒 · 日\"}".to_string(),
            ),
        ];
        let bytes = stream.as_bytes();
        for a in 0..=bytes.len() {
            for b in a..=bytes.len() {
                let mut d = SseDecoder::default();
                let mut got = Vec::new();
                for part in [&bytes[..a], &bytes[a..b], &bytes[b..]] {
                    d.push(part);
                    while let Some(e) = d.next_event().unwrap() {
                        got.push(e);
                    }
                }
                assert_eq!(got, want, "cut at {a} and {b}");
            }
        }
    }

    /// An event that comes in many frames is searched once per byte (the search resumes where
    /// it stopped, a blank line split between two frames still found), and one that passes the
    /// cap without its blank line is an error, not a buffer that grows for good.
    #[test]
    fn a_long_event_is_searched_once_and_capped() {
        let mut d = SseDecoder::default();
        d.push(b"event: task\ndata: {");
        assert_eq!(d.next_event(), Ok(None));
        assert_eq!(d.scanned, d.buf.len());
        for _ in 0..100 {
            d.push(b"\"k\":1,");
            assert_eq!(d.next_event(), Ok(None));
            assert_eq!(d.scanned, d.buf.len(), "searched to the end, once");
        }
        d.push(b"\"end\":1}\n");
        assert_eq!(d.next_event(), Ok(None));
        d.push(b"\nevent: ready\ndata: {}\n\n");
        let (name, data) = d.next_event().unwrap().unwrap();
        assert_eq!(name, "task");
        assert!(
            data.starts_with("{\"k\":1,") && data.ends_with("\"end\":1}"),
            "{data}"
        );
        assert_eq!(
            d.next_event(),
            Ok(Some(("ready".to_string(), "{}".to_string())))
        );
        assert!(d.buf.is_empty());

        let mut d = SseDecoder::default();
        d.push(b"event: task\ndata: ");
        let chunk = vec![b'x'; 1 << 20];
        let mut err = None;
        for _ in 0..8 {
            d.push(&chunk);
            if let Err(e) = d.next_event() {
                err = Some(e);
                break;
            }
        }
        assert_eq!(err.as_deref(), Some("an event larger than 4 MiB"));
        assert!(d.buf.len() <= EVENT_BYTES_MAX + chunk.len());
    }
}

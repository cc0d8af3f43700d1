//! Reading export lines into an empty store (see `mod.rs` for the format). Every line is
//! checked against what came before it (a message or run belongs to the task just read,
//! messages are numbered 0, 1, ..., the `end` line's counts match), and a file without its
//! `end` line is refused: it was cut short. A task and its messages are checked by the rules
//! of a create (`request/restore.rs`, with the limits of the herald that will serve them),
//! and its progress, runs and failures against it: a file edited by hand or damaged is
//! refused naming its line and field, never stored for the engine to trip over. A line is
//! read only up to [`line_max`] bytes: a file that is no export (`/dev/zero`) is refused
//! instead of read into memory whole.
//!
//! `herald import --skip-invalid` ([`import_with`] given a `skip` report) imports a backup some
//! of whose tasks today's rules refuse (an export of an older herald: a `notify.to` over
//! today's cap, a message time zone an old PATCH stored unchecked). Skippable, and only
//! these: the rules of a create on a task line (`task.id` and `request::check_task`), on a
//! message line (`request::restored_message`), and on a task's messages as a whole
//! (`request::check_zones`: recipient time, its zones). Such a task is left out with every
//! line of it: its messages, runs and timeline (which follow it), its failure-list entries and
//! idempotency keys (found by its id, [`Held::skipped`]). Everything else still refuses the
//! whole file, flag or not: a broken file (not JSON, an unknown field, lines out of order or
//! of a task they do not follow, a failure of a task not in the file, a task's message count
//! or its runs against its fires, a run's cursor, the end line missing or its counts wrong).
//! The lines of a skipped task are still checked for their place in the file (the task they
//! follow, their order and numbering), not for their content.

use std::io::BufRead;
use std::path::Path;

use serde::Deserialize;

use super::{unhex32, BackupError, Line, FORMAT, VERSION};
use crate::model::timeline::TimelineEvent;
use crate::model::{delivery_key, Failure, Limits, Message, Run, RunState, Task};
use crate::store::{Batch, IdemRecord, Op, Store};

/// Writes per batch (the messages of one task count as one op but are bounded by the task
/// limit).
const BATCH_OPS: usize = 1_000;

/// A batch is also written once the lines read into it hold this many bytes: a store write
/// holds at most `store::commit::JOB_BYTES_MAX` (1 GiB), and 1 000 tasks of a herald with
/// raised limits can hold more (review finding: the import of a valid export was refused).
const BATCH_BYTES: usize = 64 << 20;

/// When a batch is written: at `ops` writes or `bytes` bytes of lines read into it, whichever
/// comes first. [`BATCH`] but in tests, which lower `bytes` to see it applied.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    ops: usize,
    bytes: usize,
}

const BATCH: Bounds = Bounds {
    ops: BATCH_OPS,
    bytes: BATCH_BYTES,
};

/// Room on a line for everything but a message's body and recipient: the task line's
/// metadata (64 entries of up to 1 152 bytes, escaped up to 6 times: ~440 KiB), name, zones
/// and notify, a run, a timeline event's or failure's error text. A few MiB above the largest
/// such line herald writes, so no real file comes near it.
const LINE_SLACK_BYTES: u64 = 4 << 20;

/// The longest line an export of a herald with `limits` can hold, newline not counted: a
/// message line, its body (with its data) and recipient each JSON-escaped at most 6 bytes per
/// byte (`\u001f`), plus [`LINE_SLACK_BYTES`]. 4.4 MiB with the default limits.
pub fn line_max(limits: &Limits) -> u64 {
    let message = limits
        .message_body_bytes_max
        .saturating_add(limits.recipient_bytes_max);
    u64::try_from(message)
        .unwrap_or(u64::MAX)
        .saturating_mul(6)
        .saturating_add(LINE_SLACK_BYTES)
}

/// What an import wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    /// Tasks written (the file's, less those skipped).
    pub tasks: u64,
    /// Tasks left out by `--skip-invalid`, with every line of them.
    pub skipped: u64,
    pub lines: u64,
    /// Idempotency keys of tasks the file does not hold (deleted, their keys not yet swept
    /// when the export was made), left out as the sweep would remove them.
    pub keys_left_out: u64,
}

/// Refuses a data directory that has anything in it: an import never mixes with existing data.
/// One an earlier import did not finish is named as such ([`super::marker`]).
pub fn check_empty(dir: &Path) -> Result<(), BackupError> {
    super::marker::check_complete(dir).map_err(BackupError::Refused)?;
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(BackupError::Refused(format!(
                    "the data directory {} is not empty; import only into a new or empty directory (move the old one aside first)",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BackupError::Refused(format!(
            "cannot read the data directory {}: {e}",
            dir.display()
        ))),
    }
}

/// A task `--skip-invalid` left out, with every line of it: the first rule of a create it
/// fails. Shown as `line N: task "ID" skipped: <field>: <reason>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The line the rule names: the task's line, or one of its messages' lines.
    pub line: u64,
    pub task_id: String,
    /// The field and what is wrong with it (`task.notify.to: must be at most 1024 bytes`).
    pub detail: String,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {}: task {:?} skipped: {}",
            self.line, self.task_id, self.detail
        )
    }
}

/// The task whose messages and runs are being read. Its writes are held here, not in the
/// batch, until it ends ([`Reading::finish`]): only then is it known to keep (a rule of a
/// create on its messages may skip it), and a batch written meanwhile holds none of it.
struct Current {
    id: String,
    /// The task's line, which what is checked once its messages have come names.
    line: u64,
    /// The task as read (its schedule and zones are what its messages are checked against).
    task: Box<Task>,
    message_count: u32,
    /// Its messages (none kept once it is skipped).
    messages: Vec<Message>,
    /// Its message lines read: the next is this seq.
    received: u32,
    /// Its writes but its messages, in the order read: the task, its runs, its timeline.
    ops: Vec<Op>,
    /// What `ops` counts toward the batch's op bound (a timeline event one each).
    weight: usize,
    /// Why it is left out (only with `--skip-invalid`): its lines are still read, in place.
    skip: Option<Skipped>,
    /// Its fires so far: its runs are numbered 1 to this.
    fires: u32,
    /// The number of its last run read.
    last_run: Option<u32>,
    /// The seq of its last timeline event read.
    last_seq: Option<u64>,
    /// Its `created` event as the store derives it: an exported one equal to it is not
    /// stored (`store/timeline.rs`).
    created: TimelineEvent,
}

/// Reads an export from `r` into `store` (which should be empty; see [`check_empty`]),
/// checking its tasks against the default limits.
pub async fn import(store: &Store, r: impl BufRead) -> Result<Imported, BackupError> {
    import_with(store, r, &Limits::default(), None).await
}

/// [`import`], checking each task against `limits`: those of the herald that will serve it.
/// Without `skip`, a task a rule of a create refuses refuses the file
/// ([`BackupError::Invalid`]); with it, the task is left out with every line of it and given
/// to `skip` (`herald import --skip-invalid`; which rules, the module's doc).
pub async fn import_with(
    store: &Store,
    r: impl BufRead,
    limits: &Limits,
    skip: Option<&mut dyn FnMut(&Skipped)>,
) -> Result<Imported, BackupError> {
    import_bounded(store, r, limits, skip, BATCH)
        .await
        .map(|(imported, _)| imported)
}

/// [`import_with`], writing a batch at `bounds`; also returns the number of batches written.
async fn import_bounded(
    store: &Store,
    mut r: impl BufRead,
    limits: &Limits,
    mut skip: Option<&mut dyn FnMut(&Skipped)>,
    bounds: Bounds,
) -> Result<(Imported, u64), BackupError> {
    let mut st = Reading {
        limits: limits.clone(),
        skip_invalid: skip.is_some(),
        ..Reading::default()
    };
    let mut writes = 0u64;
    let max = line_max(limits);
    let mut n = 0u64;
    let mut buf = Vec::new();
    // Bytes of the lines read since the last write: about what the batch holds (a task joins
    // it when it ends, so it may hold one task's more, and a batch the bound finds empty, the
    // current task not ended yet, waits for it).
    let mut read = 0usize;
    while next_line(&mut r, &mut buf, n + 1, max)? {
        n += 1;
        read += buf.len();
        let err = |detail: String| BackupError::Format { line: n, detail };
        let Some(line) = parse(&buf, n).map_err(err)? else {
            continue;
        };
        if st.ended {
            return Err(err("text after the end line".into()));
        }
        if n == 1 {
            header(&line).map_err(err)?;
            continue;
        }
        st.line(line, n).map_err(|r| r.error(n))?;
        if let (Some(s), Some(report)) = (st.just_skipped.take(), skip.as_mut()) {
            report(&s);
        }
        let full = st.ops >= bounds.ops || read >= bounds.bytes;
        if full && !st.batch.ops.is_empty() {
            store.write(&st.batch).await?;
            writes += 1;
            st.batch = Batch::new();
            st.ops = 0;
            read = 0;
        }
    }
    if !st.ended {
        return Err(BackupError::Format {
            line: n,
            detail: "the file ends without its end line: it was cut short".into(),
        });
    }
    store.write(&st.batch).await?;
    let imported = Imported {
        tasks: st.tasks.saturating_sub(st.skipped),
        skipped: st.skipped,
        lines: n,
        keys_left_out: st.keys_left_out,
    };
    Ok((imported, writes + 1))
}

/// Reads line `n` into `buf` (with its newline), at most `max` bytes before the newline:
/// `false` at the end of the file.
fn next_line(
    r: &mut impl BufRead,
    buf: &mut Vec<u8>,
    n: u64,
    max: u64,
) -> Result<bool, BackupError> {
    buf.clear();
    // One byte past the longest line, for its newline: a line that fills it without one is
    // longer, and is not read on.
    let read = std::io::Read::take(&mut *r, max.saturating_add(1)).read_until(b'\n', buf)?;
    if u64::try_from(read).unwrap_or(u64::MAX) > max && !buf.ends_with(b"\n") {
        return Err(BackupError::Format {
            line: n,
            detail: format!(
                "longer than {max} bytes, the longest line an export can hold with these limits \
                 (6 x (limits.message_body_bytes_max + a recipient) + 4 MiB): not an export line"
            ),
        });
    }
    Ok(read > 0)
}

/// Line `n` as read (with its newline): `None` if blank (never the first, the header). A
/// field this build does not know is refused, not dropped: a file from a newer herald would
/// otherwise lose what it set.
fn parse(raw: &[u8], n: u64) -> Result<Option<Line>, String> {
    let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
    let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
    let text = std::str::from_utf8(raw)
        .map_err(|e| format!("not UTF-8 text (at byte {})", e.valid_up_to()))?;
    if text.trim().is_empty() {
        return match n {
            1 => Err("the first line must be the header; it is blank".into()),
            _ => Ok(None),
        };
    }
    let given: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not an export line: {e}"))?;
    let line = Line::deserialize(&given).map_err(|e| format!("not an export line: {e}"))?;
    // Every field of the line types is written (none is skipped when empty), so a field of the
    // line that is not in it written back is one this build does not know.
    let known = serde_json::to_value(&line).map_err(|e| format!("not an export line: {e}"))?;
    if let Some(field) = unknown_field(&given, &known) {
        return Err(format!(
            "unknown field {field}: written by a newer herald? This build would lose it, so it \
             refuses the file; import it with that herald (or a newer one)"
        ));
    }
    Ok(Some(line))
}

/// The path of the first field of `given` that `known` lacks (`task.retry.jitter`).
fn unknown_field(given: &serde_json::Value, known: &serde_json::Value) -> Option<String> {
    let path = unknown_below(given, known)?;
    Some(path.strip_prefix('.').unwrap_or(&path).to_string())
}

/// [`unknown_field`] as a suffix: `.name` per object field, `[i]` per array element.
fn unknown_below(given: &serde_json::Value, known: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match (given, known) {
        (Value::Object(g), Value::Object(k)) => g.iter().find_map(|(name, gv)| match k.get(name) {
            None => Some(format!(".{name}")),
            Some(kv) => unknown_below(gv, kv).map(|inner| format!(".{name}{inner}")),
        }),
        (Value::Array(g), Value::Array(k)) => {
            g.iter().zip(k).enumerate().find_map(|(i, (gv, kv))| {
                unknown_below(gv, kv).map(|inner| format!("[{i}]{inner}"))
            })
        }
        _ => None,
    }
}

/// The first line: the header of a format and version this build reads.
fn header(line: &Line) -> Result<(), String> {
    match line {
        Line::Header {
            format, version, ..
        } if format == FORMAT && *version == VERSION => Ok(()),
        Line::Header {
            format, version, ..
        } => Err(format!(
            "format {format:?} version {version}; this build reads {FORMAT:?} version {VERSION}"
        )),
        _ => Err("the first line must be the header".into()),
    }
}

/// The parts of an export, in the order they come.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    #[default]
    Tasks,
    Failures,
    Idempotency,
}

/// A line refused: what is wrong, and the line to name when it is not the one being read
/// (what is checked once a task's messages have come names the task's line).
struct Refusal {
    line: Option<u64>,
    detail: String,
    /// A rule of a create that the task fails, which `--skip-invalid` would skip (the file is
    /// not broken): [`BackupError::Invalid`].
    invalid: bool,
}

impl From<String> for Refusal {
    fn from(detail: String) -> Refusal {
        Refusal {
            line: None,
            detail,
            invalid: false,
        }
    }
}

impl Refusal {
    /// A rule of a create the task fails (named at `line`, or the line being read).
    fn invalid(line: Option<u64>, detail: String) -> Refusal {
        Refusal {
            line,
            detail,
            invalid: true,
        }
    }

    /// The error of line `n`, the one being read.
    fn error(self, n: u64) -> BackupError {
        let line = self.line.unwrap_or(n);
        let detail = self.detail;
        match self.invalid {
            true => BackupError::Invalid { line, detail },
            false => BackupError::Format { line, detail },
        }
    }
}

/// A task of the file, as its failure-list entries and idempotency keys are checked against it.
struct Held {
    id: Box<str>,
    fires: u32,
    /// The most messages a run of it in the file had: its message count, or a run's total
    /// (its messages may have been changed since that run).
    messages: u32,
    /// Its first run in the file; runs before it were trimmed from its history, their totals
    /// unknown.
    first_run: Option<u32>,
    /// Left out by `--skip-invalid`: its failure-list entries and keys are dropped.
    skipped: bool,
}

/// An import under way: the batch being filled and what the order checks need.
#[derive(Default)]
struct Reading {
    batch: Batch,
    /// Writes in `batch` (it is written at [`BATCH_OPS`]).
    ops: usize,
    /// What each task is checked against.
    limits: Limits,
    current: Option<Current>,
    /// Every task read, in id order (so the last is the greatest): what the failure and
    /// idempotency lines are checked against.
    ids: Vec<Held>,
    part: Part,
    last_failure: Option<String>,
    last_key: Option<String>,
    keys_left_out: u64,
    /// Task lines read, skipped ones included (the end line counts them all).
    tasks: u64,
    /// `--skip-invalid`: a task a rule of a create refuses is skipped, not the file.
    skip_invalid: bool,
    /// Tasks skipped.
    skipped: u64,
    /// The task the last line ended and skipped, for the import to report.
    just_skipped: Option<Skipped>,
    ended: bool,
}

impl Reading {
    /// One line after the header (`n`: its number, which the end line counts).
    fn line(&mut self, line: Line, n: u64) -> Result<(), Refusal> {
        match line {
            Line::Header { .. } => Err(String::from("a second header").into()),
            Line::Task { task } => self.task(task, n),
            Line::Message {
                task_id,
                seq,
                message,
            } => self.message(task_id, seq, message, n),
            Line::Run { task_id, run } => Ok(self.run(task_id, run)?),
            Line::Timeline {
                task_id,
                seq,
                at_ms,
                event,
                run,
                msg,
                attempt,
                detail,
            } => {
                let e = TimelineEvent {
                    seq,
                    at_ms,
                    kind: event,
                    run,
                    msg,
                    attempt,
                    detail,
                };
                Ok(self.timeline(task_id, e)?)
            }
            Line::Failure { failure } => self.failure(failure),
            Line::Idempotency {
                key,
                task_id,
                body_sha256,
            } => Ok(self.idempotency(key, task_id, body_sha256)?),
            Line::End { tasks, lines } => self.end(tasks, lines, n),
        }
    }

    /// The end line: its counts must be the file's.
    fn end(&mut self, tasks: u64, lines: u64, n: u64) -> Result<(), Refusal> {
        self.finish()?;
        if tasks != self.tasks || lines != n {
            return Err(format!(
                "the end line counts {tasks} tasks in {lines} lines, the file has {} in {n}",
                self.tasks
            )
            .into());
        }
        self.ended = true;
        Ok(())
    }

    /// Ends the current task: all its messages must have come, in its zones (what is wrong
    /// names the task's line). A task kept joins the batch whole; one skipped leaves nothing
    /// but its mark in [`Reading::ids`].
    fn finish(&mut self) -> Result<(), Refusal> {
        let Some(mut c) = self.current.take() else {
            return Ok(());
        };
        let line = Some(c.line);
        if c.received != c.message_count {
            return Err(Refusal {
                line,
                detail: format!(
                    "task.message_count: task {:?} has {} messages, the export holds {}",
                    c.id, c.message_count, c.received
                ),
                invalid: false,
            });
        }
        if c.skip.is_none() {
            if let Err(e) = crate::request::check_zones(&c.task, &mut c.messages) {
                let detail = format!("task.{e}");
                if !self.skip_invalid {
                    return Err(Refusal::invalid(line, detail));
                }
                c.skip = Some(Skipped {
                    line: c.line,
                    task_id: c.id.clone(),
                    detail,
                });
            }
        }
        if let Some(s) = c.skip {
            if let Some(h) = self.ids.last_mut() {
                h.skipped = true; // the current task is the last one read
            }
            self.skipped += 1;
            self.just_skipped = Some(s);
            return Ok(());
        }
        self.ops += c.weight + c.messages.len();
        self.batch.ops.append(&mut c.ops);
        self.batch.ops.push(Op::Messages {
            task_id: c.id,
            old_count: 0,
            messages: c.messages,
        });
        Ok(())
    }

    /// Moves on to `part` (ending the last task): never back to an earlier one.
    fn enter(&mut self, part: Part, what: &str) -> Result<(), Refusal> {
        self.finish()?;
        if part < self.part {
            return Err(format!(
                "{what} after the {}: out of order",
                match self.part {
                    Part::Tasks => "tasks",
                    Part::Failures => "failure list",
                    Part::Idempotency => "idempotency keys",
                }
            )
            .into());
        }
        self.part = part;
        Ok(())
    }

    /// Task `id` if the file holds it.
    fn held(&self, id: &str) -> Option<&Held> {
        let i = self.ids.binary_search_by(|h| (*h.id).cmp(id)).ok()?;
        self.ids.get(i)
    }

    /// A run of the current task: numbered 1 to its fires, in order, each once (a repeated
    /// run would overwrite the one before it: an older cursor sends again).
    fn run(&mut self, task_id: String, run: Run) -> Result<(), String> {
        let c = self
            .current
            .as_mut()
            .filter(|c| c.id == task_id)
            .ok_or_else(|| format!("run of task {task_id:?} is not right after that task"))?;
        let n = run.run;
        if n == 0 || n > c.fires {
            return Err(format!(
                "run {n} of task {task_id:?}: the task has fired {} times (runs 1 to {0})",
                c.fires
            ));
        }
        if c.last_run.is_some_and(|l| l >= n) {
            return Err(format!(
                "run {n} of task {task_id:?} is out of order (or repeated)"
            ));
        }
        // A skipped task's runs are not checked against it: a rule refused what they would
        // be checked against.
        if c.skip.is_none() {
            check_run(&run, c.message_count, &self.limits).map_err(|e| format!("run.{e}"))?;
        }
        c.last_run = Some(n);
        if let Some(h) = self.ids.last_mut() {
            h.messages = h.messages.max(run.total);
            h.first_run.get_or_insert(n);
        }
        c.ops.push(Op::Run(task_id, run));
        c.weight += 1;
        Ok(())
    }

    /// A failure-list entry: of a task in the file and a run it had, its id the delivery's
    /// key, in id order, each once.
    fn failure(&mut self, f: Failure) -> Result<(), Refusal> {
        self.enter(Part::Failures, "a failure-list entry")?;
        let want = delivery_key(&f.task_id, f.run, f.seq);
        if f.id != want {
            return Err(
                format!("failure {:?}: its id must be {want:?} (task:run:seq)", f.id).into(),
            );
        }
        if self
            .last_failure
            .as_deref()
            .is_some_and(|l| l >= f.id.as_str())
        {
            return Err(format!("failure {:?} is out of id order (or repeated)", f.id).into());
        }
        let held = self.held(&f.task_id).ok_or_else(|| {
            format!(
                "failure {:?} is of task {:?}, which the file does not hold",
                f.id, f.task_id
            )
        })?;
        if held.skipped {
            self.last_failure = Some(f.id);
            return Ok(());
        }
        let fires = held.fires;
        if f.run == 0 || f.run > fires {
            return Err(format!(
                "failure {:?}: task {:?} has fired {fires} times (runs 1 to {fires})",
                f.id, f.task_id
            )
            .into());
        }
        // A run trimmed from the history may have had more messages than any left: bounded
        // then only by the limit.
        let messages = match held.first_run {
            Some(first) if f.run >= first => held.messages,
            _ => u32::try_from(self.limits.messages_max).unwrap_or(u32::MAX),
        };
        if f.seq >= messages {
            return Err(format!(
                "failure.seq: message {} of run {}, whose task's runs have at most {messages} messages",
                f.seq, f.run
            )
            .into());
        }
        self.last_failure = Some(f.id.clone());
        self.batch.failure(f);
        self.ops += 1;
        Ok(())
    }

    /// An idempotency key, in key order, each once. A key of a task the file does not hold is
    /// left out: its task was deleted and the key not yet swept (the sweep removes it).
    fn idempotency(&mut self, key: String, task_id: String, sha: String) -> Result<(), Refusal> {
        self.enter(Part::Idempotency, "an idempotency key")?;
        if self.last_key.as_deref().is_some_and(|l| l >= key.as_str()) {
            return Err(format!("idempotency key {key:?} is out of order (or repeated)").into());
        }
        let hash =
            unhex32(&sha).ok_or_else(|| "body_sha256: expected 64 hex digits".to_string())?;
        self.last_key = Some(key.clone());
        match self.held(&task_id) {
            None => {
                self.keys_left_out += 1;
                return Ok(());
            }
            Some(h) if h.skipped => return Ok(()),
            Some(_) => {}
        }
        self.batch.ops.push(Op::PutIdem(
            key,
            IdemRecord {
                task_id,
                body_sha256: hash,
            },
        ));
        self.ops += 1;
        Ok(())
    }

    /// A task (line `n`): in id order, after the previous task's messages, by the rules of a
    /// create (or skipped, its lines read on, with `--skip-invalid`), its runs no more than
    /// its fires.
    fn task(&mut self, task: Box<Task>, n: u64) -> Result<(), Refusal> {
        self.enter(Part::Tasks, "a task")?;
        let rules = crate::model::check_id(&task.id)
            .map_err(|e| format!("task.id: {e}"))
            .and_then(|()| {
                crate::request::check_task(&task, &self.limits).map_err(|e| format!("task.{e}"))
            })
            .err();
        if let Some(detail) = rules.as_ref().filter(|_| !self.skip_invalid) {
            return Err(Refusal::invalid(None, detail.clone()));
        }
        if self.ids.last().is_some_and(|l| *l.id >= *task.id.as_str()) {
            return Err(format!("task {:?} is out of id order (or repeated)", task.id).into());
        }
        if task.runs > task.fires {
            return Err(format!(
                "task.runs: {} runs started, more than the task's {} fires",
                task.runs, task.fires
            )
            .into());
        }
        self.ids.push(Held {
            id: task.id.as_str().into(),
            fires: task.fires,
            messages: task.message_count,
            first_run: None,
            skipped: false,
        });
        self.tasks += 1;
        self.current = Some(Current {
            id: task.id.clone(),
            line: n,
            message_count: task.message_count,
            messages: Vec::new(),
            received: 0,
            ops: vec![Op::Task(task.clone())],
            weight: 1,
            skip: rules.map(|detail| Skipped {
                line: n,
                task_id: task.id.clone(),
                detail,
            }),
            fires: task.fires,
            last_run: None,
            last_seq: None,
            created: TimelineEvent::created(&task),
            task,
        });
        Ok(())
    }

    /// A message of the current task (line `n`), in order, by the rules of a create (or its
    /// task skipped, with `--skip-invalid`).
    fn message(
        &mut self,
        task_id: String,
        seq: u32,
        message: Message,
        n: u64,
    ) -> Result<(), Refusal> {
        let c = self
            .current
            .as_mut()
            .filter(|c| c.id == task_id)
            .ok_or_else(|| format!("message of task {task_id:?} is not right after that task"))?;
        if seq != c.received || seq >= c.message_count {
            return Err(format!(
                "message {seq} of task {task_id:?}: expected message {} of {}",
                c.received, c.message_count
            )
            .into());
        }
        c.received += 1;
        if c.skip.is_some() {
            return Ok(());
        }
        if let Err(e) = crate::request::restored_message(&message, &self.limits) {
            let detail = format!("message.{e}");
            if !self.skip_invalid {
                return Err(Refusal::invalid(None, detail));
            }
            c.skip = Some(Skipped {
                line: n,
                task_id,
                detail,
            });
            c.messages = Vec::new(); // not written: no need to hold them
            return Ok(());
        }
        c.messages.push(message);
        Ok(())
    }

    /// A timeline event of the current task, in seq order; consecutive events of one task
    /// are written in one op.
    fn timeline(&mut self, task_id: String, e: TimelineEvent) -> Result<(), String> {
        let c = self
            .current
            .as_mut()
            .filter(|c| c.id == task_id)
            .ok_or_else(|| {
                format!("timeline event of task {task_id:?} is not right after that task")
            })?;
        let seq = e.seq;
        if c.last_seq.is_some_and(|l| l >= seq) || seq == 0 {
            return Err(format!(
                "timeline event {seq} of task {task_id:?} is out of order (or repeated)"
            ));
        }
        c.last_seq = Some(seq);
        if e == c.created {
            return Ok(()); // derived again from the task when read
        }
        match c.ops.last_mut() {
            Some(Op::PutTimeline { task_id: t, events }) if *t == task_id => events.push(e),
            _ => c.ops.push(Op::PutTimeline {
                task_id,
                events: vec![e],
            }),
        }
        c.weight += 1;
        Ok(())
    }
}

/// A run by the cursor's rules (`model/run.rs`): its cursor within its messages, the message
/// in flight the one at the cursor; a running run has the task's messages (they cannot change
/// while it goes), a finished one at most the limit. Errors name the run's field.
fn check_run(run: &Run, message_count: u32, limits: &Limits) -> Result<(), String> {
    let total = run.total;
    if run.cursor > total {
        return Err(format!(
            "cursor: {} is past the run's {total} messages",
            run.cursor
        ));
    }
    if let Some(seq) = run.in_flight.filter(|s| *s != run.cursor || *s >= total) {
        return Err(format!(
            "in_flight: message {seq}, but the cursor is at {} of {total}",
            run.cursor
        ));
    }
    if run.state == RunState::Running && total != message_count {
        return Err(format!(
            "total: a running run of {total} messages, its task has {message_count}"
        ));
    }
    if usize::try_from(total).unwrap_or(usize::MAX) > limits.messages_max {
        return Err(format!(
            "total: at most {} messages per task, got {total}",
            limits.messages_max
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::backup::FORMAT;

    const NOW: u64 = 1_800_000_000_000;

    /// Task `id` with two messages and `fires` fires, and its message lines.
    fn task(id: &str, fires: u32) -> Vec<Line> {
        let mut t = crate::request::test_task(
            json!({"id": id, "channel": "log", "schedule": {"after": "1h"},
                "to": ["a", "b"], "body": "x"}),
            NOW,
        );
        t.fires = fires;
        t.runs = fires;
        let mut out = vec![Line::Task {
            task: Box::new(t.clone()),
        }];
        for seq in 0..t.message_count {
            out.push(Line::Message {
                task_id: id.into(),
                seq,
                message: Message {
                    to: format!("to{seq}"),
                    body: "x".into(),
                    data: None,
                    tz: None,
                },
            });
        }
        out
    }

    fn run(id: &str, n: u32) -> Line {
        Line::Run {
            task_id: id.into(),
            run: Run::new(n, NOW, NOW, 2),
        }
    }

    fn failure(id: &str, run: u32, seq: u32) -> Failure {
        Failure {
            id: delivery_key(id, run, seq),
            task_id: id.into(),
            run,
            seq,
            to: "to0".into(),
            channel: "log".into(),
            attempts: 3,
            last_error: "HTTP 500".into(),
            failed_at_ms: NOW,
            retrying: false,
            retries: 0,
        }
    }

    fn fail(id: &str, run: u32, seq: u32) -> Line {
        Line::Failure {
            failure: failure(id, run, seq),
        }
    }

    fn idem(key: &str, id: &str) -> Line {
        Line::Idempotency {
            key: key.into(),
            task_id: id.into(),
            body_sha256: "ab".repeat(32),
        }
    }

    /// `body` between a header and its end line, as text: the header is line 1, `body[i]`
    /// line `i + 2`.
    fn file(body: Vec<Line>) -> Vec<u8> {
        let tasks = body
            .iter()
            .filter(|l| matches!(l, Line::Task { .. }))
            .count() as u64;
        let mut ls = vec![Line::Header {
            format: FORMAT.into(),
            version: VERSION,
            exported_at: "2027-01-15T08:00:00Z".into(),
        }];
        ls.extend(body);
        let lines = ls.len() as u64 + 1;
        ls.push(Line::End { tasks, lines });
        ls.iter()
            .map(|l| serde_json::to_string(l).unwrap() + "\n")
            .collect::<String>()
            .into_bytes()
    }

    async fn import_text(text: &[u8]) -> Result<Imported, BackupError> {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        import(&store, text).await
    }

    async fn refusal(text: &[u8]) -> String {
        match import_text(text).await {
            Ok(i) => panic!("imported: {i:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// Tasks `a` (fired twice) and `b` (never), with runs, a failure and keys.
    fn good() -> Vec<Line> {
        let mut body = task("a", 2);
        body.extend([run("a", 1), run("a", 2)]);
        body.extend(task("b", 0));
        body.extend([fail("a", 1, 0), fail("a", 2, 1)]);
        body.extend([idem("k1", "a"), idem("k2", "gone"), idem("k3", "b")]);
        body
    }

    #[tokio::test]
    async fn a_whole_file_imports_and_keys_of_gone_tasks_are_left_out() {
        let i = import_text(&file(good())).await.unwrap();
        assert_eq!((i.tasks, i.keys_left_out), (2, 1));
    }

    #[tokio::test]
    async fn runs_are_numbered_within_the_fires_in_order_each_once() {
        // Lines: 2 task a, 3-4 its messages, 5 and on its runs.
        let cases: [(&[u32], &str); 4] = [
            (
                &[1, 1],
                "line 6: run 1 of task \"a\" is out of order (or repeated)",
            ),
            (
                &[2, 1],
                "line 6: run 1 of task \"a\" is out of order (or repeated)",
            ),
            (
                &[1, 3],
                "line 6: run 3 of task \"a\": the task has fired 2 times",
            ),
            (
                &[0],
                "line 5: run 0 of task \"a\": the task has fired 2 times",
            ),
        ];
        for (runs, says) in cases {
            let mut body = task("a", 2);
            body.extend(runs.iter().map(|n| run("a", *n)));
            let e = refusal(&file(body)).await;
            assert!(e.contains(says), "{runs:?}: {e}");
        }
    }

    #[tokio::test]
    async fn failures_are_of_tasks_in_the_file_keyed_by_delivery_in_order_each_once() {
        // Lines: 2-4 task a, 5-7 task b, 8 and on the failure list.
        let mut wrong_id = failure("a", 1, 0);
        wrong_id.id = "a:1:1".into();
        let cases: [(Vec<Line>, &str); 5] = [
            (
                vec![fail("a", 1, 0), fail("a", 1, 0)],
                "line 9: failure \"a:1:0\" is out of id order (or repeated)",
            ),
            (
                vec![fail("a", 1, 1), fail("a", 1, 0)],
                "line 9: failure \"a:1:0\" is out of id order (or repeated)",
            ),
            (
                vec![fail("c", 1, 0)],
                "line 8: failure \"c:1:0\" is of task \"c\", which the file does not hold",
            ),
            (
                vec![Line::Failure { failure: wrong_id }],
                "line 8: failure \"a:1:1\": its id must be \"a:1:0\"",
            ),
            (
                vec![fail("b", 1, 0)],
                "line 8: failure \"b:1:0\": task \"b\" has fired 0 times",
            ),
        ];
        for (failures, says) in cases {
            let mut body = task("a", 1);
            body.extend(task("b", 0));
            body.extend(failures);
            let e = refusal(&file(body)).await;
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    #[tokio::test]
    async fn keys_come_in_order_each_once_and_parts_in_their_order() {
        let mut body = task("a", 0);
        body.extend([idem("k1", "a"), idem("k1", "a")]);
        let e = refusal(&file(body)).await;
        assert!(
            e.contains("line 6: idempotency key \"k1\" is out of order (or repeated)"),
            "{e}"
        );
        let mut body = task("b", 0);
        body.push(idem("k1", "b"));
        body.extend(task("c", 0));
        let e = refusal(&file(body)).await;
        assert!(
            e.contains("line 6: a task after the idempotency keys: out of order"),
            "{e}"
        );
    }

    /// `body` with its first line's task changed by `edit`.
    fn with_task(mut body: Vec<Line>, edit: impl FnOnce(&mut Task)) -> Vec<Line> {
        match body.first_mut() {
            Some(Line::Task { task }) => edit(task),
            _ => panic!("the first line is a task"),
        }
        body
    }

    /// `body` with message `seq` of its first task changed by `edit`.
    fn with_message(mut body: Vec<Line>, seq: u32, edit: impl FnOnce(&mut Message)) -> Vec<Line> {
        for l in &mut body {
            if let Line::Message {
                seq: s, message, ..
            } = l
            {
                if *s == seq {
                    edit(message);
                    return body;
                }
            }
        }
        panic!("no message {seq}");
    }

    fn cron(expr: &str, tz: Option<&str>) -> crate::model::Schedule {
        crate::model::Schedule::Cron {
            cron: expr.into(),
            tz: tz.map(Into::into),
            dst: Default::default(),
            start: None,
            start_ms: None,
            end: None,
            end_ms: None,
            max_runs: None,
        }
    }

    /// Every case imported before the checks of a create (the garbage cron and the body over
    /// the limit as seen); each is refused naming its line and field.
    #[tokio::test]
    async fn a_task_is_checked_by_the_rules_of_a_create() {
        use crate::model::{Notify, NotifyOn, QuietHours, QuietSetting, RetryPolicy, Schedule};
        type Edit = Box<dyn FnOnce(&mut Task)>;
        // Line 2 is task a.
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|t| t.schedule = cron("garbage cron", None)),
                "line 2: task.schedule.cron: ",
            ),
            (
                Box::new(|t| t.schedule = cron("0 9 * * *", Some("Mars/Olympus"))),
                "line 2: task.schedule.tz: ",
            ),
            (
                Box::new(|t| {
                    t.schedule = Schedule::At {
                        at: "tomorrow".into(),
                        tz: None,
                        dst: Default::default(),
                        at_ms: NOW,
                    }
                }),
                "line 2: task.schedule.at: ",
            ),
            (
                Box::new(|t| {
                    t.schedule = Schedule::Reminders {
                        event_at: "2027-01-15T08:00:00Z".into(),
                        tz: None,
                        dst: Default::default(),
                        event_ms: NOW,
                        before: vec!["15m".into(), "15m".into()],
                        before_ms: vec![900_000, 900_000],
                    }
                }),
                "line 2: task.schedule.reminders.before[1]: appears twice",
            ),
            (
                Box::new(|t| t.message_count = 10_001),
                "line 2: task.message_count: at most 10000 messages per task, got 10001",
            ),
            (
                Box::new(|t| t.message_count = 0),
                "line 2: task.message_count: must not be empty",
            ),
            (
                Box::new(|t| t.name = Some("n".repeat(1025))),
                "line 2: task.name: must be at most 1024 bytes",
            ),
            (
                Box::new(|t| t.pacing.interval_ms = 8 * 86_400_000),
                "line 2: task.pacing.interval: ",
            ),
            (
                Box::new(|t| t.pacing.batch_pause_ms = 1_000),
                "line 2: task.pacing.batch_pause: needs pacing.batch_size",
            ),
            (
                Box::new(|t| {
                    t.retry = Some(RetryPolicy {
                        max_attempts: 0,
                        ..RetryPolicy::default()
                    })
                }),
                "line 2: task.retry.max_attempts: ",
            ),
            (
                Box::new(|t| {
                    t.metadata.insert("k".into(), "v".repeat(1025));
                }),
                "line 2: task.metadata.k: ",
            ),
            (
                Box::new(|t| {
                    t.quiet_hours = QuietSetting::Own(QuietHours {
                        from_min: 22 * 60,
                        to_min: 22 * 60,
                        tz: "Europe/Paris".into(),
                    })
                }),
                "line 2: task.quiet_hours.to: must differ from from",
            ),
            (
                Box::new(|t| {
                    t.notify = Some(Notify {
                        channel: "log".into(),
                        to: String::new(),
                        on: vec![NotifyOn::Failed],
                    })
                }),
                "line 2: task.notify.to: must not be empty",
            ),
            (
                Box::new(|t| t.recipient_zones = vec!["Nowhere/City".into()]),
                "line 2: task.recipient_zones[0]: ",
            ),
            // Checked once its messages have come, naming the task's line: a zone none of
            // its messages has (and a schedule not in recipient time).
            (
                Box::new(|t| t.recipient_zones = vec!["Europe/Paris".into()]),
                "line 2: task.recipient_zones: lists 1 zones, its messages have 0 (first difference: \"Europe/Paris\")",
            ),
            (
                Box::new(|t| {
                    t.runs = 3;
                    t.fires = 2;
                }),
                "line 2: task.runs: 3 runs started, more than the task's 2 fires",
            ),
        ];
        for (edit, says) in cases {
            let e = refusal(&file(with_task(task("a", 0), edit))).await;
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    /// A timeline event of task `id` (not its derived `created`, so it is stored).
    fn event(id: &str, seq: u64) -> Line {
        Line::timeline(
            id,
            TimelineEvent {
                seq,
                at_ms: NOW,
                kind: crate::model::timeline::TimelineKind::Paused,
                run: None,
                msg: None,
                attempt: None,
                detail: serde_json::Value::Null,
            },
        )
    }

    /// Tasks `a` and `c` and, between them, `b` with every kind of line a task has (its lines
    /// changed by `edit_b`): the file with `b`, and the same file without any line of `b`.
    /// Lines: 2-7 task a (messages, 2 runs, an event), 8 task b, 9-10 its messages, 11 its
    /// run, 12 its event, 13-15 task c, 16-17 failures of a and b, 18-20 keys of a, b, c.
    fn with_b(edit_b: impl FnOnce(&mut Vec<Line>)) -> (Vec<Line>, Vec<Line>) {
        let mut a = task("a", 2);
        a.extend([run("a", 1), run("a", 2), event("a", 2)]);
        let mut b = task("b", 1);
        b.extend([run("b", 1), event("b", 2)]);
        edit_b(&mut b);
        let c = task("c", 0);
        let tail = |b_too: bool| {
            let mut t = vec![fail("a", 1, 0)];
            t.extend(b_too.then(|| fail("b", 1, 1)));
            t.push(idem("k1", "a"));
            t.extend(b_too.then(|| idem("k2", "b")));
            t.push(idem("k3", "c"));
            t
        };
        let with = [a.clone(), b, c.clone(), tail(true)].concat();
        let without = [a, c, tail(false)].concat();
        (with, without)
    }

    /// `text` imported into a new store kept for the test (`skip`: `--skip-invalid`, its
    /// reports collected).
    async fn import_kept(
        text: &[u8],
        skip: bool,
    ) -> (
        tempfile::TempDir,
        Store,
        Result<Imported, BackupError>,
        Vec<Skipped>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut seen = Vec::new();
        let mut report = |s: &Skipped| seen.push(s.clone());
        let report = skip.then_some(&mut report as &mut dyn FnMut(&Skipped));
        let r = import_with(&store, text, &Limits::default(), report).await;
        (dir, store, r, seen)
    }

    /// Every line `store` would export.
    fn exported(store: &Store) -> Vec<Line> {
        let mut out = Vec::new();
        crate::backup::export::export(store, NOW, &mut |l| {
            out.push(l.clone());
            Ok(())
        })
        .unwrap();
        out
    }

    /// A task that breaks a rule of a create on its task line, on a message line, or in its
    /// messages' zones refuses the file (nothing written); with `--skip-invalid` it is left
    /// out with its messages, runs, timeline, failures and keys, named at its line, and the
    /// store holds exactly what the file without that task imports.
    #[tokio::test]
    async fn skip_invalid_leaves_out_a_task_with_every_line_of_it() {
        type Edit = Box<dyn FnOnce(&mut Vec<Line>)>;
        let cases: Vec<(Edit, u64, &str)> = vec![
            (
                Box::new(|b| {
                    let Some(Line::Task { task }) = b.first_mut() else {
                        panic!("b's first line is its task")
                    };
                    task.notify = Some(crate::model::Notify {
                        channel: "log".into(),
                        to: "n".repeat(1025),
                        on: vec![crate::model::NotifyOn::Failed],
                    });
                }),
                8,
                "task.notify.to: must be at most 1024 bytes",
            ),
            (
                Box::new(|b| {
                    if let Some(Line::Message { message, .. }) = b.get_mut(2) {
                        message.tz = Some("Nowhere/City".into());
                    }
                }),
                10,
                "message.tz: ",
            ),
            (
                Box::new(|b| {
                    let Some(Line::Task { task }) = b.first_mut() else {
                        panic!("b's first line is its task")
                    };
                    task.recipient_zones = vec!["Europe/Paris".into()];
                }),
                8,
                "task.recipient_zones: lists 1 zones, its messages have 0",
            ),
        ];
        let (_, want_store, r, _) = import_kept(&file(with_b(|_| {}).1), false).await;
        r.unwrap();
        let want = exported(&want_store);
        for (edit, line, says) in cases {
            let (with, _) = with_b(edit);
            let text = file(with);
            let (_, store, r, seen) = import_kept(&text, false).await;
            match r {
                Err(BackupError::Invalid { line: l, detail }) => {
                    assert_eq!(l, line, "{detail}");
                    assert!(detail.starts_with(says), "{says}: {detail}");
                }
                other => panic!("{says}: {other:?}"),
            }
            assert!(seen.is_empty());
            assert_eq!(
                store.task_ids().count(),
                0,
                "{says}: written before the refusal"
            );

            let (_, store, r, seen) = import_kept(&text, true).await;
            let i = r.unwrap();
            assert_eq!((i.tasks, i.skipped, i.keys_left_out), (2, 1, 0), "{says}");
            assert_eq!(seen.len(), 1, "{says}: {seen:?}");
            let shown = seen[0].to_string();
            let prefix = format!("line {line}: task \"b\" skipped: {says}");
            assert!(shown.starts_with(&prefix), "{prefix}: {shown}");
            assert_eq!(exported(&store), want, "{says}");
            // What an export would not show: nothing of b's is stored at all.
            let failures: Vec<String> = store.all_failures().map(|f| f.unwrap().id).collect();
            assert_eq!(failures, ["a:1:0"], "{says}");
            assert!(store.idem_get("k2").unwrap().is_none());
            assert!(store.idem_get("k1").unwrap().is_some());
            assert!(store.runs_of("b").unwrap().is_empty());
            assert_eq!(store.runs_of("a").unwrap().len(), 2);
            let (events, _) = store.timeline("b", None, None, 10).unwrap();
            assert!(events.is_empty(), "{events:?}");
            assert_eq!(store.timeline("a", None, None, 10).unwrap().0.len(), 2);
        }
    }

    /// `--skip-invalid` skips only the rules of a create: a broken file is refused whole, in
    /// a skipped task's lines as anywhere else; and a file with nothing to skip imports as
    /// without it.
    #[tokio::test]
    async fn skip_invalid_still_refuses_a_broken_file() {
        let invalid = |b: &mut Vec<Line>| {
            if let Some(Line::Task { task }) = b.first_mut() {
                task.name = Some("n".repeat(1025));
            }
        };
        type Edit = Box<dyn FnOnce(&mut Vec<Line>)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|b| {
                    b.remove(2); // message 1
                }),
                "line 8: task.message_count: task \"b\" has 2 messages, the export holds 1",
            ),
            (
                Box::new(|b| b.insert(3, run("b", 2))),
                "line 11: run 2 of task \"b\": the task has fired 1 times",
            ),
            (
                Box::new(|b| b.push(event("b", 2))),
                "line 13: timeline event 2 of task \"b\" is out of order",
            ),
            (
                Box::new(|b| b.push(fail("b", 1, 0))),
                "line 14: a task after the failure list: out of order",
            ),
            (
                Box::new(|b| {
                    if let Some(Line::Task { task }) = b.first_mut() {
                        task.runs = 2;
                    }
                }),
                "line 8: task.runs: 2 runs started",
            ),
        ];
        for (edit, says) in cases {
            let (with, _) = with_b(|b| {
                invalid(b);
                edit(b);
            });
            let (_, _, r, _) = import_kept(&file(with), true).await;
            match r {
                Err(e @ BackupError::Format { .. }) => {
                    let e = e.to_string();
                    assert!(e.starts_with(says), "{says}: {e}");
                }
                other => panic!("{says}: {other:?}"),
            }
        }
        // A failure of a task the file does not hold, beside a skipped one.
        let (mut with, _) = with_b(invalid);
        with.insert(16, fail("bz", 1, 0));
        let (_, _, r, _) = import_kept(&file(with), true).await;
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains(
                "line 18: failure \"bz:1:0\" is of task \"bz\", which the file does not hold"
            ),
            "{e}"
        );
        let (_, store, r, seen) = import_kept(&file(good()), true).await;
        assert_eq!(r.unwrap().skipped, 0);
        assert!(seen.is_empty());
        assert_eq!(store.task_ids().count(), 2);
    }

    /// A batch is written once the lines read into it reach the byte bound, long before the op
    /// bound: ten tasks of 8 KiB bodies, 30 writes, with the bound lowered to 4 KiB, are
    /// written a task at a time (with the import's bounds, in one batch).
    #[tokio::test]
    async fn a_batch_is_written_at_the_byte_bound_before_the_op_bound() {
        let mut body = Vec::new();
        for i in 0..10 {
            let mut t = task(&format!("t{i}"), 0);
            for l in &mut t {
                if let Line::Message { message, .. } = l {
                    message.body = "x".repeat(4096);
                }
            }
            body.extend(t);
        }
        let text = file(body);
        let low = Bounds {
            ops: BATCH_OPS,
            bytes: 4096,
        };
        for (bounds, batches) in [(BATCH, 1..=1), (low, 10..=11)] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            let (i, writes) = import_bounded(&store, &text[..], &Limits::default(), None, bounds)
                .await
                .unwrap();
            assert_eq!(i.tasks, 10);
            assert!(batches.contains(&writes), "{bounds:?}: {writes} batches");
            assert_eq!(store.task_ids().count(), 10);
        }
    }

    #[tokio::test]
    async fn a_message_is_checked_by_the_rules_of_a_create_naming_its_line() {
        type Edit = Box<dyn FnOnce(&mut Message)>;
        // Lines: 2 task a, 3-4 its messages.
        let cases: Vec<(u32, Edit, &str)> = vec![
            (
                1,
                Box::new(|m| m.body = "x".repeat(64 * 1024 + 1)),
                "line 4: message.body: must be at most 65536 bytes",
            ),
            (
                1,
                Box::new(|m| {
                    m.body = "x".repeat(60 * 1024);
                    m.data = Some(format!("{{\"k\":\"{}\"}}", "d".repeat(8 * 1024)));
                }),
                "line 4: message.data: body and data together must be at most 65536 bytes",
            ),
            (
                0,
                Box::new(|m| m.to.clear()),
                "line 3: message.to: must not be empty",
            ),
            (
                0,
                Box::new(|m| m.data = Some("[1]".into())),
                "line 3: message.data: must be a JSON object",
            ),
            (
                0,
                Box::new(|m| m.tz = Some("Nowhere/City".into())),
                "line 3: message.tz: ",
            ),
        ];
        for (seq, edit, says) in cases {
            let e = refusal(&file(with_message(task("a", 0), seq, edit))).await;
            assert!(e.contains(says), "{says}: {e}");
        }
        // Fewer message lines than the task says: named at the task's line.
        let mut body = task("a", 0);
        body.pop();
        body.extend(task("b", 0));
        let e = refusal(&file(body)).await;
        assert!(
            e.contains("line 2: task.message_count: task \"a\" has 2 messages, the export holds 1"),
            "{e}"
        );
    }

    /// A task in recipient time whose messages have their zones imports; one message without
    /// its zone is refused, as a create refuses it.
    #[tokio::test]
    async fn recipient_time_needs_each_message_in_a_zone_of_the_task() {
        let t = crate::request::test_task(
            json!({"id": "r", "channel": "log",
                "schedule": {"cron": "0 9 * * *", "tz": "recipient"},
                "messages": [{"to": "a", "body": "x", "tz": "Europe/Paris"},
                             {"to": "b", "body": "x", "tz": "Asia/Tokyo"}]}),
            NOW,
        );
        let message = |seq: u32, tz: Option<&str>| Line::Message {
            task_id: "r".into(),
            seq,
            message: Message {
                to: "a".into(),
                body: "x".into(),
                data: None,
                tz: tz.map(Into::into),
            },
        };
        let lines = |second: Option<&str>| {
            vec![
                Line::Task {
                    task: Box::new(t.clone()),
                },
                message(0, Some("Europe/Paris")),
                message(1, second),
            ]
        };
        import_text(&file(lines(Some("Asia/Tokyo")))).await.unwrap();
        let e = refusal(&file(lines(None))).await;
        assert!(e.contains("line 2: task.messages[1].tz: required"), "{e}");
        let e = refusal(&file(lines(Some("America/Lima")))).await;
        assert!(e.contains("line 2: task.recipient_zones: "), "{e}");
    }

    #[tokio::test]
    async fn a_run_and_a_failure_are_checked_against_their_task() {
        // Lines: 2 task a (2 messages, fired once), 3-4 its messages, 5 its run.
        let run_with = |edit: &dyn Fn(&mut Run)| {
            let mut r = Run::new(1, NOW, NOW, 2);
            edit(&mut r);
            let mut body = task("a", 1);
            body.push(Line::Run {
                task_id: "a".into(),
                run: r,
            });
            body
        };
        type Edit<'a> = &'a dyn Fn(&mut Run);
        let cases: [(Edit, &str); 4] = [
            (
                &|r| r.cursor = 3,
                "line 5: run.cursor: 3 is past the run's 2 messages",
            ),
            (
                &|r| r.in_flight = Some(1),
                "line 5: run.in_flight: message 1, but the cursor is at 0 of 2",
            ),
            (
                &|r| r.total = 3,
                "line 5: run.total: a running run of 3 messages, its task has 2",
            ),
            (
                &|r| {
                    r.state = crate::model::RunState::Completed;
                    r.total = 10_001;
                },
                "line 5: run.total: at most 10000 messages per task, got 10001",
            ),
        ];
        for (edit, says) in cases {
            let e = refusal(&file(run_with(edit))).await;
            assert!(e.contains(says), "{says}: {e}");
        }
        // A finished run of more messages than the task has now (they changed since) imports,
        // and its failures may name them.
        let mut body = run_with(&|r| {
            r.state = crate::model::RunState::Completed;
            r.total = 5;
        });
        body.push(fail("a", 1, 4));
        import_text(&file(body)).await.unwrap();
        // Line 6: the failure.
        let mut body = run_with(&|_| {});
        body.push(fail("a", 1, 2));
        let e = refusal(&file(body)).await;
        assert!(
            e.contains("line 6: failure.seq: message 2 of run 1, whose task's runs have at most 2 messages"),
            "{e}"
        );
        // A run trimmed from the history: bounded by the limit only. Line 5: the failure.
        let mut body = task("a", 1);
        body.push(fail("a", 1, 10_000));
        let e = refusal(&file(body)).await;
        assert!(
            e.contains("line 5: failure.seq: message 10000 of run 1"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_line_is_read_only_up_to_the_longest_an_export_can_hold() {
        let max = line_max(&crate::model::Limits::default());
        assert_eq!(max, 6 * (65_536 + 1_024) + (4 << 20));
        let max = usize::try_from(max).unwrap();
        // Zeros without end (bounded here, /dev/zero in tests/backup.rs): refused at the cap,
        // not read whole.
        let zeros = std::io::Read::take(std::io::repeat(0), 64 << 20);
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let e = import(&store, std::io::BufReader::new(zeros))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("line 1: longer than {max} bytes")),
            "{e}"
        );
        // A long third line; one of exactly the longest length is read (and is no JSON).
        for (len, long) in [(max + 1, true), (max, false)] {
            let mut bad = file(good());
            // Where line 3 starts: after the second newline.
            let at = bad
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .nth(1)
                .unwrap()
                .0
                + 1;
            let mut line = vec![b'x'; len];
            line.push(b'\n');
            bad.splice(at..at, line);
            let e = refusal(&bad).await;
            assert_eq!(e.contains("line 3: longer than"), long, "{len}: {e}");
            if !long {
                assert!(e.contains("line 3: not an export line"), "{e}");
            }
        }
    }

    #[tokio::test]
    async fn bad_text_is_refused_naming_its_line() {
        let text = file(good());
        // Invalid UTF-8 in line 3 (a message of task a).
        let mut bad = text.clone();
        let at = bad
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(1)
            .unwrap()
            .0;
        bad.insert(at + 10, 0xff);
        let e = refusal(&bad).await;
        assert!(e.contains("line 3: not UTF-8 text"), "{e}");
        // A blank first line does not skip the header's check.
        let mut blank = b"\n".to_vec();
        blank.extend_from_slice(&text);
        let e = refusal(&blank).await;
        assert!(
            e.contains("line 1: the first line must be the header; it is blank"),
            "{e}"
        );
        // An unknown field, nested, named with its path.
        let mut v: Vec<serde_json::Value> = String::from_utf8(text)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        v[1]["task"]["schedule"]["After"]["wobble"] = json!(1);
        let newer: String = v.iter().map(|l| format!("{l}\n")).collect();
        let e = refusal(newer.as_bytes()).await;
        assert!(
            e.contains("line 2: unknown field task.schedule.After.wobble"),
            "{e}"
        );
    }
}

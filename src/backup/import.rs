//! Reading export lines into an empty store (see `mod.rs` for the format). Every line is
//! checked against what came before it (a message or run belongs to the task just read,
//! messages are numbered 0, 1, ..., the `end` line's counts match), and a file without its
//! `end` line is refused: it was cut short.

use std::io::BufRead;
use std::path::Path;

use serde::Deserialize;

use super::{unhex32, BackupError, Line, FORMAT, VERSION};
use crate::model::timeline::TimelineEvent;
use crate::model::{delivery_key, Failure, Message, Run, Task};
use crate::store::{Batch, IdemRecord, Op, Store};

/// Writes per batch (the messages of one task count as one op but are bounded by the task
/// limit).
const BATCH_OPS: usize = 1_000;

/// What an import wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    pub tasks: u64,
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

/// The task whose messages and runs are being read.
struct Current {
    id: String,
    message_count: u32,
    messages: Vec<Message>,
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

/// Reads an export from `r` into `store` (which should be empty; see [`check_empty`]).
pub async fn import(store: &Store, mut r: impl BufRead) -> Result<Imported, BackupError> {
    let mut st = Reading::default();
    let mut n = 0u64;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if r.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        n += 1;
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
        st.line(line, n).map_err(err)?;
        if st.ops >= BATCH_OPS {
            store.write(&st.batch).await?;
            st.batch = Batch::new();
            st.ops = 0;
        }
    }
    if !st.ended {
        return Err(BackupError::Format {
            line: n,
            detail: "the file ends without its end line: it was cut short".into(),
        });
    }
    store.write(&st.batch).await?;
    Ok(Imported {
        tasks: st.tasks,
        lines: n,
        keys_left_out: st.keys_left_out,
    })
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

/// An import under way: the batch being filled and what the order checks need.
#[derive(Default)]
struct Reading {
    batch: Batch,
    /// Writes in `batch` (it is written at [`BATCH_OPS`]).
    ops: usize,
    current: Option<Current>,
    /// Every task read, in id order (so the last is the greatest), with its fires: what the
    /// failure and idempotency lines are checked against.
    ids: Vec<(Box<str>, u32)>,
    part: Part,
    last_failure: Option<String>,
    last_key: Option<String>,
    keys_left_out: u64,
    tasks: u64,
    ended: bool,
}

impl Reading {
    /// One line after the header (`n`: its number, which the end line counts).
    fn line(&mut self, line: Line, n: u64) -> Result<(), String> {
        match line {
            Line::Header { .. } => Err("a second header".into()),
            Line::Task { task } => self.task(task),
            Line::Message {
                task_id,
                seq,
                message,
            } => self.message(task_id, seq, message),
            Line::Run { task_id, run } => self.run(task_id, run),
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
                self.timeline(task_id, e)
            }
            Line::Failure { failure } => self.failure(failure),
            Line::Idempotency {
                key,
                task_id,
                body_sha256,
            } => self.idempotency(key, task_id, body_sha256),
            Line::End { tasks, lines } => self.end(tasks, lines, n),
        }
    }

    /// The end line: its counts must be the file's.
    fn end(&mut self, tasks: u64, lines: u64, n: u64) -> Result<(), String> {
        self.finish()?;
        if tasks != self.tasks || lines != n {
            return Err(format!(
                "the end line counts {tasks} tasks in {lines} lines, the file has {} in {n}",
                self.tasks
            ));
        }
        self.ended = true;
        Ok(())
    }

    fn finish(&mut self) -> Result<(), String> {
        finish(&mut self.current, &mut self.batch, &mut self.ops)
    }

    /// Moves on to `part` (ending the last task): never back to an earlier one.
    fn enter(&mut self, part: Part, what: &str) -> Result<(), String> {
        self.finish()?;
        if part < self.part {
            return Err(format!(
                "{what} after the {}: out of order",
                match self.part {
                    Part::Tasks => "tasks",
                    Part::Failures => "failure list",
                    Part::Idempotency => "idempotency keys",
                }
            ));
        }
        self.part = part;
        Ok(())
    }

    /// The fires of task `id` if the file holds it.
    fn fires_of(&self, id: &str) -> Option<u32> {
        let i = self.ids.binary_search_by(|(t, _)| (**t).cmp(id)).ok()?;
        self.ids.get(i).map(|(_, fires)| *fires)
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
        c.last_run = Some(n);
        self.batch.run(&task_id, &run);
        self.ops += 1;
        Ok(())
    }

    /// A failure-list entry: of a task in the file and a run it had, its id the delivery's
    /// key, in id order, each once.
    fn failure(&mut self, f: Failure) -> Result<(), String> {
        self.enter(Part::Failures, "a failure-list entry")?;
        let want = delivery_key(&f.task_id, f.run, f.seq);
        if f.id != want {
            return Err(format!(
                "failure {:?}: its id must be {want:?} (task:run:seq)",
                f.id
            ));
        }
        if self
            .last_failure
            .as_deref()
            .is_some_and(|l| l >= f.id.as_str())
        {
            return Err(format!(
                "failure {:?} is out of id order (or repeated)",
                f.id
            ));
        }
        let fires = self.fires_of(&f.task_id).ok_or_else(|| {
            format!(
                "failure {:?} is of task {:?}, which the file does not hold",
                f.id, f.task_id
            )
        })?;
        if f.run == 0 || f.run > fires {
            return Err(format!(
                "failure {:?}: task {:?} has fired {fires} times (runs 1 to {fires})",
                f.id, f.task_id
            ));
        }
        self.last_failure = Some(f.id.clone());
        self.batch.failure(f);
        self.ops += 1;
        Ok(())
    }

    /// An idempotency key, in key order, each once. A key of a task the file does not hold is
    /// left out: its task was deleted and the key not yet swept (the sweep removes it).
    fn idempotency(&mut self, key: String, task_id: String, sha: String) -> Result<(), String> {
        self.enter(Part::Idempotency, "an idempotency key")?;
        if self.last_key.as_deref().is_some_and(|l| l >= key.as_str()) {
            return Err(format!(
                "idempotency key {key:?} is out of order (or repeated)"
            ));
        }
        let hash =
            unhex32(&sha).ok_or_else(|| "body_sha256: expected 64 hex digits".to_string())?;
        self.last_key = Some(key.clone());
        if self.fires_of(&task_id).is_none() {
            self.keys_left_out += 1;
            return Ok(());
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

    /// A task: in id order, after the previous task's messages.
    fn task(&mut self, task: Box<Task>) -> Result<(), String> {
        self.enter(Part::Tasks, "a task")?;
        crate::model::check_id(&task.id).map_err(|e| format!("task.id: {e}"))?;
        if self
            .ids
            .last()
            .is_some_and(|(l, _)| **l >= *task.id.as_str())
        {
            return Err(format!(
                "task {:?} is out of id order (or repeated)",
                task.id
            ));
        }
        self.ids.push((task.id.as_str().into(), task.fires));
        self.tasks += 1;
        self.current = Some(Current {
            id: task.id.clone(),
            message_count: task.message_count,
            messages: Vec::new(),
            fires: task.fires,
            last_run: None,
            last_seq: None,
            created: TimelineEvent::created(&task),
        });
        self.batch.task(&task);
        self.ops += 1;
        Ok(())
    }

    /// A message of the current task, in order.
    fn message(&mut self, task_id: String, seq: u32, message: Message) -> Result<(), String> {
        let c = self
            .current
            .as_mut()
            .filter(|c| c.id == task_id)
            .ok_or_else(|| format!("message of task {task_id:?} is not right after that task"))?;
        if seq as usize != c.messages.len() || seq >= c.message_count {
            return Err(format!(
                "message {seq} of task {task_id:?}: expected message {} of {}",
                c.messages.len(),
                c.message_count
            ));
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
        match self.batch.ops.last_mut() {
            Some(Op::PutTimeline { task_id: t, events }) if *t == task_id => events.push(e),
            _ => self.batch.ops.push(Op::PutTimeline {
                task_id,
                events: vec![e],
            }),
        }
        self.ops += 1;
        Ok(())
    }
}

/// Ends the current task: all its messages must have come.
fn finish(current: &mut Option<Current>, batch: &mut Batch, ops: &mut usize) -> Result<(), String> {
    let Some(c) = current.take() else {
        return Ok(());
    };
    if c.messages.len() != c.message_count as usize {
        return Err(format!(
            "task {:?} has {} messages, the export holds {}",
            c.id,
            c.message_count,
            c.messages.len()
        ));
    }
    *ops += c.messages.len();
    batch.ops.push(Op::Messages {
        task_id: c.id,
        old_count: 0,
        messages: c.messages,
    });
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

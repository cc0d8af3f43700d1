//! Reading export lines into an empty store (see `mod.rs` for the format). Every line is
//! checked against what came before it (a message or run belongs to the task just read,
//! messages are numbered 0, 1, ..., the `end` line's counts match), and a file without its
//! `end` line is refused: it was cut short.

use std::io::BufRead;
use std::path::Path;

use super::{unhex32, BackupError, Line, FORMAT, VERSION};
use crate::model::timeline::TimelineEvent;
use crate::model::{Message, Task};
use crate::store::{Batch, IdemRecord, Op, Store};

/// Writes per batch (the messages of one task count as one op but are bounded by the task
/// limit).
const BATCH_OPS: usize = 1_000;

/// What an import wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    pub tasks: u64,
    pub lines: u64,
}

/// Refuses a data directory that has anything in it: an import never mixes with existing data.
pub fn check_empty(dir: &Path) -> Result<(), BackupError> {
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
    /// The seq of its last timeline event read.
    last_seq: Option<u64>,
    /// Its `created` event as the store derives it: an exported one equal to it is not
    /// stored (`store/timeline.rs`).
    created: TimelineEvent,
}

/// Reads an export from `r` into `store` (which should be empty; see [`check_empty`]).
pub async fn import(store: &Store, r: impl BufRead) -> Result<Imported, BackupError> {
    let mut st = Reading::default();
    let mut n = 0u64;
    for text in r.lines() {
        let text = text?;
        n += 1;
        let err = |detail: String| BackupError::Format { line: n, detail };
        if text.trim().is_empty() {
            continue;
        }
        if st.ended {
            return Err(err("text after the end line".into()));
        }
        let line: Line =
            serde_json::from_str(&text).map_err(|e| err(format!("not an export line: {e}")))?;
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
    })
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

/// An import under way: the batch being filled and what the order checks need.
struct Reading {
    batch: Batch,
    /// Writes in `batch` (it is written at [`BATCH_OPS`]).
    ops: usize,
    current: Option<Current>,
    last_id: Option<String>,
    tasks: u64,
    ended: bool,
}

impl Default for Reading {
    fn default() -> Self {
        Reading {
            batch: Batch::new(),
            ops: 0,
            current: None,
            last_id: None,
            tasks: 0,
            ended: false,
        }
    }
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
            Line::Run { task_id, run } => {
                if self.current.as_ref().is_none_or(|c| c.id != task_id) {
                    return Err(format!(
                        "run of task {task_id:?} is not right after that task"
                    ));
                }
                self.batch.run(&task_id, &run);
                self.ops += 1;
                Ok(())
            }
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
            Line::Failure { failure } => {
                self.finish()?;
                self.batch.failure(failure);
                self.ops += 1;
                Ok(())
            }
            Line::Idempotency {
                key,
                task_id,
                body_sha256,
            } => {
                self.finish()?;
                let hash = unhex32(&body_sha256)
                    .ok_or_else(|| "body_sha256: expected 64 hex digits".to_string())?;
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

    /// A task: in id order, after the previous task's messages.
    fn task(&mut self, task: Box<Task>) -> Result<(), String> {
        self.finish()?;
        crate::model::check_id(&task.id).map_err(|e| format!("task.id: {e}"))?;
        if self
            .last_id
            .as_deref()
            .is_some_and(|l| l >= task.id.as_str())
        {
            return Err(format!(
                "task {:?} is out of id order (or repeated)",
                task.id
            ));
        }
        self.last_id = Some(task.id.clone());
        self.tasks += 1;
        self.current = Some(Current {
            id: task.id.clone(),
            message_count: task.message_count,
            messages: Vec::new(),
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

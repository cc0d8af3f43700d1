//! Reading export lines into an empty store (see `mod.rs` for the format). Every line is
//! checked against what came before it (a message or run belongs to the task just read,
//! messages are numbered 0, 1, ..., the `end` line's counts match), and a file without its
//! `end` line is refused: it was cut short.

use std::io::BufRead;
use std::path::Path;

use super::{unhex32, BackupError, Line, FORMAT, VERSION};
use crate::model::timeline::TimelineEvent;
use crate::model::Message;
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
}

/// Reads an export from `r` into `store` (which should be empty; see [`check_empty`]).
pub async fn import(store: &Store, r: impl BufRead) -> Result<Imported, BackupError> {
    let mut batch = Batch::new();
    let mut ops = 0usize;
    let mut current: Option<Current> = None;
    let mut last_id: Option<String> = None;
    let mut tasks = 0u64;
    let mut n = 0u64;
    let mut ended = false;
    for text in r.lines() {
        let text = text?;
        n += 1;
        let err = |detail: String| BackupError::Format { line: n, detail };
        if text.trim().is_empty() {
            continue;
        }
        if ended {
            return Err(err("text after the end line".into()));
        }
        let line: Line =
            serde_json::from_str(&text).map_err(|e| err(format!("not an export line: {e}")))?;
        if n == 1 {
            match &line {
                Line::Header { format, version, .. } if format == FORMAT && *version == VERSION => continue,
                Line::Header { format, version, .. } => {
                    return Err(err(format!(
                        "format {format:?} version {version}; this build reads {FORMAT:?} version {VERSION}"
                    )))
                }
                _ => return Err(err("the first line must be the header".into())),
            }
        }
        match line {
            Line::Header { .. } => return Err(err("a second header".into())),
            Line::Task { task } => {
                finish(&mut current, &mut batch, &mut ops).map_err(err)?;
                crate::model::check_id(&task.id).map_err(|e| err(format!("task.id: {e}")))?;
                if last_id.as_deref().is_some_and(|l| l >= task.id.as_str()) {
                    return Err(err(format!(
                        "task {:?} is out of id order (or repeated)",
                        task.id
                    )));
                }
                last_id = Some(task.id.clone());
                tasks += 1;
                current = Some(Current {
                    id: task.id.clone(),
                    message_count: task.message_count,
                    messages: Vec::new(),
                    last_seq: None,
                });
                batch.task(&task);
                ops += 1;
            }
            Line::Message {
                task_id,
                seq,
                message,
            } => {
                let c = current
                    .as_mut()
                    .filter(|c| c.id == task_id)
                    .ok_or_else(|| {
                        err(format!(
                            "message of task {task_id:?} is not right after that task"
                        ))
                    })?;
                if seq as usize != c.messages.len() || seq >= c.message_count {
                    return Err(err(format!(
                        "message {seq} of task {task_id:?}: expected message {} of {}",
                        c.messages.len(),
                        c.message_count
                    )));
                }
                c.messages.push(message);
            }
            Line::Run { task_id, run } => {
                if current.as_ref().is_none_or(|c| c.id != task_id) {
                    return Err(err(format!(
                        "run of task {task_id:?} is not right after that task"
                    )));
                }
                batch.run(&task_id, &run);
                ops += 1;
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
                let c = current
                    .as_mut()
                    .filter(|c| c.id == task_id)
                    .ok_or_else(|| {
                        err(format!(
                            "timeline event of task {task_id:?} is not right after that task"
                        ))
                    })?;
                if c.last_seq.is_some_and(|l| l >= seq) || seq == 0 {
                    return Err(err(format!(
                        "timeline event {seq} of task {task_id:?} is out of order (or repeated)"
                    )));
                }
                c.last_seq = Some(seq);
                let e = TimelineEvent {
                    seq,
                    at_ms,
                    kind: event,
                    run,
                    msg,
                    attempt,
                    detail,
                };
                match batch.ops.last_mut() {
                    Some(Op::PutTimeline { task_id: t, events }) if *t == task_id => events.push(e),
                    _ => batch.ops.push(Op::PutTimeline {
                        task_id,
                        events: vec![e],
                    }),
                }
                ops += 1;
            }
            Line::Failure { failure } => {
                finish(&mut current, &mut batch, &mut ops).map_err(err)?;
                batch.failure(failure);
                ops += 1;
            }
            Line::Idempotency {
                key,
                task_id,
                body_sha256,
            } => {
                finish(&mut current, &mut batch, &mut ops).map_err(err)?;
                let hash = unhex32(&body_sha256)
                    .ok_or_else(|| err("body_sha256: expected 64 hex digits".into()))?;
                batch.ops.push(Op::PutIdem(
                    key,
                    IdemRecord {
                        task_id,
                        body_sha256: hash,
                    },
                ));
                ops += 1;
            }
            Line::End { tasks: t, lines } => {
                finish(&mut current, &mut batch, &mut ops).map_err(err)?;
                if t != tasks || lines != n {
                    return Err(err(format!(
                        "the end line counts {t} tasks in {lines} lines, the file has {tasks} in {n}"
                    )));
                }
                ended = true;
            }
        }
        if ops >= BATCH_OPS {
            store.write(&batch).await?;
            batch = Batch::new();
            ops = 0;
        }
    }
    if !ended {
        return Err(BackupError::Format {
            line: n,
            detail: "the file ends without its end line: it was cut short".into(),
        });
    }
    store.write(&batch).await?;
    Ok(Imported { tasks, lines: n })
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

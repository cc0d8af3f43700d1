//! Backups: `herald export` writes a data directory as JSON lines, `herald import` reads them
//! into an empty data directory, and the restored directory behaves as the original would
//! after an outage: every task with its spec and progress, its messages, its runs with their
//! cursors (a sequence resumes at its cursor; a message that was in flight is sent again with
//! the same idempotency key, as after a crash), the failure list and the idempotency keys.
//!
//! The format (one JSON object per line, `kind` says which):
//! 1. `header`: `{"kind":"header","format":"herald-export","version":1,"exported_at":"..."}`
//! 2. per task, in id order: `task`, then its `message`s (seq 0, 1, ...), then its `run`s,
//!    then its `timeline` events (oldest first, with their seqs; exports made before the
//!    timeline have none, and import as tasks without events)
//! 3. every `failure` (in id order), then every `idempotency` key (in key order), of the
//!    tasks exported and as their images show them
//! 4. `end` with the counts: a file without it was cut short and is refused.
//!
//! A field the reader does not know is refused, naming its line and path (a newer herald's
//! setting would otherwise be lost); a field missing is given its default (files from older
//! herald versions). `VERSION` moves only when a reader of the old version would misread a file.
//! A task, its messages, runs and failures are checked as a create and the engine would have
//! them (`import.rs`): a file edited by hand or damaged is refused, naming its line and field.
//! A task only today's rules of a create refuse (an older herald's) is left out instead, with
//! every line of it, by `herald import --skip-invalid`; a broken file never is.
//!
//! `export.rs` reads a [`crate::store::Store`] (each task as one consistent image, so it may
//! run while herald writes: `GET /v1/export` streams it); `import.rs` writes one through the
//! store's ordinary batch path, with the directory marked until it has finished (`marker.rs`).

pub mod export;
pub mod import;
pub mod marker;

use serde::{Deserialize, Serialize};

use crate::model::timeline::{TimelineEvent, TimelineKind};
use crate::model::{Failure, Message, Run, Task};

/// `format` of the header line.
pub const FORMAT: &str = "herald-export";
/// `version` of the header line this build writes and reads.
pub const VERSION: u32 = 1;

/// One line of an export.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    Header {
        format: String,
        version: u32,
        exported_at: String,
    },
    Task {
        task: Box<Task>,
    },
    Message {
        task_id: String,
        seq: u32,
        message: Message,
    },
    Run {
        task_id: String,
        run: Run,
    },
    Timeline {
        task_id: String,
        seq: u64,
        at_ms: u64,
        event: TimelineKind,
        #[serde(default)]
        run: Option<u32>,
        #[serde(default)]
        msg: Option<u32>,
        #[serde(default)]
        attempt: Option<u32>,
        #[serde(default)]
        detail: serde_json::Value,
    },
    Failure {
        failure: Failure,
    },
    Idempotency {
        key: String,
        task_id: String,
        /// SHA-256 of the create request's body, hex.
        body_sha256: String,
    },
    End {
        tasks: u64,
        lines: u64,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A broken file: not an export, or lines out of place.
    #[error("line {line}: {detail}")]
    Format { line: u64, detail: String },
    /// A task (or one of its messages) a rule of a create refuses: `herald import
    /// --skip-invalid` leaves such a task out instead (`import.rs`).
    #[error("line {line}: {detail}")]
    Invalid { line: u64, detail: String },
    #[error("{0}")]
    Refused(String),
}

impl Line {
    /// The line of one timeline event of `task_id`.
    pub fn timeline(task_id: &str, e: TimelineEvent) -> Line {
        Line::Timeline {
            task_id: task_id.to_string(),
            seq: e.seq,
            at_ms: e.at_ms,
            event: e.kind,
            run: e.run,
            msg: e.msg,
            attempt: e.attempt,
            detail: e.detail,
        }
    }
}

pub use crate::model::timeline::hex;

/// The 32 bytes of a 64-digit hex string.
pub fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_junk() {
        let b: [u8; 32] = std::array::from_fn(|i| (i * 7) as u8);
        assert_eq!(unhex32(&hex(&b)), Some(b));
        assert_eq!(unhex32("00"), None);
        assert_eq!(unhex32(&"zz".repeat(32)), None);
    }

    #[test]
    fn lines_are_tagged_by_kind() {
        let l = Line::End { tasks: 2, lines: 9 };
        let s = serde_json::to_string(&l).unwrap();
        assert_eq!(s, r#"{"kind":"end","tasks":2,"lines":9}"#);
        assert_eq!(serde_json::from_str::<Line>(&s).unwrap(), l);
    }
}

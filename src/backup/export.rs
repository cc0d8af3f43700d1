//! Writing a store as export lines (see `mod.rs` for the format).

use super::{hex, BackupError, Line, FORMAT, VERSION};
use crate::store::Store;

/// Counts the lines it passes on (the `end` line says how many there were).
struct Out<'a> {
    out: &'a mut dyn FnMut(&Line) -> std::io::Result<()>,
    lines: u64,
}

impl Out<'_> {
    fn emit(&mut self, l: &Line) -> std::io::Result<()> {
        self.lines += 1;
        (self.out)(l)
    }
}

/// Writes every task (one consistent image each), failure and idempotency key of `store` to
/// `out`, one line each, between the header and the `end` line; returns (tasks, lines).
/// Stops at the first record it cannot read: a backup that silently left something out would
/// be worse than none.
pub fn export(
    store: &Store,
    now_ms: u64,
    out: &mut dyn FnMut(&Line) -> std::io::Result<()>,
) -> Result<(u64, u64), BackupError> {
    let mut o = Out { out, lines: 0 };
    let mut tasks = 0u64;
    o.emit(&Line::Header {
        format: FORMAT.into(),
        version: VERSION,
        exported_at: crate::schedule::format_utc(now_ms),
    })?;
    for id in store.task_ids() {
        let id = id?;
        // Deleted between the listing and the read: it is simply not in the export.
        let Some(img) = store.task_image(&id)? else {
            continue;
        };
        tasks += 1;
        // The task's `created` event is derived, not stored (`store/timeline.rs`): the export
        // carries it like any other.
        let created =
            crate::store::timeline::derived_created(&img.task, &img.timeline, store.timeline_max());
        o.emit(&Line::Task {
            task: Box::new(img.task),
        })?;
        for (seq, message) in img.messages.into_iter().enumerate() {
            o.emit(&Line::Message {
                task_id: id.clone(),
                seq: seq as u32,
                message,
            })?;
        }
        for run in img.runs {
            o.emit(&Line::Run {
                task_id: id.clone(),
                run,
            })?;
        }
        for e in created.into_iter().chain(img.timeline) {
            o.emit(&Line::timeline(&id, e))?;
        }
    }
    for f in store.all_failures() {
        o.emit(&Line::Failure { failure: f? })?;
    }
    for r in store.idem_records() {
        let (key, rec) = r?;
        o.emit(&Line::Idempotency {
            key,
            task_id: rec.task_id,
            body_sha256: hex(&rec.body_sha256),
        })?;
    }
    // The end line counts itself.
    let lines = o.lines + 1;
    o.emit(&Line::End { tasks, lines })?;
    Ok((tasks, lines))
}

/// [`export`] to a writer as JSON lines.
pub fn export_to(
    store: &Store,
    now_ms: u64,
    w: &mut dyn std::io::Write,
) -> Result<(u64, u64), BackupError> {
    export(store, now_ms, &mut |l| {
        serde_json::to_writer(&mut *w, l)?;
        w.write_all(b"\n")
    })
}

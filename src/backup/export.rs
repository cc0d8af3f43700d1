//! Writing a store as export lines (see `mod.rs` for the format).

use std::collections::HashMap;

use super::{hex, BackupError, Line, FORMAT, VERSION};
use crate::model::{Failure, RunState};
use crate::store::image::TaskImage;
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

/// What the exported task images said, for the failure list and keys read after them: the
/// export holds them as of each task's image, not as of their own later read.
#[derive(Default)]
struct Exported {
    /// The tasks exported, in the listing's order (by id).
    images: Vec<Image>,
    /// The runs under way in their image (running, or a send in flight): the cursor it shows.
    open: HashMap<(Box<str>, u32), u32>,
}

/// What an exported image says about the failures import will take for its task
/// (`backup/import.rs`, `failure`): its runs are 1 to `fires`, and a run from `first_run` on
/// (the runs the file holds) has at most `messages` messages.
struct Image {
    id: Box<str>,
    fires: u32,
    first_run: Option<u32>,
    /// The most messages of the task and of any run the image holds.
    messages: u32,
}

impl Exported {
    fn add(&mut self, img: &TaskImage) {
        let id: Box<str> = img.task.id.as_str().into();
        for r in &img.runs {
            if r.state == RunState::Running || r.in_flight.is_some() {
                self.open.insert((id.clone(), r.run), r.cursor);
            }
        }
        let totals = img.runs.iter().map(|r| r.total);
        self.images.push(Image {
            id,
            fires: img.task.fires,
            first_run: img.runs.iter().map(|r| r.run).min(),
            messages: totals.fold(img.task.message_count, u32::max),
        });
    }

    /// Ready for [`Exported::image`] (the listing is in id order already).
    fn done(&mut self) {
        if !self.images.is_sorted_by(|a, b| a.id <= b.id) {
            self.images.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        }
    }

    fn image(&self, id: &str) -> Option<&Image> {
        let i = self.images.binary_search_by(|m| (*m.id).cmp(id)).ok()?;
        self.images.get(i)
    }

    fn holds(&self, id: &str) -> bool {
        self.image(id).is_some()
    }

    /// Whether a failure-list entry goes with the exported images: of a task exported (not
    /// one created after the listing passed it), of a run and a message its image holds (not
    /// of a run started after the image was read, nor of a task deleted and created again
    /// with more messages meanwhile: import refuses the whole file for either), and not of a
    /// message its image still shows unsettled (it ran out of attempts after the image was
    /// read: the image's in-flight mark sends it again after the import, as after a crash at
    /// that moment).
    fn keeps(&self, f: &Failure) -> bool {
        let Some(img) = self.image(&f.task_id) else {
            return false;
        };
        if f.run > img.fires {
            return false;
        }
        // Runs before the first held were trimmed: import bounds them by its limits alone.
        if img.first_run.is_some_and(|first| f.run >= first) && f.seq >= img.messages {
            return false;
        }
        let key = (Box::<str>::from(f.task_id.as_str()), f.run);
        self.open.get(&key).is_none_or(|cursor| f.seq < *cursor)
    }
}

/// Writes every task (one consistent image each), failure and idempotency key of `store` to
/// `out`, one line each, between the header and the `end` line; returns (tasks, lines).
/// Failure entries and keys are of the tasks exported, as their images show them
/// ([`Exported`]); a key of a task not exported (deleted, its key not swept yet; or created
/// after the listing passed it) is left out. Stops at the first record it cannot read: a
/// backup that silently left something out would be worse than none.
pub fn export(
    store: &Store,
    now_ms: u64,
    out: &mut dyn FnMut(&Line) -> std::io::Result<()>,
) -> Result<(u64, u64), BackupError> {
    let mut o = Out { out, lines: 0 };
    let mut tasks = 0u64;
    let mut exported = Exported::default();
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
        exported.add(&img);
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
    exported.done();
    for f in store.all_failures() {
        let f = f?;
        if exported.keeps(&f) {
            o.emit(&Line::Failure { failure: f })?;
        }
    }
    for r in store.idem_records() {
        let (key, rec) = r?;
        if !exported.holds(&rec.task_id) {
            continue;
        }
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::{delivery_key, Message, Run, Task};
    use crate::store::{Batch, IdemRecord, Op};

    const NOW: u64 = 1_800_000_000_000;

    /// Task `id` (two messages) fired `fires` times.
    fn task_fired(id: &str, fires: u32) -> Task {
        let mut t: Task = crate::request::test_task(
            json!({"id": id, "channel": "log", "schedule": {"after": "1h"},
                "to": ["x", "y"], "body": "hi"}),
            NOW,
        );
        t.fires = fires;
        t.runs = fires;
        t
    }

    /// Task `id`, fired once, with its two messages, into `b`.
    fn put_task(b: &mut Batch, id: &str) {
        b.task(&task_fired(id, 1));
        let m = |to: &str| Message {
            to: to.into(),
            body: "hi".into(),
            data: None,
            tz: None,
        };
        b.ops.push(Op::Messages {
            task_id: id.into(),
            old_count: 0,
            messages: vec![m("x"), m("y")],
        });
        b.ops.push(Op::PutIdem(
            format!("key-{id}"),
            IdemRecord {
                task_id: id.into(),
                body_sha256: [7; 32],
            },
        ));
    }

    fn failure(id: &str, seq: u32) -> Failure {
        failure_of_run(id, 1, seq)
    }

    fn failure_of_run(id: &str, run: u32, seq: u32) -> Failure {
        Failure {
            id: delivery_key(id, run, seq),
            task_id: id.into(),
            run,
            seq,
            to: "x".into(),
            channel: "log".into(),
            attempts: 3,
            last_error: "HTTP 500".into(),
            failed_at_ms: NOW,
            retrying: false,
            retries: 0,
        }
    }

    /// Run 1 at `cursor`, the message there in flight (or, past it, given up on).
    fn run(cursor: u32, in_flight: bool) -> Run {
        let mut r = Run::new(1, NOW, NOW, 2);
        r.cursor = cursor;
        r.failed = cursor;
        r.in_flight = in_flight.then_some(cursor);
        r.attempts = if in_flight { 3 } else { 0 };
        r
    }

    /// Task `b`'s message 0 runs out of attempts after its image was read (the cursor and the
    /// failure entry in one write), and task `a` is created (before `b` in id order: not
    /// listed) with an entry and a key of its own: the export keeps neither entry nor `a`'s
    /// key, so it imports with `b`'s message in flight (sent again, as after a crash then) and
    /// nothing in the failure list for it. `c`'s entry, settled in its image, stays; `c` fires
    /// again after its image was read and its run 2 gives up on message 0 (`c:2:0`): a run the
    /// image does not hold (its `fires` is 1), so the entry is left out too, else the import
    /// would refuse the whole file ("task c has fired 1 times"); so is `c:1:5`, a message
    /// past every run the image holds (as if `c` were deleted and created again with six).
    #[test]
    fn failure_entries_and_keys_go_with_the_exported_images() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut w = Batch::new();
        put_task(&mut w, "b");
        w.run("b", &run(0, true));
        put_task(&mut w, "c");
        // Run 1 of `c` finished: message 0 given up on, message 1 sent.
        let mut c1 = run(1, false);
        c1.cursor = 2;
        c1.sent = 1;
        c1.state = RunState::Completed;
        c1.finished_at_ms = Some(NOW);
        w.run("c", &c1);
        w.failure(failure("c", 0));
        rt.block_on(store.write(&w)).unwrap();
        let mut lines = Vec::new();
        export(&store, NOW, &mut |l| {
            if matches!(l, Line::Run { task_id, .. } if task_id == "b") {
                let mut w = Batch::new();
                w.run("b", &run(1, false));
                w.failure(failure("b", 0));
                put_task(&mut w, "a");
                w.run("a", &run(1, false));
                w.failure(failure("a", 0));
                rt.block_on(store.write(&w)).unwrap();
            }
            if matches!(l, Line::Run { task_id, .. } if task_id == "c") {
                let mut w = Batch::new();
                w.progress(&task_fired("c", 2));
                let mut r2 = Run::new(2, NOW, NOW, 2);
                r2.cursor = 1;
                r2.failed = 1;
                w.run("c", &r2);
                w.failure(failure_of_run("c", 2, 0));
                // As if `c` had been deleted and created again with six messages since.
                w.failure(failure_of_run("c", 1, 5));
                rt.block_on(store.write(&w)).unwrap();
            }
            lines.push(l.clone());
            Ok(())
        })
        .unwrap();
        let failures: Vec<&str> = lines
            .iter()
            .filter_map(|l| match l {
                Line::Failure { failure } => Some(failure.id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(failures, ["c:1:0"]);
        let keys: Vec<&str> = lines
            .iter()
            .filter_map(|l| match l {
                Line::Idempotency { key, .. } => Some(key.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(keys, ["key-b", "key-c"]);

        let text: String = lines
            .iter()
            .map(|l| serde_json::to_string(l).unwrap() + "\n")
            .collect();
        let dir2 = tempfile::tempdir().unwrap();
        let restored = Store::open(dir2.path()).unwrap();
        let i = rt
            .block_on(crate::backup::import::import(&restored, text.as_bytes()))
            .unwrap();
        assert_eq!(i.tasks, 2);
        let b = restored.task_image("b").unwrap().unwrap();
        assert_eq!(b.runs[0].in_flight, Some(0));
        let ids: Vec<String> = restored.all_failures().map(|f| f.unwrap().id).collect();
        assert_eq!(ids, ["c:1:0"]);
    }
}

//! Format 6 → 7: the `live` tree folded into the progress records (issue 29: one key fewer
//! per pending task). Format 6 kept each unfinished task's live entry twice, keyed by id in
//! `live` and in start-up order in `due`, and derived a new task's progress from the `live`
//! copy. Format 7 derives the due entry from the progress record (stored, or derived from the
//! spec's `initial`), so each task that had a live entry gets its progress record stored
//! with `one_shot` (which version 1 lacked) and its live entry removed, in one atomic job.
//!
//! Idempotent and resumable: a task is migrated by one job, so a crash leaves every task
//! either as format 6 had it or as format 7 has it, and the next open migrates the rest.
//! Used by sled's open (`Store::open_with`, through the backend's own log) and by
//! PostgreSQL's schema version 6 (`store/pg/schema.rs`, inside the migration's transaction).

use super::backend::{Backend, RawOp, TreeId};
use super::codec::{decode, encode};
use super::records::{due_key, due_key_of, LiveEntry, ProgressRecord, SpecRecord};
use super::StoreError;

/// What one task's migration writes.
#[derive(Debug, PartialEq, Eq)]
pub struct Folded {
    /// The progress record to store (version 2).
    pub progress: Vec<u8>,
    /// The due entry format 6 kept (derived from the live entry), to remove.
    pub old_due: Vec<u8>,
    /// The due entry of the progress record: key and value (the same as `old_due` and its
    /// value unless the two copies disagreed).
    pub due: (Vec<u8>, Vec<u8>),
}

/// One task's migration from its live entry, spec and progress record (format 6's bytes).
/// `None`: nothing to store, only the live entry (and its due entry) to remove: the spec is
/// gone (an orphan), or the progress says the task is finished.
pub fn fold(
    id: &[u8],
    live: &[u8],
    spec: Option<&[u8]>,
    progress: Option<&[u8]>,
) -> Result<Option<Folded>, StoreError> {
    let entry: LiveEntry = decode("live", id, live)?;
    let Some(spec) = spec else {
        return Ok(None);
    };
    let mut p = match progress {
        Some(p) => decode::<ProgressRecord>("progress", id, p)?,
        None => {
            let spec: SpecRecord = decode("specs", id, spec)?;
            ProgressRecord::created(&spec, &entry)
        }
    };
    p.one_shot = entry.one_shot;
    let Some(now) = p.live() else {
        return Ok(None);
    };
    Ok(Some(Folded {
        progress: encode(&p)?,
        old_due: due_key(id, live),
        due: (due_key_of(id, &now), encode(&now)?),
    }))
}

/// Tasks migrated per job.
const CHUNK: usize = 1024;

/// Migrates every live entry of `backend` (sled's, before the commit thread starts: applied
/// and synced here, through the write-ahead log). Answers how many tasks it migrated.
pub fn live_into_progress(backend: &dyn Backend) -> Result<usize, StoreError> {
    let started = std::time::Instant::now();
    let mut n = 0usize;
    loop {
        // Every round removes what it read, so each starts from the first key left.
        let chunk: Vec<(Vec<u8>, Vec<u8>)> = backend
            .scan(TreeId::Live, &[], None)
            .take(CHUNK)
            .collect::<Result<_, _>>()?;
        if chunk.is_empty() {
            break;
        }
        let mut ops = Vec::with_capacity(chunk.len() * 4);
        for (id, live) in &chunk {
            let spec = backend.get(TreeId::Specs, id)?;
            let progress = backend.get(TreeId::Progress, id)?;
            ops.push(RawOp::Delete(TreeId::Live, id.clone()));
            match fold(id, live, spec.as_deref(), progress.as_deref()) {
                Ok(Some(f)) => {
                    ops.push(RawOp::Delete(TreeId::Due, f.old_due));
                    ops.push(RawOp::Put(TreeId::Progress, id.clone(), f.progress));
                    ops.push(RawOp::Put(TreeId::Due, f.due.0, f.due.1));
                }
                Ok(None) => ops.push(RawOp::Delete(TreeId::Due, due_key(id, live))),
                // Left as it is but for the live entry: start-up meets its due entry and
                // reports the task as unreadable, as it would have before.
                Err(e) => {
                    tracing::error!(error = %e, "a task's records do not decode; not migrated")
                }
            }
        }
        for r in backend.apply(vec![ops])? {
            r.map_err(|r| {
                StoreError::Write(format!(
                    "migration refused in {} (no precondition)",
                    r.tree.name()
                ))
            })?;
        }
        backend.sync()?;
        n += chunk.len();
    }
    if n > 0 {
        tracing::info!(
            tasks = n,
            took_ms = started.elapsed().as_millis() as u64,
            "folded the live index into progress records (format 6 -> 7)"
        );
    }
    Ok(n)
}

/// Puts a due entry per live entry (format 2 had no `due` index; format 6's `live` tree
/// holds the same entries), through `backend` (sled's, before the commit thread starts: the
/// merged scan of the log's writes and sled's, and writes through the log), in chunks, each
/// applied and synced. Nothing is cleared: format 2 wrote no due entry, and every put is the
/// one [`live_into_progress`] expects to remove, so a run again (an upgrade whose `format`
/// write was lost) puts the same entries or, once the live entries are folded, none.
/// Answers how many it put.
pub fn due_from_live(backend: &dyn Backend) -> Result<usize, StoreError> {
    let started = std::time::Instant::now();
    let (mut n, mut ops) = (0usize, Vec::new());
    let flush = |ops: Vec<RawOp>| -> Result<(), StoreError> {
        if !ops.is_empty() {
            backend.apply(vec![ops])?;
            backend.sync()?;
        }
        Ok(())
    };
    // A scan ends at its first error (sled may repeat one forever): `?` does.
    for item in backend.scan(TreeId::Live, &[], None) {
        let (id, live) = item?;
        ops.push(RawOp::Put(TreeId::Due, due_key(&id, &live), live));
        n += 1;
        if ops.len() == 10_000 {
            flush(std::mem::take(&mut ops))?;
        }
    }
    flush(ops)?;
    tracing::info!(
        entries = n,
        took_ms = started.elapsed().as_millis() as u64,
        "built the due index of this data directory (format 2 -> 3)"
    );
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TaskState;
    use crate::store::records::{progress_of, spec_of};

    fn task() -> crate::model::Task {
        let req: crate::request::TaskRequest = serde_json::from_value(serde_json::json!({
            "id": "t", "schedule": {"after": "1h"}, "to": ["a"], "body": "hello"
        }))
        .unwrap();
        req.into_task(&crate::request::Context {
            now_ms: 1_800_000_000_000,
            limits: &crate::model::Limits::default(),
            channel_exists: &|_| true,
        })
        .unwrap()
        .0
    }

    fn live(state: TaskState, at: Option<u64>) -> (LiveEntry, Vec<u8>) {
        let e = LiveEntry {
            state,
            next_fire_at_ms: at,
            one_shot: true,
        };
        (e, encode(&e).unwrap())
    }

    #[test]
    fn a_derived_progress_is_stored_with_one_shot_and_its_due_entry_kept() {
        let t = task();
        let spec = encode(&spec_of(&t)).unwrap();
        let (e, l) = live(TaskState::Pending, t.next_fire_at_ms);
        let f = fold(b"t", &l, Some(&spec), None).unwrap().unwrap();
        let p: ProgressRecord = decode("progress", b"t", &f.progress).unwrap();
        let mut want = progress_of(&t);
        want.one_shot = true;
        assert_eq!(p, want);
        assert_eq!(f.old_due, due_key_of(b"t", &e));
        assert_eq!(f.due, (due_key_of(b"t", &e), l));
    }

    #[test]
    fn a_stored_progress_gains_one_shot_and_wins_over_a_stale_live_entry() {
        let t = task();
        let spec = encode(&spec_of(&t)).unwrap();
        let mut p = progress_of(&t);
        p.one_shot = false;
        p.state = TaskState::Paused;
        let stored = encode(&p).unwrap();
        let (e, l) = live(TaskState::Pending, Some(5));
        let f = fold(b"t", &l, Some(&spec), Some(&stored)).unwrap().unwrap();
        let back: ProgressRecord = decode("progress", b"t", &f.progress).unwrap();
        assert!(back.one_shot);
        assert_eq!(back.state, TaskState::Paused);
        assert_eq!(f.old_due, due_key_of(b"t", &e));
        assert_eq!(f.due.0, due_key_of(b"t", &back.live().unwrap()));
    }

    #[test]
    fn an_orphan_or_finished_entry_is_only_removed() {
        let t = task();
        let (_, l) = live(TaskState::Pending, Some(5));
        assert_eq!(fold(b"t", &l, None, None).unwrap(), None);
        let mut p = progress_of(&t);
        p.state = TaskState::Completed;
        let spec = encode(&spec_of(&t)).unwrap();
        let done = encode(&p).unwrap();
        assert_eq!(fold(b"t", &l, Some(&spec), Some(&done)).unwrap(), None);
        assert!(fold(b"t", b"\x01\xff", Some(&spec), None).is_err());
    }

    /// Three tasks written in format 7, all of it in sled (the log drained by a reopen).
    async fn format_7_in_sled(dir: &std::path::Path) -> Vec<crate::model::Task> {
        let mut tasks = Vec::new();
        {
            let s = crate::store::Store::open(dir).unwrap();
            for id in ["x", "y", "z"] {
                let (t, m) = crate::store::tests::task(id);
                s.insert_new_task(&t, &m, None).await.unwrap();
                tasks.push(t);
            }
        }
        crate::store::legacy::tests::settle(dir).await;
        tasks
    }

    fn due_ids(s: &crate::store::Store) -> Vec<String> {
        s.due_entries(&[]).map(|e| e.unwrap().1).collect()
    }

    /// A format-2 upgrade whose `format` write was lost (killed before it was durable): the
    /// next open takes the format-7 directory for format 2 again. The due entries it folded
    /// (here all in sled) stay: nothing clears sled's `due` behind the log.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_format_2_upgrade_run_again_keeps_the_due_index() {
        use crate::store::legacy::tests::{set_format, sled_open, store_open};
        let dir = tempfile::tempdir().unwrap();
        format_7_in_sled(dir.path()).await;
        set_format(&sled_open(dir.path()), 2);
        let s = store_open(dir.path());
        assert_eq!(due_ids(&s), ["x", "y", "z"]);
        assert!(s.get_task("y").unwrap().is_some());
    }

    /// What format 2 left: a live entry per unfinished task, no due index, no log. The due
    /// index is built through the log and then folded with the live entries (format 7).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_format_2_directory_gets_its_due_index_through_the_log() {
        use crate::store::legacy::tests::{set_format, sled_open, store_open};
        let dir = tempfile::tempdir().unwrap();
        let tasks = format_7_in_sled(dir.path()).await;
        {
            let db = sled_open(dir.path());
            db.open_tree("due").unwrap().clear().unwrap();
            let live = db.open_tree("live").unwrap();
            for t in &tasks {
                let e = progress_of(t).live().unwrap();
                live.insert(t.id.as_bytes(), encode(&e).unwrap()).unwrap();
            }
            set_format(&db, 2);
        }
        let s = store_open(dir.path());
        assert_eq!(due_ids(&s), ["x", "y", "z"]);
        assert_eq!(s.backend.scan(TreeId::Live, &[], None).count(), 0);
        assert_eq!(
            s.get_task("z").unwrap().unwrap().next_fire_at_ms,
            tasks[2].next_fire_at_ms
        );
    }
}

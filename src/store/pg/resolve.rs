//! A commit group resolved into plain writes before it reaches the database. Pure: the
//! stored values it needs are read first ([`reads_needed`]), in one round trip, and handed in.
//!
//! The same rules as sled's resolver (`store/backend.rs`): a job's preconditions are checked
//! against the store as the group's earlier jobs left it; a job whose precondition fails
//! writes nothing and the rest go on; an indexed write removes the index entry of the value it
//! replaces and puts one for the new value; rewriting a value unchanged writes nothing.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::store::backend::{idem_names, IndexedWrite, RawOp, Rejected, TreeId, Unstored, TREES};

/// Per tree, the final value of every key the group writes (`None`: delete). One entry per
/// key, so one multi-row statement per tree never touches a row twice.
pub type Writes = [BTreeMap<Vec<u8>, Option<Vec<u8>>>; TREES];

/// What the group must read before it can be resolved: per tree, keys whose stored value (or
/// mere presence) decides something.
pub fn reads_needed(jobs: &[Vec<RawOp>]) -> [Vec<Vec<u8>>; TREES] {
    let mut seen: [HashSet<&[u8]>; TREES] = Default::default();
    let mut out: [Vec<Vec<u8>>; TREES] = Default::default();
    for op in jobs.iter().flatten() {
        let (tree, key) = match op {
            RawOp::Absent(t, k) => (*t, k.as_slice()),
            RawOp::IdemOf(k, _) => (TreeId::Idem, k.as_slice()),
            // Read even when the writer says it knows the old value (`indexed` below).
            RawOp::Indexed(w) if !w.stored_absent => {
                // Its source too, for a value not stored (one round trip either way).
                if w.derived_from.of_mut(&mut seen).insert(&w.key) {
                    w.derived_from.of_mut(&mut out).push(w.key.clone());
                }
                (w.tree, w.key.as_slice())
            }
            _ => continue,
        };
        if tree.of_mut(&mut seen).insert(key) {
            tree.of_mut(&mut out).push(key.to_vec());
        }
    }
    out
}

/// Per tree, the stored values of the keys [`reads_needed`] named (absent keys not in it).
pub type Stored = [HashMap<Vec<u8>, Vec<u8>>; TREES];

/// Resolves the group against `stored`: per job applied or rejected, and the writes.
pub fn resolve(jobs: Vec<Vec<RawOp>>, stored: &Stored) -> (Vec<Result<(), Rejected>>, Writes) {
    let mut writes: Writes = Default::default();
    let mut unstored = Unstored::new();
    let results = jobs
        .into_iter()
        .map(|ops| job(ops, stored, &mut writes, &mut unstored))
        .collect();
    (results, writes)
}

/// The value of `key` as the group's writes so far leave it; `Some(None)` means deleted, and
/// `None` that the group has not written it.
fn written<'a>(writes: &'a Writes, tree: TreeId, key: &[u8]) -> Option<Option<&'a Vec<u8>>> {
    tree.of(writes).get(key).map(Option::as_ref)
}

fn current<'a>(
    writes: &'a Writes,
    stored: &'a Stored,
    tree: TreeId,
    key: &[u8],
) -> Option<&'a Vec<u8>> {
    match written(writes, tree, key) {
        Some(v) => v,
        None => tree.of(stored).get(key),
    }
}

fn job(
    ops: Vec<RawOp>,
    stored: &Stored,
    writes: &mut Writes,
    unstored: &mut Unstored,
) -> Result<(), Rejected> {
    for op in &ops {
        let refused = match op {
            RawOp::Absent(t, k) => current(writes, stored, *t, k).is_some().then_some((*t, k)),
            RawOp::IdemOf(k, task) => {
                let v = current(writes, stored, TreeId::Idem, k);
                (!idem_names(v.map(Vec::as_slice), task)).then_some((TreeId::Idem, k))
            }
            _ => None,
        };
        if let Some((tree, key)) = refused {
            return Err(Rejected {
                tree,
                key: key.clone(),
                lost_shard: None,
            });
        }
    }
    for op in ops {
        match op {
            RawOp::Put(t, k, v) => {
                t.of_mut(writes).insert(k, Some(v));
            }
            RawOp::Delete(t, k) => {
                t.of_mut(writes).insert(k, None);
            }
            RawOp::Absent(..) | RawOp::Born(_) | RawOp::IdemOf(..) | RawOp::LoadedAt(..) => {}
            RawOp::Indexed(w) => indexed(*w, stored, writes, unstored),
        }
    }
    Ok(())
}

fn indexed(mut w: IndexedWrite, stored: &Stored, writes: &mut Writes, unstored: &mut Unstored) {
    let (tree, derived_from, derive) = (w.tree, w.derived_from, w.derive);
    // The writer's known old value is not trusted here: on PostgreSQL a group answered as
    // failed may have committed (a COMMIT whose reply was lost and could not be read back),
    // so the engine's memory can be behind the database. The cluster nemesis found one
    // (seed 2912049, a lost COMMIT reply): the debug check of the promise failed. sled cuts a
    // failed group off its log, so there the promise holds and saves the read.
    w.old = None;
    let key = &w.key;
    let stored_or_derived = || match tree.of(stored).get(key) {
        Some(v) => (Some(v.clone()), true),
        None => (
            derived_from
                .of(stored)
                .get(key)
                .and_then(|from| derive(key, from)),
            false,
        ),
    };
    // The writer's promise covers what was stored before this group, not what an earlier job
    // of the group wrote. A derived value comes from its source as stored before the group.
    // `in_tree`: the old value is in `tree` (not derived, not an unstored value).
    let (old, in_tree) = match (
        unstored.get(&(tree, key.clone())),
        written(writes, tree, key),
    ) {
        (Some(v), _) => (v.clone(), false),
        (None, Some(v)) => (v.cloned(), true),
        (None, None) if w.stored_absent => (None, true),
        (None, None) => stored_or_derived(),
    };
    w.resolve(old, in_tree, unstored, |t, k, v| {
        t.of_mut(writes).insert(k, v);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index entry: the value, then the key; none for a value starting with `x`
    /// (finished).
    fn ik(key: &[u8], value: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        if value.starts_with(b"x") {
            return None;
        }
        let mut k = value.to_vec();
        k.extend_from_slice(key);
        Some((k, value.to_vec()))
    }

    /// The value derived from its source: the source's bytes after `=`.
    fn derive(_key: &[u8], from: &[u8]) -> Option<Vec<u8>> {
        from.strip_prefix(b"=").map(<[u8]>::to_vec)
    }

    fn ixs(key: &str, value: Option<&str>, store: bool, stored_absent: bool) -> RawOp {
        RawOp::Indexed(Box::new(IndexedWrite {
            tree: TreeId::Progress,
            key: key.into(),
            value: value.map(Into::into),
            store,
            index: TreeId::Due,
            entry: ik,
            derived_from: TreeId::Specs,
            derive,
            stored_absent,
            old: None,
        }))
    }

    /// [`ix`] of a value whose old one the writer knows.
    fn ix_known(key: &str, value: &str, old: &str) -> RawOp {
        let mut op = ix(key, Some(value), false);
        if let RawOp::Indexed(w) = &mut op {
            w.old = Some(old.into());
        }
        op
    }

    #[test]
    fn a_known_old_value_moves_the_entry_it_names() {
        let mut stored: Stored = Default::default();
        // "d" is derived from its spec ("=p"), "t" stored ("a").
        stored[TreeId::Specs as usize].insert(b"d".to_vec(), b"=p".to_vec());
        stored[TreeId::Progress as usize].insert(b"t".to_vec(), b"a".to_vec());
        let jobs = vec![
            vec![ix_known("d", "s", "p")],
            vec![ix_known("t", "b", "a")],
            // The group's own earlier write wins over what the writer says.
            vec![ix_known("t", "c", "a")],
        ];
        let (res, w) = resolve(jobs, &stored);
        assert!(res.iter().all(Result::is_ok));
        assert_eq!(get(&w, TreeId::Due, "pd"), Some(None));
        assert_eq!(get(&w, TreeId::Due, "sd"), Some(Some(&b"s"[..])));
        assert_eq!(get(&w, TreeId::Due, "at"), Some(None));
        assert_eq!(get(&w, TreeId::Due, "bt"), Some(None));
        assert_eq!(get(&w, TreeId::Due, "ct"), Some(Some(&b"c"[..])));
        assert_eq!(get(&w, TreeId::Progress, "t"), Some(Some(&b"c"[..])));
    }

    /// A writer's memory can be behind the database (an unconfirmed COMMIT that landed): the
    /// stored value is read and wins over what the writer says.
    #[test]
    fn a_known_old_value_is_read_and_the_stored_one_wins() {
        let mut stored: Stored = Default::default();
        stored[TreeId::Progress as usize].insert(b"t".to_vec(), b"a".to_vec());
        assert!(
            !reads_needed(&[vec![ix_known("t", "b", "z")]])[TreeId::Progress as usize].is_empty(),
            "the key is read although the writer names a value"
        );
        let (res, w) = resolve(vec![vec![ix_known("t", "b", "z")]], &stored);
        assert!(res.iter().all(Result::is_ok));
        assert_eq!(
            get(&w, TreeId::Due, "at"),
            Some(None),
            "the stored entry goes"
        );
        assert_eq!(
            get(&w, TreeId::Due, "zt"),
            None,
            "the writer's wrong one is not touched"
        );
        assert_eq!(get(&w, TreeId::Due, "bt"), Some(Some(&b"b"[..])));
    }

    fn ix(key: &str, value: Option<&str>, stored_absent: bool) -> RawOp {
        ixs(key, value, true, stored_absent)
    }

    fn get<'a>(w: &'a Writes, t: TreeId, k: &str) -> Option<Option<&'a [u8]>> {
        w[t as usize].get(k.as_bytes()).map(|v| v.as_deref())
    }

    /// Review finding: a freed idempotency key's delete was blind. It applies only while the
    /// key is absent or names the gone task; taken again meanwhile (by task "b"), it is left.
    #[test]
    fn a_freed_keys_delete_leaves_a_key_taken_again() {
        let rec = |t: &str| {
            crate::store::codec::encode(&crate::store::IdemRecord {
                task_id: t.into(),
                body_sha256: [0; 32],
            })
            .unwrap()
        };
        let mut stored: Stored = Default::default();
        stored[TreeId::Idem as usize].insert(b"k".to_vec(), rec("b"));
        let delete = |task: &str, key: &str| {
            vec![
                RawOp::IdemOf(key.as_bytes().to_vec(), task.into()),
                RawOp::Delete(TreeId::Idem, key.as_bytes().to_vec()),
            ]
        };
        let jobs = vec![delete("a", "k"), delete("a", "gone"), delete("b", "k")];
        assert_eq!(reads_needed(&jobs)[TreeId::Idem as usize].len(), 2);
        let (res, w) = resolve(jobs.clone(), &stored);
        assert_eq!(res[0].as_ref().unwrap_err().tree, TreeId::Idem, "names b");
        assert!(res[1].is_ok(), "absent: nothing to keep");
        assert!(res[2].is_ok(), "names b: b's delete goes");
        assert_eq!(get(&w, TreeId::Idem, "k"), Some(None));
        let (res, _) = resolve(jobs[..1].to_vec(), &stored);
        assert!(res[0].is_err());
    }

    #[test]
    fn a_failed_precondition_writes_nothing_and_later_jobs_see_earlier_ones() {
        let mut stored: Stored = Default::default();
        stored[TreeId::Specs as usize].insert(b"old".to_vec(), b"v".to_vec());
        let jobs = vec![
            vec![
                RawOp::Absent(TreeId::Specs, b"old".to_vec()),
                RawOp::Put(TreeId::Specs, b"x".to_vec(), b"1".to_vec()),
            ],
            vec![
                RawOp::Absent(TreeId::Specs, b"new".to_vec()),
                RawOp::Put(TreeId::Specs, b"new".to_vec(), b"2".to_vec()),
            ],
            vec![
                RawOp::Absent(TreeId::Specs, b"new".to_vec()),
                RawOp::Put(TreeId::Specs, b"y".to_vec(), b"3".to_vec()),
            ],
        ];
        assert_eq!(reads_needed(&jobs)[TreeId::Specs as usize].len(), 2);
        let (res, w) = resolve(jobs, &stored);
        assert_eq!(res[0].as_ref().unwrap_err().key, b"old");
        assert!(res[1].is_ok());
        assert_eq!(res[2].as_ref().unwrap_err().key, b"new");
        assert_eq!(get(&w, TreeId::Specs, "x"), None);
        assert_eq!(get(&w, TreeId::Specs, "y"), None);
        assert_eq!(get(&w, TreeId::Specs, "new"), Some(Some(&b"2"[..])));
    }

    #[test]
    fn indexed_writes_move_the_index_entry_and_skip_unchanged_values() {
        let mut stored: Stored = Default::default();
        stored[TreeId::Progress as usize].insert(b"t".to_vec(), b"a".to_vec());
        let jobs = vec![
            vec![ix("t", Some("b"), false)],
            vec![ix("t", Some("b"), false)],
            vec![ix("n", Some("c"), true), ix("n", None, true)],
        ];
        assert_eq!(
            reads_needed(&jobs)[TreeId::Progress as usize],
            vec![b"t".to_vec()]
        );
        let (res, w) = resolve(jobs, &stored);
        assert!(res.iter().all(Result::is_ok));
        assert_eq!(get(&w, TreeId::Due, "at"), Some(None));
        assert_eq!(get(&w, TreeId::Due, "bt"), Some(Some(&b"b"[..])));
        assert_eq!(get(&w, TreeId::Progress, "t"), Some(Some(&b"b"[..])));
        // Put then deleted in one group: the promise does not hide the group's own write.
        assert_eq!(get(&w, TreeId::Due, "cn"), Some(None));
        assert_eq!(get(&w, TreeId::Progress, "n"), Some(None));
    }

    #[test]
    fn a_value_not_stored_is_derived_from_its_source_until_one_is_stored() {
        let mut stored: Stored = Default::default();
        // "d" was created unstored: its value is derived from its spec ("=p").
        stored[TreeId::Specs as usize].insert(b"d".to_vec(), b"=p".to_vec());
        let jobs = vec![
            // A new task, its value not stored: only its index entry is written.
            vec![ixs("n", Some("q"), false, true)],
            // Its next write in the same group replaces the unstored value's entry.
            vec![ix("n", Some("r"), false)],
            // The derived task's first stored value moves its entry.
            vec![ix("d", Some("s"), false)],
        ];
        assert_eq!(
            reads_needed(&jobs)[TreeId::Specs as usize],
            vec![b"n".to_vec(), b"d".to_vec()]
        );
        let (res, w) = resolve(jobs, &stored);
        assert!(res.iter().all(Result::is_ok));
        assert_eq!(get(&w, TreeId::Due, "qn"), Some(None));
        assert_eq!(get(&w, TreeId::Due, "rn"), Some(Some(&b"r"[..])));
        assert_eq!(get(&w, TreeId::Progress, "n"), Some(Some(&b"r"[..])));
        assert_eq!(get(&w, TreeId::Due, "pd"), Some(None));
        assert_eq!(get(&w, TreeId::Due, "sd"), Some(Some(&b"s"[..])));
        // Finished: the entry goes, nothing takes its place.
        let (_, w) = resolve(vec![vec![ix("d", Some("x"), false)]], &stored);
        assert_eq!(get(&w, TreeId::Due, "pd"), Some(None));
        assert_eq!(w[TreeId::Due as usize].len(), 1);
    }
}

//! A commit group resolved into plain writes before it reaches the database. Pure: the
//! stored values it needs are read first ([`reads_needed`]), in one round trip, and handed in.
//!
//! The same rules as sled's resolver (`store/backend.rs`): a job's preconditions are checked
//! against the store as the group's earlier jobs left it; a job whose precondition fails
//! writes nothing and the rest go on; an indexed write removes the index entry of the value it
//! replaces and puts one for the new value; rewriting a value unchanged writes nothing.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::store::backend::{IndexedWrite, RawOp, Rejected, TreeId, TREES};

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
            RawOp::Indexed(w) if !w.stored_absent => (w.tree, w.key.as_slice()),
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
    let results = jobs
        .into_iter()
        .map(|ops| job(ops, stored, &mut writes))
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

fn job(ops: Vec<RawOp>, stored: &Stored, writes: &mut Writes) -> Result<(), Rejected> {
    for op in &ops {
        if let RawOp::Absent(t, k) = op {
            if current(writes, stored, *t, k).is_some() {
                return Err(Rejected {
                    tree: *t,
                    key: k.clone(),
                    lost_shard: None,
                });
            }
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
            RawOp::Absent(..) | RawOp::Born(_) | RawOp::IdemOf(..) => {}
            RawOp::Indexed(w) => indexed(*w, stored, writes),
        }
    }
    Ok(())
}

fn indexed(w: IndexedWrite, stored: &Stored, writes: &mut Writes) {
    let IndexedWrite {
        tree,
        key,
        value,
        index,
        index_key,
        stored_absent,
    } = w;
    // The writer's promise covers what was stored before this group, not what an earlier job
    // of the group wrote.
    let old = match (written(writes, tree, &key), stored_absent) {
        (Some(v), _) => v.cloned(),
        (None, true) => None,
        (None, false) => tree.of(stored).get(&key).cloned(),
    };
    if old == value {
        return;
    }
    if let Some(old) = &old {
        index.of_mut(writes).insert(index_key(&key, old), None);
    }
    if let Some(v) = &value {
        index
            .of_mut(writes)
            .insert(index_key(&key, v), Some(v.clone()));
    }
    tree.of_mut(writes).insert(key, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ik(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut k = value.to_vec();
        k.extend_from_slice(key);
        k
    }

    fn ix(key: &str, value: Option<&str>, stored_absent: bool) -> RawOp {
        RawOp::Indexed(Box::new(IndexedWrite {
            tree: TreeId::Live,
            key: key.into(),
            value: value.map(Into::into),
            index: TreeId::Due,
            index_key: ik,
            stored_absent,
        }))
    }

    fn get<'a>(w: &'a Writes, t: TreeId, k: &str) -> Option<Option<&'a [u8]>> {
        w[t as usize].get(k.as_bytes()).map(|v| v.as_deref())
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
        stored[TreeId::Live as usize].insert(b"t".to_vec(), b"a".to_vec());
        let jobs = vec![
            vec![ix("t", Some("b"), false)],
            vec![ix("t", Some("b"), false)],
            vec![ix("n", Some("c"), true), ix("n", None, true)],
        ];
        assert_eq!(
            reads_needed(&jobs)[TreeId::Live as usize],
            vec![b"t".to_vec()]
        );
        let (res, w) = resolve(jobs, &stored);
        assert!(res.iter().all(Result::is_ok));
        assert_eq!(get(&w, TreeId::Due, "at"), Some(None));
        assert_eq!(get(&w, TreeId::Due, "bt"), Some(Some(&b"b"[..])));
        assert_eq!(get(&w, TreeId::Live, "t"), Some(Some(&b"b"[..])));
        // Put then deleted in one group: the promise does not hide the group's own write.
        assert_eq!(get(&w, TreeId::Due, "cn"), Some(None));
        assert_eq!(get(&w, TreeId::Live, "n"), Some(None));
    }
}

//! The storage boundary's contract (`store::backend::Backend`), run the same on every backend:
//! `contract(open)` where `open()` opens the backend on the same storage each time (so the
//! last step can drop it and open it again).

use std::sync::Arc;

use herald::store::backend::{Backend, IndexedWrite, RawOp, TreeId};

type Open<'a> = &'a dyn Fn() -> Arc<dyn Backend>;

fn put(t: TreeId, k: &[u8], v: &[u8]) -> RawOp {
    RawOp::Put(t, k.to_vec(), v.to_vec())
}

/// `value ‖ key` → value: an index whose key moves with the value; none for a value that
/// starts with `x` (a finished task has no due entry).
fn entry(key: &[u8], value: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    if value.starts_with(b"x") {
        return None;
    }
    let mut k = value.to_vec();
    k.extend_from_slice(key);
    Some((k, value.to_vec()))
}

/// A value not stored is the source's bytes after `=` (a new task's progress, from its spec).
fn derive(_key: &[u8], from: &[u8]) -> Option<Vec<u8>> {
    from.strip_prefix(b"=").map(<[u8]>::to_vec)
}

fn indexed_as(key: &[u8], value: Option<&[u8]>, store: bool, stored_absent: bool) -> RawOp {
    RawOp::Indexed(Box::new(IndexedWrite {
        tree: TreeId::Progress,
        key: key.to_vec(),
        value: value.map(<[u8]>::to_vec),
        store,
        index: TreeId::Due,
        entry,
        derived_from: TreeId::Specs,
        derive,
        stored_absent,
        old: None,
    }))
}

/// [`indexed`] of a value whose old one the writer knows (`IndexedWrite::old`, the engine's
/// progress of a task it holds): the backend need not read it.
fn indexed_known(key: &[u8], value: &[u8], old: &[u8]) -> RawOp {
    let mut op = indexed(key, Some(value), false);
    if let RawOp::Indexed(w) = &mut op {
        w.old = Some(old.to_vec());
    }
    op
}

fn indexed(key: &[u8], value: Option<&[u8]>, stored_absent: bool) -> RawOp {
    indexed_as(key, value, true, stored_absent)
}

fn commit(b: &dyn Backend, jobs: Vec<Vec<RawOp>>) -> Vec<bool> {
    let r = b.apply(jobs).expect("apply");
    b.sync().expect("sync");
    r.iter().map(Result::is_ok).collect()
}

fn keys(b: &dyn Backend, t: TreeId, start: &[u8], prefix: Option<&[u8]>) -> Vec<Vec<u8>> {
    b.scan(t, start, prefix)
        .map(|kv| kv.expect("scan").0)
        .collect()
}

fn run_key(id: &[u8], n: u32) -> Vec<u8> {
    let mut k = id.to_vec();
    k.push(0);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// Every clause of the contract, in order, on a fresh (empty) store.
pub fn contract(open: Open) {
    let b = open();
    empty_store_reads_nothing(&*b);
    jobs_are_atomic_and_guarded_by_preconditions(&*b);
    indexed_writes_keep_the_index_in_step(&*b);
    scans_are_ordered_bounded_and_paged(&*b);
    deletes_and_last_with_prefix(&*b);
    atomic_reads_see_one_state(&*b);
    drop(b);
    everything_committed_survives_reopen(open);
}

fn empty_store_reads_nothing(b: &dyn Backend) {
    for t in TreeId::ALL {
        assert_eq!(b.get(t, b"nothing").unwrap(), None, "{t:?}");
        assert!(keys(b, t, b"", None).is_empty(), "{t:?}");
        assert_eq!(b.last_with_prefix(t, b"").unwrap(), None, "{t:?}");
    }
}

fn jobs_are_atomic_and_guarded_by_preconditions(b: &dyn Backend) {
    let ok = commit(
        b,
        vec![
            vec![
                RawOp::Absent(TreeId::Specs, b"a".to_vec()),
                put(TreeId::Specs, b"a", b"spec-a"),
                put(TreeId::Progress, b"a", b"progress-a"),
            ],
            // The same id again in the same group: the first job's write counts.
            vec![
                RawOp::Absent(TreeId::Specs, b"a".to_vec()),
                put(TreeId::Specs, b"a", b"spec-a2"),
                put(TreeId::Idem, b"key-1", b"would-be"),
            ],
            vec![
                RawOp::Absent(TreeId::Specs, b"b".to_vec()),
                put(TreeId::Specs, b"b", b"spec-b"),
            ],
        ],
    );
    assert_eq!(ok, [true, false, true]);
    assert_eq!(b.get(TreeId::Specs, b"a").unwrap().unwrap(), b"spec-a");
    assert_eq!(
        b.get(TreeId::Progress, b"a").unwrap().unwrap(),
        b"progress-a"
    );
    assert_eq!(
        b.get(TreeId::Idem, b"key-1").unwrap(),
        None,
        "a rejected job wrote"
    );
    assert_eq!(b.get(TreeId::Specs, b"b").unwrap().unwrap(), b"spec-b");

    // A later group sees the stored key: the job is refused, naming the precondition.
    let r = b
        .apply(vec![vec![
            RawOp::Absent(TreeId::Specs, b"b".to_vec()),
            put(TreeId::Messages, b"b", b"m"),
        ]])
        .unwrap();
    b.sync().unwrap();
    let rej = r[0].clone().unwrap_err();
    assert_eq!((rej.tree, rej.key.as_slice()), (TreeId::Specs, &b"b"[..]));
    assert_eq!(b.get(TreeId::Messages, b"b").unwrap(), None);

    // A job's own later write of a key wins over its earlier one.
    commit(
        b,
        vec![vec![
            put(TreeId::Progress, b"b", b"one"),
            put(TreeId::Progress, b"b", b"two"),
        ]],
    );
    assert_eq!(b.get(TreeId::Progress, b"b").unwrap().unwrap(), b"two");
}

fn indexed_writes_keep_the_index_in_step(b: &dyn Backend) {
    assert_eq!(
        commit(b, vec![vec![indexed(b"t1", Some(b"v1"), true)]]),
        [true]
    );
    assert_eq!(keys(b, TreeId::Due, b"", None), [b"v1t1".to_vec()]);
    assert_eq!(b.get(TreeId::Due, b"v1t1").unwrap().unwrap(), b"v1");
    // A new value: the old index entry goes, the new one comes, in one job.
    commit(b, vec![vec![indexed(b"t1", Some(b"v2"), false)]]);
    assert_eq!(keys(b, TreeId::Due, b"", None), [b"v2t1".to_vec()]);
    assert_eq!(b.get(TreeId::Progress, b"t1").unwrap().unwrap(), b"v2");
    // Rewritten twice in one group, then unchanged: the index follows the last value only.
    commit(
        b,
        vec![
            vec![indexed(b"t1", Some(b"v3"), false)],
            vec![indexed(b"t1", Some(b"v4"), false)],
            vec![indexed(b"t1", Some(b"v4"), false)],
            vec![indexed(b"t2", Some(b"v1"), true)],
        ],
    );
    assert_eq!(
        keys(b, TreeId::Due, b"", None),
        [b"v1t2".to_vec(), b"v4t1".to_vec()]
    );
    // Deleted: the index entry goes too.
    commit(
        b,
        vec![vec![
            indexed(b"t1", None, false),
            indexed(b"t2", None, false),
        ]],
    );
    assert!(keys(b, TreeId::Due, b"", None).is_empty());
    assert_eq!(b.get(TreeId::Progress, b"t1").unwrap(), None);
    // A value not stored (a new task's progress): its index entry only; the next write, in
    // a later group, derives the old value from the source and moves the entry; a value
    // without an entry (finished) removes it.
    assert_eq!(
        commit(
            b,
            vec![vec![
                put(TreeId::Specs, b"t3", b"=v1"),
                indexed_as(b"t3", Some(b"v1"), false, true),
            ]]
        ),
        [true]
    );
    assert_eq!(keys(b, TreeId::Due, b"", None), [b"v1t3".to_vec()]);
    assert_eq!(b.get(TreeId::Progress, b"t3").unwrap(), None);
    commit(b, vec![vec![indexed(b"t3", Some(b"v2"), false)]]);
    assert_eq!(keys(b, TreeId::Due, b"", None), [b"v2t3".to_vec()]);
    assert_eq!(b.get(TreeId::Progress, b"t3").unwrap().unwrap(), b"v2");
    commit(b, vec![vec![indexed(b"t3", Some(b"x"), false)]]);
    assert!(keys(b, TreeId::Due, b"", None).is_empty());
    // The old value known to the writer, derived then stored: the entries it names move.
    commit(
        b,
        vec![vec![
            put(TreeId::Specs, b"k4", b"=v1"),
            indexed_as(b"k4", Some(b"v1"), false, true),
        ]],
    );
    commit(b, vec![vec![indexed_known(b"k4", b"v2", b"v1")]]);
    assert_eq!(keys(b, TreeId::Due, b"", None), [b"v2k4".to_vec()]);
    commit(b, vec![vec![indexed_known(b"k4", b"x", b"v2")]]);
    assert!(keys(b, TreeId::Due, b"", None).is_empty());
    assert_eq!(b.get(TreeId::Progress, b"k4").unwrap().unwrap(), b"x");
    // A derived value written unchanged to be stored (its source rewritten in the same job,
    // a patch's spec) is stored, its index entry kept.
    commit(
        b,
        vec![vec![
            put(TreeId::Specs, b"t5", b"=v6"),
            indexed_as(b"t5", Some(b"v6"), false, true),
        ]],
    );
    commit(
        b,
        vec![vec![
            indexed(b"t5", Some(b"v6"), false),
            put(TreeId::Specs, b"t5", b"no longer derives"),
        ]],
    );
    assert_eq!(b.get(TreeId::Progress, b"t5").unwrap().unwrap(), b"v6");
    assert_eq!(keys(b, TreeId::Due, b"", None), [b"v6t5".to_vec()]);
    commit(
        b,
        vec![vec![
            indexed(b"t5", None, false),
            RawOp::Delete(TreeId::Specs, b"t5".to_vec()),
        ]],
    );
    assert!(keys(b, TreeId::Due, b"", None).is_empty());
    // Unstored, then deleted before anything was stored: the derived entry goes.
    commit(
        b,
        vec![vec![
            put(TreeId::Specs, b"t4", b"=v5"),
            indexed_as(b"t4", Some(b"v5"), false, true),
        ]],
    );
    commit(
        b,
        vec![vec![
            indexed(b"t4", None, false),
            RawOp::Delete(TreeId::Specs, b"t4".to_vec()),
        ]],
    );
    assert!(keys(b, TreeId::Due, b"", None).is_empty());
    commit(
        b,
        vec![vec![
            indexed(b"t3", None, false),
            RawOp::Delete(TreeId::Specs, b"t3".to_vec()),
        ]],
    );
}

fn scans_are_ordered_bounded_and_paged(b: &dyn Backend) {
    // Enough runs to need several pages of any backend that pages, with keys around 0x00 and
    // 0xFF (the prefix ends) and a neighbour task on either side.
    let mut jobs = Vec::new();
    for n in (0..300u32).rev() {
        jobs.push(vec![put(
            TreeId::Runs,
            &run_key(b"task", n),
            &n.to_be_bytes(),
        )]);
    }
    jobs.push(vec![
        put(TreeId::Runs, &run_key(b"tas", u32::MAX), b"before"),
        put(TreeId::Runs, &run_key(b"task\x01", 0), b"after"),
        put(TreeId::Runs, b"task\0\xff\xff\xff\xff\xff", b"longer"),
        put(TreeId::Runs, &run_key(b"\xff\xff", 1), b"ff"),
    ]);
    assert!(commit(b, jobs).iter().all(|ok| *ok));
    let mut prefix = b"task".to_vec();
    prefix.push(0);
    let got = keys(b, TreeId::Runs, &prefix, Some(&prefix));
    let mut want: Vec<Vec<u8>> = (0..300).map(|n| run_key(b"task", n)).collect();
    want.push(b"task\0\xff\xff\xff\xff\xff".to_vec());
    assert_eq!(
        got, want,
        "a prefix scan is exactly the prefix's keys, in order"
    );
    // A start inside the prefix. (Not asked: a start below the prefix with other keys in
    // between. sled's scan stops at the first key outside the prefix, so it answers nothing
    // there; every caller starts at or inside its prefix.)
    let from = run_key(b"task", 250);
    assert_eq!(keys(b, TreeId::Runs, &from, Some(&prefix)), want[250..]);
    // Without a prefix: every key from the start on, in byte order.
    let all = keys(b, TreeId::Runs, b"", None);
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(all, sorted);
    assert_eq!(all.len(), 304);
    assert_eq!(all.first().unwrap(), &run_key(b"tas", u32::MAX));
    assert_eq!(all.last().unwrap(), &run_key(b"\xff\xff", 1));
    assert_eq!(
        keys(b, TreeId::Runs, &run_key(b"task\x01", 0), None).len(),
        2
    );
    assert_eq!(
        keys(b, TreeId::Runs, b"\xff\xff", Some(b"\xff\xff")).len(),
        1
    );
    // A scan that stops early reads what it took.
    let first: Vec<_> = b.scan(TreeId::Runs, b"task", None).take(3).collect();
    assert_eq!(first.len(), 3);
    // Values come with their keys.
    let (k, v) = b
        .scan(TreeId::Runs, &run_key(b"task", 7), Some(&prefix))
        .next()
        .unwrap()
        .unwrap();
    assert_eq!((k, v), (run_key(b"task", 7), 7u32.to_be_bytes().to_vec()));
}

fn deletes_and_last_with_prefix(b: &dyn Backend) {
    let mut prefix = b"task".to_vec();
    prefix.push(0);
    let (k, v) = b.last_with_prefix(TreeId::Runs, &prefix).unwrap().unwrap();
    assert_eq!(
        (k.as_slice(), v.as_slice()),
        (&b"task\0\xff\xff\xff\xff\xff"[..], &b"longer"[..])
    );
    commit(
        b,
        vec![vec![
            RawOp::Delete(TreeId::Runs, b"task\0\xff\xff\xff\xff\xff".to_vec()),
            RawOp::Delete(TreeId::Runs, run_key(b"task", 299)),
            RawOp::Delete(TreeId::Runs, b"never-there".to_vec()),
        ]],
    );
    let (k, _) = b.last_with_prefix(TreeId::Runs, &prefix).unwrap().unwrap();
    assert_eq!(k, run_key(b"task", 298));
    assert_eq!(b.get(TreeId::Runs, &run_key(b"task", 299)).unwrap(), None);
    assert_eq!(b.last_with_prefix(TreeId::Runs, b"nobody").unwrap(), None);
    let (k, _) = b.last_with_prefix(TreeId::Runs, b"").unwrap().unwrap();
    assert_eq!(k, run_key(b"\xff\xff", 1));
    // Deleted then put again in one group: the last write stands.
    commit(
        b,
        vec![
            vec![RawOp::Delete(TreeId::Specs, b"b".to_vec())],
            vec![put(TreeId::Specs, b"b", b"again")],
        ],
    );
    assert_eq!(b.get(TreeId::Specs, b"b").unwrap().unwrap(), b"again");
}

fn atomic_reads_see_one_state(b: &dyn Backend) {
    let got = b
        .get_atomic(&[
            (TreeId::Specs, b"a".to_vec()),
            (TreeId::Progress, b"a".to_vec()),
            (TreeId::Specs, b"missing".to_vec()),
            (TreeId::Specs, b"a".to_vec()),
        ])
        .unwrap();
    assert_eq!(
        got,
        [
            Some(b"spec-a".to_vec()),
            Some(b"progress-a".to_vec()),
            None,
            Some(b"spec-a".to_vec())
        ]
    );
    assert!(b.get_atomic(&[]).unwrap().is_empty());
}

fn everything_committed_survives_reopen(open: Open) {
    let b = open();
    assert_eq!(b.get(TreeId::Specs, b"a").unwrap().unwrap(), b"spec-a");
    assert_eq!(b.get(TreeId::Specs, b"b").unwrap().unwrap(), b"again");
    assert_eq!(b.get(TreeId::Progress, b"b").unwrap().unwrap(), b"two");
    assert_eq!(keys(b.as_ref(), TreeId::Runs, b"", None).len(), 302);
    assert!(keys(b.as_ref(), TreeId::Due, b"", None).is_empty());
    assert_eq!(b.get(TreeId::Idem, b"key-1").unwrap(), None);
}

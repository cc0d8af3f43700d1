//! The vendored sled's `Tree::apply_sorted` (vendor/sled/HERALD.md), the applier's one way
//! into sled: after every series of runs, and after a reopen, the tree holds exactly what a
//! model map holds. Seeded rounds mix new keys in order (one leaf after another, as task ids
//! and due instants arrive), scattered overwrites and removals (a few per leaf, the
//! single-key path), and values large enough that leaves split by size. And a reader scanning
//! during the runs never misses a key they do not touch.

mod common;

use std::collections::BTreeMap;

/// A small deterministic generator (xorshift), so that a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn value(rng: &mut Rng, key: u64, round: u64) -> Vec<u8> {
    // Mostly small values, some past a kilobyte (a leaf of those splits past 16 entries).
    let len = if rng.below(10) == 0 {
        1_000 + rng.below(3_000)
    } else {
        rng.below(200)
    } as usize;
    let mut v = format!("{key}:{round}:").into_bytes();
    v.resize(v.len() + len, b'v');
    v
}

/// Writes `batch` (`None` removes) with `apply_sorted`, `slice` keys per call, and into
/// `model` as well.
fn apply(
    tree: &sled::Tree,
    batch: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    slice: usize,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
) {
    let entries: Vec<(&[u8], Option<&[u8]>)> = batch
        .iter()
        .map(|(k, v)| (k.as_slice(), v.as_deref()))
        .collect();
    for part in entries.chunks(slice.max(1)) {
        tree.apply_sorted(part).expect("apply_sorted");
    }
    for (k, v) in batch {
        match v {
            Some(v) => model.insert(k, v),
            None => model.remove(&k),
        };
    }
}

fn assert_same(tree: &sled::Tree, model: &BTreeMap<Vec<u8>, Vec<u8>>, when: &str) {
    let got: Vec<(Vec<u8>, Vec<u8>)> = tree
        .iter()
        .map(|r| {
            let (k, v) = r.expect("read");
            (k.to_vec(), v.to_vec())
        })
        .collect();
    assert_eq!(got.len(), model.len(), "{when}: key count");
    for ((gk, gv), (mk, mv)) in got.iter().zip(model.iter()) {
        assert_eq!(gk, mk, "{when}: keys differ");
        assert_eq!(gv, mv, "{when}: value of {:?}", String::from_utf8_lossy(gk));
    }
    // Point reads go through the leaves' bounds, not only the iteration order.
    for (k, v) in model.iter().step_by(7) {
        assert_eq!(
            tree.get(k).expect("get").as_deref(),
            Some(v.as_slice()),
            "{when}"
        );
    }
}

#[test]
fn sorted_runs_match_a_model_across_splits_removals_and_a_reopen() {
    for seed in [1u64, 29, 4242] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut next_new = 0u64;
        for round in 0..12u64 {
            // sled's threads let go of the directory a moment after its last handle drops.
            let db = common::herald::reopen(|| sled::open(dir.path()));
            let tree = db.open_tree("t").expect("tree");
            assert_same(
                &tree,
                &model,
                &format!("seed {seed} reopened before round {round}"),
            );
            let mut batch: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
            // New keys in order: long runs into the rightmost leaves.
            for _ in 0..rng.below(3_000) {
                let k = next_new;
                next_new += 1 + rng.below(2);
                batch.insert(
                    format!("k{k:08}").into_bytes(),
                    Some(value(&mut rng, k, round)),
                );
            }
            // Scattered overwrites and removals of older keys, and a cluster of removals.
            if next_new > 0 {
                for _ in 0..rng.below(400) {
                    let k = rng.below(next_new);
                    let v = (rng.below(3) != 0).then(|| value(&mut rng, k, round));
                    batch.insert(format!("k{k:08}").into_bytes(), v);
                }
                let from = rng.below(next_new);
                for k in from..(from + rng.below(300)).min(next_new) {
                    batch.insert(format!("k{k:08}").into_bytes(), None);
                }
            }
            // In slices, as the applier writes them.
            apply(&tree, batch, 1 + rng.below(1_500) as usize, &mut model);
            assert_same(&tree, &model, &format!("seed {seed} after round {round}"));
            db.flush().expect("flush");
        }
        assert!(
            model.len() > 1_000,
            "seed {seed}: the rounds left {} keys",
            model.len()
        );
    }
}

/// The rightmost leaf splits near its end, not in halves (vendor/sled/HERALD.md): keys
/// appended in order one at a time (sled's own insert and split, not a run), drained from the
/// left as due keys are when they fire (leaves emptied and merged), with a shared prefix as
/// due keys have, overwritten now and then, and read back after each round and a reopen.
#[test]
fn a_queue_appended_at_the_right_and_drained_at_the_left_matches_a_model() {
    for seed in [3u64, 77] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let key = |k: u64| {
            let mut v = b"due/".to_vec();
            v.extend_from_slice(&k.to_be_bytes());
            v
        };
        let (mut head, mut tail) = (0u64, 0u64);
        for round in 0..8u64 {
            let db = common::herald::reopen(|| sled::open(dir.path()));
            let tree = db.open_tree("q").expect("tree");
            assert_same(
                &tree,
                &model,
                &format!("seed {seed} reopened before round {round}"),
            );
            for _ in 0..2_000 + rng.below(2_000) {
                let v = value(&mut rng, tail, round);
                tree.insert(key(tail), v.clone()).expect("insert");
                model.insert(key(tail), v);
                tail += 1;
            }
            for _ in 0..rng.below(50) {
                let k = head + rng.below(tail - head);
                let v = value(&mut rng, k, round);
                tree.insert(key(k), v.clone()).expect("overwrite");
                model.insert(key(k), v);
            }
            let drain = rng.below((tail - head) * 3 / 4);
            for k in head..head + drain {
                tree.remove(key(k)).expect("remove");
                model.remove(&key(k));
            }
            head += drain;
            assert_same(&tree, &model, &format!("seed {seed} after round {round}"));
            db.flush().expect("flush");
        }
        assert!(model.len() > 500, "seed {seed}: {} keys left", model.len());
    }
}

/// herald reads sled while the applier writes into it: a reader scanning and looking keys up
/// during the runs never misses a key no run touches, and sees the keys in order.
#[test]
fn readers_during_runs_see_every_untouched_key() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::open(dir.path()).expect("open");
    let tree = db.open_tree("t").expect("tree");
    // The untouched keys: every even number below 8 000.
    let stable: Vec<Vec<u8>> = (0..8_000u64)
        .step_by(2)
        .map(|k| format!("k{k:08}").into_bytes())
        .collect();
    let entries: Vec<(&[u8], Option<&[u8]>)> = stable
        .iter()
        .map(|k| (k.as_slice(), Some(&b"stable"[..])))
        .collect();
    tree.apply_sorted(&entries).expect("seed the stable keys");
    let done = Arc::new(AtomicBool::new(false));
    let scans = Arc::new(AtomicU64::new(0));
    let reader = {
        let (tree, done, scans, stable) =
            (tree.clone(), done.clone(), scans.clone(), stable.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(7);
            // Bounded: stops when the writer is done, or after 100 000 rounds at most.
            for _ in 0..100_000 {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                let mut last: Option<Vec<u8>> = None;
                let mut seen = 0usize;
                for r in tree.iter() {
                    let (k, v) = r.expect("scan");
                    if let Some(l) = &last {
                        assert!(k.as_ref() > l.as_slice(), "keys out of order");
                    }
                    if v.as_ref() == b"stable" {
                        seen += 1;
                    }
                    last = Some(k.to_vec());
                }
                assert_eq!(seen, stable.len(), "a scan missed an untouched key");
                for _ in 0..50 {
                    let k = &stable[rng.below(stable.len() as u64) as usize];
                    assert!(
                        tree.get(k).expect("get").is_some(),
                        "a lookup missed an untouched key"
                    );
                }
                scans.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // The writer: rounds of odd keys put and removed in runs, leaves splitting as they fill.
    // It starts once the reader has scanned, and goes on (at least 40 rounds, at most 2 000)
    // until three more scans have run during its writes, however fast either side is.
    let mut rng = Rng(11);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = stable
        .iter()
        .map(|k| (k.clone(), b"stable".to_vec()))
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while scans.load(Ordering::Relaxed) == 0 && !reader.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the reader never scanned"
        );
        std::thread::yield_now();
    }
    let before = scans.load(Ordering::Relaxed);
    for round in 0..2_000u64 {
        if round >= 40 && scans.load(Ordering::Relaxed) >= before + 3 {
            break;
        }
        let mut batch: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let from = rng.below(7_000) | 1;
        for k in (from..from + 1_000).step_by(2) {
            let v = (rng.below(4) != 0).then(|| value(&mut rng, k, round));
            batch.insert(format!("k{k:08}").into_bytes(), v);
        }
        apply(&tree, batch, usize::MAX, &mut model);
    }
    let during = scans.load(Ordering::Relaxed) - before;
    done.store(true, Ordering::Relaxed);
    reader.join().expect("the reader saw every untouched key");
    assert!(during >= 3, "only {during} scans ran during the writes");
    assert_same(&tree, &model, "after the concurrent rounds");
}

/// Keys of every length, some the prefixes of others (a leaf stores its keys after the
/// prefix its bounds share), empty values, and values of 8–24 KiB (a leaf of those splits
/// past 16 entries by bytes, and a run stops growing it there): the tree still holds what
/// the model holds, through removals and a reopen before every round.
#[test]
fn keys_of_any_length_empty_and_large_values_match_a_model() {
    for seed in [3u64, 77] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for round in 0..6u64 {
            let db = common::herald::reopen(|| sled::open(dir.path()));
            let tree = db.open_tree("t").expect("tree");
            assert_same(
                &tree,
                &model,
                &format!("seed {seed} reopened before round {round}"),
            );
            let mut batch: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
            for _ in 0..rng.below(1_500) {
                // "k7", "k70", "k700", "k7000": no padding, so keys nest as prefixes; some
                // with one more byte past the number.
                let mut k = format!("k{}", rng.below(20_000)).into_bytes();
                if rng.below(5) == 0 {
                    k.push(rng.below(256) as u8);
                }
                let v = match rng.below(10) {
                    0 => None,
                    1 | 2 => Some(Vec::new()),
                    3 => Some(vec![b'L'; 8_192 + rng.below(16_384) as usize]),
                    _ => Some(value(&mut rng, 0, round)),
                };
                batch.insert(k, v);
            }
            apply(&tree, batch, 1 + rng.below(600) as usize, &mut model);
            assert_same(&tree, &model, &format!("seed {seed} after round {round}"));
            db.flush().expect("flush");
        }
        assert!(
            model.len() > 1_000,
            "seed {seed}: the rounds left {} keys",
            model.len()
        );
    }
}

/// Keys out of order, or one key twice, are refused before anything is written.
#[test]
fn keys_not_strictly_ascending_are_refused_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::open(dir.path()).expect("open");
    let tree = db.open_tree("t").expect("tree");
    let keys: Vec<Vec<u8>> = (0..40u64)
        .map(|k| format!("k{k:08}").into_bytes())
        .collect();
    let mut entries: Vec<(&[u8], Option<&[u8]>)> = keys
        .iter()
        .map(|k| (k.as_slice(), Some(&b"v"[..])))
        .collect();
    entries.swap(20, 21);
    assert!(tree.apply_sorted(&entries).is_err(), "out of order");
    entries.swap(20, 21);
    entries[21] = entries[20];
    assert!(tree.apply_sorted(&entries).is_err(), "a key twice");
    assert_eq!(tree.len(), 0, "nothing written");
    entries.remove(21);
    tree.apply_sorted(&entries).expect("strictly ascending");
    assert_eq!(tree.len(), 39);
}

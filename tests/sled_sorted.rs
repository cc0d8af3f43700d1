//! The vendored sled's `Tree::apply_sorted` (vendor/sled/HERALD.md), the applier's one way
//! into sled: after every series of runs, and after a reopen, the tree holds exactly what a
//! model map holds. Seeded rounds mix new keys in order (one leaf after another, as task ids
//! and due instants arrive), scattered overwrites and removals (a few per leaf, the
//! single-key path), and values large enough that leaves split by size.

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
            let db = sled::open(dir.path()).expect("open");
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
            let entries: Vec<(&[u8], Option<&[u8]>)> = batch
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_deref()))
                .collect();
            // In slices, as the applier writes them.
            for part in entries.chunks(1 + rng.below(1_500) as usize) {
                tree.apply_sorted(part).expect("apply_sorted");
            }
            for (k, v) in batch {
                match v {
                    Some(v) => model.insert(k, v),
                    None => model.remove(&k),
                };
            }
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

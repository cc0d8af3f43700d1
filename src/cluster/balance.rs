//! Which shards a node takes and which it hands over (HA.md "Balancing"). Pure.
//!
//! Each node aims at `ceil(S / live nodes)` shards. It takes only free or expired shards
//! (never one another node holds), starting at a point of its own on the ring so that nodes
//! starting together do not all race for shard 0, and hands surplus over one shard per round
//! (gracefully: drained, settled, released), so a new node's arrival moves shards gradually.

/// The share of shards each of `live_nodes` aims at.
pub fn target(shards: u32, live_nodes: usize) -> u32 {
    let n = u32::try_from(live_nodes.max(1)).unwrap_or(u32::MAX);
    shards.div_ceil(n)
}

/// What one balancing round does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Free or expired shards to try to acquire (each in its own fenced transaction).
    pub acquire: Vec<u32>,
    /// An owned shard to hand over.
    pub release: Option<u32>,
}

/// A round for a node owning `mine`, with `takeable` shards free or expired now. `start`:
/// the node's own point on the ring (e.g. a hash of its id mod S).
pub fn round(shards: u32, live_nodes: usize, mine: &[u32], takeable: &[u32], start: u32) -> Round {
    let goal = target(shards, live_nodes) as usize;
    if mine.len() > goal {
        // The surplus shard furthest from our start goes first (stable across rounds).
        let release = mine
            .iter()
            .copied()
            .max_by_key(|s| ring_distance(shards, start, *s));
        return Round {
            acquire: Vec::new(),
            release,
        };
    }
    let mut candidates: Vec<u32> = takeable
        .iter()
        .copied()
        .filter(|s| *s < shards && !mine.contains(s))
        .collect();
    candidates.sort_by_key(|s| ring_distance(shards, start, *s));
    candidates.dedup();
    candidates.truncate(goal - mine.len());
    Round {
        acquire: candidates,
        release: None,
    }
}

/// How far `s` lies after `start` on the ring of `shards`.
fn ring_distance(shards: u32, start: u32, s: u32) -> u32 {
    if shards == 0 {
        return 0;
    }
    (s + shards - start % shards) % shards
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_a_ceiling_share() {
        assert_eq!(target(64, 1), 64);
        assert_eq!(target(64, 3), 22);
        assert_eq!(target(64, 0), 64, "no live node known: this one takes all");
        assert_eq!(target(64, 100), 1);
    }

    #[test]
    fn a_node_takes_free_shards_up_to_its_share_from_its_own_start() {
        let free: Vec<u32> = (0..64).collect();
        let r = round(64, 3, &[], &free, 60);
        assert_eq!(r.acquire.len(), 22);
        assert_eq!(&r.acquire[..5], &[60, 61, 62, 63, 0]);
        assert_eq!(r.release, None);
        // Already at its share: takes nothing, even with shards free.
        let mine: Vec<u32> = (0..22).collect();
        assert_eq!(round(64, 3, &mine, &free, 0), Round::default());
    }

    #[test]
    fn a_node_over_its_share_hands_one_shard_over_per_round() {
        let mine: Vec<u32> = (0..64).collect();
        // A second node joined: 32 each; one shard per round leaves, the furthest first.
        let r = round(64, 2, &mine, &[], 10);
        assert_eq!(
            r,
            Round {
                acquire: vec![],
                release: Some(9)
            }
        );
    }

    #[test]
    fn held_and_unknown_shards_are_never_taken() {
        let r = round(8, 1, &[1, 2], &[2, 3, 99], 0);
        assert_eq!(r.acquire, [3]);
    }
}

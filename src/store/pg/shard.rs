//! Which shard a row belongs to: `shard = fnv1a64(task id) mod S`, the task id taken from the
//! row's key (and, for an idempotency key, from its value). Pure.
//!
//! Why FNV-1a (64-bit, offset basis 0xcbf29ce484222325, prime 0x100000001b3): it is fixed by
//! its definition, so every process, build and platform computes the same shard for a task,
//! which the cluster's ownership depends on (Rust's `Hash` is not stable across releases).
//! All rows of one task share its shard, so a commit group touching one task writes one shard.

use std::borrow::Cow;

use crate::store::backend::TreeId;
use crate::store::codec::decode;
use crate::store::IdemRecord;

/// FNV-1a over `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The task id a row of `tree` belongs to, from its key (and value, for idempotency keys).
/// A key that does not have its tree's shape answers the whole key: any stable choice will do,
/// as long as it never fails.
pub fn task_id_of<'a>(tree: TreeId, key: &'a [u8], value: Option<&[u8]>) -> Cow<'a, [u8]> {
    if tree == TreeId::Idem {
        // The client's key names no task; the record it holds does. A deletion has no value,
        // and the shard column of a row being deleted is never read.
        return match value.and_then(|v| decode::<IdemRecord>("idempotency", key, v).ok()) {
            Some(rec) => Cow::Owned(rec.task_id.into_bytes()),
            None => Cow::Borrowed(key),
        };
    }
    Cow::Borrowed(match tree {
        TreeId::Specs | TreeId::Progress | TreeId::Live => key,
        // `id ‖ 0x00 ‖ n`: ids never contain 0x00.
        TreeId::Messages | TreeId::Runs | TreeId::Active | TreeId::Timeline => {
            key.split(|b| *b == 0).next().unwrap_or(key)
        }
        // `class ‖ u64 ‖ id` (`records::due_key`).
        TreeId::Due => key.get(9..).unwrap_or(key),
        // `id:run:seq` (`model::delivery_key`); the id itself may hold ':'.
        TreeId::Failures => {
            let mut parts = key.rsplitn(3, |b| *b == b':');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(_), Some(_), Some(id)) => id,
                _ => key,
            }
        }
        TreeId::Idem => key,
    })
}

/// The shard of a row, given `shards` (S, at least 1).
pub fn shard_of(tree: TreeId, key: &[u8], value: Option<&[u8]>, shards: u32) -> i32 {
    let s = u64::from(shards.max(1));
    // S fits in i32 (schema.rs bounds it), so the remainder does too.
    i32::try_from(fnv1a64(&task_id_of(tree, key, value)) % s).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::codec::encode;

    #[test]
    fn fnv_matches_its_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn every_row_of_a_task_is_in_the_tasks_shard() {
        let id = b"task:with:colons";
        let s = |t, k: &[u8], v: Option<&[u8]>| shard_of(t, k, v, 64);
        let own = s(TreeId::Specs, id, None);
        assert_eq!(s(TreeId::Progress, id, None), own);
        assert_eq!(s(TreeId::Live, id, None), own);
        let mut run = id.to_vec();
        run.extend_from_slice(&[0, 0, 0, 0, 7]);
        assert_eq!(s(TreeId::Runs, &run, None), own);
        assert_eq!(s(TreeId::Messages, &run, None), own);
        assert_eq!(s(TreeId::Active, &run, None), own);
        let mut due = vec![1];
        due.extend_from_slice(&42u64.to_be_bytes());
        due.extend_from_slice(id);
        assert_eq!(s(TreeId::Due, &due, None), own);
        assert_eq!(s(TreeId::Failures, b"task:with:colons:3:0", None), own);
        let rec = encode(&IdemRecord {
            task_id: "task:with:colons".into(),
            body_sha256: [0; 32],
        })
        .unwrap();
        assert_eq!(s(TreeId::Idem, b"client-key", Some(&rec)), own);
    }

    #[test]
    fn odd_keys_still_get_a_shard() {
        for k in [&b""[..], b"\0", b"no-colons", b"\x02short"] {
            for t in TreeId::ALL {
                assert!((0..64).contains(&shard_of(t, k, Some(b"junk"), 64)));
            }
        }
        assert_eq!(shard_of(TreeId::Specs, b"x", None, 0), 0);
    }
}

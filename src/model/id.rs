//! Task ids: 1–128 characters of `[A-Za-z0-9._:-]`, chosen by the client or made by herald.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub const ID_MAX_LEN: usize = 128;

/// Failure ids are `{task id}:{run}:{seq}`: a task id of up to 128 characters plus two numbers.
pub const FAILURE_ID_LEN_MAX: usize = ID_MAX_LEN + 22;

/// Checks an id; the error says what is wrong with it.
pub fn check_id(id: &str) -> Result<(), String> {
    check_id_len(id, ID_MAX_LEN)
}

/// Checks an id of the same alphabet with another length limit (failure ids are a task id
/// plus `:{run}:{seq}`).
pub fn check_id_len(id: &str, max_len: usize) -> Result<(), String> {
    if id.is_empty() {
        return Err("must not be empty".into());
    }
    if id.len() > max_len {
        return Err(format!(
            "must be at most {max_len} characters, got {}",
            id.len()
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(format!(
            "character {c:?} is not allowed (use A-Z a-z 0-9 . _ : -)"
        ));
    }
    Ok(())
}

/// A new time-ordered id: 12 hex digits of Unix milliseconds, then 8 hex digits of a counter
/// that starts at a random value per process. Ids made later sort later (lists are ordered by
/// id), and two processes are unlikely to collide; a collision is caught as a 409-style conflict
/// by the store, never an overwrite.
pub fn new_id(now_ms: u64) -> String {
    static COUNTER: OnceLock<AtomicU64> = OnceLock::new();
    let counter = COUNTER.get_or_init(|| {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(now_ms);
        AtomicU64::new(h.finish())
    });
    let n = counter.fetch_add(1, Ordering::Relaxed) as u32;
    format!("{:012x}{:08x}", now_ms & 0xffff_ffff_ffff, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_alphabet() {
        assert!(check_id("morning-digest_2026.12:01").is_ok());
        assert!(check_id(&"a".repeat(128)).is_ok());
    }

    #[test]
    fn rejects_bad_ids() {
        assert!(check_id("").is_err());
        assert!(check_id(&"a".repeat(129)).is_err());
        assert!(check_id("a/b").is_err());
        assert!(check_id("a b").is_err());
        assert!(check_id("é").is_err());
    }

    #[test]
    fn generated_ids_are_valid_unique_and_time_ordered() {
        let a = new_id(1_000);
        let b = new_id(1_000);
        let c = new_id(2_000);
        assert!(check_id(&a).is_ok());
        assert_ne!(a, b);
        assert!(c > a && c > b);
        assert_eq!(a.len(), 20);
    }
}

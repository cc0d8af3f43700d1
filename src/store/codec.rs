//! Versioned record encoding: one format-version byte, then bincode (standard config).
//!
//! Decoding never panics. A record that is too short, has an unknown version or does not decode
//! is an error naming the tree and key, so the caller can report it and keep serving the rest.
//! A byte limit stops a corrupt length prefix from allocating gigabytes.

use serde::{de::DeserializeOwned, Serialize};

use super::StoreError;

/// Version of the record layout written by this build.
pub const FORMAT_VERSION: u8 = 1;
// (Each record carries this byte; the data-directory layout has its own number, `DIR_FORMAT`.)

/// Largest record we will decode (a task with 10 000 messages fits well within it).
const DECODE_LIMIT_BYTES: usize = 64 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT_BYTES>()
}

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    // One buffer: the version byte, then bincode straight after it (most records of a create
    // fit in the first allocation; encoding to a second vector and copying cost a create
    // ~5 allocations and copies).
    let mut out = Vec::with_capacity(ENCODE_CAPACITY);
    out.push(FORMAT_VERSION);
    bincode::serde::encode_into_std_write(value, &mut out, config())
        .map_err(|e| StoreError::Encode(e.to_string()))?;
    Ok(out)
}

/// First allocation of an encoded record: a spec of one message and a short body, a progress
/// or a live record fit.
const ENCODE_CAPACITY: usize = 160;

pub fn decode<T: DeserializeOwned>(tree: &str, key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        tree: tree.to_string(),
        key: String::from_utf8_lossy(key).into_owned(),
        detail,
    };
    let Some((&version, body)) = bytes.split_first() else {
        return Err(corrupt("empty record".into()));
    };
    if version != FORMAT_VERSION {
        return Err(corrupt(format!(
            "record format version {version}, this build reads {FORMAT_VERSION}"
        )));
    }
    let (value, used) = bincode::serde::decode_from_slice::<T, _>(body, config())
        .map_err(|e| corrupt(e.to_string()))?;
    if used != body.len() {
        return Err(corrupt(format!(
            "{} trailing bytes after the record",
            body.len() - used
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Run;

    #[test]
    fn round_trip() {
        let r = Run::new(3, 10, 20, 7);
        let bytes = encode(&r).unwrap();
        assert_eq!(bytes[0], FORMAT_VERSION);
        let back: Run = decode("runs", b"k", &bytes).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn corruption_is_an_error_naming_the_key() {
        let r = Run::new(3, 10, 20, 7);
        let mut bytes = encode(&r).unwrap();
        for bad in [
            vec![],
            vec![9, 1, 2],
            bytes[..bytes.len() - 1].to_vec(),
            [bytes.clone(), vec![0]].concat(),
        ] {
            match decode::<Run>("runs", b"task-1", &bad) {
                Err(StoreError::Corrupt { key, tree, .. }) => {
                    assert_eq!(key, "task-1");
                    assert_eq!(tree, "runs");
                }
                other => panic!("expected corrupt, got {other:?}"),
            }
        }
        // A huge length prefix must not allocate or panic.
        bytes.truncate(1);
        bytes.extend_from_slice(&[0xff; 12]);
        assert!(decode::<crate::model::Task>("tasks", b"x", &bytes).is_err());
    }
}

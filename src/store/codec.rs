//! Versioned record encoding: one format-version byte, then bincode (standard config) of the
//! value's frozen on-disk type ([`Stored::Disk`], `store/records/`).
//!
//! Only [`Stored`] values are encoded: a model type is converted to its frozen type first, so
//! a change to the model never changes the bytes by accident (bincode is not self-describing:
//! a field added to a type changes what every old record must hold). A new shape of a family
//! is a new frozen type written with the next version byte ([`Stored::VERSION`]); its decode
//! then reads the older bytes too, by their byte.
//!
//! Decoding never panics. A record that is too short, has an unknown version or does not decode
//! is an error naming the tree and key, so the caller can report it and keep serving the rest.
//! A byte limit stops a corrupt length prefix from allocating gigabytes.

use std::borrow::Cow;

use serde::{de::DeserializeOwned, Serialize};

use super::StoreError;

/// A value the store writes, and the frozen type its bytes are (`store/records/`). The
/// conversions live in `store/records/convert.rs`; a frozen type is its own `Disk`.
pub trait Stored: Sized {
    /// The on-disk shape: never changed once released.
    type Disk: Serialize + DeserializeOwned + Clone;
    /// The version byte written before it (and the only one read, until a family has two).
    const VERSION: u8 = FORMAT_VERSION;
    fn to_disk(&self) -> Cow<'_, Self::Disk>;
    fn from_disk(disk: Self::Disk) -> Self;
    /// A record of this family written with an older version byte: its body decoded (with
    /// [`decode_body`]) into the older frozen type and converted. `None`: no such version.
    /// The spec and the progress record read their version 1 this way (format 7 wrote 2).
    fn from_older(_version: u8, _body: &[u8]) -> Option<Result<Self, String>> {
        None
    }
    /// The older version this value is written in instead of [`Self::VERSION`], when that
    /// shape holds all of it (nothing only the newer shape has is set): its version byte and
    /// body, written into `out` with [`encode_body`]. So a family whose new shape carries
    /// something few records have (a recipient-time slot's wall) keeps every other record's
    /// bytes, which older builds read. `None` (the default): written as [`Self::VERSION`].
    fn encode_older(&self, _out: &mut Vec<u8>) -> Option<Result<(), StoreError>> {
        None
    }
    /// The decoded value given what its key says, for a family that does not store it again
    /// in its value (a format-7 spec's id). The default keeps the value as decoded.
    fn with_key(self, _key: &[u8]) -> Self {
        self
    }
}

/// A record of version byte `version` and body `disk` into `out` (for
/// [`Stored::encode_older`]). A body the decoder would refuse ([`DECODE_LIMIT_BYTES`]) is
/// an error, and nothing is written: stored, it would be acknowledged and then answer
/// "corrupt" at every read.
pub fn encode_body<D: Serialize + DeserializeOwned>(
    version: u8,
    disk: &D,
    out: &mut Vec<u8>,
) -> Result<(), StoreError> {
    let start = out.len();
    out.push(version);
    let written = bincode::serde::encode_into_std_write(disk, out, config())
        .map_err(|e| StoreError::Encode(e.to_string()))
        .and_then(|_| readable::<D>(out.get(start + 1..).unwrap_or_default()));
    if written.is_err() {
        out.truncate(start);
    }
    written
}

/// Whether a body just encoded decodes within the limit. The limit counts what decoding
/// allocates, not the bytes read: an integer counts its width (8 for a `u64` of one byte on
/// disk), a string or list its length prefix as 8 and its elements. No frozen type holds a
/// 16-byte integer, so a body counts at most 8 times its length, and one of up to an eighth
/// of the limit always decodes: only a larger one (a message of megabytes; rare) is decoded
/// here once to find out.
fn readable<D: DeserializeOwned>(body: &[u8]) -> Result<(), StoreError> {
    if body.len() <= DECODE_LIMIT_BYTES / 8 {
        return Ok(());
    }
    let too_big = || {
        StoreError::Encode(format!(
            "a record of {} bytes is larger than one can be read back (at most {} MiB, counted as decoded)",
            body.len(),
            DECODE_LIMIT_BYTES >> 20
        ))
    };
    // Decoded even when longer than the limit (an integer of 9 bytes on disk counts 8): the
    // decoder is the judge, and it stops at the limit (a string counts its length first).
    match bincode::serde::decode_from_slice::<D, _>(body, config()) {
        Ok(_) => Ok(()),
        Err(bincode::error::DecodeError::LimitExceeded) => Err(too_big()),
        Err(e) => Err(StoreError::Encode(format!(
            "a record just encoded does not decode: {e}"
        ))),
    }
}

/// The body of a record (after its version byte) as `T`, every byte used.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let (value, used) =
        bincode::serde::decode_from_slice::<T, _>(body, config()).map_err(|e| e.to_string())?;
    if used != body.len() {
        return Err(format!(
            "{} trailing bytes after the record",
            body.len() - used
        ));
    }
    Ok(value)
}

/// Version of the record layout written by this build.
pub const FORMAT_VERSION: u8 = 1;
// (Each record carries this byte; the data-directory layout has its own number, `DIR_FORMAT`.)

/// Largest record we will decode (a task with 10 000 messages fits well within it: each
/// message is a record of its own). [`encode`] refuses a record past it, and the config caps
/// `[limits] message_body_bytes_max` well below it (a task's only message is stored inside
/// its spec: `config.rs`, `MESSAGE_BODY_BYTES_STORABLE`).
pub const DECODE_LIMIT_BYTES: usize = 64 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT_BYTES>()
}

pub fn encode<T: Stored>(value: &T) -> Result<Vec<u8>, StoreError> {
    // Encoded into a reused buffer, then copied into an exact-sized one: the record lives on
    // in the memtable, which counts its length, not its capacity. (Encoding to a vector of its
    // own and copying that behind the version byte cost two growing allocations per record.)
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|scratch| {
        let mut buf = scratch.borrow_mut();
        buf.clear();
        let written = match value.encode_older(&mut buf) {
            Some(older) => older,
            None => encode_body(T::VERSION, &*value.to_disk(), &mut buf),
        };
        let out = written.map(|()| buf.as_slice().to_vec());
        // A huge record (a task of 10 000 messages, or one refused as too big) does not keep
        // its buffer for good.
        if buf.capacity() > SCRATCH_KEEP {
            *buf = Vec::new();
        }
        out
    })
}

/// Largest scratch buffer a thread keeps between records.
const SCRATCH_KEEP: usize = 64 << 10;

pub fn decode<T: Stored>(tree: &str, key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        tree: tree.to_string(),
        key: String::from_utf8_lossy(key).into_owned(),
        detail,
    };
    let Some((&version, body)) = bytes.split_first() else {
        return Err(corrupt("empty record".into()));
    };
    if version == T::VERSION {
        return decode_body::<T::Disk>(body)
            .map(|d| T::from_disk(d).with_key(key))
            .map_err(corrupt);
    }
    match T::from_older(version, body) {
        Some(r) => r.map(|v| v.with_key(key)).map_err(corrupt),
        None => Err(corrupt(format!(
            "record format version {version}, this build reads {}",
            T::VERSION
        ))),
    }
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

    /// A family's second shape: written with byte 2, and its decode still reads byte 1.
    #[derive(Debug, PartialEq)]
    struct Grown {
        a: u32,
        b: String,
    }
    #[derive(serde::Serialize, serde::Deserialize, Clone)]
    struct GrownV1 {
        a: u32,
    }
    #[derive(serde::Serialize, serde::Deserialize, Clone)]
    struct GrownV2 {
        a: u32,
        b: String,
    }
    impl Stored for Grown {
        type Disk = GrownV2;
        const VERSION: u8 = 2;
        fn to_disk(&self) -> Cow<'_, GrownV2> {
            Cow::Owned(GrownV2 {
                a: self.a,
                b: self.b.clone(),
            })
        }
        fn from_disk(d: GrownV2) -> Grown {
            Grown { a: d.a, b: d.b }
        }
        fn from_older(version: u8, body: &[u8]) -> Option<Result<Grown, String>> {
            (version == 1).then(|| {
                decode_body::<GrownV1>(body).map(|d| Grown {
                    a: d.a,
                    b: "default".into(),
                })
            })
        }
    }

    #[test]
    fn a_new_version_is_written_with_its_byte_and_old_records_still_read() {
        let mut old = vec![1];
        old.extend(bincode::serde::encode_to_vec(GrownV1 { a: 7 }, config()).unwrap());
        let want = Grown {
            a: 7,
            b: "default".into(),
        };
        assert_eq!(decode::<Grown>("t", b"k", &old).unwrap(), want);
        let new = encode(&want).unwrap();
        assert_eq!(new[0], 2);
        assert_eq!(decode::<Grown>("t", b"k", &new).unwrap(), want);
        assert!(decode::<Grown>("t", b"k", &[3, 7]).is_err());
        assert!(decode::<Grown>("t", b"k", &[old.clone(), vec![0]].concat()).is_err());
    }

    /// A value whose frozen type is a list of small integers: one byte each on disk, eight
    /// each to the decoder's limit (bincode counts what decoding allocates).
    #[derive(Debug, PartialEq)]
    struct Counts(Vec<u64>);
    impl Stored for Counts {
        type Disk = Vec<u64>;
        fn to_disk(&self) -> Cow<'_, Vec<u64>> {
            Cow::Borrowed(&self.0)
        }
        fn from_disk(d: Vec<u64>) -> Counts {
            Counts(d)
        }
    }

    /// A record the decoder would refuse is refused when it is written: otherwise the write
    /// is acknowledged and its key answers "corrupt" for good.
    #[test]
    fn a_record_too_big_to_read_back_is_refused_when_written() {
        let message = |body_bytes: usize| crate::model::Message {
            to: "r".into(),
            body: "a".repeat(body_bytes),
            data: None,
            tz: None,
        };
        match encode(&message(DECODE_LIMIT_BYTES + 1)) {
            Err(StoreError::Encode(e)) => assert!(e.contains("at most"), "{e}"),
            other => panic!("expected an encode error, got {:?}", other.map(|b| b.len())),
        }
        // Just under the limit: written, and read back.
        let fits = message(DECODE_LIMIT_BYTES - 1024);
        let bytes = encode(&fits).unwrap();
        let back: crate::model::Message = decode("messages", b"k", &bytes).unwrap();
        assert_eq!(back, fits);
        // Small on disk (9 MiB), too big to read (72 MiB counted): refused as well.
        let dense = Counts(vec![0; 9 << 20]);
        assert!(decode::<Counts>("t", b"k", &{
            let mut b = vec![FORMAT_VERSION];
            b.extend(bincode::serde::encode_to_vec(&dense.0, config()).unwrap());
            b
        })
        .is_err());
        assert!(matches!(encode(&dense), Err(StoreError::Encode(_))));
        // Through an older version's body as well (`Stored::encode_older`).
        let mut out = Vec::new();
        assert!(matches!(
            encode_body(1, &dense.0, &mut out),
            Err(StoreError::Encode(_))
        ));
        // Dense but within the limit: written.
        assert!(encode(&Counts(vec![0; 1 << 20])).is_ok());
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
        assert!(decode::<crate::store::records::SpecRecord>("specs", b"x", &bytes).is_err());
    }
}

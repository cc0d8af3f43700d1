//! herald's life sign in a data directory ([`super::super::Backend::stamp_alive`]): the file
//! `alive`, the wall instant (ms, 8 bytes little-endian) of the last stamp. A hint, not data:
//! written in place with no sync, never through the log. A stamp lost (a power cut, a full
//! disk) or a file that does not read back as 8 bytes only makes the next start judge a
//! longer outage, as it did before the file existed.

use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::store::StoreError;

const FILE: &str = "alive";

/// The last stamp, `None` when there is none that reads back whole.
pub fn read(dir: &Path) -> Result<Option<u64>, StoreError> {
    match std::fs::read(dir.join(FILE)) {
        Ok(bytes) => Ok(<[u8; 8]>::try_from(bytes.as_slice())
            .ok()
            .map(u64::from_le_bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::Io(e)),
    }
}

/// Overwrites the stamp in place: after the first stamp no block is allocated, so a full disk
/// does not refuse it (and a refusal only keeps the previous stamp).
pub fn write(dir: &Path, ms: u64) -> Result<(), StoreError> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(FILE))?;
    f.write_all_at(&ms.to_le_bytes(), 0)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_reads_back_and_a_torn_one_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        write(dir.path(), 1_700_000_000_123).unwrap();
        write(dir.path(), 1_700_000_001_456).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(1_700_000_001_456));
        std::fs::write(dir.path().join(FILE), [1, 2, 3]).unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
    }
}

//! Free space on the data directory's filesystem, and the two reserves herald keeps there.
//!
//! Why: sled 0.34 remembers an I/O error for good, and after an `ENOSPC` inside it closing the
//! old handle can block forever (its drop flushes and waits for a write that never comes). So
//! herald keeps sled from ever meeting a full disk of its own making:
//! - a group is refused ([`StoreError::DiskFull`], so 503 and `storage_failing`) once free space
//!   is under [`WRITE_RESERVE`]; nothing new goes into the write-ahead log;
//! - the applier writes a memtable layer into sled only while at least [`APPLY_RESERVE`] plus
//!   twice the layer is free, and otherwise waits with the layer in memory (it is in the log).
//!
//! The write reserve is the larger, so the applier still has room for the small layers the
//! log holds when writes stop (up to 12 MiB: a layer freezes at 4 MiB, and grows beyond only
//! while the applier lags). A bigger one, up to the memtable's bound (64 MiB, so 136 MiB free),
//! waits in memory while the disk is that full: writes then reach the memtable's bound and are
//! refused as on a full disk (`wait_for_room`), and go on once space is freed. A disk filled by someone else can still take sled's room mid-write;
//! that path is `SledBackend::recover` (reopen, never under a lock). When space comes back both
//! resume by themselves: the commit thread's probe (`store/commit.rs`) clears the failure.

use std::path::Path;

use super::StoreError;

/// Below this much free space no group is written.
pub const WRITE_RESERVE: u64 = 32 << 20;
/// The applier leaves at least this much free space, beyond twice the layer it writes.
pub const APPLY_RESERVE: u64 = 8 << 20;

/// Bytes an unprivileged writer may still use on the filesystem that holds `dir`, or `None`
/// when the system cannot say (then herald does not hold back: it has no number to go by).
pub fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `path` is a valid NUL-terminated string and `st` a properly sized out-parameter
    // that statvfs fills in; both outlive the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    if r != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// How long a reading of free space is used for a group before it is taken again: a statvfs
/// per group would cost the commit thread a syscall each, and in 10 ms the log cannot grow by
/// anything near [`WRITE_RESERVE`].
pub const READ_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// The commit thread's last reading of free space (taken alone: no other lock is held with it).
#[derive(Default)]
pub struct Gauge {
    last: parking_lot::Mutex<Option<(std::time::Instant, Option<u64>)>>,
}

impl Gauge {
    /// Free bytes on `dir`'s filesystem, read at most every [`READ_EVERY`].
    pub fn free(&self, dir: &Path) -> Option<u64> {
        let mut last = self.last.lock();
        match *last {
            Some((at, free)) if at.elapsed() < READ_EVERY => free,
            _ => {
                let free = free_bytes(dir);
                *last = Some((std::time::Instant::now(), free));
                free
            }
        }
    }
}

/// Whether a group may be written with `free` bytes free (pure).
pub fn may_write(free: Option<u64>) -> bool {
    free.is_none_or(|f| f >= WRITE_RESERVE)
}

/// Whether a layer of `layer_bytes` may be written into sled with `free` bytes free (pure).
pub fn may_apply(free: Option<u64>, layer_bytes: usize) -> bool {
    let need = APPLY_RESERVE.saturating_add((layer_bytes as u64).saturating_mul(2));
    free.is_none_or(|f| f >= need)
}

/// The error a refused group answers.
pub fn full(dir: &Path, free: u64, reserve: u64) -> StoreError {
    StoreError::DiskFull {
        dir: dir.display().to_string(),
        free_mib: free >> 20,
        reserve_mib: reserve >> 20,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_decide_at_their_bounds() {
        assert!(may_write(None));
        assert!(may_write(Some(WRITE_RESERVE)));
        assert!(!may_write(Some(WRITE_RESERVE - 1)));
        let layer = 4 << 20;
        let need = APPLY_RESERVE + 2 * layer as u64;
        assert!(may_apply(Some(need), layer));
        assert!(!may_apply(Some(need - 1), layer));
        assert!(may_apply(None, usize::MAX));
        // Writes stop first: with writes just refused, a normal layer still goes into sled.
        assert!(may_apply(Some(WRITE_RESERVE - 1), 4 << 20));
    }

    #[test]
    fn free_bytes_reads_a_real_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).is_some());
        assert_eq!(free_bytes(&dir.path().join("no/such/dir")), None);
    }
}

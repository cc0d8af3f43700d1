//! The write-ahead log in front of sled: what makes a group of writes durable.
//!
//! Why: sled 0.34 does ~60 000 transactional puts/s on this machine (~105 000 with mimalloc),
//! and a `flush()` per group on top; every step of every task paid both. Now the commit
//! thread resolves a group into plain writes (`Write`: put or delete, values known), appends
//! them to the log as one record, `fdatasync`s the log once, and only then puts them in the
//! write-behind memtable (`store/memtable.rs`), from which the applier thread writes them into
//! sled without a transaction. sled is made durable in the background, not per group.
//!
//! Files: `wal-{n:016}.log` in the data directory, numbered upward. The newest is the one
//! being written; older ones are closed, and deleted once a memtable layer holding all their
//! records is in sled and sled is flushed. At open every segment still there is read into the
//! memtable in order (idempotent: every write carries its whole value), and sled takes it in
//! the background.
//!
//! Segments are zero-filled to [`SEGMENT_BYTES`] before use (a spare is made ahead by the
//! store's spare thread, `herald-spare`), so an append overwrites blocks that exist and its `fdatasync` journals
//! no metadata; zeros after the last record are the unused end.
//!
//! Record: `len: u32 LE | crc32(payload): u32 LE | payload`, payload `count: u32 LE` then per
//! write `tree: u8 | kind: u8 (0 delete, 1 put) | klen: u32 | key | [vlen: u32 | value]`.
//!
//! Invariants:
//! - A write reaches sled only after the log record holding it is durable, so sled never holds
//!   a write that a crash could take from the log (sled's own background writes included).
//! - A record whose sync failed is cut off the log (zeros over it, made durable) before
//!   anything else is appended; a group whose cut cannot be made durable fails, and so does every
//!   later one until the cut is. So a write answered "failed" is never replayed once herald
//!   writes again. One window stays, as in every database: herald dying between the failed sync
//!   and the durable cut may replay it at the next start (its writer was told "failed", which
//!   means "not known to be applied", never "known not applied").
//! - Decoding never panics: a bad length, checksum or tree is an error naming the file and the
//!   byte offset; only a damaged *last* record of the newest segment is taken for a torn write
//!   (power lost mid-append: it was never acknowledged) and cut off with a warning, and only
//!   when it is incomplete or fails its checksum: a whole record with a good checksum that
//!   does not decode (a newer build's tree) was synced, so it is damage, never cut. "Last" means
//!   no good record starts anywhere after it: appends are contiguous and each waits for the
//!   sync of the one before (or for its cut, which moves the end back), so a good record after
//!   a bad one proves the bad one was synced: damage, never a torn append. Whatever follows a
//!   torn append's start is that append's own pages (which a power loss may keep without its
//!   first one) or the segment's zeros.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::backend::TreeId;
use super::StoreError;

/// A segment is closed (and a checkpoint started) once it holds this much.
pub const SEGMENT_BYTES: u64 = 8 << 20;
/// ... or once it is this old and not empty, so that under a trickle of writes the log's old
/// records are deleted now and then (sled has them within a second: the memtable freezes
/// without closing the segment). Each close costs a new zero-filled 8 MiB segment, so not
/// often: at 10 s, one write every few seconds wrote ~0.8 MiB/s of zeros.
pub const SEGMENT_AGE: std::time::Duration = std::time::Duration::from_secs(300);

/// A zero-filled segment made ahead by the spare thread ([`prepare_spare`]); a new
/// segment is this file renamed. Appends then overwrite blocks that exist, so an `fdatasync`
/// has no file size or extent to journal: measured here, 1 306–1 535 syncs/s appending to a
/// growing file against 1 828–2 014/s overwriting a preallocated one.
const SPARE: &str = "wal-spare.tmp";
/// A segment being zero-filled on the write path (no spare was ready), renamed to its number
/// once whole. Only `Segment::create` writes it, under the log's lock (or at open, alone); the
/// spare thread fills `wal-spare.partial`. Not a segment's name: never read as one.
const FILLING: &str = "wal-next.partial";

/// One resolved write: put `value` at `key` in `tree`, or delete `key` (`None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub tree: TreeId,
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
}

/// The segment file for number `n`.
pub fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("wal-{n:016}.log"))
}

/// The number of the segment at `path` (`None`: not a segment's name).
pub fn segment_number(path: &Path) -> Option<u64> {
    path.file_name()?
        .to_str()?
        .strip_prefix("wal-")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

/// The segments in `dir`, oldest first.
pub fn segments(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let Some(n) = segment_number(&e.path()) else {
            continue;
        };
        out.push((n, e.path()));
    }
    out.sort();
    Ok(out)
}

/// Appends one record holding `writes` to `out`.
pub fn encode_record(writes: &[Write], out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&(writes.len() as u32).to_le_bytes());
    for w in writes {
        out.push(w.tree as u8);
        out.push(u8::from(w.value.is_some()));
        out.extend_from_slice(&(w.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&w.key);
        if let Some(v) = &w.value {
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
    // `start + 8 <= out.len()`: the header was pushed above; split there so no index can panic.
    let Some((_, framed)) = out.split_at_mut_checked(start) else {
        return;
    };
    let Some((header, payload)) = framed.split_at_mut_checked(8) else {
        return;
    };
    let payload_len = payload.len() as u32;
    let crc = crc32fast::hash(payload);
    let (len_field, crc_field) = header.split_at_mut(4);
    len_field.copy_from_slice(&payload_len.to_le_bytes());
    crc_field.copy_from_slice(&crc.to_le_bytes());
}

/// How a segment's bytes end.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// Every byte belongs to a good record (or the rest is zeros).
    Clean,
    /// The last record is incomplete or fails its checksum and no good record follows it: a
    /// torn append. Cut the file at `at`.
    Torn { at: u64 },
    /// A bad record with a good one somewhere after it, or a record whose checksum is right
    /// but that does not decode (another version's, or damage): the log is damaged at `at`.
    Damaged { at: u64, why: String },
}

/// The records of one segment, and how it ends. Pure; never panics on any bytes.
pub fn decode_segment(bytes: &[u8]) -> (Vec<Vec<Write>>, End) {
    let mut records = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = bytes.get(at..).unwrap_or_default();
        if rest.iter().all(|b| *b == 0) {
            break;
        }
        let Some((&[l0, l1, l2, l3, c0, c1, c2, c3], body)) = rest.split_first_chunk::<8>() else {
            return (records, End::Torn { at: at as u64 });
        };
        let len = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
        let crc = u32::from_le_bytes([c0, c1, c2, c3]);
        let bad = |why: String| {
            if good_record_after(bytes, at) {
                End::Damaged { at: at as u64, why }
            } else {
                End::Torn { at: at as u64 }
            }
        };
        let Some((payload, _)) = body.split_at_checked(len) else {
            return (
                records,
                bad(format!("a length of {len} bytes runs past the end")),
            );
        };
        if crc32fast::hash(payload) != crc {
            return (records, bad("checksum mismatch".into()));
        }
        // Zeros before the end (a torn append whose first page never reached the disk) frame
        // an empty payload, whose checksum is 0: no proof. Herald writes no empty record.
        if payload.is_empty() {
            return (records, bad("an empty record".into()));
        }
        // Its checksum is right, so the record is whole as it was written, and synced (a torn
        // append matches its checksum only by a 1 in 2^32 accident): acknowledged. One that
        // does not decode was written by another version (a newer build's tree or kind) or
        // is damage; cut as torn, it would drop an acknowledged write without a word.
        match decode_payload(payload) {
            Ok(writes) => records.push(writes),
            Err(why) => {
                return (
                    records,
                    End::Damaged {
                        at: at as u64,
                        why: format!("a record with a good checksum does not decode ({why}): written by another version of herald, or damaged"),
                    },
                )
            }
        }
        at += 8 + len;
    }
    (records, End::Clean)
}

/// Whether a good record (well formed, its checksum right) starts anywhere in `bytes` after
/// offset `bad` (see the module's invariants). The bytes after a torn append are that
/// append's own or zeros. A heuristic, in two steps: the shape first ([`well_formed`], no
/// allocation, failing within a few bytes at almost every offset, and never on zeros), the
/// checksum only for a candidate of the right shape, where a false match is a 1 in 2^32
/// accident (or a stored value that holds a whole record: then herald refuses to start, the
/// safe side). Bounded: past [`SEARCH_BYTES`] hashed it answers yes, so a tail too costly to
/// search is reported, not cut.
fn good_record_after(bytes: &[u8], bad: usize) -> bool {
    let mut budget = SEARCH_BYTES;
    for o in bad.saturating_add(1)..bytes.len() {
        let Some((&[l0, l1, l2, l3, c0, c1, c2, c3], body)) =
            bytes.get(o..).unwrap_or_default().split_first_chunk::<8>()
        else {
            return false;
        };
        let len = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
        let Some(payload) = body.get(..len).filter(|p| well_formed(p)) else {
            continue;
        };
        let Some(left) = budget.checked_sub(len) else {
            return true;
        };
        budget = left;
        if crc32fast::hash(payload) == u32::from_le_bytes([c0, c1, c2, c3]) {
            return true;
        }
    }
    false
}

/// Whether `p` has the shape of a record's payload: a count, that many writes of a known tree
/// and kind, each with a key of at least one byte (herald writes no empty key, and so the
/// zeros of a preallocated segment never read as writes), and nothing after them. No
/// allocation: [`good_record_after`] asks it at every offset.
fn well_formed(p: &[u8]) -> bool {
    fn u32_at(p: &[u8], at: usize) -> Option<usize> {
        let b: [u8; 4] = p.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(u32::from_le_bytes(b) as usize)
    }
    let Some(count) = u32_at(p, 0) else {
        return false;
    };
    // Tree, kind, key length and one key byte: a write takes at least 7 bytes.
    if count > p.len() / 7 {
        return false;
    }
    let mut at = 4usize;
    for _ in 0..count {
        let (Some(&tree), Some(&kind), Some(klen)) = (p.get(at), p.get(at + 1), u32_at(p, at + 2))
        else {
            return false;
        };
        if usize::from(tree) >= TreeId::ALL.len() || klen == 0 {
            return false;
        }
        at = match (at + 6).checked_add(klen) {
            Some(end) if end <= p.len() => end,
            _ => return false,
        };
        match kind {
            0 => {}
            1 => {
                let Some(vlen) = u32_at(p, at) else {
                    return false;
                };
                at = match (at + 4).checked_add(vlen) {
                    Some(end) if end <= p.len() => end,
                    _ => return false,
                };
            }
            _ => return false,
        }
    }
    at == p.len()
}

/// How many bytes [`good_record_after`] may hash: only candidates of a record's shape are
/// hashed, so this is met only on a tail built to be costly.
const SEARCH_BYTES: usize = 1 << 30;

fn decode_payload(p: &[u8]) -> Result<Vec<Write>, String> {
    let mut r = Reader { p, at: 0 };
    let count = r.u32()? as usize;
    let mut out = Vec::with_capacity(count.min(p.len() / 6));
    for _ in 0..count {
        let tree = r.u8()?;
        let tree = TreeId::ALL
            .get(tree as usize)
            .copied()
            .ok_or_else(|| format!("unknown tree {tree}"))?;
        let kind = r.u8()?;
        let klen = r.u32()? as usize;
        let key = r.bytes(klen)?.to_vec();
        let value = match kind {
            0 => None,
            1 => {
                let vlen = r.u32()? as usize;
                Some(r.bytes(vlen)?.to_vec())
            }
            k => return Err(format!("unknown write kind {k}")),
        };
        out.push(Write { tree, key, value });
    }
    if r.at != p.len() {
        return Err("trailing bytes in a record".into());
    }
    Ok(out)
}

struct Reader<'a> {
    p: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn bytes(&mut self, n: usize) -> Result<&[u8], String> {
        let b = self
            .p
            .get(self.at..self.at.saturating_add(n))
            .ok_or("record ends early")?;
        self.at += n;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8, String> {
        match self.bytes(1)? {
            [b] => Ok(*b),
            _ => Err("record ends early".into()),
        }
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b: [u8; 4] = self.bytes(4)?.try_into().map_err(|_| "record ends early")?;
        Ok(u32::from_le_bytes(b))
    }
}

/// What replay reads: the records in order, and the segments (number, path) they came from.
pub type Replay = (Vec<Vec<Write>>, Vec<(u64, PathBuf)>);

/// Reads every segment in `dir` for replay: their records in order, and the segments' paths.
/// A torn tail of the newest segment is cut off (with a warning); any other damage is an error
/// naming the file and the offset.
pub fn read_all(dir: &Path) -> Result<Replay, StoreError> {
    let segs = segments(dir)?;
    let mut all = Vec::new();
    for (i, (_, path)) in segs.iter().enumerate() {
        let bytes = std::fs::read(path)?;
        let (records, end) = decode_segment(&bytes);
        all.extend(records);
        let newest = match segs.get(i + 1..) {
            Some(later) if !later.is_empty() && matches!(end, End::Torn { .. }) => {
                never_used(later)?
            }
            _ => true,
        };
        match end {
            End::Clean => {}
            End::Torn { at } if newest => {
                tracing::warn!(file = %path.display(), at, dropped = bytes.len() as u64 - at,
                    "the write-ahead log ends in an incomplete record (an append cut off by a power loss); it was never acknowledged and is dropped. If the machine did not lose power, check the disk");
                let f = OpenOptions::new().write(true).open(path)?;
                f.set_len(at)?;
                f.sync_all()?;
            }
            End::Torn { at } => return Err(damaged(path, at, "incomplete record")),
            End::Damaged { at, why } => return Err(damaged(path, at, &why)),
        }
    }
    Ok((all, segs))
}

/// Whether every segment in `later` is all zeros: made and never appended to (a failed
/// create whose removal did not survive a power loss, or one made right before it). Then the
/// segment before them holds the log's last record, and a torn tail there is torn.
///
/// Sound because a torn tail is judged on records, not files: an acknowledged record was
/// made durable by its `fdatasync`, so a segment that holds one (or any byte of a record,
/// torn or not, that reached the disk) is not all zeros. Segments of zeros add no record to
/// the log, and the log's last record is the same one as without those files; the rule for
/// it is the newest segment's (torn if no good record follows it). A torn tail followed by
/// a segment with any record in it stays damage: appends move to a new segment only after
/// the old one's last record was durable.
fn never_used(later: &[(u64, PathBuf)]) -> Result<bool, StoreError> {
    for (_, path) in later {
        let bytes = std::fs::read(path)?;
        if bytes.iter().any(|b| *b != 0) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn damaged(path: &Path, at: u64, why: &str) -> StoreError {
    StoreError::Corrupt {
        tree: format!("write-ahead log {}", path.display()),
        key: format!("byte {at}"),
        detail: why.to_string(),
    }
}

/// The segment being appended to.
pub struct Segment {
    pub n: u64,
    pub path: PathBuf,
    file: File,
    /// Bytes appended.
    len: u64,
    /// Bytes known durable; the file is cut back to this after a failed append or sync.
    synced: u64,
    opened: std::time::Instant,
    /// No spare was ready: the segment was zero-filled by `create` itself, taking this long
    /// (on the commit thread when a rotation made it; the caller logs it).
    pub filled_inline: Option<std::time::Duration>,
}

impl Segment {
    /// Creates segment `n` (empty: zero-filled) and makes its directory entry durable. Takes
    /// the spare made ahead if there is one; otherwise fills a new file here
    /// (`filled_inline`).
    pub fn create(dir: &Path, n: u64) -> std::io::Result<Segment> {
        let path = segment_path(dir, n);
        let made = Segment::made(dir, &path).inspect_err(|_| {
            // A segment file left after a failed create would be the newest at the next
            // start while the appends go on in the one before (`rotate` keeps it). Removed,
            // and the removal made durable if the disk lets us; if not, the file may come
            // back after a power loss: it is whole and all zeros (filled before its rename),
            // which `read_all` takes for a segment never used.
            if std::fs::remove_file(&path).is_ok() {
                let _ = sync_dir(dir);
            }
        })?;
        let (file, filled_inline) = made;
        Ok(Segment {
            n,
            path,
            file,
            len: 0,
            synced: 0,
            opened: std::time::Instant::now(),
            filled_inline,
        })
    }

    /// The file of a new segment at `path`, its directory entry durable: the spare renamed,
    /// or a file zero-filled here (how long that took), under [`FILLING`] and renamed as the
    /// spare is: a fill that fails half-way (a full disk) never leaves a file at `path`.
    fn made(dir: &Path, path: &Path) -> std::io::Result<(File, Option<std::time::Duration>)> {
        let mut filled_inline = None;
        if std::fs::rename(dir.join(SPARE), path).is_err() {
            let started = std::time::Instant::now();
            let filling = dir.join(FILLING);
            zero_filled(&filling)
                .and_then(|()| std::fs::rename(&filling, path))
                .inspect_err(|_| {
                    let _ = std::fs::remove_file(&filling);
                })?;
            filled_inline = Some(started.elapsed());
        }
        let file = OpenOptions::new().write(true).open(path)?;
        sync_dir(dir)?;
        Ok((file, filled_inline))
    }

    /// Appends `bytes` (not yet durable).
    pub fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self.file.write_all(bytes) {
            Ok(()) => {
                self.len += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Part of it may be in the file: count all of it as appended so that the cut
                // back zeroes whatever got there.
                self.len += bytes.len() as u64;
                let _ = self.cut_back();
                Err(e)
            }
        }
    }

    /// Makes everything appended durable.
    pub fn sync(&mut self) -> std::io::Result<()> {
        match self.file.sync_data() {
            Ok(()) => {
                self.synced = self.len;
                Ok(())
            }
            Err(e) => {
                let _ = self.cut_back();
                Err(e)
            }
        }
    }

    /// Drops whatever was appended but not made durable: zeros over it, so that it reads as
    /// the segment's unused end.
    pub fn cut_back(&mut self) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom};
        if self.len == self.synced {
            return Ok(());
        }
        self.file.seek(SeekFrom::Start(self.synced))?;
        self.file
            .write_all(&vec![0; (self.len - self.synced) as usize])?;
        // The zeros must be durable too: after a failed `fdatasync` nobody knows which of the
        // record's pages reached the disk, and only zeros on disk over it keep a crash from
        // replaying it. Until this succeeds `len` stays ahead of `synced`, so the next group
        // tries the cut again (`Log::discard`) and fails rather than append behind it.
        self.file.sync_data()?;
        self.file.seek(SeekFrom::Start(self.synced))?;
        self.len = self.synced;
        Ok(())
    }

    /// Nothing appended yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A failed append or sync is still in the file: its cut back (zeros, made durable) has
    /// not succeeded yet. Such a segment must stay the open one until it has (`Log::discard`
    /// retries it before the next group): closed, it would be read at the next start with the
    /// failed record in it, and no later cut would reach it.
    pub fn uncut(&self) -> bool {
        self.len > self.synced
    }

    /// Time to close this segment and start a checkpoint.
    pub fn full(&self) -> bool {
        self.len >= SEGMENT_BYTES || (self.len > 0 && self.opened.elapsed() >= SEGMENT_AGE)
    }
}

/// Writes a zero-filled file of [`SEGMENT_BYTES`] at `path` and makes it durable.
fn zero_filled(path: &Path) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)?;
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..SEGMENT_BYTES / zeros.len() as u64 {
        f.write_all(&zeros)?;
    }
    f.sync_all()
}

/// Makes the spare segment if there is none (the spare thread, off the write path). It
/// is filled under another name and renamed, so a spare is always whole.
pub fn prepare_spare(dir: &Path) -> std::io::Result<()> {
    let spare = dir.join(SPARE);
    if std::fs::metadata(&spare).is_ok_and(|m| m.len() == SEGMENT_BYTES) {
        return Ok(());
    }
    let partial = dir.join("wal-spare.partial");
    zero_filled(&partial)?;
    std::fs::rename(&partial, &spare)?;
    sync_dir(dir)
}

/// Makes a directory's entries (a file created or removed) durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(tree: TreeId, k: &str, v: Option<&str>) -> Write {
        Write {
            tree,
            key: k.as_bytes().to_vec(),
            value: v.map(|v| v.as_bytes().to_vec()),
        }
    }

    /// Two records, their bytes, and where the second one starts.
    fn two_records() -> (Vec<Vec<Write>>, Vec<u8>, usize) {
        let recs = vec![
            vec![
                w(TreeId::Specs, "a", Some("spec")),
                w(TreeId::Due, "x", None),
            ],
            vec![w(TreeId::Progress, "b", Some(""))],
        ];
        let mut bytes = Vec::new();
        encode_record(&recs[0], &mut bytes);
        let first_len = bytes.len();
        encode_record(&recs[1], &mut bytes);
        (recs, bytes, first_len)
    }

    #[test]
    fn a_short_payload_with_a_good_checksum_is_refused_not_a_panic() {
        // Every prefix of a real payload, framed with its right length and checksum: the
        // reader runs out of bytes inside a field and must say so (damage: the checksum says
        // the record is whole as written, so it is no torn append).
        let (_, bytes, first_len) = two_records();
        let payload = &bytes[8..first_len];
        // (An empty one frames as eight zero bytes: the clean end of a log.)
        for cut in 1..payload.len() {
            let p = &payload[..cut];
            let mut framed = (p.len() as u32).to_le_bytes().to_vec();
            framed.extend_from_slice(&crc32fast::hash(p).to_le_bytes());
            framed.extend_from_slice(p);
            let (got, end) = decode_segment(&framed);
            assert!(got.is_empty(), "cut at {cut}");
            assert!(
                matches!(&end, End::Damaged { at: 0, why } if why.contains("ends early")),
                "cut at {cut}: {end:?}"
            );
        }
    }

    /// A whole, correctly checksummed last record that does not decode (here: a tree this
    /// build does not know, as a newer build may write) was synced, so acknowledged: a torn
    /// append practically never has its checksum right. It is damage, refused, and the file
    /// is not cut (a rollback to an older build must not drop a newer one's writes).
    #[test]
    fn a_checksummed_last_record_that_does_not_decode_is_damage_never_cut() {
        let (recs, bytes, _) = two_records();
        let mut p = 1u32.to_le_bytes().to_vec();
        p.extend_from_slice(&[10, 1]); // tree 10, a put
        p.extend_from_slice(&1u32.to_le_bytes());
        p.push(b'k');
        p.extend_from_slice(&1u32.to_le_bytes());
        p.push(b'v');
        let mut seg = bytes.clone();
        seg.extend_from_slice(&(p.len() as u32).to_le_bytes());
        seg.extend_from_slice(&crc32fast::hash(&p).to_le_bytes());
        seg.extend_from_slice(&p);
        seg.extend_from_slice(&[0; 64]);
        let (got, end) = decode_segment(&seg);
        assert_eq!(got, recs);
        match &end {
            End::Damaged { at, why } => {
                assert_eq!(*at, bytes.len() as u64);
                assert!(why.contains("unknown tree 10"), "{why}");
                assert!(why.contains("another version"), "{why}");
            }
            other => panic!("expected damage, got {other:?}"),
        }
        // On disk, as the newest segment: refused, and its bytes left as they were.
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 3);
        std::fs::write(&path, &seg).unwrap();
        let e = read_all(dir.path()).expect_err("refused").to_string();
        assert!(e.contains("wal-0000000000000003.log"), "{e}");
        assert!(e.contains("another version"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), seg, "the file is not cut");
    }

    #[test]
    fn records_round_trip() {
        let (recs, bytes, _) = two_records();
        assert_eq!(decode_segment(&bytes), (recs, End::Clean));
    }

    #[test]
    fn a_cut_last_record_is_torn_and_the_ones_before_survive() {
        let (recs, bytes, first_len) = two_records();
        for cut in first_len + 1..bytes.len() {
            let (got, end) = decode_segment(&bytes[..cut]);
            assert_eq!(got, recs[..1].to_vec(), "cut at {cut}");
            assert_eq!(
                end,
                End::Torn {
                    at: first_len as u64
                },
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn damage_before_the_last_record_is_an_error_and_in_the_last_a_torn_tail() {
        let (recs, bytes, first_len) = two_records();
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x5a;
            let (got, end) = decode_segment(&b);
            if at < first_len {
                assert!(got.is_empty(), "flip at {at}");
                // The second record is good: whatever the flip did to the first (its length
                // too, now short or past the end), that is damage.
                assert!(
                    matches!(end, End::Damaged { at: 0, .. }),
                    "flip at {at}: {end:?}"
                );
            } else {
                // Nothing good follows the last record: torn, wherever the flip is.
                assert_eq!(got, recs[..1].to_vec(), "flip at {at}");
                assert_eq!(
                    end,
                    End::Torn {
                        at: first_len as u64
                    },
                    "flip at {at}"
                );
            }
        }
    }

    /// Power lost while a record spanning pages was appended: its later page reached the disk
    /// and its first (with the header) did not. Nothing good follows it: a torn append.
    #[test]
    fn a_torn_record_whose_first_page_never_reached_the_disk_is_torn() {
        let big = vec![Write {
            tree: TreeId::Specs,
            key: b"k".to_vec(),
            value: Some(vec![7; 10_000]),
        }];
        let (recs, bytes, _) = two_records();
        let mut seg = bytes.clone();
        encode_record(&big, &mut seg);
        let torn_at = bytes.len();
        // The first page of the torn record (from its header on) is zeros, the rest is there.
        for b in &mut seg[torn_at..4096] {
            *b = 0;
        }
        seg.extend_from_slice(&[0; 4096]);
        assert_eq!(
            decode_segment(&seg),
            (recs.clone(), End::Torn { at: torn_at as u64 })
        );
        // The same hole before a good record: damage, never cut (it was acknowledged).
        let mut damaged = seg[..torn_at + 10_000].to_vec();
        encode_record(&recs[0], &mut damaged);
        let (got, end) = decode_segment(&damaged);
        assert_eq!(got, recs);
        assert!(
            matches!(end, End::Damaged { at, .. } if at == torn_at as u64),
            "{end:?}"
        );
    }

    /// A group of 1 300 writes (a herd chunk's settle) torn by a power loss, its first page
    /// lost: the search through its own bytes, where many offsets read as a plausible length
    /// into the zero-filled rest of the segment, must still find nothing and call it torn
    /// (with checksums alone it ran out of its budget and called it damage).
    #[test]
    fn a_big_torn_group_in_a_preallocated_segment_is_torn() {
        let writes: Vec<Write> = (0..1_300u32)
            .map(|i| Write {
                tree: TreeId::ALL[i as usize % TreeId::ALL.len()],
                key: format!("task-{i:06}-abcdefgh\0\0\0\x01").into_bytes(),
                value: (i % 3 != 0).then(|| vec![b'v'; 100 + (i as usize % 50)]),
            })
            .collect();
        let (recs, bytes, _) = two_records();
        let mut seg = bytes.clone();
        encode_record(&writes, &mut seg);
        let torn_at = bytes.len();
        let page_end = (torn_at / 4096 + 1) * 4096;
        for b in &mut seg[torn_at..page_end] {
            *b = 0;
        }
        seg.resize(8 << 20, 0);
        let t = std::time::Instant::now();
        assert_eq!(
            decode_segment(&seg),
            (recs, End::Torn { at: torn_at as u64 })
        );
        // Not a bound asserted on time; printed to see what the search costs.
        eprintln!("searched a torn 8 MiB segment in {:?}", t.elapsed());
    }

    /// A flipped bit in a length that now runs past the end must not pass for a torn tail when
    /// good records follow: cutting there would drop writes that were acknowledged.
    #[test]
    fn a_length_run_past_the_end_before_good_records_is_damage() {
        let (_, bytes, _) = two_records();
        let mut b = bytes.clone();
        b[3] ^= 0x40; // the first record's length, now about a gigabyte
        let (got, end) = decode_segment(&b);
        assert!(got.is_empty());
        assert!(matches!(end, End::Damaged { at: 0, .. }), "{end:?}");
    }

    #[test]
    fn a_torn_record_in_a_preallocated_segment_is_torn_not_damage() {
        let (recs, bytes, _) = two_records();
        // The last 5 bytes are the key "b" and an empty value's length: zeros in their place
        // change the record.
        let mut seg = bytes[..bytes.len() - 5].to_vec();
        seg.extend_from_slice(&[0; 64]);
        let (got, end) = decode_segment(&seg);
        assert_eq!(got, recs[..1].to_vec());
        assert!(matches!(end, End::Torn { .. }), "{end:?}");
    }

    #[test]
    fn trailing_zeros_end_the_log_cleanly() {
        let (recs, mut bytes, _) = two_records();
        bytes.extend_from_slice(&[0; 100]);
        assert_eq!(decode_segment(&bytes), (recs, End::Clean));
    }

    #[test]
    fn a_failed_append_is_cut_back_and_segments_list_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Segment::create(dir.path(), 7).unwrap();
        let (_, bytes, _) = two_records();
        s.append(&bytes).unwrap();
        s.sync().unwrap();
        s.append(b"not synced").unwrap();
        s.cut_back().unwrap();
        s.append(&bytes).unwrap();
        s.sync().unwrap();
        let _ = Segment::create(dir.path(), 12).unwrap();
        let (records, segs) = read_all(dir.path()).unwrap();
        assert_eq!(records.len(), 4);
        assert_eq!(
            segs.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            vec![7, 12]
        );
    }

    #[test]
    fn a_segment_is_uncut_from_an_append_until_its_sync_or_its_cut_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Segment::create(dir.path(), 3).unwrap();
        let (_, bytes, _) = two_records();
        assert!(!s.uncut());
        s.append(&bytes).unwrap();
        assert!(
            s.uncut(),
            "appended, not yet durable: the segment may not close"
        );
        s.sync().unwrap();
        assert!(!s.uncut());
        s.append(b"failed").unwrap();
        assert!(s.uncut());
        s.cut_back().unwrap();
        assert!(!s.uncut(), "cut back durably: it may close");
        assert!(!s.is_empty());
    }

    /// A new segment whose create failed (a full disk, an error syncing the directory) was
    /// removed, but the removal did not survive a power loss: an all-zero `wal-(n+1).log`
    /// next to segment n, where the appends went on and the last one was torn. It is a
    /// segment never used: the torn tail is cut, every acknowledged record replayed.
    #[test]
    fn an_all_zero_newer_segment_leaves_a_torn_tail_before_it_torn() {
        let dir = tempfile::tempdir().unwrap();
        let (recs, bytes, first_len) = two_records();
        let mut s = Segment::create(dir.path(), 4).unwrap();
        s.append(&bytes[..first_len]).unwrap();
        s.sync().unwrap();
        // The second record torn: only its first 6 bytes reached the disk.
        s.append(&bytes[first_len..first_len + 6]).unwrap();
        s.sync().unwrap();
        zero_filled(&segment_path(dir.path(), 5)).unwrap();
        let (records, segs) = read_all(dir.path()).expect("opens");
        assert_eq!(records, recs[..1].to_vec());
        assert_eq!(segs.len(), 2);
        let cut = std::fs::metadata(segment_path(dir.path(), 4))
            .unwrap()
            .len();
        assert_eq!(cut, first_len as u64, "the torn append is cut off");
        // A newer segment with a record in it: the torn tail before it is damage.
        let mut s = Segment::create(dir.path(), 6).unwrap();
        s.append(&bytes[first_len..first_len + 6]).unwrap();
        s.sync().unwrap();
        let mut n7 = Segment::create(dir.path(), 7).unwrap();
        n7.append(&bytes[..first_len]).unwrap();
        n7.sync().unwrap();
        let e = read_all(dir.path()).expect_err("damaged").to_string();
        assert!(e.contains("wal-0000000000000006.log"), "{e}");
    }

    /// A segment filled on the write path (no spare) is filled under another name: the only
    /// file at a segment's name is a whole one.
    #[test]
    fn a_segment_filled_inline_appears_whole_under_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let s = Segment::create(dir.path(), 1).unwrap();
        assert!(s.filled_inline.is_some());
        assert_eq!(std::fs::metadata(&s.path).unwrap().len(), SEGMENT_BYTES);
        assert!(!dir.path().join(FILLING).exists());
        // A fill that cannot be made (here: its temporary name taken by a directory) leaves
        // no file at the segment's name.
        std::fs::create_dir(dir.path().join(FILLING)).unwrap();
        assert!(Segment::create(dir.path(), 2).is_err());
        assert!(!segment_path(dir.path(), 2).exists());
    }

    #[test]
    fn garbage_in_an_older_segment_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Segment::create(dir.path(), 1).unwrap();
        s.append(b"\xff\xff\xff\x00 garbage that is not a record")
            .unwrap();
        s.sync().unwrap();
        // A newer segment in use (an all-zero one would be one never used, and the garbage
        // the log's torn last record).
        let (_, bytes, _) = two_records();
        let mut s2 = Segment::create(dir.path(), 2).unwrap();
        s2.append(&bytes).unwrap();
        s2.sync().unwrap();
        let e = read_all(dir.path()).expect_err("damaged").to_string();
        assert!(e.contains("wal-0000000000000001.log"), "{e}");
    }
}

//! The mark of an import under way. `herald import` makes each batch durable as it goes, so an
//! import stopped halfway (Ctrl-C, `kill -9`, a crash, a power cut) leaves part of the file's
//! tasks behind. Before its first write the import leaves [`MARKER`] in the data directory
//! (durably), and removes it only once the file's `end` line was checked and everything is
//! durable; `herald serve`, `herald export --data` and another import refuse a directory that
//! holds it ([`check_complete`]), so a half-restored directory is never run or taken for a
//! backup. On PostgreSQL the same mark is a row of `herald_meta`
//! (`PgBackend::mark_import`).

use std::io::Write;
use std::path::Path;

/// The file an import keeps in its data directory until it has finished.
pub const MARKER: &str = "IMPORT-INCOMPLETE";

/// What the marker file says to whoever finds it.
const TEXT: &str = "herald import did not finish writing this data directory: it holds only \
part of the export. herald will not run it. Delete this directory and run herald import again.\n";

/// What herald says of a directory (or database, `what`) holding an unfinished import.
pub fn refusal(what: &str, marker: &str) -> String {
    format!(
        "{what} holds an unfinished import ({marker} is there: herald import was interrupted \
         and only part of the export was written); herald will not use it. Delete it and run \
         herald import again"
    )
}

/// What herald says of a database holding an unfinished import (`shown`: its URL without
/// the password).
pub fn pg_refusal(shown: &str) -> String {
    let mark = crate::store::pg::backend::IMPORT_MARK;
    format!(
        "the database {shown} holds an unfinished import (herald_meta row {mark:?}: herald \
         import was interrupted and only part of the export was written); herald will not use \
         it. Import again into a new database (or drop herald's herald_* tables first)"
    )
}

/// Refuses a data directory an import did not finish.
pub fn check_complete(dir: &Path) -> Result<(), String> {
    let marker = dir.join(MARKER);
    match std::fs::symlink_metadata(&marker) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Ok(_) => Err(refusal(
            &format!("the data directory {}", dir.display()),
            &marker.display().to_string(),
        )),
        Err(e) => Err(format!("cannot read {}: {e}", marker.display())),
    }
}

/// Creates `dir` if needed and leaves the marker in it, durably (the file, the directory's
/// entry for it, and the entry of a new directory in its parent).
pub fn mark(dir: &Path) -> std::io::Result<()> {
    let created = !dir.exists();
    std::fs::create_dir_all(dir)?;
    let mut f = std::fs::File::create(dir.join(MARKER))?;
    f.write_all(TEXT.as_bytes())?;
    f.sync_all()?;
    sync_dir(dir)?;
    if created {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Removes the marker, durably: the import is complete.
pub fn unmark(dir: &Path) -> std::io::Result<()> {
    std::fs::remove_file(dir.join(MARKER))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_directory_is_refused_until_unmarked() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("new");
        assert_eq!(
            check_complete(&dir),
            Ok(()),
            "no directory: nothing to refuse"
        );
        mark(&dir).unwrap();
        let e = check_complete(&dir).unwrap_err();
        assert!(e.contains(MARKER) && e.contains("Delete it"), "{e}");
        unmark(&dir).unwrap();
        assert_eq!(check_complete(&dir), Ok(()));
    }
}

//! External programs that some tests need (chromedriver and chromium, promtool, faketime,
//! PostgreSQL's server binaries). One rule for all of them:
//!
//! - found: `require` answers its path;
//! - missing under CI (`CI=true`, as `.ci/run` runs): the test fails, naming the install command,
//!   because CI must run everything;
//! - missing elsewhere: a loud `SKIP` line on stderr and one line appended to
//!   `target/tmp/test-skips.txt` (the README's test command, `scripts/test`, clears that list
//!   first and prints it at the end; `HERALD_TEST_SKIPS` names another file), and `require`
//!   answers `None`; the caller returns early.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A program on `PATH` (or an absolute path that exists), else `None`.
pub fn which(program: &str) -> Option<PathBuf> {
    let direct = Path::new(program);
    if direct.is_absolute() {
        return is_executable(direct).then(|| direct.to_path_buf());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

/// A file someone may run (a non-executable `chromedriver` on PATH is not chromedriver).
fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// True when the run is CI's (`CI` set to anything but empty, `0` or `false`).
pub fn in_ci() -> bool {
    std::env::var("CI")
        .map(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
        .unwrap_or(false)
}

/// `program` for the test `test`, or `None` after recording the skip (see the module doc).
/// `install` is the one command that brings it, e.g. `apt-get install -y faketime`.
pub fn require(program: &str, install: &str, test: &str) -> Option<PathBuf> {
    if let Some(path) = which(program) {
        return Some(path);
    }
    skip(test, &format!("{program} not found on PATH"), install);
    None
}

/// Records that `test` cannot run for `why`; under CI this fails the test instead.
pub fn skip(test: &str, why: &str, install: &str) {
    let line = format!("SKIP {test}: {why}; install with: {install}");
    if in_ci() {
        panic!("{line} (CI=true: a missing tool is a failure, not a skip)");
    }
    eprintln!("\n*** {line} ***\n");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skips_file())
    {
        let _ = writeln!(f, "{line}");
    }
}

/// The list `skip` appends to: `HERALD_TEST_SKIPS` when set (scripts/test sets it; the
/// fresh-machine test points a child run at its own file so the outer list is left alone),
/// else `target/tmp/test-skips.txt`.
pub fn skips_file() -> PathBuf {
    match std::env::var_os("HERALD_TEST_SKIPS") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-skips.txt"),
    }
}

/// libfaketime's multi-threaded library as Debian's `faketime` package installs it, for
/// `LD_PRELOAD` (the `faketime` wrapper's own `FAKETIME` would win over a test's settings), or
/// `None` after recording the skip for `test`.
pub fn faketime_lib(test: &str) -> Option<PathBuf> {
    const INSTALL: &str = "apt-get install -y faketime";
    require("faketime", INSTALL, test)?;
    let mut dirs = vec![PathBuf::from("/usr/lib/faketime")];
    if let Ok(rd) = std::fs::read_dir("/usr/lib") {
        dirs.extend(rd.flatten().map(|e| e.path().join("faketime")));
    }
    let lib = dirs
        .into_iter()
        .map(|d| d.join("libfaketimeMT.so.1"))
        .find(|p| p.exists());
    if lib.is_none() {
        skip(test, "libfaketimeMT.so.1 not found", INSTALL);
    }
    lib
}

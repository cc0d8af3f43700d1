//! `herald export` and `herald import` (format in `backup/`).
//!
//! Export reads a data directory directly when herald is stopped (`--data`), or asks a running
//! herald for it (`--url`, `GET /v1/export`): sled lets one process open a directory, so while
//! herald runs only herald can read it, and `--data` says so and points at `--url`; a
//! directory of an older format is refused rather than migrated. Import writes into a new or
//! empty directory only, and removes what it wrote if the file is bad; an import stopped
//! halfway (killed, a crash) leaves its mark (`backup/marker.rs`), which `herald serve`
//! refuses: a failed import leaves nothing half-restored behind that herald would run. Each
//! task is checked as a create would be (`backup/import.rs`), against the `[limits]` of the
//! config `--config` names (the herald that will serve the data may raise them), herald's
//! defaults without it; its channel is not: import reads no channels. `--skip-invalid` leaves
//! out a task those rules refuse (an export of an older herald), with every line of it, naming
//! each on stderr; a broken file is still refused whole (which is which: `backup/import.rs`).
//!
//! On PostgreSQL (`--store-url`, password from `HERALD_STORE_PASSWORD` / `PGPASSWORD`) both
//! read and write the database directly: export sees one snapshot per task, so it may run
//! while herald does; import wants a database holding no herald tasks, and empties herald's
//! tables again if the file is bad. Moving a sled data dir to Postgres is an export with
//! `--data` and an import with `--store-url`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use http_body_util::BodyExt;

use super::client::{CliError, Client};
use super::output;
use crate::backup::{export, import, marker, BackupError};
use crate::model::Limits;
use crate::store::pg::{PgBackend, PgOptions};
use crate::store::{Store, StoreError, StoreOptions, DIR_FORMAT, DIR_FORMAT_READ_AS_IS};

#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub struct ExportArgs {
    /// Data directory of a stopped herald.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A running herald (token from HERALD_TOKEN).
    #[arg(long)]
    pub url: Option<String>,
    /// herald's PostgreSQL database (postgres://user@host:port/db).
    #[arg(long = "store-url")]
    pub store_url: Option<String>,
}

/// One target, `--data` or `--store-url`; `--file` goes with either (not in the group a
/// struct-level `#[group]` would make of every field).
#[derive(Args, Debug)]
#[group(skip)]
#[command(group(
    clap::ArgGroup::new("target")
        .required(true)
        .multiple(false)
        .args(["data", "store_url"])
))]
pub struct ImportArgs {
    /// New or empty data directory to restore into.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A PostgreSQL database holding no herald tasks to restore into.
    #[arg(long = "store-url")]
    pub store_url: Option<String>,
    /// The export file (default: standard input).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// The config file of the herald that will serve the data (with the HERALD_* variables,
    /// as `herald serve` reads it): its [limits] are what each task is checked against, as a
    /// create there would be. Without it, herald's default limits.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Skip each task today's rules of a create refuse instead of refusing the whole file:
    /// for an export of an older herald.
    ///
    /// Skipped, with every line of it (its messages, runs, timeline, failure-list entries and
    /// idempotency keys), and named on stderr as `line N: task "ID" skipped: FIELD: REASON`: a
    /// task whose task line or one of whose message lines breaks a rule a create checks against
    /// the [limits] of --config (an id, the schedule, a time zone, a name, metadata, pacing,
    /// retry, quiet hours, notify, a recipient, a body, data, the zones of recipient time). Still
    /// refused whole, with or without this flag: a broken file (not JSON, an unknown field, a
    /// line too long, lines out of order or not after their task, a message count or a run
    /// that does not fit its task, a failure of a task not in the file, no end line or wrong
    /// counts in it). The exit status is 0 when the rest was imported.
    #[arg(long = "skip-invalid")]
    pub skip_invalid: bool,
}

fn local(e: impl std::fmt::Display) -> CliError {
    CliError::Local(e.to_string())
}

/// `herald export`: JSON lines on standard output.
pub async fn export_cmd(args: ExportArgs) -> Result<(), CliError> {
    if let Some(url) = args.url {
        return export_url(&url).await;
    }
    let (store, from) = match args.store_url {
        // An export only reads: no process lock, beside a server that serves the database.
        Some(url) => (open_pg(&url, None)?.0, crate::store::pg::redact(&url)),
        None => {
            let dir = args.data.unwrap_or_default();
            (open_existing(&dir)?, dir.display().to_string())
        }
    };
    let now = crate::clock::Clock::now_ms(&crate::clock::SystemClock::new());
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let written = export::export_to(&store, now, &mut out)
        .and_then(|counts| out.flush().map(|()| counts).map_err(BackupError::Io));
    let (tasks, lines) = match written {
        // `herald export | head`: the reader wanted no more; the store still closes cleanly.
        Err(BackupError::Io(e)) if output::is_closed_pipe(&e) => return Ok(()),
        other => other.map_err(local)?,
    };
    eprintln!("herald: exported {tasks} tasks ({lines} lines) from {from}");
    Ok(())
}

/// herald's store on PostgreSQL, for export and import (the password as herald takes it),
/// claiming `lock` (`store/pg/lock.rs`) before anything else.
fn open_pg(
    url: &str,
    lock: Option<crate::store::pg::lock::Mode>,
) -> Result<(Store, Arc<PgBackend>), CliError> {
    let password = ["HERALD_STORE_PASSWORD", "PGPASSWORD"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|p| !p.is_empty()));
    let opts = PgOptions {
        password,
        process_lock: lock,
        // Without the lock (an export) the schema is only read, never upgraded.
        upgrade: lock.is_some(),
        ..PgOptions::default()
    };
    let backend = Arc::new(PgBackend::open(url, &opts).map_err(local)?);
    let store = Store::with_backend(backend.clone()).map_err(local)?;
    Ok((store, backend))
}

/// Opens a data directory that must exist, saying what to do when herald holds it. One of an
/// older format is refused, not opened: opening migrates it, and the herald that wrote it
/// could not read it any more (an export taken before an upgrade must leave a way back). One
/// of a newer format is refused as well, before anything in it is touched.
fn open_existing(dir: &Path) -> Result<Store, CliError> {
    if !dir.join("db").exists() {
        return Err(local(format!(
            "no herald data directory at {}",
            dir.display()
        )));
    }
    // Part of an export is no backup.
    marker::check_complete(dir).map_err(local)?;
    let refused = |e: StoreError| {
        match &e {
        _ if sled_locked(&e) => local(format!(
            "{} is in use by a running herald (sled allows one process per directory); export through it instead: herald export --url http://ADDR (the token from HERALD_TOKEN)",
            dir.display()
        )),
        _ => local(format!("cannot open {}: {e}", dir.display())),
    }
    };
    match stored_format(dir).map_err(refused)? {
        Some(found) if found < DIR_FORMAT_READ_AS_IS => {
            return Err(local(format!(
                "{} holds data-directory format {found}, written by an older herald; export does not upgrade it (opening it would, and the herald that wrote it could not read it any more). Export it with that herald, or start this one on it first (herald serve upgrades it to format {DIR_FORMAT}) and export then",
                dir.display()
            )))
        }
        // Opening it is refused as well, before its log is read; this says what to do.
        Some(found) if found > DIR_FORMAT => {
            return Err(local(format!(
                "{} holds data-directory format {found}, written by a newer herald (this one reads formats up to {DIR_FORMAT}); export it with that herald",
                dir.display()
            )))
        }
        _ => {}
    }
    // sled's threads let go of the directory a moment after the read above closed it.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        // A format read as it is stays as it is: the herald that wrote it still opens it.
        let opts = StoreOptions {
            keep_format: true,
            ..StoreOptions::default()
        };
        match Store::open_with(dir, &opts) {
            Err(e) if sled_locked(&e) && std::time::Instant::now() < end => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => return r.map_err(refused),
        }
    }
}

fn sled_locked(e: &StoreError) -> bool {
    matches!(e, StoreError::Sled(sled::Error::Io(io)) if io.to_string().contains("could not acquire lock"))
}

/// The data-directory format `dir` holds (`None`: none written yet), read from sled alone:
/// not through [`Store::open_with`], which migrates an older format as it opens.
fn stored_format(dir: &Path) -> Result<Option<u8>, StoreError> {
    let read = || -> Result<Option<u8>, StoreError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(1 << 20)
            .open()?;
        crate::store::stored_format(&db)
    };
    // sled may panic on a damaged file; an error here, as `Store::open_with` makes it.
    std::panic::catch_unwind(read).unwrap_or_else(|_| {
        Err(StoreError::Panic {
            dir: dir.display().to_string(),
            detail: "sled panicked reading it".into(),
        })
    })
}

/// Keeps the last [`TAIL_BYTES`] of a stream in `tail` as `data` comes (an end line is short).
fn keep_tail(tail: &mut Vec<u8>, data: &[u8]) {
    const TAIL_BYTES: usize = 4096;
    tail.extend_from_slice(data);
    let over = tail.len().saturating_sub(TAIL_BYTES);
    tail.drain(..over);
}

/// Whether an export's output ends with its end line (herald leaves it out of a failed one).
fn ends_complete(tail: &[u8]) -> bool {
    let tail = String::from_utf8_lossy(tail);
    let end_line = tail.trim_end().rsplit('\n').next().unwrap_or("");
    end_line.starts_with("{\"kind\":\"end\"")
}

/// The longest wait for the next bytes of an export from a running herald: a stalled server
/// (a hung database read, a frozen process) must not hold `herald export --url` for good.
const EXPORT_IDLE_MAX: std::time::Duration = std::time::Duration::from_secs(300);

/// Test knob, not configuration: [`EXPORT_IDLE_MAX`] in milliseconds (`tests/cli.rs`).
pub const EXPORT_IDLE_ENV: &str = "HERALD_TEST_EXPORT_IDLE_MS";

fn export_idle_max() -> std::time::Duration {
    std::env::var(EXPORT_IDLE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(EXPORT_IDLE_MAX, std::time::Duration::from_millis)
}

async fn export_url(url: &str) -> Result<(), CliError> {
    let c = Client::new(url)?;
    let mut body = c.stream("/v1/export").await?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // The output's last bytes, whatever frames they came in: a frame may end inside the end
    // line, or hold only its newline.
    let mut last = Vec::new();
    let idle = export_idle_max();
    loop {
        let Ok(frame) = tokio::time::timeout(idle, body.frame()).await else {
            return Err(local(format!(
                "the export stalled for {} s; the output is incomplete and import will refuse it",
                idle.as_secs_f64()
            )));
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| local(format!("the export broke off: {e}")))?;
        if let Ok(data) = frame.into_data() {
            match out.write_all(&data) {
                Err(e) if output::is_closed_pipe(&e) => return Ok(()),
                other => other.map_err(local)?,
            }
            keep_tail(&mut last, &data);
        }
    }
    match out.flush() {
        Err(e) if output::is_closed_pipe(&e) => return Ok(()),
        other => other.map_err(local)?,
    }
    // herald ends a failed export without its end line; say so rather than leave a file that
    // looks complete.
    if !ends_complete(&last) {
        return Err(local(
            "the export ended early (see herald's log); the output is incomplete and import will refuse it",
        ));
    }
    Ok(())
}

/// `herald import`: into a new or empty data directory. The directory holds the import's
/// marker (`backup/marker.rs`) from before the first write until the `end` line was checked
/// and everything is durable: an import stopped halfway is refused by `herald serve`.
pub async fn import_cmd(args: ImportArgs) -> Result<(), CliError> {
    let config_given = args.config.is_some();
    let mut report = |s: &import::Skipped| eprintln!("herald: {s}");
    let skip = match args.skip_invalid {
        true => Some(&mut report as &mut dyn FnMut(&import::Skipped)),
        false => None,
    };
    let limits = match &args.config {
        Some(path) => {
            crate::config::Config::load(Some(path), crate::config::Overrides::default())
                .map_err(local)?
                .limits
        }
        None => Limits::default(),
    };
    if let Some(url) = args.store_url {
        let file = args.file.as_deref();
        return import_pg(&url, file, &limits, skip, config_given).await;
    }
    let dir = args.data.unwrap_or_default();
    import::check_empty(&dir).map_err(local)?;
    let existed = dir.exists();
    let reader = input(args.file.as_deref())?;
    let r = match marker::mark(&dir) {
        Ok(()) => restore(&dir, reader, &limits, skip).await,
        Err(e) => Err(BackupError::Io(e)),
    };
    let r = r.and_then(|i| marker::unmark(&dir).map(|()| i).map_err(BackupError::Io));
    match r {
        Ok(i) => {
            say_imported(&i, &dir.display().to_string());
            Ok(())
        }
        Err(e) => {
            let note = match clean(&dir, existed) {
                Ok(()) => "nothing was kept".to_string(),
                Err(_) => format!("delete {} before trying again", dir.display()),
            };
            Err(local(format!(
                "import into {} failed ({note}): {e}{}",
                dir.display(),
                refusal_hint(&e, config_given)
            )))
        }
    }
}

/// What a refused file's error adds: `--config` when the limits may be why (a rule of a
/// create, a line too long for them), `--skip-invalid` when a task's rules are (it skips
/// nothing else, so it is not offered for a broken file).
fn refusal_hint(e: &BackupError, config_given: bool) -> &'static str {
    let invalid = matches!(e, BackupError::Invalid { .. });
    let limits = invalid || matches!(e, BackupError::Format { .. });
    match (limits && !config_given, invalid) {
        (true, true) => {
            " (tasks are checked against herald's default [limits]; give --config with the \
             config of the herald that will serve them if it raises them, or --skip-invalid to \
             import the rest without the tasks the rules refuse, each named)"
        }
        (true, false) => {
            " (tasks are checked against herald's default [limits]; give --config with the \
             config of the herald that will serve them if it raises them)"
        }
        (false, true) => {
            " (give --skip-invalid to import the rest without the tasks the rules refuse, each \
             named)"
        }
        (false, false) => "",
    }
}

fn say_imported(i: &import::Imported, into: &str) {
    let skipped = match i.skipped {
        0 => String::new(),
        n => format!(
            "; skipped {n} tasks the rules refuse (named above), with their messages, runs, \
             timelines, failures and idempotency keys"
        ),
    };
    eprintln!(
        "herald: imported {} tasks ({} lines) into {into}{skipped}",
        i.tasks, i.lines
    );
    if i.keys_left_out > 0 {
        eprintln!(
            "herald: left out {} idempotency keys of tasks the file does not hold (deleted tasks whose keys were not swept yet)",
            i.keys_left_out
        );
    }
}

/// Leaves the directory of a failed import as it was: new and gone, or empty. The marker goes
/// last, so a directory this stops short of emptying is still refused.
fn clean(dir: &Path, existed: bool) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        let p = e.path();
        if e.file_name() == marker::MARKER {
            continue;
        }
        if p.is_dir() {
            std::fs::remove_dir_all(&p)?;
        } else {
            std::fs::remove_file(&p)?;
        }
    }
    std::fs::remove_file(dir.join(marker::MARKER)).or_else(ignore_missing)?;
    if !existed {
        std::fs::remove_dir(dir)?;
    }
    Ok(())
}

fn ignore_missing(e: std::io::Error) -> std::io::Result<()> {
    match e.kind() {
        std::io::ErrorKind::NotFound => Ok(()),
        _ => Err(e),
    }
}

async fn restore(
    dir: &Path,
    reader: Box<dyn std::io::BufRead>,
    limits: &Limits,
    skip: Option<&mut dyn FnMut(&import::Skipped)>,
) -> Result<import::Imported, BackupError> {
    let store = Store::open_with(dir, &StoreOptions::default())?;
    let r = import::import_with(&store, reader, limits, skip).await;
    // Closed (the commit thread joined, sled flushed and unlocked) before the marker goes.
    drop(store);
    r
}

/// The export file, or standard input.
fn input(file: Option<&Path>) -> Result<Box<dyn std::io::BufRead>, CliError> {
    Ok(match file {
        Some(p) => Box::new(std::io::BufReader::new(
            std::fs::File::open(p)
                .map_err(|e| local(format!("cannot read {}: {e}", p.display())))?,
        )),
        None => Box::new(std::io::stdin().lock()),
    })
}

/// `herald import --store-url`: into a database that holds no herald tasks; a bad file
/// leaves herald's tables empty again. The database holds the import's mark (a row of
/// `herald_meta`) until the import has finished: one stopped halfway is refused by
/// `herald serve`.
async fn import_pg(
    url: &str,
    file: Option<&Path>,
    limits: &Limits,
    skip: Option<&mut dyn FnMut(&import::Skipped)>,
    config_given: bool,
) -> Result<(), CliError> {
    let shown = crate::store::pg::redact(url);
    // Exclusive: never into a database a herald serves.
    let (store, backend) = open_pg(url, Some(crate::store::pg::lock::Mode::Exclusive))?;
    if backend.import_unfinished().map_err(local)? {
        return Err(local(marker::pg_refusal(&shown)));
    }
    if backend.holds_tasks().map_err(local)? {
        return Err(local(format!(
            "the database {shown} already holds herald tasks; import only into a database without them"
        )));
    }
    let reader = input(file)?;
    backend.mark_import(true).map_err(local)?;
    let r = match import::import_with(&store, reader, limits, skip).await {
        Ok(i) => backend
            .mark_import(false)
            .map(|()| i)
            .map_err(BackupError::Store),
        Err(e) => Err(e),
    };
    match r {
        Ok(i) => {
            say_imported(&i, &shown);
            Ok(())
        }
        Err(e) => {
            drop(store);
            // The mark goes only once the tables are empty again.
            let note = match backend.clear().and_then(|()| backend.mark_import(false)) {
                Ok(()) => "nothing was kept",
                Err(_) => "import again into a new database",
            };
            Err(local(format!(
                "import into {shown} failed ({note}): {e}{}",
                refusal_hint(&e, config_given)
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_line_split_across_frames_is_still_seen() {
        let frames: [&[u8]; 3] = [
            b"{\"kind\":\"header\"}\n{\"kind\":\"en",
            b"d\",\"tasks\":0,\"lines\":2}",
            b"\n",
        ];
        let mut tail = Vec::new();
        for f in frames {
            keep_tail(&mut tail, f);
        }
        assert!(ends_complete(&tail));
        // The last frame alone (what was kept before) holds no end line.
        assert!(!ends_complete(frames[2]));
        let mut cut = Vec::new();
        keep_tail(&mut cut, frames[0]);
        assert!(!ends_complete(&cut), "a stream cut inside its end line");
        let mut long = vec![b'x'; 10_000];
        long.extend_from_slice(b"\n{\"kind\":\"end\"}\n");
        let mut tail = Vec::new();
        keep_tail(&mut tail, &long);
        assert!(tail.len() <= 4096 && ends_complete(&tail));
    }
}

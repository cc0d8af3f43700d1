//! `herald export` and `herald import` (format in `backup/`).
//!
//! Export reads a data directory directly when herald is stopped (`--data`), or asks a running
//! herald for it (`--url`, `GET /v1/export`): sled lets one process open a directory, so while
//! herald runs only herald can read it, and `--data` says so and points at `--url`. Import
//! writes into a new or empty directory only, and removes what it wrote if the file is bad, so
//! a failed import leaves nothing half-restored behind.
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
use crate::backup::{export, import, BackupError};
use crate::store::pg::{PgBackend, PgOptions};
use crate::store::{Store, StoreError, StoreOptions};

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

#[derive(Args, Debug)]
#[group(id = "target", required = true, multiple = false, args = ["data", "store_url"])]
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
        Some(url) => (open_pg(&url)?.0, crate::store::pg::redact(&url)),
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

/// herald's store on PostgreSQL, for export and import (the password as herald takes it).
fn open_pg(url: &str) -> Result<(Store, Arc<PgBackend>), CliError> {
    let password = ["HERALD_STORE_PASSWORD", "PGPASSWORD"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|p| !p.is_empty()));
    let opts = PgOptions {
        password,
        ..PgOptions::default()
    };
    let backend = Arc::new(PgBackend::open(url, &opts).map_err(local)?);
    let store = Store::with_backend(backend.clone()).map_err(local)?;
    Ok((store, backend))
}

/// Opens a data directory that must exist, saying what to do when herald holds it.
fn open_existing(dir: &Path) -> Result<Store, CliError> {
    if !dir.join("db").exists() {
        return Err(local(format!(
            "no herald data directory at {}",
            dir.display()
        )));
    }
    Store::open_with(dir, &StoreOptions::default()).map_err(|e| match &e {
        StoreError::Sled(sled::Error::Io(io)) if io.to_string().contains("could not acquire lock") => {
            local(format!(
                "{} is in use by a running herald (sled allows one process per directory); export through it instead: herald export --url http://ADDR (the token from HERALD_TOKEN)",
                dir.display()
            ))
        }
        _ => local(format!("cannot open {}: {e}", dir.display())),
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

async fn export_url(url: &str) -> Result<(), CliError> {
    let c = Client::new(url)?;
    let mut body = c.stream("/v1/export").await?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // The output's last bytes, whatever frames they came in: a frame may end inside the end
    // line, or hold only its newline.
    let mut last = Vec::new();
    while let Some(frame) = body.frame().await {
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

/// `herald import`: into a new or empty data directory.
pub async fn import_cmd(args: ImportArgs) -> Result<(), CliError> {
    if let Some(url) = args.store_url {
        return import_pg(&url, args.file.as_deref()).await;
    }
    let dir = args.data.unwrap_or_default();
    import::check_empty(&dir).map_err(local)?;
    let existed = dir.exists();
    let reader = input(args.file.as_deref())?;
    let r = restore(&dir, reader).await;
    match r {
        Ok(i) => {
            eprintln!(
                "herald: imported {} tasks ({} lines) into {}",
                i.tasks,
                i.lines,
                dir.display()
            );
            Ok(())
        }
        Err(e) => {
            // Leave the directory as it was: new and gone, or empty.
            let cleaned = if existed {
                std::fs::read_dir(&dir).map(|es| {
                    for e in es.flatten() {
                        let p = e.path();
                        let _ = if p.is_dir() {
                            std::fs::remove_dir_all(&p)
                        } else {
                            std::fs::remove_file(&p)
                        };
                    }
                })
            } else {
                std::fs::remove_dir_all(&dir)
            };
            let note = match cleaned {
                Ok(()) => "nothing was kept",
                Err(_) => "remove what it wrote before trying again",
            };
            Err(local(format!(
                "import into {} failed ({note}): {e}",
                dir.display()
            )))
        }
    }
}

async fn restore(
    dir: &Path,
    reader: Box<dyn std::io::BufRead>,
) -> Result<import::Imported, BackupError> {
    let store = Store::open_with(dir, &StoreOptions::default())?;
    let r = import::import(&store, reader).await;
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
/// leaves herald's tables empty again.
async fn import_pg(url: &str, file: Option<&Path>) -> Result<(), CliError> {
    let shown = crate::store::pg::redact(url);
    let (store, backend) = open_pg(url)?;
    if backend.holds_tasks().map_err(local)? {
        return Err(local(format!(
            "the database {shown} already holds herald tasks; import only into a database without them"
        )));
    }
    let reader = input(file)?;
    match import::import(&store, reader).await {
        Ok(i) => {
            eprintln!(
                "herald: imported {} tasks ({} lines) into {shown}",
                i.tasks, i.lines
            );
            Ok(())
        }
        Err(e) => {
            drop(store);
            let note = match backend.clear() {
                Ok(()) => "nothing was kept",
                Err(_) => "empty herald's tables before trying again",
            };
            Err(local(format!("import into {shown} failed ({note}): {e}")))
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

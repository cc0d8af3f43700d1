//! The `file` sink: one JSON line per delivered message, appended.
//!
//! Lines go through one writer thread per file that takes everything queued and appends it
//! with one `write` (group write, like the store's group commit): a herd of sends costs a
//! syscall per batch, not a blocking-pool thread per line. (With a `spawn_blocking` per line,
//! a 100 000-message herd grew tokio's blocking pool to hundreds of threads fighting over the
//! file's lock, and the first seconds of the drain stalled.)

use std::io::Write;
use std::path::{Path, PathBuf};

use tokio::sync::oneshot;

use crate::model::Outcome;

/// Lines one `write` takes at most.
const BATCH_LINES: usize = 4_096;

type Line = (Vec<u8>, oneshot::Sender<Result<(), String>>);

pub struct FileSink {
    path: PathBuf,
    lines: crossbeam_channel::Sender<Line>,
}

impl FileSink {
    /// Opens (creating it and its directory if needed) the file for appending, and starts its
    /// writer thread (it ends when the sink is dropped).
    pub fn open(path: &Path) -> std::io::Result<FileSink> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("herald-file".into())
            .spawn(move || writer(file, rx, shown))?;
        Ok(FileSink {
            path: path.to_path_buf(),
            lines: tx,
        })
    }

    /// Appends the delivery (or alert) as one line. Lines are whole (a batch is written with
    /// one `write_all`) and never interleave; a write error is worth a retry.
    pub async fn write<T: serde::Serialize>(&self, d: &T) -> Outcome {
        let mut line = match serde_json::to_vec(d) {
            Ok(l) => l,
            Err(e) => {
                return Outcome::Permanent {
                    error: format!("encode: {e}"),
                }
            }
        };
        line.push(b'\n');
        let (done, wait) = oneshot::channel();
        let r = match self.lines.send((line, done)) {
            Ok(()) => wait
                .await
                .unwrap_or_else(|_| Err("the file writer stopped".into())),
            Err(_) => Err("the file writer stopped".into()),
        };
        match r {
            Ok(()) => Outcome::Sent,
            Err(e) => Outcome::Retry {
                error: format!("write {}: {e}", self.path.display()),
                not_before_ms: None,
            },
        }
    }
}

/// The writer thread: appends every queued line (up to [`BATCH_LINES`]) with one write, then
/// answers each. A failed write fails the whole batch (each send is tried again); a line is
/// never reported written unless `write_all` of its batch returned Ok.
fn writer(mut file: std::fs::File, rx: crossbeam_channel::Receiver<Line>, path: String) {
    let mut buf = Vec::new();
    let mut waiting = Vec::new();
    while let Ok(first) = rx.recv() {
        buf.clear();
        buf.extend_from_slice(&first.0);
        waiting.push(first.1);
        while waiting.len() < BATCH_LINES {
            let Ok((line, done)) = rx.try_recv() else {
                break;
            };
            buf.extend_from_slice(&line);
            waiting.push(done);
        }
        let r = file.write_all(&buf).map_err(|e| e.to_string());
        if let Err(e) = &r {
            tracing::warn!(file = %path, error = %e, lines = waiting.len(), "file channel write failed; the sends are tried again");
        }
        for done in waiting.drain(..) {
            let _ = done.send(r.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_land_as_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out/sent.jsonl");
        let sink = std::sync::Arc::new(FileSink::open(&path).unwrap());
        let mut tasks = Vec::new();
        for i in 0..2_000u32 {
            let sink = sink.clone();
            tasks.push(tokio::spawn(async move {
                sink.write(&serde_json::json!({ "n": i, "pad": "x".repeat(300) }))
                    .await
            }));
        }
        for t in tasks {
            assert!(matches!(t.await.unwrap(), Outcome::Sent));
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut seen: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["n"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        seen.sort();
        assert_eq!(seen, (0..2_000).collect::<Vec<u64>>());
    }
}

//! The `file` sink: one JSON line per delivered message, appended.
//!
//! Lines go through one writer thread per file that takes everything queued and appends it
//! with one `write` (group write, like the store's group commit): a herd of sends costs a
//! syscall per batch, not a blocking-pool thread per line. (With a `spawn_blocking` per line,
//! a 100 000-message herd grew tokio's blocking pool to hundreds of threads fighting over the
//! file's lock, and the first seconds of the drain stalled.)
//!
//! A line counts as delivered (its cursor moves on) only once it is durable: each batch is
//! `fdatasync`ed before any of its sends is answered, as the store's own group commit is. A
//! line only in the page cache would be lost with the machine while the store, synced,
//! says it was sent, and it would never go again.

use std::io::Write;
use std::path::{Path, PathBuf};

use tokio::sync::oneshot;

use crate::model::Outcome;

/// Lines one `write` takes at most.
const BATCH_LINES: usize = 4_096;

/// A write this slow is logged (at warn): the sends of its lines waited as long.
const SLOW_WRITE: std::time::Duration = std::time::Duration::from_millis(50);

type Line = (Vec<u8>, oneshot::Sender<Result<(), String>>);

pub struct FileSink {
    path: PathBuf,
    lines: crossbeam_channel::Sender<Line>,
}

impl FileSink {
    /// Opens (creating it and its directory if needed) the file for appending, and starts its
    /// writer thread (it ends when the sink is dropped).
    pub fn open(path: &Path) -> std::io::Result<FileSink> {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir {
            std::fs::create_dir_all(dir)?;
        }
        let created = !path.exists();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        if created {
            // The new file's name must survive the machine too, or its synced lines go with it.
            std::fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()?;
        }
        close_torn_line(path, &mut file)?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let shown = path.display().to_string();
        let at = path.to_path_buf();
        std::thread::Builder::new()
            .name("herald-file".into())
            .spawn(move || writer(file, at, rx, shown))?;
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

impl FileSink {
    /// Appends many deliveries in one go (a chunk of a herd's sends, `engine/chunk.rs`): one
    /// line each, handed to the writer as one piece, so they land together and in order. One
    /// outcome per item, in order: they share the write's result, except an item that cannot
    /// be encoded (permanent, alone).
    pub async fn write_many<T: serde::Serialize>(&self, items: &[&T]) -> Vec<Outcome> {
        let mut buf = Vec::new();
        let mut encoded = Vec::with_capacity(items.len());
        for d in items {
            let start = buf.len();
            match serde_json::to_writer(&mut buf, d) {
                Ok(()) => {
                    buf.push(b'\n');
                    encoded.push(Ok(()));
                }
                Err(e) => {
                    // What it wrote before failing must not prefix the next line.
                    buf.truncate(start);
                    encoded.push(Err(format!("encode: {e}")));
                }
            }
        }
        let r = if buf.is_empty() {
            Ok(())
        } else {
            let (done, wait) = oneshot::channel();
            match self.lines.send((buf, done)) {
                Ok(()) => wait
                    .await
                    .unwrap_or_else(|_| Err("the file writer stopped".into())),
                Err(_) => Err("the file writer stopped".into()),
            }
        };
        encoded
            .into_iter()
            .map(|e| match (e, &r) {
                (Err(error), _) => Outcome::Permanent { error },
                (Ok(()), Ok(())) => Outcome::Sent,
                (Ok(()), Err(e)) => Outcome::Retry {
                    error: format!("write {}: {e}", self.path.display()),
                    not_before_ms: None,
                },
            })
            .collect()
    }
}

/// A kill during a write (or a write that failed part-way: a full disk) can leave the file's
/// last line cut short. It is ended with a newline, so that the next line is whole (the message
/// it held was not recorded as sent: it goes again). A file herald may not read (write-only
/// permissions) is left as it is.
fn close_torn_line(path: &Path, file: &mut impl Write) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut r) = std::fs::File::open(path) else {
        return Ok(());
    };
    if r.metadata()?.len() == 0 {
        return Ok(());
    }
    r.seek(SeekFrom::End(-1))?;
    let mut last = [0u8; 1];
    r.read_exact(&mut last)?;
    if last[0] != b'\n' {
        file.write_all(b"\n")?;
    }
    Ok(())
}

/// What the writer appends to: the file, whose `sync` is `fdatasync`.
trait Append: Write {
    fn sync(&mut self) -> std::io::Result<()>;
}

impl Append for std::fs::File {
    fn sync(&mut self) -> std::io::Result<()> {
        self.sync_data()
    }
}

/// The writer thread: appends every queued line (up to [`BATCH_LINES`]) with one write and
/// makes it durable with one sync, then answers each. A failed write or sync fails the whole
/// batch (each send is tried again; a line that did land is then written twice, as any
/// in-flight send may be); a line is never reported written unless the `write_all` and the
/// sync of its batch returned Ok.
fn writer(mut file: impl Append, at: PathBuf, rx: crossbeam_channel::Receiver<Line>, path: String) {
    let mut buf = Vec::new();
    let mut waiting = Vec::new();
    // A failed write may have left part of its batch: the next one starts on a new line.
    let mut torn = false;
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
        let started = std::time::Instant::now();
        let r = if torn {
            close_torn_line(&at, &mut file)
        } else {
            Ok(())
        }
        .and_then(|()| file.write_all(&buf))
        .and_then(|()| file.sync())
        .map_err(|e| e.to_string());
        torn = r.is_err();
        let took = started.elapsed();
        if took >= SLOW_WRITE {
            // A plain append can wait on the filesystem (ext4 starts a journal handle for the
            // size and mtime, and waits while a commit forced by someone's fsync is locked).
            tracing::warn!(file = %path, took_ms = took.as_millis() as u64, lines = waiting.len(),
                bytes = buf.len(), "file channel write was slow");
        }
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

    /// An append target that logs each call, and whose sync can fail.
    struct Logged {
        calls: std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>,
        sync_fails: bool,
    }

    impl Write for Logged {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.calls.lock().unwrap().push("write");
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Append for Logged {
        fn sync(&mut self) -> std::io::Result<()> {
            self.calls.lock().unwrap().push("sync");
            if self.sync_fails {
                return Err(std::io::Error::other("injected sync failure"));
            }
            Ok(())
        }
    }

    /// Sends one line through a writer thread over `Logged`; the calls made by the time the
    /// line was answered, and the answer.
    fn answered(sync_fails: bool) -> (Vec<&'static str>, Result<(), String>) {
        let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let target = Logged {
            calls: calls.clone(),
            sync_fails,
        };
        let (tx, rx) = crossbeam_channel::unbounded();
        let t = std::thread::spawn(move || {
            writer(target, PathBuf::from("/nonexistent/x"), rx, "x".into())
        });
        let (done, wait) = oneshot::channel();
        tx.send((b"{}\n".to_vec(), done)).unwrap();
        let r = wait.blocking_recv().unwrap();
        let seen = calls.lock().unwrap().clone();
        drop(tx);
        t.join().unwrap();
        (seen, r)
    }

    #[test]
    fn a_line_is_answered_only_after_its_batch_is_synced() {
        let (calls, r) = answered(false);
        assert_eq!(r, Ok(()));
        assert_eq!(calls, ["write", "sync"]);
    }

    #[test]
    fn a_failed_sync_fails_the_batch() {
        let (calls, r) = answered(true);
        assert!(r.unwrap_err().contains("injected sync failure"));
        assert_eq!(calls, ["write", "sync"]);
    }

    /// The `n` of every line of the file, in file order.
    fn ns(path: &Path) -> Vec<u64> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["n"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }

    #[tokio::test]
    async fn a_torn_last_line_is_closed_before_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sent.jsonl");
        std::fs::write(&path, "{\"n\":1}\n{\"n\":2,\"bo").unwrap();
        let sink = FileSink::open(&path).unwrap();
        assert!(matches!(
            sink.write(&serde_json::json!({"n": 3})).await,
            Outcome::Sent
        ));
        drop(sink);
        // A whole file is left as it is.
        let sink = FileSink::open(&path).unwrap();
        assert!(matches!(
            sink.write(&serde_json::json!({"n": 4})).await,
            Outcome::Sent
        ));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"n\":1}\n{\"n\":2,\"bo\n{\"n\":3}\n{\"n\":4}\n");
    }

    #[tokio::test]
    async fn a_chunk_lands_as_whole_lines_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sent.jsonl");
        let sink = FileSink::open(&path).unwrap();
        let items: Vec<serde_json::Value> = (0..500u32)
            .map(|i| serde_json::json!({ "n": i, "body": "line\nbreak" }))
            .collect();
        let refs: Vec<&serde_json::Value> = items.iter().collect();
        let out = sink.write_many(&refs).await;
        assert_eq!(out.len(), 500);
        assert!(out.iter().all(|o| matches!(o, Outcome::Sent)));
        assert_eq!(ns(&path), (0..500).collect::<Vec<u64>>());
    }

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
        let mut seen = ns(&path);
        seen.sort();
        assert_eq!(seen, (0..2_000).collect::<Vec<u64>>());
    }
}

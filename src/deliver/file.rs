//! The `file` sink: one JSON line per delivered message, appended.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::model::Outcome;

pub struct FileSink {
    path: PathBuf,
    file: Arc<Mutex<std::fs::File>>,
}

impl FileSink {
    /// Opens (creating it and its directory if needed) the file for appending.
    pub fn open(path: &Path) -> std::io::Result<FileSink> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(FileSink {
            path: path.to_path_buf(),
            file: Arc::new(Mutex::new(file)),
        })
    }

    /// Appends the delivery (or alert) as one line. The line is written with a single `write_all` under a
    /// lock so concurrent deliveries never interleave; a write error is worth a retry.
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
        let file = self.file.clone();
        let r = tokio::task::spawn_blocking(move || file.lock().write_all(&line)).await;
        match r {
            Ok(Ok(())) => Outcome::Sent,
            Ok(Err(e)) => Outcome::Retry {
                error: format!("write {}: {e}", self.path.display()),
                not_before_ms: None,
            },
            Err(e) => Outcome::Retry {
                error: format!("write task: {e}"),
                not_before_ms: None,
            },
        }
    }
}

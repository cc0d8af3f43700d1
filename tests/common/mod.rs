//! Shared test helpers: a scriptable local webhook receiver and a tiny HTTP client.
#![allow(dead_code)]

pub mod audit;
pub mod cluster;
pub mod contract;
pub mod herald;
pub mod history;
pub mod http;
pub mod pg;
pub mod pgproxy;
pub mod platform;
pub mod receiver;
pub mod tools;

/// Header names lower-cased, values lossily decoded: how the client and the receiver record them.
pub fn header_pairs(headers: &hyper::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// A checked-in data directory (`tests/fixtures/<name>`) copied into a fresh temp dir, ready
/// to open (the fixture itself is never written to).
pub fn fixture_copy(name: &str) -> tempfile::TempDir {
    fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let target = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy_dir(&e.path(), &target);
            } else {
                std::fs::copy(e.path(), target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
        dir.path(),
    );
    // git keeps no empty directories; sled wants its blob directory.
    std::fs::create_dir_all(dir.path().join("blobs")).unwrap();
    dir
}

//! Where a data directory's bytes go: per sled tree, its keys, and the bytes of their keys and
//! values, beside the directory's size on disk. The gap between the two is sled's own cost
//! (node headers, its log's garbage and free segments), which is what issue 29's bytes per
//! task target is about. Run it on a directory no herald has open, after a clean stop or once
//! the memtable was in sled (`herald_store_memtable_bytes` 0), or the last writes are missing.
//!
//! ```sh
//! cargo run --release --example tree_bytes -- /path/to/data/sled
//! ```

fn du(p: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(p) else {
        return std::fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0);
    };
    rd.flatten()
        .map(|e| {
            let path = e.path();
            match e.metadata() {
                Ok(m) if m.is_dir() => du(&path),
                Ok(m) => m.blocks() * 512,
                Err(_) => 0,
            }
        })
        .sum()
}

fn main() {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: tree_bytes SLED_DIR");
        std::process::exit(2);
    };
    let dir = std::path::PathBuf::from(dir);
    let on_disk = du(&dir);
    let db = sled::Config::new().path(&dir).open().expect("open sled");
    let (mut keys_all, mut bytes_all) = (0u64, 0u64);
    println!(
        "{:<14} {:>10} {:>12} {:>12}",
        "tree", "keys", "key bytes", "value bytes"
    );
    for name in db.tree_names() {
        let tree = db.open_tree(&name).expect("tree");
        let (mut n, mut kb, mut vb) = (0u64, 0u64, 0u64);
        for item in tree.iter() {
            let (k, v) = item.expect("read");
            n += 1;
            kb += k.len() as u64;
            vb += v.len() as u64;
        }
        if n == 0 {
            continue;
        }
        println!(
            "{:<14} {n:>10} {kb:>12} {vb:>12}",
            String::from_utf8_lossy(&name)
        );
        keys_all += n;
        bytes_all += kb + vb;
    }
    println!(
        "all: {keys_all} keys, {bytes_all} bytes of keys and values; {on_disk} bytes on disk \
         ({:.2}x; {:.0} bytes of sled's own per key)",
        on_disk as f64 / bytes_all.max(1) as f64,
        on_disk.saturating_sub(bytes_all) as f64 / keys_all.max(1) as f64
    );
}

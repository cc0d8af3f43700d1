//! PostgreSQL behind [`crate::store::backend::Backend`]: the same engine on a database that
//! users replicate (`../shared/HA.md`). Without `[store] url` none of this runs.
//!
//! Layout (`schema.rs`): one table per tree, `herald_<tree>(shard int, key bytea primary key,
//! value bytea)`, where `shard` is the task's shard (`shard.rs`: FNV-1a of the task id mod S,
//! S kept in `herald_meta`); a lease table `herald_shard` for the cluster's epoch fence (one
//! node owns every shard until issue 24); `herald_meta` holding the schema version and S.
//!
//! A commit group is one transaction (`backend.rs`): the keys its preconditions and indexed
//! writes depend on are read in one pipelined round trip, the group is resolved in memory
//! (`resolve.rs`, pure), and its writes go as one multi-row upsert and one multi-row delete per
//! tree, pipelined, then `COMMIT`.
//!
//! One process writes a database, or cluster nodes do: herald's process lock, a session-level
//! advisory lock held exclusively by a single-node process and shared by cluster nodes
//! (`lock.rs`). Commits have connections of their own, apart from the reads' pool
//! (`backend.rs`, `COMMIT_CONNECTIONS`).

pub mod backend;
pub mod backoff;
pub mod fence;
pub mod lock;
pub mod resolve;
pub mod schema;
pub mod shard;

pub use backend::{PgBackend, PgOptions};

/// The smallest key above every key that starts with `prefix`, or `None` when there is none
/// (the prefix is empty or all 0xFF): a prefix scan is then the range `prefix ..< end`, which
/// the primary key's B-tree answers (bytea compares bytewise, as Rust's `[u8]` does).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// `url` with its password replaced by `***`, for every message and log line: a
/// `postgres://user:secret@host/db` URL or a `key=value` string with `password=secret`.
///
/// The credentials are what tokio-postgres takes for them: everything after `://` up to the
/// first `@`, wherever it is (its URL parser reads them so), not only an `@` before the first
/// `/`: a password holding a raw `/` (`postgres://u:pa/ss@db/x`) is still a password.
pub fn redact(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        if let Some(at) = rest.find('@') {
            let userinfo = &rest[..at];
            if let Some(colon) = userinfo.find(':') {
                // The query after the credentials may name a password too (and a query `@`
                // read as the credentials' end leaves the real one after it).
                return redact_param(
                    &format!(
                        "{}{}:***{}",
                        &url[..scheme_end + 3],
                        &userinfo[..colon],
                        &rest[at..]
                    ),
                    "password=",
                );
            }
        }
        // A password may also come as a query parameter.
        return redact_param(url, "password=");
    }
    redact_param(url, "password=")
}

fn redact_param(s: &str, name: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(name) {
        out.push_str(&rest[..i + name.len()]);
        out.push_str("***");
        rest = &rest[i + name.len()..];
        let end = rest.find([' ', '&']).unwrap_or(rest.len());
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix_range() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
        assert_eq!(prefix_end(b"t\0"), Some(b"t\x01".to_vec()));
    }

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(
            redact("postgres://herald:s3cr:et@db:5432/herald"),
            "postgres://herald:***@db:5432/herald"
        );
        assert_eq!(
            redact("postgres://herald@127.0.0.1:5432/herald"),
            "postgres://herald@127.0.0.1:5432/herald"
        );
        assert_eq!(
            redact("postgres://h@db/x?password=abc&sslmode=disable"),
            "postgres://h@db/x?password=***&sslmode=disable"
        );
        assert_eq!(
            redact("host=db password=abc user=h"),
            "host=db password=*** user=h"
        );
        // tokio-postgres reads the credentials up to the first `@`, a `/` or `?` in them too.
        for (url, secret) in [
            ("postgres://u:pa/ss@db/x", "pa/ss"),
            ("postgres://u:p?w@db/x", "p?w"),
            ("postgres://u:a/b?c@db:5432/x?sslmode=disable", "a/b?c"),
        ] {
            let shown = redact(url);
            assert!(!shown.contains(secret), "{url} shown as {shown}");
            assert!(shown.starts_with("postgres://u:***@db"), "{shown}");
        }
        // An `@` in the query is read as the credentials' end; the query's password is still
        // hidden.
        let shown = redact("postgres://db:5432/x?user=me@corp&password=secret");
        assert!(!shown.contains("secret"), "{shown}");
    }
}

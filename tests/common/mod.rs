//! Shared test helpers: a scriptable local webhook receiver and a tiny HTTP client.
#![allow(dead_code)]

pub mod contract;
pub mod herald;
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

//! Shared test helpers: a scriptable local webhook receiver and a tiny HTTP client.
#![allow(dead_code)]

pub mod herald;
pub mod http;
pub mod receiver;

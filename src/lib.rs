//! herald: sends messages at the right time. See ARCHITECTURE.md for the code map.

pub mod api;
pub mod backup;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod deliver;
pub mod engine;
pub mod fdlimit;
pub mod logsafe;
pub mod model;
pub mod schedule;
pub mod server;
pub mod store;
pub mod trace;
pub mod wheel;

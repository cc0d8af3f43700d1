//! herald: sends messages at the right time. See ARCHITECTURE.md for the code map.

pub mod clock;
pub mod deliver;
pub mod engine;
pub mod model;
pub mod schedule;
pub mod store;
pub mod wheel;

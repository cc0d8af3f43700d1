//! Quiet hours as a task or a channel holds them: a daily window of local minutes in a zone.
//! The rules that read it against a clock and a zone database are in `schedule::quiet`.

use serde::{Deserialize, Serialize};

/// A daily window `[from, to)` of local wall-clock minutes; `from > to` crosses midnight
/// (22:00–08:00). `zone`: an IANA name, or `recipient` (each message's own `tz`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct QuietHours {
    pub from_min: u16,
    pub to_min: u16,
    pub tz: String,
}

impl QuietHours {
    /// Whether the local minute of the day `m` is inside the window.
    pub fn inside(&self, m: u16) -> bool {
        match self.from_min.cmp(&self.to_min) {
            std::cmp::Ordering::Less => (self.from_min..self.to_min).contains(&m),
            std::cmp::Ordering::Greater => m >= self.from_min || m < self.to_min,
            std::cmp::Ordering::Equal => false,
        }
    }
}

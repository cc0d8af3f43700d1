//! Limits on what one request may ask for. Units are in the names.

/// Limits applied when validating a task. All are configurable in principle; these are the
/// documented defaults of API.md.
#[derive(Clone, Debug)]
pub struct Limits {
    pub messages_max: usize,
    pub message_body_bytes_max: usize,
    pub recipient_bytes_max: usize,
    pub name_bytes_max: usize,
    pub metadata_entries_max: usize,
    pub metadata_key_bytes_max: usize,
    pub metadata_value_bytes_max: usize,
    /// How far ahead a schedule may reach.
    pub horizon_ms: u64,
    pub max_attempts_max: u32,
    pub interval_ms_max: u64,
    pub backoff_ms_max: u64,
    /// Tasks that may be pending, running or paused at once (each holds memory and a wheel
    /// entry); creates past it are refused.
    pub live_tasks_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            messages_max: 10_000,
            message_body_bytes_max: 64 * 1024,
            recipient_bytes_max: 1024,
            name_bytes_max: 1024,
            metadata_entries_max: 64,
            metadata_key_bytes_max: 128,
            metadata_value_bytes_max: 1024,
            horizon_ms: 10 * 366 * 86_400_000,
            max_attempts_max: 100,
            interval_ms_max: 7 * 86_400_000,
            backoff_ms_max: 7 * 86_400_000,
            live_tasks_max: 1_000_000,
        }
    }
}

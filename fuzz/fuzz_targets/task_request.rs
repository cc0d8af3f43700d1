//! Any bytes as a task creation body: parsing and validation must answer Ok or a field error,
//! never panic.
#![no_main]

use herald::model::Limits;
use herald::request::{Context, TaskRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = serde_json::from_slice::<TaskRequest>(data) else {
        return;
    };
    let limits = Limits::default();
    let exists = |c: &str| c == "log" || c == "hook";
    let cx = Context {
        now_ms: 1_800_000_000_000,
        limits: &limits,
        channel_exists: &exists,
    };
    if let Ok((task, messages)) = req.into_task(&cx) {
        // A message of its own, or the messages stored apart: never none.
        assert!(
            task.message_count > 0
                && (messages.is_empty() || messages.len() == task.message_count as usize)
        );
        assert!(herald::model::check_id(&task.id).is_ok());
        let _ = herald::schedule::describe(&task.schedule);
    }
});

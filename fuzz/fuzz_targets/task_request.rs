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
    if let Ok(task) = req.into_task(&cx) {
        assert!(!task.messages.is_empty());
        assert!(herald::model::check_id(&task.id).is_ok());
        let _ = herald::schedule::describe(&task.schedule);
    }
});

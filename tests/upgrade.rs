//! A data directory written by format-1 herald (`tests/fixtures/v1-data`, made by herald 0.1
//! before the spec/progress split: a paused cron, a pending `at` in a zone, pending reminders,
//! a sequence in the middle of its run, a completed task and a failure-list entry) opens in this
//! build: the tasks are migrated on open, and the engine serves them.

mod common;

use herald::model::TaskState;
use herald::store::Store;

fn fixture() -> tempfile::TempDir {
    common::fixture_copy("v1-data")
}

#[tokio::test]
async fn format_1_records_are_migrated_on_open() {
    let dir = fixture();
    {
        let s = Store::open(dir.path()).unwrap();
        let t = |id: &str| {
            s.get_task(id)
                .unwrap()
                .unwrap_or_else(|| panic!("{id} missing"))
        };
        assert_eq!(t("pending-at").state, TaskState::Pending);
        assert_eq!(
            t("pending-at").metadata.get("k").map(String::as_str),
            Some("v")
        );
        assert_eq!(t("cron-paused").state, TaskState::Paused);
        assert_eq!(t("cron-paused").name.as_deref(), Some("digest"));
        assert_eq!(t("cron-paused").message_count, 2);
        assert_eq!(t("reminders").state, TaskState::Pending);
        assert_eq!(t("done").state, TaskState::Completed);
        let seq = t("seq-running");
        assert_eq!((seq.state, seq.message_count), (TaskState::Running, 6));
        assert_eq!(s.get_message("seq-running", 5).unwrap().unwrap().to, "f");
        assert_eq!(
            s.get_message("pending-at", 0).unwrap().unwrap().body,
            "morning"
        );
        let run = s.last_run("seq-running").unwrap().unwrap();
        assert_eq!((run.cursor, run.sent, run.total), (1, 1, 6));
        let (f, _) = s.failure_page(None, None, 10).unwrap();
        assert_eq!(
            f.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
            ["fails:1:0"]
        );
        // Only unfinished tasks are in the live index.
        let mut live: Vec<String> = s.live_entries().map(|e| e.unwrap().0).collect();
        live.sort();
        assert_eq!(
            live,
            ["cron-paused", "pending-at", "reminders", "seq-running"]
        );
    }
    // Opening again is a no-op (the format is recorded).
    let s = common::herald::reopen(|| Store::open(dir.path()));
    assert_eq!(s.live_entries().count(), 4);
}

#[tokio::test]
async fn a_migrated_directory_serves_over_http() {
    let dir = fixture();
    // The fixture's failing task used a webhook channel `hook`.
    let config = common::herald::webhook_channel("hook", "http://127.0.0.1:9/unreachable", "");
    let server = common::herald::start_in(dir.path(), &config).await;
    let r = common::http::get(&format!("{}/v1/tasks/seq-running", server.url())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert_eq!(body["state"], "running");
    assert_eq!(body["messages"], 6);
    let r = common::http::get(&format!("{}/v1/tasks?state=paused", server.url())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["tasks"][0]["id"], "cron-paused");
}

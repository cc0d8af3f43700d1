//! A data directory written by format-5 herald (`tests/fixtures/v5-data`: every message in the
//! `messages` tree, a progress record beside every spec) opens in this build, whose creates
//! keep a single message inside the spec and store no progress until the task's first change
//! (format 6). The old records are read as they are; rewriting them keeps them whole.
//!
//! The fixture was written through `Store` by the build before format 6 (commit noted in the
//! commit that added it): `one` (one message, an idempotency key, metadata), `seq` (three
//! messages), `running` (fired: progress and a running run), `done` (completed), `cron` (a
//! daily cron in Asia/Shanghai). Its write-ahead log was checkpointed into sled and removed.

mod common;

use herald::model::{Limits, Message, TaskState};
use herald::request::{Context, TaskRequest};
use herald::store::{Batch, Inserted, Op, Store};

fn fixture() -> tempfile::TempDir {
    common::fixture_copy("v5-data")
}

fn msg(to: &str, body: &str) -> Message {
    Message {
        to: to.into(),
        body: body.into(),
        data: None,
        tz: None,
    }
}

#[tokio::test]
async fn format_5_records_open_as_they_are_and_keep_their_messages_when_rewritten() {
    let dir = fixture();
    let s = Store::open(dir.path()).unwrap();
    let t = |id: &str| {
        s.get_task(id)
            .unwrap()
            .unwrap_or_else(|| panic!("{id} missing"))
    };
    let one = t("one");
    assert_eq!(
        (one.state, one.message_count, one.name.as_deref()),
        (TaskState::Pending, 1, Some("single"))
    );
    assert_eq!(one.metadata.get("k").map(String::as_str), Some("v"));
    assert_eq!(
        s.get_message("one", 0).unwrap().unwrap().body,
        "Your class starts soon"
    );
    assert!(s.get_message("one", 1).unwrap().is_none());
    assert_eq!(s.idem_get("idem-one").unwrap().unwrap().task_id, "one");
    assert_eq!(t("seq").message_count, 3);
    assert_eq!(s.get_message("seq", 2).unwrap().unwrap().body, "m2");
    let running = t("running");
    assert_eq!((running.state, running.runs), (TaskState::Running, 1));
    assert_eq!(s.active_runs_of("running").unwrap().len(), 1);
    assert_eq!(t("done").state, TaskState::Completed);
    assert!(matches!(
        t("cron").schedule,
        herald::model::Schedule::Cron { .. }
    ));
    let mut live: Vec<String> = s.live_entries().map(|e| e.unwrap().0).collect();
    live.sort();
    assert_eq!(live, ["cron", "one", "running", "seq"]);
    // The export reads the old records whole.
    let image = s.task_image("seq").unwrap().unwrap();
    assert_eq!(image.messages.len(), 3);
    let image = s.task_image("one").unwrap().unwrap();
    assert_eq!(image.messages, [msg("u1", "Your class starts soon")]);

    // A rewrite of an old spec (a patch of its name) keeps its messages where they are.
    let mut renamed = t("one");
    renamed.name = Some("renamed".into());
    let mut b = Batch::new();
    b.task(&renamed);
    s.write(&b).await.unwrap();
    assert_eq!(t("one").name.as_deref(), Some("renamed"));
    assert_eq!(
        s.get_message("one", 0).unwrap().unwrap().body,
        "Your class starts soon"
    );

    // A new task next to them: its message inside the spec, its progress derived.
    let req: TaskRequest = serde_json::from_value(serde_json::json!({
        "id": "fresh", "schedule": {"after": "1h"}, "to": ["n"], "body": "new layout"
    }))
    .unwrap();
    let (fresh, m) = req
        .into_task(&Context {
            now_ms: 1_800_000_000_000,
            limits: &Limits::default(),
            channel_exists: &|_| true,
        })
        .unwrap();
    assert!(matches!(
        s.insert_new_task(&fresh, &m, None).await.unwrap(),
        Inserted::Created
    ));
    assert_eq!(t("fresh"), fresh);
    assert_eq!(
        s.get_message("fresh", 0).unwrap().unwrap().body,
        "new layout"
    );
    // A rename keeps the message inside the spec; a patch of the messages moves them out
    // (the spec must not shadow them), and message 0 is the new one.
    let mut renamed = fresh.clone();
    renamed.name = Some("n2".into());
    let mut b = Batch::new();
    b.task(&renamed);
    s.write(&b).await.unwrap();
    assert_eq!(
        s.get_message("fresh", 0).unwrap().unwrap().body,
        "new layout"
    );
    let mut b = Batch::new();
    b.ops.push(Op::Messages {
        task_id: "fresh".into(),
        old_count: 1,
        messages: vec![msg("p", "patched 0"), msg("q", "patched 1")],
    });
    renamed.message_count = 2;
    b.task(&renamed);
    s.write(&b).await.unwrap();
    assert_eq!(
        s.get_message("fresh", 0).unwrap().unwrap().body,
        "patched 0"
    );
    assert_eq!(
        s.get_message("fresh", 1).unwrap().unwrap().body,
        "patched 1"
    );
    let image = s.task_image("fresh").unwrap().unwrap();
    assert_eq!(image.messages.len(), 2);
    drop(s);

    // Reopened (format 6 recorded), everything reads the same.
    let s = common::herald::reopen(|| Store::open(dir.path()));
    assert_eq!(
        s.get_task("fresh").unwrap().unwrap().name.as_deref(),
        Some("n2")
    );
    assert_eq!(
        s.get_message("fresh", 1).unwrap().unwrap().body,
        "patched 1"
    );
    assert_eq!(s.get_message("seq", 0).unwrap().unwrap().body, "m0");
    assert_eq!(
        s.get_task("running").unwrap().unwrap().state,
        TaskState::Running
    );
}

/// The create of a one-message task writes fewer keys than format 5 did: no `messages` entry
/// and no progress record (the spec, the live entry and its due-index twin).
#[tokio::test]
async fn a_one_message_create_keeps_its_message_in_the_spec_and_stores_no_progress() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let req: TaskRequest = serde_json::from_value(serde_json::json!({
        "id": "t", "schedule": {"after": "1h"}, "to": ["n"], "body": "b"
    }))
    .unwrap();
    let (t, m) = req
        .into_task(&Context {
            now_ms: 1_800_000_000_000,
            limits: &Limits::default(),
            channel_exists: &|_| true,
        })
        .unwrap();
    s.insert_new_task(&t, &m, None).await.unwrap();
    let footprint = s.footprint("t").unwrap();
    assert_eq!(footprint.messages, 0, "no key in `messages` to delete");
    assert!(
        s.progress_page(None, 10).unwrap().0.is_empty(),
        "no progress record"
    );
    assert_eq!(s.get_task("t").unwrap().unwrap(), t);
    // The first change stores it.
    let mut paused = t.clone();
    paused.state = TaskState::Paused;
    let mut b = Batch::new();
    b.progress(&paused);
    s.write(&b).await.unwrap();
    assert_eq!(s.progress_page(None, 10).unwrap().0.len(), 1);
    assert_eq!(s.get_task("t").unwrap().unwrap().state, TaskState::Paused);
}

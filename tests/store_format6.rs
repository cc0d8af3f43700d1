//! A data directory written by format-6 herald before its records had frozen types of their own
//! (`tests/fixtures/v6-data`) opens in this build and reads back every field of every record.
//!
//! The fixture was written through `Store` by [`write_the_format_6_fixture`] on the build before
//! the frozen record types (`store/records/`; commit 24ba781), from the values [`fixture`] builds,
//! then reopened until its write-ahead log was in sled, and the log removed. It holds:
//! `cron` (a cron in a zone with every schedule knob, its own retry policy, three runs, one
//! failure), `paced` (three messages with data and recipient zones, batch pacing, running),
//! `notify` (one message kept inside its spec, notify, its own quiet hours, recipient zones, a
//! trace id, `zh`, an idempotency key, a timeline), `reminders` (paused), `done` (completed).
//!
//! Format 7 (issue 29) folds the `live` tree into the progress records on open
//! (`store/migrate.rs`): [`format_6_records_written_before_the_frozen_types_read_back_every_field`]
//! opens the format-6 fixture, finds every field, and finds the `live` tree empty and each
//! unfinished task's due entry derived from its progress.
//!
//! The same values written by this build are checked in as `tests/fixtures/v7-data` (written
//! by the build that introduced format 7), and [`this_build_writes_the_fixtures_bytes`] writes
//! them afresh and compares every record of every tree with it. Rewrite that fixture (only
//! ever on purpose, with the build whose bytes it is to hold):
//! `HERALD_WRITE_FIXTURE=tests/fixtures/v7-data cargo test --test store_format6 -- this_build`
//! (the comparison then fails if the bytes changed: that is the point of rewriting it).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use herald::model::timeline::{TimelineEvent, TimelineKind};
use herald::model::{
    Backoff, DstGap, DstPolicy, DstRepeat, Failure, Lang, Message, Misfire, Notify, NotifyOn,
    Overlap, Pacing, QuietSetting, RetryPolicy, Run, RunState, Schedule, Task, TaskState,
};
use herald::schedule::quiet::QuietHours;
use herald::store::{Batch, Inserted, Store};

const T0: u64 = 1_800_000_000_000;

fn msg(to: &str, body: &str, data: Option<&str>, tz: Option<&str>) -> Message {
    Message {
        to: to.into(),
        body: body.into(),
        data: data.map(Into::into),
        tz: tz.map(Into::into),
    }
}

/// A task with every field set to something other than its default where it can be.
fn task(id: &str, schedule: Schedule, state: TaskState, messages: &[Message]) -> Task {
    Task {
        id: id.into(),
        name: Some(format!("{id} name")),
        channel: "log".into(),
        schedule,
        message_count: messages.len() as u32,
        pacing: Pacing::default(),
        retry: None,
        misfire: Misfire::FireNow,
        misfire_grace_ms: 600_000,
        overlap: Overlap::Skip,
        metadata: BTreeMap::from([("team".into(), id.into())]),
        state,
        created_at_ms: T0,
        updated_at_ms: T0 + 5,
        next_fire_at_ms: Some(T0 + 3_600_000),
        runs: 0,
        fires: 0,
        last_fire_ms: None,
        last_slot_wall_ms: None,
        done_offsets_ms: Vec::new(),
        queued: Vec::new(),
        skipped: 0,
        expired: 0,
        watched_since_ms: T0 + 1,
        failed_reason: None,
        lang: Lang::En,
        recipient_zones: Vec::new(),
        quiet_hours: QuietSetting::Channel,
        notify: None,
        trace_id: None,
    }
}

/// An idempotency key and the hash of its request body.
type Idem = Option<(String, [u8; 32])>;

struct Fixture {
    /// Each task, its messages, its idempotency key (key, body hash), its runs and timeline.
    tasks: Vec<(Task, Vec<Message>, Idem)>,
    runs: Vec<(String, Run)>,
    failures: Vec<Failure>,
    timeline: Vec<(String, Vec<TimelineEvent>)>,
}

fn fixture() -> Fixture {
    let cron_msgs = [msg("ops@example.com", "daily digest", None, None)];
    let mut cron = task(
        "cron",
        Schedule::Cron {
            cron: "0 9 * * MON-FRI".into(),
            tz: Some("Asia/Shanghai".into()),
            dst: DstPolicy {
                gap: DstGap::Skip,
                repeat: DstRepeat::Both,
            },
            start: Some("2027-01-01T00:00:00Z".into()),
            start_ms: Some(T0 - 1_000),
            end: Some("2028-01-01T00:00:00Z".into()),
            end_ms: Some(T0 + 86_400_000 * 365),
            max_runs: Some(500),
        },
        TaskState::Pending,
        &cron_msgs,
    );
    cron.retry = Some(RetryPolicy {
        max_attempts: 7,
        backoff: Backoff::Exponential,
        initial_ms: 2_000,
        max_ms: 120_000,
    });
    cron.misfire = Misfire::FireAll;
    cron.misfire_grace_ms = 30_000;
    cron.overlap = Overlap::Queue;
    cron.runs = 2;
    cron.fires = 3;
    cron.skipped = 1;
    cron.last_fire_ms = Some(T0 + 120_000);
    cron.queued = vec![herald::model::Queued::at(4, T0 + 180_000)];
    cron.updated_at_ms = T0 + 130_000;

    let paced_msgs = [
        msg(
            "u1",
            "m0",
            Some(r#"{"template":"a"}"#),
            Some("Europe/Berlin"),
        ),
        msg("u2", "m1", None, Some("America/New_York")),
        msg("u3", "m2", Some("{}"), Some("Europe/Berlin")),
    ];
    let mut paced = task(
        "paced",
        Schedule::After {
            after: "10m".into(),
            after_ms: 600_000,
            at_ms: T0 + 600_000,
        },
        TaskState::Running,
        &paced_msgs,
    );
    paced.pacing = Pacing {
        interval_ms: 250,
        batch_size: Some(2),
        batch_pause_ms: 5_000,
    };
    paced.overlap = Overlap::Allow;
    paced.misfire = Misfire::Skip;
    paced.runs = 1;
    paced.fires = 1;
    paced.next_fire_at_ms = None;
    paced.last_fire_ms = Some(T0 + 600_000);
    paced.recipient_zones = vec!["America/New_York".into(), "Europe/Berlin".into()];

    let notify_msgs = [msg("+15550100", "call me", None, Some("Asia/Tokyo"))];
    let mut notify = task(
        "notify",
        Schedule::At {
            at: "2027-03-10T02:30:00".into(),
            tz: Some("America/New_York".into()),
            dst: DstPolicy {
                gap: DstGap::Shift,
                repeat: DstRepeat::Last,
            },
            at_ms: T0 + 7_200_000,
        },
        TaskState::Pending,
        &notify_msgs,
    );
    notify.lang = Lang::Zh;
    notify.recipient_zones = vec!["Asia/Tokyo".into()];
    notify.quiet_hours = QuietSetting::Own(QuietHours {
        from_min: 22 * 60,
        to_min: 8 * 60,
        tz: "recipient".into(),
    });
    notify.notify = Some(Notify {
        channel: "log".into(),
        to: "oncall".into(),
        on: vec![NotifyOn::Failed, NotifyOn::Expired],
    });
    notify.trace_id = Some([
        0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47,
        0x36,
    ]);
    // Exactly as created: no progress record, derived from spec and live entry when read.
    notify.updated_at_ms = notify.created_at_ms;
    notify.watched_since_ms = notify.created_at_ms;
    notify.next_fire_at_ms = Some(T0 + 7_200_000);

    let rem_msgs = [msg("a", "soon", None, None), msg("b", "now", None, None)];
    let mut reminders = task(
        "reminders",
        Schedule::Reminders {
            event_at: "2027-06-01T10:00:00+02:00".into(),
            tz: Some("Europe/Paris".into()),
            dst: DstPolicy::default(),
            event_ms: T0 + 86_400_000,
            before: vec!["1d".into(), "1h".into()],
            before_ms: vec![86_400_000, 3_600_000],
        },
        TaskState::Paused,
        &rem_msgs,
    );
    reminders.done_offsets_ms = vec![86_400_000];
    reminders.fires = 1;
    reminders.expired = 1;

    let done_msgs = [msg("z", "bye", None, None), msg("y", "bye too", None, None)];
    let mut done = task(
        "done",
        Schedule::After {
            after: "1s".into(),
            after_ms: 1_000,
            at_ms: T0 + 1_000,
        },
        TaskState::Failed,
        &done_msgs,
    );
    done.next_fire_at_ms = None;
    done.failed_reason = Some("a corrupt record parked it".into());

    let mut run1 = Run::new(1, T0 + 60_000, T0 + 60_010, 1);
    run1.cursor = 1;
    run1.sent = 1;
    run1.attempts = 0;
    run1.state = RunState::Completed;
    run1.finished_at_ms = Some(T0 + 60_020);
    run1.next_at_ms = None;
    run1.last_attempt_at_ms = Some(T0 + 60_011);
    let skipped = Run::not_started(
        2,
        T0 + 90_000,
        T0 + 90_001,
        1,
        RunState::Skipped,
        "overlap: the previous run was still going".into(),
    );
    let mut run3 = Run::new(3, T0 + 120_000, T0 + 120_003, 1);
    run3.cursor = 1;
    run3.failed = 1;
    run3.state = RunState::Completed;
    run3.finished_at_ms = Some(T0 + 125_000);
    run3.next_at_ms = None;
    run3.last_attempt_at_ms = Some(T0 + 124_000);
    let mut paced_run = Run::new(1, T0 + 600_000, T0 + 600_002, 3);
    paced_run.cursor = 1;
    paced_run.sent = 1;
    paced_run.in_flight = Some(1);
    paced_run.attempts = 2;
    paced_run.next_at_ms = Some(T0 + 600_300);
    paced_run.last_attempt_at_ms = Some(T0 + 600_260);
    let rem_run = Run::not_started(
        1,
        T0 - 86_400_000,
        T0 + 2,
        2,
        RunState::Expired,
        "missed by more than misfire_grace".into(),
    );

    let failure = Failure {
        id: "cron:3:0".into(),
        task_id: "cron".into(),
        run: 3,
        seq: 0,
        to: "ops@example.com".into(),
        channel: "log".into(),
        attempts: 9,
        last_error: "HTTP 500: upstream down".into(),
        failed_at_ms: T0 + 125_000,
        retrying: true,
        retries: 2,
    };
    let detail = serde_json::json!({"status": 500, "duration_ms": 12, "outcome": "retry"});
    let events = vec![
        TimelineEvent::task(TimelineKind::Created, T0),
        TimelineEvent {
            seq: 0,
            at_ms: T0 + 10,
            kind: TimelineKind::Attempt,
            run: Some(1),
            msg: Some(0),
            attempt: Some(2),
            detail,
        },
    ];
    Fixture {
        tasks: vec![
            (cron, cron_msgs.to_vec(), None),
            (paced, paced_msgs.to_vec(), None),
            (
                notify,
                notify_msgs.to_vec(),
                Some(("idem-notify".into(), [7; 32])),
            ),
            (reminders, rem_msgs.to_vec(), None),
            (done, done_msgs.to_vec(), None),
        ],
        runs: vec![
            ("cron".into(), run1),
            ("cron".into(), skipped),
            ("cron".into(), run3),
            ("paced".into(), paced_run),
            ("reminders".into(), rem_run),
        ],
        failures: vec![failure],
        timeline: vec![("notify".into(), events)],
    }
}

/// Every record of herald's trees in the data directory `dir`, tree by tree in key order.
fn raw_records(dir: &Path) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    use herald::store::backend::{Backend, TreeId};
    let b = common::herald::reopen(|| herald::store::embedded::SledBackend::open(dir, 8 << 20));
    let mut out = Vec::new();
    for t in TreeId::ALL {
        for kv in b.scan(t, &[], None) {
            let (k, v) = kv.unwrap();
            out.push((t.name().to_string(), k, v));
        }
    }
    out
}

/// Writes the fixture's values with this build (into `$HERALD_WRITE_FIXTURE` when set, else a
/// temp dir) and compares every record, key and value, with the checked-in format-7 fixture's:
/// the frozen record types keep format 7's bytes.
#[tokio::test]
async fn this_build_writes_the_fixtures_bytes() {
    let temp = tempfile::tempdir().unwrap();
    let out = std::env::var("HERALD_WRITE_FIXTURE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| temp.path().join("data"));
    write_fixture(&out).await;
    let written = raw_records(&out);
    let checked_in = common::fixture_copy("v7-data");
    let expected = raw_records(checked_in.path());
    assert!(
        !written.iter().any(|(t, _, _)| t == "live"),
        "format 7 writes no live entry"
    );
    assert!(!expected.is_empty());
    for (w, e) in written.iter().zip(&expected) {
        assert_eq!(w, e, "a record's key or bytes differ from the fixture's");
    }
    assert_eq!(written.len(), expected.len(), "the same records");
}

/// Writes the fixture's values into `out` (an empty or absent directory), then lets sled take
/// the log and removes it, as the checked-in fixture was made.
async fn write_fixture(out: &Path) {
    let out = out.to_path_buf();
    let f = fixture();
    {
        let s = Store::open(Path::new(&out)).unwrap();
        for (t, m, idem) in &f.tasks {
            // Created as it was first made (pending, nothing fired), then moved to where the
            // fixture has it by the engine's kind of write (progress only), except `notify`,
            // which keeps its initial progress (no progress record).
            let created = Task {
                state: TaskState::Pending,
                ..t.clone()
            };
            let idem = idem.as_ref().map(|(k, h)| (k.as_str(), *h));
            let events = if t.id == "notify" {
                f.timeline[0].1.clone()
            } else {
                Vec::new()
            };
            let r = s.insert_new_task_with(&created, m, idem, &events).await;
            assert!(matches!(r.unwrap(), Inserted::Created));
            if t.id != "notify" {
                let mut b = Batch::new();
                b.progress(t);
                s.write(&b).await.unwrap();
            }
        }
        let mut b = Batch::new();
        for (id, r) in &f.runs {
            b.run(id, r);
        }
        for x in &f.failures {
            b.failure(x.clone());
        }
        s.write(&b).await.unwrap();
    }
    // Reopened, the store reads its log into the memtable and writes that into sled in the
    // background; once the memtable is empty, sled holds everything and the log is not needed
    // (it is not part of the fixture).
    {
        let s = common::herald::reopen(|| Store::open(Path::new(&out)));
        let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while s.memtable_bytes() > 0 {
            assert!(
                std::time::Instant::now() < end,
                "the log never reached sled"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    for e in std::fs::read_dir(&out).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name != "db" && name != "conf" && !name.starts_with("snap.") {
            let p = e.path();
            if p.is_dir() {
                std::fs::remove_dir_all(p).unwrap();
            } else {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
}

fn opened_fixture() -> tempfile::TempDir {
    common::fixture_copy("v6-data")
}

/// Every record of the fixture as the model reads it, compared whole (every field).
fn assert_reads_the_fixture(s: &Store) {
    let f = fixture();
    for (t, m, idem) in &f.tasks {
        assert_eq!(
            s.get_task(&t.id).unwrap().as_ref(),
            Some(t),
            "task {}",
            t.id
        );
        for (i, want) in m.iter().enumerate() {
            let got = s.get_message(&t.id, i as u32).unwrap();
            assert_eq!(got.as_ref(), Some(want), "message {i} of {}", t.id);
        }
        assert!(s.get_message(&t.id, m.len() as u32).unwrap().is_none());
        if let Some((key, hash)) = idem {
            let rec = s.idem_get(key).unwrap().unwrap();
            assert_eq!(
                (rec.task_id.as_str(), rec.body_sha256),
                (t.id.as_str(), *hash)
            );
        }
        let image = s.task_image(&t.id).unwrap().unwrap();
        assert_eq!(&image.task, t);
        assert_eq!(&image.messages, m);
    }
    for (id, r) in &f.runs {
        assert_eq!(
            s.get_run(id, r.run).unwrap().as_ref(),
            Some(r),
            "run {id}/{}",
            r.run
        );
    }
    let cron_runs: Vec<Run> = f
        .runs
        .iter()
        .filter(|(id, _)| id == "cron")
        .map(|(_, r)| r.clone())
        .collect();
    assert_eq!(s.runs_of("cron").unwrap(), cron_runs);
    assert_eq!(s.active_runs_of("paced").unwrap().len(), 1);
    assert!(s.active_runs_of("cron").unwrap().is_empty());
    for x in &f.failures {
        assert_eq!(s.get_failure(&x.id).unwrap().as_ref(), Some(x));
    }
    assert_eq!(s.failure_count().unwrap(), 1);
    let events = s.timeline_all("notify").unwrap();
    let want = &f.timeline[0].1;
    assert_eq!(events.len(), want.len());
    for (got, want) in events.iter().zip(want) {
        assert_eq!(
            (
                got.at_ms,
                got.kind,
                got.run,
                got.msg,
                got.attempt,
                &got.detail
            ),
            (
                want.at_ms,
                want.kind,
                want.run,
                want.msg,
                want.attempt,
                &want.detail
            )
        );
    }
    // The live index: every unfinished task, with its state and next fire.
    let mut live: Vec<(String, TaskState, Option<u64>, bool)> = s
        .live_entries()
        .map(|e| {
            let (id, e) = e.unwrap();
            (id, e.state, e.next_fire_at_ms, e.one_shot)
        })
        .collect();
    live.sort_by(|a, b| a.0.cmp(&b.0));
    let mut want: Vec<(String, TaskState, Option<u64>, bool)> = f
        .tasks
        .iter()
        .filter(|(t, _, _)| !t.state.is_terminal())
        .map(|(t, _, _)| {
            (
                t.id.clone(),
                t.state,
                t.next_fire_at_ms,
                t.schedule.is_one_shot(),
            )
        })
        .collect();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(live, want);
    // The due index, in start-up order: running first, then pending by next fire, then paused.
    let due: Vec<String> = s.due_entries(&[]).map(|e| e.unwrap().1).collect();
    assert_eq!(due, ["paced", "cron", "notify", "reminders"]);
}

#[tokio::test]
async fn format_6_records_written_before_the_frozen_types_read_back_every_field() {
    let dir = opened_fixture();
    let before = raw_records(dir.path());
    assert_eq!(
        before.iter().filter(|(t, _, _)| t == "live").count(),
        4,
        "the fixture is format 6: a live entry per unfinished task"
    );
    let s = Store::open(dir.path()).unwrap();
    assert_reads_the_fixture(&s);
    drop(s);
    // Migrated to format 7: no live entry left, every unfinished task's progress stored, and
    // its due entry the one its progress derives.
    let after = raw_records(dir.path());
    assert!(!after.iter().any(|(t, _, _)| t == "live"));
    let due: Vec<&(String, Vec<u8>, Vec<u8>)> =
        after.iter().filter(|(t, _, _)| t == "due").collect();
    assert_eq!(due.len(), 4);
    for (_, k, v) in due {
        let id = herald::store::records::due_key_id(k).unwrap();
        let (_, _, p) = after
            .iter()
            .find(|(t, key, _)| t == "progress" && key == id)
            .expect("a stored progress record per due entry");
        assert_eq!(
            herald::store::records::due_entry(id, p),
            Some((k.clone(), v.clone())),
            "task {}",
            String::from_utf8_lossy(id)
        );
    }
    let s = common::herald::reopen(|| Store::open(dir.path()));
    assert_reads_the_fixture(&s);
    // Rewritten by this build (a progress write, a new run), then reopened: still the same.
    let f = fixture();
    let mut b = Batch::new();
    b.progress(&f.tasks[0].0);
    b.run("cron", &f.runs[0].1);
    s.write(&b).await.unwrap();
    drop(s);
    let s = common::herald::reopen(|| Store::open(dir.path()));
    assert_reads_the_fixture(&s);
}

/// The format byte of the directory at `dir` (sled's `meta` tree).
fn format_byte(dir: &Path) -> Option<Vec<u8>> {
    let b = common::herald::reopen(|| herald::store::embedded::SledBackend::open(dir, 8 << 20));
    let db = b.db().unwrap();
    db.open_tree("meta")
        .unwrap()
        .get("format")
        .unwrap()
        .map(|v| v.to_vec())
}

/// Format 7 (the checked-in fixture) is read as it is and marked format 8, the format whose
/// records may carry recipient time's slot walls; a directory of a format newer than this
/// build's is refused, not read.
#[tokio::test]
async fn format_7_opens_as_it_is_and_a_newer_format_is_refused() {
    let dir = common::fixture_copy("v7-data");
    assert_eq!(format_byte(dir.path()), Some(vec![7]));
    let before: Vec<_> = raw_records(dir.path())
        .into_iter()
        .filter(|(t, _, _)| t != "meta")
        .collect();
    let s = common::herald::reopen(|| Store::open(dir.path()));
    assert_reads_the_fixture(&s);
    drop(s);
    assert_eq!(
        format_byte(dir.path()),
        Some(vec![herald::store::DIR_FORMAT])
    );
    assert_eq!(herald::store::DIR_FORMAT, 8);
    let after: Vec<_> = raw_records(dir.path())
        .into_iter()
        .filter(|(t, _, _)| t != "meta")
        .collect();
    assert_eq!(before, after, "format 7's records are read as they are");
    // A newer format: refused, naming it.
    {
        let b = common::herald::reopen(|| {
            herald::store::embedded::SledBackend::open(dir.path(), 8 << 20)
        });
        let db = b.db().unwrap();
        db.open_tree("meta")
            .unwrap()
            .insert("format", &[herald::store::DIR_FORMAT + 1])
            .unwrap();
        db.flush().unwrap();
    }
    let err = match Store::open(dir.path()) {
        Ok(_) => panic!("a newer format was opened"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("format version 9"), "{err}");
    // and what it reads instead
    assert!(err.contains("reads formats 1 to 8"), "{err}");
}

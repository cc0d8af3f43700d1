//! Golden bytes: one fixed value per record family, encoded, compared with the bytes this
//! family has on disk (checked in below as hex). A change to a frozen type, to a conversion
//! that feeds it, or to the codec fails here before it strands anybody's data. Never edit an
//! expected string to make a test pass: a new shape is a new version.

use std::collections::BTreeMap;

use super::convert::upgrade_v1;
use super::{live_of, progress_of, spec_of, SpecRecord};
use crate::model::timeline::{hex, TimelineEvent, TimelineKind};
use crate::model::{
    Backoff, DstGap, DstPolicy, DstRepeat, Failure, Lang, Message, Misfire, Notify, NotifyOn,
    Overlap, Pacing, Queued, QuietSetting, RetryPolicy, Run, RunState, Schedule, Task, TaskState,
};
use crate::schedule::quiet::QuietHours;
use crate::store::codec::{decode, encode, Stored};
use crate::store::legacy::{MessageV1 as MessageF1, TaskV1};
use crate::store::timeline::TimelineRecord;
use crate::store::IdemRecord;

const T0: u64 = 1_800_000_000_000;

fn message() -> Message {
    Message {
        to: "u1".into(),
        body: "hi".into(),
        data: Some("{}".into()),
        tz: Some("Asia/Tokyo".into()),
    }
}

fn schedules() -> [Schedule; 4] {
    [
        Schedule::At {
            at: "2027-03-10T02:30".into(),
            tz: Some("America/New_York".into()),
            dst: DstPolicy {
                gap: DstGap::Skip,
                repeat: DstRepeat::Last,
            },
            at_ms: T0,
        },
        Schedule::After {
            after: "1m".into(),
            after_ms: 60_000,
            at_ms: T0 + 60_000,
        },
        Schedule::Cron {
            cron: "0 9 * * *".into(),
            tz: Some("Asia/Shanghai".into()),
            dst: DstPolicy {
                gap: DstGap::Shift,
                repeat: DstRepeat::Both,
            },
            start: Some("s".into()),
            start_ms: Some(1),
            end: Some("e".into()),
            end_ms: Some(2),
            max_runs: Some(3),
        },
        Schedule::Reminders {
            event_at: "ev".into(),
            tz: None,
            dst: DstPolicy::default(),
            event_ms: T0,
            before: vec!["1h".into()],
            before_ms: vec![3_600_000],
        },
    ]
}

fn task(schedule: Schedule) -> Task {
    Task {
        id: "t".into(),
        name: Some("n".into()),
        channel: "log".into(),
        schedule,
        message_count: 1,
        pacing: Pacing {
            interval_ms: 250,
            batch_size: Some(2),
            batch_pause_ms: 5_000,
        },
        retry: Some(RetryPolicy {
            max_attempts: 7,
            backoff: Backoff::Exponential,
            initial_ms: 2_000,
            max_ms: 120_000,
        }),
        misfire: Misfire::FireAll,
        misfire_grace_ms: 30_000,
        overlap: Overlap::Queue,
        metadata: BTreeMap::from([("k".into(), "v".into())]),
        state: TaskState::Running,
        created_at_ms: T0,
        updated_at_ms: T0 + 1,
        next_fire_at_ms: Some(T0 + 2),
        runs: 3,
        fires: 4,
        last_fire_ms: Some(T0 + 3),
        last_slot_wall_ms: None,
        done_offsets_ms: vec![60_000],
        queued: vec![Queued::at(5, T0 + 4)],
        skipped: 1,
        expired: 2,
        watched_since_ms: T0 + 5,
        failed_reason: Some("why".into()),
        lang: Lang::Zh,
        recipient_zones: vec!["Asia/Tokyo".into()],
        quiet_hours: QuietSetting::Own(QuietHours {
            from_min: 1_320,
            to_min: 480,
            tz: "recipient".into(),
        }),
        notify: Some(Notify {
            channel: "log".into(),
            to: "oncall".into(),
            on: vec![NotifyOn::Failed, NotifyOn::Expired],
        }),
        trace_id: Some([0xab; 16]),
    }
}

fn run() -> Run {
    Run {
        run: 3,
        scheduled_at_ms: T0,
        started_at_ms: T0 + 1,
        finished_at_ms: Some(T0 + 2),
        state: RunState::Expired,
        total: 4,
        cursor: 2,
        in_flight: Some(2),
        attempts: 1,
        sent: 1,
        failed: 1,
        next_at_ms: Some(T0 + 3),
        last_attempt_at_ms: Some(T0 + 4),
        reason: Some("r".into()),
        slot_wall_ms: None,
    }
}

fn failure() -> Failure {
    Failure {
        id: "t:3:0".into(),
        task_id: "t".into(),
        run: 3,
        seq: 0,
        to: "u1".into(),
        channel: "log".into(),
        attempts: 5,
        last_error: "500".into(),
        failed_at_ms: T0,
        retrying: true,
        retries: 2,
    }
}

/// Asserts `bytes` are `want` (hex) and prints them, so a new family's line can be pasted.
fn check(family: &str, bytes: &[u8], want: &str) {
    let got = hex(bytes);
    println!("{family}: \"{got}\"");
    assert_eq!(got, want, "{family}: the bytes on disk changed");
}

/// The four specs: one per schedule kind, between them every variant a spec holds.
fn specs() -> Vec<SpecRecord> {
    schedules()
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let mut spec = spec_of(&task(s));
            match i {
                0 => {
                    spec.message = Some(message());
                    spec.quiet_hours = QuietSetting::Off;
                }
                1 => {
                    spec.quiet_hours = QuietSetting::Channel;
                    spec.retry = Some(RetryPolicy::default());
                    spec.notify = None;
                    spec.trace_id = None;
                    spec.lang = Lang::En;
                }
                _ => {}
            }
            spec
        })
        .collect()
}

/// Encodes `value`, checks its bytes, and decodes them back to `value`.
fn golden<T: Stored + PartialEq + std::fmt::Debug>(family: &str, value: &T, want: &str) {
    golden_at(family, b"k", value, want);
}

/// [`golden`] of a record stored under `key` (a spec's id is its key).
fn golden_at<T: Stored + PartialEq + std::fmt::Debug>(
    family: &str,
    key: &[u8],
    value: &T,
    want: &str,
) {
    let bytes = encode(value).unwrap();
    check(family, &bytes, want);
    assert_eq!(
        &decode::<T>(family, key, &bytes).unwrap(),
        value,
        "{family}"
    );
}

/// Bytes an older version of a family wrote (hex, pinned when it was current) still decode
/// to `value`.
fn reads_back<T: Stored + PartialEq + std::fmt::Debug>(
    family: &str,
    key: &[u8],
    value: &T,
    want: &str,
) {
    let bytes: Vec<u8> = (0..want.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&want[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(
        &decode::<T>(family, key, &bytes).unwrap(),
        value,
        "{family}"
    );
}

#[test]
fn version_1_spec_records_still_read() {
    let want = [
        concat!(
        "01017401016e036c6f670010323032372d30332d31305430323a33300110416d65726963612f4e65775f596f",
        "726b0101fd00505c18a301000001fa0102fb8813010701fbd007fcc0d4010002fb30750101016b0176fd0050",
        "5c18a3010000010102753102686901027b7d010a417369612f546f6b796f010a417369612f546f6b796f0101",
        "036c6f67066f6e63616c6c02000101abababababababababababababababab",
    ),
        concat!(
        "01017401016e036c6f670102316dfb60eafd603a5d18a301000001fa0102fb8813010500fbe803fce0930400",
        "02fb30750101016b0176fd00505c18a30100000000010a417369612f546f6b796f000000",
    ),
        concat!(
        "01017401016e036c6f670209302039202a202a202a010d417369612f5368616e676861690002010173010101",
        "01650102010301fa0102fb8813010701fbd007fcc0d4010002fb30750101016b0176fd00505c18a301000001",
        "00010a417369612f546f6b796f02fb2805fbe00109726563697069656e7401036c6f67066f6e63616c6c0200",
        "0101abababababababababababababababab",
    ),
        concat!(
        "01017401016e036c6f6703026576000000fd00505c18a30100000102316801fc80ee360001fa0102fb881301",
        "0701fbd007fcc0d4010002fb30750101016b0176fd00505c18a30100000100010a417369612f546f6b796f02",
        "fb2805fbe00109726563697069656e7401036c6f67066f6e63616c6c02000101abababababababababababab",
        "abababab",
    ),
    ];
    // Version 1 (formats 4 to 6): its id inside (the key is not read), no initial entry.
    for (spec, want) in specs().iter().zip(want) {
        reads_back("specs", b"ignored", spec, want);
    }
}

#[test]
fn version_2_spec_records_keep_their_bytes() {
    let want = [
        concat!(
        "0201016e036c6f670010323032372d30332d31305430323a33300110416d65726963612f4e65775f596f726b",
        "0101fd00505c18a301000001fa0102fb8813010701fbd007fcc0d4010002fb30750101016b0176fd00505c18",
        "a3010000010102753102686901027b7d010a417369612f546f6b796f010a417369612f546f6b796f0101036c",
        "6f67066f6e63616c6c02000101abababababababababababababababab00",
    ),
        concat!(
        "0201016e036c6f670102316dfb60eafd603a5d18a301000001fa0102fb8813010500fbe803fce093040002fb",
        "30750101016b0176fd00505c18a30100000000010a417369612f546f6b796f000000010101fd02505c18a301",
        "000001",
    ),
        concat!(
        "0201016e036c6f670209302039202a202a202a010d417369612f5368616e6768616900020101730101010165",
        "0102010301fa0102fb8813010701fbd007fcc0d4010002fb30750101016b0176fd00505c18a3010000010001",
        "0a417369612f546f6b796f02fb2805fbe00109726563697069656e7401036c6f67066f6e63616c6c02000101",
        "abababababababababababababababab00",
    ),
        concat!(
        "0201016e036c6f6703026576000000fd00505c18a30100000102316801fc80ee360001fa0102fb8813010701",
        "fbd007fcc0d4010002fb30750101016b0176fd00505c18a30100000100010a417369612f546f6b796f02fb28",
        "05fbe00109726563697069656e7401036c6f67066f6e63616c6c02000101abababababababababababababab",
        "abab00",
    ),
    ];
    let mut specs = specs();
    if let Some(s) = specs.get_mut(1) {
        s.initial = Some(live_of(&task(schedules()[1].clone())));
    }
    for (spec, want) in specs.iter().zip(want) {
        golden_at("specs", spec.id.as_bytes(), spec, want);
    }
}

#[test]
fn progress_records_and_live_entries_keep_their_bytes() {
    let t = task(schedules()[2].clone());
    let mut p = progress_of(&t);
    p.one_shot = true;
    golden(
        "progress",
        &p,
        concat!(
        "0201fd01505c18a301000001fd02505c18a3010000030401fd03505c18a301000001fb60ea0105fd04505c18",
        "a30100000102fd05505c18a3010000010377687901",
    ),
    );
    // Version 1 (formats 4 to 6): no one_shot.
    p.one_shot = false;
    reads_back(
        "progress",
        b"k",
        &p,
        concat!(
        "0101fd01505c18a301000001fd02505c18a3010000030401fd03505c18a301000001fb60ea0105fd04505c18",
        "a30100000102fd05505c18a30100000103776879",
    ),
    );
    golden("live", &live_of(&t), "010101fd02505c18a301000000");
}

/// Version 3 (recipient time's slot walls) is written only with a wall to carry; a progress
/// record without one keeps version 2's bytes (above), which older builds read.
#[test]
fn progress_records_with_slot_walls_are_version_3() {
    let mut p = progress_of(&task(schedules()[2].clone()));
    p.last_slot_wall_ms = Some(T0 + 6);
    p.queued = vec![
        Queued {
            wall_ms: Some(T0 + 7),
            ..Queued::at(5, T0 + 4)
        },
        Queued::at(6, T0 + 8),
    ];
    golden(
        "progress",
        &p,
        concat!(
            "0301fd01505c18a301000001fd02505c18a3010000030401fd03505c18a301000001fb60ea0205fd04505c18",
            "a301000001fd07505c18a301000006fd08505c18a3010000000102fd05505c18a301000001037768790001fd",
            "06505c18a3010000",
        ),
    );
    // One wall is enough: the queued fire's alone.
    p.last_slot_wall_ms = None;
    assert_eq!(encode(&p).unwrap()[0], 3);
}

#[test]
fn messages_keep_their_bytes() {
    golden(
        "messages",
        &message(),
        "0102753102686901027b7d010a417369612f546f6b796f",
    );
}

#[test]
fn runs_failures_and_idempotency_records_keep_their_bytes() {
    golden(
        "runs",
        &run(),
        concat!(
        "0103fd00505c18a3010000fd01505c18a301000001fd02505c18a3010000040402010201010101fd03505c18",
        "a301000001fd04505c18a3010000010172",
    ),
    );
    // Version 2: a run of a recipient-time cron slot, with its wall; any other run is
    // version 1 (above).
    golden(
        "runs",
        &Run {
            slot_wall_ms: Some(T0 + 5),
            ..run()
        },
        concat!(
            "0203fd00505c18a3010000fd01505c18a301000001fd02505c18a3010000040402010201010101fd03505c18",
            "a301000001fd04505c18a301000001017201fd05505c18a3010000",
        ),
    );
    golden(
        "failures",
        &failure(),
        "0105743a333a3001740300027531036c6f670503353030fd00505c18a30100000102",
    );
    let idem = IdemRecord {
        task_id: "t".into(),
        body_sha256: [9; 32],
    };
    golden(
        "idempotency",
        &idem,
        "0101740909090909090909090909090909090909090909090909090909090909090909",
    );
}

#[test]
fn timeline_records_keep_their_bytes() {
    let ev = TimelineEvent {
        seq: 9,
        at_ms: T0,
        kind: TimelineKind::Attempt,
        run: Some(1),
        msg: Some(2),
        attempt: Some(3),
        detail: serde_json::json!({"status": 500}),
    };
    golden(
        "timeline",
        &TimelineRecord::of(&ev),
        "0100fd00505c18a3010000090101010201030e7b22737461747573223a3530307d",
    );
    // An attempt and its delivery in one record (issue 29).
    let delivered = TimelineEvent {
        kind: TimelineKind::Delivered,
        detail: serde_json::Value::Null,
        ..ev.clone()
    };
    let pair = TimelineRecord::paired(&ev, 9, &delivered, 10).expect("a pair");
    golden(
        "timeline",
        &pair,
        "0101fd00505c18a30100000101010201030e7b22737461747573223a3530307d",
    );
}

#[test]
fn format_1_task_records_keep_their_bytes_and_upgrade() {
    let cron = task(schedules()[2].clone());
    let v1 = TaskV1 {
        id: "t".into(),
        name: None,
        channel: "log".into(),
        schedule: (&cron.schedule).into(),
        messages: vec![MessageF1 {
            to: "a".into(),
            body: "b".into(),
        }],
        pacing: Pacing::every(5).into(),
        retry: None,
        misfire: Misfire::Skip.into(),
        misfire_grace_ms: 6,
        overlap: Overlap::Allow.into(),
        metadata: BTreeMap::new(),
        state: TaskState::Paused.into(),
        created_at_ms: 1,
        updated_at_ms: 2,
        next_fire_at_ms: None,
        runs: 3,
        fires: 4,
        last_fire_ms: Some(5),
        done_offsets_ms: vec![6],
        queued: vec![(7, 8)],
        skipped: 9,
        expired: 10,
    };
    golden(
        "tasks",
        &v1,
        concat!(
        "01017400036c6f670209302039202a202a202a010d417369612f5368616e6768616900020101730101010165",
        "010201030101610162050000000106020002010200030401050106010708090a",
    ),
    );
    let (t, m) = upgrade_v1(v1);
    assert_eq!(
        (t.schedule, t.state, t.watched_since_ms),
        (cron.schedule, TaskState::Paused, 2)
    );
    assert_eq!(
        (t.message_count, m[0].body.as_str(), m[0].data.as_deref()),
        (1, "b", None)
    );
}

/// Every variant of every enum a record holds, from the model through its conversion: the
/// on-disk code is the variant's index in the frozen type, so a reordered or inserted variant
/// (or a conversion that maps to the wrong one) changes a code here.
#[test]
fn every_variant_keeps_its_code() {
    use super::progress::TaskStateV1;
    use super::run::RunStateV1;
    use super::spec::{DstPolicyV1, LangV1, MisfireV1, NotifyOnV1, OverlapV1, RetryPolicyV1};
    fn code<T: serde::Serialize>(v: T) -> u8 {
        let b = bincode::serde::encode_to_vec(v, bincode::config::standard()).unwrap();
        assert_eq!(b.len(), 1, "a unit variant is one byte");
        b[0]
    }
    let states = [
        TaskState::Pending,
        TaskState::Running,
        TaskState::Paused,
        TaskState::Completed,
        TaskState::Cancelled,
        TaskState::Failed,
        TaskState::Expired,
    ]
    .map(|s| code(TaskStateV1::from(s)));
    assert_eq!(states, [0, 1, 2, 3, 4, 5, 6]);
    let runs = [
        RunState::Running,
        RunState::Completed,
        RunState::Cancelled,
        RunState::Skipped,
        RunState::Expired,
    ]
    .map(|s| code(RunStateV1::from(&s)));
    assert_eq!(runs, [0, 1, 2, 3, 4]);
    let misfire =
        [Misfire::FireNow, Misfire::Skip, Misfire::FireAll].map(|m| code(MisfireV1::from(m)));
    assert_eq!(misfire, [0, 1, 2]);
    let overlap = [Overlap::Skip, Overlap::Queue, Overlap::Allow].map(|o| code(OverlapV1::from(o)));
    assert_eq!(overlap, [0, 1, 2]);
    assert_eq!([Lang::En, Lang::Zh].map(|l| code(LangV1::from(l))), [0, 1]);
    let on = [NotifyOn::Failed, NotifyOn::Expired].map(|n| code(NotifyOnV1::from(n)));
    assert_eq!(on, [0, 1]);
    let gaps = [DstGap::Shift, DstGap::Skip].map(|g| {
        code(
            DstPolicyV1::from(DstPolicy {
                gap: g,
                repeat: DstRepeat::First,
            })
            .gap,
        )
    });
    assert_eq!(gaps, [0, 1]);
    let repeats = [DstRepeat::First, DstRepeat::Last, DstRepeat::Both].map(|r| {
        code(
            DstPolicyV1::from(DstPolicy {
                gap: DstGap::Shift,
                repeat: r,
            })
            .repeat,
        )
    });
    assert_eq!(repeats, [0, 1, 2]);
    let backoff = [Backoff::Fixed, Backoff::Exponential].map(|b| {
        let r = RetryPolicy {
            backoff: b,
            ..RetryPolicy::default()
        };
        code(RetryPolicyV1::from(r).backoff)
    });
    assert_eq!(backoff, [0, 1]);
}

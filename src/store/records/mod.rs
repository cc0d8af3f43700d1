//! What a task looks like on disk (format 7): its spec and its progress, two records in two
//! trees, plus an entry in the `due` index while it is unfinished.
//!
//! - The **spec** (tree `specs`) is what the user asked for: written at create and patch only.
//!   Its key is the task id, which the value does not repeat (version 2).
//! - The **progress** (tree `progress`) is what the engine rewrites on every fire and state
//!   change; it is small and holds no strings but the failure reason. A task whose progress
//!   is still the one it was created with has no progress record: its spec holds the live
//!   entry it was created with ([`SpecRecord::initial`]) and the progress is derived from
//!   it ([`ProgressRecord::initial`]).
//! - The messages (tree `messages`) are one record each, read one at a time when sent; a task
//!   created with a single message keeps it inside its spec instead ([`SpecRecord::message`]).
//! - The **due index** (tree `due`) holds one small entry per unfinished task, its
//!   [`LiveEntry`], keyed in the order start-up needs them ([`due_key`]): running tasks first,
//!   then pending ones by next fire, then the rest. Start-up reads the running ones and those
//!   due soon, is ready, and reads the rest in the background. The entry is derived from the
//!   progress record (stored or derived), which the backend keeps it in step with
//!   (`RawOp::Indexed`, [`due_entry`]).
//!
//! A pending one-shot is therefore two keys: its spec and its due entry. Format 6 stored a
//! third, the `live` tree's copy of the due entry keyed by id; the migration to format 7
//! (`store/migrate.rs`) gives each unfinished task its progress record instead and empties
//! `live`.
//!
//! In memory the engine holds a [`TaskSpec`] and a [`TaskProgress`]; the API and exports the
//! flat [`Task`]. [`SpecRecord`], [`ProgressRecord`] and
//! [`LiveEntry`] only exist to split and join them, in the model's types (they may change with
//! the model). What is on disk are the **frozen** types beside them, never changed once
//! released: `spec.rs` (spec, message and the values a spec holds), `progress.rs` (progress,
//! live entry), `run.rs` (runs, failures, idempotency records), the timeline's
//! `timeline::TimelineRecord` and format 1's `legacy::TaskV1`. `convert.rs` is the one place
//! that converts between the two; the codec encodes only through it (`codec::Stored`).
//! `golden.rs` pins every family's bytes.

use std::collections::BTreeMap;

use crate::model::{
    Lang, Message, Misfire, Notify, Overlap, Pacing, Queued, QuietSetting, RetryPolicy, Schedule,
    TaskState,
};
#[cfg(doc)]
use crate::model::{Task, TaskProgress, TaskSpec};

pub mod convert;
pub mod progress;
pub mod run;
pub mod spec;

pub use convert::{join, live_of, progress_of, progress_record, spec_of};

/// What the user asked for, as the `specs` tree holds it (frozen: [`spec::SpecV1`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecRecord {
    pub id: String,
    pub name: Option<String>,
    pub channel: String,
    pub schedule: Schedule,
    pub message_count: u32,
    pub pacing: Pacing,
    pub retry: Option<RetryPolicy>,
    pub misfire: Misfire,
    pub misfire_grace_ms: u64,
    pub overlap: Overlap,
    pub metadata: BTreeMap<String, String>,
    pub created_at_ms: u64,
    /// `en` from a spec written before format 5.
    pub lang: Lang,
    /// Format 6: the task's only message, kept here instead of in `messages` when a create
    /// has exactly one (one key fewer per task; most tasks have one). `None` in a record
    /// written before (read as such: its messages are in `messages`), and whenever the
    /// messages are in `messages` (more than one, or replaced by a patch).
    pub message: Option<Message>,
    /// Empty from a spec written before issue 28 (recipient time).
    pub recipient_zones: Vec<String>,
    /// The channel's quiet hours from a spec written before issue 28.
    pub quiet_hours: QuietSetting,
    /// None from a spec written before issue 28.
    pub notify: Option<Notify>,
    /// None from a spec written before the timeline (issue 25).
    pub trace_id: Option<[u8; 16]>,
    /// Format 7: the live entry the task was created with, while its progress record is not
    /// stored (derived: [`ProgressRecord::initial`]). `None` in a spec written before, and in
    /// every spec written with its progress stored (a patch's).
    pub initial: Option<LiveEntry>,
}

/// What the engine rewrites, as the `progress` tree holds it (frozen: [`progress::ProgressV1`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgressRecord {
    pub state: TaskState,
    pub updated_at_ms: u64,
    pub next_fire_at_ms: Option<u64>,
    pub runs: u32,
    pub fires: u32,
    pub last_fire_ms: Option<u64>,
    /// Version 3: the last fire's slot wall in recipient time (`None` from older records).
    pub last_slot_wall_ms: Option<u64>,
    pub done_offsets_ms: Vec<u64>,
    /// Each queued fire's slot wall: version 3 (`None` from older records).
    pub queued: Vec<Queued>,
    pub skipped: u32,
    pub expired: u32,
    pub watched_since_ms: u64,
    pub failed_reason: Option<String>,
    /// Format 7: an `at`/`after` task (its due entry says so, [`LiveEntry::one_shot`]); false
    /// from a version-1 record (a live task's was rewritten with it by the migration to
    /// format 7; a finished task's has no due entry).
    pub one_shot: bool,
}

impl ProgressRecord {
    /// The progress a task has when it is created, from its spec and the live entry it was
    /// created with: nothing has happened to it yet. No progress record is stored for a task
    /// whose progress is this (most creates: one key fewer per pending task); its spec holds
    /// the live entry instead ([`SpecRecord::initial`]) and a read derives it
    /// ([`ProgressRecord::initial`]). The engine's first write of the task's progress (a
    /// fire, a command) stores it as usual.
    pub fn created(spec: &SpecRecord, live: &LiveEntry) -> ProgressRecord {
        ProgressRecord {
            state: live.state,
            updated_at_ms: spec.created_at_ms,
            next_fire_at_ms: live.next_fire_at_ms,
            runs: 0,
            fires: 0,
            last_fire_ms: None,
            last_slot_wall_ms: None,
            done_offsets_ms: Vec::new(),
            queued: Vec::new(),
            skipped: 0,
            expired: 0,
            watched_since_ms: spec.created_at_ms,
            failed_reason: None,
            one_shot: live.one_shot,
        }
    }

    /// The progress of a task whose record is not stored, derived from its spec (format 7);
    /// `None` when the spec holds no initial live entry.
    pub fn initial(spec: &SpecRecord) -> Option<ProgressRecord> {
        spec.initial
            .as_ref()
            .map(|l| ProgressRecord::created(spec, l))
    }

    /// The due-index entry of an unfinished task; `None` once it is finished.
    pub fn live(&self) -> Option<LiveEntry> {
        (!self.state.is_terminal()).then_some(LiveEntry {
            state: self.state,
            next_fire_at_ms: self.next_fire_at_ms,
            one_shot: self.one_shot,
        })
    }
}

/// The `live` index entry of an unfinished task: enough to put it back on the wheel (frozen:
/// [`progress::LiveV1`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveEntry {
    pub state: TaskState,
    pub next_fire_at_ms: Option<u64>,
    /// An `at`/`after` task: its fire is handled earlier than a cron's (`dispatch::fire_lead_ms`).
    pub one_shot: bool,
}

/// Classes of the due index, in the order start-up reads them.
pub const DUE_RUNNING: u8 = 0;
pub const DUE_PENDING: u8 = 1;
/// Paused tasks and anything else that waits for a command, not a clock.
pub const DUE_OTHER: u8 = 2;
/// An entry that does not decode: last, so start-up meets (and reports) it after the rest.
pub const DUE_UNREADABLE: u8 = 3;

/// The due-index key of a live entry: class (1 byte) ‖ next fire (u64 big-endian; `u64::MAX`
/// for none) ‖ task id. Keys sort running first, then pending by next fire.
/// `value` is the encoded [`LiveEntry`]; an undecodable one still gets a stable key so that its
/// index entry can be removed when the entry is rewritten.
pub fn due_key(id: &[u8], value: &[u8]) -> Vec<u8> {
    match super::codec::decode::<LiveEntry>("live", id, value) {
        Ok(e) => due_key_of(id, &e),
        Err(_) => due_key_in(DUE_UNREADABLE, 0, id),
    }
}

/// The due-index entry of a task from its encoded progress record (format 7: the progress
/// record is the index's primary, `RawOp::Indexed`): the key of its live entry and the live
/// entry encoded; `None` for a finished task. A record that does not decode still gets a
/// stable entry (class [`DUE_UNREADABLE`], its bytes as the value, which start-up reports)
/// so that the entry is removed when the record is rewritten.
pub fn due_entry(id: &[u8], progress: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    match super::codec::decode::<ProgressRecord>("progress", id, progress) {
        Ok(p) => {
            let live = p.live()?;
            let value = super::codec::encode(&live).ok()?;
            Some((due_key_of(id, &live), value))
        }
        Err(_) => Some((due_key_in(DUE_UNREADABLE, 0, id), progress.to_vec())),
    }
}

/// The encoded progress of a task whose record is not stored, from its encoded spec
/// ([`ProgressRecord::initial`]); `None` when the spec holds none or does not decode. What
/// `RawOp::Indexed` takes as the old value when no progress record is stored.
pub fn initial_progress(id: &[u8], spec: &[u8]) -> Option<Vec<u8>> {
    let spec = super::codec::decode::<SpecRecord>("specs", id, spec).ok()?;
    super::codec::encode(&ProgressRecord::initial(&spec)?).ok()
}

/// The due-index key of a live entry.
pub fn due_key_of(id: &[u8], e: &LiveEntry) -> Vec<u8> {
    let (class, at) = match e.state {
        TaskState::Running => (DUE_RUNNING, 0),
        TaskState::Pending => (DUE_PENDING, e.next_fire_at_ms.unwrap_or(u64::MAX)),
        _ => (DUE_OTHER, 0),
    };
    due_key_in(class, at, id)
}

fn due_key_in(class: u8, at: u64, id: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + id.len());
    k.push(class);
    k.extend_from_slice(&at.to_be_bytes());
    k.extend_from_slice(id);
    k
}

/// The due-index keys of a class whose tasks have no next fire in the key (running, paused):
/// `class ‖ 0u64`, after which keys are in task-id order.
pub fn due_class_prefix(class: u8) -> Vec<u8> {
    let mut k = vec![class];
    k.extend_from_slice(&0u64.to_be_bytes());
    k
}

/// The task id of a due-index key.
pub fn due_key_id(key: &[u8]) -> Option<&[u8]> {
    key.get(9..)
}

#[cfg(test)]
mod golden;

#[cfg(test)]
mod tests {
    use super::spec::{LangV1, MisfireV1, OverlapV1, PacingV1, RetryPolicyV1, ScheduleV1};
    use super::*;
    use crate::store::codec::{decode, encode, Stored, FORMAT_VERSION};
    use serde::Serialize;

    /// Bytes as an older build wrote them: the version byte, then bincode of an older shape.
    fn raw<T: Serialize>(old: &T) -> Vec<u8> {
        let mut b = vec![FORMAT_VERSION];
        b.extend(bincode::serde::encode_to_vec(old, bincode::config::standard()).unwrap());
        b
    }

    /// The spec record as format 4 first wrote it, before `lang`.
    #[derive(Serialize)]
    struct SpecBeforeLang {
        id: String,
        name: Option<String>,
        channel: String,
        schedule: ScheduleV1,
        message_count: u32,
        pacing: PacingV1,
        retry: Option<RetryPolicyV1>,
        misfire: MisfireV1,
        misfire_grace_ms: u64,
        overlap: OverlapV1,
        metadata: BTreeMap<String, String>,
        created_at_ms: u64,
    }

    fn spec(lang: Lang) -> SpecRecord {
        SpecRecord {
            id: "t".into(),
            name: Some("n".into()),
            channel: "log".into(),
            schedule: Schedule::After {
                after: "1m".into(),
                after_ms: 60_000,
                at_ms: 1_000,
            },
            message_count: 2,
            pacing: Pacing::default(),
            retry: None,
            misfire: Misfire::default(),
            misfire_grace_ms: 5,
            overlap: Overlap::default(),
            metadata: BTreeMap::from([("k".into(), "v".into())]),
            created_at_ms: 7,
            lang,
            message: None,
            recipient_zones: Vec::new(),
            quiet_hours: QuietSetting::Channel,
            notify: None,
            trace_id: None,
            initial: None,
        }
    }

    #[test]
    fn a_spec_written_before_lang_decodes_as_english() {
        let s = spec(Lang::En);
        let d = s.to_disk().into_owned();
        let old = SpecBeforeLang {
            id: s.id.clone(),
            name: d.name.clone(),
            channel: d.channel.clone(),
            schedule: d.schedule.clone(),
            message_count: d.message_count,
            pacing: d.pacing,
            retry: d.retry,
            misfire: d.misfire,
            misfire_grace_ms: d.misfire_grace_ms,
            overlap: d.overlap,
            metadata: d.metadata.clone(),
            created_at_ms: d.created_at_ms,
        };
        let bytes = raw(&old);
        assert_eq!(decode::<SpecRecord>("specs", b"t", &bytes).unwrap(), s);
    }

    /// The spec record as format 5 wrote it: `lang` last, no message.
    #[derive(Serialize)]
    struct SpecFormat5 {
        id: String,
        name: Option<String>,
        channel: String,
        schedule: ScheduleV1,
        message_count: u32,
        pacing: PacingV1,
        retry: Option<RetryPolicyV1>,
        misfire: MisfireV1,
        misfire_grace_ms: u64,
        overlap: OverlapV1,
        metadata: BTreeMap<String, String>,
        created_at_ms: u64,
        lang: LangV1,
    }

    #[test]
    fn a_format_5_spec_decodes_without_a_message_and_one_kept_inside_round_trips() {
        let s = spec(Lang::Zh);
        let d = s.to_disk().into_owned();
        let old = SpecFormat5 {
            id: s.id.clone(),
            name: d.name.clone(),
            channel: d.channel.clone(),
            schedule: d.schedule.clone(),
            message_count: d.message_count,
            pacing: d.pacing,
            retry: d.retry,
            misfire: d.misfire,
            misfire_grace_ms: d.misfire_grace_ms,
            overlap: d.overlap,
            metadata: d.metadata.clone(),
            created_at_ms: d.created_at_ms,
            lang: d.lang,
        };
        let bytes = raw(&old);
        assert_eq!(decode::<SpecRecord>("specs", b"t", &bytes).unwrap(), s);
        let mut with = spec(Lang::En);
        with.message = Some(Message {
            to: "a".into(),
            body: "hello".into(),
            data: Some("{}".into()),
            tz: None,
        });
        let bytes = encode(&with).unwrap();
        assert_eq!(decode::<SpecRecord>("specs", b"t", &bytes).unwrap(), with);
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode::<SpecRecord>("specs", b"t", &longer).is_err());
    }

    #[test]
    fn the_initial_progress_is_what_a_create_makes() {
        let req: crate::request::TaskRequest = serde_json::from_value(serde_json::json!({
            "id": "t", "schedule": {"after": "1h"}, "to": ["a"], "body": "hello"
        }))
        .unwrap();
        let (t, _) = req
            .into_task(&crate::request::Context {
                now_ms: 1_800_000_000_000,
                limits: &crate::model::Limits::default(),
                channel_exists: &|_| true,
            })
            .unwrap();
        assert_eq!(
            ProgressRecord::created(&spec_of(&t), &live_of(&t)),
            progress_of(&t)
        );
        let mut spec = spec_of(&t);
        assert_eq!(ProgressRecord::initial(&spec), None);
        spec.initial = Some(live_of(&t));
        assert_eq!(ProgressRecord::initial(&spec), Some(progress_of(&t)));
    }

    /// A spec as version 1 (formats 4 to 6) held it.
    fn v1_of(s: &SpecRecord) -> spec::SpecV1 {
        let d = s.to_disk().into_owned();
        spec::SpecV1 {
            id: s.id.clone(),
            name: d.name,
            channel: d.channel,
            schedule: d.schedule,
            message_count: d.message_count,
            pacing: d.pacing,
            retry: d.retry,
            misfire: d.misfire,
            misfire_grace_ms: d.misfire_grace_ms,
            overlap: d.overlap,
            metadata: d.metadata,
            created_at_ms: d.created_at_ms,
            lang: d.lang,
            message: d.message,
            recipient_zones: d.recipient_zones,
            quiet_hours: d.quiet_hours,
            notify: d.notify,
            trace_id: d.trace_id,
        }
    }

    #[test]
    fn a_format_7_spec_takes_its_id_from_its_key_and_a_version_1_spec_from_itself() {
        let mut s = spec(Lang::Zh);
        s.initial = Some(LiveEntry {
            state: TaskState::Pending,
            next_fire_at_ms: Some(9),
            one_shot: true,
        });
        let bytes = encode(&s).unwrap();
        assert_eq!(bytes[0], 2, "version 2");
        assert!(!bytes.windows(3).any(|w| w == b"\x01tx"), "no id inside");
        let back = decode::<SpecRecord>("specs", b"t", &bytes).unwrap();
        assert_eq!(back, s);
        let other = decode::<SpecRecord>("specs", b"u", &bytes).unwrap();
        assert_eq!(other.id, "u");
        // Version 1 (format 6) holds its id; a progress record of version 1 has no one_shot.
        // Version 1 (format 6) holds its id; the key is not read.
        let v1 = v1_of(&s);
        let old = decode::<SpecRecord>("specs", b"ignored", &raw(&v1)).unwrap();
        assert_eq!(old, SpecRecord { initial: None, ..s });
    }

    #[test]
    fn lang_round_trips_and_extra_bytes_still_fail() {
        let s = spec(Lang::Zh);
        let mut bytes = encode(&s).unwrap();
        assert_eq!(decode::<SpecRecord>("specs", b"t", &bytes).unwrap(), s);
        bytes.extend_from_slice(&[1, 2]);
        assert!(decode::<SpecRecord>("specs", b"t", &bytes).is_err());
    }

    #[test]
    fn a_spec_written_before_trace_id_decodes_without_one_and_trace_id_round_trips() {
        let s = spec(Lang::Zh);
        let mut bytes = raw(&v1_of(&s));
        // What a build before issue 25 wrote: the record ends after `lang`.
        assert_eq!(bytes.pop(), Some(0), "None is one 0 byte");
        assert_eq!(decode::<SpecRecord>("specs", b"t", &bytes).unwrap(), s);
        let traced = SpecRecord {
            trace_id: Some([7; 16]),
            ..s
        };
        let bytes = encode(&traced).unwrap();
        assert_eq!(decode::<SpecRecord>("specs", b"t", &bytes).unwrap(), traced);
    }
}

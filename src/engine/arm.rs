//! Lead times and wheel deadlines: when a task's fire step and a run's steps go on the wheel.
//! Below `commit.rs` and `cells.rs`, above the timer: it knows instants, not decisions.

use std::sync::Arc;

use super::timer::Key;
use super::Inner;
use crate::model::{Run, Task, TaskProgress, TaskSpec, TaskState};
use crate::store::records::LiveEntry;

/// How long before a message is due its attempt is armed (in-flight mark made durable).
/// Covers a flush even on a busy disk (typically 1–5 ms; tens of ms under heavy IO).
pub const ARM_LEAD_MS: u64 = 100;

/// How long before its instant a one-shot's fire is handled (its run started and its first
/// attempt armed, durably), at least. Many one-shots often share an instant (a notice to a
/// whole list): those get a longer lead, growing with how many share their second
/// (`engine/herd.rs`), so that a herd's fires are all handled before the instant and its sends
/// leave at the due millisecond, in deadline order. A run armed before an outage that spans
/// its instant is resumed (its message may have left) rather than judged by `misfire_grace`;
/// a restart before the instant gives the armed attempt back (`cells::load`). Cron and
/// reminder fires keep [`ARM_LEAD_MS`]: an early fire would judge overlap against a run that
/// is about to end.
pub const ONE_SHOT_LEAD_MS: u64 = 2_000;

/// When the fire step of a task due at `due_ms` runs: [`lead_ms`] earlier, and a one-shot
/// that shares its second with many others earlier still (`engine/herd.rs`).
pub(crate) fn fire_step_at(inner: &Inner, due_ms: u64, one_shot: bool) -> u64 {
    let extra = if one_shot {
        inner
            .herd
            .lock()
            .extra_lead_ms(due_ms, inner.clock.now_ms())
    } else {
        0
    };
    due_ms.saturating_sub(lead_ms(one_shot) + extra)
}

/// The earliest a fire step may run before its instant (an earlier one is a stale wheel
/// entry and is put back).
pub(crate) fn lead_max_ms(one_shot: bool) -> u64 {
    if one_shot {
        ONE_SHOT_LEAD_MS + super::herd::HERD_LEAD_MAX_MS
    } else {
        ARM_LEAD_MS
    }
}

/// The fire lead of a one-shot (`true`) or a cron/reminders schedule.
pub(crate) fn lead_ms(one_shot: bool) -> u64 {
    if one_shot {
        ONE_SHOT_LEAD_MS
    } else {
        ARM_LEAD_MS
    }
}

/// Brings the task's fire entry in line with its next fire (off the wheel if it has none or
/// is not pending or running).
pub(crate) fn sync_fire(inner: &Inner, spec: &TaskSpec, p: &TaskProgress) {
    let one_shot = spec.schedule.is_one_shot();
    let key = Key::fire(&spec.id);
    sync_fire_at(inner, key, p.state, p.next_fire_at_ms, one_shot);
}

/// [`sync_fire`] of a new task (a create, in its wire shape). `id` is the task's id as the
/// live map holds it: the wheel's key shares it (at a million pending tasks a second copy
/// of every id is ~48 MB).
pub(crate) fn sync_fire_new(inner: &Inner, id: &Arc<str>, t: &Task) {
    sync_fire_at(
        inner,
        Key::Fire(id.clone()),
        t.state,
        t.next_fire_at_ms,
        t.schedule.is_one_shot(),
    );
}

fn sync_fire_at(inner: &Inner, key: Key, state: TaskState, next: Option<u64>, one_shot: bool) {
    match next {
        Some(at) if matches!(state, TaskState::Pending | TaskState::Running) => {
            inner.timer.at(key, fire_step_at(inner, at, one_shot))
        }
        _ => inner.timer.cancel(key),
    }
}

/// Puts a run's next step on the wheel: an armed run's send at its instant, an unarmed run's
/// arm [`ARM_LEAD_MS`] ahead of it. `wall`: the instant is one a person named (the end of
/// quiet hours), held to the wall clock alone (`Timer::at_wall`).
pub(crate) fn step(inner: &Inner, task_id: &str, run: &Run, wall: bool) {
    let Some(at) = run.next_at_ms else {
        return;
    };
    let at = if run.in_flight.is_some() {
        at
    } else {
        at.saturating_sub(ARM_LEAD_MS)
    };
    if wall {
        inner.timer.at_wall(Key::run(task_id, run.run), at);
    } else {
        inner.timer.at(Key::run(task_id, run.run), at);
    }
}

/// Puts a live entry's next fire on the wheel (pending tasks only: running ones are loaded,
/// paused ones wait for a resume).
pub(crate) fn arm_entry(inner: &Inner, id: &Arc<str>, entry: &LiveEntry) {
    if let Some((key, at)) = entry_fire(inner, id, entry) {
        inner.timer.at(key, at);
    }
}

/// The wheel entry of a live entry, if it has one.
pub(crate) fn entry_fire(inner: &Inner, id: &Arc<str>, entry: &LiveEntry) -> Option<(Key, u64)> {
    if entry.state != TaskState::Pending {
        return None;
    }
    let at = entry.next_fire_at_ms?;
    Some((
        Key::Fire(id.clone()),
        fire_step_at(inner, at, entry.one_shot),
    ))
}

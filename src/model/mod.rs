//! The data herald works on, and the rules about it. Pure: no IO, no clock.

pub mod duration;
pub mod failure;
pub mod id;
pub mod instant;
pub mod lang;
pub mod limits;
pub mod quiet;
pub mod run;
pub mod state;
pub mod task;
pub mod timeline;

pub use duration::{format_duration_ms, parse_duration_ms};
pub use failure::{delivery_key, Failure};
pub use id::{check_id, new_id};
pub use instant::format_utc;
pub use lang::Lang;
pub use limits::Limits;
pub use quiet::QuietHours;
pub use run::{GaveUp, Outcome, Run, RunState, Settled};
pub use state::{InvalidTransition, TaskState};
pub use task::*;
pub use timeline::{TimelineEvent, TimelineKind};

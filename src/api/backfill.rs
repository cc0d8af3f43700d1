//! `POST /v1/tasks/{id}/backfill` `{"from": INSTANT, "to": INSTANT}` → 202 `{"runs": [n, …]}`
//! (API.md "Missed runs and backfill"): one run for each slot of the task's schedule in the
//! range without a completed run, sent in slot order with the task's pacing. The slots are
//! worked out by `schedule::backfill` (pure); the engine allocates the runs under the task's
//! lock (`Engine::backfill`), where it also checks `to` against now and the task's next fire:
//! what is past depends on the task's state at that moment.

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::input::{parse_json, read_body};
use super::problem::Problem;
use super::{json_response, ApiState, Resp};
use crate::model::DstPolicy;
use crate::schedule::parse_instant;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BackfillRequest {
    from: String,
    to: String,
}

fn instant(field: &str, text: &str) -> Result<u64, Problem> {
    parse_instant(text, None, DstPolicy::default())
        .map_err(|e| Problem::invalid(field.to_string(), e))?
        .first()
        .copied()
        .ok_or_else(|| Problem::invalid(field.to_string(), "not an instant"))
}

pub async fn handle(state: &ApiState, id: &str, req: Request<Incoming>) -> Result<Resp, Problem> {
    let body = read_body(state, req).await?;
    let r: BackfillRequest = parse_json(&body)?;
    let from = instant("from", &r.from)?;
    let to = instant("to", &r.to)?;
    if to < from {
        return Err(Problem::invalid(
            "to".to_string(),
            "must not be before from",
        ));
    }
    // The engine's 422s (a FieldError): more than BACKFILL_SLOTS_MAX slots, or a `to` after
    // now or at the task's next fire (`to`); a slot a trimmed run may have sent (`from`).
    let runs = state.engine.backfill(id, from, to).await?;
    Ok(json_response(
        StatusCode::ACCEPTED,
        &json!({ "runs": runs }),
    ))
}

//! `POST /v1/schedules/preview`: the next fires of a schedule, validated exactly as a task
//! creation validates it (the work is in [`crate::schedule::preview`]). The description and
//! each fire's `human` time are in the request's language (`?lang=`, `Accept-Language`).

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::{json, Value};

use super::input::{parse_json, read_body};
use super::problem::Problem;
use super::{json_response, ApiState, Resp};
use crate::model::Lang;
use crate::schedule::preview::{preview, PreviewRequest};

pub async fn handle(
    state: &ApiState,
    req: Request<Incoming>,
    lang: Option<Lang>,
) -> Result<Resp, Problem> {
    let lang = lang.unwrap_or_default();
    let body = read_body(state, req).await?;
    let r: PreviewRequest = parse_json(&body)?;
    let p = preview(r, state.engine.now_ms(), state.engine.limits())
        .map_err(|e| Problem::invalid(e.field, e.detail))?;
    let fires: Vec<Value> = p
        .fires
        .iter()
        .map(|&ms| json!({ "at": p.utc(ms), "local": p.local(ms), "human": p.human(ms, lang) }))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({ "description": p.description_in(lang), "tz": p.tz.name(), "fires": fires }),
    ))
}

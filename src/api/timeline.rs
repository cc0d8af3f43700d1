//! `GET /v1/tasks/{id}/timeline?run=&limit=&after=`: a task's timeline events, oldest first,
//! paged by seq like runs are by number (`after` is the `next` of the previous page; `next`
//! is `null` on the last page). `run` keeps only that run's events. Bad parameters are 400
//! problem documents naming the parameter.

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::{json, Value};

use super::input::{page_params, param, query};
use super::problem::Problem;
use super::{json_response, ApiState, Resp};
use crate::model::timeline::TimelineEvent;

pub async fn handle(state: &ApiState, id: &str, req: &Request<Incoming>) -> Result<Resp, Problem> {
    let q = query(req, &["limit", "after", "run"])?;
    // `after` is a seq, at most 20 digits: checked as a number below.
    let (limit, _) = page_params(&q, 20)?;
    let after = number::<u64>(&q, "after", "a seq (the `next` of the previous page)")?;
    let run = number::<u32>(&q, "run", "a run number")?;
    let engine = state.engine.clone();
    let id_owned = id.to_string();
    // A filtered page may examine up to SCAN_MAX events: off the runtime's workers.
    // A storage error is the store's (an outage: 503, try again), not a bug.
    let page = super::off_workers(move || {
        let store = engine.store();
        if !store.task_exists(&id_owned)? {
            return Ok(None);
        }
        store.timeline(&id_owned, run, after, limit).map(Some)
    })
    .await?;
    match page {
        Some((events, next)) => {
            let list: Vec<Value> = events.iter().map(event).collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({ "events": list, "next": next.map(|n| n.to_string()) }),
            ))
        }
        None => Err(Problem::not_found(format!("task {id:?} does not exist"))),
    }
}

/// An optional numeric query parameter; 400 naming it when it is not a number.
fn number<T: std::str::FromStr>(
    q: &[(String, String)],
    name: &str,
    what: &str,
) -> Result<Option<T>, Problem> {
    match param(q, name) {
        Some(v) if !v.is_empty() => v.parse::<T>().map(Some).map_err(|_| {
            Problem::bad_request(format!("{name}: {v:?} is not {what}")).with_field(name)
        }),
        _ => Ok(None),
    }
}

/// One event as API.md shows it.
pub fn event(e: &TimelineEvent) -> Value {
    e.view()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::timeline::TimelineKind;

    #[test]
    fn an_event_has_the_names_of_api_md() {
        let e = TimelineEvent::run(TimelineKind::RetryScheduled, 1_000, 3, Some(0))
            .with_attempt(2)
            .with_detail(json!({"reason": "HTTP 500"}));
        let v = event(&TimelineEvent { seq: 7, ..e });
        assert_eq!(
            v,
            json!({"seq": 7, "at": "1970-01-01T00:00:01Z", "kind": "retry_scheduled", "run": 3,
                "msg": 0, "attempt": 2, "detail": {"reason": "HTTP 500"}})
        );
        let v = event(&TimelineEvent::task(TimelineKind::Created, 0));
        assert_eq!(
            (v["run"].clone(), v["detail"].clone()),
            (Value::Null, json!({}))
        );
    }
}

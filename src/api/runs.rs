//! `GET /v1/tasks/{id}/runs`: a task's runs, oldest first, paged by run number (`after`,
//! `next`), optionally only those in some states (`?state=expired` or `?state=skipped,expired`).
//!
//! The store pages runs by number only, so a filtered page reads pages and keeps the matches.
//! It examines at most [`SCAN_MAX`] runs: a page may then hold fewer than `limit` runs, even
//! none, and `next` says where the following page starts, so paging on reaches every match.
//! `next` is `null` only when no run after the page matches.

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::{json, Value};

use super::input::{page_params, param, query};
use super::problem::Problem;
use super::{json_response, views, ApiState, Resp};
use crate::engine::RunPage;
use crate::model::{Run, RunState};
use crate::store::SCAN_MAX;

/// The states a run can be in, by their API names.
const STATES: [(&str, RunState); 5] = [
    ("running", RunState::Running),
    ("completed", RunState::Completed),
    ("cancelled", RunState::Cancelled),
    ("skipped", RunState::Skipped),
    ("expired", RunState::Expired),
];

/// Runs read from the store per step of a filtered page.
const CHUNK: usize = 256;

pub async fn handle(state: &ApiState, id: &str, req: &Request<Incoming>) -> Result<Resp, Problem> {
    let q = query(req, &["limit", "after", "state", "lang"])?;
    let (limit, _) = page_params(&q, crate::model::id::ID_MAX_LEN)?;
    let after = match param(&q, "after") {
        Some(a) if !a.is_empty() => Some(a.parse::<u32>().map_err(|_| {
            Problem::bad_request(format!(
                "after: {a:?} is not a run number (the `next` of the previous page)"
            ))
            .with_field("after")
        })?),
        _ => None,
    };
    let states = match param(&q, "state") {
        Some(s) if !s.is_empty() => Some(parse_states(s)?),
        _ => None,
    };
    let engine = state.engine.clone();
    let id_owned = id.to_string();
    // A filtered page may read up to SCAN_MAX runs: off the runtime's workers.
    let page = super::off_workers(move || match states {
        None => engine.runs_page(&id_owned, after, limit),
        Some(states) => filtered_page(
            |after, n| engine.runs_page(&id_owned, after, n),
            &states,
            after,
            limit,
            SCAN_MAX,
        ),
    })
    .await?;
    match page {
        Some((runs, next)) => {
            let list: Vec<Value> = runs.iter().map(views::run).collect();
            let next = next.map(|n| n.to_string());
            Ok(json_response(
                StatusCode::OK,
                &json!({ "runs": list, "next": next }),
            ))
        }
        None => Err(Problem::not_found(format!("task {id:?} does not exist"))),
    }
}

/// `expired` or `skipped,expired`: 422 naming `state` for a name that is not a run state.
fn parse_states(s: &str) -> Result<Vec<RunState>, Problem> {
    s.split(',')
        .map(|name| {
            let name = name.trim();
            STATES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, st)| st.clone())
                .ok_or_else(|| {
                    let names: Vec<&str> = STATES.iter().map(|(n, _)| *n).collect();
                    Problem::invalid(
                        "state",
                        format!(
                            "unknown run state {name:?}; expected one or more of {} (comma-separated)",
                            names.join(", ")
                        ),
                    )
                })
        })
        .collect()
}

/// A page of the runs in `states` after run `after`: `fetch(after, n)` reads up to `n` runs
/// after a run number and says the last one's number if more follow (`None`: no such task).
/// At most `limit` runs are kept and `examine_max` read (the page's bound).
fn filtered_page<E>(
    mut fetch: impl FnMut(Option<u32>, usize) -> Result<Option<RunPage>, E>,
    states: &[RunState],
    after: Option<u32>,
    limit: usize,
    examine_max: usize,
) -> Result<Option<RunPage>, E> {
    let mut out: Vec<Run> = Vec::new();
    let mut cursor = after;
    let mut examined = 0usize;
    loop {
        let n = CHUNK.min(examine_max.saturating_sub(examined)).max(1);
        let Some((runs, more)) = fetch(cursor, n)? else {
            return Ok(None);
        };
        for r in runs {
            examined += 1;
            cursor = Some(r.run);
            if states.contains(&r.state) {
                if out.len() == limit {
                    // A match beyond the page: there is a next page, after the last kept.
                    let last = out.last().map(|l| l.run);
                    return Ok(Some((out, last)));
                }
                out.push(r);
            }
        }
        if more.is_none() {
            return Ok(Some((out, None)));
        }
        if examined >= examine_max {
            // Bound reached: a full page goes on after its last run, a short one after the
            // last run read (nothing between matched).
            let next = match out.len() == limit {
                true => out.last().map(|l| l.run),
                false => cursor,
            };
            return Ok(Some((out, next)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs 1..=n, every third expired, the rest completed; paged like the store.
    fn store(n: u32) -> Vec<Run> {
        (1..=n)
            .map(|i| {
                let mut r = Run::new(i, 0, 0, 1);
                r.state = if i % 3 == 0 {
                    RunState::Expired
                } else {
                    RunState::Completed
                };
                r
            })
            .collect()
    }

    fn fetch(runs: &[Run]) -> impl FnMut(Option<u32>, usize) -> Result<Option<RunPage>, ()> + '_ {
        move |after, n| {
            let rest: Vec<Run> = runs
                .iter()
                .filter(|r| after.is_none_or(|a| r.run > a))
                .cloned()
                .collect();
            let page: Vec<Run> = rest.iter().take(n).cloned().collect();
            let more = (rest.len() > n)
                .then(|| page.last().map(|r| r.run))
                .flatten();
            Ok(Some((page, more)))
        }
    }

    /// Every page until `next` is null: the run numbers of each page.
    fn pages(runs: &[Run], states: &[RunState], limit: usize, max: usize) -> Vec<Vec<u32>> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let (page, next) = filtered_page(fetch(runs), states, after, limit, max)
                .unwrap()
                .unwrap();
            out.push(page.iter().map(|r| r.run).collect());
            match next {
                Some(n) => after = Some(n),
                None => return out,
            }
            assert!(out.len() < 1_000, "paging does not end");
        }
    }

    #[test]
    fn pages_hold_only_matches_and_next_is_null_after_the_last() {
        let runs = store(20);
        let got = pages(&runs, &[RunState::Expired], 2, 10_000);
        assert_eq!(got, [vec![3, 6], vec![9, 12], vec![15, 18]]);
        // Exactly filled last page: no empty page after it.
        let got = pages(&store(18), &[RunState::Expired], 3, 10_000);
        assert_eq!(got, [vec![3, 6, 9], vec![12, 15, 18]]);
        let got = pages(&runs, &[RunState::Skipped], 5, 10_000);
        assert_eq!(got, [Vec::<u32>::new()]);
        let both = pages(&runs, &[RunState::Expired, RunState::Completed], 7, 10_000);
        assert_eq!(both.concat(), (1..=20).collect::<Vec<_>>());
    }

    #[test]
    fn a_bounded_scan_goes_on_where_it_stopped() {
        // 4 runs read per page at most: short pages, but every match is reached once.
        let runs = store(20);
        let got = pages(&runs, &[RunState::Expired], 10, 4);
        assert_eq!(got.concat(), [3, 6, 9, 12, 15, 18]);
        assert!(got.len() > 1);
    }

    #[test]
    fn unknown_states_name_the_field() {
        assert_eq!(
            parse_states("skipped, expired").unwrap(),
            [RunState::Skipped, RunState::Expired]
        );
        let p = parse_states("expired,late").unwrap_err();
        assert_eq!(p.status.as_u16(), 422);
        assert_eq!(p.field.as_deref(), Some("state"));
    }
}

//! The dashboard page at `/`: HTML, CSS and JS embedded in the binary (no CDN, no build step).
//! Its data comes from the `/v1` API with the operator's token; the page and its two assets are
//! static and open (they hold no data), like `/healthz`. The scripts: `format.js` (dates,
//! durations, pacing and retry in words), `metrics.js` (the overview's figures from `/metrics`),
//! `chart.js` (a small SVG line chart), `timeline.js` (a task's timeline in words), `cluster.js`
//! (the cluster panel's words and owner colours), `app.js` (the page: API calls, event stream, drawing).

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::Response;

use super::Resp;

const INDEX: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const APP_CSS: &str = include_str!("dashboard/app.css");
const FORMAT_JS: &str = include_str!("dashboard/format.js");
const METRICS_JS: &str = include_str!("dashboard/metrics.js");
const CHART_JS: &str = include_str!("dashboard/chart.js");
const TIMELINE_JS: &str = include_str!("dashboard/timeline.js");
const CLUSTER_JS: &str = include_str!("dashboard/cluster.js");

/// Scripts and styles from this origin only, data only from this origin, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page or one of its assets, by path; `None` if `path` is not one of them.
pub fn asset(path: &str) -> Option<Resp> {
    let (body, ty) = match path {
        "/" => (INDEX, "text/html; charset=utf-8"),
        "/dashboard/app.js" => (APP_JS, "text/javascript; charset=utf-8"),
        "/dashboard/app.css" => (APP_CSS, "text/css; charset=utf-8"),
        "/dashboard/format.js" => (FORMAT_JS, "text/javascript; charset=utf-8"),
        "/dashboard/metrics.js" => (METRICS_JS, "text/javascript; charset=utf-8"),
        "/dashboard/chart.js" => (CHART_JS, "text/javascript; charset=utf-8"),
        "/dashboard/timeline.js" => (TIMELINE_JS, "text/javascript; charset=utf-8"),
        "/dashboard/cluster.js" => (CLUSTER_JS, "text/javascript; charset=utf-8"),
        _ => return None,
    };
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(ty));
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Some(r)
}

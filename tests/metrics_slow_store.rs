//! `/metrics` answers on time while the store is slow. Its task census scans the store (the
//! `live` index and the failure list); with the database's every round trip late, a scrape
//! that waited for the scan took seconds (8 s here), just when its figures are wanted. Now a
//! scrape waits at most `CENSUS_WAIT` (1 s), then answers with the last census or, before the
//! first, without the by-state gauges; the scan goes on, and a later scrape has its counts.

mod common;

use std::time::{Duration, Instant};

use common::http;
use common::pgproxy::ProxiedNode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_does_not_wait_for_a_census_of_a_slow_store() {
    let Some(t) = ProxiedNode::start("metrics_slow_store", "slow_metrics", "") else {
        return;
    };
    let (node, proxy) = (&t.node, &t.proxy);
    let metrics = format!("{}/metrics", node.url);

    // Every byte to and from the database a second late: the census's scan takes seconds.
    proxy.delay(Duration::from_secs(1));
    let asked = Instant::now();
    let first = http::get(&metrics).await;
    let took = asked.elapsed();
    assert_eq!(first.status, 200, "{}", first.text());
    let text = first.text();
    assert!(
        took < Duration::from_millis(2_500),
        "the scrape took {took:?}: it waited for the scan"
    );
    assert!(
        text.contains("herald_http_connections_open"),
        "the rest of the figures are there: {text}"
    );
    assert!(
        !text.contains("herald_tasks{"),
        "no census can be done yet (the scan needs seconds), yet the scrape has one: {text}"
    );

    // The scan went on: a later scrape has its counts, and says how old they are.
    let counted = common::herald::poll(Duration::from_secs(60), || async {
        let text = http::get(&metrics).await.text();
        text.contains("herald_tasks{state=\"pending\"} 0")
            .then_some(text)
    })
    .await
    .expect("no scrape ever had the census");
    assert!(
        counted.contains("herald_tasks_census_age_seconds"),
        "{counted}"
    );
}

//! The timeline on PostgreSQL (issue 25): the `timeline` tree is a table like the others
//! (`herald_timeline`, schema version 2), so the same store code writes, pages, trims and
//! deletes events there; a database made by a build before it (schema 1) gets the table on
//! open. Needs PostgreSQL's server binaries (`tests/common/pg.rs`: a loud skip without them).

mod common;

use std::sync::Arc;

use common::pg::PgServer;
use herald::model::timeline::{TimelineEvent, TimelineKind};
use herald::model::Limits;
use herald::request::{Context, TaskRequest};
use herald::store::pg::{PgBackend, PgOptions};
use herald::store::{purge, Batch, Op, Store};

fn store(url: &str) -> Store {
    let backend = PgBackend::open(url, &PgOptions::default()).expect("open the postgres backend");
    Store::with_backend(Arc::new(backend)).unwrap()
}

fn task(id: &str) -> (herald::model::Task, Vec<herald::model::Message>) {
    let req: TaskRequest = serde_json::from_value(serde_json::json!({
        "id": id, "schedule": {"after": "1h"}, "to": ["a"], "body": "hello"
    }))
    .unwrap();
    req.into_task(&Context {
        now_ms: 1_800_000_000_000,
        limits: &Limits::default(),
        channel_exists: &|_| true,
    })
    .unwrap()
}

fn fired(n: u32) -> TimelineEvent {
    TimelineEvent::run(TimelineKind::Fired, u64::from(n), n, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_written_paged_trimmed_and_deleted_on_postgres_and_schema_1_gets_the_table() {
    let Some(pg) = PgServer::shared("timeline_on_postgres") else {
        return;
    };
    let url = pg.create_db("timeline");
    {
        let s = store(&url);
        s.set_timeline_max(4);
        let (t, m) = task("t");
        s.insert_new_task_with(
            &t,
            &m,
            None,
            &[TimelineEvent::task(TimelineKind::Created, 0)],
        )
        .await
        .unwrap();
        for n in 1..=5 {
            let mut b = Batch::new();
            b.timeline("t", vec![fired(n)]);
            s.write(&b).await.unwrap();
        }
        // Six events, four kept: the oldest went first.
        let (page, next) = s.timeline("t", None, None, 3).unwrap();
        assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!(next, Some(5));
        let (page, next) = s.timeline("t", None, Some(5), 3).unwrap();
        assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [6]);
        assert_eq!(next, None);
        assert_eq!(page[0].kind, TimelineKind::Fired);
        let fp: purge::Footprint = s.footprint("t").unwrap();
        let mut b = Batch::new();
        b.ops.push(Op::DeleteTask(fp));
        s.write(&b).await.unwrap();
        assert!(
            s.timeline_all("t").unwrap().is_empty(),
            "deleted with its task"
        );
    }
    // What a schema-1 database looks like: no commit-token table (version 2), no timeline
    // table (version 3), no node table (version 4).
    pg.psql(
        &url,
        "DROP TABLE herald_timeline; DROP TABLE herald_commit; DROP TABLE herald_node; UPDATE herald_meta SET value = '1' WHERE name = 'schema_version'",
    );
    let s = store(&url);
    let mut b = Batch::new();
    b.timeline("u", vec![fired(1)]);
    s.write(&b).await.unwrap();
    assert_eq!(s.timeline_all("u").unwrap().len(), 1);
    let version = pg.psql(
        &url,
        "SELECT value FROM herald_meta WHERE name = 'schema_version'",
    );
    assert_eq!(
        version.trim(),
        herald::store::pg::schema::SCHEMA_VERSION.to_string(),
        "migrated to this build's schema"
    );
}

/// The counters of many tasks in one round trip (`Backend::prefix_bounds_many` on
/// PostgreSQL, what the fire pump's prefetch uses): each goes on after its last stored seq, a
/// task without events at 2 (its derived `created` is 1); and the derived `created` is shown
/// on PostgreSQL as on sled, without a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_of_many_tasks_are_read_in_one_round_trip_and_created_is_derived() {
    let Some(pg) = PgServer::shared("timeline_on_postgres") else {
        return;
    };
    let url = pg.create_db("counters");
    let s = store(&url);
    s.set_timeline_max(3);
    let ids: Vec<String> = (0..50).map(|i| format!("c{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let (t, m) = task(id);
        s.insert_new_task_with(&t, &m, None, &[TimelineEvent::created(&t)])
            .await
            .unwrap();
        // Task i has i % 5 events after its created: seqs 2 ..= 1 + i % 5, the bound keeps 3.
        let events: Vec<TimelineEvent> = (0..(i % 5) as u32).map(fired).collect();
        if !events.is_empty() {
            let mut b = Batch::new();
            b.timeline(id, events);
            s.write(&b).await.unwrap();
        }
    }
    let (n, _) = s.timeline_footprint().unwrap();
    assert_eq!(
        n,
        (0..50u64).map(|i| (i % 5).min(3)).sum::<u64>(),
        "no created stored"
    );
    let first = s.timeline("c00", None, None, 10).unwrap().0;
    assert_eq!(
        first.iter().map(|e| (e.seq, e.kind)).collect::<Vec<_>>(),
        [(1, TimelineKind::Created)]
    );
    for id in &ids {
        s.forget_timeline_seq(id);
    }
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let before = s.read_round_trips();
    s.prime_timeline_seqs(&refs).unwrap();
    assert_eq!(
        s.read_round_trips() - before,
        1,
        "one round trip for 50 counters"
    );
    for id in &ids {
        let mut b = Batch::new();
        b.timeline(id, vec![TimelineEvent::task(TimelineKind::Paused, 9)]);
        s.write(&b).await.unwrap();
    }
    for (i, id) in ids.iter().enumerate() {
        let seqs: Vec<u64> = s.timeline_all(id).unwrap().iter().map(|e| e.seq).collect();
        let last = 2 + (i % 5) as u64; // the Paused event
        let want: Vec<u64> = if last <= 3 {
            (1..=last).collect() // created still within the bound
        } else {
            (last - 2..=last).collect()
        };
        assert_eq!(seqs, want, "task {id}");
    }
}

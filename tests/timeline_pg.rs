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

//! A failed write tells its writer what failed, typed: the commit thread answers every writer
//! of a failed group with the storage's own error (a full disk, an I/O error with its kind),
//! not with its text alone.

use std::io::ErrorKind;
use std::sync::Arc;

use herald::store::embedded::SledBackend;
use herald::store::fault::{Faults, FaultyBackend};
use herald::store::{Batch, Store, StoreError};

fn task() -> herald::model::Task {
    let req: herald::request::TaskRequest = serde_json::from_value(serde_json::json!({
        "id": "t", "schedule": {"after": "1h"}, "to": ["a"], "body": "b"
    }))
    .unwrap();
    req.into_task(&herald::request::Context {
        now_ms: 1_800_000_000_000,
        limits: &herald::model::Limits::default(),
        channel_exists: &|_| true,
    })
    .unwrap()
    .0
}

#[tokio::test]
async fn a_failed_group_answers_each_writer_with_the_io_error_and_its_kind() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let backend = FaultyBackend {
        inner: Arc::new(SledBackend::open(dir.path(), 8 << 20).unwrap()),
        faults: faults.clone(),
    };
    let store = Store::with_backend(Arc::new(backend)).unwrap();
    let t = task();
    let mut b = Batch::new();
    b.task(&t);
    faults.set(true, false);
    let (a, b2) = tokio::join!(store.write(&b), store.write(&b));
    for e in [a.unwrap_err(), b2.unwrap_err()] {
        assert!(matches!(e, StoreError::Io(_)), "{e:?}");
        assert_eq!(e.io_kind(), Some(ErrorKind::Other));
        assert!(e.is_storage() && !e.is_disk_full());
        assert!(e.to_string().contains("injected fault"), "{e}");
    }
    // A failed sync is the same error.
    faults.set(false, true);
    let e = store.write(&b).await.unwrap_err();
    assert_eq!(e.io_kind(), Some(ErrorKind::Other), "{e:?}");
    faults.set(false, false);
    store.write(&b).await.unwrap();
    assert_eq!(store.get_task("t").unwrap(), Some(t));
}

#[test]
fn each_writer_gets_the_storage_errors_typed_and_the_rest_as_write_failures() {
    let full = StoreError::DiskFull {
        dir: "/d".into(),
        free_mib: 1,
        reserve_mib: 64,
    };
    let copy = full.for_each_writer();
    assert!(matches!(&copy, StoreError::DiskFull { free_mib: 1, .. }));
    assert!(copy.is_disk_full() && copy.is_storage());

    let enospc = StoreError::Io(std::io::Error::new(ErrorKind::StorageFull, "ENOSPC"));
    let copy = enospc.for_each_writer();
    assert_eq!(copy.io_kind(), Some(ErrorKind::StorageFull));
    assert!(copy.is_disk_full());
    assert_eq!(copy.to_string(), enospc.to_string());

    let eio = StoreError::Sled(sled::Error::Io(std::io::Error::other("EIO")));
    let copy = eio.for_each_writer();
    assert_eq!(copy.io_kind(), Some(ErrorKind::Other));
    assert!(!copy.is_disk_full() && copy.is_storage());
    assert_eq!(copy.to_string(), eio.to_string());

    // Not the storage's own: a write failure with its text, a storage error as before.
    let corrupt = StoreError::Corrupt {
        tree: "specs".into(),
        key: "t".into(),
        detail: "bad".into(),
    };
    let copy = corrupt.for_each_writer();
    assert!(matches!(&copy, StoreError::Write(s) if s == &corrupt.to_string()));
    assert!(copy.is_storage());
    let write = StoreError::Write("x".into()).for_each_writer();
    assert_eq!(write.to_string(), "storage write failed: x");
}

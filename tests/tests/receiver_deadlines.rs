//! One deadline per request: a request waits for its commit at most `--db-deadline` in all,
//! and a statement nobody waits for any more (every request of its batch answered 503, or its
//! client gone) is cancelled on the server rather than left queued on a lock, to commit
//! events whose requests were already refused.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use inbox_tests::*;
use receiver::ingest::IngestMode;
use serde_json::json;
use test_db::TestDatabase;

const CANCELLED: &str = "inbox_receiver_statements_cancelled_total";
const WAITING_ON_LOCKS: &str = "SELECT count(*) AS n FROM pg_stat_activity \
     WHERE datname = current_database() AND wait_event_type = 'Lock'";

async fn start(db: &TestDatabase, deadline: Duration) -> TestReceiver {
    let mut args = serve_args(db, IngestMode::GroupCommit);
    args.commit_writers = 1;
    args.db_deadline = deadline;
    TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await
}

async fn lock_the_journal(db: &TestDatabase) -> AsyncPgConnection {
    let mut locker = db.connect().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE inbox_events IN EXCLUSIVE MODE")
        .await
        .unwrap();
    locker
}

fn event(id: &str) -> String {
    json!({ "id": id, "type": "t" }).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_outliving_its_requests_deadline_is_cancelled_on_the_server() {
    let db = TestDatabase::new().await;
    let receiver = start(&db, Duration::from_secs(1)).await;
    let mut check = db.connect().await;
    let mut locker = lock_the_journal(&db).await;

    let (status, _) = receiver.post_demo(&event("evt-late"), DEMO_SECRET).await;
    assert_eq!(status, 503);
    // The lock is still held: only a cancel ends the statement's wait.
    wait_for_count(
        &mut check,
        "the abandoned insert stops waiting for the lock",
        WAITING_ON_LOCKS,
        0,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(receiver.metric(CANCELLED).await, 1.0);
    locker.batch_execute("COMMIT").await.unwrap();

    assert!(
        stored_event(&mut check, "demo", "evt-late").await.is_none(),
        "a refused request's event was not committed behind its back"
    );
    let (status, answer) = receiver.post_demo(&event("evt-late"), DEMO_SECRET).await;
    assert_eq!((status, answer), (200, json!({"status": "accepted"})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_whose_clients_all_hung_up_is_cancelled_before_the_deadline() {
    let db = TestDatabase::new().await;
    let receiver = start(&db, Duration::from_secs(60)).await;
    let mut check = db.connect().await;
    let mut locker = lock_the_journal(&db).await;

    let body = event("evt-gone");
    let hung_up = tokio::time::timeout(Duration::from_secs(30), async {
        let post = receiver.post_demo(&body, DEMO_SECRET);
        let mut post = std::pin::pin!(post);
        tokio::select! {
            _ = &mut post => panic!("answered while the table is locked"),
            () = wait_for_count(&mut check, "the insert waits for the lock", WAITING_ON_LOCKS, 1, Duration::from_secs(10)) => {}
        }
        // Dropping the request closes its connection: the client is gone.
    })
    .await;
    assert!(hung_up.is_ok());
    wait_for_count(
        &mut check,
        "the insert nobody waits for is cancelled",
        WAITING_ON_LOCKS,
        0,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(receiver.metric(CANCELLED).await, 1.0);
    locker.batch_execute("COMMIT").await.unwrap();
    assert!(stored_event(&mut check, "demo", "evt-gone").await.is_none());
}

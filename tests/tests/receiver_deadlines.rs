//! One deadline per request: a request is answered at most `--db-deadline` after it reached
//! the receiver, however long its body took to arrive, and a statement nobody waits for any
//! more (every request of its batch answered 503, or its client gone) is cancelled on the
//! server rather than left queued on a lock, to commit events whose requests were already
//! refused.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use inbox_tests::*;
use receiver::ingest::IngestMode;
use serde_json::json;
use test_db::TestDatabase;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::time::Instant;

const CANCELLED: &str = "inbox_receiver_statements_cancelled_total";
const WAITING_ON_LOCKS: &str = "SELECT count(*) AS n FROM pg_stat_activity \
     WHERE datname = current_database() AND wait_event_type = 'Lock'";

async fn start(db: &TestDatabase, deadline: Duration) -> TestReceiver {
    let mut args = serve_args(db, IngestMode::GroupCommit);
    args.commit_writers = 1;
    args.db_deadline = deadline;
    // Longer than any deadline here: a slow body is answered by the deadline, not by 408.
    args.body_timeout = Duration::from_secs(30);
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

/// Sends a signed webhook to `demo` whose body's second half follows its first after `pause`.
async fn send_slowly(receiver: &TestReceiver, body: &str, pause: Duration) -> TcpStream {
    let (first_half, second_half) = body.as_bytes().split_at(body.len() / 2);
    let head = format!(
        "POST /webhooks/demo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         X-Signature: {}\r\nContent-Length: {}\r\n\r\n",
        demo_signature(body.as_bytes(), DEMO_SECRET),
        body.len()
    );
    let mut stream = TcpStream::connect(receiver.running.addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(first_half).await.unwrap();
    tokio::time::sleep(pause).await;
    stream.write_all(second_half).await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_a_body_takes_to_arrive_comes_out_of_its_deadline() {
    const DEADLINE: Duration = Duration::from_secs(2);
    // Most of the deadline: counted from the hand-over of its events instead of from its
    // arrival, the request would be answered this much later.
    const TRICKLE: Duration = Duration::from_millis(1_500);
    const LATENESS_ALLOWED: Duration = Duration::from_millis(750);
    let db = TestDatabase::new().await;
    let receiver = start(&db, DEADLINE).await;
    let mut check = db.connect().await;
    let mut locker = lock_the_journal(&db).await;

    let sent = Instant::now();
    let mut stream = send_slowly(&receiver, &event("evt-slow"), TRICKLE).await;
    let answer = tokio::time::timeout_at(
        sent + DEADLINE + LATENESS_ALLOWED,
        read_raw_answer(&mut stream),
    )
    .await
    .expect("answered by the deadline counted from the request's arrival");
    assert_eq!(answer.status, 503, "{}", answer.head);
    assert!(answer.header("retry-after").is_some());
    // It did reach the database: its statement waited on the lock, and is cancelled.
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
    assert!(stored_event(&mut check, "demo", "evt-slow").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_complete_after_its_deadline_is_answered_503_without_a_write() {
    let db = TestDatabase::new().await;
    let deadline = Duration::from_millis(300);
    let receiver = start(&db, deadline).await;
    let mut check = db.connect().await;

    let mut stream = send_slowly(&receiver, &event("evt-too-slow"), 2 * deadline).await;
    let answer = read_raw_answer(&mut stream).await;
    assert_eq!(answer.status, 503, "{}", answer.head);
    assert!(answer.header("retry-after").is_some());
    assert_eq!(
        receiver
            .metric(r#"inbox_receiver_db_errors_total{kind="deadline"}"#)
            .await,
        1.0
    );
    assert_eq!(receiver.metric(CANCELLED).await, 0.0, "no statement ran");
    assert!(stored_event(&mut check, "demo", "evt-too-slow")
        .await
        .is_none());
    // Within its budget, the same event is stored.
    let (status, answer) = receiver
        .post_demo(&event("evt-too-slow"), DEMO_SECRET)
        .await;
    assert_eq!((status, answer), (200, json!({"status": "accepted"})));
}

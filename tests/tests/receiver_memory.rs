//! Bounded memory: request bodies reserve their declared length from one budget of bytes in
//! flight before a byte is read; a request the budget cannot take is answered 503 with
//! Retry-After at once, its body unread, while small webhooks keep their quarter of the
//! budget; the bytes come back when requests end; and group-commit statements are bounded in
//! body bytes as well as in events.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel_async::SimpleAsyncConnection;
use futures_util::future::join_all;
use inbox_tests::*;
use receiver::ingest::IngestMode;
use serde_json::json;
use test_db::TestDatabase;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

const IN_FLIGHT: &str = "inbox_receiver_body_bytes_in_flight";
const REFUSED: &str = "inbox_receiver_body_budget_refusals_total";
const MIB: usize = 1024 * 1024;

/// Opens a connection that declares a 1 MiB body and sends only its first kilobyte.
async fn trickle(receiver: &TestReceiver) -> TcpStream {
    let mut stream = TcpStream::connect(receiver.running.addr).await.unwrap();
    let head = format!(
        "POST /webhooks/demo HTTP/1.1\r\nHost: x\r\nX-Signature: sha256=00\r\n\
         Content-Type: application/json\r\nContent-Length: {MIB}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&[b' '; 1024]).await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_beyond_the_budget_are_refused_unread_and_small_webhooks_still_pass() {
    let db = TestDatabase::new().await;
    let mut args = serve_args(&db, IngestMode::GroupCommit);
    args.max_body_bytes_in_flight = 2 * MIB;
    args.body_timeout = Duration::from_secs(30);
    let receiver = TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;

    // The first large body fits (1 MiB, leaving the small bodies' 512 KiB).
    let held = trickle(&receiver).await;
    wait_until(
        "the first body is reserved",
        Duration::from_secs(10),
        async || receiver.metric(IN_FLIGHT).await == MIB as f64,
    )
    .await;
    // The next ones do not: answered at once, before their body is sent.
    for _ in 0..5 {
        let mut refused = trickle(&receiver).await;
        let answer = read_raw_answer(&mut refused).await;
        assert_eq!(answer.status, 503, "{}", answer.head);
        assert_eq!(answer.header("retry-after"), Some("1"));
        assert!(answer.header("x-request-id").is_some());
    }
    assert_eq!(receiver.metric(REFUSED).await, 5.0);

    // Small signed webhooks still get through meanwhile.
    let answers = join_all((0..20).map(|n| {
        let body = json!({"id": format!("evt-{n}"), "type": "t"}).to_string();
        let receiver = &receiver;
        async move { receiver.post_demo(&body, DEMO_SECRET).await }
    }))
    .await;
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "{answers:?}"
    );

    // The held body's bytes come back when its request ends.
    drop(held);
    wait_until(
        "every reserved byte is given back",
        Duration::from_secs(10),
        async || receiver.metric(IN_FLIGHT).await == 0.0,
    )
    .await;
    let mut conn = db.connect().await;
    assert_eq!(stored_events(&mut conn, "demo").await.len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_statements_are_bounded_in_body_bytes() {
    let db = TestDatabase::new().await;
    let mut args = serve_args(&db, IngestMode::GroupCommit);
    args.commit_writers = 1;
    args.max_batch_bytes = 1000;
    args.db_deadline = Duration::from_secs(10);
    let receiver = TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;
    let mut check = db.connect().await;
    let mut locker = db.connect().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE inbox_events IN EXCLUSIVE MODE")
        .await
        .unwrap();
    // About 400 bytes each: two to a statement.
    let body = |n: usize| {
        json!({"id": format!("evt-{n}"), "type": "t", "pad": "p".repeat(370)}).to_string()
    };
    let first_body = body(100);
    let first = receiver.post_demo(&first_body, DEMO_SECRET);
    let rest = async {
        wait_for_count(
            &mut check,
            "the first insert waits for the lock",
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            1,
            Duration::from_secs(10),
        )
        .await;
        let bodies: Vec<String> = (0..6).map(body).collect();
        let posts = join_all(
            bodies
                .iter()
                .map(|body| receiver.post_demo(body, DEMO_SECRET)),
        );
        let release = async {
            wait_until("six events queue", Duration::from_secs(10), async || {
                receiver.metric("inbox_receiver_ingest_queue_events").await == 6.0
            })
            .await;
            locker.batch_execute("COMMIT").await.unwrap();
        };
        tokio::join!(posts, release).0
    };
    let (first, rest) = tokio::join!(first, rest);
    assert_eq!(first.0, 200);
    assert!(rest.iter().all(|(status, _)| *status == 200), "{rest:?}");
    let page = receiver.metrics().await;
    assert_eq!(
        metric_value(&page, "inbox_receiver_batch_size_sum"),
        Some(7.0)
    );
    assert_eq!(
        metric_value(&page, "inbox_receiver_batch_size_count"),
        Some(4.0),
        "one statement for the first, three of two for the six queued behind it"
    );
}

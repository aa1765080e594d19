//! Bounded memory: request bodies draw on one budget of bytes in flight as they arrive; a
//! request whose next bytes the budget cannot take is answered 503 with Retry-After at once,
//! the rest of its body unread, while small webhooks keep their quarter of the budget; a
//! connection that declares a length and idles holds nothing; the bytes come back when
//! requests end; and group-commit statements are bounded in body bytes as well as in events.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel_async::SimpleAsyncConnection;
use futures_util::future::join_all;
use inbox_tests::*;
use receiver::ingest::IngestMode;
use serde_json::json;
use test_db::TestDatabase;
use tokio::io::AsyncWriteExt as _;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;

const IN_FLIGHT: &str = "inbox_receiver_body_bytes_in_flight";
const REFUSED: &str = "inbox_receiver_body_budget_refusals_total";
const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

/// A connection that declared a body and sent part of it; dropping it closes the connection.
struct Trickle {
    read: OwnedReadHalf,
    writer: tokio::task::JoinHandle<()>,
}

impl Drop for Trickle {
    fn drop(&mut self) {
        // The write half goes with its task, and with the read half the socket.
        self.writer.abort();
    }
}

/// Opens a connection that declares a `declared`-byte body and sends its first `sent` bytes,
/// from a task of its own (a refused body is no longer read, so its writes may stall or fail),
/// then holds the connection open.
async fn trickle(receiver: &TestReceiver, declared: usize, sent: usize) -> Trickle {
    let stream = TcpStream::connect(receiver.running.addr).await.unwrap();
    let (read, mut write) = stream.into_split();
    let head = format!(
        "POST /webhooks/demo HTTP/1.1\r\nHost: x\r\nX-Signature: sha256=00\r\n\
         Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    );
    let writer = tokio::spawn(async move {
        let _ = write.write_all(head.as_bytes()).await;
        let _ = write.write_all(&vec![b' '; sent]).await;
        std::future::pending::<()>().await;
    });
    Trickle { read, writer }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_declare_a_body_and_idle_hold_none_of_the_budget() {
    let db = TestDatabase::new().await;
    let mut args = serve_args(&db, IngestMode::GroupCommit);
    args.max_body_bytes = 128 * KIB;
    args.max_body_bytes_in_flight = 256 * KIB;
    args.body_timeout = Duration::from_secs(30);
    let receiver = TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;

    // Four connections declare 64 KiB, the whole budget between them, and send one byte.
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(trickle(&receiver, 64 * KIB, 1).await);
    }
    wait_until(
        "each holds the byte it sent, not the length it declared",
        Duration::from_secs(10),
        async || receiver.metric(IN_FLIGHT).await == 4.0,
    )
    .await;

    let (status, answer) = receiver
        .post_demo(r#"{"id":"evt-small","type":"t"}"#, DEMO_SECRET)
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(receiver.metric(REFUSED).await, 0.0);
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_budget_cannot_take_as_it_arrives_is_refused_and_small_webhooks_still_pass() {
    let db = TestDatabase::new().await;
    let mut args = serve_args(&db, IngestMode::GroupCommit);
    args.max_body_bytes_in_flight = 2 * MIB;
    args.body_timeout = Duration::from_secs(30);
    let receiver = TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;

    // The first large body arrives all but its last byte: 1 MiB held, the small bodies'
    // 512 KiB left free, and 512 KiB for other large bodies.
    let held = trickle(&receiver, MIB, MIB - 1).await;
    wait_until(
        "the first body is held",
        Duration::from_secs(10),
        async || receiver.metric(IN_FLIGHT).await >= (MIB - 1) as f64,
    )
    .await;
    // The next ones do not fit once their bytes come: answered 503 mid-way.
    for _ in 0..3 {
        let mut refused = trickle(&receiver, MIB, 900 * KIB).await;
        let answer = read_raw_answer(&mut refused.read).await;
        assert_eq!(answer.status, 503, "{}", answer.head);
        assert_eq!(answer.header("retry-after"), Some("1"));
        assert!(answer.header("x-request-id").is_some());
    }
    assert_eq!(receiver.metric(REFUSED).await, 3.0);

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
async fn a_body_limit_the_budget_could_never_hold_refuses_to_start() {
    let db = TestDatabase::new().await;
    let mut args = serve_args(&db, IngestMode::GroupCommit);
    args.max_body_bytes = MIB;
    args.max_body_bytes_in_flight = MIB;
    let refused = receiver::server::start(
        &args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await
    .expect_err("1 MiB bodies never fit three quarters of 1 MiB");
    let message = refused.to_string();
    assert!(message.contains("--max-body-bytes (1048576)"), "{message}");
    assert!(
        message.contains("--max-body-bytes-in-flight (1048576)"),
        "{message}"
    );
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

//! Group commit: concurrent deliveries share multi-row insert statements, a lone delivery is
//! written at once, duplicates inside one batch get the right answers, and the per-request mode
//! commits each delivery alone. Batches are read from the receiver's own metrics.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::{Duration, Instant};

use diesel_async::SimpleAsyncConnection;
use futures_util::future::join_all;
use futures_util::stream::{self, StreamExt};
use inbox_tests::*;
use receiver::ingest::IngestMode;
use serde_json::json;
use test_db::TestDatabase;

const BATCH_COUNT: &str = "inbox_receiver_batch_size_count";
const BATCH_SUM: &str = "inbox_receiver_batch_size_sum";
const QUEUED: &str = "inbox_receiver_ingest_queue_events";
const MISMATCHES: &str = r#"inbox_receiver_duplicate_body_mismatch_total{provider="demo"}"#;

async fn start_receiver(db: &TestDatabase, mode: IngestMode, writers: usize) -> TestReceiver {
    let mut args = serve_args(db, mode);
    args.commit_writers = writers;
    args.db_deadline = Duration::from_secs(10);
    TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await
}

/// Posts an owned body, so the future borrows nothing temporary.
async fn post(receiver: &TestReceiver, body: String) -> (u16, serde_json::Value) {
    receiver.post_demo(&body, DEMO_SECRET).await
}

fn event(id: &str, note: &str) -> String {
    json!({"id": id, "type": "t", "note": note}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deliveries_share_insert_statements() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db, IngestMode::GroupCommit, 1).await;

    let answers: Vec<(u16, serde_json::Value)> = stream::iter(0..300)
        .map(|n| {
            let receiver = &receiver;
            async move { post(receiver, event(&format!("evt-{n}"), "")).await }
        })
        .buffer_unordered(48)
        .collect()
        .await;
    assert!(answers
        .iter()
        .all(|answer| *answer == (200, json!({"status": "accepted"}))));

    let page = receiver.metrics().await;
    let statements = metric_value(&page, BATCH_COUNT).unwrap();
    let events = metric_value(&page, BATCH_SUM).unwrap();
    assert_eq!(events, 300.0, "every event written once");
    assert!(
        statements < events,
        "{statements} statements for {events} events: no batch held more than one"
    );
    eprintln!(
        "300 concurrent deliveries written by {statements} statements ({:.1} events each)",
        events / statements
    );
    let mut conn = db.connect().await;
    assert_eq!(stored_events(&mut conn, "demo").await.len(), 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_inside_one_batch_get_one_accepted_and_the_rest_duplicate() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db, IngestMode::GroupCommit, 1).await;
    let mut check = db.connect().await;

    // Hold the table so the only writer's first statement waits, and everything sent meanwhile
    // queues up into its next batch.
    let mut locker = db.connect().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE webhook_inbox IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let first = post(&receiver, event("evt-first", ""));
    let (first_answer, later_answers) = tokio::join!(first, async {
        wait_until(
            "the first insert waits for the lock",
            Duration::from_secs(10),
            async || {
                count(
                    &mut check,
                    "SELECT count(*) AS n FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .await
                    == 1
            },
        )
        .await;
        let same: Vec<_> = (0..5)
            .map(|_| post(&receiver, event("evt-same", "original")))
            .collect();
        let distinct: Vec<_> = (0..6)
            .map(|n| post(&receiver, event(&format!("evt-other-{n}"), "")))
            .collect();
        let queued_then_released = async {
            wait_until("eleven events queue", Duration::from_secs(10), async || {
                receiver.metric(QUEUED).await == 11.0
            })
            .await;
            // Last into the batch: a redelivery of evt-same whose body differs.
            let tampered = post(&receiver, event("evt-same", "tampered"));
            let release = async {
                wait_until("twelve events queue", Duration::from_secs(10), async || {
                    receiver.metric(QUEUED).await == 12.0
                })
                .await;
                locker.batch_execute("COMMIT").await.unwrap();
            };
            tokio::join!(tampered, release).0
        };
        tokio::join!(join_all(same), join_all(distinct), queued_then_released)
    });
    assert_eq!(first_answer, (200, json!({"status": "accepted"})));
    let (same, distinct, tampered) = later_answers;

    let accepted = json!({"status": "accepted"});
    let duplicate = json!({"status": "duplicate"});
    let same_accepted = same.iter().filter(|answer| answer.1 == accepted).count();
    let same_duplicate = same.iter().filter(|answer| answer.1 == duplicate).count();
    assert_eq!((same_accepted, same_duplicate), (1, 4), "{same:?}");
    assert_eq!(tampered, (200, duplicate.clone()));
    assert!(
        distinct
            .iter()
            .all(|answer| *answer == (200, accepted.clone())),
        "{distinct:?}"
    );

    let page = receiver.metrics().await;
    assert_eq!(metric_value(&page, BATCH_COUNT), Some(2.0), "{page}");
    assert_eq!(
        metric_value(&page, BATCH_SUM),
        Some(13.0),
        "one batch of 1, one of 12"
    );
    assert_eq!(
        metric_value(&page, MISMATCHES),
        Some(1.0),
        "the tampered copy is counted"
    );
    let stored = stored_event(&mut check, "demo", "evt-same").await.unwrap();
    assert_eq!(stored.body, event("evt-same", "original").as_bytes());
    assert_eq!(stored_events(&mut check, "demo").await.len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_delivery_is_written_at_once_without_waiting_for_company() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db, IngestMode::GroupCommit, 4).await;
    let mut latencies = Vec::new();
    for n in 0..20 {
        let started = Instant::now();
        let answer = post(&receiver, event(&format!("evt-{n}"), "")).await;
        latencies.push(started.elapsed());
        assert_eq!(answer.0, 200);
    }
    let page = receiver.metrics().await;
    assert_eq!(
        metric_value(&page, BATCH_COUNT),
        Some(20.0),
        "one statement each"
    );
    assert_eq!(metric_value(&page, BATCH_SUM), Some(20.0));
    latencies.sort();
    // Generous for a loaded two-core machine: it only has to rule out waiting for a batch.
    assert!(
        latencies[10] < Duration::from_millis(200),
        "median {:?}",
        latencies[10]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_request_mode_commits_each_delivery_alone() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db, IngestMode::PerRequest, 1).await;
    let answers = join_all((0..40).map(|n| post(&receiver, event(&format!("evt-{n}"), "")))).await;
    assert!(answers.iter().all(|answer| answer.0 == 200));
    let page = receiver.metrics().await;
    assert_eq!(metric_value(&page, BATCH_COUNT), Some(40.0));
    assert_eq!(metric_value(&page, BATCH_SUM), Some(40.0));
    let mut conn = db.connect().await;
    assert_eq!(stored_events(&mut conn, "demo").await.len(), 40);
}

async fn a_redelivery_with_another_body_is_a_counted_duplicate(mode: IngestMode) {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db, mode, 2).await;
    let original = event("evt-changed", "original");
    let changed = event("evt-changed", "changed");
    let accepted = (200, json!({"status": "accepted"}));
    let duplicate = (200, json!({"status": "duplicate"}));

    assert_eq!(receiver.post_demo(&original, DEMO_SECRET).await, accepted);
    assert_eq!(receiver.metric(MISMATCHES).await, 0.0);
    assert_eq!(receiver.post_demo(&changed, DEMO_SECRET).await, duplicate);
    assert_eq!(receiver.metric(MISMATCHES).await, 1.0);
    assert_eq!(receiver.post_demo(&original, DEMO_SECRET).await, duplicate);
    assert_eq!(
        receiver.metric(MISMATCHES).await,
        1.0,
        "an identical copy is no mismatch"
    );

    let mut conn = db.connect().await;
    let stored = stored_event(&mut conn, "demo", "evt-changed")
        .await
        .unwrap();
    assert_eq!(stored.body, original.as_bytes(), "the first body is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_with_another_body_is_a_counted_duplicate_with_group_commit() {
    a_redelivery_with_another_body_is_a_counted_duplicate(IngestMode::GroupCommit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_with_another_body_is_a_counted_duplicate_per_request() {
    a_redelivery_with_another_body_is_a_counted_duplicate(IngestMode::PerRequest).await;
}

/// Listens on the workers' channel and sends the arrival time of each notification.
async fn listen_for_notifications(
    db: &TestDatabase,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<Instant>,
) {
    let (client, mut connection) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let (arrivals, received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(_) = message {
                let _ = arrivals.send(Instant::now());
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {}", inbox_core::NOTIFY_CHANNEL))
        .await
        .unwrap();
    (client, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_to_the_workers_are_spaced_and_cover_every_commit_meanwhile() {
    let db = TestDatabase::new().await;
    let spacing = Duration::from_millis(500);
    let mut args = serve_args(&db, IngestMode::GroupCommit);
    args.notify_spacing = spacing;
    let receiver = TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;
    let (_listening, mut notifications) = listen_for_notifications(&db).await;
    let next = async |notifications: &mut tokio::sync::mpsc::UnboundedReceiver<Instant>| {
        tokio::time::timeout(Duration::from_secs(10), notifications.recv())
            .await
            .expect("a notification within 10 s")
            .unwrap()
    };
    let accepted = (200, json!({"status": "accepted"}));

    let sent = Instant::now();
    assert_eq!(post(&receiver, event("evt-quiet", "")).await, accepted);
    let first = next(&mut notifications).await;
    assert!(
        first - sent < spacing,
        "the first commit after a quiet spell notifies at once ({:?})",
        first - sent
    );

    // Twenty commits one after another, each of which asks for a notification.
    for n in 0..20 {
        assert_eq!(
            post(&receiver, event(&format!("evt-flow-{n}"), "")).await,
            accepted
        );
    }
    let second = next(&mut notifications).await;
    // Arrivals are timed where they are read, so a notification read late (the listener's
    // own wait for a core) shortens the gap seen after it by that much; unspaced ones would
    // arrive within milliseconds of each other.
    let spaced = spacing * 9 / 10;
    assert!(
        second - first >= spaced,
        "the next notification waits for the spacing ({:?})",
        second - first
    );
    assert_eq!(post(&receiver, event("evt-last", "")).await, accepted);
    let third = next(&mut notifications).await;
    assert!(third - second >= spaced);
    // Had each commit queued a notification of its own, they would go on arriving a spacing
    // apart.
    assert!(
        tokio::time::timeout(spacing * 3, notifications.recv())
            .await
            .is_err(),
        "the commits within a spacing share one notification"
    );
}

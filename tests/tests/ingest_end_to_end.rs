//! A webhook from arrival to business effect: receiver and worker on one real database.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use futures_util::future::join_all;
use inbox_tests::*;
use receiver::ingest::IngestMode;
use test_db::TestDatabase;

async fn duplicates_yield_one_row_and_one_effect(mode: IngestMode) {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::start(
        serve_args(&db, mode),
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;
    let body = r#"{"id":"evt_dup","type":"payment.succeeded"}"#;

    assert_eq!(
        receiver.post_demo(body, DEMO_SECRET).await,
        (200, serde_json::json!({"status": "accepted"}))
    );
    assert_eq!(
        receiver.post_demo(body, DEMO_SECRET).await,
        (200, serde_json::json!({"status": "duplicate"}))
    );

    // Twenty concurrent deliveries of another event: exactly one is accepted.
    let concurrent = r#"{"id":"evt_storm","type":"payment.succeeded"}"#;
    let answers = join_all((0..20).map(|_| receiver.post_demo(concurrent, DEMO_SECRET))).await;
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "{answers:?}"
    );
    let accepted = answers
        .iter()
        .filter(|(_, json)| json["status"] == "accepted")
        .count();
    let duplicates = answers
        .iter()
        .filter(|(_, json)| json["status"] == "duplicate")
        .count();
    assert_eq!((accepted, duplicates), (1, 19));

    let mut conn = db.connect().await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox").await,
        2
    );

    let worker = RunningWorker::start(&db, demo_router(), worker_settings("w1"));
    let mut check = db.connect().await;
    wait_for_count(
        &mut check,
        "both events are done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        2,
        Duration::from_secs(20),
    )
    .await;
    worker.stop().await;
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM demo_ledger WHERE event_id IN ('evt_dup', 'evt_storm')"
        )
        .await,
        2,
        "one ledger line per event"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM (SELECT event_id FROM demo_ledger GROUP BY event_id HAVING count(*) > 1) d"
        )
        .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_deliveries_yield_one_row_and_one_effect_with_group_commit() {
    duplicates_yield_one_row_and_one_effect(IngestMode::GroupCommit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_deliveries_yield_one_row_and_one_effect_per_request() {
    duplicates_yield_one_row_and_one_effect(IngestMode::PerRequest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_signature_is_refused_and_nothing_is_stored() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let body = r#"{"id":"evt_forged","type":"payment.succeeded"}"#;

    let (status, json) = receiver.post_demo(body, "not-the-secret").await;
    assert_eq!(status, 401);
    assert_eq!(json["code"], "invalid_signature");

    let missing = receiver
        .client
        .post(receiver.url("/webhooks/demo"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 401);

    let mut conn = db.connect().await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox").await,
        0
    );
    let metrics = receiver.metrics().await;
    assert!(
        metrics
            .contains(r#"inbox_receiver_requests_total{outcome="unauthorized",provider="demo"} 2"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_webhook_wakes_an_idle_worker_through_the_receivers_notification() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let mut settings = worker_settings("w1");
    // Nothing but the notification can wake it in time.
    settings.poll_interval = Duration::from_secs(600);
    settings.rescue_interval = Duration::from_secs(600);
    let worker = RunningWorker::start(&db, demo_router(), settings);
    let mut conn = db.connect().await;
    // The first event proves the worker runs; after it the worker idles.
    assert_eq!(
        receiver
            .post_demo(r#"{"id":"evt_a","type":"t"}"#, DEMO_SECRET)
            .await
            .0,
        200
    );
    wait_for_count(
        &mut conn,
        "the first event is done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        receiver
            .post_demo(r#"{"id":"evt_b","type":"t"}"#, DEMO_SECRET)
            .await
            .0,
        200
    );
    wait_for_count(
        &mut conn,
        "the second event is done, long before any poll",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        2,
        Duration::from_secs(30),
    )
    .await;
    worker.stop().await;
}

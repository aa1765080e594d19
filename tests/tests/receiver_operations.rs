//! What operators rely on: liveness and readiness, Prometheus metrics on their own listener
//! only, and a request id on every answer.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use inbox_tests::*;
use test_db::TestDatabase;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_are_served_where_operators_look() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;

    assert_eq!(receiver.get("/healthz").await.json["status"], "alive");
    let ready = receiver.get("/readyz").await;
    assert_eq!(
        (ready.status, ready.json["status"].as_str()),
        (200, Some("ready"))
    );

    let body = r#"{"id":"evt_ops","type":"t"}"#;
    assert_eq!(receiver.post_demo(body, DEMO_SECRET).await.0, 200);
    assert_eq!(receiver.post_demo(body, "wrong").await.0, 401);

    // Not on the public listener: webhook senders have no business reading it.
    assert_eq!(receiver.get("/metrics").await.status, 404);
    let response = receiver
        .client
        .get(format!("http://{}/metrics", receiver.running.metrics_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let page = response.text().await.unwrap();
    for series in [
        r#"inbox_receiver_requests_total{outcome="accepted",provider="demo"} 1"#,
        r#"inbox_receiver_requests_total{outcome="unauthorized",provider="demo"} 1"#,
        r#"inbox_receiver_ingest_duration_seconds_count{provider="demo"} 1"#,
        "inbox_receiver_batch_size_count 1",
        "inbox_receiver_ingest_queue_events 0",
        r#"inbox_receiver_signature_verified_total{provider="demo",secret="current"} 1"#,
    ] {
        assert!(page.contains(series), "{series} missing from:\n{page}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_its_own_request_id() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let mut ids = std::collections::HashSet::new();
    let answers = [
        receiver.get("/healthz").await,
        receiver.get("/webhooks/demo").await,
        receiver.get("/nowhere").await,
        receiver
            .post_webhook("demo", &[], r#"{"id":"evt_unsigned"}"#)
            .await,
        receiver.post_webhook("nobody", &[], "{}").await,
    ];
    for answer in &answers {
        let id = answer
            .header("x-request-id")
            .unwrap_or_else(|| panic!("no X-Request-Id on a {} answer", answer.status));
        assert_eq!(id.len(), 36, "a UUID: {id}");
        assert!(ids.insert(id.to_owned()), "request id {id} reused");
    }
}

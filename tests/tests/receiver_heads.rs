//! Request heads: a head over `--max-head-bytes` is answered 431 (with `X-Request-Id`, like
//! every answer of the app), the headers kept with an event are capped in bytes, and
//! `/readyz` answers from a result cached for about a second, so probes cannot open a
//! database connection each.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use futures_util::future::join_all;
use inbox_tests::*;
use receiver::accept::{MAX_STORED_HEADER_BYTES, TRUNCATED_MARKER};
use serde_json::json;
use test_db::TestDatabase;

const READINESS_CHECKS: &str = "inbox_receiver_readiness_checks_total";

fn signed(body: &str) -> Vec<(String, String)> {
    vec![(
        "x-signature".to_owned(),
        demo_signature(body.as_bytes(), DEMO_SECRET),
    )]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_the_budget_is_answered_431_with_a_request_id() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let body = json!({"id": "evt-big-head", "type": "t"}).to_string();
    let mut headers = signed(&body);
    // 100 KB of headers: under actix's own limits (128 KiB, 96 headers), far over the budget.
    for n in 0..25 {
        headers.push((format!("x-filler-{n}"), "f".repeat(4000)));
    }
    let answer = receiver.post_webhook("demo", &headers, body.clone()).await;
    assert_eq!(answer.status, 431, "{:?}", answer.json);
    assert_eq!(answer.json["code"], "headers_too_large");
    assert!(answer.header("x-request-id").is_some());
    let mut conn = db.connect().await;
    assert!(stored_events(&mut conn, "demo").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_headers_kept_with_an_event_are_capped_in_bytes() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let body = json!({"id": "evt-many-headers", "type": "t"}).to_string();
    let mut headers = signed(&body);
    // 12 KB of headers: within the head budget, over what a row keeps.
    for n in 0..12 {
        headers.push((format!("x-filler-{n:02}"), "f".repeat(1000)));
    }
    let answer = receiver.post_webhook("demo", &headers, body).await;
    assert_eq!(answer.status, 200, "{:?}", answer.json);
    let mut conn = db.connect().await;
    let stored = stored_event(&mut conn, "demo", "evt-many-headers")
        .await
        .unwrap();
    let kept = stored.headers.as_object().unwrap();
    let bytes: usize = kept
        .iter()
        .map(|(name, value)| name.len() + value.as_str().map_or(0, str::len))
        .sum();
    assert!(bytes <= MAX_STORED_HEADER_BYTES + 64, "{bytes} bytes kept");
    assert!(
        kept.contains_key("x-signature"),
        "the early headers are kept"
    );
    assert_eq!(kept[TRUNCATED_MARKER], "true");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_probes_share_one_database_check_a_second() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let answers = join_all((0..50).map(|_| receiver.get("/readyz"))).await;
    assert!(answers.iter().all(|answer| answer.status == 200));
    // 50 concurrent probes make one check (two if the second turned over in between).
    let checks = receiver.metric(READINESS_CHECKS).await;
    assert!((1.0..=2.0).contains(&checks), "{checks} database checks");
}

//! Exact ids: the dedup key is what the provider sent, never an approximation or a guess.
//! Integers beyond 64 bits keep their digits, an object naming the id twice is refused, an
//! id header that is present but unreadable is refused rather than passed over for another
//! header, and a numeric id is the same event as the string of its digits.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use inbox_tests::*;
use serde_json::json;
use test_db::TestDatabase;

const SHOPIFY: &str = r#"
[providers.shopify]
scheme = "shopify"
secrets = [{ env = "SHOPIFY_SECRET" }]
"#;
const SHOPIFY_SECRET: &str = "shop-secret";

async fn post_raw_body(receiver: &TestReceiver, body: &str) -> Answer {
    let headers = vec![(
        "x-signature".to_owned(),
        demo_signature(body.as_bytes(), DEMO_SECRET),
    )];
    receiver
        .post_webhook("demo", &headers, body.to_owned())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integer_ids_beyond_64_bits_are_two_events_not_one() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let first = post_raw_body(&receiver, r#"{"id":8262010272424615981079,"type":"t"}"#).await;
    let second = post_raw_body(&receiver, r#"{"id":8262010272424615981080,"type":"t"}"#).await;
    assert_eq!(first.json, json!({"status": "accepted"}));
    assert_eq!(
        second.json,
        json!({"status": "accepted"}),
        "not a duplicate"
    );
    let mut conn = db.connect().await;
    let ids: Vec<String> = stored_events(&mut conn, "demo")
        .await
        .into_iter()
        .map(|event| event.event_id)
        .collect();
    assert_eq!(ids, ["8262010272424615981079", "8262010272424615981080"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_naming_its_id_twice_is_refused() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let answer = post_raw_body(&receiver, r#"{"id":"evt-a","type":"t","id":"evt-b"}"#).await;
    assert_eq!(answer.status, 400, "{:?}", answer.json);
    assert_eq!(answer.json["code"], "ambiguous_body");
    let answer = post_raw_body(&receiver, r#"{"id":"evt-c","type":"a","type":"b"}"#).await;
    assert_eq!(
        answer.status, 400,
        "a type decides the handler: {:?}",
        answer.json
    );
    // Repeats elsewhere in the body are the handler's business.
    let answer = post_raw_body(&receiver, r#"{"id":"evt-d","type":"t","n":1,"n":2}"#).await;
    assert_eq!(answer.status, 200, "{:?}", answer.json);
    let mut conn = db.connect().await;
    assert_eq!(stored_events(&mut conn, "demo").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_numeric_id_and_the_string_of_its_digits_are_one_event() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let number = post_raw_body(&receiver, r#"{"id":1,"type":"t"}"#).await;
    let string = post_raw_body(&receiver, r#"{"id":"1","type":"t"}"#).await;
    assert_eq!(number.json, json!({"status": "accepted"}));
    assert_eq!(string.json, json!({"status": "duplicate"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_id_header_is_refused_not_passed_over_for_the_next_one() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::start(
        serve_args(&db, receiver::ingest::IngestMode::GroupCommit),
        providers(SHOPIFY, &[("SHOPIFY_SECRET", SHOPIFY_SECRET)]),
    )
    .await;
    let body = br#"{"id":7}"#;
    let signed = signed_headers(&*scheme("shopify"), SHOPIFY_SECRET, body, "", unix_now());
    let mut request =
        b"POST /webhooks/shopify HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".to_vec();
    for (name, value) in &signed {
        request.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    // Latin-1 bytes in the event id header, a valid webhook id beside it.
    request.extend_from_slice(b"X-Shopify-Event-Id: ev-\xe9t\xe9\r\n");
    request.extend_from_slice(b"X-Shopify-Webhook-Id: wh-1\r\n");
    request.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    request.extend_from_slice(body);
    let answer = raw_exchange(receiver.running.addr, &request).await;
    assert_eq!(answer.status, 400, "{}", answer.head);
    let json: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(json["code"], "unreadable_header");
    let mut conn = db.connect().await;
    assert!(stored_events(&mut conn, "shopify").await.is_empty());
}

//! Replays of body-only signatures: a GitHub delivery seen once can be sent again under a
//! fresh X-GitHub-Delivery id, and its signature still verifies. Such a copy (same provider,
//! type and body within the dedup window) is stored apart as a suppressed replay, answered
//! 200, counted, never queued for a handler, until an operator releases it.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use inbox_core::replays;
use inbox_tests::*;
use serde_json::json;
use test_db::TestDatabase;

const GITHUB: &str = r#"
[providers.github]
scheme = "github"
secrets = [{ env = "GITHUB_SECRET" }]
"#;
const GITHUB_SECRET: &str = "replay-test-secret";
const PUSH: &[u8] = br#"{"ref":"refs/heads/main","after":"4f2a9c1"}"#;

async fn start_receiver(db: &TestDatabase) -> TestReceiver {
    TestReceiver::start(
        serve_args(db, receiver::ingest::IngestMode::GroupCommit),
        providers(GITHUB, &[("GITHUB_SECRET", GITHUB_SECRET)]),
    )
    .await
}

/// `body` signed as GitHub signs it, delivered as `delivery` of type `event`.
async fn deliver(receiver: &TestReceiver, delivery: &str, event: &str, body: &[u8]) -> Answer {
    let mut headers = signed_headers(&*scheme("github"), GITHUB_SECRET, body, "", 0);
    headers.push(("x-github-delivery".to_owned(), delivery.to_owned()));
    headers.push(("x-github-event".to_owned(), event.to_owned()));
    receiver
        .post_webhook("github", &headers, body.to_vec())
        .await
}

async fn queued_event_ids(conn: &mut diesel_async::AsyncPgConnection) -> Vec<String> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        event_id: String,
    }
    let rows: Vec<Row> = diesel_async::RunQueryDsl::load(
        diesel::sql_query(
            "SELECT event_id FROM inbox_queue JOIN inbox_events USING (id) ORDER BY event_id",
        ),
        conn,
    )
    .await
    .unwrap();
    rows.into_iter().map(|row| row.event_id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_again_under_a_fresh_id_is_kept_apart_and_never_queued() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;

    let original = deliver(&receiver, "d-1", "push", PUSH).await;
    assert_eq!(original.json, json!({"status": "accepted"}));
    let replay = deliver(&receiver, "d-2", "push", PUSH).await;
    assert_eq!(replay.status, 200, "a replay is answered like an event");
    assert_eq!(replay.json, json!({"status": "accepted"}));
    // The replay's own id again: a duplicate, like any redelivery.
    let again = deliver(&receiver, "d-2", "push", PUSH).await;
    assert_eq!(again.json, json!({"status": "duplicate"}));
    // The same body as another type, and another body: events of their own.
    let other_type = deliver(&receiver, "d-3", "create", PUSH).await;
    assert_eq!(other_type.json, json!({"status": "accepted"}));
    let other_body = deliver(&receiver, "d-4", "push", br#"{"ref":"refs/heads/dev"}"#).await;
    assert_eq!(other_body.json, json!({"status": "accepted"}));

    let mut conn = db.connect().await;
    assert_eq!(queued_event_ids(&mut conn).await, ["d-1", "d-3", "d-4"]);
    let ids: Vec<String> = stored_events(&mut conn, "github")
        .await
        .into_iter()
        .map(|event| event.event_id)
        .collect();
    assert_eq!(ids, ["d-1", "d-3", "d-4"], "the journal holds events only");

    let suppressed = replays::list(&mut conn, None, None, 10).await.unwrap();
    assert_eq!(suppressed.len(), 1);
    let replay = &suppressed[0];
    assert_eq!(
        (replay.provider.as_str(), replay.event_id.as_str()),
        ("github", "d-2")
    );
    assert_eq!(replay.event_type.as_deref(), Some("push"));
    assert_eq!(replay.original_event_id.as_deref(), Some("d-1"));
    assert_eq!(replay.body_bytes, i64::try_from(PUSH.len()).unwrap());
    assert_eq!(
        receiver
            .metric("inbox_receiver_replays_suppressed_total{provider=\"github\"}")
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_copies_under_different_ids_store_one_event() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;
    let deliveries: Vec<String> = (0..12).map(|n| format!("race-{n:02}")).collect();
    let answers = futures_util::future::join_all(
        deliveries
            .iter()
            .map(|delivery| deliver(&receiver, delivery, "push", PUSH)),
    )
    .await;
    for answer in &answers {
        assert_eq!(answer.status, 200, "{:?}", answer.json);
    }
    let mut conn = db.connect().await;
    assert_eq!(queued_event_ids(&mut conn).await.len(), 1);
    assert_eq!(
        replays::list(&mut conn, Some("github"), None, 100)
            .await
            .unwrap()
            .len(),
        11
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_replay_is_queued_once_as_a_new_arrival() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;
    deliver(&receiver, "d-1", "push", PUSH).await;
    deliver(&receiver, "d-2", "push", PUSH).await;
    let mut conn = db.connect().await;
    let suppressed = replays::list(&mut conn, None, None, 10).await.unwrap();
    let id = suppressed[0].id;

    assert_eq!(
        replays::release(&mut conn, &[id, 999_999]).await.unwrap(),
        [id]
    );
    assert_eq!(
        replays::release(&mut conn, &[id]).await.unwrap(),
        Vec::<i64>::new(),
        "released once"
    );
    assert_eq!(queued_event_ids(&mut conn).await, ["d-1", "d-2"]);
    let released = stored_event(&mut conn, "github", "d-2").await.unwrap();
    assert_eq!(released.body, PUSH);
    assert_eq!(released.event_type.as_deref(), Some("push"));
    assert!(replays::list(&mut conn, None, None, 10)
        .await
        .unwrap()
        .is_empty());
    // Still one dedup key per id: a redelivery of the released id is a duplicate.
    let again = deliver(&receiver, "d-2", "push", PUSH).await;
    assert_eq!(again.json, json!({"status": "duplicate"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_old_replays_with_their_keys_and_frees_the_body() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;
    deliver(&receiver, "d-1", "push", PUSH).await;
    deliver(&receiver, "d-2", "push", PUSH).await;
    let mut conn = db.connect().await;
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(
            "UPDATE inbox_suppressed_replays SET received_at = now() - interval '10 days'",
        ),
        &mut conn,
    )
    .await
    .unwrap();
    let purged = inbox_core::operations::purge_done(
        &mut conn,
        Duration::from_secs(7 * 86_400),
        Duration::from_secs(3 * 86_400),
        100,
    )
    .await
    .unwrap();
    assert_eq!(purged.suppressed_replays, 1);
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_dedup WHERE event_id = 'd-2'"
        )
        .await,
        0,
        "its dedup key went with it"
    );
    // The original is not purged (it is still queued), so the body is still a replay.
    let replay = deliver(&receiver, "d-5", "push", PUSH).await;
    assert_eq!(replay.json, json!({"status": "accepted"}));
    assert_eq!(queued_event_ids(&mut conn).await, ["d-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_original_is_gone_the_same_body_is_an_event_again() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;
    deliver(&receiver, "d-1", "push", PUSH).await;
    let mut conn = db.connect().await;
    // As retention does once the dedup window is over: the original's key goes.
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query("DELETE FROM inbox_dedup WHERE event_id = 'd-1'"),
        &mut conn,
    )
    .await
    .unwrap();
    let later = deliver(&receiver, "d-9", "push", PUSH).await;
    assert_eq!(later.json, json!({"status": "accepted"}));
    assert_eq!(queued_event_ids(&mut conn).await, ["d-1", "d-9"]);
    assert!(replays::list(&mut conn, None, None, 10)
        .await
        .unwrap()
        .is_empty());
}

/// Linear signs the body and a timestamp inside it, but its id travels in the unsigned
/// `Linear-Delivery` header; the template signs a timestamp header but reads its id from
/// another header. Within the tolerance a copy under a fresh id verifies, so it is a replay.
const TIMESTAMPED: &str = r#"
[providers.linear]
scheme = "linear"
secrets = [{ env = "LINEAR_SECRET" }]

[providers.acme]
scheme = "template"
signature_header = "X-Acme-Signature"
signed = "{timestamp}.{body}"
timestamp_header = "X-Acme-Timestamp"
event_id = { header = "X-Acme-Delivery" }
secrets = [{ env = "ACME_SECRET" }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timestamped_body_sent_again_within_its_tolerance_under_a_fresh_id_is_a_replay() {
    let db = TestDatabase::new().await;
    let providers = providers(
        TIMESTAMPED,
        &[
            ("LINEAR_SECRET", "lin_wh_test"),
            ("ACME_SECRET", "acme-test"),
        ],
    );
    let schemes: Vec<(
        &str,
        &str,
        &str,
        std::sync::Arc<dyn inbox_signature::Scheme>,
    )> = vec![
        (
            "linear",
            "linear-delivery",
            "lin_wh_test",
            providers.get("linear").unwrap().scheme.clone(),
        ),
        (
            "acme",
            "x-acme-delivery",
            "acme-test",
            providers.get("acme").unwrap().scheme.clone(),
        ),
    ];
    let receiver = TestReceiver::start(
        serve_args(&db, receiver::ingest::IngestMode::GroupCommit),
        providers,
    )
    .await;
    let body = br#"{"action":"create","type":"Issue","data":{"id":"2174add1"}}"#;
    for (provider, id_header, secret, scheme) in schemes {
        let signed = signed_request(&*scheme, secret, "", body, "", unix_now());
        for delivery in ["d-1", "d-2"] {
            let mut headers = signed.headers.clone();
            headers.push((id_header.to_owned(), delivery.to_owned()));
            let answer = receiver
                .post_webhook(provider, &headers, signed.body.clone())
                .await;
            assert_eq!(answer.json, json!({"status": "accepted"}), "{provider}");
        }
        let mut conn = db.connect().await;
        let stored: Vec<String> = stored_events(&mut conn, provider)
            .await
            .into_iter()
            .map(|event| event.event_id)
            .collect();
        assert_eq!(stored, ["d-1"], "{provider}: the copy is not an event");
        let suppressed = replays::list(&mut conn, Some(provider), None, 10)
            .await
            .unwrap();
        assert_eq!(suppressed.len(), 1, "{provider}");
        assert_eq!(suppressed[0].event_id, "d-2");
    }
}

const MAILGUN: &str = r#"
[providers.mailgun]
scheme = "mailgun"
secrets = [{ env = "MAILGUN_KEY" }]
"#;
const MAILGUN_KEY: &str = "key-replay-test";

/// A Mailgun body for `event_id`, signed (its `signature` block) with a token of its own.
fn mailgun_delivery(event_id: &str) -> Vec<u8> {
    let body = json!({"event-data": {"id": event_id, "event": "delivered"}}).to_string();
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    signed_request(
        &*scheme("mailgun"),
        MAILGUN_KEY,
        "",
        body.as_bytes(),
        event_id,
        now,
    )
    .body
}

/// Mailgun signs only `{timestamp}{token}`: a captured delivery's `signature` block verifies
/// over any `event-data`. A delivery whose token was seen before under another event id is a
/// replay, kept apart; the same id again is a duplicate; a fresh token is a new event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailgun_token_seen_before_under_another_event_id_is_a_replay() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::start(
        serve_args(&db, receiver::ingest::IngestMode::GroupCommit),
        providers(MAILGUN, &[("MAILGUN_KEY", MAILGUN_KEY)]),
    )
    .await;
    let post = |body: Vec<u8>| receiver.post_webhook("mailgun", &[], body);

    let original = mailgun_delivery("mg-1");
    assert_eq!(
        post(original.clone()).await.json,
        json!({"status": "accepted"})
    );
    assert_eq!(
        post(original.clone()).await.json,
        json!({"status": "duplicate"})
    );
    // The captured signature block over other event data.
    let mut forged: serde_json::Value = serde_json::from_slice(&original).unwrap();
    forged["event-data"] = json!({"id": "mg-forged", "event": "complained"});
    let forged = serde_json::to_vec(&forged).unwrap();
    let replay = post(forged).await;
    assert_eq!(replay.status, 200, "{:?}", replay.json);
    assert_eq!(
        post(mailgun_delivery("mg-2")).await.json,
        json!({"status": "accepted"})
    );

    let mut conn = db.connect().await;
    assert_eq!(queued_event_ids(&mut conn).await, ["mg-1", "mg-2"]);
    let suppressed = replays::list(&mut conn, Some("mailgun"), None, 10)
        .await
        .unwrap();
    let [replay] = suppressed.as_slice() else {
        panic!("one suppressed replay: {suppressed:?}");
    };
    assert_eq!(replay.event_id, "mg-forged");
    assert_eq!(replay.original_event_id.as_deref(), Some("mg-1"));
}

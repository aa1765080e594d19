//! One bad row never fails its batch: an event that passes the receiver's checks but that the
//! database refuses is isolated from the events it shares a statement with; only its request
//! is refused (422 for a constraint or a data exception, which no retry can satisfy), the
//! others are stored and acknowledged. And the receiver's own limits are the schema's: they
//! are held here against the migrated CHECK constraints and the database's text type.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel_async::SimpleAsyncConnection;
use futures_util::future::join_all;
use inbox_core::inbox::{self, EventOrdering, InsertOutcome, NewEvent};
use inbox_core::limits::{is_storable_text, MAX_EVENT_ID_CHARS, MAX_PROVIDER_CHARS};
use inbox_tests::*;
use receiver::ingest::IngestMode;
use serde_json::json;
use sha2::{Digest, Sha256};
use test_db::TestDatabase;
use tokio_postgres::error::SqlState;

const QUEUED: &str = "inbox_receiver_ingest_queue_events";
const INVALID_ROWS: &str = r#"inbox_receiver_db_errors_total{kind="invalid_row"}"#;

/// Test-only constraints: ids starting `poison` break a CHECK (SQLSTATE 23514); ids
/// `num-<text>` make the CHECK itself fail with a data exception (22P02).
const POISON_CONSTRAINTS: &str = "
ALTER TABLE inbox_events ADD CONSTRAINT test_no_poison CHECK (event_id NOT LIKE 'poison%');
ALTER TABLE inbox_events ADD CONSTRAINT test_numbers_are_numbers
    CHECK (event_id NOT LIKE 'num-%' OR substr(event_id, 5)::int >= 0);
";

fn new_event(provider: &str, event_id: &str) -> NewEvent {
    let body = json!({ "id": event_id }).to_string().into_bytes();
    NewEvent {
        provider: provider.to_owned(),
        event_id: event_id.to_owned(),
        event_type: None,
        headers: json!({}),
        body_sha256: Sha256::digest(&body).into(),
        replays: inbox_core::inbox::ReplayCheck::Off,
        body,
        ordering: None,
    }
}

fn is_check_violation(result: &Result<Vec<InsertOutcome>, DieselError>) -> bool {
    matches!(
        result,
        Err(DieselError::DatabaseError(
            DatabaseErrorKind::CheckViolation,
            _
        ))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receivers_limits_are_the_check_constraints_of_the_schema() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    // Characters, not bytes: the widest ids are two bytes a character.
    let longest_provider = "p".repeat(MAX_PROVIDER_CHARS);
    let longest_id = "é".repeat(MAX_EVENT_ID_CHARS);
    let stored = inbox::insert_events(
        &mut conn,
        &[
            new_event(&longest_provider, "evt-1"),
            new_event("demo", &longest_id),
        ],
    )
    .await
    .unwrap();
    assert_eq!(stored, vec![InsertOutcome::Accepted; 2]);

    let too_long_provider = "p".repeat(MAX_PROVIDER_CHARS + 1);
    let refused = inbox::insert_events(&mut conn, &[new_event(&too_long_provider, "evt-1")]).await;
    assert!(is_check_violation(&refused), "{refused:?}");
    let too_long_id = "é".repeat(MAX_EVENT_ID_CHARS + 1);
    let refused = inbox::insert_events(&mut conn, &[new_event("demo", &too_long_id)]).await;
    assert!(is_check_violation(&refused), "{refused:?}");
    let refused = inbox::insert_events(&mut conn, &[new_event("demo", "")]).await;
    assert!(
        is_check_violation(&refused),
        "empty ids are refused too: {refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_text_the_receiver_refuses_is_the_text_the_database_cannot_hold() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let settings = db.args(1).connection_settings().unwrap();
    let (mut client, driver) = settings.connect_client().await.unwrap();
    tokio::spawn(driver);
    let rehearse = async |client: &mut tokio_postgres::Client, event: &NewEvent| {
        inbox::rehearse_insert(client, std::slice::from_ref(event), Duration::from_secs(10))
            .await
            .err()
            .and_then(|error| error.code().cloned())
    };

    let nul = "key\u{0}nul";
    assert!(!is_storable_text(nul));
    let mut event = new_event("demo", "evt-nul-key");
    event.ordering = Some(EventOrdering {
        key: nul.to_owned(),
        sequence: 0,
        hold: Duration::ZERO,
    });
    // diesel-async names no kind for it; the driver gives its SQLSTATE.
    let refused = inbox::insert_events(&mut conn, std::slice::from_ref(&event)).await;
    assert!(
        matches!(
            refused,
            Err(DieselError::DatabaseError(DatabaseErrorKind::Unknown, _))
        ),
        "{refused:?}"
    );
    assert_eq!(
        rehearse(&mut client, &event).await,
        Some(SqlState::CHARACTER_NOT_IN_REPERTOIRE)
    );

    // Every other character is storable, the controls the receiver keeps too; a rehearsal
    // stores nothing.
    let kept = "key\u{1}\u{7f}\u{fffd}é";
    assert!(is_storable_text(kept));
    event.ordering.as_mut().unwrap().key = kept.to_owned();
    assert_eq!(rehearse(&mut client, &event).await, None);
    assert!(stored_event(&mut conn, "demo", "evt-nul-key")
        .await
        .is_none());
    let stored = inbox::insert_events(&mut conn, std::slice::from_ref(&event)).await;
    assert_eq!(stored.unwrap(), vec![InsertOutcome::Accepted]);
}

async fn post(receiver: &TestReceiver, id: String) -> Answer {
    let body = json!({ "id": id, "type": "t" }).to_string();
    let headers = vec![(
        "x-signature".to_owned(),
        demo_signature(body.as_bytes(), DEMO_SECRET),
    )];
    receiver.post_webhook("demo", &headers, body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_database_refuses_fails_alone_and_its_batch_is_stored() {
    let db = TestDatabase::new().await;
    let mut setup = db.connect().await;
    setup.batch_execute(POISON_CONSTRAINTS).await.unwrap();
    let mut args = serve_args(&db, IngestMode::GroupCommit);
    args.commit_writers = 1;
    args.db_deadline = Duration::from_secs(10);
    let receiver = TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;

    // Hold the table so the only writer's first statement waits and everything sent meanwhile
    // forms its next batch.
    let mut locker = db.connect().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE inbox_events IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let first = post(&receiver, "evt-first".into());
    let mut ids: Vec<String> = (0..10).map(|n| format!("evt-{n}")).collect();
    ids.insert(3, "poison-1".into());
    ids.insert(8, "num-x".into());
    let mut check = db.connect().await;
    let batch = async {
        wait_for_count(
            &mut check,
            "the first insert waits for the lock",
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            1,
            Duration::from_secs(10),
        )
        .await;
        let batch = join_all(ids.iter().map(|id| post(&receiver, id.clone())));
        let release = async {
            wait_until("the batch queues", Duration::from_secs(10), async || {
                receiver.metric(QUEUED).await == 12.0
            })
            .await;
            locker.batch_execute("COMMIT").await.unwrap();
        };
        tokio::join!(batch, release).0
    };
    let (first, answers) = tokio::join!(first, batch);
    assert_eq!(first.status, 200);

    for (id, answer) in ids.iter().zip(&answers) {
        match id.as_str() {
            // A data exception reaches the receiver without its SQLSTATE; rehearsing the row
            // alone tells it from a passing failure, and it is refused for good too.
            "poison-1" | "num-x" => {
                assert_eq!(answer.status, 422, "{id}: {:?}", answer.json);
                assert_eq!(answer.json["code"], "unstorable_event");
                assert!(answer.header("retry-after").is_none());
            }
            _ => assert_eq!(
                (answer.status, &answer.json),
                (200, &json!({"status": "accepted"})),
                "{id}"
            ),
        }
    }
    let stored: Vec<String> = stored_events(&mut setup, "demo")
        .await
        .into_iter()
        .map(|event| event.event_id)
        .collect();
    assert_eq!(stored.len(), 11, "every good event stored: {stored:?}");
    assert!(!stored.iter().any(|id| id == "poison-1" || id == "num-x"));
    assert_eq!(receiver.metric(INVALID_ROWS).await, 2.0);
    // Refused for good, so recorded as refusals like any other 4xx.
    wait_for_count(
        &mut setup,
        "both refusals are recorded",
        "SELECT count(*) AS n FROM inbox_rejections \
         WHERE provider = 'demo' AND cause = 'unstorable_event' AND status = 422",
        2,
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_row_is_answered_422_in_per_request_mode_too() {
    let db = TestDatabase::new().await;
    let mut setup = db.connect().await;
    setup.batch_execute(POISON_CONSTRAINTS).await.unwrap();
    let receiver = TestReceiver::start(
        serve_args(&db, IngestMode::PerRequest),
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;
    let refused = post(&receiver, "poison-2".into()).await;
    assert_eq!(refused.status, 422, "{:?}", refused.json);
    assert!(refused.header("retry-after").is_none());
    assert_eq!(post(&receiver, "evt-ok".into()).await.status, 200);
}

/// `demo`'s scheme, with each event ordered by its body's `key`.
const ORDERED_PROVIDERS: &str = r#"
[providers.ordered]
scheme = "hmac-sha256"
signature_header = "X-Signature"
encoding = "hex"
prefix = "sha256="
event_id = { json_pointer = "/id" }
event_type = { json_pointer = "/type" }
secrets = [{ env = "DEMO_SECRET", name = "current" }]

[providers.ordered.ordering]
key = { json_pointer = "/key" }
"#;

const ORDERED_REFUSED: &str =
    r#"inbox_receiver_requests_total{outcome="bad_request",provider="ordered"}"#;

async fn post_ordered(receiver: &TestReceiver, id: &str, key: &str) -> Answer {
    let body = json!({ "id": id, "type": "t", "key": key }).to_string();
    let headers = vec![(
        "x-signature".to_owned(),
        demo_signature(body.as_bytes(), DEMO_SECRET),
    )];
    receiver.post_webhook("ordered", &headers, body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_an_ordering_key_refuses_only_its_event_and_its_batch_is_stored() {
    let db = TestDatabase::new().await;
    let mut check = db.connect().await;
    let mut args = serve_args(&db, IngestMode::GroupCommit);
    args.commit_writers = 1;
    args.db_deadline = Duration::from_secs(10);
    let receiver = TestReceiver::start(
        args,
        providers(ORDERED_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;

    // As above: the lone writer's first statement waits on the lock while the rest queue up
    // behind it and form one batch.
    let mut locker = db.connect().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE inbox_events IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let first = post_ordered(&receiver, "evt-first", "key-first");
    // A JSON string may carry U+0000 and the body is valid JSON, but PostgreSQL's text
    // cannot hold it (SQLSTATE 22021).
    let keys: Vec<(String, String)> = (0..6)
        .map(|n| (format!("evt-{n}"), format!("key-{n}")))
        .chain([("evt-nul".to_owned(), "key\u{0}nul".to_owned())])
        .collect();
    let batch = async {
        wait_for_count(
            &mut check,
            "the first insert waits for the lock",
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            1,
            Duration::from_secs(10),
        )
        .await;
        let batch = join_all(
            keys.iter()
                .map(|(id, key)| post_ordered(&receiver, id, key)),
        );
        let release = async {
            // Each of them queued behind the first, or refused before the database.
            wait_until("the batch queues", Duration::from_secs(10), async || {
                receiver.metric(QUEUED).await + receiver.metric(ORDERED_REFUSED).await == 7.0
            })
            .await;
            locker.batch_execute("COMMIT").await.unwrap();
        };
        tokio::join!(batch, release).0
    };
    let (first, answers) = tokio::join!(first, batch);
    assert_eq!(first.status, 200);

    for ((id, _), answer) in keys.iter().zip(&answers) {
        if id == "evt-nul" {
            // Refused for good (not retried), before the database.
            assert_eq!(answer.status, 400, "{:?}", answer.json);
            assert_eq!(answer.json["code"], "invalid_ordering_key");
            assert!(answer.header("retry-after").is_none());
        } else {
            assert_eq!(
                (answer.status, &answer.json),
                (200, &json!({"status": "accepted"})),
                "{id}"
            );
        }
    }
    let stored: Vec<String> = stored_events(&mut check, "ordered")
        .await
        .into_iter()
        .map(|event| event.event_id)
        .collect();
    assert_eq!(stored.len(), 7, "every good event stored: {stored:?}");
    assert!(!stored.iter().any(|id| id == "evt-nul"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_missing_from_the_journal_is_answered_503_not_refused_for_good() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let mut conn = db.connect().await;
    // The receiver's own keeper of the days ahead runs at start and would put the day back
    // whenever it ran after the drop; holding the lock every creation takes first keeps it
    // out until the test creates the day itself.
    conn.batch_execute("SELECT pg_advisory_lock(hashtext('inbox_create_journal_day'))")
        .await
        .unwrap();
    // Today's partition gone (as if no binary had created it): the row has nowhere to go,
    // which PostgreSQL reports as a check violation naming no constraint.
    conn.batch_execute(
        "DO $$ BEGIN EXECUTE format('DROP TABLE inbox_events_%s', \
         to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')); END $$",
    )
    .await
    .unwrap();
    let body = r#"{"id":"evt-no-day","type":"t"}"#;
    let (status, answer) = receiver.post_demo(body, DEMO_SECRET).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(
        receiver.metric(INVALID_ROWS).await,
        0.0,
        "not refused as a bad row"
    );
    conn.batch_execute(
        "SELECT pg_advisory_unlock(hashtext('inbox_create_journal_day')); \
         SELECT inbox_create_journal_day((now() AT TIME ZONE 'UTC')::date)",
    )
    .await
    .unwrap();
    let (status, answer) = receiver.post_demo(body, DEMO_SECRET).await;
    assert_eq!(
        (status, answer),
        (200, json!({"status": "accepted"})),
        "the provider's retry is stored"
    );
}

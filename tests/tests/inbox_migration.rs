//! The migration that splits the inbox into journal, queue and finished rows, run on a
//! database migrated with the earlier migrations and holding rows in every state: every event
//! keeps its columns, its state and its dedup key, the workers' transitions carry on from
//! there, and the migration reverts to the same rows.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel::sql_types::Text;
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::inbox::{self, InsertOutcome, NewEvent};
use inbox_core::operations::{self, Backlog};
use inbox_core::InboxStatus;
use inbox_tests::count;
use test_db::TestDatabase;

/// The last migration before the split.
const BEFORE_SPLIT: &str = "20261201000004";
const HELD_TOKEN: &str = "11111111-1111-1111-1111-111111111111";
const LEASE: Duration = Duration::from_secs(30);

/// One row per state, written into the one-table inbox as its transitions left them.
const ROWS_IN_EVERY_STATE: &str = "
INSERT INTO webhook_inbox (provider, event_id, event_type, headers, body, body_sha256, status,
    attempt, next_attempt_at, lease_token, locked_by, locked_until, last_error, processed_at)
VALUES
  ('demo', 'ready-new', 'a.b', '{\"x\": \"1\"}', '\\x7b7d', sha256('\\x7b7d'), 0, 0, now() - interval '1 minute', NULL, NULL, NULL, NULL, NULL),
  ('demo', 'ready-retry', NULL, '{}', '\\x01', sha256('\\x01'), 0, 2, now() + interval '1 hour', NULL, 'w0', NULL, 'retryable: boom', NULL),
  ('demo', 'processing-held', 'a.b', '{}', '\\x02', sha256('\\x02'), 1, 1, now() - interval '1 minute', '11111111-1111-1111-1111-111111111111', 'w1', now() + interval '1 hour', NULL, NULL),
  ('demo', 'processing-expired', 'a.b', '{}', '\\x03', sha256('\\x03'), 1, 1, now() - interval '1 minute', '22222222-2222-2222-2222-222222222222', 'w2', now() - interval '1 second', NULL, NULL),
  ('demo', 'done', 'a.b', '{}', '\\x04', sha256('\\x04'), 2, 1, now() - interval '1 minute', NULL, 'w1', NULL, NULL, now() - interval '30 seconds'),
  ('demo', 'dead', 'a.b', '{}', '\\x05', sha256('\\x05'), 3, 12, now() - interval '1 minute', NULL, 'w3', NULL, 'permanent: no', now() - interval '20 seconds')
";

/// A database migrated up to [`BEFORE_SPLIT`] holding [`ROWS_IN_EVERY_STATE`].
async fn one_table_inbox_with_rows_in_every_state() -> (TestDatabase, AsyncPgConnection) {
    let db = TestDatabase::migrated_until(BEFORE_SPLIT).await;
    let mut conn = db.connect().await;
    diesel::sql_query(ROWS_IN_EVERY_STATE)
        .execute(&mut conn)
        .await
        .unwrap();
    (db, conn)
}

#[derive(QueryableByName)]
struct Snapshot {
    #[diesel(sql_type = Text)]
    rows: String,
}

/// Every event with every column as one text: the same query reads the one-table inbox and
/// the view that replaces it. A finished event's `next_attempt_at` is left out: nothing reads
/// it once the event is finished.
async fn snapshot(conn: &mut AsyncPgConnection) -> String {
    let rows: Vec<Snapshot> = diesel::sql_query(
        "SELECT string_agg(row_to_json(inbox)::text, E'\\n' ORDER BY inbox.id) AS rows FROM ( \
             SELECT id, provider, event_id, event_type, received_at, headers, body, body_sha256, \
                    status, attempt, \
                    CASE WHEN status IN (0, 1) THEN next_attempt_at END AS next_attempt_at, \
                    lease_token, locked_by, locked_until, last_error, processed_at \
             FROM webhook_inbox) AS inbox",
    )
    .load(conn)
    .await
    .unwrap();
    rows.into_iter().map(|row| row.rows).collect()
}

#[derive(QueryableByName)]
struct Digest {
    #[diesel(sql_type = diesel::sql_types::Bytea)]
    sha256: Vec<u8>,
}

/// An event as the receiver stores it, its body hashed by PostgreSQL as the rows above are.
async fn event(conn: &mut AsyncPgConnection, event_id: &str, body: &[u8]) -> NewEvent {
    let digest: Digest = diesel::sql_query("SELECT sha256($1) AS sha256")
        .bind::<diesel::sql_types::Bytea, _>(body)
        .get_result(conn)
        .await
        .unwrap();
    NewEvent {
        provider: "demo".into(),
        event_id: event_id.into(),
        event_type: None,
        headers: serde_json::json!({}),
        body: body.to_vec(),
        body_sha256: digest.sha256.try_into().unwrap(),
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_split_keeps_every_event_its_state_and_its_dedup_key_and_reverts_to_the_same_rows() {
    let (db, mut conn) = one_table_inbox_with_rows_in_every_state().await;
    let before = snapshot(&mut conn).await;
    assert_eq!(before.lines().count(), 6);

    db.migrate_pending();
    assert_eq!(
        snapshot(&mut conn).await,
        before,
        "the view shows the same rows"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_queue").await,
        4
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_finished").await,
        2
    );

    // Back to the one-table inbox: every later migration, then the split itself.
    db.revert_after(BEFORE_SPLIT);
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM pg_tables WHERE tablename = 'inbox_queue'"
        )
        .await,
        0,
        "the split is reverted"
    );
    assert_eq!(
        snapshot(&mut conn).await,
        before,
        "the revert restores them"
    );
    db.migrate_pending();
    assert_eq!(snapshot(&mut conn).await, before);

    // The operator's figures read the new tables.
    let backlog = operations::backlog(&mut conn).await.unwrap();
    assert_eq!(
        (backlog.ready, backlog.due, backlog.processing, backlog.dead),
        (2, 1, 2, 1),
        "{backlog:?}"
    );
    assert!(backlog.oldest_unprocessed_age_seconds > 0.0, "{backlog:?}");
    assert_ne!(backlog, Backlog::default());
    assert_eq!(
        operations::count_by_status(&mut conn).await.unwrap(),
        [
            (InboxStatus::Ready, 2),
            (InboxStatus::Processing, 2),
            (InboxStatus::Done, 1),
            (InboxStatus::Dead, 1)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_split_the_transitions_carry_on_from_the_migrated_states() {
    let (db, mut conn) = one_table_inbox_with_rows_in_every_state().await;
    db.migrate_pending();

    // Every stored key is still a duplicate, faithful or not; a new one is accepted.
    let events = [
        event(&mut conn, "done", b"\x04").await,
        event(&mut conn, "dead", b"other").await,
        event(&mut conn, "ready-new", b"{}").await,
        event(&mut conn, "fresh", b"{}").await,
    ];
    let outcomes = inbox::insert_events(&mut conn, &events).await.unwrap();
    assert_eq!(
        outcomes,
        [
            InsertOutcome::Duplicate {
                same_body: Some(true)
            },
            InsertOutcome::Duplicate {
                same_body: Some(false)
            },
            InsertOutcome::Duplicate {
                same_body: Some(true)
            },
            InsertOutcome::Accepted,
        ]
    );

    // The lease taken before the migration still fences: its holder completes its event.
    let held: i64 = count(
        &mut conn,
        "SELECT id AS n FROM inbox_events WHERE event_id = 'processing-held'",
    )
    .await;
    inbox::complete(&mut conn, held, HELD_TOKEN.parse().unwrap())
        .await
        .unwrap();
    // The lapsed lease is rescued (with no backoff here, and its attempt given back), the
    // retry waits for its time, the others are claimed.
    let no_backoff = inbox_core::BackoffPolicy {
        base: Duration::ZERO,
        cap: Duration::ZERO,
        max_attempts: 12,
    };
    let rescued = inbox::rescue_expired(&mut conn, &no_backoff, 100)
        .await
        .unwrap();
    assert_eq!((rescued.requeued, rescued.dead), (1, 0));
    let claim = inbox::claim_due(&mut conn, "after", LEASE, 10)
        .await
        .unwrap();
    let mut claimed: Vec<(&str, i32)> = claim
        .events
        .iter()
        .map(|e| (e.event_id.as_str(), e.attempt))
        .collect();
    claimed.sort_unstable();
    assert_eq!(
        claimed,
        [("fresh", 1), ("processing-expired", 1), ("ready-new", 1)]
    );
    let ids: Vec<i64> = claim.events.iter().map(|e| e.id).collect();
    inbox::complete_all(&mut conn, &ids, claim.lease_token)
        .await
        .unwrap();
    // The dead letter replays, with its history.
    let dead = operations::replay_candidates(&mut conn, &Default::default())
        .await
        .unwrap();
    assert_eq!(operations::replay(&mut conn, &dead).await.unwrap(), 1);
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE event_id = 'dead' AND status = 0 AND attempt = 0 AND last_error = 'replayed by operator after: permanent: no'").await,
        1
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2 AND processed_at IS NOT NULL AND lease_token IS NULL").await,
        5
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE status = 0 AND event_id IN ('ready-retry', 'dead')").await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverting_refuses_to_drop_acknowledged_replays_pauses_or_ordered_events() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let copy = |event_id: &str, key: Option<&str>| {
        let body = br#"{"object":"pi_1","amount":100}"#.to_vec();
        NewEvent {
            provider: "github".into(),
            event_id: event_id.into(),
            event_type: Some("push".into()),
            headers: serde_json::json!({}),
            body_sha256: <sha2::Sha256 as sha2::Digest>::digest(&body).into(),
            replays: inbox_core::inbox::ReplayCheck::SameBody,
            ordering: key.map(|key| inbox::EventOrdering {
                key: inbox::ordering_key("github", key),
                sequence: 1,
                hold: Duration::ZERO,
            }),
            body,
        }
    };
    inbox::insert_events(&mut conn, &[copy("delivery-1", Some("pi_1"))])
        .await
        .unwrap();
    let outcome = inbox::insert_events(&mut conn, &[copy("delivery-2", None)])
        .await
        .unwrap();
    assert!(
        matches!(outcome[..], [InsertOutcome::SuppressedReplay { .. }]),
        "{outcome:?}"
    );
    diesel::sql_query(
        "INSERT INTO inbox_paused_routes (provider, event_type, paused_by) \
         VALUES ('github', '*', 'test')",
    )
    .execute(&mut conn)
    .await
    .unwrap();

    // Each refusal leaves its migration applied, and what it guards as it was.
    let refused = db.try_revert_after("20261201000007").unwrap_err();
    assert!(refused.contains("routes are paused"), "{refused}");
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_paused_routes").await,
        1
    );
    diesel::sql_query("DELETE FROM inbox_paused_routes")
        .execute(&mut conn)
        .await
        .unwrap();
    let refused = db.try_revert_after("20261201000007").unwrap_err();
    assert!(
        refused.contains("inbox_suppressed_replays holds acknowledged events"),
        "{refused}"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_suppressed_replays"
        )
        .await,
        1
    );
    diesel::sql_query("DELETE FROM inbox_suppressed_replays")
        .execute(&mut conn)
        .await
        .unwrap();
    let refused = db.try_revert_after("20261201000007").unwrap_err();
    assert!(refused.contains("ordered events are queued"), "{refused}");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_queue WHERE ordering_key IS NOT NULL"
        )
        .await,
        1
    );
    // With nothing left to lose, the revert goes through, and forward again.
    diesel::sql_query("UPDATE inbox_queue SET ordering_key = NULL, ordering_sequence = NULL")
        .execute(&mut conn)
        .await
        .unwrap();
    db.try_revert_after("20261201000007").unwrap();
    db.migrate_pending();
}

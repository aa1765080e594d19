//! The journal partitioned by day: partitions created ahead, whole days dropped by retention,
//! what must outlive its day kept, and the dedup key unique across days.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use chrono::{NaiveDate, Utc};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use inbox_core::inbox::{self, InsertOutcome, NewEvent};
use inbox_core::{journal, operations};
use inbox_tests::count;
use sha2::{Digest, Sha256};
use test_db::TestDatabase;
use uuid::Uuid;

fn event(id: &str) -> NewEvent {
    let body = format!(r#"{{"id":"{id}"}}"#).into_bytes();
    NewEvent {
        provider: "demo".into(),
        event_id: id.into(),
        event_type: Some("test.event".into()),
        headers: serde_json::json!({}),
        body_sha256: Sha256::digest(&body).into(),
        replays: inbox_core::inbox::ReplayCheck::Off,
        body,
        ordering: None,
    }
}

fn today() -> NaiveDate {
    Utc::now().date_naive()
}

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

/// Moves the events whose ids `ids_sql` selects into the day `days_ago` (its partition made
/// first), as if they had been received then.
async fn received_days_ago(conn: &mut AsyncPgConnection, days_ago: u64, ids_sql: &str) {
    let day = today() - chrono::Days::new(days_ago);
    journal::ensure_day(conn, day).await.unwrap();
    conn.batch_execute(&format!(
        "UPDATE inbox_events SET journal_day = '{day}', \
                received_at = now() - interval '{days_ago} days' \
         WHERE id IN ({ids_sql})"
    ))
    .await
    .unwrap();
}

async fn partition_names(conn: &mut AsyncPgConnection) -> Vec<String> {
    journal::partitions(conn)
        .await
        .unwrap()
        .into_iter()
        .map(|partition| partition.name)
        .collect()
}

fn day_partition(day: NaiveDate) -> String {
    format!("inbox_events_{}", day.format("%Y%m%d"))
}

#[tokio::test]
async fn today_and_the_days_ahead_have_partitions_and_ensuring_them_again_creates_none() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let names = partition_names(&mut conn).await;
    for ahead in 0..=journal::DAYS_AHEAD {
        let day = today() + chrono::Days::new(u64::try_from(ahead).unwrap());
        assert!(names.contains(&day_partition(day)), "{day} in {names:?}");
    }
    assert_eq!(names.last().map(String::as_str), Some("inbox_events_kept"));
    // Binaries starting together: every call but none creates anything.
    let (first, second) = tokio::join!(
        async {
            let mut conn = db.connect().await;
            journal::ensure_days_ahead(&mut conn).await.unwrap()
        },
        async {
            let mut conn = db.connect().await;
            journal::ensure_days_ahead(&mut conn).await.unwrap()
        }
    );
    assert_eq!(first + second, 0);
    // A missing day is made, once.
    let next = today() + chrono::Days::new(u64::try_from(journal::DAYS_AHEAD).unwrap());
    conn.batch_execute(&format!("DROP TABLE {}", day_partition(next)))
        .await
        .unwrap();
    assert_eq!(journal::ensure_days_ahead(&mut conn).await.unwrap(), 1);
    assert_eq!(journal::ensure_days_ahead(&mut conn).await.unwrap(), 0);
    // And today's partition takes today's events.
    inbox::insert_events(&mut conn, &[event("evt_today")])
        .await
        .unwrap();
    assert_eq!(
        count(
            &mut conn,
            &format!("SELECT count(*) AS n FROM {}", day_partition(today()))
        )
        .await,
        1
    );
}

#[tokio::test]
async fn the_dedup_key_holds_across_days() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &[event("evt_1")])
        .await
        .unwrap();
    received_days_ago(&mut conn, 3, "SELECT id FROM inbox_events").await;
    // Redelivered today, three days after its day: still a duplicate, of the same body.
    let outcome = inbox::insert_events(&mut conn, &[event("evt_1")])
        .await
        .unwrap();
    assert_eq!(
        outcome,
        vec![InsertOutcome::Duplicate {
            same_body: Some(true)
        }]
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_events").await,
        1
    );
}

/// Seven events received ten days ago (four done, one dead, one ready, one processing) and
/// two received today.
async fn an_old_day_with_every_state(conn: &mut AsyncPgConnection) {
    let old: Vec<NewEvent> = (1..=7).map(|n| event(&format!("evt_old_{n}"))).collect();
    inbox::insert_events(conn, &old).await.unwrap();
    let claim = inbox::claim_due(conn, "w1", Duration::from_secs(60), 7)
        .await
        .unwrap();
    let ids: Vec<i64> = claim.events.iter().map(|event| event.id).collect();
    for &id in &ids[..4] {
        inbox::complete(conn, id, claim.lease_token).await.unwrap();
    }
    inbox::dead_letter(conn, ids[4], claim.lease_token, "bad payload")
        .await
        .unwrap();
    inbox::release_unstarted(conn, &ids[5..6], claim.lease_token)
        .await
        .unwrap();
    // ids[6] stays processing under its lease.
    received_days_ago(conn, 10, "SELECT id FROM inbox_events").await;
    conn.batch_execute(
        "UPDATE inbox_finished SET processed_at = now() - interval '10 days'; \
         INSERT INTO processed_events (provider, event_id, processed_at) \
         VALUES ('demo', 'evt_old_1', now() - interval '10 days')",
    )
    .await
    .unwrap();
    inbox::insert_events(conn, &[event("evt_new_1"), event("evt_new_2")])
        .await
        .unwrap();
}

#[tokio::test]
async fn retention_drops_a_whole_day_and_keeps_what_is_still_wanted() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    an_old_day_with_every_state(&mut conn).await;
    let old_day = day_partition(today() - chrono::Days::new(10));

    let purged = operations::purge_done(&mut conn, WEEK, WEEK, 2)
        .await
        .unwrap();
    assert_eq!(purged.days, 1, "{purged:?}");
    assert_eq!(purged.events, 4, "{purged:?}");
    assert_eq!(purged.processed_records, 1, "{purged:?}");
    assert!(!partition_names(&mut conn).await.contains(&old_day));
    assert_eq!(
        count(
            &mut conn,
            &format!("SELECT count(*) AS n FROM pg_class WHERE relname = '{old_day}'")
        )
        .await,
        0,
        "dropped, not only detached"
    );
    // The dead, the ready and the processing events are kept, with their keys and states.
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_events_kept").await,
        3
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE event_id LIKE 'evt_old_%' AND status IN (0, 1, 3)").await,
        3
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_dedup").await,
        5,
        "the kept events' keys and today's"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_finished").await,
        1,
        "the dead letter's outcome"
    );
    // Today's events are untouched; a second purge finds nothing.
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE event_id LIKE 'evt_new_%' AND status = 0").await,
        2
    );
    let again = operations::purge_done(&mut conn, WEEK, WEEK, 2)
        .await
        .unwrap();
    assert_eq!(again, operations::Purged::default());
    // The kept events are still served: the ready one is claimed with its body.
    let claim = inbox::claim_due(&mut conn, "w2", Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert!(
        claim
            .events
            .iter()
            .any(|event| event.event_id == "evt_old_6" && !event.body.is_empty()),
        "{:?}",
        claim.events
    );
}

#[tokio::test]
async fn a_kept_event_done_longer_ago_than_the_retention_is_deleted_row_by_row() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    an_old_day_with_every_state(&mut conn).await;
    operations::purge_done(&mut conn, WEEK, WEEK, 100)
        .await
        .unwrap();
    // The dead letter is replayed and done, eight days ago.
    let dead: i64 = count(
        &mut conn,
        "SELECT id AS n FROM inbox_finished WHERE status = 3",
    )
    .await;
    operations::replay(&mut conn, &[dead]).await.unwrap();
    conn.batch_execute(&format!(
        "UPDATE inbox_queue SET status = 1, lease_token = '{}', locked_until = now() + interval '1 minute' WHERE id = {dead}",
        Uuid::nil()
    ))
    .await
    .unwrap();
    inbox::complete(&mut conn, dead, Uuid::nil()).await.unwrap();
    // Its handler's record of the effect, however recent, goes with the event (by its key:
    // the table has no index by time to find it by).
    conn.batch_execute(&format!(
        "UPDATE inbox_finished SET processed_at = now() - interval '8 days' WHERE id = {dead}; \
         INSERT INTO processed_events (provider, event_id) VALUES ('demo', 'evt_old_5')"
    ))
    .await
    .unwrap();

    let purged = operations::purge_done(&mut conn, WEEK, WEEK, 100)
        .await
        .unwrap();
    assert_eq!((purged.days, purged.events), (0, 1), "{purged:?}");
    assert_eq!(purged.processed_records, 1, "{purged:?}");
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM processed_events").await,
        0
    );
    assert_eq!(
        count(
            &mut conn,
            &format!("SELECT count(*) AS n FROM webhook_inbox WHERE id = {dead}")
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_dedup WHERE event_id = 'evt_old_5'"
        )
        .await,
        0,
        "its key goes with it"
    );
}

#[tokio::test]
async fn a_day_detached_but_not_dropped_is_dropped_by_the_next_purge() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let old_day = today() - chrono::Days::new(30);
    journal::ensure_day(&mut conn, old_day).await.unwrap();
    // A purge whose connection was lost between the detach and the drop.
    conn.batch_execute(&format!(
        "ALTER TABLE inbox_events DETACH PARTITION {}",
        day_partition(old_day)
    ))
    .await
    .unwrap();
    let purged = operations::purge_done(&mut conn, WEEK, WEEK, 100)
        .await
        .unwrap();
    assert_eq!(purged.days, 1, "{purged:?}");
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) AS n FROM pg_class WHERE relname = '{}'",
                day_partition(old_day)
            )
        )
        .await,
        0
    );
}

#[tokio::test]
async fn one_purge_runs_at_a_time_and_another_leaves_everything_to_it() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    an_old_day_with_every_state(&mut conn).await;
    // Another replica's purge, in progress.
    let mut other = db.connect().await;
    diesel::sql_query("SELECT pg_advisory_lock($1)")
        .bind::<diesel::sql_types::BigInt, _>(operations::PURGE_LOCK_KEY)
        .execute(&mut other)
        .await
        .unwrap();
    let refused = operations::purge_done(&mut conn, WEEK, WEEK, 100).await;
    assert!(
        matches!(refused, Err(operations::PurgeError::AlreadyRunning)),
        "{refused:?}"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_finished").await,
        5,
        "nothing was purged"
    );
    // The other purge ends (its lock let go in its session, which a closed connection's
    // server process would do only once it noticed).
    diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<diesel::sql_types::BigInt, _>(operations::PURGE_LOCK_KEY)
        .execute(&mut other)
        .await
        .unwrap();
    let purged = operations::purge_done(&mut conn, WEEK, WEEK, 100)
        .await
        .unwrap();
    assert_eq!(purged.days, 1, "{purged:?}");
    // It let the lock go: the next purge runs (and finds nothing).
    let again = operations::purge_done(&mut conn, WEEK, WEEK, 100)
        .await
        .unwrap();
    assert_eq!(again, operations::Purged::default());
}

#[tokio::test]
async fn every_day_vacuums_and_analyzes_as_an_insert_only_table() {
    // The first day is the table that was the journal before partitioning, which once carried
    // the queue's autovacuum settings: a vacuum and an analyze of the whole day every minute.
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let tuned = count(
        &mut conn,
        "SELECT count(*) AS n FROM pg_inherits JOIN pg_class ON pg_class.oid = inhrelid \
         WHERE inhparent = 'inbox_events'::regclass AND reloptions IS NOT NULL",
    )
    .await;
    assert_eq!(
        tuned, 0,
        "day partitions with autovacuum settings of their own"
    );
}

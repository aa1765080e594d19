//! Database time is bounded: every attempt runs under a statement and a lock timeout, and a
//! handler that times out has its statement cancelled on the server, so a handler stuck on a
//! row lock can no longer hold its event, its slot and a connection for ever.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::inbox::{insert_events, NewEvent};
use inbox_tests::*;
use test_db::TestDatabase;
use worker::limits::DatabaseLimits;
use worker::{Event, Handled, Handler, HandlerError, Router};

/// Applies its event by incrementing the one row of `contended`: it waits for that row's lock
/// whenever someone else holds it.
struct IncrementsTheContendedRow;

#[async_trait]
impl Handler for IncrementsTheContendedRow {
    async fn handle(&self, _: &Event, tx: &mut AsyncPgConnection) -> Result<Handled, HandlerError> {
        diesel::sql_query("UPDATE contended SET applied = applied + 1 WHERE id = 1")
            .execute(tx)
            .await?;
        Ok(Handled::Applied)
    }
}

fn event() -> NewEvent {
    NewEvent {
        provider: "demo".into(),
        event_id: "evt_contended".into(),
        event_type: Some("test.event".into()),
        headers: serde_json::json!({}),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: None,
        body: br#"{"id":"evt_contended"}"#.to_vec(),
    }
}

/// A database with the `contended` row, its lock held by the returned connection's open
/// transaction, and the event waiting.
async fn contended_row_locked_by_the_test(db: &TestDatabase) -> AsyncPgConnection {
    let mut setup = db.connect().await;
    diesel::sql_query("CREATE TABLE contended (id int PRIMARY KEY, applied int NOT NULL)")
        .execute(&mut setup)
        .await
        .unwrap();
    diesel::sql_query("INSERT INTO contended VALUES (1, 0)")
        .execute(&mut setup)
        .await
        .unwrap();
    insert_events(&mut setup, &[event()]).await.unwrap();
    let mut holder = db.connect().await;
    diesel::sql_query("BEGIN")
        .execute(&mut holder)
        .await
        .unwrap();
    diesel::sql_query("SELECT id FROM contended WHERE id = 1 FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();
    holder
}

async fn release_and_expect_one_effect(mut holder: AsyncPgConnection, db: &TestDatabase) {
    diesel::sql_query("COMMIT")
        .execute(&mut holder)
        .await
        .unwrap();
    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "the event done once the lock is released",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        count(&mut conn, "SELECT applied::bigint AS n FROM contended").await,
        1,
        "one effect"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_waiting_on_a_row_lock_is_retried_within_the_lock_timeout_and_applies_once() {
    let db = TestDatabase::new().await;
    let holder = contended_row_locked_by_the_test(&db).await;
    let lock_timeout = Duration::from_millis(300);
    let router = Router::new().route_with_limits(
        None,
        None,
        Arc::new(IncrementsTheContendedRow),
        DatabaseLimits {
            statement_timeout: None,
            lock_timeout: Some(lock_timeout),
        },
    );
    let mut settings = worker_settings("w1");
    settings.handler_timeout = Duration::from_secs(60);
    settings.backoff.max_attempts = 50;
    let lease = settings.lease;
    let worker = RunningWorker::start(&db, router, settings);
    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "the attempt failed on the lock timeout and the event was retried",
        "SELECT count(*) AS n FROM webhook_inbox \
         WHERE status <> 2 AND attempt >= 2 AND last_error LIKE '%lock timeout%'",
        1,
        lease + lock_timeout,
    )
    .await;
    release_and_expect_one_effect(holder, &db).await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_times_out_has_its_statement_cancelled_so_its_event_is_retried_at_once() {
    let db = TestDatabase::new().await;
    let holder = contended_row_locked_by_the_test(&db).await;
    // The database timeouts are far away: only the handler timeout and the cancellation it
    // sends can end the wait. Without the cancellation, the rollback after the first timeout
    // would wait behind the blocked statement for a minute.
    let router = Router::new().route_with_limits(
        None,
        None,
        Arc::new(IncrementsTheContendedRow),
        DatabaseLimits {
            statement_timeout: Some(Duration::from_secs(60)),
            lock_timeout: Some(Duration::from_secs(60)),
        },
    );
    let mut settings = worker_settings("w1");
    settings.handler_timeout = Duration::from_millis(300);
    settings.backoff.max_attempts = 50;
    let worker = RunningWorker::start(&db, router, settings);
    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "two attempts timed out and the event is being retried",
        "SELECT count(*) AS n FROM webhook_inbox \
         WHERE status <> 2 AND attempt >= 3 AND last_error LIKE '%handler timed out%'",
        1,
        Duration::from_secs(15),
    )
    .await;
    release_and_expect_one_effect(holder, &db).await;
    worker.stop().await;
}

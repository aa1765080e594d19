//! Exactly one business effect per event, when leases expire, handlers fail at random, and
//! workers run side by side; and the operator's replay.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::inbox::{insert_events, NewEvent};
use inbox_core::schema::demo_ledger;
use inbox_tests::*;
use test_db::TestDatabase;
use worker::{Event, Handled, Handler, HandlerError, Router};

fn event(n: usize, event_type: &str) -> NewEvent {
    let body = format!(r#"{{"id":"evt_{n}","type":"{event_type}"}}"#).into_bytes();
    NewEvent {
        provider: "demo".into(),
        event_id: format!("evt_{n}"),
        event_type: Some(event_type.into()),
        headers: serde_json::json!({}),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: None,
        body,
    }
}

async fn seed(db: &TestDatabase, events: usize) {
    let mut conn = db.connect().await;
    let batch: Vec<NewEvent> = (0..events).map(|n| event(n, "test.event")).collect();
    for chunk in batch.chunks(1_000) {
        insert_events(&mut conn, chunk).await.unwrap();
    }
}

/// Writes a ledger line with no idempotency guard of its own, so that only the lease
/// fencing stands between a retry and a second effect.
struct UnguardedLedger {
    delay: Duration,
    failure_rate: f64,
    /// Written as the line's event type, to tell whose effect committed.
    writer: &'static str,
}

#[async_trait]
impl Handler for UnguardedLedger {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        tokio::time::sleep(self.delay).await;
        diesel::insert_into(demo_ledger::table)
            .values((
                demo_ledger::provider.eq(&event.provider),
                demo_ledger::event_id.eq(&event.event_id),
                demo_ledger::event_type.eq(self.writer),
            ))
            .execute(tx)
            .await?;
        // Fail after the write: the rollback must take the write with it.
        if rand::random::<f64>() < self.failure_rate {
            return Err(HandlerError::Retryable("random failure".into()));
        }
        Ok(Handled::Applied)
    }
}

fn unguarded(delay: Duration, failure_rate: f64, writer: &'static str) -> Router {
    Router::new().route(
        None,
        None,
        Arc::new(UnguardedLedger {
            delay,
            failure_rate,
            writer,
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_worker_whose_lease_was_taken_over_produces_no_second_effect() {
    let db = TestDatabase::new().await;
    seed(&db, 1).await;

    // The stalled worker: no heartbeat, a short lease, a handler slower than the lease.
    let mut stalled = worker_settings("stalled");
    stalled.lease = Duration::from_millis(300);
    stalled.heartbeat = false;
    // Busy with its one slow attempt, it cannot claim the event back once it is rescued.
    stalled.concurrency = 1;
    let stalled = RunningWorker::start(
        &db,
        unguarded(Duration::from_millis(2_500), 0.0, "stalled"),
        stalled,
    );
    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "the stalled worker holds the event",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 1 AND locked_by = 'stalled'",
        1,
        Duration::from_secs(10),
    )
    .await;

    // A healthy worker rescues the expired lease and processes the event, slowly enough that
    // the stalled worker tries to complete while the row is held under the healthy lease.
    let healthy = RunningWorker::start(
        &db,
        unguarded(Duration::from_secs(4), 0.0, "healthy"),
        worker_settings("healthy"),
    );
    wait_until(
        "the stalled worker's completion is refused",
        Duration::from_secs(20),
        async || stalled.metrics.lease_lost.get() == 1,
    )
    .await;
    stalled.stop().await;
    healthy.stop().await;

    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2 AND locked_by = 'healthy'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM demo_ledger WHERE event_type = 'healthy'"
        )
        .await,
        1,
        "the effect of the lease holder committed"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger").await,
        1,
        "one effect, although two handlers ran to the end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_with_random_failures_give_each_of_10000_events_exactly_one_effect() {
    let db = TestDatabase::new().await;
    seed(&db, 10_000).await;
    let mut settings = worker_settings("w");
    settings.backoff.max_attempts = 50;
    settings.backoff.base = Duration::from_millis(1);
    settings.backoff.cap = Duration::from_millis(10);
    let workers: Vec<RunningWorker> = (0..4)
        .map(|n| {
            let mut settings = settings.clone();
            settings.name = format!("w{n}");
            RunningWorker::start(&db, unguarded(Duration::ZERO, 0.2, "w"), settings)
        })
        .collect();
    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "all 10,000 events are done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        10_000,
        Duration::from_secs(240),
    )
    .await;
    let retries: u64 = workers
        .iter()
        .map(|w| {
            w.metrics
                .events
                .with_label_values(&["demo", "*", "retry"])
                .get()
        })
        .sum();
    for worker in workers {
        worker.stop().await;
    }
    assert!(
        retries > 1_000,
        "about 20% of attempts fail; saw {retries} retries"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger").await,
        10_000
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(DISTINCT event_id) AS n FROM demo_ledger"
        )
        .await,
        10_000,
        "every event has exactly one effect"
    );
}

struct FailsWhileBroken {
    broken: Arc<AtomicBool>,
}

#[async_trait]
impl Handler for FailsWhileBroken {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        if AtomicBool::load(&self.broken, Ordering::SeqCst) {
            return Err(HandlerError::Permanent("rejected by business rules".into()));
        }
        worker::demo::DemoLedger.handle(event, tx).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_dead_event_is_processed_once_more() {
    let db = TestDatabase::new().await;
    seed(&db, 1).await;
    let broken = Arc::new(AtomicBool::new(true));
    let router = Router::new().route(
        None,
        None,
        Arc::new(FailsWhileBroken {
            broken: Arc::clone(&broken),
        }),
    );
    let worker = RunningWorker::start(&db, router, worker_settings("w1"));
    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "the event is dead",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 3 AND attempt = 1",
        1,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger").await,
        0
    );

    broken.store(false, Ordering::SeqCst);
    let filter = inbox_core::operations::EventFilter {
        status: Some(inbox_core::InboxStatus::Dead),
        ..Default::default()
    };
    let ids = inbox_core::operations::replay_candidates(&mut conn, &filter)
        .await
        .unwrap();
    assert_eq!(
        inbox_core::operations::replay(&mut conn, &ids)
            .await
            .unwrap(),
        1
    );
    wait_for_count(
        &mut conn,
        "the replayed event is done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        1,
        Duration::from_secs(10),
    )
    .await;
    worker.stop().await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger").await,
        1
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE attempt = 1 AND last_error IS NULL"
        )
        .await,
        1,
        "replay reset the attempts; completion cleared the error"
    );
    // Replaying a row that is not dead changes nothing.
    assert_eq!(
        inbox_core::operations::replay(&mut conn, &ids)
            .await
            .unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_no_route_matches_is_completed_as_ignored() {
    let db = TestDatabase::new().await;
    seed(&db, 1).await;
    let router = Router::new().route(Some("github"), None, Arc::new(worker::demo::DemoLedger));
    let worker = RunningWorker::start(&db, router, worker_settings("w1"));
    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "the event is done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        1,
        Duration::from_secs(10),
    )
    .await;
    let ignored = worker
        .stop()
        .await
        .events
        .with_label_values(&["demo", "other", "ignored"])
        .get();
    assert_eq!(ignored, 1);
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_event_wakes_an_idle_worker_without_waiting_for_the_poll() {
    let db = TestDatabase::new().await;
    let mut settings = worker_settings("w1");
    settings.poll_interval = Duration::from_secs(600);
    settings.rescue_interval = Duration::from_secs(600);
    let worker = RunningWorker::start(&db, demo_router(), settings);
    let mut conn = db.connect().await;
    // A first event proves the loop runs; after it the worker idles on a 10-minute poll.
    insert_events(&mut conn, &[event(1, "test.event")])
        .await
        .unwrap();
    inbox_core::inbox::notify_new_events(&mut conn)
        .await
        .unwrap();
    wait_for_count(
        &mut conn,
        "the first event is done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        1,
        Duration::from_secs(30),
    )
    .await;
    // A notification sent before the listener's LISTEN would be lost (and found by the poll).
    wait_for_count(
        &mut conn,
        "the worker listens",
        "SELECT count(*) AS n FROM pg_stat_activity \
         WHERE datname = current_database() AND query LIKE 'LISTEN %'",
        1,
        Duration::from_secs(30),
    )
    .await;
    insert_events(&mut conn, &[event(2, "test.event")])
        .await
        .unwrap();
    // As the receiver does after its commit.
    inbox_core::inbox::notify_new_events(&mut conn)
        .await
        .unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_events_reach_the_same_state_in_either_order_and_each_refund_counts() {
    let db = TestDatabase::new().await;
    let payment = |id: &str, event_type: &str, payment_id: &str, amount: i64| {
        let body = serde_json::json!({"id": id, "type": event_type, "data": {"payment_id": payment_id, "amount": amount}});
        NewEvent {
            provider: "demo".into(),
            event_id: id.into(),
            event_type: Some(event_type.into()),
            headers: serde_json::json!({}),
            body_sha256: [0; 32],
            replays: inbox_core::inbox::ReplayCheck::Off,
            ordering: None,
            body: body.to_string().into_bytes(),
        }
    };
    let mut conn = db.connect().await;
    // In order for pay_a, refund first for pay_b, and two refunds of pay_c; one statement
    // each, so they arrive (and are claimed) in this order.
    for event in [
        payment("e1", "payment.succeeded", "pay_a", 1000),
        payment("e2", "payment.refunded", "pay_b", 1000),
        payment("e3", "payment.succeeded", "pay_c", 1000),
        payment("e4", "payment.refunded", "pay_c", 300),
        payment("e5", "payment.refunded", "pay_c", 300),
    ] {
        insert_events(&mut conn, &[event]).await.unwrap();
    }
    let mut settings = worker_settings("w1");
    settings.concurrency = 1;
    let worker = RunningWorker::start(&db, demo_router(), settings);
    wait_for_count(
        &mut conn,
        "the first events are done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        5,
        Duration::from_secs(20),
    )
    .await;
    insert_events(
        &mut conn,
        &[payment("e6", "payment.refunded", "pay_a", 1000)],
    )
    .await
    .unwrap();
    insert_events(
        &mut conn,
        &[payment("e7", "payment.succeeded", "pay_b", 1000)],
    )
    .await
    .unwrap();
    wait_for_count(
        &mut conn,
        "all events are done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        7,
        Duration::from_secs(20),
    )
    .await;
    worker.stop().await;

    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_payments WHERE payment_id IN ('pay_a', 'pay_b') AND status = 'refunded' AND refunded_amount = 1000 AND refund_count = 1").await,
        2,
        "succeeded-then-refunded and refunded-then-succeeded end alike"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_payments WHERE payment_id = 'pay_c' AND status = 'partially_refunded' AND refunded_amount = 600 AND refund_count = 2").await,
        1,
        "a second refund of one payment is its own event, not a duplicate"
    );
}

/// A batchable handler that writes its line, then fails permanently for every tenth event
/// and panics for every fifteenth.
struct SometimesFailsInBatches;

#[async_trait]
impl Handler for SometimesFailsInBatches {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        diesel::insert_into(demo_ledger::table)
            .values((
                demo_ledger::provider.eq(&event.provider),
                demo_ledger::event_id.eq(&event.event_id),
            ))
            .execute(tx)
            .await?;
        let n: usize = event.event_id.trim_start_matches("evt_").parse().unwrap();
        if n % 10 == 0 {
            return Err(HandlerError::Permanent("every tenth is rejected".into()));
        }
        assert!(n % 15 != 0, "every fifteenth panics");
        Ok(Handled::Applied)
    }

    fn batchable(&self) -> bool {
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_shared_transaction_a_failing_event_undoes_only_its_own_writes() {
    let db = TestDatabase::new().await;
    seed(&db, 300).await;
    let mut settings = worker_settings("w1");
    settings.transaction_size = 50;
    settings.concurrency = 100;
    settings.batch_size = 100;
    settings.backoff.max_attempts = 2;
    let router = Router::new().route(None, None, Arc::new(SometimesFailsInBatches));
    let worker = RunningWorker::start(&db, router, settings);
    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "every event is done or dead",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status IN (2, 3)",
        300,
        Duration::from_secs(30),
    )
    .await;
    let reruns = worker.stop().await.savepoint_reruns.get();

    // evt_0..evt_299: multiples of 10 are rejected, other multiples of 15 panic (twice: dead).
    let failing = (0..300).filter(|n| n % 10 == 0 || n % 15 == 0).count() as i64;
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE status = 3"
        )
        .await,
        failing
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2"
        )
        .await,
        300 - failing
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger").await,
        300 - failing,
        "failed events left no line; the others in their transactions kept theirs"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger l JOIN webhook_inbox i USING (provider, event_id) WHERE i.status <> 2").await,
        0
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE status = 3 AND last_error LIKE '%panicked%'").await,
        (0..300).filter(|n| n % 15 == 0 && n % 10 != 0).count() as i64
    );
    // Every transaction first runs without savepoints; those with a failing event roll back
    // and run again with one savepoint per event.
    assert!(
        reruns > 0,
        "failing events forced savepoint reruns (got {reruns})"
    );
}

/// The demo handler writes a shared transaction's ledger lines with one statement: an event
/// whose effect was recorded before (its `processed_events` row exists) is ignored, the
/// others get one line each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_demo_events_gets_one_line_each_and_skips_effects_already_recorded() {
    let db = TestDatabase::new().await;
    seed(&db, 40).await;
    let mut conn = db.connect().await;
    diesel::sql_query(
        "INSERT INTO processed_events (provider, event_id) \
         SELECT 'demo', 'evt_' || n FROM generate_series(0, 39, 4) AS n",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let router = Router::new().route(None, None, Arc::new(worker::demo::DemoLedger));
    let mut settings = worker_settings("w1");
    settings.transaction_size = 20;
    let worker = RunningWorker::start(&db, router, settings);
    wait_for_count(
        &mut conn,
        "every event is done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        40,
        Duration::from_secs(20),
    )
    .await;
    let ignored = worker
        .stop()
        .await
        .events
        .with_label_values(&["demo", "*", "ignored"])
        .get();
    assert_eq!(ignored, 10);
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger").await,
        30
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger WHERE event_id IN (SELECT 'evt_' || n FROM generate_series(0, 39, 4) AS n)").await,
        0
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM (SELECT event_id FROM demo_ledger GROUP BY event_id HAVING count(*) > 1) AS twice").await,
        0
    );
}

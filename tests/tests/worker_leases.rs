//! One lease keeper per worker: it keeps every lease in flight alive from a task of its own,
//! and stops an attempt whose lease it finds lost; a lost lease in a shared transaction costs
//! the other events neither an attempt nor their effects.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::inbox::{insert_events, NewEvent};
use inbox_tests::*;
use test_db::TestDatabase;
use worker::{Event, Handled, Handler, HandlerError, Router};

fn event(id: &str) -> NewEvent {
    NewEvent {
        provider: "demo".into(),
        event_id: id.into(),
        event_type: Some("test.event".into()),
        headers: serde_json::json!({}),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: None,
        body: format!(r#"{{"id":"{id}"}}"#).into_bytes(),
    }
}

async fn record_effect(event: &Event, tx: &mut AsyncPgConnection) -> Result<(), HandlerError> {
    diesel::sql_query("INSERT INTO effects (event_id) VALUES ($1)")
        .bind::<diesel::sql_types::Text, _>(&event.event_id)
        .execute(tx)
        .await?;
    Ok(())
}

async fn database_with_effects_table() -> TestDatabase {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    diesel::sql_query("CREATE TABLE effects (event_id text NOT NULL)")
        .execute(&mut conn)
        .await
        .unwrap();
    db
}

/// Blocks its thread (CPU-bound work, a synchronous call) for longer than the lease.
struct BlocksItsThread {
    for_how_long: Duration,
}

#[async_trait]
impl Handler for BlocksItsThread {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        std::thread::sleep(self.for_how_long);
        record_effect(event, tx).await?;
        Ok(Handled::Applied)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_handler_blocking_its_thread_past_the_lease_keeps_its_lease_and_its_first_attempt() {
    let db = database_with_effects_table().await;
    let mut conn = db.connect().await;
    insert_events(&mut conn, &[event("evt_blocking")])
        .await
        .unwrap();
    let mut settings = worker_settings("w1");
    // Blocked for two and a half leases: without the keeper the lease expires twice over;
    // the keeper's margin (two thirds of a lease) leaves room for a loaded machine.
    settings.lease = Duration::from_secs(2);
    settings.handler_timeout = Duration::from_secs(30);
    let router = Router::new().route(
        None,
        None,
        Arc::new(BlocksItsThread {
            for_how_long: Duration::from_millis(5_000),
        }),
    );
    let worker = RunningWorker::start(&db, router, settings);
    wait_for_count(
        &mut conn,
        "the event done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        1,
        Duration::from_secs(30),
    )
    .await;
    let metrics = worker.stop().await;
    let rescued = metrics.rescued.with_label_values(&["ready"]).get()
        + metrics.rescued.with_label_values(&["dead"]).get();
    assert_eq!(rescued, 0, "the lease never expired");
    assert_eq!(
        count(&mut conn, "SELECT attempt::bigint AS n FROM webhook_inbox").await,
        1,
        "done on its first attempt"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM effects").await,
        1
    );
}

/// Writes its effect, then waits for ever; records that it was dropped (abandoned).
struct WaitsForEver {
    started: Arc<AtomicBool>,
    abandoned: Arc<AtomicBool>,
    /// Only events whose id is this wait; the others apply at once.
    waiting_event: &'static str,
    batchable: bool,
}

fn is_set(flag: &AtomicBool) -> bool {
    // Spelt out: diesel's `RunQueryDsl::load` would be found first.
    AtomicBool::load(flag, Ordering::SeqCst)
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[async_trait]
impl Handler for WaitsForEver {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        record_effect(event, tx).await?;
        if event.event_id == self.waiting_event {
            let _abandoned = SetOnDrop(Arc::clone(&self.abandoned));
            self.started.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        Ok(Handled::Applied)
    }

    fn batchable(&self) -> bool {
        self.batchable
    }
}

/// Takes the lease of `event_id` away from the worker, as another worker's claim after a
/// rescue would.
async fn steal_the_lease(conn: &mut AsyncPgConnection, event_id: &str) {
    let stolen = diesel::sql_query(
        "UPDATE inbox_queue SET lease_token = gen_random_uuid(), locked_by = 'thief', \
         locked_until = now() + interval '1 hour' \
         WHERE id = (SELECT id FROM inbox_events WHERE event_id = $1) AND status = 1",
    )
    .bind::<diesel::sql_types::Text, _>(event_id)
    .execute(conn)
    .await
    .unwrap();
    assert_eq!(stolen, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_stops_its_attempt_and_rolls_its_transaction_back() {
    let db = database_with_effects_table().await;
    let mut conn = db.connect().await;
    insert_events(&mut conn, &[event("evt_stuck")])
        .await
        .unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let abandoned = Arc::new(AtomicBool::new(false));
    let handler = WaitsForEver {
        started: Arc::clone(&started),
        abandoned: Arc::clone(&abandoned),
        waiting_event: "evt_stuck",
        batchable: false,
    };
    let mut settings = worker_settings("w1");
    settings.lease = Duration::from_secs(3);
    settings.handler_timeout = Duration::from_secs(600);
    let lease = settings.lease;
    let worker = RunningWorker::start(
        &db,
        Router::new().route(None, None, Arc::new(handler)),
        settings,
    );
    wait_until("the handler runs", Duration::from_secs(20), async || {
        is_set(&started)
    })
    .await;
    steal_the_lease(&mut conn, "evt_stuck").await;
    // The keeper looks every third of the lease.
    wait_until("the attempt is abandoned", lease, async || {
        is_set(&abandoned)
    })
    .await;
    wait_until("the loss is counted", Duration::from_secs(5), async || {
        worker.metrics.lease_lost.get() == 1
    })
    .await;
    wait_for_count(
        &mut conn,
        "its transaction rolled back: no effect, no session left in a transaction",
        "SELECT (SELECT count(*) FROM effects) + (SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND state LIKE 'idle in transaction%') AS n",
        0,
        Duration::from_secs(5),
    )
    .await;
    worker.stop().await;
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE locked_by = 'thief' AND status = 1"
        )
        .await,
        1,
        "the row stays with whoever holds it now"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_in_a_shared_transaction_costs_the_other_events_no_attempt_and_no_effect() {
    let db = database_with_effects_table().await;
    let mut conn = db.connect().await;
    insert_events(&mut conn, &[event("evt_a"), event("evt_b"), event("evt_c")])
        .await
        .unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let handler = WaitsForEver {
        started: Arc::clone(&started),
        abandoned: Arc::new(AtomicBool::new(false)),
        waiting_event: "evt_b",
        batchable: true,
    };
    let mut settings = worker_settings("w1");
    settings.lease = Duration::from_secs(3);
    settings.handler_timeout = Duration::from_secs(600);
    // One claim, one shared transaction for the three events.
    settings.claimers = 1;
    let worker = RunningWorker::start(
        &db,
        Router::new().route(None, None, Arc::new(handler)),
        settings,
    );
    wait_until(
        "evt_b's handler runs",
        Duration::from_secs(20),
        async || is_set(&started),
    )
    .await;
    steal_the_lease(&mut conn, "evt_b").await;
    wait_for_count(
        &mut conn,
        "evt_a and evt_c done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE event_id IN ('evt_a', 'evt_c') AND status = 2",
        2,
        Duration::from_secs(20),
    )
    .await;
    let lost = worker.stop().await.lease_lost.get();
    assert_eq!(lost, 1, "only evt_b's lease was lost");
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE event_id IN ('evt_a', 'evt_c') AND attempt = 1").await,
        2,
        "done on their first attempt"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM effects WHERE event_id IN ('evt_a', 'evt_c')"
        )
        .await,
        2,
        "one effect each"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM effects WHERE event_id = 'evt_b'"
        )
        .await,
        0,
        "the abandoned attempt's effect rolled back"
    );
}

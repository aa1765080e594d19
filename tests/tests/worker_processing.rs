//! The worker against a real database: retries, dead letters, and several workers at once.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use diesel_async::AsyncPgConnection;
use inbox_core::inbox::{insert_events, NewEvent};
use inbox_tests::*;
use test_db::TestDatabase;
use worker::{Event, Handled, Handler, HandlerError, Router};

fn event(n: usize) -> NewEvent {
    let body = format!(r#"{{"id":"evt_{n}","type":"test.event"}}"#).into_bytes();
    NewEvent {
        provider: "demo".into(),
        event_id: format!("evt_{n}"),
        event_type: Some("test.event".into()),
        headers: serde_json::json!({}),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: None,
        body,
    }
}

async fn seed(db: &TestDatabase, events: usize) {
    let mut conn = db.connect().await;
    let batch: Vec<NewEvent> = (0..events).map(event).collect();
    for chunk in batch.chunks(500) {
        insert_events(&mut conn, chunk).await.unwrap();
    }
}

struct AlwaysFails;

#[async_trait]
impl Handler for AlwaysFails {
    async fn handle(&self, _: &Event, _: &mut AsyncPgConnection) -> Result<Handled, HandlerError> {
        Err(HandlerError::Retryable("downstream unavailable".into()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_handler_is_retried_then_dead_lettered() {
    let db = TestDatabase::new().await;
    seed(&db, 1).await;
    let router = Router::new().route(None, None, Arc::new(AlwaysFails));
    let worker = RunningWorker::start(&db, router, worker_settings("w1"));
    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "the event is dead",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 3",
        1,
        Duration::from_secs(20),
    )
    .await;
    let metrics = worker.stop().await.render();

    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox \
             WHERE attempt = 3 AND last_error LIKE '%downstream unavailable%' AND processed_at IS NOT NULL"
        )
        .await,
        1,
        "dead after exactly max_attempts (3), with the handler's error kept"
    );
    let text = String::from_utf8(metrics).unwrap();
    assert!(
        text.contains(r#"outcome="retry",provider="demo"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"outcome="dead",provider="demo"} 1"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_draining_2000_events_process_each_exactly_once() {
    let db = TestDatabase::new().await;
    seed(&db, 2_000).await;
    let first = RunningWorker::start(&db, demo_router(), worker_settings("w1"));
    let second = RunningWorker::start(&db, demo_router(), worker_settings("w2"));
    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "all 2,000 events are done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        2_000,
        Duration::from_secs(120),
    )
    .await;
    first.stop().await;
    second.stop().await;

    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger").await,
        2_000
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(DISTINCT (provider, event_id)) AS n FROM demo_ledger"
        )
        .await,
        2_000,
        "no event has two ledger lines"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE attempt <> 1"
        )
        .await,
        0,
        "nothing was claimed twice"
    );
}

struct Accepts;

#[async_trait]
impl Handler for Accepts {
    async fn handle(&self, _: &Event, _: &mut AsyncPgConnection) -> Result<Handled, HandlerError> {
        Ok(Handled::Applied)
    }

    fn batchable(&self) -> bool {
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_sender_chosen_event_types_leave_the_metric_series_bounded() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    // Every event a type of its own, as a hostile sender would choose them; half match a
    // route's pattern, half no route at all.
    let events: Vec<NewEvent> = (0..10_000)
        .map(|n| {
            let mut event = event(n);
            event.event_type = Some(if n % 2 == 0 {
                format!("payment.{n}")
            } else {
                format!("x-{n}\u{1b}[2J")
            });
            event
        })
        .collect();
    for chunk in events.chunks(1_000) {
        insert_events(&mut conn, chunk).await.unwrap();
    }
    let router = Router::new().route(None, Some("payment.*"), Arc::new(Accepts));
    let worker = RunningWorker::start(&db, router, worker_settings("w1"));
    wait_for_count(
        &mut conn,
        "every event done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        10_000,
        Duration::from_secs(120),
    )
    .await;
    // The counters move just after each commit: wait for the last ones.
    wait_until("every event counted", Duration::from_secs(10), async || {
        let page = String::from_utf8(worker.metrics.render()).unwrap();
        page.lines()
            .filter(|line| line.starts_with("inbox_worker_events_total{"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
            == 10_000.0
    })
    .await;
    let page = String::from_utf8(worker.metrics.render()).unwrap();
    worker.stop().await;

    let series: Vec<&str> = page
        .lines()
        .filter(|line| line.starts_with("inbox_worker_events_total{"))
        .collect();
    assert_eq!(
        series,
        [
            r#"inbox_worker_events_total{event_type="other",outcome="ignored",provider="demo"} 5000"#,
            r#"inbox_worker_events_total{event_type="payment.*",outcome="done",provider="demo"} 5000"#,
        ],
        "one series per route pattern and outcome, whatever the event types"
    );
    assert!(!page.contains("x-1"), "no sender-chosen type in any label");
}

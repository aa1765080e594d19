//! The rescue of expired leases: a worker that dies abruptly costs the events it had in flight
//! no attempt; they come back after their attempt's backoff delay, their previous error kept
//! beside the rescue reason; an event that kills its worker every time still ends dead.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::inbox::{self, NewEvent};
use inbox_core::BackoffPolicy;
use inbox_tests::count;
use test_db::TestDatabase;

const LEASE: Duration = Duration::from_secs(30);

fn events(n: usize) -> Vec<NewEvent> {
    (0..n)
        .map(|i| NewEvent {
            provider: "demo".into(),
            event_id: format!("evt_{i}"),
            event_type: None,
            headers: serde_json::json!({}),
            body_sha256: [0; 32],
            replays: inbox_core::inbox::ReplayCheck::Off,
            ordering: None,
            body: b"{}".to_vec(),
        })
        .collect()
}

async fn execute(conn: &mut AsyncPgConnection, sql: &str) {
    diesel::sql_query(sql).execute(conn).await.unwrap();
}

/// The worker holding the rows dies: their leases lapse.
async fn worker_dies(conn: &mut AsyncPgConnection) {
    execute(
        conn,
        "UPDATE inbox_queue SET locked_until = now() - interval '1 second' WHERE status = 1",
    )
    .await;
}

const POLICY: BackoffPolicy = BackoffPolicy {
    base: Duration::from_secs(10),
    cap: Duration::from_secs(3600),
    max_attempts: 2,
};

#[tokio::test]
async fn a_worker_dying_abruptly_costs_its_events_no_attempt_and_they_return_with_backoff_and_history(
) {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &events(50)).await.unwrap();
    // First attempt: each event fails by itself.
    let first = inbox::claim_due(&mut conn, "w1", LEASE, 50).await.unwrap();
    for event in &first.events {
        inbox::schedule_retry(
            &mut conn,
            event.id,
            first.lease_token,
            Duration::ZERO,
            "retryable: downstream said no",
        )
        .await
        .unwrap();
    }
    // Second and last attempt: the worker running them dies.
    let second = inbox::claim_due(&mut conn, "w2", LEASE, 50).await.unwrap();
    assert!(second.events.iter().all(|event| event.attempt == 2));
    worker_dies(&mut conn).await;

    let rescued = inbox::rescue_expired(&mut conn, &POLICY, 100)
        .await
        .unwrap();
    assert_eq!(
        (rescued.requeued, rescued.dead),
        (50, 0),
        "not one innocent event dead-lettered by the crash"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_queue WHERE status = 0 AND attempt = 1 AND rescues = 1 \
              AND last_error = 'lease expired: the worker crashed or stalled (previous error: retryable: downstream said no)'").await,
        50,
        "the attempt given back, the handler's error kept beside the rescue reason"
    );
    // Full jitter over the second attempt's ceiling, 20 s: never beyond it, and not `now()`.
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_queue WHERE next_attempt_at > now() + interval '20 seconds'").await,
        0
    );
    assert!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_queue WHERE next_attempt_at > now() + interval '1 second'").await
            > 25,
        "the rescued events wait their backoff delay"
    );

    // Their own second failure is what takes them to dead.
    execute(&mut conn, "UPDATE inbox_queue SET next_attempt_at = now()").await;
    let third = inbox::claim_due(&mut conn, "w3", LEASE, 50).await.unwrap();
    assert!(third.events.iter().all(|event| event.attempt == 2));
    assert!(POLICY.is_exhausted(2));
}

#[tokio::test]
async fn an_event_that_kills_its_worker_every_time_ends_dead_with_its_history() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &events(1)).await.unwrap();
    let claim = inbox::claim_due(&mut conn, "w1", LEASE, 1).await.unwrap();
    inbox::schedule_retry(
        &mut conn,
        claim.events[0].id,
        claim.lease_token,
        Duration::ZERO,
        "retryable: timeout",
    )
    .await
    .unwrap();
    for crash in 1..=2 {
        execute(&mut conn, "UPDATE inbox_queue SET next_attempt_at = now()").await;
        let claim = inbox::claim_due(&mut conn, "victim", LEASE, 1)
            .await
            .unwrap();
        assert_eq!(claim.events.len(), 1, "crash {crash}");
        worker_dies(&mut conn).await;
        let rescued = inbox::rescue_expired(&mut conn, &POLICY, 100)
            .await
            .unwrap();
        let expected = if crash < 2 { (1, 0) } else { (0, 1) };
        assert_eq!((rescued.requeued, rescued.dead), expected, "crash {crash}");
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE status = 3 \
              AND last_error = 'lease expired: the worker crashed or stalled (previous error: retryable: timeout)'").await,
        1,
        "dead after as many rescues as attempts, the first error still shown"
    );
}

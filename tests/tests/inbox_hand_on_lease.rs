//! The keyed completion hands a key on to its next event under the completing attempt's
//! lease, at the end of a transaction that has run handlers and may have run for longer than
//! a lease. The event handed on must start with a whole lease ahead of it, counted from the
//! completion, not from the transaction's start: else the rescue takes it at once and it runs
//! twice.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel_async::{AsyncConnection, RunQueryDsl};
use inbox_core::inbox::{self, KeyLocks, NewEvent};
use inbox_core::BackoffPolicy;
use inbox_tests::count;
use test_db::TestDatabase;

const POLICY: BackoffPolicy = BackoffPolicy {
    base: Duration::from_secs(10),
    cap: Duration::from_secs(3600),
    max_attempts: 5,
};

fn ordered(event_id: &str, sequence: i64) -> NewEvent {
    NewEvent {
        provider: "demo".into(),
        event_id: event_id.into(),
        event_type: None,
        headers: serde_json::json!({}),
        body_sha256: [0; 32],
        replays: inbox::ReplayCheck::Off,
        ordering: Some(inbox::EventOrdering {
            key: inbox::ordering_key("demo", "order_1"),
            sequence,
            hold: Duration::ZERO,
        }),
        body: b"{}".to_vec(),
    }
}

#[tokio::test]
async fn an_event_handed_on_by_a_transaction_older_than_a_lease_starts_with_a_whole_lease() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &[ordered("evt_1", 1), ordered("evt_2", 2)])
        .await
        .unwrap();
    let lease = Duration::from_millis(400);
    let claim = inbox::claim_due(&mut conn, "w1", lease, 10).await.unwrap();
    assert_eq!(claim.events.len(), 1, "the key's head alone");
    let head = claim.events[0].id;

    let handed_on = conn
        .transaction::<_, inbox::TransitionError, _>(async |tx| {
            // The handlers of a long transaction, longer than a lease.
            diesel::sql_query("SELECT pg_sleep(0.6)")
                .execute(tx)
                .await?;
            inbox::complete_all_keyed(tx, &[head], claim.lease_token, "w1", lease, KeyLocks::Take)
                .await
        })
        .await
        .unwrap();
    assert_eq!(handed_on.len(), 1, "the key's next event handed on");

    let leased_ahead = count(
        &mut conn,
        &format!(
            "SELECT count(*) AS n FROM inbox_queue \
             WHERE id = {} AND status = 1 AND locked_until > now()",
            handed_on[0].id
        ),
    )
    .await;
    assert_eq!(
        leased_ahead, 1,
        "the event handed on is leased beyond the commit"
    );
    let rescued = inbox::rescue_expired(&mut conn, &POLICY, 100)
        .await
        .unwrap();
    assert_eq!(rescued.requeued, 0, "nothing for the rescue to take");
}

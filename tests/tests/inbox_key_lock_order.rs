//! An ordering key's row is locked by whoever changes the key, and every writer locks its keys
//! in key order, so that two never wait for each other: an arrival, a completion, and here the
//! writers that move several heads at once (a rescue of expired leases, a worker giving back
//! heads it never started, an operator's replay). Each met an arrival holding one of its keys
//! and wanting another, and PostgreSQL aborted one of them a second later ("deadlock
//! detected": an ingest batch answered 503, or the rescue or replay failed).
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::inbox::{self, NewEvent};
use inbox_core::{operations, BackoffPolicy};
use inbox_tests::{count, wait_until};
use test_db::TestDatabase;

const LEASE: Duration = Duration::from_secs(30);

const POLICY: BackoffPolicy = BackoffPolicy {
    base: Duration::from_secs(10),
    cap: Duration::from_secs(3600),
    max_attempts: 2,
};

async fn execute(conn: &mut AsyncPgConnection, sql: &str) {
    diesel::sql_query(sql).execute(conn).await.unwrap();
}

fn ordered(event_id: &str, key: &str, sequence: i64) -> NewEvent {
    NewEvent {
        provider: "demo".into(),
        event_id: event_id.into(),
        event_type: None,
        headers: serde_json::json!({}),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: Some(inbox::EventOrdering {
            key: inbox::ordering_key("demo", key),
            sequence,
            hold: Duration::ZERO,
        }),
        body: b"{}".to_vec(),
    }
}

/// Waits until one session of the test's database waits for a lock.
async fn wait_for_a_lock_wait(conn: &mut AsyncPgConnection, what: &str) {
    wait_until(what, Duration::from_secs(10), async || {
        count(
            conn,
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .await
            == 1
    })
    .await;
}

/// Two keys' heads in processing, key b's with the lower id.
async fn heads_of_two_keys(db: &TestDatabase) -> (AsyncPgConnection, inbox::Claim) {
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &[ordered("evt_b1", "b", 1)])
        .await
        .unwrap();
    inbox::insert_events(&mut conn, &[ordered("evt_a1", "a", 1)])
        .await
        .unwrap();
    let claim = inbox::claim_due(&mut conn, "w1", LEASE, 10).await.unwrap();
    assert_eq!(claim.events.len(), 2, "both keys' heads");
    (conn, claim)
}

/// A session that has locked key a (as an arrival of a batch holding both keys would, first),
/// in a transaction left open.
async fn an_arrival_holding_key_a(db: &TestDatabase) -> AsyncPgConnection {
    let mut arrival = db.connect().await;
    execute(&mut arrival, "BEGIN").await;
    inbox::insert_events(&mut arrival, &[ordered("evt_a2", "a", 2)])
        .await
        .unwrap();
    arrival
}

/// The arrival holding key a goes on to key b, as one locking both in key order would, then
/// commits: it must not find key b held by the writer under test.
async fn the_arrival_goes_on_to_key_b(arrival: &mut AsyncPgConnection, writer: &str) {
    let second = inbox::insert_events(arrival, &[ordered("evt_b2", "b", 2)]).await;
    assert!(
        second.is_ok(),
        "an arrival for the keys of {writer} failed: {second:?}"
    );
    execute(arrival, "COMMIT").await;
}

/// A rescue of heads of several keys locked each key as it requeued that key's head, in the
/// order of the heads' ids, while it held the expired rows. It must wait for no key: it rescues
/// the heads whose keys are free, and the others at its next pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescue_waits_for_no_key_an_arrival_holds_and_rescues_its_head_at_the_next_pass() {
    let db = TestDatabase::new().await;
    let (mut conn, _claim) = heads_of_two_keys(&db).await;
    let mut arrival = an_arrival_holding_key_a(&db).await;
    execute(
        &mut conn,
        "UPDATE inbox_queue SET locked_until = now() - interval '1 second' WHERE status = 1",
    )
    .await;

    let mut rescuer = db.connect().await;
    let first = tokio::time::timeout(
        Duration::from_secs(5),
        inbox::rescue_expired(&mut rescuer, &POLICY, 100),
    )
    .await
    .expect("the rescue waited for a key an arrival holds")
    .unwrap();
    assert_eq!(first.requeued, 1, "key b's head, whose key is free");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_queue WHERE status = 1 AND ordering_key = 'demo:a'"
        )
        .await,
        1,
        "key a's head waits for the next pass"
    );
    the_arrival_goes_on_to_key_b(&mut arrival, "a rescue").await;
    let second = inbox::rescue_expired(&mut rescuer, &POLICY, 100)
        .await
        .unwrap();
    assert_eq!(second.requeued, 1, "key a's head, its key free now");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_queue WHERE status = 1"
        )
        .await,
        0
    );
}

/// The rescue requeues only heads whose keys it could lock; a head whose key has no row (nothing
/// deletes one, but nothing in the schema forbids it) has nothing to lock and must not stay
/// expired for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescue_requeues_a_head_whose_key_has_no_row() {
    let db = TestDatabase::new().await;
    let (mut conn, _claim) = heads_of_two_keys(&db).await;
    execute(
        &mut conn,
        "DELETE FROM inbox_keys WHERE ordering_key = 'demo:a'",
    )
    .await;
    execute(
        &mut conn,
        "UPDATE inbox_queue SET locked_until = now() - interval '1 second' WHERE status = 1",
    )
    .await;
    let rescued = inbox::rescue_expired(&mut conn, &POLICY, 100)
        .await
        .unwrap();
    assert_eq!(
        rescued.requeued, 2,
        "both heads, the one without a key row too"
    );
}

/// A worker shutting down gives back the heads it has not started, locking their keys in key
/// order first: given back in the order of their ids, each row locked its key as it returned
/// to ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giving_back_unstarted_heads_locks_their_keys_in_key_order_and_never_deadlocks_with_an_arrival(
) {
    let db = TestDatabase::new().await;
    let (mut conn, claim) = heads_of_two_keys(&db).await;
    let mut arrival = an_arrival_holding_key_a(&db).await;
    let ids: Vec<i64> = claim.events.iter().map(|event| event.id).collect();
    let mut worker = db.connect().await;
    let release = tokio::spawn(async move {
        inbox::release_unstarted(&mut worker, &ids, claim.lease_token).await
    });
    wait_for_a_lock_wait(&mut conn, "the release waits for key a").await;
    the_arrival_goes_on_to_key_b(&mut arrival, "a release").await;
    assert_eq!(release.await.unwrap().unwrap(), 2, "both heads given back");
}

/// An operator's replay of dead heads unblocks their keys and queues the events again, locking
/// the keys in key order first: it unblocked them in the order it read their rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_dead_heads_locks_their_keys_in_key_order_and_never_deadlocks_with_an_arrival()
{
    let db = TestDatabase::new().await;
    let (mut conn, claim) = heads_of_two_keys(&db).await;
    let ids: Vec<i64> = claim.events.iter().map(|event| event.id).collect();
    let mut worker = db.connect().await;
    for &id in &ids {
        inbox::dead_letter(&mut worker, id, claim.lease_token, "gave up")
            .await
            .unwrap();
    }
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_keys WHERE blocked_by IS NOT NULL"
        )
        .await,
        2,
        "each dead head blocks its key"
    );
    let mut arrival = an_arrival_holding_key_a(&db).await;
    let mut operator = db.connect().await;
    let replay = tokio::spawn(async move { operations::replay(&mut operator, &ids).await });
    wait_for_a_lock_wait(&mut conn, "the replay waits for key a").await;
    the_arrival_goes_on_to_key_b(&mut arrival, "a replay").await;
    assert_eq!(replay.await.unwrap().unwrap(), 2, "both heads replayed");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_keys WHERE blocked_by IS NOT NULL"
        )
        .await,
        0,
        "both keys unblocked"
    );
}

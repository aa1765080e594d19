//! Retention of ordering keys: `inbox_keys` keeps a row per key only while the key may still
//! matter. A key is forgotten once it has been idle (no event queued, no block) longer than the
//! retention; every departure that leaves a key idle dates it; and forgetting a key never races
//! an arrival of it into losing the arrival's order.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use chrono::Utc;
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use inbox_core::inbox::{self, EventOrdering, NewEvent};
use inbox_core::ordering::{forget_idle_keys, skip_dead_head};
use inbox_tests::{complete_keyed, count};
use test_db::TestDatabase;

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: chrono::TimeDelta = chrono::TimeDelta::days(7);

/// Event `n` of the `demo` key `key_value`, with sequence `sequence`.
fn keyed_event(key_value: &str, n: u32, sequence: i64) -> NewEvent {
    NewEvent {
        provider: "demo".into(),
        event_id: format!("{key_value}_{n}"),
        event_type: None,
        headers: serde_json::json!({}),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: Some(EventOrdering {
            key: inbox::ordering_key("demo", key_value),
            sequence,
            hold: Duration::ZERO,
        }),
        body: b"{}".to_vec(),
    }
}

/// Receives `event`, claims it and completes it: its key is left idle, its sequence processed.
async fn run_to_done(conn: &mut AsyncPgConnection, event: NewEvent) {
    inbox::insert_events(conn, &[event]).await.unwrap();
    let claim = inbox::claim_due(conn, "w1", LEASE, 10).await.unwrap();
    let [claimed] = claim.events.as_slice() else {
        panic!("one event claimed: {:?}", claim.events);
    };
    complete_keyed(conn, &[claimed.id], claim.lease_token)
        .await
        .unwrap();
}

/// Dates every key's idle time `days` back, as if nothing had happened to them since.
async fn age_keys(conn: &mut AsyncPgConnection, days: i32) {
    conn.batch_execute(&format!(
        "UPDATE inbox_keys SET idle_since = now() - interval '{days} days'"
    ))
    .await
    .unwrap();
}

async fn keys(conn: &mut AsyncPgConnection) -> Vec<String> {
    #[derive(diesel::QueryableByName)]
    struct Key {
        #[diesel(sql_type = diesel::sql_types::Text)]
        ordering_key: String,
    }
    let keys: Vec<Key> = diesel_async::RunQueryDsl::load(
        diesel::sql_query("SELECT ordering_key FROM inbox_keys ORDER BY ordering_key"),
        conn,
    )
    .await
    .unwrap();
    keys.into_iter().map(|key| key.ordering_key).collect()
}

/// How long `key` has been idle, in seconds.
async fn seconds_idle(conn: &mut AsyncPgConnection, key: &str) -> i64 {
    count(
        conn,
        &format!(
            "SELECT extract(epoch FROM now() - idle_since)::bigint AS n FROM inbox_keys \
             WHERE ordering_key = '{key}'"
        ),
    )
    .await
}

#[tokio::test]
async fn retention_forgets_keys_idle_longer_than_it_and_keeps_the_rest() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    // Five keys idle for ten days, walked two at a time.
    for key in ["idle_a", "idle_b", "idle_c", "idle_d", "idle_e"] {
        run_to_done(&mut conn, keyed_event(key, 1, 10)).await;
    }
    // A key whose dead head blocks it.
    inbox::insert_events(&mut conn, &[keyed_event("blocked", 1, 10)])
        .await
        .unwrap();
    let claim = inbox::claim_due(&mut conn, "w1", LEASE, 10).await.unwrap();
    inbox::dead_letter(&mut conn, claim.events[0].id, claim.lease_token, "gave up")
        .await
        .unwrap();
    age_keys(&mut conn, 10).await;
    // A key idle for a day.
    run_to_done(&mut conn, keyed_event("recent", 1, 10)).await;
    age_keys_of(&mut conn, "recent", 1).await;
    // A key with an event waiting in the queue since its last idle time ten days ago.
    inbox::insert_events(&mut conn, &[keyed_event("queued", 1, 10)])
        .await
        .unwrap();
    age_keys_of(&mut conn, "queued", 10).await;

    let cutoff = Utc::now() - RETENTION;
    let forgotten = forget_idle_keys(&mut conn, cutoff, 2).await.unwrap();

    assert_eq!(forgotten, 5, "the five keys idle for ten days");
    assert_eq!(
        keys(&mut conn).await,
        ["demo:blocked", "demo:queued", "demo:recent"]
    );
    assert_eq!(
        forget_idle_keys(&mut conn, cutoff, 2).await.unwrap(),
        0,
        "nothing more to forget"
    );

    // A forgotten key's late arrival runs as the key's first event: its processed sequence went
    // with it. The same arrival to a key still known is stale.
    inbox::insert_events(
        &mut conn,
        &[keyed_event("idle_a", 2, 5), keyed_event("recent", 2, 5)],
    )
    .await
    .unwrap();
    let claim = inbox::claim_due(&mut conn, "w1", LEASE, 10).await.unwrap();
    let mut stale: Vec<(String, bool)> = claim
        .events
        .iter()
        .map(|event| (event.event_id.clone(), event.stale))
        .collect();
    stale.sort();
    assert_eq!(
        stale,
        [
            ("idle_a_2".to_owned(), false),
            ("queued_1".to_owned(), false),
            ("recent_2".to_owned(), true)
        ]
    );
}

async fn age_keys_of(conn: &mut AsyncPgConnection, key_value: &str, days: i32) {
    conn.batch_execute(&format!(
        "UPDATE inbox_keys SET idle_since = now() - interval '{days} days' \
         WHERE ordering_key = 'demo:{key_value}'"
    ))
    .await
    .unwrap();
}

/// Each way a key can fall idle dates it: its last event completed (the keyed completion), its
/// dead head released by its provider's policy (the trigger on a head leaving), its dead head
/// skipped by an operator.
#[tokio::test]
async fn every_way_a_key_falls_idle_dates_it() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    conn.batch_execute(
        "INSERT INTO inbox_ordering_providers (provider, release_dead) VALUES ('released', true)",
    )
    .await
    .unwrap();
    let completed = keyed_event("completed", 1, 1);
    let released = NewEvent {
        provider: "released".into(),
        ordering: Some(EventOrdering {
            key: inbox::ordering_key("released", "dead"),
            sequence: 1,
            hold: Duration::ZERO,
        }),
        ..keyed_event("released_dead", 1, 1)
    };
    let skipped = keyed_event("skipped", 1, 1);
    inbox::insert_events(&mut conn, &[completed, released, skipped])
        .await
        .unwrap();
    age_keys(&mut conn, 10).await;
    let claim = inbox::claim_due(&mut conn, "w1", LEASE, 10).await.unwrap();
    assert_eq!(claim.events.len(), 3, "{:?}", claim.events);
    let id_of = |event_id: &str| {
        claim
            .events
            .iter()
            .find(|event| event.event_id == event_id)
            .unwrap()
            .id
    };

    complete_keyed(&mut conn, &[id_of("completed_1")], claim.lease_token)
        .await
        .unwrap();
    inbox::dead_letter(
        &mut conn,
        id_of("released_dead_1"),
        claim.lease_token,
        "gave up",
    )
    .await
    .unwrap();
    inbox::dead_letter(&mut conn, id_of("skipped_1"), claim.lease_token, "gave up")
        .await
        .unwrap();
    // Blocked for ten days before the skip.
    age_keys_of(&mut conn, "skipped", 10).await;
    skip_dead_head(&mut conn, id_of("skipped_1"), "handled by hand")
        .await
        .unwrap();

    for key in ["demo:completed", "released:dead", "demo:skipped"] {
        let idle = seconds_idle(&mut conn, key).await;
        assert!(idle < 60, "{key} idle for {idle}s");
    }
    let forgotten = forget_idle_keys(&mut conn, Utc::now() - RETENTION, 100)
        .await
        .unwrap();
    assert_eq!(forgotten, 0, "keys idle since now are kept");
}

/// An arrival holding its key (its transaction not yet committed) keeps the key: retention
/// skips it rather than wait, and once the arrival commits, its queued event keeps the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_an_arrival_holds_is_not_forgotten() {
    let db = TestDatabase::new().await;
    let mut receiver = db.connect().await;
    let mut worker = db.connect().await;
    run_to_done(&mut worker, keyed_event("order_1", 1, 10)).await;
    age_keys(&mut worker, 10).await;
    let cutoff = Utc::now() - RETENTION;

    receiver.batch_execute("BEGIN").await.unwrap();
    inbox::insert_events(&mut receiver, &[keyed_event("order_1", 2, 5)])
        .await
        .unwrap();
    let forgotten = tokio::time::timeout(
        Duration::from_secs(10),
        forget_idle_keys(&mut worker, cutoff, 100),
    )
    .await
    .expect("retention waited for the arrival's lock")
    .unwrap();
    assert_eq!(forgotten, 0, "the key the arrival holds");
    receiver.batch_execute("COMMIT").await.unwrap();

    assert_eq!(
        forget_idle_keys(&mut worker, cutoff, 100).await.unwrap(),
        0,
        "the key with an event queued"
    );
    let claim = inbox::claim_due(&mut worker, "w1", LEASE, 10)
        .await
        .unwrap();
    let [late] = claim.events.as_slice() else {
        panic!("the arrival is claimed: {:?}", claim.events);
    };
    assert!(late.stale, "the key still knows what it processed");
}

/// An arrival that finds its key locked by a retention about to forget it waits, and once the
/// key's row is gone, makes it anew and becomes its head: the order of what arrives afterwards
/// starts from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arrival_waiting_for_a_key_being_forgotten_makes_it_anew() {
    let db = TestDatabase::new().await;
    let mut retention = db.connect().await;
    let mut receiver = db.connect().await;
    let mut watcher = db.connect().await;
    run_to_done(&mut retention, keyed_event("order_1", 1, 10)).await;
    // What `forget_idle_keys` holds between its two statements: the key's row locked.
    retention
        .batch_execute(
            "BEGIN; SELECT 1 FROM inbox_keys WHERE ordering_key = 'demo:order_1' FOR UPDATE",
        )
        .await
        .unwrap();
    let receiver_pid = count(&mut receiver, "SELECT pg_backend_pid()::bigint AS n").await;
    let arrival = tokio::spawn(async move {
        inbox::insert_events(&mut receiver, &[keyed_event("order_1", 2, 5)])
            .await
            .unwrap();
        receiver
    });
    inbox_tests::wait_for_count(
        &mut watcher,
        "the arrival to wait for the key's lock",
        &format!(
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE pid = {receiver_pid} AND wait_event_type = 'Lock'"
        ),
        1,
        Duration::from_secs(10),
    )
    .await;
    retention
        .batch_execute("DELETE FROM inbox_keys WHERE ordering_key = 'demo:order_1'; COMMIT")
        .await
        .unwrap();
    let _receiver = arrival.await.unwrap();

    assert_eq!(keys(&mut watcher).await, ["demo:order_1"]);
    let claim = inbox::claim_due(&mut watcher, "w1", LEASE, 10)
        .await
        .unwrap();
    let [head] = claim.events.as_slice() else {
        panic!("the arrival is its key's head: {:?}", claim.events);
    };
    assert_eq!(head.event_id, "order_1_2");
    assert!(!head.stale, "the key was forgotten with what it processed");
}

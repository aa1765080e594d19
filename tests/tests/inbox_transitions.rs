//! Every state transition of an inbox row against a real database: claims never overlap,
//! each transition out of processing is fenced by the lease token, expired leases are
//! rescued (or dead-lettered when out of attempts), and the CHECK constraints hold the
//! invariants SQL can hold.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel_async::RunQueryDsl;
use inbox_core::inbox::{self, NewEvent, TransitionError};
use inbox_core::schema::{
    console_audit, demo_ledger, demo_payments, inbox_dedup, inbox_events, inbox_finished,
    inbox_paused_routes, inbox_queue, processed_events, webhook_inbox,
};
use inbox_core::BackoffPolicy;
use inbox_tests::{complete_keyed, count};
use test_db::TestDatabase;

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

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn concurrent_claims_never_take_the_same_row() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &events(200)).await.unwrap();
    let mut a = db.connect().await;
    let mut b = db.connect().await;
    let (first, second) = tokio::join!(
        inbox::claim_due(&mut a, "a", LEASE, 150),
        inbox::claim_due(&mut b, "b", LEASE, 150)
    );
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.events.len() + second.events.len(), 200);
    let mut ids: Vec<i64> = first
        .events
        .iter()
        .chain(&second.events)
        .map(|e| e.id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 200, "no row in both claims");
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE status = 1 AND attempt = 1 AND locked_until > now()").await,
        200
    );
}

#[tokio::test]
async fn a_stale_lease_token_cannot_complete_retry_or_dead_letter() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &events(1)).await.unwrap();
    let claim = inbox::claim_due(&mut conn, "a", LEASE, 1).await.unwrap();
    let id = claim.events[0].id;
    let stale = uuid::Uuid::new_v4();
    assert!(matches!(
        inbox::complete(&mut conn, id, stale).await,
        Err(TransitionError::LeaseLost)
    ));
    assert!(matches!(
        inbox::schedule_retry(&mut conn, id, stale, Duration::ZERO, "x").await,
        Err(TransitionError::LeaseLost)
    ));
    assert!(matches!(
        inbox::dead_letter(&mut conn, id, stale, "x").await,
        Err(TransitionError::LeaseLost)
    ));
    inbox::complete(&mut conn, id, claim.lease_token)
        .await
        .unwrap();
    // Done is final: the right token no longer moves it either.
    assert!(matches!(
        inbox::complete(&mut conn, id, claim.lease_token).await,
        Err(TransitionError::LeaseLost)
    ));
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2 AND lease_token IS NULL AND processed_at IS NOT NULL").await,
        1
    );
}

#[tokio::test]
async fn expired_leases_are_requeued_with_backoff_or_dead_lettered_when_rescued_too_often() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &events(2)).await.unwrap();
    // evt_1 was rescued twice already: this third rescue of 3 allowed is its last.
    diesel::sql_query("UPDATE inbox_queue SET attempt = 2, rescues = 2 WHERE id = (SELECT id FROM inbox_events WHERE event_id = 'evt_1')")
        .execute(&mut conn)
        .await
        .unwrap();
    let claim = inbox::claim_due(&mut conn, "crashed", Duration::from_millis(1), 10)
        .await
        .unwrap();
    assert_eq!(claim.events.len(), 2);
    // The crashed worker's leases lapse.
    diesel::sql_query("UPDATE inbox_queue SET locked_until = now() - interval '1 second'")
        .execute(&mut conn)
        .await
        .unwrap();
    let policy = BackoffPolicy {
        base: Duration::from_secs(60),
        cap: Duration::from_secs(3600),
        max_attempts: 3,
    };
    let rescued = inbox::rescue_expired(&mut conn, &policy, 100)
        .await
        .unwrap();
    assert_eq!((rescued.requeued, rescued.dead), (1, 1));
    // evt_0's attempt is given back (the crash is counted apart), and it waits a backoff
    // delay of at most the first attempt's ceiling.
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_queue WHERE id = (SELECT id FROM inbox_events WHERE event_id = 'evt_0') AND status = 0 AND attempt = 0 AND rescues = 1 AND next_attempt_at <= now() + interval '60 seconds' AND last_error LIKE 'lease expired%'").await,
        1
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE event_id = 'evt_1' AND status = 3 AND attempt = 3").await,
        1
    );
    // The crashed worker's late completion is refused.
    let late = claim.events.iter().find(|e| e.event_id == "evt_0").unwrap();
    assert!(matches!(
        inbox::complete(&mut conn, late.id, claim.lease_token).await,
        Err(TransitionError::LeaseLost)
    ));
}

#[tokio::test]
async fn leases_in_force_are_not_rescued_and_heartbeats_extend_them() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &events(1)).await.unwrap();
    let claim = inbox::claim_due(&mut conn, "a", Duration::from_millis(300), 1)
        .await
        .unwrap();
    let ids = [claim.events[0].id];
    assert_eq!(
        inbox::extend_lease(&mut conn, &ids, claim.lease_token, LEASE)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE locked_until > now() + interval '29 seconds'").await,
        1,
        "the heartbeat moved the expiry from 300 ms to 30 s ahead"
    );
    assert_eq!(
        inbox::rescue_expired(&mut conn, &BackoffPolicy::default(), 100)
            .await
            .unwrap(),
        inbox::Rescued::default()
    );
    assert_eq!(
        inbox::extend_lease(&mut conn, &ids, uuid::Uuid::new_v4(), LEASE)
            .await
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn released_rows_return_to_ready_without_spending_the_attempt() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &events(3)).await.unwrap();
    let claim = inbox::claim_due(&mut conn, "a", LEASE, 3).await.unwrap();
    let ids: Vec<i64> = claim.events.iter().map(|e| e.id).collect();
    assert_eq!(
        inbox::release_unstarted(&mut conn, &ids, claim.lease_token)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE status = 0 AND attempt = 0 AND lease_token IS NULL").await,
        3
    );
}

#[tokio::test]
async fn retries_wait_for_their_backoff_before_they_can_be_claimed() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &events(1)).await.unwrap();
    let claim = inbox::claim_due(&mut conn, "a", LEASE, 1).await.unwrap();
    inbox::schedule_retry(
        &mut conn,
        claim.events[0].id,
        claim.lease_token,
        Duration::from_secs(3600),
        "later",
    )
    .await
    .unwrap();
    assert!(inbox::claim_due(&mut conn, "a", LEASE, 1)
        .await
        .unwrap()
        .events
        .is_empty());
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE status = 0 AND next_attempt_at > now() + interval '59 minutes' AND last_error = 'later'").await,
        1
    );
}

#[tokio::test]
async fn check_constraints_refuse_impossible_states() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &events(1)).await.unwrap();
    for impossible in [
        "UPDATE inbox_queue SET status = 1", // processing without a lease
        "UPDATE inbox_queue SET status = 7", // unknown state
        "UPDATE inbox_queue SET status = 2", // a finished state in the queue
        "UPDATE inbox_queue SET attempt = -1", // negative attempts
        "UPDATE inbox_queue SET lease_token = gen_random_uuid(), locked_until = now()", // lease while ready
        "INSERT INTO inbox_finished (id, status, attempt, processed_at) SELECT id, 1, 0, now() FROM inbox_events", // an unfinished state among the finished
        "INSERT INTO inbox_finished (id, status, attempt) SELECT id, 2, 0 FROM inbox_events", // done without processed_at
        "UPDATE inbox_dedup SET event_id = ''", // empty dedup key
        "UPDATE inbox_dedup SET body_sha256 = '\\x00'", // not a SHA-256
        "INSERT INTO inbox_dedup (provider, event_id, body_sha256) SELECT provider, event_id, body_sha256 FROM inbox_events", // a second key for an event
        "INSERT INTO inbox_events (id, provider, event_id, body, body_sha256, journal_day) SELECT id, provider, event_id, body, body_sha256, journal_day FROM inbox_events", // a second journal row for an id
        "INSERT INTO inbox_events (id, provider, event_id, body, body_sha256, journal_day) VALUES (99, 'p', 'e', '', '', date '2000-01-01')", // a day without its partition
        "UPDATE webhook_inbox SET status = 2", // the view is read-only
    ] {
        let result = diesel::sql_query(impossible).execute(&mut conn).await;
        assert!(result.is_err(), "accepted: {impossible}");
    }
}

#[tokio::test]
async fn the_diesel_schema_matches_the_migrated_tables() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    inbox::insert_events(&mut conn, &events(1)).await.unwrap();
    // Loading every declared column with its declared type fails on any mismatch.
    webhook_inbox::table
        .load::<(
            i64,
            String,
            String,
            Option<String>,
            chrono::DateTime<chrono::Utc>,
            serde_json::Value,
            Vec<u8>,
            Vec<u8>,
            inbox_core::InboxStatus,
            i32,
            chrono::DateTime<chrono::Utc>,
            Option<uuid::Uuid>,
            Option<String>,
            Option<chrono::DateTime<chrono::Utc>>,
            Option<String>,
            Option<chrono::DateTime<chrono::Utc>>,
        )>(&mut conn)
        .await
        .unwrap();
    inbox_dedup::table
        .load::<(String, String, i64, Vec<u8>, Option<Vec<u8>>)>(&mut conn)
        .await
        .unwrap();
    inbox_events::table
        .load::<(
            i64,
            String,
            String,
            Option<String>,
            chrono::DateTime<chrono::Utc>,
            serde_json::Value,
            Vec<u8>,
            Vec<u8>,
            chrono::NaiveDate,
        )>(&mut conn)
        .await
        .unwrap();
    inbox_queue::table
        .load::<(
            i64,
            inbox_core::InboxStatus,
            i32,
            chrono::DateTime<chrono::Utc>,
            Option<uuid::Uuid>,
            Option<String>,
            Option<chrono::DateTime<chrono::Utc>>,
            Option<String>,
            i32,
            Option<String>,
            Option<i64>,
            bool,
            Option<i64>,
        )>(&mut conn)
        .await
        .unwrap();
    inbox_finished::table
        .load::<(
            i64,
            inbox_core::InboxStatus,
            i32,
            Option<String>,
            Option<String>,
            chrono::DateTime<chrono::Utc>,
        )>(&mut conn)
        .await
        .unwrap();
    processed_events::table
        .load::<(String, String, chrono::DateTime<chrono::Utc>)>(&mut conn)
        .await
        .unwrap();
    demo_ledger::table
        .load::<(
            i64,
            String,
            String,
            Option<String>,
            chrono::DateTime<chrono::Utc>,
            Option<String>,
            Option<i64>,
            Option<bool>,
            Option<chrono::DateTime<chrono::Utc>>,
            Option<i64>,
            Option<chrono::DateTime<chrono::Utc>>,
        )>(&mut conn)
        .await
        .unwrap();
    demo_payments::table
        .load::<(
            String,
            Option<i64>,
            Option<chrono::DateTime<chrono::Utc>>,
            i64,
            i32,
            chrono::DateTime<chrono::Utc>,
            String,
        )>(&mut conn)
        .await
        .unwrap();
    console_audit::table
        .load::<(
            i64,
            chrono::DateTime<chrono::Utc>,
            String,
            String,
            serde_json::Value,
            Option<i64>,
            i64,
            String,
        )>(&mut conn)
        .await
        .unwrap();
    inbox_paused_routes::table
        .load::<(String, String, String, chrono::DateTime<chrono::Utc>)>(&mut conn)
        .await
        .unwrap();
    inbox_core::schema::inbox_keys::table
        .load::<(
            String,
            Option<i64>,
            Option<chrono::DateTime<chrono::Utc>>,
            Option<i64>,
            chrono::DateTime<chrono::Utc>,
        )>(&mut conn)
        .await
        .unwrap();
    inbox_core::schema::inbox_ordering_providers::table
        .load::<(String, bool, bool, chrono::DateTime<chrono::Utc>)>(&mut conn)
        .await
        .unwrap();
    inbox_core::schema::inbox_dead_ordering::table
        .load::<(i64, String, i64)>(&mut conn)
        .await
        .unwrap();
    inbox_core::schema::inbox_key_skips::table
        .load::<(i64, String, i64, String, chrono::DateTime<chrono::Utc>)>(&mut conn)
        .await
        .unwrap();
    inbox_core::schema::inbox_rejections::table
        .load::<(
            i64,
            chrono::DateTime<chrono::Utc>,
            String,
            String,
            i16,
            String,
            serde_json::Value,
            i64,
            Option<Vec<u8>>,
        )>(&mut conn)
        .await
        .unwrap();
    inbox_core::schema::inbox_suppressed_replays::table
        .load::<(
            i64,
            String,
            String,
            Option<String>,
            chrono::DateTime<chrono::Utc>,
            serde_json::Value,
            Vec<u8>,
            Vec<u8>,
            Option<String>,
            Option<i64>,
            i64,
        )>(&mut conn)
        .await
        .unwrap();
    // And no migrated column is missing from the diesel schema.
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM information_schema.columns WHERE table_schema = 'public' AND table_name IN ('inbox_dedup', 'inbox_events', 'inbox_queue', 'inbox_finished', 'webhook_inbox', 'processed_events', 'demo_ledger', 'demo_payments', 'console_audit', 'inbox_paused_routes', 'inbox_keys', 'inbox_ordering_providers', 'inbox_dead_ordering', 'inbox_key_skips', 'inbox_rejections', 'inbox_suppressed_replays')").await,
        5 + 9 + 13 + 6 + 16 + 3 + 11 + 7 + 8 + 4 + 5 + 4 + 3 + 5 + 9 + 11
    );
    // Nor any table (the journal's partitions are the journal).
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM information_schema.tables WHERE table_schema = 'public' AND table_name NOT LIKE '\\_\\_diesel%' AND table_name NOT IN (SELECT relname FROM pg_class WHERE relispartition)").await,
        16
    );
}

#[derive(diesel::QueryableByName)]
struct Sum {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

#[tokio::test]
async fn hand_written_hot_statements_are_prepared_once_per_connection() {
    use inbox_core::prepared::{bind, cached_sql};
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    for (a, b) in [(1_i64, 2_i64), (40, 2)] {
        let rows: Vec<Sum> = cached_sql(
            "SELECT $1::int8 + $2::int8 AS n /* cached-sql-probe */",
            (
                bind::<diesel::sql_types::BigInt, _>(a),
                bind::<diesel::sql_types::BigInt, _>(b),
            ),
        )
        .load(&mut conn)
        .await
        .unwrap();
        assert_eq!(rows.iter().map(|r| r.n).collect::<Vec<_>>(), [a + b]);
    }
    inbox::insert_events(&mut conn, &events(5)).await.unwrap();
    inbox::insert_events(&mut conn, &events(6)).await.unwrap();
    let claim = inbox::claim_due(&mut conn, "a", LEASE, 5).await.unwrap();
    let ids: Vec<i64> = claim.events.iter().map(|e| e.id).collect();
    inbox::complete_all(&mut conn, &ids[..2], claim.lease_token)
        .await
        .unwrap();
    inbox::complete_all(&mut conn, &ids[2..], claim.lease_token)
        .await
        .unwrap();
    // An ordinary `sql_query` is prepared and dropped at every execution.
    for _ in 0..2 {
        diesel::sql_query("SELECT 1 AS uncached_probe")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM pg_prepared_statements WHERE statement LIKE '%cached-sql-' || 'probe%'").await,
        1,
        "one server-side statement for both executions"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM pg_prepared_statements WHERE statement LIKE 'WITH completed AS ( DELETE FROM inbox_queue %'").await,
        1,
        "the completion is prepared too"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM pg_prepared_statements WHERE statement LIKE 'WITH input AS ( SELECT * FROM unnest(%), keyed AS ( INSERT INTO inbox_dedup %'").await,
        1,
        "so is the ingest insert, whatever the batch size"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM pg_prepared_statements WHERE statement LIKE '%uncached_' || 'probe%'").await,
        0
    );
}

#[derive(diesel::QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
    line: String,
}

#[derive(diesel::QueryableByName)]
struct StatementName {
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
}

/// The claim is prepared, so PostgreSQL may switch it to a generic plan, blind to its `LIMIT`.
/// That plan must still read the claimed rows by primary key, never the whole table.
#[tokio::test]
async fn the_claims_generic_plan_reads_rows_by_primary_key() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    diesel::sql_query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut conn)
        .await
        .unwrap();
    inbox::insert_events(&mut conn, &events(5_000))
        .await
        .unwrap();
    // As autovacuum would: the queue and today's journal partition analyzed, the days ahead
    // not (autovacuum analyzes a table only once rows change in it).
    diesel::sql_query(format!(
        "ANALYZE inbox_queue, inbox_events_{}",
        chrono::Utc::now().format("%Y%m%d")
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    inbox::claim_due(&mut conn, "a", LEASE, 10).await.unwrap();
    let names: Vec<StatementName> = diesel::sql_query(
        "SELECT name FROM pg_prepared_statements \
         WHERE statement LIKE 'WITH unflushed AS MATERIALIZED %' \
           AND statement LIKE '%due AS MATERIALIZED ( SELECT ARRAY( SELECT id FROM inbox_queue %'",
    )
    .load(&mut conn)
    .await
    .unwrap();
    assert_eq!(names.len(), 1, "the claim is a prepared statement");
    let plan: Vec<PlanLine> = diesel::sql_query(format!(
        "EXPLAIN EXECUTE {}(10, '00000000-0000-0000-0000-000000000000', 'probe', 1000)",
        names[0].name
    ))
    .load(&mut conn)
    .await
    .unwrap();
    let plan: Vec<&str> = plan.iter().map(|line| line.line.as_str()).collect();
    // The queue rows by primary key (an index or bitmap index scan), their bodies likewise
    // in each of the journal's partitions.
    for index in [" inbox_queue_pkey", "_pkey on inbox_events_"] {
        assert!(
            plan.iter()
                .any(|line| line.contains("Index Scan") && line.contains(index)),
            "{plan:#?}"
        );
    }
    // Only the small per-provider tables may be read whole, and the paused-route check, which
    // runs only while a route is paused.
    let may_be_read_whole = ["paused", "on inbox_ordering_providers"];
    assert!(
        !plan.iter().any(|line| line.contains("Seq Scan")
            && !may_be_read_whole.iter().any(|table| line.contains(table))),
        "{plan:#?}"
    );
}

/// The queue's own autovacuum settings: it gathers two dead row versions per event.
#[tokio::test]
async fn the_queue_is_vacuumed_after_one_percent_of_dead_rows() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM pg_class WHERE relname = 'inbox_queue' \
             AND reloptions @> ARRAY['autovacuum_vacuum_scale_factor=0.01', 'autovacuum_vacuum_cost_delay=0']"
        )
        .await,
        1
    );
}

/// The completion of an ordered event settles its key itself, and the trigger that settles keys
/// on any other departure of a head skips it (migrations 19 and 21). The key must still keep
/// its processed sequence when the next event the statement meant to hand the key on to leaves
/// the queue under it: here, deleted by another transaction that commits while the completion
/// waits for that row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_completion_keeps_its_keys_sequence_when_the_next_event_leaves_under_it() {
    let db = TestDatabase::new().await;
    let mut worker = db.connect().await;
    let mut other = db.connect().await;
    let key = inbox::ordering_key("demo", "order_1");
    inbox::insert_events(&mut worker, &ordered_events(&key, 2))
        .await
        .unwrap();
    let claim = inbox::claim_due(&mut worker, "w1", LEASE, 10)
        .await
        .unwrap();
    let [head] = claim.events.as_slice() else {
        panic!(
            "one event of the key is claimed at a time: {:?}",
            claim.events
        );
    };
    let next = count(
        &mut other,
        &format!("SELECT id AS n FROM inbox_queue WHERE id <> {}", head.id),
    )
    .await;

    // Another transaction takes the next event out of the queue and holds it.
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut other,
        &format!("BEGIN; DELETE FROM inbox_queue WHERE id = {next}"),
    )
    .await
    .unwrap();
    let worker_pid: i64 = count(&mut worker, "SELECT pg_backend_pid()::bigint AS n").await;
    let head_id = head.id;
    let completion = tokio::spawn(async move {
        diesel_async::SimpleAsyncConnection::batch_execute(&mut worker, "BEGIN")
            .await
            .unwrap();
        let handed = complete_keyed(&mut worker, &[head_id], claim.lease_token)
            .await
            .unwrap();
        diesel_async::SimpleAsyncConnection::batch_execute(&mut worker, "COMMIT")
            .await
            .unwrap();
        handed
    });
    // The completion read the next event as ready and now waits for its row.
    let waiting = format!(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = {worker_pid} AND wait_event_type = 'Lock'"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while count(&mut other, &waiting).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the completion never waited for the next event"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    diesel_async::SimpleAsyncConnection::batch_execute(&mut other, "COMMIT")
        .await
        .unwrap();

    let handed = completion.await.unwrap();
    assert!(handed.is_empty(), "nothing is left to hand on: {handed:?}");
    assert_eq!(
        count(
            &mut other,
            &format!("SELECT processed_sequence AS n FROM inbox_keys WHERE ordering_key = '{key}'")
        )
        .await,
        1,
        "the key keeps the sequence of its event done"
    );
    assert_eq!(
        count(&mut other, "SELECT count(*) AS n FROM inbox_queue").await,
        0
    );
}

/// A keyed completion runs without a transaction around it when the worker has no more to do in
/// one: losing the lease of any of its events must then change nothing, neither completing the
/// others nor handing their keys on to events the worker would not know it holds.
#[tokio::test]
async fn a_keyed_completion_with_a_lease_lost_changes_nothing() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let (kept, lost) = (
        inbox::ordering_key("demo", "order_1"),
        inbox::ordering_key("demo", "order_2"),
    );
    let mut arrivals = ordered_events(&kept, 2);
    arrivals.extend(ordered_events(&lost, 2).into_iter().map(|event| NewEvent {
        event_id: format!("{}_lost", event.event_id),
        ..event
    }));
    inbox::insert_events(&mut conn, &arrivals).await.unwrap();
    let claim = inbox::claim_due(&mut conn, "w1", LEASE, 10).await.unwrap();
    let heads: Vec<i64> = claim.events.iter().map(|e| e.id).collect();
    assert_eq!(heads.len(), 2, "one head of each key: {:?}", claim.events);
    // The head of the second key is rescued and claimed again, by another worker.
    diesel::sql_query(format!(
        "UPDATE inbox_queue SET lease_token = gen_random_uuid(), locked_by = 'w2' \
         WHERE ordering_key = '{lost}' AND head"
    ))
    .execute(&mut conn)
    .await
    .unwrap();

    let completion = complete_keyed(&mut conn, &heads, claim.lease_token).await;
    assert!(
        matches!(completion, Err(TransitionError::LeaseLost)),
        "{completion:?}"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_finished").await,
        0,
        "the event still held is not completed either"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_queue WHERE head AND status = 1"
        )
        .await,
        2,
        "both heads are still in processing"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_queue WHERE NOT head AND status = 0 AND attempt = 0"
        )
        .await,
        2,
        "no key was handed on"
    );
    // With its lease, the completion goes through.
    let kept_head = claim
        .events
        .iter()
        .find(|event| event.ordering_key.as_deref() == Some(kept.as_str()))
        .unwrap();
    let handed = complete_keyed(&mut conn, &[kept_head.id], claim.lease_token)
        .await
        .unwrap();
    assert_eq!(handed.len(), 1, "the kept key's next event is handed on");
}

/// A key's next event on a paused route is not handed on: it becomes the key's head, ready,
/// and waits for the route to be resumed and a claim. Another provider's pause changes nothing.
#[tokio::test]
async fn a_keyed_completion_hands_no_event_of_a_paused_route_on() {
    use inbox::pause::{pause_route, resume_route, EVERY_EVENT_TYPE};
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let key = inbox::ordering_key("demo", "order_1");
    inbox::insert_events(&mut conn, &ordered_events(&key, 3))
        .await
        .unwrap();
    let claim = inbox::claim_due(&mut conn, "w1", LEASE, 10).await.unwrap();
    let [head] = claim.events.as_slice() else {
        panic!("one event of the key is claimed: {:?}", claim.events);
    };
    let complete = async |conn: &mut diesel_async::AsyncPgConnection, id: i64| {
        complete_keyed(conn, &[id], claim.lease_token)
            .await
            .unwrap()
    };

    assert!(pause_route(&mut conn, "other", EVERY_EVENT_TYPE, "olivia")
        .await
        .unwrap());
    let handed = complete(&mut conn, head.id).await;
    let [second] = handed.as_slice() else {
        panic!("the next event is handed on: {handed:?}");
    };
    assert!(pause_route(&mut conn, "demo", EVERY_EVENT_TYPE, "olivia")
        .await
        .unwrap());
    let handed = complete(&mut conn, second.id).await;
    assert!(handed.is_empty(), "a paused event is handed on: {handed:?}");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_queue WHERE head AND status = 0 AND attempt = 0"
        )
        .await,
        1,
        "the third event is the key's head, ready and unclaimed"
    );
    assert!(resume_route(&mut conn, "demo", EVERY_EVENT_TYPE)
        .await
        .unwrap());
    let claim = inbox::claim_due(&mut conn, "w1", LEASE, 10).await.unwrap();
    assert_eq!(claim.events.len(), 1, "resumed, the head is claimed");
}

/// The events of `key`, in order: sequences 1, 2, ...
fn ordered_events(key: &str, n: usize) -> Vec<NewEvent> {
    events(n)
        .into_iter()
        .zip(1..)
        .map(|(event, sequence)| NewEvent {
            ordering: Some(inbox::EventOrdering {
                key: key.to_owned(),
                sequence,
                hold: Duration::ZERO,
            }),
            ..event
        })
        .collect()
}

/// An arrival behind a key's ready head changes nothing a claim reads: it locks the key's row,
/// so no other writer changes the key's events until the arrival commits, but does not write a
/// new version of it, and the head stays claimable meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arrival_behind_a_ready_head_locks_its_key_without_writing_it() {
    let db = TestDatabase::new().await;
    let mut worker = db.connect().await;
    let mut receiver = db.connect().await;
    let key = inbox::ordering_key("demo", "order_1");
    let [first, second]: [NewEvent; 2] = ordered_events(&key, 2).try_into().unwrap();
    inbox::insert_events(&mut receiver, &[first]).await.unwrap();
    let version = "SELECT xmin::text::bigint AS n FROM inbox_keys";
    let written_by = count(&mut receiver, version).await;

    diesel_async::SimpleAsyncConnection::batch_execute(&mut receiver, "BEGIN")
        .await
        .unwrap();
    inbox::insert_events(&mut receiver, &[second])
        .await
        .unwrap();
    let locked = format!(
        "SELECT count(*) AS n FROM (SELECT 1 FROM inbox_keys WHERE ordering_key = '{key}' \
         FOR UPDATE SKIP LOCKED) AS free"
    );
    assert_eq!(
        count(&mut worker, &locked).await,
        0,
        "the arrival holds its key's row"
    );
    let claim = inbox::claim_due(&mut worker, "w1", LEASE, 10)
        .await
        .unwrap();
    assert_eq!(
        claim
            .events
            .iter()
            .map(|e| e.event_id.as_str())
            .collect::<Vec<_>>(),
        ["evt_0"],
        "the key's head is claimed while the arrival is in flight"
    );
    diesel_async::SimpleAsyncConnection::batch_execute(&mut receiver, "COMMIT")
        .await
        .unwrap();

    assert_eq!(
        count(&mut receiver, version).await,
        written_by,
        "the arrival wrote the key's row"
    );
    assert_eq!(
        count(
            &mut worker,
            "SELECT count(*) AS n FROM inbox_queue WHERE head"
        )
        .await,
        1,
        "the arrival waits behind the head"
    );
}

/// An event arriving lower in sequence than its key's ready head takes its place (the reorder
/// window's purpose), unless a claim is taking the head at that moment; one that arrives while
/// the head is in processing waits behind it and runs next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_arrival_takes_the_place_of_a_ready_head_but_not_of_one_in_processing() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let key = inbox::ordering_key("demo", "order_1");
    let [first, second, third]: [NewEvent; 3] = ordered_events(&key, 3).try_into().unwrap();
    let head = "SELECT coalesce(max(ordering_sequence), -1) AS n FROM inbox_queue WHERE head";

    inbox::insert_events(&mut conn, &[third]).await.unwrap();
    assert_eq!(
        count(&mut conn, head).await,
        3,
        "the first arrival is the head"
    );
    inbox::insert_events(&mut conn, &[second]).await.unwrap();
    assert_eq!(
        count(&mut conn, head).await,
        2,
        "a lower arrival takes a ready head's place"
    );

    let claim = inbox::claim_due(&mut conn, "w1", LEASE, 10).await.unwrap();
    let [taken] = claim.events.as_slice() else {
        panic!("one event of the key at a time: {:?}", claim.events);
    };
    assert_eq!(taken.ordering_sequence, Some(2));
    inbox::insert_events(&mut conn, &[first]).await.unwrap();
    assert_eq!(
        count(&mut conn, head).await,
        2,
        "the head in processing keeps its key"
    );

    diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, "BEGIN")
        .await
        .unwrap();
    let handed = complete_keyed(&mut conn, &[taken.id], claim.lease_token)
        .await
        .unwrap();
    diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, "COMMIT")
        .await
        .unwrap();
    let [next] = handed.as_slice() else {
        panic!("the key is handed on to its lowest waiting event: {handed:?}");
    };
    assert_eq!(
        (next.ordering_sequence, next.stale),
        (Some(1), true),
        "the late event runs next, marked stale"
    );
}

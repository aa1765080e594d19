//! The plans of the statements on the hot paths (the claim, the transitions of a lease, the
//! ordered arrivals and completions, the receiver's duplicate lookup), made under statistics
//! that misstate the tables as PostgreSQL may keep them for a session's life: each must read
//! the rows it names by key, however many others the tables hold.
//!
//! The claim is a prepared statement: after a few executions PostgreSQL may keep one generic
//! plan for the connection's life, chosen with the statistics of that moment. A day's journal
//! partition starts with none (it is analyzed a minute or more into the day), and without
//! them the planner cannot tell that a claimed event joins one journal row: it hashed the whole
//! partition on every claim, which reads every body of the day. Under a steady 3,000/s the
//! drain fell to 300 events/s within a minute, until an autoanalyze replanned it. The claim
//! must read the journal rows of the events it claims by key, whatever the statistics say.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel::sql_types::BigInt;
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use inbox_core::inbox::{
    claim_due, complete_all, dead_letter, extend_leases, insert_events, ordering_key,
    prepare_claim_session, schedule_retry, Claim, EventOrdering, InsertOutcome, NewEvent,
};
use inbox_tests::{complete_keyed, count};
use test_db::TestDatabase;

fn event(n: usize) -> NewEvent {
    let body = format!(r#"{{"id":"evt_{n}","padding":"{}"}}"#, "x".repeat(900)).into_bytes();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_reads_the_journal_by_key_even_under_a_generic_plan_made_before_any_statistics() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let events: Vec<NewEvent> = (0..2_000).map(event).collect();
    for chunk in events.chunks(500) {
        insert_events(&mut conn, chunk).await.unwrap();
    }
    plan_generically(&mut conn).await;
    for _ in 0..3 {
        conn.batch_execute("BEGIN").await.unwrap();
        let claim = claim_due(&mut conn, "w1", Duration::from_secs(30), 100)
            .await
            .unwrap();
        assert_eq!(claim.events.len(), 100);
        // Rows this transaction read by scanning tables (not yet flushed to the statistics).
        let scans = journal_scanned(&mut conn).await;
        conn.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(
            scans, 0,
            "a claim scanned the journal instead of reading its rows by key"
        );
    }
}

/// Has `conn` plan every statement generically from its first execution on: the plan
/// PostgreSQL may settle on after five, and keep for the session's life.
async fn plan_generically(conn: &mut AsyncPgConnection) {
    conn.batch_execute("SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();
}

/// Rows of the tables named like `tables` (a `LIKE` pattern) this session read, by the counter
/// `counter` of `pg_stat_xact_user_tables` (`seq_tup_read`: by scanning the table;
/// `idx_tup_fetch`: through an index, a bitmap scan's too). The counts are not yet reported to
/// the statistics, so earlier transactions' are in them too: take the difference around a
/// statement.
async fn rows_read(conn: &mut AsyncPgConnection, counter: &str, tables: &str) -> i64 {
    count(
        conn,
        &format!(
            "SELECT coalesce(sum({counter}), 0)::bigint AS n FROM pg_stat_xact_user_tables \
             WHERE relname LIKE '{tables}'"
        ),
    )
    .await
}

/// Rows of the journal's partitions this session read by scanning them.
async fn journal_scanned(conn: &mut AsyncPgConnection) -> i64 {
    rows_read(conn, "seq_tup_read", "inbox\\_events%").await
}

/// What `step` returns, run in a transaction of its own on a session set up as the caller
/// chose, and how many rows of `table` it read by `counter` (see [`rows_read`]).
async fn reading<T>(
    conn: &mut AsyncPgConnection,
    counter: &str,
    table: &str,
    step: impl AsyncFnOnce(&mut AsyncPgConnection) -> T,
) -> (T, i64) {
    conn.batch_execute("BEGIN").await.unwrap();
    let before = rows_read(conn, counter, table).await;
    let result = step(conn).await;
    let read = rows_read(conn, counter, table).await - before;
    conn.batch_execute("COMMIT").await.unwrap();
    (result, read)
}

/// A claim of up to `limit` events in a transaction of its own: how many it claimed, and how
/// many rows of `table` it read by `counter`.
async fn claim_reading(
    conn: &mut AsyncPgConnection,
    limit: i64,
    counter: &str,
    table: &str,
) -> (usize, i64) {
    let (claim, read) = reading(
        conn,
        counter,
        table,
        async |conn: &mut AsyncPgConnection| {
            claim_due(conn, "w1", Duration::from_secs(30), limit)
                .await
                .unwrap()
        },
    )
    .await;
    (claim.events.len(), read)
}

/// A day's partition analyzed while empty (the partitions are made days ahead, and a nightly
/// `VACUUM ANALYZE` or `vacuumdb` reaches them) is known to hold no rows, so a plan made then
/// reads it by a sequential scan as the cheapest way. A claim session keeps that plan as the
/// day fills: every claimed event scanned the whole day's journal, and at 1,000 events/s the
/// time from answer to handling grew past a second within twenty seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_session_reads_the_journal_by_key_under_a_plan_made_while_it_was_empty() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    conn.batch_execute("VACUUM ANALYZE inbox_events")
        .await
        .unwrap();
    prepare_claim_session(&mut conn).await.unwrap();
    let claim = claim_due(&mut conn, "w1", Duration::from_secs(30), 100)
        .await
        .unwrap();
    assert!(claim.events.is_empty(), "nothing to claim yet");
    let events: Vec<NewEvent> = (0..2_000).map(event).collect();
    for chunk in events.chunks(500) {
        insert_events(&mut conn, chunk).await.unwrap();
    }
    for _ in 0..3 {
        let before = journal_scanned(&mut conn).await;
        let claim = claim_due(&mut conn, "w1", Duration::from_secs(30), 100)
            .await
            .unwrap();
        let scanned = journal_scanned(&mut conn).await - before;
        assert_eq!(claim.events.len(), 100);
        assert_eq!(
            scanned, 0,
            "a claim scanned the journal instead of reading its rows by key"
        );
    }
}

fn ordered(n: usize) -> NewEvent {
    NewEvent {
        ordering: Some(EventOrdering {
            key: ordering_key("demo", &format!("key_{n}")),
            sequence: 1,
            hold: Duration::ZERO,
        }),
        ..event(n)
    }
}

/// The trigger that settles a key when its head leaves the queue (here: dead) reads the event's
/// finished row: it must read it by key even under a plan its session made while
/// `inbox_finished` was empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_release_reads_the_finished_row_by_key_under_a_plan_made_on_an_empty_table() {
    const EVENTS: usize = 10;
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let events: Vec<NewEvent> = (0..EVENTS).map(ordered).collect();
    insert_events(&mut conn, &events).await.unwrap();
    // Every statement of the trigger planned once, generic, at its first run, on an empty table.
    plan_generically(&mut conn).await;
    let dead_letter_one = async |conn: &mut diesel_async::AsyncPgConnection| {
        let claim = claim_due(conn, "w1", Duration::from_secs(30), 1)
            .await
            .unwrap();
        let [event] = claim.events.as_slice() else {
            panic!("claimed {} events", claim.events.len());
        };
        dead_letter(conn, event.id, claim.lease_token, "gave up")
            .await
            .unwrap();
    };
    dead_letter_one(&mut conn).await;
    // The table grows meanwhile (other workers' completions).
    conn.batch_execute(
        "INSERT INTO inbox_finished (id, status, attempt, processed_at) \
         SELECT id, 2, 1, now() FROM generate_series(1000000, 1005000) AS id",
    )
    .await
    .unwrap();
    for _ in 1..EVENTS {
        conn.batch_execute("BEGIN").await.unwrap();
        dead_letter_one(&mut conn).await;
        let scans = count(
            &mut conn,
            "SELECT coalesce(sum(seq_tup_read), 0)::bigint AS n FROM pg_stat_xact_user_tables \
             WHERE relname IN ('inbox_finished', 'inbox_keys')",
        )
        .await;
        conn.batch_execute("COMMIT").await.unwrap();
        assert_eq!(
            scans, 0,
            "settling a key scanned a table instead of reading its row by key"
        );
    }
}

/// Claims of `HELD` events in all, while the queue's statistics, taken before the workers
/// started on its backlog, show nothing in processing.
async fn claims_beside_others_in_processing(conn: &mut AsyncPgConnection) -> Vec<Claim> {
    const HELD: usize = 1_300;
    let events: Vec<NewEvent> = (0..2_000).map(event).collect();
    for chunk in events.chunks(500) {
        insert_events(conn, chunk).await.unwrap();
    }
    conn.batch_execute("ANALYZE inbox_queue").await.unwrap();
    let mut claims = Vec::new();
    for _ in 0..HELD / 100 {
        let claim = claim_due(conn, "w1", Duration::from_secs(30), 100)
            .await
            .unwrap();
        assert_eq!(claim.events.len(), 100);
        claims.push(claim);
    }
    claims
}

fn ids(claim: &Claim) -> Vec<i64> {
    claim.events.iter().map(|event| event.id).collect()
}

/// A batch's completion reads its own rows by primary key even when the queue was analyzed
/// with nothing in processing (a backlog waiting for its workers), while other claims hold
/// many rows: read through the partial index of processing rows, it would visit them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_completion_reads_only_its_rows_whatever_else_is_in_processing() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let claims = claims_beside_others_in_processing(&mut conn).await;
    for claim in &claims[..3] {
        let ids = ids(claim);
        let ((), read) = reading(
            &mut conn,
            "idx_tup_fetch",
            "inbox_queue",
            async |conn: &mut AsyncPgConnection| {
                complete_all(conn, &ids, claim.lease_token).await.unwrap();
            },
        )
        .await;
        assert_eq!(
            read,
            ids.len() as i64,
            "completing {} rows read {read} queue rows",
            ids.len()
        );
    }
}

/// A retry and a dead letter name one row, and read that one alone under the same statistics:
/// written as `status = processing`, they read every row in processing through its partial
/// index, each failure as costly as the work in flight (a partner's outage fails every event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_and_a_dead_letter_read_only_their_row_whatever_else_is_in_processing() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let claims = claims_beside_others_in_processing(&mut conn).await;
    let claim = &claims[0];
    for event in &claim.events[..3] {
        let ((), read) = reading(
            &mut conn,
            "idx_tup_fetch + seq_tup_read",
            "inbox_queue",
            async |conn: &mut AsyncPgConnection| {
                schedule_retry(
                    conn,
                    event.id,
                    claim.lease_token,
                    Duration::from_secs(1),
                    "503",
                )
                .await
                .unwrap();
            },
        )
        .await;
        assert_eq!(read, 1, "a retry read {read} queue rows");
    }
    for event in &claim.events[3..6] {
        let ((), read) = reading(
            &mut conn,
            "idx_tup_fetch + seq_tup_read",
            "inbox_queue",
            async |conn: &mut AsyncPgConnection| {
                dead_letter(conn, event.id, claim.lease_token, "gave up")
                    .await
                    .unwrap();
            },
        )
        .await;
        assert_eq!(read, 1, "a dead letter read {read} queue rows");
    }
}

/// The lease keeper extends every lease its worker holds in one statement, every third of a
/// lease. Under the same statistics it must read the rows it names, not every row in
/// processing (every worker's) for each heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_reads_only_its_rows_whatever_else_is_in_processing() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let claims = claims_beside_others_in_processing(&mut conn).await;
    for claim in &claims[..3] {
        let ids = ids(claim);
        let tokens = vec![claim.lease_token; ids.len()];
        let (not_held, read) = reading(
            &mut conn,
            "idx_tup_fetch + seq_tup_read",
            "inbox_queue",
            async |conn: &mut AsyncPgConnection| {
                extend_leases(conn, &ids, &tokens, Duration::from_secs(30))
                    .await
                    .unwrap()
            },
        )
        .await;
        assert!(
            not_held.lost.is_empty() && not_held.finished.is_empty(),
            "every lease is held"
        );
        // Each row looked up to be locked, then updated, then checked as still held.
        assert!(
            read <= 3 * ids.len() as i64,
            "extending {} leases read {read} queue rows",
            ids.len()
        );
    }
}

/// Event `n` of `keys` keys named `name_0` and on, the `n / keys + 1`th of its key.
fn ordered_among(name: &str, keys: usize, n: usize) -> NewEvent {
    NewEvent {
        ordering: Some(EventOrdering {
            key: ordering_key("demo", &format!("{name}_{}", n % keys)),
            sequence: i64::try_from(n / keys + 1).unwrap(),
            hold: Duration::ZERO,
        }),
        ..event(n)
    }
}

/// The completion of ordered events hands each key on to its next event and returns those,
/// in one statement. Under a generic plan (what PostgreSQL may keep for the connection's
/// life) it must read every row by key: a scan of the queue or of the keys would read every
/// waiting event or key at each completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_completion_hands_on_by_key_under_a_generic_plan() {
    const KEYS: usize = 50;
    const LEASE: Duration = Duration::from_secs(30);
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    // Other keys' events waiting, analyzed as autovacuum would.
    let others: Vec<NewEvent> = (0..5_000)
        .map(|n| ordered_among("other", 5_000, KEYS * 3 + n))
        .collect();
    for chunk in others.chunks(500) {
        insert_events(&mut conn, chunk).await.unwrap();
    }
    conn.batch_execute("ANALYZE inbox_queue, inbox_keys")
        .await
        .unwrap();
    let events: Vec<NewEvent> = (0..KEYS * 3)
        .map(|n| ordered_among("key", KEYS, n))
        .collect();
    insert_events(&mut conn, &events).await.unwrap();
    plan_generically(&mut conn).await;
    // Claims until the first key's head comes (oldest due first: the other keys' first).
    let mut expected = 1;
    let (mut handed, token) = loop {
        let claim = claim_due(&mut conn, "w1", LEASE, 100).await.unwrap();
        assert!(!claim.events.is_empty(), "every key's head is due");
        let ours: Vec<_> = claim
            .events
            .iter()
            .filter(|event| event.ordering_key.as_deref() == Some("demo:key_0"))
            .cloned()
            .collect();
        if !ours.is_empty() {
            break (ours, claim.lease_token);
        }
    };
    // Rows this session read by scanning the tables that grow (counted before they reach the
    // statistics, earlier transactions' too: hence the difference).
    let scanned = async |conn: &mut diesel_async::AsyncPgConnection| {
        count(
            conn,
            "SELECT coalesce(sum(seq_tup_read), 0)::bigint AS n FROM pg_stat_xact_user_tables \
             WHERE relname IN ('inbox_queue', 'inbox_keys', 'inbox_finished') \
                OR relname LIKE 'inbox\\_events%'",
        )
        .await
    };
    while let [event] = handed.as_slice() {
        assert_eq!(event.ordering_sequence, Some(expected));
        conn.batch_execute("BEGIN").await.unwrap();
        let before = scanned(&mut conn).await;
        let next = complete_keyed(&mut conn, &[event.id], token).await.unwrap();
        let read = scanned(&mut conn).await - before;
        conn.batch_execute("COMMIT").await.unwrap();
        assert_eq!(
            read, 0,
            "a keyed completion scanned a table instead of reading its rows by key"
        );
        handed = next;
        expected += 1;
    }
    assert!(handed.is_empty(), "one event at a time: {handed:?}");
    assert_eq!(expected, 4, "the key's three events, in sequence");
}

/// A completion of many ordered events is planned once per connection, generically, and that
/// plan is kept as the day's journal fills. Made while the journal was known to be empty, it
/// must still read the events it hands on by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_completion_reads_the_journal_by_key_under_a_plan_made_while_it_was_empty() {
    const KEYS: usize = 50;
    const LEASE: Duration = Duration::from_secs(30);
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    conn.batch_execute("VACUUM ANALYZE inbox_events")
        .await
        .unwrap();
    let first_events = [ordered_among("first", 2, 0), ordered_among("first", 2, 1)];
    insert_events(&mut conn, &first_events).await.unwrap();
    let first = claim_due(&mut conn, "w1", LEASE, 100).await.unwrap();
    let ids: Vec<i64> = first.events.iter().map(|event| event.id).collect();
    // In a transaction, as the worker completes events: the plan is made here.
    conn.batch_execute("BEGIN").await.unwrap();
    complete_keyed(&mut conn, &ids, first.lease_token)
        .await
        .unwrap();
    conn.batch_execute("COMMIT").await.unwrap();
    let events: Vec<NewEvent> = (0..KEYS * 20)
        .map(|n| ordered_among("key", KEYS, n))
        .collect();
    insert_events(&mut conn, &events).await.unwrap();
    let claim = claim_due(&mut conn, "w1", LEASE, 100).await.unwrap();
    assert_eq!(claim.events.len(), KEYS, "every key's head");
    let ids: Vec<i64> = claim.events.iter().map(|event| event.id).collect();
    conn.batch_execute("BEGIN").await.unwrap();
    let before = journal_scanned(&mut conn).await;
    let handed = complete_keyed(&mut conn, &ids, claim.lease_token)
        .await
        .unwrap();
    let scanned = journal_scanned(&mut conn).await - before;
    conn.batch_execute("COMMIT").await.unwrap();
    assert_eq!(handed.len(), KEYS, "each key handed on to its second event");
    assert_eq!(
        scanned, 0,
        "a keyed completion scanned the journal instead of reading its rows by key"
    );
}

/// A key left without events keeps its processed sequence in its `inbox_keys` row, written by
/// the completion. `ANALYZE` run while another transaction was adding every key sees none of
/// them, and records the table as holding no rows; a completion planned then, generically and
/// for the session's life, must still write only its own keys. Written through a join, it read
/// every key for each call and compared each with every completed event: a drain of 200,000
/// events over 10,000 keys fell from about 40,000/s to 2,000/s (`bench/history.md`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_completion_writes_its_idle_keys_by_key_under_a_plan_made_while_they_looked_empty()
{
    const KEYS: usize = 2_000;
    const COMPLETED: i64 = 100;
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let mut adding = db.connect().await;
    adding.batch_execute("BEGIN").await.unwrap();
    let events: Vec<NewEvent> = (0..KEYS).map(|n| ordered_among("key", KEYS, n)).collect();
    for chunk in events.chunks(500) {
        insert_events(&mut adding, chunk).await.unwrap();
    }
    conn.batch_execute("ANALYZE inbox_keys").await.unwrap();
    adding.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        count(
            &mut conn,
            "SELECT reltuples::bigint AS n FROM pg_class WHERE relname = 'inbox_keys'"
        )
        .await,
        0,
        "the keys' table was analyzed as empty"
    );

    let claim = claim_due(&mut conn, "w1", Duration::from_secs(30), COMPLETED)
        .await
        .unwrap();
    assert_eq!(claim.events.len(), 100, "a hundred keys' heads are due");
    let ids: Vec<i64> = claim.events.iter().map(|event| event.id).collect();
    let counter = "idx_tup_fetch + seq_tup_read";
    let (handed, read) = reading(
        &mut conn,
        counter,
        "inbox_keys",
        async |conn: &mut AsyncPgConnection| {
            complete_keyed(conn, &ids, claim.lease_token).await.unwrap()
        },
    )
    .await;
    assert!(handed.is_empty(), "each key had one event: {handed:?}");
    // Each key read once to be locked and once to be written.
    assert!(
        read <= 2 * COMPLETED,
        "a completion of {COMPLETED} events read {read} of the {KEYS} keys"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_keys WHERE processed_sequence = 1"
        )
        .await,
        COMPLETED,
        "each completed key keeps the sequence it processed"
    );
}

/// Stores `events` unordered events, added by another session in one transaction, and analyzes
/// `table` before it commits (as an autoanalyze during a long import or replay may): the
/// statistics then say the table is empty, whatever it holds.
async fn stored_while_analyzed_as_empty(db: &TestDatabase, events: usize, table: &str) {
    let mut adding = db.connect().await;
    let mut analyzing = db.connect().await;
    adding.batch_execute("BEGIN").await.unwrap();
    let backlog: Vec<NewEvent> = (0..events).map(event).collect();
    for chunk in backlog.chunks(500) {
        insert_events(&mut adding, chunk).await.unwrap();
    }
    analyzing
        .batch_execute(&format!("ANALYZE {table}"))
        .await
        .unwrap();
    adding.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        count(
            &mut analyzing,
            &format!("SELECT reltuples::bigint AS n FROM pg_class WHERE relname = '{table}'")
        )
        .await,
        0,
        "{table} was analyzed as empty"
    );
}

/// An arrival that starts a key (or precedes its ready head) settles the key in the statement
/// that inserted it: it looks for a ready head to step back, then makes the key's lowest event
/// its head. A receiver's session plans that once and keeps the plan. Made while the queue
/// looked empty, the plan read every claimable event to find a key's ready head, and every
/// queued event to update the new head: each key an ingest started read the whole backlog
/// twice, and an ingest of 10,000 keys' events ran at about 13,500/s instead of 18,000/s
/// (`bench/history.md`, migration 24). It must read each key's rows by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arrival_settles_its_keys_by_key_under_a_plan_made_while_the_queue_looked_empty() {
    const BACKLOG: usize = 5_000;
    const NEW_KEYS: usize = 100;
    let db = TestDatabase::new().await;
    stored_while_analyzed_as_empty(&db, BACKLOG, "inbox_queue").await;
    let mut conn = db.connect().await;
    plan_generically(&mut conn).await;
    let arrivals: Vec<NewEvent> = (0..NEW_KEYS)
        .map(|n| ordered_among("key", NEW_KEYS, BACKLOG + n))
        .collect();
    let counter = "idx_tup_fetch + seq_tup_read";
    let ((), read) = reading(
        &mut conn,
        counter,
        "inbox_queue",
        async |conn: &mut AsyncPgConnection| {
            insert_events(conn, &arrivals).await.unwrap();
        },
    )
    .await;
    // Per key: its lowest waiting event, looked up to step a head back and to promote it, the
    // key's head looked up by the arrival and by the promotion, and the promoted row updated.
    assert!(
        read <= 5 * NEW_KEYS as i64,
        "settling {NEW_KEYS} new keys read {read} queue rows beside a backlog of {BACKLOG}"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_queue WHERE head"
        )
        .await,
        NEW_KEYS as i64,
        "each key's first event is its head"
    );
}

/// A keyed completion hands each key on to its next event by updating that event. Its plan is
/// made once per worker session, generically; made while the queue looked empty, it must still
/// update the next events by key, not read the backlog for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_completion_hands_on_by_key_under_a_plan_made_while_the_queue_looked_empty() {
    const BACKLOG: usize = 5_000;
    const KEYS: usize = 50;
    let db = TestDatabase::new().await;
    stored_while_analyzed_as_empty(&db, BACKLOG, "inbox_queue").await;
    let mut conn = db.connect().await;
    let events: Vec<NewEvent> = (0..KEYS * 2)
        .map(|n| ordered_among("key", KEYS, BACKLOG + n))
        .collect();
    insert_events(&mut conn, &events).await.unwrap();
    // The backlog is older: claimed out of the way, then the keys' heads, in one claim.
    let (heads, token) = loop {
        let claim = claim_due(&mut conn, "w1", Duration::from_secs(30), 1_000)
            .await
            .unwrap();
        assert!(!claim.events.is_empty(), "every key's head is due");
        let heads: Vec<i64> = claim
            .events
            .iter()
            .filter(|event| event.ordering_key.is_some())
            .map(|event| event.id)
            .collect();
        if !heads.is_empty() {
            break (heads, claim.lease_token);
        }
    };
    assert_eq!(heads.len(), KEYS, "every key's head in one claim");
    let counter = "idx_tup_fetch + seq_tup_read";
    let (handed, read) = reading(
        &mut conn,
        counter,
        "inbox_queue",
        async |conn: &mut AsyncPgConnection| complete_keyed(conn, &heads, token).await.unwrap(),
    )
    .await;
    assert_eq!(handed.len(), KEYS, "each key handed on to its second event");
    // Per key: its head locked and deleted, its next event looked up and updated.
    assert!(
        read <= 5 * KEYS as i64,
        "a completion of {KEYS} heads read {read} queue rows beside a backlog of {BACKLOG}"
    );
}

/// A key's row stays once its events are done (its `processed_sequence` recognises late
/// arrivals), so `inbox_keys` holds every key ever seen; and a busy key may have thousands of
/// events waiting. A claim reads neither: it takes heads from the index of claimable rows, each
/// carrying what its key had processed, under a generic plan too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_claim_reads_heads_only_under_a_generic_plan() {
    const KEYS: usize = 1_000;
    const LIMIT: i64 = 100;
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let events: Vec<NewEvent> = (0..KEYS * 5)
        .map(|n| ordered_among("key", KEYS, n))
        .collect();
    for chunk in events.chunks(500) {
        insert_events(&mut conn, chunk).await.unwrap();
    }
    conn.batch_execute("ANALYZE inbox_queue, inbox_keys; SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();

    conn.batch_execute(
        "INSERT INTO inbox_paused_routes (provider, event_type, paused_by) \
         VALUES ('demo', '*', 'test')",
    )
    .await
    .unwrap();
    let (claimed, read) = claim_reading(&mut conn, LIMIT, "seq_tup_read", "inbox_queue").await;
    assert_eq!(claimed, 0, "every head is paused");
    assert_eq!(read, 0, "a claim of paused heads scanned {read} queue rows");
    conn.batch_execute("DELETE FROM inbox_paused_routes")
        .await
        .unwrap();
    for _ in 0..3 {
        let (claimed, keys_read) = claim_reading(
            &mut conn,
            LIMIT,
            "idx_tup_fetch + seq_tup_read",
            "inbox_keys",
        )
        .await;
        assert_eq!(claimed, 100, "a hundred keys' heads are due");
        assert_eq!(keys_read, 0, "a claim read {keys_read} keys");
        let (claimed, queue_read) = claim_reading(
            &mut conn,
            LIMIT,
            "idx_tup_fetch + seq_tup_read",
            "inbox_queue",
        )
        .await;
        assert_eq!(claimed, 100);
        // Each head found in the index of claimable rows, then updated by primary key.
        assert!(
            queue_read <= 2 * LIMIT,
            "a claim of {LIMIT} heads read {queue_read} queue rows"
        );
    }
}

/// A claim session plans the claim once and keeps that plan for its life, so a worker started
/// on a new deployment keeps the plan made before the queue had any statistics. That plan must
/// still read the due rows oldest first and stop at the claim's limit. When ordering keys were
/// claimed through their own table, the plan made for the one due key it expected fetched and
/// sorted every due key at each claim: 100,000 events over as many keys drained at 8,568/s
/// instead of 23,441/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_session_reads_due_heads_up_to_its_limit_under_a_plan_made_before_any_statistics() {
    const KEYS: usize = 5_000;
    const LIMIT: i64 = 100;
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let events: Vec<NewEvent> = (0..KEYS).map(|n| ordered_among("key", KEYS, n)).collect();
    for chunk in events.chunks(500) {
        insert_events(&mut conn, chunk).await.unwrap();
    }
    prepare_claim_session(&mut conn).await.unwrap();
    for _ in 0..3 {
        let (claimed, fetched) =
            claim_reading(&mut conn, LIMIT, "idx_tup_fetch", "inbox_queue").await;
        assert_eq!(claimed, 100, "a hundred keys' heads are due");
        // The heads taken, fetched again by key to be updated.
        assert!(
            fetched <= 2 * LIMIT,
            "a claim of {LIMIT} fetched {fetched} rows of {KEYS} due"
        );
    }
}

#[derive(QueryableByName)]
struct Plans {
    #[diesel(sql_type = BigInt)]
    generic_plans: i64,
    #[diesel(sql_type = BigInt)]
    custom_plans: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    jit: String,
}

/// Left to choose, PostgreSQL plans the claim anew for its `LIMIT` at every execution (its
/// first five always): on a claim session it is planned once, and never compiled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_session_plans_the_claim_once_and_never_compiles_it() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let events: Vec<NewEvent> = (0..200).map(event).collect();
    insert_events(&mut conn, &events).await.unwrap();
    prepare_claim_session(&mut conn).await.unwrap();
    for _ in 0..8 {
        let claim = claim_due(&mut conn, "w1", Duration::from_secs(30), 10)
            .await
            .unwrap();
        assert_eq!(claim.events.len(), 10);
    }
    let plans: Plans = diesel::sql_query(
        "SELECT generic_plans, custom_plans, current_setting('jit') AS jit \
         FROM pg_prepared_statements WHERE statement LIKE '%FOR UPDATE SKIP LOCKED%'",
    )
    .get_result(&mut conn)
    .await
    .unwrap();
    assert_eq!(plans.custom_plans, 0, "no claim planned for its values");
    assert_eq!(
        plans.generic_plans, 8,
        "the one generic plan, used by every claim"
    );
    assert_eq!(plans.jit, "off");
}

/// A delivery of an event already stored looks its key up to tell the sender whether the body
/// was the same. The receiver's sessions keep that lookup's plan; made while `inbox_dedup`
/// looked empty (analyzed while a migration or import was adding its keys in one transaction),
/// a join read every stored key for each batch holding a duplicate, at the moment providers
/// retry most. It must read each key by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_reads_its_stored_key_by_key_under_statistics_taken_while_the_keys_were_invisible(
) {
    const STORED: usize = 5_000;
    const DUPLICATES: usize = 10;
    let db = TestDatabase::new().await;
    stored_while_analyzed_as_empty(&db, STORED, "inbox_dedup").await;
    let mut conn = db.connect().await;
    plan_generically(&mut conn).await;
    for round in 0..3 {
        let again: Vec<NewEvent> = (round * DUPLICATES..(round + 1) * DUPLICATES)
            .map(event)
            .collect();
        let (outcomes, read) = reading(
            &mut conn,
            "idx_tup_fetch + seq_tup_read",
            "inbox\\_dedup",
            async |conn: &mut AsyncPgConnection| insert_events(conn, &again).await.unwrap(),
        )
        .await;
        assert!(
            outcomes.iter().all(|outcome| *outcome
                == InsertOutcome::Duplicate {
                    same_body: Some(true)
                }),
            "every delivery a duplicate of the same body: {outcomes:?}"
        );
        // Each key read by the insert's conflict check, then by the lookup.
        assert!(
            read <= 2 * DUPLICATES as i64,
            "{DUPLICATES} duplicates read {read} of {STORED} stored keys"
        );
    }
}

/// `worker show` (and the console's lookups by provider and event id) find the event by its
/// dedup key, then read it by its id: the journal has no index by event id, and a filter on it
/// read every stored event of every day.
#[tokio::test]
async fn showing_an_event_reads_it_by_key_not_the_whole_journal() {
    const EVENTS: usize = 500;
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let events: Vec<NewEvent> = (0..EVENTS).map(event).collect();
    insert_events(&mut conn, &events).await.unwrap();
    conn.batch_execute("ANALYZE").await.unwrap();
    let wanted = events[EVENTS / 2].event_id.clone();
    let (shown, scanned) = reading(
        &mut conn,
        "seq_tup_read",
        "inbox\\_events%",
        async |conn: &mut AsyncPgConnection| {
            inbox_core::operations::show(conn, "demo", &wanted)
                .await
                .unwrap()
        },
    )
    .await;
    assert_eq!(
        shown.map(|event| event.summary.event_id).as_deref(),
        Some(wanted.as_str())
    );
    assert_eq!(scanned, 0, "the journal was scanned");

    // The console's list, filtered by provider and event id.
    let query = inbox_core::operations::browse::EventQuery {
        provider: Some("demo".into()),
        event_id: Some(wanted.clone()),
        ..Default::default()
    };
    let (listed, scanned) = reading(
        &mut conn,
        "seq_tup_read",
        "inbox\\_events%",
        async |conn: &mut AsyncPgConnection| {
            inbox_core::operations::browse::tune_session(conn, None)
                .await
                .unwrap();
            inbox_core::operations::browse::list_page(conn, &query, None, 51)
                .await
                .unwrap()
        },
    )
    .await;
    assert_eq!(
        listed
            .iter()
            .map(|row| row.event_id.as_str())
            .collect::<Vec<_>>(),
        [wanted.as_str()]
    );
    assert_eq!(scanned, 0, "the list scanned the journal");
}

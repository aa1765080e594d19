//! The worker's side of the inbox: the lease state machine.
//!
//! The state of an event still to process is its small `inbox_queue` row; the body stays in
//! its `inbox_events` row, which no transition writes. A finished event's queue row is
//! replaced, in the same statement, by its `inbox_finished` row.
//!
//! A claim moves due rows `ready -> processing` under a fresh lease token. Each transition out
//! of `processing` is fenced by that token: it matches on `(id, lease_token, status =
//! processing)`, and zero rows updated is [`TransitionError::LeaseLost`], never ignored. A
//! worker whose lease expired and was taken over can therefore never complete, retry or
//! dead-letter a row it no longer owns.
//!
//! Every statement is fixed SQL prepared once per connection ([`cached_sql`]), its row states
//! written from [`crate::InboxStatus`] ([`crate::statuses_sql!`]); the keyed completion calls a
//! function of the schema (migration 22), whose SQL writes them as numbers, as migrations do.
//!
//! Every transition out of `processing` (`id = $1` or `id = ANY($1)`, with its lease token)
//! tests the state as `status + 0 = processing`: written plainly, the condition lets the
//! planner read the rows through a partial index of processing rows (`inbox_queue_leases`)
//! instead of by primary key, which it does whenever the table's statistics were taken with
//! few rows in processing (a backlog analyzed before the workers started, say). That plan reads
//! every row in processing, of every worker, for each transition: 1,300 rows to complete a
//! batch of 100 in a 10,000-key drain, 1,300 for one retry beside 13 claims of 100. The
//! expression matches the same rows and keeps the partial indexes out of reach; the heartbeat
//! names its rows by `id = ANY($1)` too, so that no plan walks the queue to join them.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use uuid::Uuid;

use super::{duration_millis, truncate_error};
use crate::prepared::{bind, cached_sql};
use crate::schema::webhook_inbox;
use crate::statuses_sql;
use crate::BackoffPolicy;

/// An event claimed by a worker, with everything a handler needs.
#[derive(Debug, Clone, QueryableByName)]
#[diesel(table_name = webhook_inbox)]
pub struct ClaimedEvent {
    /// Row id.
    pub id: i64,
    /// Provider name.
    pub provider: String,
    /// The provider's event id.
    pub event_id: String,
    /// The provider's event type, when known.
    pub event_type: Option<String>,
    /// When the receiver committed the event.
    pub received_at: DateTime<Utc>,
    /// Stored request headers (a JSON object).
    pub headers: serde_json::Value,
    /// The exact body bytes.
    pub body: Vec<u8>,
    /// Attempts begun, including this one.
    pub attempt: i32,
    /// Its ordering key (`provider:value`), when its provider orders events.
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    pub ordering_key: Option<String>,
    /// Its sequence within its key (0 when the provider has none).
    #[diesel(sql_type = diesel::sql_types::Nullable<BigInt>)]
    pub ordering_sequence: Option<i64>,
    /// A late arrival: an event of its key with a higher sequence is already done.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub stale: bool,
    /// Its provider completes late arrivals as skipped instead of handing them over.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub skip_stale: bool,
}

/// A set of events claimed together under one lease token.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The fencing token every transition of these rows must present.
    pub lease_token: Uuid,
    /// The claimed events, oldest due first.
    pub events: Vec<ClaimedEvent>,
}

/// Claims up to `limit` due ready rows in one short statement and returns them under a fresh
/// lease: `status = processing`, `attempt + 1`, `locked_until = now() + lease`; each with its
/// journal columns, read (not written) from `inbox_events` by primary key.
///
/// Unordered events and the heads of ordering keys are claimed alike, oldest due first, from the
/// one index of claimable rows (`inbox_queue_ready`): an ordered event is claimable only as its
/// key's head (`inbox_queue.head`, migration 21), so a claim never reads an event waiting behind
/// another, nor a key's `inbox_keys` row: a head carries the sequence its key had processed when
/// it became the head (`key_processed_sequence`), and comes late when its own is lower. Taking
/// a head changes no head: the key stays with its event until that event leaves processing, and
/// the unique index `inbox_queue_one_head_per_key` holds the guarantee whatever a statement does.
///
/// Locks: the claimed rows are selected `FOR UPDATE SKIP LOCKED`, so concurrent claimers never
/// wait on each other nor take the same row, and a head stepping back for a lower arrival is
/// passed by; they are updated by primary key, re-checked to be still ready. All locks end when
/// the statement commits, right away. The lease, not a row lock, protects the row while the
/// handler runs.
///
/// Each claimed event's journal row is read by key, in a `LATERAL` subquery with a `LIMIT` the
/// planner cannot turn into a join. Joined plainly, a generic plan made while the day's
/// partition has no statistics (its first minute) hashes the whole partition on every claim,
/// bodies included, and keeps doing so as the day fills.
///
/// The due ids are collected into an array first, evaluated once, and the rows updated by
/// primary key. Joined to a subquery (or to a materialized CTE) instead, the statement has a
/// generic plan that scans the whole table, because the planner cannot see the `LIMIT`:
/// should PostgreSQL switch the prepared statement to that plan, claims would slow down as
/// the backlog grows.
///
/// The claim commits without waiting for its WAL to reach the disk (`synchronous_commit`
/// off for this statement's transaction alone): a claim is the most frequent commit of the
/// worker, and its flush would queue the receiver's acknowledgements behind it. Nothing is
/// lost by it. A claim the server loses in a crash leaves its rows as they were, ready,
/// their attempt unspent; every commit that makes an attempt's outcome durable (the
/// completion with its handler's effect) comes later in the WAL and is flushed, which
/// flushes the claim with it.
///
/// Run it on a connection set up by [`prepare_claim_session`], or the server plans it anew at
/// every execution.
pub async fn claim_due(
    conn: &mut AsyncPgConnection,
    worker_name: &str,
    lease: Duration,
    limit: i64,
) -> QueryResult<Claim> {
    let lease_token = Uuid::new_v4();
    let events = cached_sql(
        statuses_sql!(
            "WITH unflushed AS MATERIALIZED ( \
                 SELECT set_config('synchronous_commit', 'off', true) \
             ), due AS MATERIALIZED ( \
                 SELECT ARRAY( \
                     SELECT id FROM inbox_queue \
                     WHERE status = {ready} AND (ordering_key IS NULL OR head) \
                       AND next_attempt_at <= now() AND {not_paused} \
                     ORDER BY next_attempt_at \
                     LIMIT $4 \
                     FOR UPDATE SKIP LOCKED \
                 ) AS ids FROM unflushed \
             ), claimed AS ( \
                 UPDATE inbox_queue AS queue \
                 SET status = {processing}, attempt = queue.attempt + 1, lease_token = $1, \
                     locked_by = $2, locked_until = now() + $3 * interval '1 millisecond' \
                 WHERE queue.id = ANY((SELECT ids FROM due)::bigint[]) \
                   AND queue.status = {ready} \
                 RETURNING queue.id, queue.attempt, queue.next_attempt_at, queue.ordering_key, \
                           queue.ordering_sequence, queue.key_processed_sequence \
             ) \
             SELECT event.id, event.provider, event.event_id, event.event_type, \
                    event.received_at, event.headers, event.body, claimed.attempt, \
                    claimed.ordering_key, claimed.ordering_sequence, \
                    coalesce(claimed.ordering_sequence < claimed.key_processed_sequence, false) \
                        AS stale, \
                    coalesce(policy.skip_stale, false) AS skip_stale \
             FROM claimed CROSS JOIN LATERAL ( \
                 SELECT * FROM inbox_events WHERE inbox_events.id = claimed.id LIMIT 1 \
             ) AS event \
             LEFT JOIN inbox_ordering_providers AS policy \
                 ON claimed.ordering_key IS NOT NULL AND policy.provider = event.provider \
             ORDER BY claimed.next_attempt_at, event.id"
        ),
        (
            bind::<diesel::sql_types::Uuid, _>(lease_token),
            bind::<Text, _>(worker_name),
            bind::<BigInt, _>(duration_millis(lease)),
            bind::<BigInt, _>(limit),
        ),
    )
    .load::<ClaimedEvent>(conn)
    .await?;
    Ok(Claim {
        lease_token,
        events,
    })
}

/// The session settings a connection that runs [`claim_due`] needs, one round trip: run them
/// once, right after it is opened, and use the connection for claims alone.
///
/// `plan_cache_mode = force_generic_plan`: the claim's `LIMIT` is a parameter, and a generic
/// plan, which cannot see its value, is costed as if a tenth of the queue were claimed. Left
/// to choose, PostgreSQL therefore plans the statement anew for its value at every execution,
/// and the claim is large (its ordered half): about 1 ms of the server's CPU per claim, more
/// than a quarter of what a no-op drain costs the database. The generic plan takes the same indexes
/// (every lookup is by index whatever the row estimates), so it is made once per connection.
///
/// `jit = off`: costed for a tenth of the queue, the generic plan passes `jit_above_cost` on
/// any sizeable backlog, and compiling it took 700 ms at every execution.
///
/// `enable_seqscan = off` and `enable_bitmapscan = off`: the plan is kept for the session's
/// life, so it must read by key whatever the statistics said when it was made, and every
/// lookup of the claim has an index. Two plans it made otherwise, each kept as the tables grew:
/// - A day's journal partition analyzed while empty (partitions are made days ahead, and a
///   nightly `VACUUM ANALYZE` reaches them) is known to hold no rows, and a sequential scan
///   of it is the cheapest plan: every claimed event then scanned the day's journal, and at
///   1,000 events/s the time from answer to handling grew past a second within twenty seconds.
/// - Before a table had statistics (a worker started on a new deployment) the planner expected
///   few due rows and read them with a bitmap scan, which returns them unordered: each claim
///   fetched every due row and sorted them all to lock the oldest hundred. When ordering keys
///   were claimed through their own table, a drain of 100,000 events over as many keys ran at a
///   third of its speed so.
///
/// Read by index, the due rows come oldest first from `inbox_queue_ready` and the scan stops at
/// the claim's limit.
pub async fn prepare_claim_session(conn: &mut AsyncPgConnection) -> QueryResult<()> {
    conn.batch_execute(INDEXES_ONLY_GENERIC_PLANS).await
}

/// The settings of [`prepare_claim_session`], for the session.
const INDEXES_ONLY_GENERIC_PLANS: &str = "SET plan_cache_mode = force_generic_plan; \
     SET jit = off; SET enable_seqscan = off; SET enable_bitmapscan = off";

/// A fenced transition that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum TransitionError {
    /// The row is no longer processing under this token: the lease expired and the row was
    /// rescued or claimed by another worker. Whatever the caller did in this transaction must
    /// roll back.
    #[error("lease lost: the row is no longer held under this lease token")]
    LeaseLost,
    /// The database failed.
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// `Ok` when all `expected` rows were updated: otherwise some were no longer held.
fn expect_all(updated: usize, expected: usize) -> Result<(), TransitionError> {
    if updated == expected {
        Ok(())
    } else {
        Err(TransitionError::LeaseLost)
    }
}

/// `processing -> done`. Call it inside the handler's transaction, after the handler's
/// writes: the effect and the completion then commit together or not at all.
pub async fn complete(
    conn: &mut AsyncPgConnection,
    id: i64,
    lease_token: Uuid,
) -> Result<(), TransitionError> {
    complete_all(conn, &[id], lease_token).await
}

/// `processing -> done` for several rows claimed under one token, in one statement: the
/// batched form of [`complete`]. The queue rows are deleted and their `inbox_finished` rows
/// written. Unless every row is still held, the caller's transaction must roll back
/// ([`TransitionError::LeaseLost`]): some of them may have been completed in it.
///
/// Locks the queue rows it deletes until the caller's transaction ends, so a rescue (`SKIP
/// LOCKED`) passes them by meanwhile.
pub async fn complete_all(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    lease_token: Uuid,
) -> Result<(), TransitionError> {
    if ids.is_empty() {
        return Ok(());
    }
    let updated = cached_sql(
        statuses_sql!(
            "WITH completed AS ( \
                 DELETE FROM inbox_queue \
                 WHERE id = ANY($1) AND lease_token = $2 AND status + 0 = {processing} \
                 RETURNING id, attempt, locked_by \
             ) \
             INSERT INTO inbox_finished (id, status, attempt, locked_by, processed_at) \
             SELECT id, {done}, attempt, locked_by, clock_timestamp() FROM completed"
        ),
        (
            bind::<Array<BigInt>, _>(ids),
            bind::<diesel::sql_types::Uuid, _>(lease_token),
        ),
    )
    .execute(conn)
    .await?;
    expect_all(updated, ids.len())
}

/// Whether a keyed completion must lock its keys' rows, or its transaction holds them already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLocks {
    /// Lock them first: no earlier statement of the transaction did.
    Take,
    /// Held since an earlier completion in the same transaction handed these keys on to the
    /// events now completed.
    Held,
}

/// [`complete_all`] for rows of which some are ordered, handing each of their keys on to its
/// next event, and returning the events handed on. One statement: call it inside the caller's
/// transaction, or alone (it commits by itself, with the events it hands on claimed).
///
/// A key's next event is its lowest `(ordering_sequence, id)` waiting behind the completed head;
/// it becomes the key's head (migration 21). When it is due and not paused it is claimed too,
/// under `lease_token` for `worker_name`, as [`claim_due`] would claim it, and comes back as a
/// [`ClaimedEvent`] (late arrivals marked as [`claim_due`] marks them), oldest due first: the
/// next event of a busy key then starts without waiting for a claim, its claim committing with
/// the completion before it. Otherwise it waits as the head for a claim. Either way it carries
/// the key's processed sequence on, raised to the completed event's. A key with nothing waiting
/// is left without a head, for its next arrival to take, and its `inbox_keys` row keeps that
/// sequence: a busy key's row is written only when it falls idle.
///
/// The work is the function `inbox_complete_keyed` (migration 22), in two statements: the first
/// locks the keys' `inbox_keys` rows in key order, as every writer of a key locks them, so an
/// ingest and a completion never deadlock; the second reads the waiting events in a snapshot
/// taken after those locks were granted, so no event that arrived before is missed, and an
/// arrival that comes later waits for the completion, then finds the key's new head (or none,
/// and becomes it). With [`KeyLocks::Held`] (events handed on earlier in the same transaction:
/// a busy key's run of events) the first is left out. The function's statements run their
/// generic plans, made once per session, reading by index.
///
/// The second statement settles every key of its rows itself, so the trigger that settles a key
/// when its head leaves the queue (migration 21) would only find it settled, at a PL/pgSQL call
/// and a key lookup an event: the function names the statement in `inbox.keys_released_by` (its
/// lease token and its start, both of which the trigger's `WHEN` sees), and the trigger skips
/// the rows it deletes (migration 19).
///
/// Unless every row is still held, it fails with [`TransitionError::LeaseLost`] and changes
/// nothing: the function raises (`inbox_lease_held`), which undoes the statement, so a call
/// alone leaves no event completed or handed on; a caller's transaction is aborted and must
/// roll back. Locks the key rows, the queue rows it deletes and the events it hands on until
/// the transaction ends.
pub async fn complete_all_keyed(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    lease_token: Uuid,
    worker_name: &str,
    lease: Duration,
    keys: KeyLocks,
) -> Result<Vec<ClaimedEvent>, TransitionError> {
    /// The function's rows: one event handed on in each, or none in the one row returned when
    /// no event was handed on. (Their count of rows completed is checked by the function.)
    #[derive(QueryableByName)]
    struct KeyedCompletion {
        #[diesel(embed)]
        handed_on: Option<ClaimedEvent>,
    }

    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = cached_sql(
        "SELECT * FROM inbox_complete_keyed($1, $2, $3, $4, $5)",
        (
            bind::<Array<BigInt>, _>(ids),
            bind::<diesel::sql_types::Uuid, _>(lease_token),
            bind::<Text, _>(worker_name),
            bind::<BigInt, _>(duration_millis(lease)),
            bind::<Bool, _>(keys == KeyLocks::Take),
        ),
    )
    .load::<KeyedCompletion>(conn)
    .await
    .map_err(lease_lost_in_function)?;
    Ok(rows.into_iter().filter_map(|row| row.handed_on).collect())
}

/// The error a function of the lease raises (`inbox_lease_held`, migration 22) when a row was no
/// longer held, as [`TransitionError::LeaseLost`].
fn lease_lost_in_function(err: diesel::result::Error) -> TransitionError {
    use diesel::result::{DatabaseErrorKind, Error};
    match &err {
        Error::DatabaseError(DatabaseErrorKind::CheckViolation, info)
            if info.constraint_name() == Some("inbox_lease_held") =>
        {
            TransitionError::LeaseLost
        }
        _ => TransitionError::Database(err),
    }
}

/// `processing -> ready` after a retryable failure, due again after `delay`, with `error`
/// kept (cut to [`super::MAX_ERROR_CHARS`]) for the operator.
pub async fn schedule_retry(
    conn: &mut AsyncPgConnection,
    id: i64,
    lease_token: Uuid,
    delay: Duration,
    error: &str,
) -> Result<(), TransitionError> {
    let updated = cached_sql(
        statuses_sql!(
            "UPDATE inbox_queue \
             SET status = {ready}, next_attempt_at = now() + $3 * interval '1 millisecond', \
                 lease_token = NULL, locked_until = NULL, last_error = $4 \
             WHERE id = $1 AND lease_token = $2 AND status + 0 = {processing}"
        ),
        (
            bind::<BigInt, _>(id),
            bind::<diesel::sql_types::Uuid, _>(lease_token),
            bind::<BigInt, _>(duration_millis(delay)),
            bind::<Text, _>(truncate_error(error)),
        ),
    )
    .execute(conn)
    .await?;
    expect_all(updated, 1)
}

/// `processing -> dead`: a permanent failure, or the last attempt failed. The queue row is
/// replaced by its `inbox_finished` row.
pub async fn dead_letter(
    conn: &mut AsyncPgConnection,
    id: i64,
    lease_token: Uuid,
    error: &str,
) -> Result<(), TransitionError> {
    let updated = cached_sql(
        statuses_sql!(
            "WITH dead AS ( \
                 DELETE FROM inbox_queue \
                 WHERE id = $1 AND lease_token = $2 AND status + 0 = {processing} \
                 RETURNING id, attempt, locked_by \
             ) \
             INSERT INTO inbox_finished (id, status, attempt, locked_by, last_error, processed_at) \
             SELECT id, {dead}, attempt, locked_by, $3, now() FROM dead"
        ),
        (
            bind::<BigInt, _>(id),
            bind::<diesel::sql_types::Uuid, _>(lease_token),
            bind::<Text, _>(truncate_error(error)),
        ),
    )
    .execute(conn)
    .await?;
    expect_all(updated, 1)
}

/// `processing -> ready` without spending the attempt: a worker shutting down gives back
/// rows it claimed but never started. Rows no longer held under the token are skipped;
/// returns how many were released.
///
/// The keys of the heads it gives back are locked first, in key order (`inbox_lock_keys`,
/// migration 21), as every writer of keys locks them: the trigger that settles a head's key
/// when it returns to ready (migration 21) locks each key as it comes to its row, in the order
/// of the rows, and an arrival holding one of those keys and waiting for another would
/// deadlock with it.
pub async fn release_unstarted(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    lease_token: Uuid,
) -> QueryResult<usize> {
    cached_sql(
        statuses_sql!(
            "WITH keys_locked AS MATERIALIZED ( \
                 SELECT inbox_lock_keys(ARRAY( \
                     SELECT held.ordering_key FROM inbox_queue AS held \
                     WHERE held.id = ANY($1) AND held.lease_token = $2 \
                       AND held.status + 0 = {processing} AND held.ordering_key IS NOT NULL \
                 )) \
             ) \
             UPDATE inbox_queue \
             SET status = {ready}, attempt = greatest(attempt - 1, 0), lease_token = NULL, \
                 locked_until = NULL \
             WHERE id = ANY($1) AND lease_token = $2 AND status + 0 = {processing} \
               AND (SELECT count(*) FROM keys_locked) = 1"
        ),
        (
            bind::<Array<BigInt>, _>(ids),
            bind::<diesel::sql_types::Uuid, _>(lease_token),
        ),
    )
    .execute(conn)
    .await
}

/// Extends the lease of rows still held under `lease_token` to `now() + lease` (the heartbeat
/// of long handlers). Returns how many rows are still held.
pub async fn extend_lease(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    lease_token: Uuid,
    lease: Duration,
) -> QueryResult<usize> {
    cached_sql(
        statuses_sql!(
            "UPDATE inbox_queue SET locked_until = now() + $3 * interval '1 millisecond' \
             WHERE id = ANY($1) AND lease_token = $2 AND status + 0 = {processing}"
        ),
        (
            bind::<Array<BigInt>, _>(ids),
            bind::<diesel::sql_types::Uuid, _>(lease_token),
            bind::<BigInt, _>(duration_millis(lease)),
        ),
    )
    .execute(conn)
    .await
}

/// Rows of [`extend_leases`] no longer held under their token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeasesNotHeld {
    /// Still in the queue, but ready again (rescued) or under another token: another
    /// attempt's now. Each with the token it was no longer held under: the attempts holding
    /// it under that token must stop, not one holding it under the new token.
    pub lost: Vec<(i64, Uuid)>,
    /// No longer in the queue: finished, by their own attempt committing at this very moment
    /// or by another worker. Their attempts learn which at their completion.
    pub finished: Vec<i64>,
}

/// The lease keeper's statement: extends to `now() + lease` the leases of every row in
/// `ids` still held under the token at the same position of `tokens` (the rows of all the
/// attempts a worker has in flight, whatever claim they came from), and returns those no
/// longer held under their token.
///
/// Locks: the rows it extends, `SKIP LOCKED`, until the statement commits. A row locked right
/// now is being retried or finished by its own attempt: it is left alone, and not reported,
/// since the check reads the statement's snapshot without locking.
///
/// Commits without waiting for its WAL flush, as the claim does: the completions of the rows
/// it locks would otherwise wait for that flush too. An extension lost in a crash only makes
/// leases end sooner, and a crash of the server ends every attempt in flight anyway.
pub async fn extend_leases(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    tokens: &[Uuid],
    lease: Duration,
) -> QueryResult<LeasesNotHeld> {
    #[derive(QueryableByName)]
    struct NotHeld {
        #[diesel(sql_type = BigInt)]
        id: i64,
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        token: Uuid,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        queued: bool,
    }
    if ids.is_empty() {
        return Ok(LeasesNotHeld::default());
    }
    let rows: Vec<NotHeld> = cached_sql(
        statuses_sql!(
            "WITH unflushed AS MATERIALIZED ( \
                 SELECT set_config('synchronous_commit', 'off', true) \
             ), held AS ( \
                 SELECT held.* FROM unflushed, \
                     unnest($1::bigint[], $2::uuid[]) AS held(id, token) \
             ), extended AS ( \
                 UPDATE inbox_queue AS queue \
                 SET locked_until = now() + $3 * interval '1 millisecond' \
                 WHERE queue.id = ANY(ARRAY( \
                     SELECT row.id FROM inbox_queue AS row \
                     JOIN held ON row.id = held.id AND row.lease_token = held.token \
                     WHERE row.id = ANY($1::bigint[]) AND row.status + 0 = {processing} \
                     FOR UPDATE OF row SKIP LOCKED \
                 )) \
                 RETURNING queue.id \
             ) \
             SELECT held.id, held.token, \
                    EXISTS (SELECT 1 FROM inbox_queue AS row WHERE row.id = held.id) AS queued \
             FROM held \
             WHERE NOT EXISTS ( \
                 SELECT 1 FROM inbox_queue AS row \
                 WHERE row.id = held.id AND row.lease_token = held.token \
                   AND row.id = ANY($1::bigint[]) AND row.status + 0 = {processing} \
             )"
        ),
        (
            bind::<Array<BigInt>, _>(ids),
            bind::<Array<diesel::sql_types::Uuid>, _>(tokens),
            bind::<BigInt, _>(duration_millis(lease)),
        ),
    )
    .load(conn)
    .await?;
    let (lost, finished): (Vec<NotHeld>, Vec<NotHeld>) =
        rows.into_iter().partition(|row| row.queued);
    Ok(LeasesNotHeld {
        lost: lost.into_iter().map(|row| (row.id, row.token)).collect(),
        finished: finished.into_iter().map(|row| row.id).collect(),
    })
}

/// What one rescue pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rescued {
    /// Expired leases put back to ready.
    pub requeued: usize,
    /// Expired leases that were out of attempts, dead-lettered.
    pub dead: usize,
}

#[derive(QueryableByName)]
struct RescuedCounts {
    #[diesel(sql_type = BigInt)]
    requeued: i64,
    #[diesel(sql_type = BigInt)]
    dead: i64,
}

/// Why a rescued row left processing, at the head of its `last_error`.
pub const RESCUE_REASON: &str = "lease expired: the worker crashed or stalled";

/// Returns rows whose lease expired (their worker crashed or stalled) to ready, due after the
/// backoff delay of the attempt that was cut short, with the handler's previous error kept
/// beside the rescue reason in `last_error`.
///
/// A rescue does not spend one of the event's attempts: when a worker dies abruptly, most of
/// the events it had in flight did not cause it, and must not reach dead sooner than their
/// own failures would take them there. It counts a rescue instead (`rescues`); the event that
/// has been rescued `policy.max_attempts` times (one that kills its worker every time) goes to
/// dead instead of looping forever.
///
/// Locks at most `limit` expired queue rows, `SKIP LOCKED`, so a completion in flight is never
/// waited on: its worker may still finish if it commits first. The ordering keys of those rows
/// are locked `SKIP LOCKED` too, before any row is written, and a row whose key someone else
/// holds (an arrival, a completion) is left for the next pass (a key without a row has nothing
/// to lock): the trigger that settles a
/// head's key when it returns to ready or leaves (migration 21) locks each key as it comes to
/// its row, in the order of the rows, and while this statement held the expired rows an
/// arrival holding one key and wanting another deadlocked with it. The ids are arrays
/// evaluated once, as in [`claim_due`], so the prepared statement's generic plan reads them by
/// primary key. Requeued rows stay in the queue; dead ones move to `inbox_finished`.
pub async fn rescue_expired(
    conn: &mut AsyncPgConnection,
    policy: &BackoffPolicy,
    limit: i64,
) -> QueryResult<Rescued> {
    let counts: RescuedCounts = cached_sql(
        statuses_sql!(
            "WITH expired AS MATERIALIZED ( \
                 SELECT ARRAY( \
                     SELECT id FROM inbox_queue \
                     WHERE status = {processing} AND locked_until < now() \
                     ORDER BY locked_until \
                     LIMIT $1 \
                     FOR UPDATE SKIP LOCKED \
                 ) AS ids \
             ), keys AS MATERIALIZED ( \
                 SELECT ARRAY( \
                     SELECT key.ordering_key FROM inbox_keys AS key \
                     WHERE key.ordering_key = ANY(ARRAY( \
                         SELECT queue.ordering_key FROM inbox_queue AS queue \
                         WHERE queue.id = ANY((SELECT ids FROM expired)::bigint[]) \
                           AND queue.ordering_key IS NOT NULL \
                     )) \
                     FOR NO KEY UPDATE OF key SKIP LOCKED \
                 ) AS locked \
             ), rescuable AS MATERIALIZED ( \
                 SELECT ARRAY( \
                     SELECT queue.id FROM inbox_queue AS queue \
                     WHERE queue.id = ANY((SELECT ids FROM expired)::bigint[]) \
                       AND (queue.ordering_key IS NULL \
                            OR queue.ordering_key = ANY((SELECT locked FROM keys)::text[]) \
                            OR NOT EXISTS (SELECT 1 FROM inbox_keys AS key \
                                           WHERE key.ordering_key = queue.ordering_key)) \
                 ) AS ids \
             ), requeued AS ( \
                 UPDATE inbox_queue AS queue \
                 SET status = {ready}, attempt = greatest(queue.attempt - 1, 0), \
                     rescues = queue.rescues + 1, \
                     next_attempt_at = now() + random() * least($3::float8, \
                         $4::float8 * power(2::float8, least(greatest(queue.attempt - 1, 0), 60))) \
                         * interval '1 millisecond', \
                     lease_token = NULL, locked_until = NULL, \
                     last_error = CASE \
                         WHEN queue.last_error IS NULL THEN $5 \
                         WHEN starts_with(queue.last_error, $5) THEN queue.last_error \
                         ELSE left($5 || ' (previous error: ' || queue.last_error || ')', $6) END \
                 WHERE queue.id = ANY((SELECT ids FROM rescuable)::bigint[]) \
                   AND queue.rescues + 1 < $2 \
                 RETURNING queue.id \
             ), dead AS ( \
                 DELETE FROM inbox_queue AS queue \
                 WHERE queue.id = ANY((SELECT ids FROM rescuable)::bigint[]) \
                   AND queue.rescues + 1 >= $2 \
                 RETURNING queue.id, queue.attempt, queue.locked_by, queue.last_error \
             ), finished AS ( \
                 INSERT INTO inbox_finished (id, status, attempt, locked_by, last_error, processed_at) \
                 SELECT id, {dead}, attempt, locked_by, CASE \
                         WHEN last_error IS NULL THEN $5 \
                         WHEN starts_with(last_error, $5) THEN last_error \
                         ELSE left($5 || ' (previous error: ' || last_error || ')', $6) END, \
                        now() \
                 FROM dead \
             ) \
             SELECT (SELECT count(*) FROM requeued) AS requeued, \
                    (SELECT count(*) FROM dead) AS dead"
        ),
        (
            bind::<BigInt, _>(limit),
            bind::<Integer, _>(i32::try_from(policy.max_attempts).unwrap_or(i32::MAX)),
            bind::<diesel::sql_types::Double, _>(policy.cap.as_secs_f64() * 1_000.0),
            bind::<diesel::sql_types::Double, _>(policy.base.as_secs_f64() * 1_000.0),
            bind::<Text, _>(RESCUE_REASON),
            bind::<Integer, _>(i32::try_from(super::MAX_ERROR_CHARS).unwrap_or(i32::MAX)),
        ),
    )
    .get_result(conn)
    .await?;
    Ok(Rescued {
        requeued: usize::try_from(counts.requeued).unwrap_or(0),
        dead: usize::try_from(counts.dead).unwrap_or(0),
    })
}

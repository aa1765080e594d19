//! Every query that writes `webhook_inbox`: ingest, claim, and one function per state
//! transition.
//!
//! Each transition out of `processing` is fenced by the lease token: it matches on
//! `(id, lease_token, status = processing)`, and zero rows updated is [`TransitionError::LeaseLost`],
//! never ignored. A worker whose lease expired and was taken over can therefore never
//! complete, retry or dead-letter a row it no longer owns.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bytea, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::prepared::{bind, cached_sql};
use crate::schema::webhook_inbox;
use crate::InboxStatus;

/// Longest `last_error` kept; error chains can be long and the row is read on every claim.
pub const MAX_ERROR_CHARS: usize = 2_000;

/// A verified webhook, ready to be stored.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// The configured provider name (the first half of the dedup key).
    pub provider: String,
    /// The provider's event id (the second half of the dedup key).
    pub event_id: String,
    /// The provider's event type, when it has one.
    pub event_type: Option<String>,
    /// The request headers to keep, as a JSON object of name to value.
    pub headers: serde_json::Value,
    /// The exact body bytes.
    pub body: Vec<u8>,
    /// SHA-256 of `body`.
    pub body_sha256: [u8; 32],
}

/// What storing one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    /// A new row was committed.
    Accepted,
    /// A row with the same `(provider, event_id)` already existed.
    Duplicate {
        /// Whether the stored body had the same SHA-256; `None` when the stored row was gone
        /// (purged) by the time it was read.
        same_body: Option<bool>,
    },
}

#[derive(QueryableByName)]
struct InsertedKey {
    #[diesel(sql_type = Text)]
    provider: String,
    #[diesel(sql_type = Text)]
    event_id: String,
}

#[derive(QueryableByName)]
struct StoredHash {
    #[diesel(sql_type = Text)]
    provider: String,
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = Bytea)]
    body_sha256: Vec<u8>,
}

/// Stores a batch of events in one statement, so one commit serves them all:
/// `INSERT ... ON CONFLICT (provider, event_id) DO NOTHING`. Duplicates within the batch are
/// folded before the insert. Returns one outcome per input event, in input order.
///
/// The insert is one implicit transaction: every outcome is durable when this returns `Ok`.
/// Only when some events were duplicates does a second statement read the stored rows' body
/// hashes, to tell a faithful redelivery from one whose body differs.
///
/// It does not wake the workers: see [`notify_new_events`], sent after the commit, because a
/// `NOTIFY` inside this transaction would serialise every ingest commit on PostgreSQL's
/// notification queue lock.
pub async fn insert_events(
    conn: &mut AsyncPgConnection,
    events: &[NewEvent],
) -> QueryResult<Vec<InsertOutcome>> {
    // Index of the first event with each key; later ones are duplicates of it.
    let mut first_of_key: HashMap<(&str, &str), usize> = HashMap::with_capacity(events.len());
    let mut unique: Vec<usize> = Vec::with_capacity(events.len());
    for (index, event) in events.iter().enumerate() {
        first_of_key
            .entry((event.provider.as_str(), event.event_id.as_str()))
            .or_insert_with(|| {
                unique.push(index);
                index
            });
    }
    // In key order, so that concurrent batches sharing keys (a provider's retries racing)
    // take their unique-index locks in the same order and cannot deadlock.
    unique.sort_unstable_by_key(|&i| (events[i].provider.as_str(), events[i].event_id.as_str()));

    let (providers, event_ids) = key_columns(events, &unique);
    let event_types: Vec<Option<&str>> = unique
        .iter()
        .map(|&i| events[i].event_type.as_deref())
        .collect();
    let headers: Vec<&serde_json::Value> = unique.iter().map(|&i| &events[i].headers).collect();
    let bodies: Vec<&[u8]> = unique.iter().map(|&i| events[i].body.as_slice()).collect();
    let hashes: Vec<&[u8]> = unique
        .iter()
        .map(|&i| events[i].body_sha256.as_slice())
        .collect();

    // Prepared once per connection: its plan (a function scan feeding the insert) is the same
    // whatever the arrays' sizes, so the generic plan PostgreSQL settles on is the right one.
    let inserted: Vec<InsertedKey> = cached_sql(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, headers, body, body_sha256) \
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::bytea[], $6::bytea[]) \
         ON CONFLICT (provider, event_id) DO NOTHING \
         RETURNING provider, event_id",
        (
            bind::<Array<Text>, _>(&providers),
            bind::<Array<Text>, _>(&event_ids),
            bind::<Array<Nullable<Text>>, _>(&event_types),
            bind::<Array<Jsonb>, _>(&headers),
            bind::<Array<Bytea>, _>(&bodies),
            bind::<Array<Bytea>, _>(&hashes),
        ),
    )
    .load(conn)
    .await?;
    let inserted: HashSet<(&str, &str)> = inserted
        .iter()
        .map(|key| (key.provider.as_str(), key.event_id.as_str()))
        .collect();

    let duplicates: Vec<usize> = unique
        .iter()
        .copied()
        .filter(|&i| {
            !inserted.contains(&(events[i].provider.as_str(), events[i].event_id.as_str()))
        })
        .collect();
    let stored_hashes = if duplicates.is_empty() {
        Vec::new()
    } else {
        let (providers, event_ids) = key_columns(events, &duplicates);
        cached_sql(
            "SELECT inbox.provider, inbox.event_id, inbox.body_sha256 \
             FROM unnest($1::text[], $2::text[]) AS input(provider, event_id) \
             JOIN webhook_inbox AS inbox USING (provider, event_id)",
            (
                bind::<Array<Text>, _>(&providers),
                bind::<Array<Text>, _>(&event_ids),
            ),
        )
        .load::<StoredHash>(conn)
        .await?
    };
    let stored_hashes: HashMap<(&str, &str), &[u8]> = stored_hashes
        .iter()
        .map(|row| {
            (
                (row.provider.as_str(), row.event_id.as_str()),
                row.body_sha256.as_slice(),
            )
        })
        .collect();

    Ok(events
        .iter()
        .enumerate()
        .map(|(index, event)| {
            let key = (event.provider.as_str(), event.event_id.as_str());
            let first = first_of_key[&key];
            if first == index && inserted.contains(&key) {
                InsertOutcome::Accepted
            } else if first == index {
                InsertOutcome::Duplicate {
                    // Gone again (purged) between the insert and the read: unknown.
                    same_body: stored_hashes
                        .get(&key)
                        .map(|&stored| stored == event.body_sha256),
                }
            } else {
                InsertOutcome::Duplicate {
                    same_body: Some(events[first].body_sha256 == event.body_sha256),
                }
            }
        })
        .collect())
}

/// The `provider` and `event_id` columns of the events at `indices`, to bind as arrays.
fn key_columns<'e>(events: &'e [NewEvent], indices: &[usize]) -> (Vec<&'e str>, Vec<&'e str>) {
    indices
        .iter()
        .map(|&i| (events[i].provider.as_str(), events[i].event_id.as_str()))
        .unzip()
}

/// Wakes the workers that `LISTEN` on [`crate::NOTIFY_CHANNEL`]: new events are committed.
///
/// Its own statement and commit. Every notifying commit takes PostgreSQL's global
/// notification queue lock, so callers coalesce: one notification for whatever was committed
/// while the previous one was in flight.
pub async fn notify_new_events(conn: &mut AsyncPgConnection) -> QueryResult<()> {
    diesel::sql_query("SELECT pg_notify($1, '')")
        .bind::<Text, _>(crate::NOTIFY_CHANNEL)
        .execute(conn)
        .await
        .map(|_| ())
}

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
/// lease: `status = processing`, `attempt + 1`, `locked_until = now() + lease`.
///
/// Locks: the rows are selected `FOR UPDATE SKIP LOCKED`, so concurrent claimers never wait on
/// each other nor take the same row; the locks end when the statement's transaction commits,
/// right away. The lease, not a row lock, protects the row while the handler runs.
///
/// The due ids are collected into an array first, evaluated once, and the rows updated by
/// primary key. Joined to a subquery (or to a materialized CTE) instead, the statement has a
/// generic plan that scans the whole table, done rows included, because the planner cannot
/// see the `LIMIT`: should PostgreSQL switch the prepared statement to that plan, claims
/// would slow down as the table grows.
pub async fn claim_due(
    conn: &mut AsyncPgConnection,
    worker_name: &str,
    lease: Duration,
    limit: i64,
) -> QueryResult<Claim> {
    let lease_token = Uuid::new_v4();
    let events = cached_sql(
        "UPDATE webhook_inbox AS inbox \
         SET status = 1, attempt = inbox.attempt + 1, lease_token = $1, locked_by = $2, \
             locked_until = now() + $3 * interval '1 millisecond' \
         WHERE inbox.id = ANY(ARRAY( \
             SELECT id FROM webhook_inbox \
             WHERE status = 0 AND next_attempt_at <= now() \
             ORDER BY next_attempt_at \
             LIMIT $4 \
             FOR UPDATE SKIP LOCKED \
         )) \
         RETURNING inbox.id, inbox.provider, inbox.event_id, inbox.event_type, inbox.received_at, \
                   inbox.headers, inbox.body, inbox.attempt",
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

/// The rows a lease holder may transition: this id, this token, still processing.
#[diesel::dsl::auto_type]
fn fenced(id: i64, token: Uuid) -> _ {
    let status: InboxStatus = InboxStatus::Processing;
    webhook_inbox::table
        .filter(webhook_inbox::id.eq(id))
        .filter(webhook_inbox::lease_token.eq(token))
        .filter(webhook_inbox::status.eq(status))
}

fn expect_one(updated: usize) -> Result<(), TransitionError> {
    if updated == 1 {
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
/// batched form of [`complete`]. Unless every row is still held, nothing is completed and
/// the caller's transaction must roll back ([`TransitionError::LeaseLost`]).
pub async fn complete_all(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    lease_token: Uuid,
) -> Result<(), TransitionError> {
    if ids.is_empty() {
        return Ok(());
    }
    let updated = cached_sql(
        "UPDATE webhook_inbox \
         SET status = 2, processed_at = clock_timestamp(), lease_token = NULL, locked_until = NULL, last_error = NULL \
         WHERE id = ANY($1) AND lease_token = $2 AND status = 1",
        (
            bind::<Array<BigInt>, _>(ids),
            bind::<diesel::sql_types::Uuid, _>(lease_token),
        ),
    )
    .execute(conn)
    .await?;
    if updated == ids.len() {
        Ok(())
    } else {
        Err(TransitionError::LeaseLost)
    }
}

/// `processing -> ready` after a retryable failure, due again after `delay`.
pub async fn schedule_retry(
    conn: &mut AsyncPgConnection,
    id: i64,
    lease_token: Uuid,
    delay: Duration,
    error: &str,
) -> Result<(), TransitionError> {
    let updated = diesel::sql_query(
        "UPDATE webhook_inbox \
         SET status = 0, next_attempt_at = now() + $3 * interval '1 millisecond', \
             lease_token = NULL, locked_until = NULL, last_error = $4 \
         WHERE id = $1 AND lease_token = $2 AND status = 1",
    )
    .bind::<BigInt, _>(id)
    .bind::<diesel::sql_types::Uuid, _>(lease_token)
    .bind::<BigInt, _>(duration_millis(delay))
    .bind::<Text, _>(truncate_error(error))
    .execute(conn)
    .await?;
    expect_one(updated)
}

/// `processing -> dead`: a permanent failure, or the last attempt failed.
pub async fn dead_letter(
    conn: &mut AsyncPgConnection,
    id: i64,
    lease_token: Uuid,
    error: &str,
) -> Result<(), TransitionError> {
    let updated = diesel::update(fenced(id, lease_token))
        .set((
            webhook_inbox::status.eq(InboxStatus::Dead),
            webhook_inbox::processed_at.eq(diesel::dsl::now),
            webhook_inbox::lease_token.eq(None::<Uuid>),
            webhook_inbox::locked_until.eq(None::<DateTime<Utc>>),
            webhook_inbox::last_error.eq(truncate_error(error)),
        ))
        .execute(conn)
        .await?;
    expect_one(updated)
}

/// `processing -> ready` without spending the attempt: a worker shutting down gives back
/// rows it claimed but never started. Rows no longer held under the token are skipped;
/// returns how many were released.
pub async fn release_unstarted(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    lease_token: Uuid,
) -> QueryResult<usize> {
    diesel::sql_query(
        "UPDATE webhook_inbox \
         SET status = 0, attempt = greatest(attempt - 1, 0), lease_token = NULL, locked_until = NULL \
         WHERE id = ANY($1) AND lease_token = $2 AND status = 1",
    )
    .bind::<Array<BigInt>, _>(ids)
    .bind::<diesel::sql_types::Uuid, _>(lease_token)
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
    diesel::sql_query(
        "UPDATE webhook_inbox SET locked_until = now() + $3 * interval '1 millisecond' \
         WHERE id = ANY($1) AND lease_token = $2 AND status = 1",
    )
    .bind::<Array<BigInt>, _>(ids)
    .bind::<diesel::sql_types::Uuid, _>(lease_token)
    .bind::<BigInt, _>(duration_millis(lease))
    .execute(conn)
    .await
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
struct RescuedRow {
    #[diesel(sql_type = SmallInt)]
    status: InboxStatus,
}

/// Returns rows whose lease expired (their worker crashed or stalled) to ready, or to dead
/// when that expired attempt was their last: a crash counts as an attempt, so an event that
/// kills its worker every time ends dead instead of looping forever.
///
/// Locks at most `limit` expired rows, `SKIP LOCKED`, so a completion in flight is never
/// waited on: its worker may still finish if it commits first.
pub async fn rescue_expired(
    conn: &mut AsyncPgConnection,
    max_attempts: u32,
    limit: i64,
) -> QueryResult<Rescued> {
    let rows: Vec<RescuedRow> = diesel::sql_query(
        "UPDATE webhook_inbox AS inbox \
         SET status = CASE WHEN inbox.attempt >= $1 THEN 3 ELSE 0 END, \
             processed_at = CASE WHEN inbox.attempt >= $1 THEN now() END, \
             next_attempt_at = now(), lease_token = NULL, locked_until = NULL, \
             last_error = 'lease expired: the worker crashed or stalled' \
         FROM ( \
             SELECT id FROM webhook_inbox \
             WHERE status = 1 AND locked_until < now() \
             ORDER BY locked_until \
             LIMIT $2 \
             FOR UPDATE SKIP LOCKED \
         ) AS expired \
         WHERE inbox.id = expired.id \
         RETURNING inbox.status",
    )
    .bind::<Integer, _>(i32::try_from(max_attempts).unwrap_or(i32::MAX))
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await?;
    let dead = rows
        .iter()
        .filter(|row| row.status == InboxStatus::Dead)
        .count();
    Ok(Rescued {
        requeued: rows.len() - dead,
        dead,
    })
}

fn duration_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Keeps `error` within [`MAX_ERROR_CHARS`], on a character boundary.
fn truncate_error(error: &str) -> &str {
    match error.char_indices().nth(MAX_ERROR_CHARS) {
        Some((byte_index, _)) => &error[..byte_index],
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_errors_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_ERROR_CHARS + 10);
        assert_eq!(truncate_error(&long).chars().count(), MAX_ERROR_CHARS);
        assert_eq!(truncate_error("short"), "short");
    }
}

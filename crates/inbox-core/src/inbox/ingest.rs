//! The receiver's side of the inbox: storing verified events, deduplicated by
//! `(provider, event_id)`, and waking the workers once they are committed.

use std::collections::{HashMap, HashSet};

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bytea, Jsonb, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::prepared::{bind, cached_sql};

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
    /// Its place among its key's events, when its provider orders them.
    pub ordering: Option<EventOrdering>,
}

/// Where an event of an ordered provider stands among the events of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventOrdering {
    /// The ordering key, scoped by provider: `provider:value` (see [`ordering_key`]).
    pub key: String,
    /// The provider's sequence (a timestamp or version); 0 when the provider has none, so
    /// arrival order decides.
    pub sequence: i64,
    /// How long after receipt the event waits before it may be claimed (the provider's
    /// reorder window), so that an earlier event still in flight can slot in before it.
    pub hold: std::time::Duration,
}

/// The stored ordering key of `value` for `provider`: provider names never contain `:`.
pub fn ordering_key(provider: &str, value: &str) -> String {
    format!("{provider}:{value}")
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
/// `INSERT INTO inbox_dedup ... ON CONFLICT (provider, event_id) DO NOTHING`, and for each key
/// inserted its journal row in `inbox_events` and a ready `inbox_queue` row. Duplicates within the batch are
/// folded before the insert. Returns one outcome per input event, in input order.
///
/// The insert is one implicit transaction: every outcome is durable when this returns `Ok`.
/// Only when some events were duplicates does a second statement read the stored keys' body
/// hashes, to tell a faithful redelivery from one whose body differs.
///
/// It does not wake the workers: see [`notify_new_events`], sent after the commit, because a
/// `NOTIFY` inside this transaction would serialise every ingest commit on PostgreSQL's
/// notification queue lock.
pub async fn insert_events(
    conn: &mut AsyncPgConnection,
    events: &[NewEvent],
) -> QueryResult<Vec<InsertOutcome>> {
    let (first_of_key, unique) = first_of_each_key(events);
    let columns = InsertColumns::of(events, &unique);
    // Prepared once per connection: its plan (function scans feeding the inserts) is the same
    // whatever the arrays' sizes, so the generic plan PostgreSQL settles on is the right one.
    let inserted: Vec<InsertedKey> = cached_sql(
        INSERT_EVENTS,
        (
            bind::<Array<Text>, _>(&columns.providers),
            bind::<Array<Text>, _>(&columns.event_ids),
            bind::<Array<Nullable<Text>>, _>(&columns.event_types),
            bind::<Array<Jsonb>, _>(&columns.headers),
            bind::<Array<Bytea>, _>(&columns.bodies),
            bind::<Array<Bytea>, _>(&columns.hashes),
            bind::<Array<Nullable<Text>>, _>(&columns.ordering_keys),
            bind::<Array<Nullable<BigInt>>, _>(&columns.sequences),
            bind::<Array<BigInt>, _>(&columns.holds),
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
            "SELECT stored.provider, stored.event_id, stored.body_sha256 \
             FROM unnest($1::text[], $2::text[]) AS input(provider, event_id) \
             JOIN inbox_dedup AS stored USING (provider, event_id)",
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

/// The insert of [`insert_events`]: the key first, since it is what deduplicates across the
/// journal's days and hands out the id; then, for the keys inserted, the journal row and the
/// queue row (ready, due now, or after its reorder window; with its ordering key and sequence,
/// if any).
const INSERT_EVENTS: &str = "WITH input AS ( \
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::bytea[], \
                              $6::bytea[], $7::text[], $8::bigint[], $9::bigint[]) \
             AS input(provider, event_id, event_type, headers, body, body_sha256, \
                      ordering_key, ordering_sequence, hold_ms) \
     ), keyed AS ( \
         INSERT INTO inbox_dedup (provider, event_id, body_sha256) \
         SELECT provider, event_id, body_sha256 FROM input \
         ON CONFLICT (provider, event_id) DO NOTHING \
         RETURNING id, provider, event_id \
     ), journaled AS ( \
         INSERT INTO inbox_events (id, provider, event_id, event_type, headers, body, body_sha256) \
         SELECT keyed.id, input.provider, input.event_id, input.event_type, input.headers, \
                input.body, input.body_sha256 \
         FROM keyed JOIN input USING (provider, event_id) \
     ), queued AS ( \
         INSERT INTO inbox_queue (id, ordering_key, ordering_sequence, next_attempt_at) \
         SELECT keyed.id, input.ordering_key, input.ordering_sequence, \
                now() + input.hold_ms * interval '1 millisecond' \
         FROM keyed JOIN input USING (provider, event_id) \
     ) \
     SELECT provider, event_id FROM keyed";

/// The index of the first event of each `(provider, event_id)` (later ones are duplicates of
/// it), and those first events' indices in key order, so that concurrent batches sharing keys
/// (a provider's retries racing) take their unique-index locks in the same order and cannot
/// deadlock.
fn first_of_each_key(events: &[NewEvent]) -> (HashMap<(&str, &str), usize>, Vec<usize>) {
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
    unique.sort_unstable_by_key(|&i| (events[i].provider.as_str(), events[i].event_id.as_str()));
    (first_of_key, unique)
}

/// The parameters of [`INSERT_EVENTS`] for the events at some indices, one array per column.
struct InsertColumns<'e> {
    providers: Vec<&'e str>,
    event_ids: Vec<&'e str>,
    event_types: Vec<Option<&'e str>>,
    headers: Vec<&'e serde_json::Value>,
    bodies: Vec<&'e [u8]>,
    hashes: Vec<&'e [u8]>,
    ordering_keys: Vec<Option<&'e str>>,
    sequences: Vec<Option<i64>>,
    holds: Vec<i64>,
}

impl<'e> InsertColumns<'e> {
    fn of(events: &'e [NewEvent], indices: &[usize]) -> Self {
        let (providers, event_ids) = key_columns(events, indices);
        let chosen = || indices.iter().map(|&i| &events[i]);
        let ordering = || chosen().map(|event| event.ordering.as_ref());
        Self {
            providers,
            event_ids,
            event_types: chosen().map(|event| event.event_type.as_deref()).collect(),
            headers: chosen().map(|event| &event.headers).collect(),
            bodies: chosen().map(|event| event.body.as_slice()).collect(),
            hashes: chosen().map(|event| event.body_sha256.as_slice()).collect(),
            ordering_keys: ordering().map(|o| o.map(|o| o.key.as_str())).collect(),
            sequences: ordering().map(|o| o.map(|o| o.sequence)).collect(),
            holds: ordering()
                .map(|o| o.map_or(0, |o| super::duration_millis(o.hold)))
                .collect(),
        }
    }
}

/// Runs the insert of [`insert_events`] for `events` on a driver-level client, in a
/// transaction that is rolled back whatever happens, and returns its error if it fails: the
/// way to learn the SQLSTATE of a failure that diesel-async reports without it (its error
/// kinds name a few codes of class 23 and a few others, and a data exception, class 22, comes
/// back as an unknown kind with only its message, which the server's `lc_messages` may
/// translate). It locks what the insert locks, until it rolls back; `timeout` bounds it on the
/// server (`statement_timeout` and `lock_timeout`), so a rehearsal given up by its caller does
/// not go on waiting there.
pub async fn rehearse_insert(
    client: &mut tokio_postgres::Client,
    events: &[NewEvent],
    timeout: std::time::Duration,
) -> Result<(), tokio_postgres::Error> {
    use tokio_postgres::types::{Json, ToSql};
    let (_, unique) = first_of_each_key(events);
    let columns = InsertColumns::of(events, &unique);
    let headers: Vec<Json<&serde_json::Value>> =
        columns.headers.iter().copied().map(Json).collect();
    let transaction = client.transaction().await?;
    let millis = super::duration_millis(timeout).max(1);
    transaction
        .batch_execute(&format!(
            "SET LOCAL statement_timeout = {millis}; SET LOCAL lock_timeout = {millis}"
        ))
        .await?;
    let parameters: [&(dyn ToSql + Sync); 9] = [
        &columns.providers,
        &columns.event_ids,
        &columns.event_types,
        &headers,
        &columns.bodies,
        &columns.hashes,
        &columns.ordering_keys,
        &columns.sequences,
        &columns.holds,
    ];
    // The driver's own `execute`, not diesel's, which would return the error without its code.
    tokio_postgres::Transaction::execute(&transaction, INSERT_EVENTS, &parameters).await?;
    transaction.rollback().await
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
    cached_sql(
        "SELECT pg_notify($1, '')",
        (bind::<Text, _>(crate::NOTIFY_CHANNEL),),
    )
    .execute(conn)
    .await
    .map(|_| ())
}

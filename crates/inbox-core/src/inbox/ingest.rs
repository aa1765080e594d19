//! The receiver's side of the inbox: storing verified events, deduplicated by
//! `(provider, event_id)`, and waking the workers once they are committed.

use std::collections::{HashMap, HashSet};

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bytea, Jsonb, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use sha2::{Digest, Sha256};

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
    /// Whether a copy of an earlier event under another id is recognised as a replay, kept
    /// apart and never handed to a handler, and how.
    pub replays: ReplayCheck,
}

/// How a copy of an earlier delivery sent under a new event id is recognised, for providers
/// whose signature does not cover the event id. A copy is kept as a suppressed replay (answered
/// like any event, never handed to a handler) for as long as its original's dedup key lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ReplayCheck {
    /// Not checked: the signature covers the id (a copy is a duplicate already), or the
    /// provider legitimately sends one body more than once.
    #[default]
    Off,
    /// The same type and body as an event stored before ([`replay_key`]): the signature covers
    /// the body but not the id.
    SameBody,
    /// The same signed nonce as an event stored before ([`nonce_replay_key`]): the signature
    /// covers that single-use value but neither the body nor the id (Mailgun's token).
    SameNonce(String),
}

impl ReplayCheck {
    /// The replay key of `event` under this check, if any.
    fn key(&self, event: &NewEvent) -> Option<[u8; 32]> {
        match self {
            Self::Off => None,
            Self::SameBody => Some(replay_key(
                &event.provider,
                event.event_type.as_deref(),
                &event.body_sha256,
            )),
            Self::SameNonce(nonce) => Some(nonce_replay_key(&event.provider, nonce)),
        }
    }
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

/// The replay key of an event whose provider suppresses replays: SHA-256 of its provider, its
/// type (empty when none) and its body's SHA-256, each length-prefixed so that no two triples
/// share a key. Unique among the dedup keys (`inbox_dedup_replay_key`), so a second event with
/// the same one conflicts at insert.
pub fn replay_key(provider: &str, event_type: Option<&str>, body_sha256: &[u8; 32]) -> [u8; 32] {
    let mut digest = Sha256::new();
    for part in [
        provider.as_bytes(),
        event_type.unwrap_or_default().as_bytes(),
    ] {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    digest.update(body_sha256);
    digest.finalize().into()
}

/// The replay key of an event whose provider signs a nonce and not the id
/// ([`ReplayCheck::SameNonce`]): SHA-256 of its provider, length-prefixed, then `u64::MAX` (a
/// length no type has, so no nonce key is ever a [`replay_key`]), then the nonce.
pub fn nonce_replay_key(provider: &str, nonce: &str) -> [u8; 32] {
    let mut digest = Sha256::new();
    digest.update((provider.len() as u64).to_be_bytes());
    digest.update(provider.as_bytes());
    digest.update(u64::MAX.to_be_bytes());
    digest.update(nonce.as_bytes());
    digest.finalize().into()
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
    /// It copies an event stored already under another id ([`NewEvent::replays`]): kept in
    /// `inbox_suppressed_replays` under its own dedup key, not queued, until an operator
    /// releases it ([`crate::replays`]).
    SuppressedReplay {
        /// The event first stored with the body.
        original_id: i64,
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
struct SuppressedKey {
    #[diesel(sql_type = Text)]
    provider: String,
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = BigInt)]
    original_id: i64,
    /// False when its id was stored meanwhile (a concurrent delivery of the same event).
    #[diesel(sql_type = diesel::sql_types::Bool)]
    kept: bool,
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
/// `INSERT INTO inbox_dedup ... ON CONFLICT DO NOTHING`, and for each key inserted its journal
/// row in `inbox_events` and a ready `inbox_queue` row. Duplicates within the batch are folded
/// before the insert. Returns one outcome per input event, in input order.
///
/// The insert is one implicit transaction: every outcome is durable when this returns `Ok`.
/// Only when some events were not inserted does a second statement read the stored keys' body
/// hashes, to tell a faithful redelivery from one whose body differs; and only when some of
/// them conflicted on their replay key instead does a third store them as suppressed replays.
///
/// It does not wake the workers: see [`notify_new_events`], sent after the commit, because a
/// `NOTIFY` inside this transaction would serialise every ingest commit on PostgreSQL's
/// notification queue lock.
pub async fn insert_events(
    conn: &mut AsyncPgConnection,
    events: &[NewEvent],
) -> QueryResult<Vec<InsertOutcome>> {
    let (first_of_key, unique) = first_of_each_key(events);

    let mut outcomes: HashMap<(&str, &str), InsertOutcome> = HashMap::with_capacity(unique.len());
    let mut pending = unique;
    // A replay whose original is purged between the insert and the read of the original is
    // inserted again, now as a new event; a second such race in a row is beyond reason.
    for _pass in 0..2 {
        pending = insert_pass(conn, events, &pending, &mut outcomes).await?;
        if pending.is_empty() {
            break;
        }
    }

    Ok(events
        .iter()
        .enumerate()
        .map(|(index, event)| {
            let key = (event.provider.as_str(), event.event_id.as_str());
            let first = first_of_key[&key];
            if first == index {
                // Gone again (purged) between the insert and the read: unknown.
                outcomes
                    .get(&key)
                    .copied()
                    .unwrap_or(InsertOutcome::Duplicate { same_body: None })
            } else {
                InsertOutcome::Duplicate {
                    same_body: Some(events[first].body_sha256 == event.body_sha256),
                }
            }
        })
        .collect())
}

/// One insert of the events at `indices` (unique keys, in key order), recording their
/// outcomes. Returns the events to insert again: replays whose original was gone by the time
/// it was read.
async fn insert_pass<'e>(
    conn: &mut AsyncPgConnection,
    events: &'e [NewEvent],
    indices: &[usize],
    outcomes: &mut HashMap<(&'e str, &'e str), InsertOutcome>,
) -> QueryResult<Vec<usize>> {
    let columns = InsertColumns::of(events, indices);
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
            bind::<Array<Nullable<Bytea>>, _>(&columns.replay_key_binds()),
        ),
    )
    .load(conn)
    .await?;
    let inserted: HashSet<(&str, &str)> = inserted
        .iter()
        .map(|key| (key.provider.as_str(), key.event_id.as_str()))
        .collect();
    let key_of = |i: usize| (events[i].provider.as_str(), events[i].event_id.as_str());

    let not_inserted: Vec<usize> = indices
        .iter()
        .copied()
        .filter(|&i| !inserted.contains(&key_of(i)))
        .collect();
    let stored_hashes = if not_inserted.is_empty() {
        Vec::new()
    } else {
        let (providers, event_ids) = key_columns(events, &not_inserted);
        // Each key read through the primary key, in a `LATERAL` subquery with a `LIMIT` the
        // planner cannot turn into a join: joined plainly, a plan made while `inbox_dedup`
        // looked empty read every stored key for each batch holding a duplicate.
        cached_sql(
            "SELECT input.provider, input.event_id, stored.body_sha256 \
             FROM unnest($1::text[], $2::text[]) AS input(provider, event_id) \
             CROSS JOIN LATERAL ( \
                 SELECT body_sha256 FROM inbox_dedup \
                 WHERE inbox_dedup.provider = input.provider \
                   AND inbox_dedup.event_id = input.event_id \
                 LIMIT 1 \
             ) AS stored",
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

    // Not inserted and not stored under their id: a guarded event conflicted on its replay key.
    let mut replays = Vec::new();
    for (position, &i) in indices.iter().enumerate() {
        let key = key_of(i);
        if inserted.contains(&key) {
            outcomes.insert(key, InsertOutcome::Accepted);
        } else if let Some(&stored) = stored_hashes.get(&key) {
            let same_body = Some(stored == events[i].body_sha256);
            outcomes.insert(key, InsertOutcome::Duplicate { same_body });
        } else if let Some(replay_key) = columns.replay_keys[position] {
            replays.push((i, replay_key));
        } else {
            outcomes.insert(key, InsertOutcome::Duplicate { same_body: None });
        }
    }
    if replays.is_empty() {
        return Ok(Vec::new());
    }
    let suppressed = store_suppressed_replays(conn, events, &replays).await?;
    let suppressed: HashMap<(&str, &str), &SuppressedKey> = suppressed
        .iter()
        .map(|row| ((row.provider.as_str(), row.event_id.as_str()), row))
        .collect();
    let mut again = Vec::new();
    for (i, _) in replays {
        let key = key_of(i);
        let outcome = match suppressed.get(&key) {
            Some(row) if row.kept => InsertOutcome::SuppressedReplay {
                original_id: row.original_id,
            },
            // Its id was stored meanwhile, by a concurrent delivery of the same event.
            Some(_) => InsertOutcome::Duplicate { same_body: None },
            None => {
                again.push(i);
                continue;
            }
        };
        outcomes.insert(key, outcome);
    }
    Ok(again)
}

/// Stores events that conflicted on their replay key as suppressed replays of the event
/// holding that key: a dedup key of their own (no replay key, so it conflicts with nothing
/// else) and a row in `inbox_suppressed_replays`, in one statement. Returns a row for each
/// event whose original was found; one whose original is gone (purged since the insert) has
/// none.
async fn store_suppressed_replays(
    conn: &mut AsyncPgConnection,
    events: &[NewEvent],
    replays: &[(usize, [u8; 32])],
) -> QueryResult<Vec<SuppressedKey>> {
    let indices: Vec<usize> = replays.iter().map(|&(i, _)| i).collect();
    let (providers, event_ids) = key_columns(events, &indices);
    let event_types: Vec<Option<&str>> = indices
        .iter()
        .map(|&i| events[i].event_type.as_deref())
        .collect();
    let headers: Vec<&serde_json::Value> = indices.iter().map(|&i| &events[i].headers).collect();
    let bodies: Vec<&[u8]> = indices.iter().map(|&i| events[i].body.as_slice()).collect();
    let hashes: Vec<&[u8]> = indices
        .iter()
        .map(|&i| events[i].body_sha256.as_slice())
        .collect();
    let ordering_keys: Vec<Option<&str>> = indices
        .iter()
        .map(|&i| events[i].ordering.as_ref().map(|o| o.key.as_str()))
        .collect();
    let sequences: Vec<Option<i64>> = indices
        .iter()
        .map(|&i| events[i].ordering.as_ref().map(|o| o.sequence))
        .collect();
    let replay_keys: Vec<&[u8]> = replays.iter().map(|(_, key)| key.as_slice()).collect();
    let stored: Vec<SuppressedKey> = cached_sql(
        "WITH input AS ( \
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::bytea[], \
                                  $6::bytea[], $7::text[], $8::bigint[], $9::bytea[]) \
                 AS input(provider, event_id, event_type, headers, body, body_sha256, \
                          ordering_key, ordering_sequence, replay_key) \
         ), originals AS ( \
             SELECT input.provider, input.event_id, original.id AS original_id \
             FROM input JOIN inbox_dedup AS original ON original.replay_key = input.replay_key \
         ), keyed AS ( \
             INSERT INTO inbox_dedup (provider, event_id, body_sha256) \
             SELECT input.provider, input.event_id, input.body_sha256 \
             FROM input JOIN originals USING (provider, event_id) \
             ON CONFLICT (provider, event_id) DO NOTHING \
             RETURNING id, provider, event_id \
         ), kept AS ( \
             INSERT INTO inbox_suppressed_replays (id, provider, event_id, event_type, headers, \
                                                   body, body_sha256, ordering_key, \
                                                   ordering_sequence, original_id) \
             SELECT keyed.id, input.provider, input.event_id, input.event_type, input.headers, \
                    input.body, input.body_sha256, input.ordering_key, input.ordering_sequence, \
                    originals.original_id \
             FROM keyed JOIN input USING (provider, event_id) \
                        JOIN originals USING (provider, event_id) \
         ) \
         SELECT originals.provider, originals.event_id, originals.original_id, \
                keyed.id IS NOT NULL AS kept \
         FROM originals LEFT JOIN keyed USING (provider, event_id)",
        (
            bind::<Array<Text>, _>(&providers),
            bind::<Array<Text>, _>(&event_ids),
            bind::<Array<Nullable<Text>>, _>(&event_types),
            bind::<Array<Jsonb>, _>(&headers),
            bind::<Array<Bytea>, _>(&bodies),
            bind::<Array<Bytea>, _>(&hashes),
            bind::<Array<Nullable<Text>>, _>(&ordering_keys),
            bind::<Array<Nullable<BigInt>>, _>(&sequences),
            bind::<Array<Bytea>, _>(&replay_keys),
        ),
    )
    .load(conn)
    .await?;
    Ok(stored)
}

/// The insert of [`insert_events`]: the key first, since it is what deduplicates across the
/// journal's days (by id, and for guarded providers by replay key: no conflict target, so
/// either conflict skips the row) and hands out the id; then, for the keys inserted, the
/// journal row and the queue row (ready, due now, or after its reorder window; with its
/// ordering key and sequence, if any).
const INSERT_EVENTS: &str = "WITH input AS ( \
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::bytea[], \
                              $6::bytea[], $7::text[], $8::bigint[], $9::bigint[], \
                              $10::bytea[]) \
             AS input(provider, event_id, event_type, headers, body, body_sha256, \
                      ordering_key, ordering_sequence, hold_ms, replay_key) \
     ), keyed AS ( \
         INSERT INTO inbox_dedup (provider, event_id, body_sha256, replay_key) \
         SELECT provider, event_id, body_sha256, replay_key FROM input \
         ON CONFLICT DO NOTHING \
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
    /// Set for the events whose provider suppresses replays (see [`replay_key`]).
    replay_keys: Vec<Option<[u8; 32]>>,
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
            replay_keys: chosen().map(|event| event.replays.key(event)).collect(),
        }
    }

    /// The replay keys as the insert binds them.
    fn replay_key_binds(&self) -> Vec<Option<&[u8]>> {
        self.replay_keys
            .iter()
            .map(|key| key.as_ref().map(<[u8; 32]>::as_slice))
            .collect()
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
    let replay_keys = columns.replay_key_binds();
    let parameters: [&(dyn ToSql + Sync); 10] = [
        &columns.providers,
        &columns.event_ids,
        &columns.event_types,
        &headers,
        &columns.bodies,
        &columns.hashes,
        &columns.ordering_keys,
        &columns.sequences,
        &columns.holds,
        &replay_keys,
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

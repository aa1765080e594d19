//! Suppressed replays: events of a provider whose signature does not cover the event id,
//! stored with a body (for Mailgun, a signed token) that was already stored under another id
//! (see [`crate::inbox::ReplayCheck`]). They keep their dedup key, so a redelivery of their id is a
//! duplicate, and wait in `inbox_suppressed_replays`, never queued, until an operator releases
//! one or the retention deletes it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// One suppressed replay, without its body.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct SuppressedReplay {
    /// Its id (from its dedup key); the id it gets in the journal once released.
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    /// Provider.
    #[diesel(sql_type = Text)]
    pub provider: String,
    /// The id it was delivered under.
    #[diesel(sql_type = Text)]
    pub event_id: String,
    /// Its type, when it has one.
    #[diesel(sql_type = Nullable<Text>)]
    pub event_type: Option<String>,
    /// When it arrived.
    #[diesel(sql_type = Timestamptz)]
    pub received_at: DateTime<Utc>,
    /// Body size in bytes.
    #[diesel(sql_type = BigInt)]
    pub body_bytes: i64,
    /// The event first stored with the same body.
    #[diesel(sql_type = BigInt)]
    pub original_id: i64,
    /// The original's id as its provider sent it; `None` once the original is purged.
    #[diesel(sql_type = Nullable<Text>)]
    pub original_event_id: Option<String>,
}

/// The newest `limit` suppressed replays of `provider` (all when `None`) received since
/// `since` (all when `None`), newest first. Reads the `(provider, received_at)` or
/// `received_at` index, and each original from the journal by its id (`inbox_dedup` has no
/// index by id); takes no lock.
pub async fn list(
    conn: &mut AsyncPgConnection,
    provider: Option<&str>,
    since: Option<DateTime<Utc>>,
    limit: i64,
) -> QueryResult<Vec<SuppressedReplay>> {
    diesel::sql_query(
        "SELECT replay.id, replay.provider, replay.event_id, replay.event_type, \
                replay.received_at, octet_length(replay.body)::bigint AS body_bytes, \
                replay.original_id, original.event_id AS original_event_id \
         FROM inbox_suppressed_replays AS replay \
         LEFT JOIN LATERAL ( \
             SELECT event.event_id FROM inbox_events AS event \
             WHERE event.id = replay.original_id LIMIT 1 \
         ) AS original ON true \
         WHERE ($1::text IS NULL OR replay.provider = $1) \
           AND ($2::timestamptz IS NULL OR replay.received_at >= $2) \
         ORDER BY replay.received_at DESC, replay.id DESC \
         LIMIT $3",
    )
    .bind::<Nullable<Text>, _>(provider)
    .bind::<Nullable<Timestamptz>, _>(since)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// How many replays are suppressed now.
pub async fn count(conn: &mut AsyncPgConnection) -> QueryResult<i64> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let count: Count = diesel::sql_query("SELECT count(*) AS n FROM inbox_suppressed_replays")
        .get_result(conn)
        .await?;
    Ok(count.n)
}

/// Releases the suppressed replays `ids`: each moves into the journal and the queue as if it
/// had just arrived (received now, ready now, with its ordering key and sequence), in one
/// statement, so a replay is released once or not at all. Returns the ids released; an id
/// that is not a suppressed replay (released already, purged, or never one) is left out.
/// Wake the workers afterwards ([`crate::inbox::notify_new_events`]).
pub async fn release(conn: &mut AsyncPgConnection, ids: &[i64]) -> QueryResult<Vec<i64>> {
    #[derive(QueryableByName)]
    struct Released {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let released: Vec<Released> = diesel::sql_query(
        "WITH released AS ( \
             DELETE FROM inbox_suppressed_replays WHERE id = ANY($1) \
             RETURNING id, provider, event_id, event_type, headers, body, body_sha256, \
                       ordering_key, ordering_sequence \
         ), journaled AS ( \
             INSERT INTO inbox_events (id, provider, event_id, event_type, headers, body, \
                                       body_sha256) \
             SELECT id, provider, event_id, event_type, headers, body, body_sha256 \
             FROM released \
         ) \
         INSERT INTO inbox_queue (id, ordering_key, ordering_sequence, next_attempt_at) \
         SELECT id, ordering_key, ordering_sequence, now() FROM released \
         RETURNING id",
    )
    .bind::<Array<BigInt>, _>(ids)
    .load(conn)
    .await?;
    let mut released: Vec<i64> = released.into_iter().map(|row| row.id).collect();
    released.sort_unstable();
    Ok(released)
}

/// Deletes at most `batch` suppressed replays received more than `retention` ago, with their
/// dedup keys, oldest first; returns how many. Callers repeat it while it deletes a full batch.
pub async fn purge(
    conn: &mut AsyncPgConnection,
    retention: Duration,
    batch: i64,
) -> QueryResult<usize> {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    diesel::sql_query(
        "WITH gone AS ( \
             DELETE FROM inbox_suppressed_replays WHERE id = ANY(ARRAY( \
                 SELECT id FROM inbox_suppressed_replays \
                 WHERE received_at < now() - $1 * interval '1 millisecond' \
                 ORDER BY received_at LIMIT $2)) \
             RETURNING provider, event_id \
         ) \
         DELETE FROM inbox_dedup USING gone \
         WHERE inbox_dedup.provider = gone.provider AND inbox_dedup.event_id = gone.event_id",
    )
    .bind::<BigInt, _>(retention_ms)
    .bind::<BigInt, _>(batch)
    .execute(conn)
    .await
}

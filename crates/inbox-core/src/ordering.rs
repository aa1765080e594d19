//! The operator's queries on ordering keys: which keys a dead head blocks, where an event
//! stands in its key, and the skip that releases a blocked key. A key's head is marked in the
//! queue (migration 21); the claim takes it in [`crate::inbox::lease::claim_due`].

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Double, Nullable, Text, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use crate::statuses_sql;

/// Longest skip reason kept (the column's CHECK constraint).
pub const MAX_SKIP_REASON_CHARS: usize = 2_000;

/// A key held by its dead head until an operator replays or skips it.
#[derive(Debug, Clone, PartialEq, QueryableByName)]
pub struct BlockedKey {
    /// The ordering key (`provider:value`).
    #[diesel(sql_type = Text)]
    pub ordering_key: String,
    /// The dead head's row id.
    #[diesel(sql_type = BigInt)]
    pub event_row_id: i64,
    /// The dead head's provider event id (`None` once purged).
    #[diesel(sql_type = Nullable<Text>)]
    pub event_id: Option<String>,
    /// Since when the key is blocked.
    #[diesel(sql_type = Timestamptz)]
    pub blocked_since: DateTime<Utc>,
    /// Events of the key waiting behind it.
    #[diesel(sql_type = BigInt)]
    pub waiting: i64,
    /// Why the head died.
    #[diesel(sql_type = Nullable<Text>)]
    pub last_error: Option<String>,
}

/// Blocked keys, longest blocked first, at most `limit`.
///
/// Reads `inbox_keys` through its partial index on blocked keys; locks nothing.
pub async fn blocked_keys(
    conn: &mut AsyncPgConnection,
    limit: i64,
) -> QueryResult<Vec<BlockedKey>> {
    diesel::sql_query(
        "SELECT key.ordering_key, key.blocked_by AS event_row_id, event.event_id, \
                key.blocked_since, \
                (SELECT count(*) FROM inbox_queue AS queue \
                 WHERE queue.ordering_key = key.ordering_key AND NOT queue.head) AS waiting, \
                finished.last_error \
         FROM inbox_keys AS key \
         LEFT JOIN inbox_events AS event ON event.id = key.blocked_by \
         LEFT JOIN inbox_finished AS finished ON finished.id = key.blocked_by \
         WHERE key.blocked_by IS NOT NULL \
         ORDER BY key.blocked_since \
         LIMIT $1",
    )
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// How many keys are blocked, and for how long the oldest has been (0 when none).
#[derive(Debug, Clone, Copy, Default, PartialEq, QueryableByName)]
pub struct BlockedSummary {
    /// Keys blocked by a dead head.
    #[diesel(sql_type = BigInt)]
    pub blocked_keys: i64,
    /// Seconds since the longest-blocked key was blocked.
    #[diesel(sql_type = Double)]
    pub oldest_blocked_age_seconds: f64,
}

/// The [`BlockedSummary`]; reads the partial index of blocked keys only.
pub async fn blocked_summary(conn: &mut AsyncPgConnection) -> QueryResult<BlockedSummary> {
    diesel::sql_query(
        "SELECT count(*) AS blocked_keys, \
                coalesce(extract(epoch FROM now() - min(blocked_since)), 0)::float8 \
                    AS oldest_blocked_age_seconds \
         FROM inbox_keys WHERE blocked_by IS NOT NULL",
    )
    .get_result(conn)
    .await
}

/// Where one event stands in its key.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct KeyPosition {
    /// The ordering key.
    #[diesel(sql_type = Text)]
    pub ordering_key: String,
    /// The event's sequence within the key.
    #[diesel(sql_type = BigInt)]
    pub sequence: i64,
    /// Events of the key that run before it: its head, and the events waiting before it (0: it
    /// is the head); `None` when it is no longer queued (dead).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub ahead: Option<i64>,
    /// Events of the key in the queue, itself included.
    #[diesel(sql_type = BigInt)]
    pub queued: i64,
    /// The key's event in processing, if any.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub holder: Option<i64>,
    /// The dead head blocking the key, if any.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub blocked_by: Option<i64>,
    /// The highest sequence of the key's events done so far.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub processed_sequence: Option<i64>,
}

/// The key and position of event row `id`: for a queued event, from its queue row; for a
/// dead one, from the ordering kept for its replay. `None` for unordered and done events.
pub async fn position(conn: &mut AsyncPgConnection, id: i64) -> QueryResult<Option<KeyPosition>> {
    diesel::sql_query(statuses_sql!(
        "WITH own AS ( \
             SELECT ordering_key, ordering_sequence, true AS queued, head FROM inbox_queue \
             WHERE id = $1 AND ordering_key IS NOT NULL \
             UNION ALL \
             SELECT ordering_key, ordering_sequence, false, false FROM inbox_dead_ordering \
             WHERE id = $1 \
         ), counted AS ( \
             SELECT own.*, \
                    (SELECT count(*) FROM inbox_queue AS other \
                     WHERE other.ordering_key = own.ordering_key AND other.head) AS heads, \
                    (SELECT count(*) FROM inbox_queue AS other \
                     WHERE other.ordering_key = own.ordering_key AND NOT other.head \
                       AND (other.ordering_sequence, other.id) < (own.ordering_sequence, $1)) \
                        AS waiting_before, \
                    (SELECT count(*) FROM inbox_queue AS other \
                     WHERE other.ordering_key = own.ordering_key AND NOT other.head) AS waiting \
             FROM own LIMIT 1 \
         ) \
         SELECT counted.ordering_key, counted.ordering_sequence AS sequence, \
                CASE WHEN NOT counted.queued THEN NULL WHEN counted.head THEN 0 \
                     ELSE counted.heads + counted.waiting_before END AS ahead, \
                counted.heads + counted.waiting AS queued, \
                (SELECT other.id FROM inbox_queue AS other \
                 WHERE other.ordering_key = counted.ordering_key AND other.head \
                   AND other.status = {processing}) AS holder, \
                key.blocked_by, \
                greatest(key.processed_sequence, \
                         (SELECT other.key_processed_sequence FROM inbox_queue AS other \
                          WHERE other.ordering_key = counted.ordering_key AND other.head)) \
                    AS processed_sequence \
         FROM counted LEFT JOIN inbox_keys AS key USING (ordering_key)"
    ))
    .bind::<BigInt, _>(id)
    .get_result(conn)
    .await
    .optional()
}

/// Why a skip did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SkipError {
    /// The reason is empty or longer than [`MAX_SKIP_REASON_CHARS`].
    #[error("a skip needs a reason of 1 to {MAX_SKIP_REASON_CHARS} characters")]
    Reason,
    /// The event blocks no key (it is not dead, not ordered, or was skipped or replayed).
    #[error("event {0} blocks no key")]
    NotBlocking(i64),
    /// The database failed.
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// Releases the key that dead event row `id` blocks, keeping `reason` in `inbox_key_skips`:
/// the event stays dead (a replay may still run it later: as a late arrival, stale, once a
/// later event of its key is done), the key's next event runs. Returns
/// the key released. The key's next event becomes its head at once, for a claim to take.
///
/// One transaction: the key row is updated only while `blocked_by = id`, so two skips (or a
/// skip racing a replay) release it once and record one reason; then, under that row's lock,
/// the key is settled (`inbox_settle_heads`, migration 21) in a statement of its own, whose
/// snapshot sees every event that arrived for the key while it was blocked.
pub async fn skip_dead_head(
    conn: &mut AsyncPgConnection,
    id: i64,
    reason: &str,
) -> Result<String, SkipError> {
    #[derive(QueryableByName)]
    struct Released {
        #[diesel(sql_type = Text)]
        ordering_key: String,
    }
    let reason = reason.trim();
    if reason.is_empty() || reason.chars().count() > MAX_SKIP_REASON_CHARS {
        return Err(SkipError::Reason);
    }
    conn.transaction::<_, SkipError, _>(async |tx| {
        let released: Released = diesel::sql_query(statuses_sql!(
            "WITH released AS ( \
                 UPDATE inbox_keys SET blocked_by = NULL, blocked_since = NULL, idle_since = now() \
                 WHERE blocked_by = $1 \
                   AND EXISTS (SELECT 1 FROM inbox_finished WHERE id = $1 AND status = {dead}) \
                 RETURNING ordering_key \
             ), recorded AS ( \
                 INSERT INTO inbox_key_skips (ordering_key, event_row_id, reason) \
                 SELECT ordering_key, $1, $2 FROM released \
             ) \
             SELECT ordering_key FROM released"
        ))
        .bind::<BigInt, _>(id)
        .bind::<Text, _>(reason)
        .get_result(tx)
        .await
        .optional()?
        .ok_or(SkipError::NotBlocking(id))?;
        diesel::sql_query("SELECT inbox_settle_heads(ARRAY[$1::text])")
            .bind::<Text, _>(&released.ordering_key)
            .execute(tx)
            .await?;
        Ok(released.ordering_key)
    })
    .await
}

/// Forgets ordering keys idle since before `cutoff`: unblocked, with no event queued, whose
/// last event left the queue (or whose block was lifted) before it. Their rows go with their
/// processed sequence, so an event of such a key arriving later runs as the key's first, not
/// as a late arrival. Returns how many were forgotten.
///
/// Walks the keys in key order, `batch` rows per transaction. Each transaction first locks
/// the candidates it walked over, skipping those another transaction holds (an arrival or a
/// completion of the key), then deletes those still without a queued event in a statement of
/// its own: that statement's snapshot is taken after the locks, so it sees every event that
/// arrived for a key before. An arrival that comes later waits for the key's lock and, the
/// row gone, inserts it anew (`inbox_lock_keys`) and becomes its head.
pub async fn forget_idle_keys(
    conn: &mut AsyncPgConnection,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> QueryResult<usize> {
    #[derive(QueryableByName)]
    struct Walked {
        #[diesel(sql_type = Nullable<Text>)]
        walked_to: Option<String>,
        #[diesel(sql_type = Array<Text>)]
        locked: Vec<String>,
    }
    let mut forgotten = 0;
    let mut after = String::new();
    loop {
        let (walked, deleted) = conn
            .transaction::<_, diesel::result::Error, _>(async |tx| {
                let walked: Walked = diesel::sql_query(
                    "WITH walked AS MATERIALIZED ( \
                         SELECT ordering_key FROM inbox_keys WHERE ordering_key > $1 \
                         ORDER BY ordering_key LIMIT $2 \
                     ), locked AS ( \
                         SELECT key.ordering_key FROM inbox_keys AS key \
                         WHERE key.ordering_key = ANY(ARRAY(SELECT ordering_key FROM walked)) \
                           AND key.blocked_by IS NULL AND key.idle_since < $3 \
                         ORDER BY key.ordering_key \
                         FOR UPDATE SKIP LOCKED \
                     ) \
                     SELECT (SELECT max(ordering_key) FROM walked) AS walked_to, \
                            ARRAY(SELECT ordering_key FROM locked) AS locked",
                )
                .bind::<Text, _>(&after)
                .bind::<BigInt, _>(batch)
                .bind::<Timestamptz, _>(cutoff)
                .get_result(tx)
                .await?;
                if walked.locked.is_empty() {
                    return Ok((walked.walked_to, 0));
                }
                // Both partial indexes of the queue by key: its head, and the events behind it
                // (an unblocked key with events has a head; checking them too costs a probe).
                let deleted = diesel::sql_query(
                    "DELETE FROM inbox_keys AS key \
                     WHERE key.ordering_key = ANY($1) \
                       AND key.blocked_by IS NULL AND key.idle_since < $2 \
                       AND NOT EXISTS (SELECT 1 FROM inbox_queue AS queue \
                                       WHERE queue.ordering_key = key.ordering_key \
                                         AND queue.head) \
                       AND NOT EXISTS (SELECT 1 FROM inbox_queue AS queue \
                                       WHERE queue.ordering_key = key.ordering_key \
                                         AND queue.ordering_key IS NOT NULL \
                                         AND NOT queue.head)",
                )
                .bind::<Array<Text>, _>(&walked.locked)
                .bind::<Timestamptz, _>(cutoff)
                .execute(tx)
                .await?;
                Ok((walked.walked_to, deleted))
            })
            .await?;
        forgotten += deleted;
        match walked {
            Some(last) => after = last,
            None => return Ok(forgotten),
        }
    }
}

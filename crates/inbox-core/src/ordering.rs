//! The operator's queries on ordering keys: which keys a dead head blocks, where an event
//! stands in its key, and the skip that releases a blocked key. The claim and the key's
//! holder live in [`crate::inbox::lease::claim_due`] and migration 8's trigger.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

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
                 WHERE queue.ordering_key = key.ordering_key) AS waiting, \
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
    /// Events of the key ahead of it in the queue (0: it is the head); `None` when it is no
    /// longer queued (dead).
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
    diesel::sql_query(
        "WITH own AS ( \
             SELECT ordering_key, ordering_sequence, true AS queued FROM inbox_queue \
             WHERE id = $1 AND ordering_key IS NOT NULL \
             UNION ALL \
             SELECT ordering_key, ordering_sequence, false FROM inbox_dead_ordering WHERE id = $1 \
         ) \
         SELECT own.ordering_key, own.ordering_sequence AS sequence, \
                CASE WHEN own.queued THEN ( \
                    SELECT count(*) FROM inbox_queue AS other \
                    WHERE other.ordering_key = own.ordering_key \
                      AND (other.ordering_sequence, other.id) < (own.ordering_sequence, $1)) \
                END AS ahead, \
                (SELECT count(*) FROM inbox_queue AS other \
                 WHERE other.ordering_key = own.ordering_key) AS queued, \
                key.holder, key.blocked_by, key.processed_sequence \
         FROM own LEFT JOIN inbox_keys AS key USING (ordering_key) \
         LIMIT 1",
    )
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
/// the event stays dead (a replay may still run it later), the key's next event runs. Returns
/// the key released. The key is due again at once, for its next event to be claimed.
///
/// One statement: the key row is updated only while `blocked_by = id`, so two skips (or a
/// skip racing a replay) release it once and record one reason.
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
    let released: Option<Released> = diesel::sql_query(statuses_sql!(
        "WITH released AS ( \
             UPDATE inbox_keys SET blocked_by = NULL, blocked_since = NULL, due_at = now() \
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
    .get_result(conn)
    .await
    .optional()?;
    released
        .map(|row| row.ordering_key)
        .ok_or(SkipError::NotBlocking(id))
}

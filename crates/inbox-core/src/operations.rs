//! The operator's queries: backlog statistics, listing and showing events, replaying dead
//! letters, and purging old done rows within the dedup window's limits.
//!
//! Counts and writes go to the tables that hold each state (`inbox_queue` for ready and
//! processing events, `inbox_finished` for done and dead ones); listing and showing read the
//! `webhook_inbox` view, one row per event.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Double, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::journal;
use crate::schema::webhook_inbox;

pub mod audit;
pub mod browse;
pub mod overview;
use crate::statuses_sql;
use crate::InboxStatus;

/// The cheap backlog figures every worker exports as gauges. Reads only the queue (ready and
/// processing rows) and the dead rows' partial index, never the done ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, QueryableByName)]
pub struct Backlog {
    /// Rows waiting, due now or later.
    #[diesel(sql_type = BigInt)]
    pub ready: i64,
    /// Ready rows due now: the work there is to do.
    #[diesel(sql_type = BigInt)]
    pub due: i64,
    /// Rows held under a lease.
    #[diesel(sql_type = BigInt)]
    pub processing: i64,
    /// Dead letters waiting for an operator.
    #[diesel(sql_type = BigInt)]
    pub dead: i64,
    /// Age in seconds of the oldest event not yet processed (ready or processing), 0 if none.
    #[diesel(sql_type = Double)]
    pub oldest_unprocessed_age_seconds: f64,
}

/// Reads the [`Backlog`].
pub async fn backlog(conn: &mut AsyncPgConnection) -> QueryResult<Backlog> {
    // The oldest unprocessed event is the queue's lowest id: ids follow arrival.
    diesel::sql_query(statuses_sql!(
        "SELECT queue.ready, queue.due, queue.processing, \
                (SELECT count(*) FROM inbox_finished WHERE status = {dead}) AS dead, \
                coalesce(extract(epoch FROM now() - ( \
                    SELECT received_at FROM inbox_events \
                    WHERE id = (SELECT min(id) FROM inbox_queue))), 0)::float8 \
                    AS oldest_unprocessed_age_seconds \
         FROM (SELECT count(*) FILTER (WHERE status = {ready}) AS ready, \
                      count(*) FILTER (WHERE status = {ready} AND next_attempt_at <= now()) AS due, \
                      count(*) FILTER (WHERE status = {processing}) AS processing \
               FROM inbox_queue) AS queue"
    ))
    .get_result(conn)
    .await
}

/// Rows per status, including done (a full count: for the operator, not for a scrape loop).
pub async fn count_by_status(conn: &mut AsyncPgConnection) -> QueryResult<Vec<(InboxStatus, i64)>> {
    let counts: Vec<StatusCount> = diesel::sql_query(
        "SELECT status, count(*) AS rows FROM ( \
             SELECT status FROM inbox_queue UNION ALL SELECT status FROM inbox_finished \
         ) AS states GROUP BY status ORDER BY status",
    )
    .load(conn)
    .await?;
    Ok(counts.into_iter().map(|c| (c.status, c.rows)).collect())
}

#[derive(QueryableByName)]
struct StatusCount {
    #[diesel(sql_type = diesel::sql_types::SmallInt)]
    status: InboxStatus,
    #[diesel(sql_type = BigInt)]
    rows: i64,
}

/// One frequent error among rows still to be processed or dead.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct ErrorCount {
    /// The error, cut to 200 characters.
    #[diesel(sql_type = Text)]
    pub error: String,
    /// Rows carrying it.
    #[diesel(sql_type = BigInt)]
    pub rows: i64,
}

/// The most frequent `last_error`s of ready and dead rows.
pub async fn top_errors(conn: &mut AsyncPgConnection, limit: i64) -> QueryResult<Vec<ErrorCount>> {
    diesel::sql_query(statuses_sql!(
        "SELECT left(last_error, 200) AS error, count(*) AS rows FROM ( \
             SELECT last_error FROM inbox_queue WHERE status = {ready} \
             UNION ALL SELECT last_error FROM inbox_finished WHERE status = {dead} \
         ) AS failed \
         WHERE last_error IS NOT NULL \
         GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT $1"
    ))
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// An inbox row as the operator sees it (without the body).
#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = webhook_inbox)]
pub struct EventSummary {
    /// Row id.
    pub id: i64,
    /// Provider.
    pub provider: String,
    /// Provider's event id.
    pub event_id: String,
    /// Event type.
    pub event_type: Option<String>,
    /// State.
    pub status: InboxStatus,
    /// Attempts begun.
    pub attempt: i32,
    /// When it was received.
    pub received_at: DateTime<Utc>,
    /// When it is due (ready rows).
    pub next_attempt_at: DateTime<Utc>,
    /// When it finished (done or dead rows).
    pub processed_at: Option<DateTime<Utc>>,
    /// Last worker that claimed it.
    pub locked_by: Option<String>,
    /// Last failure.
    pub last_error: Option<String>,
}

/// Which rows an operator command applies to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Only these row ids (when not empty).
    pub ids: Vec<i64>,
    /// Only this provider.
    pub provider: Option<String>,
    /// Only this state.
    pub status: Option<InboxStatus>,
    /// Only rows received at or after this time.
    pub received_since: Option<DateTime<Utc>>,
    /// Only rows received before this time.
    pub received_until: Option<DateTime<Utc>>,
}

impl EventFilter {
    fn apply<'a>(
        &'a self,
        mut query: webhook_inbox::BoxedQuery<'a, diesel::pg::Pg>,
    ) -> webhook_inbox::BoxedQuery<'a, diesel::pg::Pg> {
        if !self.ids.is_empty() {
            query = query.filter(webhook_inbox::id.eq_any(&self.ids));
        }
        if let Some(provider) = &self.provider {
            query = query.filter(webhook_inbox::provider.eq(provider));
        }
        if let Some(status) = self.status {
            query = query.filter(webhook_inbox::status.eq(status));
        }
        if let Some(since) = self.received_since {
            query = query.filter(webhook_inbox::received_at.ge(since));
        }
        if let Some(until) = self.received_until {
            query = query.filter(webhook_inbox::received_at.lt(until));
        }
        query
    }
}

/// Rows matching `filter`, newest first.
pub async fn list(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    limit: i64,
) -> QueryResult<Vec<EventSummary>> {
    filter
        .apply(webhook_inbox::table.into_boxed())
        .order_by(webhook_inbox::id.desc())
        .limit(limit)
        .select(EventSummary::as_select())
        .load(conn)
        .await
}

/// One event with its stored headers and body.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = webhook_inbox)]
pub struct EventDetail {
    /// The summary.
    #[diesel(embed)]
    pub summary: EventSummary,
    /// Stored headers.
    pub headers: serde_json::Value,
    /// Exact body bytes.
    pub body: Vec<u8>,
    /// Lease expiry, while processing.
    pub locked_until: Option<DateTime<Utc>>,
}

/// The event `(provider, event_id)`, if stored: its id read by its dedup key, then the event
/// by its id (the journal has no index by event id: a filter on it read every day).
pub async fn show(
    conn: &mut AsyncPgConnection,
    provider: &str,
    event_id: &str,
) -> QueryResult<Option<EventDetail>> {
    #[derive(diesel::QueryableByName)]
    struct Key {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let key: Option<Key> =
        diesel::sql_query("SELECT id FROM inbox_dedup WHERE provider = $1 AND event_id = $2")
            .bind::<diesel::sql_types::Text, _>(provider)
            .bind::<diesel::sql_types::Text, _>(event_id)
            .get_result(conn)
            .await
            .optional()?;
    match key {
        Some(key) => browse::event_by_id(conn, key.id).await,
        None => Ok(None),
    }
}

/// Ids of the dead rows `filter` selects (what a replay would touch).
pub async fn replay_candidates(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
) -> QueryResult<Vec<i64>> {
    filter
        .apply(webhook_inbox::table.into_boxed())
        .filter(webhook_inbox::status.eq(InboxStatus::Dead))
        .order_by(webhook_inbox::id)
        .select(webhook_inbox::id)
        .load(conn)
        .await
}

/// `dead -> ready` for these ids, attempts reset, due now: each one's `inbox_finished` row is
/// replaced by a ready queue row, in one statement. Rows that are not dead (any more) are
/// left alone. Returns how many rows were replayed.
///
/// The event's `processed_events` record is not touched: a dead event never committed an
/// effect, so none exists for it.
///
/// A dead event of an ordered provider takes its ordering key and sequence back (kept in
/// `inbox_dead_ordering`), and the key it blocked is unblocked in the same statement, so it
/// runs as its key's head again. The keys are locked first, in key order, as every writer of
/// keys locks them (`inbox_lock_keys`, migration 21): unblocked in the order their rows were
/// read, they deadlocked with an arrival holding one of them and wanting another.
pub async fn replay(conn: &mut AsyncPgConnection, ids: &[i64]) -> QueryResult<usize> {
    diesel::sql_query(statuses_sql!(
        "WITH keys_locked AS MATERIALIZED ( \
             SELECT inbox_lock_keys(ARRAY( \
                 SELECT dead.ordering_key FROM inbox_dead_ordering AS dead \
                 WHERE dead.id = ANY($1) \
             )) \
         ), replayed AS ( \
             DELETE FROM inbox_finished WHERE id = ANY($1) AND status = {dead} \
             RETURNING id, locked_by, last_error \
         ), ordering AS ( \
             DELETE FROM inbox_dead_ordering WHERE id IN (SELECT id FROM replayed) \
             RETURNING id, ordering_key, ordering_sequence \
         ), unblocked AS ( \
             UPDATE inbox_keys SET blocked_by = NULL, blocked_since = NULL \
             FROM ordering \
             WHERE inbox_keys.ordering_key = ordering.ordering_key \
               AND inbox_keys.blocked_by = ordering.id \
               AND (SELECT count(*) FROM keys_locked) = 1 \
         ) \
         INSERT INTO inbox_queue (id, status, attempt, next_attempt_at, locked_by, last_error, \
                                  ordering_key, ordering_sequence) \
         SELECT replayed.id, {ready}, 0, now(), locked_by, \
                'replayed by operator after: ' || coalesce(last_error, 'no error recorded'), \
                ordering.ordering_key, ordering.ordering_sequence \
         FROM replayed LEFT JOIN ordering USING (id)"
    ))
    .bind::<Array<BigInt>, _>(ids)
    .execute(conn)
    .await
}

/// Why a purge was refused.
#[derive(Debug, thiserror::Error)]
pub enum PurgeError {
    /// The retention is shorter than the dedup window: a provider's redelivery of a purged
    /// event would be accepted again as new.
    #[error("retention {retention:?} is shorter than the dedup window {dedup_window:?}: redeliveries of purged events would be processed again")]
    WithinDedupWindow {
        /// Requested retention.
        retention: Duration,
        /// The configured dedup window.
        dedup_window: Duration,
    },
    /// Another purge holds [`PURGE_LOCK_KEY`] (a replica's retention or `worker purge`); this
    /// one did nothing.
    #[error(
        "another purge is running (a worker's retention or a `worker purge`); nothing was purged"
    )]
    AlreadyRunning,
    /// The database failed.
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// The advisory lock a purge holds while it runs: every replica's retention fires on the same
/// timer, and two purges dropping the same day fail each other (a row one moves to the kept
/// partition is a row the other cannot lock).
pub const PURGE_LOCK_KEY: i64 = 0x7765_6268_6f6f_6b32; // "webhook2"

/// What one purge did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    /// Done events deleted (with their journal, outcome and dedup key rows).
    pub events: usize,
    /// Journal day partitions dropped.
    pub days: usize,
    /// `processed_events` records deleted.
    pub processed_records: usize,
    /// Suppressed replays deleted (with their dedup keys).
    pub suppressed_replays: usize,
    /// Ordering keys forgotten, idle longer than the retention (see
    /// [`crate::ordering::forget_idle_keys`]).
    pub idle_keys: usize,
}

/// Deletes done events older than `retention`, and their `processed_events` records (each by
/// its key, with its event: the table has no index by time). Whole
/// days go at once: a day partition of the journal is dropped once every event of it was
/// received more than `retention` ago (its events still queued or dead are kept, moved aside
/// first; see [`crate::journal`]), so an event is kept at least `retention` and at most a day
/// more. The few done events of the kept partition finished more than `retention` ago are
/// deleted row by row, `batch` per statement, and so are suppressed replays received more than
/// `retention` ago. Dead rows are kept for the operator. Ordering keys idle longer than
/// `retention` are forgotten. Refuses a retention shorter than `dedup_window`.
/// One purge runs at a time, across every replica: another finds [`PURGE_LOCK_KEY`] taken and
/// returns [`PurgeError::AlreadyRunning`] at once. `conn` must not be in a transaction (a
/// partition is detached concurrently).
pub async fn purge_done(
    conn: &mut AsyncPgConnection,
    retention: Duration,
    dedup_window: Duration,
    batch: i64,
) -> Result<Purged, PurgeError> {
    if retention < dedup_window {
        return Err(PurgeError::WithinDedupWindow {
            retention,
            dedup_window,
        });
    }
    if !try_purge_lock(conn).await? {
        return Err(PurgeError::AlreadyRunning);
    }
    let purged = purge_holding_lock(conn, retention, batch).await;
    // A connection that failed keeps the lock only until it closes.
    let unlocked = diesel::sql_query("SELECT pg_advisory_unlock($1)")
        .bind::<BigInt, _>(PURGE_LOCK_KEY)
        .execute(conn)
        .await;
    let purged = purged?;
    unlocked?;
    Ok(purged)
}

async fn database_now(conn: &mut AsyncPgConnection) -> QueryResult<DateTime<Utc>> {
    #[derive(diesel::QueryableByName)]
    struct Now {
        #[diesel(sql_type = diesel::sql_types::Timestamptz)]
        now: DateTime<Utc>,
    }
    let now: Now = diesel::sql_query("SELECT now() AS now")
        .get_result(conn)
        .await?;
    Ok(now.now)
}

async fn try_purge_lock(conn: &mut AsyncPgConnection) -> QueryResult<bool> {
    #[derive(diesel::QueryableByName)]
    struct Locked {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        locked: bool,
    }
    let locked: Locked = diesel::sql_query("SELECT pg_try_advisory_lock($1) AS locked")
        .bind::<BigInt, _>(PURGE_LOCK_KEY)
        .get_result(conn)
        .await?;
    Ok(locked.locked)
}

async fn purge_holding_lock(
    conn: &mut AsyncPgConnection,
    retention: Duration,
    batch: i64,
) -> Result<Purged, PurgeError> {
    // The database's clock, which dated the events and their days: a worker whose clock runs
    // ahead would otherwise drop days early.
    let cutoff = database_now(conn).await?
        - chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
    let dropped = journal::drop_days_received_before(conn, cutoff, batch).await?;
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let mut purged = Purged {
        events: dropped.events,
        days: dropped.days,
        processed_records: dropped.processed_records,
        suppressed_replays: 0,
        idle_keys: 0,
    };
    #[derive(diesel::QueryableByName)]
    struct Deleted {
        #[diesel(sql_type = BigInt)]
        events: i64,
        #[diesel(sql_type = BigInt)]
        processed: i64,
    }
    loop {
        let deleted: Deleted = diesel::sql_query(statuses_sql!(
            "WITH outcomes AS ( \
                 DELETE FROM inbox_finished WHERE id = ANY(ARRAY( \
                     SELECT finished.id FROM inbox_finished AS finished \
                     JOIN inbox_events_kept AS kept USING (id) \
                     WHERE finished.status = {done} \
                       AND finished.processed_at < now() - $1 * interval '1 millisecond' \
                     ORDER BY finished.id LIMIT $2)) \
                 RETURNING id \
             ), journal AS ( \
                 DELETE FROM inbox_events_kept WHERE id IN (SELECT id FROM outcomes) \
                 RETURNING provider, event_id \
             ), keys AS ( \
                 DELETE FROM inbox_dedup USING journal \
                 WHERE inbox_dedup.provider = journal.provider \
                   AND inbox_dedup.event_id = journal.event_id \
             ), processed AS ( \
                 DELETE FROM processed_events USING journal \
                 WHERE processed_events.provider = journal.provider \
                   AND processed_events.event_id = journal.event_id \
                 RETURNING 1 \
             ) \
             SELECT (SELECT count(*) FROM journal) AS events, \
                    (SELECT count(*) FROM processed) AS processed"
        ))
        .bind::<BigInt, _>(retention_ms)
        .bind::<BigInt, _>(batch)
        .get_result(conn)
        .await?;
        let events = usize::try_from(deleted.events).unwrap_or(0);
        purged.events += events;
        purged.processed_records += usize::try_from(deleted.processed).unwrap_or(0);
        if events < usize::try_from(batch).unwrap_or(usize::MAX) {
            break;
        }
    }
    loop {
        let deleted = crate::replays::purge(conn, retention, batch).await?;
        purged.suppressed_replays += deleted;
        if deleted < usize::try_from(batch).unwrap_or(usize::MAX) {
            break;
        }
    }
    purged.idle_keys = crate::ordering::forget_idle_keys(conn, cutoff, batch).await?;
    Ok(purged)
}

/// When the next claimable ready row (an unordered event or a key's head) falls due, if any is
/// waiting, read from the claim's index. Events of paused routes are not waited for (a worker
/// would otherwise wake for them again and again).
///
/// Prepared once per connection: a claim loop asks this after every claim that emptied the
/// queue, and planning the statement anew each time cost the server more than running it.
pub async fn next_due(conn: &mut AsyncPgConnection) -> QueryResult<Option<DateTime<Utc>>> {
    #[derive(QueryableByName)]
    struct NextDue {
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Timestamptz>)]
        due: Option<DateTime<Utc>>,
    }
    let next: NextDue = crate::prepared::cached_sql(
        statuses_sql!(
            "SELECT min(next_attempt_at) AS due FROM inbox_queue \
             WHERE status = {ready} AND (ordering_key IS NULL OR head) AND {not_paused}"
        ),
        (),
    )
    .get_result(conn)
    .await?;
    Ok(next.due)
}

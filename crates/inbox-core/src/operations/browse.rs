//! Searching the inbox the way the console does: every filter an operator types (provider,
//! type, state, time range, event id, JSON containment on the body), paged by keyset on the
//! row id, newest first, and the dead events such a filter selects, for a replay in batches.
//!
//! A page is `ORDER BY received_at DESC, id DESC LIMIT n` below the previous page's last row:
//! a backward scan of `inbox_events_received_at` that stops after `n` matching rows, whatever
//! the page number (OFFSET would read every row before the page). Arrival time, not the id,
//! orders the list: with a time range, a scan in id order would pass every newer row before
//! reaching the range (ids follow arrival, which the planner cannot know: 0.47 s for a
//! one-hour range five days back on a million events, against milliseconds through the time
//! index). Filters on the state drive the join from the state's table (`inbox_queue` for ready
//! and processing, `inbox_finished` for done and dead) when that is cheaper. A body
//! containment match is evaluated on the rows the other filters leave, parsing each body, so
//! a rare match on a large table costs a long scan: combine it with a provider or a time range
//! (or create the optional GIN index the README describes).
//!
//! Run [`tune_session`] on the connection first (the console does for every request).

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Jsonb, Nullable, SmallInt, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::{EventDetail, EventSummary};
use crate::schema::webhook_inbox;
use crate::InboxStatus;

/// Everything the console's event list can filter on; `None` means no condition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventQuery {
    /// Only this provider.
    pub provider: Option<String>,
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only this state.
    pub status: Option<InboxStatus>,
    /// Received at or after.
    pub received_since: Option<DateTime<Utc>>,
    /// Received before.
    pub received_until: Option<DateTime<Utc>>,
    /// Only this provider's event id.
    pub event_id: Option<String>,
    /// Only events whose body, parsed as JSON, contains this value (`@>`). Bodies that are not
    /// JSON never match.
    pub body_contains: Option<serde_json::Value>,
}

enum Param {
    Text(String),
    Time(DateTime<Utc>),
    Int(i64),
    Status(InboxStatus),
    Json(serde_json::Value),
}

/// A statement being written: its SQL and its binds, numbered as they are pushed.
struct Statement {
    sql: String,
    params: Vec<Param>,
}

impl Statement {
    fn new(select: &str) -> Self {
        Self {
            sql: select.to_owned(),
            params: Vec::new(),
        }
    }

    /// Appends ` AND {left} $n` with `param` as bind `$n`.
    fn and(&mut self, left: &str, param: Param) {
        self.params.push(param);
        self.sql
            .push_str(&format!(" AND {left} ${}", self.params.len()));
    }

    /// `AND` a condition of several parameters, written by `condition` from their numbers.
    fn and_many(&mut self, params: Vec<Param>, condition: impl FnOnce(&[usize]) -> String) {
        let first = self.params.len() + 1;
        let numbers: Vec<usize> = (first..first + params.len()).collect();
        self.params.extend(params);
        self.sql.push_str(&format!(" AND {}", condition(&numbers)));
    }

    fn limit(&mut self, limit: i64) {
        self.params.push(Param::Int(limit));
        self.sql.push_str(&format!(" LIMIT ${}", self.params.len()));
    }

    fn into_query(
        self,
    ) -> diesel::query_builder::BoxedSqlQuery<
        'static,
        diesel::pg::Pg,
        diesel::query_builder::SqlQuery,
    > {
        let mut query = diesel::sql_query(self.sql).into_boxed();
        for param in self.params {
            query = match param {
                Param::Text(value) => query.bind::<Text, _>(value),
                Param::Time(value) => query.bind::<Timestamptz, _>(value),
                Param::Int(value) => query.bind::<BigInt, _>(value),
                Param::Status(value) => query.bind::<SmallInt, _>(value),
                Param::Json(value) => query.bind::<Jsonb, _>(value),
            };
        }
        query
    }
}

/// The journal joined to each event's state, in the queue or finished. An event with neither
/// is in a day the purge is dropping (its outcomes deleted, its partition not yet detached),
/// and left out, as the view `webhook_inbox` leaves it out.
const FROM_EVENTS: &str = " FROM inbox_events AS event \
     LEFT JOIN inbox_queue AS queue ON queue.id = event.id \
     LEFT JOIN inbox_finished AS finished ON finished.id = event.id \
     WHERE (queue.id IS NOT NULL OR finished.id IS NOT NULL)";

const SUMMARY_COLUMNS: &str = "SELECT event.id, event.provider, event.event_id, event.event_type, \
     event.received_at, coalesce(queue.status, finished.status) AS status, \
     coalesce(queue.attempt, finished.attempt) AS attempt, \
     coalesce(queue.next_attempt_at, finished.processed_at) AS next_attempt_at, \
     finished.processed_at, coalesce(queue.locked_by, finished.locked_by) AS locked_by, \
     coalesce(queue.last_error, finished.last_error) AS last_error";

/// Sets the session up for operator queries, in one round trip:
/// - `plan_cache_mode = force_custom_plan`: diesel prepares each statement once per
///   connection, and after five executions PostgreSQL may switch it to a generic plan, blind
///   to the filter's values (a provider with a handful of events and one with millions get
///   the same plan). Operator queries are few; planning each for its values is cheap.
/// - `jit = off`: the overview's aggregates over a million rows cross the JIT cost threshold,
///   and compiling them took longer (about 240 ms) than running them.
/// - `statement_timeout`: set on every use of a pooled session, so that no earlier user's
///   limit stays behind (a search of the bodies has a shorter one); `None`: the server's.
pub async fn tune_session(
    conn: &mut AsyncPgConnection,
    statement_timeout: Option<Duration>,
) -> QueryResult<()> {
    let timeout = statement_timeout.map(|timeout| format!("{}ms", timeout.as_millis().max(1)));
    diesel::sql_query(
        "SELECT set_config('plan_cache_mode', 'force_custom_plan', false), \
                set_config('jit', 'off', false), \
                set_config('statement_timeout', coalesce($1, setting.reset_val), false) \
         FROM pg_settings AS setting WHERE setting.name = 'statement_timeout'",
    )
    .bind::<Nullable<Text>, _>(timeout)
    .execute(conn)
    .await
    .map(|_| ())
}

impl EventQuery {
    /// A statement starting with `select` and [`FROM_EVENTS`], with every condition of this
    /// query, `status` instead of the query's own state when given.
    fn statement(&self, select: &str, status: Option<InboxStatus>) -> Statement {
        let mut statement = Statement::new(&format!("{select}{FROM_EVENTS}"));
        if let Some(provider) = &self.provider {
            statement.and("event.provider =", Param::Text(provider.clone()));
        }
        if let Some(event_type) = &self.event_type {
            statement.and("event.event_type =", Param::Text(event_type.clone()));
        }
        if let Some(event_id) = &self.event_id {
            statement.and("event.event_id =", Param::Text(event_id.clone()));
            // The journal has no index by event id; its dedup key does, with the provider.
            if let Some(provider) = &self.provider {
                statement.and_many(
                    vec![Param::Text(provider.clone()), Param::Text(event_id.clone())],
                    |n| {
                        format!(
                            "event.id = (SELECT dedup.id FROM inbox_dedup AS dedup \
                             WHERE dedup.provider = ${} AND dedup.event_id = ${})",
                            n[0], n[1]
                        )
                    },
                );
            }
        }
        if let Some(since) = self.received_since {
            statement.and("event.received_at >=", Param::Time(since));
        }
        if let Some(until) = self.received_until {
            statement.and("event.received_at <", Param::Time(until));
        }
        if let Some(body) = &self.body_contains {
            statement.and("inbox_body_jsonb(event.body) @>", Param::Json(body.clone()));
        }
        match status.or(self.status) {
            // A strict condition on one side turns its outer join into an inner one, so the
            // planner can start from the state's (smaller) table.
            Some(state @ (InboxStatus::Ready | InboxStatus::Processing)) => {
                statement.and("queue.status =", Param::Status(state));
            }
            Some(state @ (InboxStatus::Done | InboxStatus::Dead)) => {
                statement.and("finished.status =", Param::Status(state));
            }
            None => {}
        }
        statement
    }
}

/// One page of the events `query` selects, newest first (by arrival, then id): at most
/// `limit` rows after the row with id `before` in that order (the last row of the previous
/// page; `None` for the first page). Reads without locking; the next page starts after the
/// last row returned.
pub async fn list_page(
    conn: &mut AsyncPgConnection,
    query: &EventQuery,
    before: Option<i64>,
    limit: i64,
) -> QueryResult<Vec<EventSummary>> {
    let mut statement = query.statement(SUMMARY_COLUMNS, None);
    if let Some(before) = before {
        // The row comparison is exact; the bound on received_at alone is what the index can
        // start its scan from.
        statement.params.push(Param::Int(before));
        let cursor = statement.params.len();
        statement.sql.push_str(&format!(
            " AND event.received_at <= (SELECT cursor.received_at FROM inbox_events AS cursor WHERE cursor.id = ${cursor}) \
             AND (event.received_at, event.id) < (SELECT cursor.received_at, cursor.id FROM inbox_events AS cursor WHERE cursor.id = ${cursor})"
        ));
    }
    statement
        .sql
        .push_str(" ORDER BY event.received_at DESC, event.id DESC");
    statement.limit(limit);
    statement.into_query().load(conn).await
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    rows: i64,
}

/// How many dead events `query` selects (whatever its own state filter): what a replay by
/// filter would replay, counted before it runs. A count, not a lock: events may die or be
/// replayed meanwhile.
pub async fn count_dead(conn: &mut AsyncPgConnection, query: &EventQuery) -> QueryResult<i64> {
    let statement = query.statement("SELECT count(*) AS rows", Some(InboxStatus::Dead));
    let count: Count = statement.into_query().get_result(conn).await?;
    Ok(count.rows)
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// The dead events a filter selected at one moment, which bound a replay by filter: only
/// events counted here are replayed, never one that dies while the replay runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, QueryableByName)]
pub struct DeadExtent {
    /// How many were dead.
    #[diesel(sql_type = BigInt)]
    pub rows: i64,
    /// The highest row id among them (`None` when there were none).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last_id: Option<i64>,
    /// The database's time of the count: every event counted had gone dead by then.
    #[diesel(sql_type = Timestamptz)]
    pub counted_at: DateTime<Utc>,
}

/// How many dead events `query` selects now (whatever its own state filter), the highest id
/// among them and the time of the count, in one statement: what a replay by filter is
/// allowed to replay ([`dead_ids_within`]). Reads without locking.
pub async fn dead_extent(
    conn: &mut AsyncPgConnection,
    query: &EventQuery,
) -> QueryResult<DeadExtent> {
    query
        .statement(
            "SELECT count(*) AS rows, max(event.id) AS last_id, now() AS counted_at",
            Some(InboxStatus::Dead),
        )
        .into_query()
        .get_result(conn)
        .await
}

/// The next `limit` dead events `query` selects with an id above `after`, in id order, among
/// those `extent` counted: an id no higher than its last one, dead since before its count (an
/// event that died later, a new one or an old one, is left alone). One batch of a replay by
/// filter: hand them to [`super::replay`], then ask for the batch after the last id. Reads
/// without locking; the replay itself skips rows no longer dead.
pub async fn dead_ids_within(
    conn: &mut AsyncPgConnection,
    query: &EventQuery,
    extent: &DeadExtent,
    after: i64,
    limit: i64,
) -> QueryResult<Vec<i64>> {
    let Some(last_id) = extent.last_id else {
        return Ok(Vec::new());
    };
    let mut statement = query.statement("SELECT event.id", Some(InboxStatus::Dead));
    statement.and("event.id >", Param::Int(after));
    statement.and("event.id <=", Param::Int(last_id));
    statement.and("finished.processed_at <=", Param::Time(extent.counted_at));
    statement.sql.push_str(" ORDER BY event.id");
    statement.limit(limit);
    let ids: Vec<Id> = statement.into_query().load(conn).await?;
    Ok(ids.into_iter().map(|row| row.id).collect())
}

/// An ordered event's place in its key: the key and the sequence within it.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Ordering {
    /// The ordering key.
    #[diesel(sql_type = Text)]
    pub ordering_key: String,
    /// Its sequence within the key.
    #[diesel(sql_type = BigInt)]
    pub ordering_sequence: i64,
}

/// The ordering key and sequence of event `id`, when its provider orders its events (from
/// its queue row, or for a dead event from `inbox_dead_ordering`).
pub async fn ordering_of(conn: &mut AsyncPgConnection, id: i64) -> QueryResult<Option<Ordering>> {
    diesel::sql_query(
        "SELECT ordering_key, ordering_sequence FROM inbox_queue \
         WHERE id = $1 AND ordering_key IS NOT NULL \
         UNION ALL SELECT ordering_key, ordering_sequence FROM inbox_dead_ordering WHERE id = $1 \
         LIMIT 1",
    )
    .bind::<BigInt, _>(id)
    .get_result(conn)
    .await
    .optional()
}

/// A key whose dead head blocks the events behind it.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct BlockedKey {
    /// The ordering key.
    #[diesel(sql_type = Text)]
    pub ordering_key: String,
    /// The dead head's row id.
    #[diesel(sql_type = BigInt)]
    pub head_id: i64,
    /// Its provider.
    #[diesel(sql_type = Text)]
    pub provider: String,
    /// Its provider's event id.
    #[diesel(sql_type = Text)]
    pub event_id: String,
    /// Since when the key is blocked.
    #[diesel(sql_type = Timestamptz)]
    pub blocked_since: DateTime<Utc>,
    /// Events of the key waiting behind the head.
    #[diesel(sql_type = BigInt)]
    pub waiting: i64,
}

/// The `limit` longest-blocked keys, oldest block first.
pub async fn blocked_keys(
    conn: &mut AsyncPgConnection,
    limit: i64,
) -> QueryResult<Vec<BlockedKey>> {
    diesel::sql_query(
        "SELECT key.ordering_key, key.blocked_by AS head_id, event.provider, event.event_id, \
                coalesce(key.blocked_since, event.received_at) AS blocked_since, \
                (SELECT count(*) FROM inbox_queue AS queue \
                 WHERE queue.ordering_key = key.ordering_key AND NOT queue.head) AS waiting \
         FROM inbox_keys AS key JOIN inbox_events AS event ON event.id = key.blocked_by \
         WHERE key.blocked_by IS NOT NULL \
         ORDER BY blocked_since, key.ordering_key LIMIT $1",
    )
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// The event with row id `id`, headers and body included, if stored.
pub async fn event_by_id(
    conn: &mut AsyncPgConnection,
    id: i64,
) -> QueryResult<Option<EventDetail>> {
    webhook_inbox::table
        .filter(webhook_inbox::id.eq(id))
        .select(EventDetail::as_select())
        .first(conn)
        .await
        .optional()
}

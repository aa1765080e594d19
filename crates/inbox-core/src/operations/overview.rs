//! The figures of the console's overview: what waits and what is dead per provider, arrivals
//! and completions per minute over the last hour, and dead letters of the last day.
//!
//! Per provider, only the states an operator acts on are counted (ready, processing, dead):
//! they are the small sets (the queue, and dead rows through their partial index), so the
//! overview stays cheap however many done events the journal keeps; done events are one total
//! ([`super::count_by_status`]).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, SmallInt, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::statuses_sql;
use crate::InboxStatus;

/// Events of one provider in one state.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct ProviderStateCount {
    /// The provider.
    #[diesel(sql_type = Text)]
    pub provider: String,
    /// The state (ready, processing or dead).
    #[diesel(sql_type = SmallInt)]
    pub status: InboxStatus,
    /// Events.
    #[diesel(sql_type = BigInt)]
    pub rows: i64,
}

/// Ready, processing and dead events per provider, by provider then state.
pub async fn provider_states(conn: &mut AsyncPgConnection) -> QueryResult<Vec<ProviderStateCount>> {
    diesel::sql_query(statuses_sql!(
        "SELECT provider, status, rows FROM ( \
             SELECT event.provider, queue.status, count(*) AS rows \
             FROM inbox_queue AS queue JOIN inbox_events AS event ON event.id = queue.id \
             GROUP BY 1, 2 \
             UNION ALL \
             SELECT event.provider, finished.status, count(*) \
             FROM inbox_finished AS finished JOIN inbox_events AS event ON event.id = finished.id \
             WHERE finished.status = {dead} GROUP BY 1, 2 \
         ) AS counts ORDER BY provider, status"
    ))
    .load(conn)
    .await
}

/// Arrivals and completions in one minute.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct MinuteRate {
    /// The minute's start.
    #[diesel(sql_type = Timestamptz)]
    pub minute: DateTime<Utc>,
    /// Events accepted by the receiver.
    #[diesel(sql_type = BigInt)]
    pub accepted: i64,
    /// Events finished (done or dead) by a worker.
    #[diesel(sql_type = BigInt)]
    pub processed: i64,
}

/// The last 60 minutes, the current one included, oldest first; every minute present.
/// Arrivals are read through `inbox_events_received_at`; completions scan `inbox_finished`'s
/// small rows (no index on `processed_at` slows the workers' completions).
pub async fn last_hour(conn: &mut AsyncPgConnection) -> QueryResult<Vec<MinuteRate>> {
    diesel::sql_query(
        "WITH start AS (SELECT date_trunc('minute', now()) - interval '59 minutes' AS at), \
         minutes AS ( \
             SELECT generate_series(start.at, start.at + interval '59 minutes', interval '1 minute') AS minute \
             FROM start), \
         accepted AS ( \
             SELECT date_trunc('minute', received_at) AS minute, count(*) AS n FROM inbox_events \
             WHERE received_at >= (SELECT at FROM start) GROUP BY 1), \
         processed AS ( \
             SELECT date_trunc('minute', processed_at) AS minute, count(*) AS n FROM inbox_finished \
             WHERE processed_at >= (SELECT at FROM start) GROUP BY 1) \
         SELECT minutes.minute, coalesce(accepted.n, 0) AS accepted, \
                coalesce(processed.n, 0) AS processed \
         FROM minutes LEFT JOIN accepted USING (minute) LEFT JOIN processed USING (minute) \
         ORDER BY minutes.minute",
    )
    .load(conn)
    .await
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    rows: i64,
}

/// Events that went dead in the last 24 hours (through the dead rows' partial index).
pub async fn dead_last_day(conn: &mut AsyncPgConnection) -> QueryResult<i64> {
    let count: Count = diesel::sql_query(statuses_sql!(
        "SELECT count(*) AS rows FROM inbox_finished \
         WHERE status = {dead} AND processed_at >= now() - interval '24 hours'"
    ))
    .get_result(conn)
    .await?;
    Ok(count.rows)
}

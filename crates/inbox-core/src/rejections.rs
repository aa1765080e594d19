//! The record of refusals: one row per 4xx the receiver answered on a configured provider's
//! path (`inbox_rejections`), written off the request path, trimmed by age and row count, and
//! read back grouped by cause for `worker rejections` and the console.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bytea, Jsonb, Nullable, SmallInt, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// A refusal to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRejection {
    /// When it was answered.
    pub at: DateTime<Utc>,
    /// The configured provider whose path was called.
    pub provider: String,
    /// The answer's code (`invalid_signature`, `body_too_large`, ...).
    pub cause: String,
    /// The HTTP status answered (4xx).
    pub status: i16,
    /// The answer's `X-Request-Id`.
    pub request_id: String,
    /// The headers the provider's stored-header policy keeps.
    pub headers: serde_json::Value,
    /// Body bytes received, or declared when the body was not read.
    pub body_bytes: i64,
    /// SHA-256 of the whole body, when it was read whole.
    pub body_sha256: Option<[u8; 32]>,
}

/// Inserts `rows` in one statement. Takes no lock beyond the inserted rows'.
pub async fn insert(conn: &mut AsyncPgConnection, rows: &[NewRejection]) -> QueryResult<usize> {
    let at: Vec<DateTime<Utc>> = rows.iter().map(|r| r.at).collect();
    let providers: Vec<&str> = rows.iter().map(|r| r.provider.as_str()).collect();
    let causes: Vec<&str> = rows.iter().map(|r| r.cause.as_str()).collect();
    let statuses: Vec<i16> = rows.iter().map(|r| r.status).collect();
    let request_ids: Vec<&str> = rows.iter().map(|r| r.request_id.as_str()).collect();
    let headers: Vec<&serde_json::Value> = rows.iter().map(|r| &r.headers).collect();
    let sizes: Vec<i64> = rows.iter().map(|r| r.body_bytes).collect();
    let hashes: Vec<Option<&[u8]>> = rows
        .iter()
        .map(|r| r.body_sha256.as_ref().map(<[u8; 32]>::as_slice))
        .collect();
    diesel::sql_query(
        "INSERT INTO inbox_rejections \
             (at, provider, cause, status, request_id, headers, body_bytes, body_sha256) \
         SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::smallint[], \
                              $5::text[], $6::jsonb[], $7::bigint[], $8::bytea[])",
    )
    .bind::<Array<Timestamptz>, _>(&at)
    .bind::<Array<Text>, _>(&providers)
    .bind::<Array<Text>, _>(&causes)
    .bind::<Array<SmallInt>, _>(&statuses)
    .bind::<Array<Text>, _>(&request_ids)
    .bind::<Array<Jsonb>, _>(&headers)
    .bind::<Array<BigInt>, _>(&sizes)
    .bind::<Array<Nullable<Bytea>>, _>(&hashes)
    .execute(conn)
    .await
}

/// Deletes at most `batch` rows that are older than `max_age` or beyond the newest
/// `max_rows`, oldest first; returns how many. Bounded, so a trim never holds many row locks
/// or writes much WAL at once: callers repeat it while it deletes a full batch.
pub async fn trim(
    conn: &mut AsyncPgConnection,
    max_age: Duration,
    max_rows: i64,
    batch: i64,
) -> QueryResult<usize> {
    let max_age_ms = i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX);
    diesel::sql_query(
        "DELETE FROM inbox_rejections WHERE id IN ( \
             SELECT id FROM inbox_rejections \
             WHERE at < now() - $1 * interval '1 millisecond' \
                OR id <= (SELECT max(id) FROM inbox_rejections) - $2 \
             ORDER BY id LIMIT $3)",
    )
    .bind::<BigInt, _>(max_age_ms)
    .bind::<BigInt, _>(max_rows)
    .bind::<BigInt, _>(batch)
    .execute(conn)
    .await
}

/// The refusals of one provider and cause.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct RejectionGroup {
    /// Provider.
    #[diesel(sql_type = Text)]
    pub provider: String,
    /// Cause (the answer's code).
    #[diesel(sql_type = Text)]
    pub cause: String,
    /// HTTP status answered.
    #[diesel(sql_type = SmallInt)]
    pub status: i16,
    /// Rows recorded (the rate limit may have left others out: see the receiver's
    /// `inbox_receiver_rejections_unrecorded_total`).
    #[diesel(sql_type = BigInt)]
    pub count: i64,
    /// First recorded.
    #[diesel(sql_type = Timestamptz)]
    pub first_at: DateTime<Utc>,
    /// Last recorded.
    #[diesel(sql_type = Timestamptz)]
    pub last_at: DateTime<Utc>,
    /// The request id of the last one, to look up in the receiver's logs.
    #[diesel(sql_type = Text)]
    pub sample_request_id: String,
}

/// The refusals recorded since `since` (all kept when `None`), of `provider` (all when
/// `None`), grouped by provider and cause, most frequent first. Reads the `at` or
/// `(provider, at)` index; takes no lock.
pub async fn grouped(
    conn: &mut AsyncPgConnection,
    provider: Option<&str>,
    since: Option<DateTime<Utc>>,
) -> QueryResult<Vec<RejectionGroup>> {
    diesel::sql_query(
        "SELECT provider, cause, status, count(*) AS count, min(at) AS first_at, \
                max(at) AS last_at, (array_agg(request_id ORDER BY id DESC))[1] AS sample_request_id \
         FROM inbox_rejections \
         WHERE ($1::text IS NULL OR provider = $1) AND ($2::timestamptz IS NULL OR at >= $2) \
         GROUP BY provider, cause, status \
         ORDER BY count(*) DESC, provider, cause",
    )
    .bind::<Nullable<Text>, _>(provider)
    .bind::<Nullable<Timestamptz>, _>(since)
    .load(conn)
    .await
}

/// Refusals recorded since `since`. Reads the `at` index; takes no lock.
pub async fn count_since(conn: &mut AsyncPgConnection, since: DateTime<Utc>) -> QueryResult<i64> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let count: Count =
        diesel::sql_query("SELECT count(*) AS n FROM inbox_rejections WHERE at >= $1")
            .bind::<Timestamptz, _>(since)
            .get_result(conn)
            .await?;
    Ok(count.n)
}

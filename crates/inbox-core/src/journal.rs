//! The journal's partitions: `inbox_events` holds one partition per UTC day of receipt
//! (`inbox_events_YYYYMMDD`), created ahead by both binaries, and `inbox_events_kept` for the
//! events of a dropped day that are still wanted. Retention drops whole days: a few kilobytes
//! of WAL, no dead rows, no vacuum, where deleting the same events row by row wrote some
//! 600 bytes of WAL each (see bench/history.md).
//!
//! Dropping a day keeps what must outlive it: events still queued or dead are moved to the
//! kept partition first (their `journal_day` becomes `infinity`), and their dedup keys stay.
//! The kept partition is purged row by row, as it holds few events.

use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Date, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::db::PgPool;
use crate::statuses_sql;

/// Days of partitions kept ready beyond today. Both binaries create them at start and then
/// periodically, so ingest finds its day's partition even after days without a restart.
pub const DAYS_AHEAD: i32 = 2;

/// How often the binaries make sure the days ahead exist.
pub const ENSURE_EVERY: Duration = Duration::from_secs(15 * 60);

/// A partition of the journal.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct JournalPartition {
    /// Its table name.
    #[diesel(sql_type = Text)]
    pub name: String,
    /// The day after the last it holds; `None` for the kept partition.
    #[diesel(sql_type = Nullable<Date>)]
    pub end_day: Option<NaiveDate>,
    /// A detach was begun and not finished (its connection was lost).
    #[diesel(sql_type = Bool)]
    pub detach_pending: bool,
}

impl JournalPartition {
    /// Whether every event it holds was received before `cutoff`.
    fn received_before(&self, cutoff: DateTime<Utc>) -> bool {
        self.end_day
            .and_then(|end| end.and_hms_opt(0, 0, 0))
            .is_some_and(|end| end.and_utc() <= cutoff)
    }
}

/// Creates the partitions of today and of the [`DAYS_AHEAD`] days after it that do not exist
/// yet, and returns how many it created.
///
/// Locks: each creation attaches a new, empty table, which takes a SHARE UPDATE EXCLUSIVE lock
/// on the journal (ingest and reads go on). The function sets a `lock_timeout` of five
/// seconds, so it gives up behind a long-held lock (another attach or detach, an `ANALYZE`
/// of the journal) instead of queueing others behind it; the next run retries.
pub async fn ensure_days_ahead(conn: &mut AsyncPgConnection) -> QueryResult<usize> {
    #[derive(QueryableByName)]
    struct Created {
        #[diesel(sql_type = BigInt)]
        created: i64,
    }
    let created: Created = diesel::sql_query(
        "SELECT count(*) FILTER (WHERE inbox_create_journal_day( \
             (now() AT TIME ZONE 'UTC')::date + ahead)) AS created \
         FROM generate_series(0, $1) AS ahead",
    )
    .bind::<diesel::sql_types::Integer, _>(DAYS_AHEAD)
    .get_result(conn)
    .await?;
    Ok(usize::try_from(created.created).unwrap_or(0))
}

/// Runs [`ensure_days_ahead`] now and every [`ENSURE_EVERY`] (every half minute after a
/// failure: the database may be down), for ever: each binary spawns it once.
pub async fn keep_days_ahead(pool: PgPool) {
    const RETRY: Duration = Duration::from_secs(30);
    loop {
        let result = match pool.get().await {
            Ok(mut conn) => ensure_days_ahead(&mut conn)
                .await
                .map_err(|err| err.to_string()),
            Err(err) => Err(err.to_string()),
        };
        let next = match result {
            Ok(0) => ENSURE_EVERY,
            Ok(created) => {
                tracing::info!(created, "journal day partitions created ahead");
                ENSURE_EVERY
            }
            Err(err) => {
                tracing::warn!(error = %err, "creating the journal's day partitions ahead failed");
                RETRY
            }
        };
        tokio::time::sleep(next).await;
    }
}

/// Creates the partition of one `day` (past days too: tests and imports) unless it exists.
pub async fn ensure_day(conn: &mut AsyncPgConnection, day: NaiveDate) -> QueryResult<bool> {
    #[derive(QueryableByName)]
    struct Created {
        #[diesel(sql_type = Bool)]
        created: bool,
    }
    Ok(
        diesel::sql_query("SELECT inbox_create_journal_day($1) AS created")
            .bind::<Date, _>(day)
            .get_result::<Created>(conn)
            .await?
            .created,
    )
}

/// The journal's partitions, oldest first, the kept partition last.
pub async fn partitions(conn: &mut AsyncPgConnection) -> QueryResult<Vec<JournalPartition>> {
    diesel::sql_query(
        "SELECT part.relname::text AS name, \
                substring(pg_get_expr(part.relpartbound, part.oid) \
                          FROM 'TO \\(''([^'']+)''\\)')::date AS end_day, \
                inherits.inhdetachpending AS detach_pending \
         FROM pg_inherits AS inherits \
         JOIN pg_class AS part ON part.oid = inherits.inhrelid \
         WHERE inherits.inhparent = 'inbox_events'::regclass \
         ORDER BY end_day NULLS LAST, name",
    )
    .load(conn)
    .await
}

/// What dropping old days did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DroppedDays {
    /// Day partitions dropped.
    pub days: usize,
    /// Done events dropped with them.
    pub events: usize,
    /// Events of those days moved to the kept partition (queued or dead).
    pub kept: usize,
    /// The handlers' `processed_events` records of the events dropped.
    pub processed_records: usize,
}

/// Drops every day partition whose events were all received before `cutoff`, oldest first.
/// For each: its events still queued or dead move to the kept partition, the finished rows,
/// dedup keys and `processed_events` records of the others are deleted `batch` at a time
/// (small rows), then the
/// partition is detached concurrently and dropped.
///
/// Locks: the move and the deletes take row locks only; `DETACH PARTITION ... CONCURRENTLY`
/// takes a SHARE UPDATE EXCLUSIVE lock and waits for the transactions that may still read the
/// partition (ingest and claims go on). It cannot run inside a transaction: `conn` must not
/// be in one. A detach interrupted by a lost connection is finished by the next call.
pub async fn drop_days_received_before(
    conn: &mut AsyncPgConnection,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> QueryResult<DroppedDays> {
    let mut dropped = DroppedDays::default();
    for partition in partitions(conn).await? {
        if partition.detach_pending {
            // Its events were settled before the detach began.
            let name = quote_identifier(&partition.name);
            conn.batch_execute(&format!(
                "ALTER TABLE inbox_events DETACH PARTITION {name} FINALIZE"
            ))
            .await?;
            conn.batch_execute(&format!("DROP TABLE {name}")).await?;
            dropped.days += 1;
            continue;
        }
        let Some(end_day) = partition
            .end_day
            .filter(|_| partition.received_before(cutoff))
        else {
            continue;
        };
        dropped.kept += keep_survivors(conn, &partition.name, end_day, batch).await?;
        let (events, processed) = delete_keys_and_outcomes(conn, &partition.name, batch).await?;
        dropped.events += events;
        dropped.processed_records += processed;
        let name = quote_identifier(&partition.name);
        conn.batch_execute(&format!(
            "ALTER TABLE inbox_events DETACH PARTITION {name} CONCURRENTLY"
        ))
        .await?;
        conn.batch_execute(&format!("DROP TABLE {name}")).await?;
        dropped.days += 1;
        tracing::info!(partition = %partition.name, "journal day dropped");
    }
    dropped.days += drop_detached_days(conn).await?;
    Ok(dropped)
}

/// Drops day partitions already detached (a connection lost between the detach and the
/// drop): tables named like a day partition that are no partition of the journal.
async fn drop_detached_days(conn: &mut AsyncPgConnection) -> QueryResult<usize> {
    #[derive(QueryableByName)]
    struct Orphan {
        #[diesel(sql_type = Text)]
        name: String,
    }
    let orphans: Vec<Orphan> = diesel::sql_query(
        "SELECT relname::text AS name FROM pg_class \
         WHERE relkind = 'r' AND NOT relispartition \
           AND relname ~ '^inbox_events_[0-9]{8}$' \
           AND relnamespace = 'public'::regnamespace",
    )
    .load(conn)
    .await?;
    for orphan in &orphans {
        conn.batch_execute(&format!("DROP TABLE {}", quote_identifier(&orphan.name)))
            .await?;
        tracing::info!(partition = %orphan.name, "detached journal day dropped");
    }
    Ok(orphans.len())
}

/// Moves the events of `partition` (received before `end_day`) that are still wanted (queued,
/// or dead and waiting for an operator) to the kept partition, `batch` events of the day per
/// statement, in id order: a day of a long-paused route or of mass dead letters holds
/// millions, and one statement moving them all with their bodies outlasts the statement
/// timeout, failing every purge from then on. Each event is judged by the snapshot of one
/// statement, which sees it either queued or finished whatever transitions run beside it; a
/// done event is never queued again (only dead ones are replayed), so none judged done can
/// need keeping later.
async fn keep_survivors(
    conn: &mut AsyncPgConnection,
    partition: &str,
    end_day: NaiveDate,
    batch: i64,
) -> QueryResult<usize> {
    #[derive(QueryableByName)]
    struct Moved {
        #[diesel(sql_type = BigInt)]
        kept: i64,
        #[diesel(sql_type = BigInt)]
        scanned: i64,
        #[diesel(sql_type = Nullable<BigInt>)]
        last_id: Option<i64>,
    }
    // The batch and the day are written into the statement: a plan made for a bound `LIMIT`
    // expects every row of the day, and joined the whole queue for each batch of it.
    let statement = statuses_sql!(
        "WITH scanned AS ( \
             SELECT id FROM {partition} WHERE id > $1 ORDER BY id LIMIT {batch} \
         ), wanted AS ( \
             SELECT scanned.id FROM scanned \
             WHERE EXISTS (SELECT 1 FROM inbox_queue AS queue WHERE queue.id = scanned.id) \
                OR EXISTS (SELECT 1 FROM inbox_finished AS finished \
                           WHERE finished.id = scanned.id AND finished.status = {dead}) \
         ), kept AS ( \
             UPDATE inbox_events SET journal_day = 'infinity' \
             WHERE journal_day < '{end_day}' AND id = ANY(ARRAY(SELECT id FROM wanted)) \
             RETURNING 1 \
         ) \
         SELECT (SELECT count(*) FROM kept) AS kept, count(*) AS scanned, max(id) AS last_id \
         FROM scanned"
    )
    .replace("{partition}", &quote_identifier(partition))
    .replace("{batch}", &batch.to_string())
    .replace("{end_day}", &end_day.format("%Y-%m-%d").to_string());
    let mut after = i64::MIN;
    let mut kept = 0;
    loop {
        let moved: Moved = diesel::sql_query(&statement)
            .bind::<BigInt, _>(after)
            .get_result(conn)
            .await?;
        kept += usize::try_from(moved.kept).unwrap_or(0);
        match moved.last_id {
            Some(last_id) if moved.scanned == batch => after = last_id,
            _ => return Ok(kept),
        }
    }
}

/// Deletes the finished rows, the dedup keys and the handlers' `processed_events` records of
/// every event left in `partition` (all done, once the survivors are moved), `batch` events
/// per statement, in id order, each record by its key. Returns the events and the records.
async fn delete_keys_and_outcomes(
    conn: &mut AsyncPgConnection,
    partition: &str,
    batch: i64,
) -> QueryResult<(usize, usize)> {
    #[derive(QueryableByName)]
    struct Deleted {
        #[diesel(sql_type = BigInt)]
        events: i64,
        #[diesel(sql_type = BigInt)]
        processed: i64,
        #[diesel(sql_type = Nullable<BigInt>)]
        last_id: Option<i64>,
    }
    // The batch is written into the statement, as in `keep_survivors`.
    let statement = format!(
        "WITH gone AS ( \
             SELECT id, provider, event_id FROM {} WHERE id > $1 ORDER BY id LIMIT {batch} \
         ), outcomes AS ( \
             DELETE FROM inbox_finished WHERE id = ANY(ARRAY(SELECT id FROM gone)) \
         ), keys AS ( \
             DELETE FROM inbox_dedup USING gone \
             WHERE inbox_dedup.provider = gone.provider AND inbox_dedup.event_id = gone.event_id \
         ), processed AS ( \
             DELETE FROM processed_events USING gone \
             WHERE processed_events.provider = gone.provider \
               AND processed_events.event_id = gone.event_id \
             RETURNING 1 \
         ) \
         SELECT count(*) AS events, (SELECT count(*) FROM processed) AS processed, \
                max(id) AS last_id \
         FROM gone",
        quote_identifier(partition)
    );
    let mut after = i64::MIN;
    let (mut events, mut processed) = (0, 0);
    loop {
        let deleted: Deleted = diesel::sql_query(&statement)
            .bind::<BigInt, _>(after)
            .get_result(conn)
            .await?;
        events += usize::try_from(deleted.events).unwrap_or(0);
        processed += usize::try_from(deleted.processed).unwrap_or(0);
        match deleted.last_id {
            Some(last_id) if deleted.events == batch => after = last_id,
            _ => return Ok((events, processed)),
        }
    }
}

/// `name` as a quoted SQL identifier.
fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(text: &str) -> NaiveDate {
        NaiveDate::parse_from_str(text, "%Y-%m-%d").unwrap_or_default()
    }

    #[test]
    fn a_day_is_received_before_a_cutoff_at_or_after_its_end() {
        let partition = JournalPartition {
            name: "inbox_events_20261124".into(),
            end_day: Some(day("2026-11-25")),
            detach_pending: false,
        };
        let at = |text: &str| {
            DateTime::parse_from_rfc3339(text)
                .map(|time| time.with_timezone(&Utc))
                .unwrap_or_default()
        };
        assert!(partition.received_before(at("2026-11-25T00:00:00Z")));
        assert!(!partition.received_before(at("2026-11-24T23:59:59Z")));
        let kept = JournalPartition {
            end_day: None,
            ..partition
        };
        assert!(!kept.received_before(at("2100-01-01T00:00:00Z")));
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(
            quote_identifier("inbox_events_20261124"),
            "\"inbox_events_20261124\""
        );
        assert_eq!(quote_identifier("a\"b"), "\"a\"\"b\"");
    }
}

//! Watching a backlog drain without loading the database that drains it.
//!
//! A drain deletes queue rows roughly in id order, so the front of the queue's heap fills with
//! dead rows. A poll that scanned for any live row (`SELECT 1 FROM inbox_queue LIMIT 1`) would
//! walk over all of them every time: its cost grows with the rows already done, and a slower
//! drain pays more polls of it. This watch looks the queue up by primary key instead, from the
//! lowest id it found live the time before, so each poll starts where the last one stopped.
//!
//! That holds for what the bench waits on: a backlog committed before the watch starts (a
//! prefill, or the soak's load once every request was answered), drained with no replay.
//! Its rows then only leave the queue, and none below the lowest id seen can be live again; a
//! replay (which returns a finished event to the queue under its old id) or an insert still
//! uncommitted when the watch passed its id would be missed.

use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Nullable};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

#[derive(QueryableByName)]
struct Lowest {
    #[diesel(sql_type = Nullable<BigInt>)]
    id: Option<i64>,
}

/// Whether the queue is empty yet, polled by primary key from the last live row seen.
#[derive(Debug, Default)]
pub struct QueueWatch {
    /// No row below this id is in the queue any more.
    live_from: i64,
}

impl QueueWatch {
    /// Whether no row is left in the queue.
    pub async fn is_empty(&mut self, conn: &mut AsyncPgConnection) -> diesel::QueryResult<bool> {
        let lowest: Lowest =
            diesel::sql_query("SELECT min(id) AS id FROM inbox_queue WHERE id >= $1")
                .bind::<BigInt, _>(self.live_from)
                .get_result(conn)
                .await?;
        match lowest.id {
            Some(id) => {
                self.live_from = id;
                Ok(false)
            }
            None => Ok(true),
        }
    }
}

/// Polls the queue every `poll` until it is empty: how long that took, or `None` when `timeout`
/// passed first.
pub async fn wait_empty(
    conn: &mut AsyncPgConnection,
    poll: Duration,
    timeout: Duration,
) -> diesel::QueryResult<Option<Duration>> {
    let started = Instant::now();
    let mut queue = QueueWatch::default();
    while !queue.is_empty(conn).await? {
        if started.elapsed() >= timeout {
            return Ok(None);
        }
        tokio::time::sleep(poll).await;
    }
    Ok(Some(started.elapsed()))
}

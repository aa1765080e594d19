//! The record of refusals: every 4xx answered on a configured provider's path is kept in
//! `inbox_rejections`, so "why were this provider's deliveries refused last night" has an
//! answer (`worker rejections`).
//!
//! The write never slows or fails the answer: a refusal is handed to one background writer
//! through a bounded queue and dropped (and counted) when the queue is full. A flood cannot
//! fill the disk: at most `per_second` refusals per provider per second are recorded (the
//! rest counted), and the writer trims the table by age and row count with bounded deletes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use inbox_core::db::PgPool;
use inbox_core::rejections::{self, NewRejection};
use tokio::sync::mpsc;

use crate::metrics::Metrics;

/// Refusals waiting for the writer at most; beyond, they are dropped and counted.
const QUEUE_CAPACITY: usize = 1024;
/// Most refusals written by one statement.
const WRITE_BATCH: usize = 256;
/// Most rows one trimming statement deletes.
const TRIM_BATCH: i64 = 1_000;
/// How often the writer trims the table.
const TRIM_EVERY: Duration = Duration::from_secs(60);

/// How many refusals are recorded and for how long.
#[derive(Debug, Clone, Copy)]
pub struct RejectionSettings {
    /// Refusals recorded per provider per second at most (0: none recorded).
    pub per_second: u32,
    /// Rows older than this are deleted.
    pub max_age: Duration,
    /// Rows beyond the newest this many are deleted.
    pub max_rows: i64,
}

/// The receiver's handle on the record of refusals.
#[derive(Debug)]
pub struct RejectionLog {
    sender: mpsc::Sender<NewRejection>,
    per_second: u32,
    started: Instant,
    /// Per provider: the second (since `started`) being counted and the refusals admitted
    /// in it. Keys are configured provider names only, so the map stays small.
    admitted: Mutex<HashMap<String, (u64, u32)>>,
    metrics: Metrics,
}

impl RejectionLog {
    /// Starts the writer on `pool`; it stops when the log is dropped.
    pub fn start(
        settings: RejectionSettings,
        pool: PgPool,
        metrics: Metrics,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (sender, receiver) = mpsc::channel(QUEUE_CAPACITY);
        let writer = tokio::spawn(write_refusals(receiver, pool, settings, metrics.clone()));
        let log = Self {
            sender,
            per_second: settings.per_second,
            started: Instant::now(),
            admitted: Mutex::new(HashMap::new()),
            metrics,
        };
        (log, writer)
    }

    /// Whether a refusal of `provider` may be recorded now: within its rate. One not
    /// admitted is counted as rate_limited. Asked before the refusal is built, so a flood
    /// costs no hashing beyond the rate.
    pub fn admit(&self, provider: &str) -> bool {
        let second = self.started.elapsed().as_secs();
        let admitted = match self.admitted.lock() {
            Ok(mut admitted) => {
                let slot = admitted.entry(provider.to_owned()).or_insert((second, 0));
                if slot.0 != second {
                    *slot = (second, 0);
                }
                let admitted = slot.1 < self.per_second;
                if admitted {
                    slot.1 += 1;
                }
                admitted
            }
            // A panic elsewhere while counting: recording refusals is not worth another.
            Err(_) => false,
        };
        if !admitted {
            self.unrecorded(provider, "rate_limited", 1);
        }
        admitted
    }

    /// Hands an admitted refusal to the writer, or drops it (counted) when the queue is full.
    pub fn record(&self, rejection: NewRejection) {
        if let Err(err) = self.sender.try_send(rejection) {
            let rejection = match err {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
            };
            self.unrecorded(&rejection.provider, "queue_full", 1);
        }
    }

    fn unrecorded(&self, provider: &str, reason: &str, count: u64) {
        self.metrics
            .rejections_unrecorded
            .with_label_values(&[provider, reason])
            .inc_by(count);
    }
}

/// The writer: batches what the queue holds into one insert, and trims the table every
/// [`TRIM_EVERY`]. A failed write is logged and counted, never retried: the record is a
/// diagnostic, and retrying would hold a connection the ingest needs.
async fn write_refusals(
    mut receiver: mpsc::Receiver<NewRejection>,
    pool: PgPool,
    settings: RejectionSettings,
    metrics: Metrics,
) {
    let mut next_trim = tokio::time::Instant::now();
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    loop {
        if tokio::time::Instant::now() >= next_trim {
            trim(&pool, settings).await;
            next_trim = tokio::time::Instant::now() + TRIM_EVERY;
        }
        match tokio::time::timeout_at(next_trim, receiver.recv_many(&mut batch, WRITE_BATCH)).await
        {
            Err(_time_to_trim) => continue,
            Ok(0) => return,
            Ok(_) => {}
        }
        let written = async {
            let mut conn = pool.get().await.map_err(|err| err.to_string())?;
            rejections::insert(&mut conn, &batch)
                .await
                .map_err(|err| err.to_string())
        }
        .await;
        if let Err(err) = &written {
            tracing::warn!(error = %err, rows = batch.len(), "recording refusals failed");
        }
        for rejection in batch.drain(..) {
            let provider = rejection.provider.as_str();
            match &written {
                Ok(_) => metrics
                    .rejections_recorded
                    .with_label_values(&[provider])
                    .inc(),
                Err(_) => metrics
                    .rejections_unrecorded
                    .with_label_values(&[provider, "write_failed"])
                    .inc(),
            }
        }
    }
}

/// Deletes rows past the age or count bound, a bounded batch per statement, until a batch
/// comes back short (or ten batches were deleted: the rest waits for the next trim).
async fn trim(pool: &PgPool, settings: RejectionSettings) {
    let result = async {
        let mut conn = pool.get().await.map_err(|err| err.to_string())?;
        let mut deleted = 0;
        for _ in 0..10 {
            let batch =
                rejections::trim(&mut conn, settings.max_age, settings.max_rows, TRIM_BATCH)
                    .await
                    .map_err(|err| err.to_string())?;
            deleted += batch;
            if (batch as i64) < TRIM_BATCH {
                break;
            }
        }
        Ok::<_, String>(deleted)
    }
    .await;
    match result {
        Ok(0) => {}
        Ok(deleted) => tracing::debug!(deleted, "trimmed the record of refusals"),
        Err(err) => tracing::warn!(error = %err, "trimming the record of refusals failed"),
    }
}

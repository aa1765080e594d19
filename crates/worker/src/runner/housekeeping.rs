//! Work on timers of its own, off the claim path: rescue of expired leases, the backlog
//! gauges and retention.

use std::time::Duration;

use inbox_core::operations::{PurgeError, Purged};
use inbox_core::{inbox, operations};
use tokio::sync::watch;

use super::{Worker, WorkerError};

impl Worker {
    /// Runs the rescue, backlog and retention timers until shutdown.
    pub(super) async fn housekeeping(&self, mut shutdown: watch::Receiver<bool>) {
        let mut rescue = tokio::time::interval(self.settings.rescue_interval);
        let mut stats = tokio::time::interval(self.settings.stats_interval);
        let mut retention = tokio::time::interval(
            self.settings
                .retention
                .map_or(Duration::from_secs(3600), |r| r.every),
        );
        for timer in [&mut rescue, &mut stats, &mut retention] {
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        loop {
            tokio::select! {
                _ = rescue.tick() => self.rescue().await,
                _ = stats.tick() => self.refresh_backlog().await,
                _ = retention.tick(), if self.settings.retention.is_some() => self.purge().await,
                _ = shutdown.changed() => return,
            }
        }
    }

    async fn refresh_backlog(&self) {
        let result = async {
            let mut conn = self.connection().await?;
            let backlog = operations::backlog(&mut conn).await?;
            let blocked = inbox_core::ordering::blocked_summary(&mut conn).await?;
            Ok::<_, WorkerError>((backlog, blocked))
        }
        .await;
        match result {
            Ok((backlog, blocked)) => {
                self.metrics.set_backlog(&backlog);
                self.metrics.set_blocked(&blocked);
            }
            Err(err) => tracing::warn!(error = %err, "reading the backlog failed"),
        }
    }

    async fn purge(&self) {
        let Some(retention) = self.settings.retention else {
            return;
        };
        let result = async {
            let mut conn = self.connection().await?;
            Ok::<_, WorkerError>(
                operations::purge_done(
                    &mut conn,
                    retention.keep_done_for,
                    retention.dedup_window,
                    1_000,
                )
                .await?,
            )
        }
        .await;
        match result {
            Ok(purged) if purged != Purged::default() => {
                tracing::info!(
                    events = purged.events,
                    days = purged.days,
                    processed_records = purged.processed_records,
                    suppressed_replays = purged.suppressed_replays,
                    idle_keys = purged.idle_keys,
                    "purged old done events"
                );
            }
            Ok(_) => {}
            // Another replica's purge, on the same timer, is doing the work.
            Err(WorkerError::Purge(PurgeError::AlreadyRunning)) => {
                tracing::debug!("another purge is running; skipped this one");
            }
            Err(err) => tracing::warn!(error = %err, "purging old done events failed"),
        }
    }

    /// Returns expired leases to ready (or dead, when out of attempts).
    pub async fn rescue(&self) {
        let result = async {
            let mut conn = self.connection().await?;
            Ok::<_, WorkerError>(
                inbox::rescue_expired(&mut conn, &self.settings.backoff, 1_000).await?,
            )
        }
        .await;
        match result {
            Ok(rescued) => {
                if rescued.requeued + rescued.dead > 0 {
                    tracing::warn!(
                        requeued = rescued.requeued,
                        dead = rescued.dead,
                        "rescued expired leases"
                    );
                }
                self.metrics
                    .rescued
                    .with_label_values(&["ready"])
                    .inc_by(rescued.requeued as u64);
                self.metrics
                    .rescued
                    .with_label_values(&["dead"])
                    .inc_by(rescued.dead as u64);
            }
            Err(err) => tracing::warn!(error = %err, "rescuing expired leases failed"),
        }
    }
}

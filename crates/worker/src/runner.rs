//! The worker loop: claim due events in batches, run each one's handler in a transaction
//! that also completes it, and settle failures with the backoff policy.
//!
//! The claim is one short statement that commits at once; no row lock is held while a
//! handler runs. The lease (token plus expiry, extended by a heartbeat while the handler
//! runs) is what keeps other workers off the row, and every transition presents the token.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::AsyncConnection;
use futures_util::FutureExt;
use inbox_core::backoff::RetryDecision;
use inbox_core::db::PgPool;
use inbox_core::inbox::{self, TransitionError};
use inbox_core::BackoffPolicy;
use tokio::sync::{watch, Notify, Semaphore};
use uuid::Uuid;

use crate::handler::{Event, Handled, HandlerError, Router};
use crate::metrics::Metrics;

/// How a worker claims and runs events.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Name recorded in `locked_by` (host and process id by default).
    pub name: String,
    /// How long a claim is valid without a heartbeat.
    pub lease: Duration,
    /// Events handled at once by this process.
    pub concurrency: usize,
    /// Most events claimed by one statement.
    pub batch_size: usize,
    /// Idle wait between claims when nothing is due (and no notification arrives).
    pub poll_interval: Duration,
    /// How often expired leases are looked for.
    pub rescue_interval: Duration,
    /// Longest a handler may run before its attempt counts as failed (retryable).
    pub handler_timeout: Duration,
    /// Retry policy.
    pub backoff: BackoffPolicy,
}

/// Why an attempt's transaction did not commit.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error(transparent)]
    Handler(#[from] HandlerError),
    #[error("lease lost")]
    LeaseLost,
    #[error("database: {0}")]
    Database(#[from] diesel::result::Error),
}

impl From<TransitionError> for AttemptError {
    fn from(err: TransitionError) -> Self {
        match err {
            TransitionError::LeaseLost => Self::LeaseLost,
            TransitionError::Database(err) => Self::Database(err),
        }
    }
}

/// A worker process's engine. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Worker {
    pool: PgPool,
    router: Arc<Router>,
    settings: Arc<WorkerSettings>,
    metrics: Metrics,
    wake: Arc<Notify>,
}

impl Worker {
    /// A worker over `pool` running `router`'s handlers.
    pub fn new(pool: PgPool, router: Router, settings: WorkerSettings, metrics: Metrics) -> Self {
        Self {
            pool,
            router: Arc::new(router),
            settings: Arc::new(settings),
            metrics,
            wake: Arc::new(Notify::new()),
        }
    }

    /// Wakes an idle worker at once (a notification that new events were committed).
    pub fn waker(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// Runs until `shutdown` turns true: then stops claiming and waits for the handlers in
    /// flight to finish.
    pub async fn run(&self, mut shutdown: watch::Receiver<bool>) {
        let slots = Arc::new(Semaphore::new(self.settings.concurrency.max(1)));
        let mut last_rescue: Option<Instant> = None;
        while !*shutdown.borrow() {
            if last_rescue.is_none_or(|at| at.elapsed() >= self.settings.rescue_interval) {
                self.rescue().await;
                last_rescue = Some(Instant::now());
            }
            // Claim only what can start now, so claimed rows never sit waiting for a slot.
            let free = slots.available_permits().min(self.settings.batch_size);
            if free == 0 {
                tokio::select! {
                    permit = Arc::clone(&slots).acquire_owned() => drop(permit),
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            let claimed = match self.claim(free).await {
                Ok(claim) => claim,
                Err(err) => {
                    tracing::warn!(error = %err, "claiming events failed; retrying after the poll interval");
                    self.idle(&mut shutdown).await;
                    continue;
                }
            };
            if claimed.events.is_empty() {
                self.idle(&mut shutdown).await;
                continue;
            }
            let token = claimed.lease_token;
            for row in claimed.events {
                let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                    // Cannot happen (we claimed at most the free slots); be safe anyway.
                    self.release(&[row.id], token).await;
                    continue;
                };
                let worker = self.clone();
                tokio::spawn(async move {
                    worker.attempt(Event::from(row), token).await;
                    drop(permit);
                });
            }
        }
        // Wait for every in-flight handler: each holds one permit.
        let total = u32::try_from(self.settings.concurrency.max(1)).unwrap_or(u32::MAX);
        let _all = slots.acquire_many(total).await;
    }

    async fn idle(&self, shutdown: &mut watch::Receiver<bool>) {
        tokio::select! {
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(self.settings.poll_interval) => {}
            _ = shutdown.changed() => {}
        }
    }

    async fn claim(&self, limit: usize) -> anyhow::Result<inbox::Claim> {
        let mut conn = self.pool.get().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Ok(inbox::claim_due(&mut conn, &self.settings.name, self.settings.lease, limit).await?)
    }

    async fn release(&self, ids: &[i64], token: Uuid) {
        let result = async {
            let mut conn = self.pool.get().await?;
            anyhow::Ok(inbox::release_unstarted(&mut conn, ids, token).await?)
        }
        .await;
        if let Err(err) = result {
            tracing::warn!(error = %err, "releasing unstarted events failed; their leases will expire");
        }
    }

    /// Returns expired leases to ready (or dead, when out of attempts).
    pub async fn rescue(&self) {
        let result = async {
            let mut conn = self.pool.get().await?;
            anyhow::Ok(
                inbox::rescue_expired(&mut conn, self.settings.backoff.max_attempts, 1_000).await?,
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

    /// One attempt at one event: handler and completion in one transaction, the lease kept
    /// alive meanwhile; then, on failure, a fenced retry or dead-lettering.
    #[tracing::instrument(skip_all, fields(provider = %event.provider, event_id = %event.event_id, attempt = event.attempt))]
    async fn attempt(&self, event: Event, token: Uuid) {
        let started = Instant::now();
        let outcome = tokio::select! {
            outcome = self.handle_and_complete(&event, token) => outcome,
            never = self.heartbeat(event.id, token) => match never {},
        };
        self.metrics
            .handler_duration
            .with_label_values(&[event.provider.as_str()])
            .observe(started.elapsed().as_secs_f64());
        let event_type = event.event_type.as_deref();
        match outcome {
            Ok(handled) => {
                let label = match handled {
                    Handled::Applied => "done",
                    Handled::Ignored => "ignored",
                };
                self.metrics.count(&event.provider, event_type, label);
            }
            Err(AttemptError::LeaseLost) => {
                tracing::warn!("lease lost before completion: the attempt was rolled back");
                self.metrics.lease_lost.inc();
                self.metrics
                    .count(&event.provider, event_type, "lease_lost");
            }
            Err(AttemptError::Handler(HandlerError::Permanent(reason))) => {
                self.settle_failure(&event, token, &format!("permanent: {reason}"), true)
                    .await;
            }
            Err(err) => {
                self.settle_failure(&event, token, &err.to_string(), false)
                    .await;
            }
        }
    }

    async fn handle_and_complete(
        &self,
        event: &Event,
        token: Uuid,
    ) -> Result<Handled, AttemptError> {
        let handler = self
            .router
            .handler_for(&event.provider, event.event_type.as_deref())
            .cloned();
        let timeout = self.settings.handler_timeout;
        let mut conn = self
            .pool
            .get()
            .await
            .map_err(|err| HandlerError::Retryable(format!("no database connection: {err}")))?;
        conn.transaction::<_, AttemptError, _>(async |tx| {
            let handled = match &handler {
                None => Handled::Ignored,
                Some(handler) => {
                    let run = AssertUnwindSafe(handler.handle(event, tx)).catch_unwind();
                    match tokio::time::timeout(timeout, run).await {
                        Err(_elapsed) => {
                            return Err(HandlerError::Retryable(format!(
                                "handler timed out after {timeout:?}"
                            ))
                            .into())
                        }
                        Ok(Err(panic)) => {
                            return Err(HandlerError::Retryable(format!(
                                "handler panicked: {}",
                                panic_message(&panic)
                            ))
                            .into())
                        }
                        Ok(Ok(result)) => result?,
                    }
                }
            };
            inbox::complete(tx, event.id, token).await?;
            Ok(handled)
        })
        .await
    }

    /// Extends the lease every third of its length for as long as the attempt runs.
    async fn heartbeat(&self, id: i64, token: Uuid) -> std::convert::Infallible {
        let period = self.settings.lease / 3;
        loop {
            tokio::time::sleep(period).await;
            let extended = async {
                let mut conn = self.pool.get().await?;
                anyhow::Ok(inbox::extend_lease(&mut conn, &[id], token, self.settings.lease).await?)
            }
            .await;
            match extended {
                Ok(0) => tracing::warn!("heartbeat found the lease already lost"),
                Ok(_) => {}
                Err(err) => tracing::warn!(error = %err, "heartbeat failed"),
            }
        }
    }

    async fn settle_failure(&self, event: &Event, token: Uuid, error: &str, permanent: bool) {
        let attempt = u32::try_from(event.attempt).unwrap_or(0);
        let decision = if permanent {
            RetryDecision::GiveUp
        } else {
            self.settings.backoff.decide(attempt)
        };
        let result = async {
            let mut conn = self
                .pool
                .get()
                .await
                .map_err(|err| anyhow::anyhow!("{err}"))?;
            match decision {
                RetryDecision::RetryAfter(delay) => {
                    inbox::schedule_retry(&mut conn, event.id, token, delay, error).await?;
                }
                RetryDecision::GiveUp => {
                    inbox::dead_letter(&mut conn, event.id, token, error).await?;
                }
            }
            anyhow::Ok(())
        }
        .await;
        let event_type = event.event_type.as_deref();
        match (result, decision) {
            (Ok(()), RetryDecision::RetryAfter(delay)) => {
                tracing::info!(error, retry_in = ?delay, "attempt failed; retry scheduled");
                self.metrics.count(&event.provider, event_type, "retry");
            }
            (Ok(()), RetryDecision::GiveUp) => {
                tracing::error!(error, "event dead-lettered");
                self.metrics.count(&event.provider, event_type, "dead");
            }
            (Err(err), _) => {
                // The lease will expire and the rescuer will count this as an attempt.
                tracing::warn!(error = %err, "recording the failure failed; the lease will expire");
                if err
                    .downcast_ref::<TransitionError>()
                    .is_some_and(|e| matches!(e, TransitionError::LeaseLost))
                {
                    self.metrics.lease_lost.inc();
                }
            }
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

//! The worker loop: claim due events in batches, run each one's handler in a transaction
//! that also completes it, and settle failures with the backoff policy.
//!
//! The claim is one short statement that commits at once; no row lock is held while a
//! handler runs. The lease (token plus expiry, extended by a heartbeat while the handler
//! runs) is what keeps other workers off the row, and every transition presents the token.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection};
use futures_util::FutureExt;
use inbox_core::backoff::RetryDecision;
use inbox_core::db::PgPool;
use inbox_core::inbox::{self, TransitionError};
use inbox_core::BackoffPolicy;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinSet;
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
    /// Claim loops sharing the concurrency.
    pub claimers: usize,
    /// Most events of batchable handlers sharing one transaction (a savepoint each only when
    /// one of them fails).
    pub transaction_size: usize,
    /// Idle wait between claims when nothing is due (and no notification arrives).
    pub poll_interval: Duration,
    /// How often expired leases are looked for.
    pub rescue_interval: Duration,
    /// Longest a handler may run before its attempt counts as failed (retryable).
    pub handler_timeout: Duration,
    /// Retry policy.
    pub backoff: BackoffPolicy,
    /// On shutdown, how long handlers in flight may take to finish before they are abandoned
    /// (their leases then expire and the events are retried).
    pub shutdown_grace: Duration,
    /// Whether running attempts extend their lease. Off only to simulate a stalled worker.
    pub heartbeat: bool,
    /// How often the backlog gauges are read from the database.
    pub stats_interval: Duration,
    /// Periodic purge of old done rows, if enabled.
    pub retention: Option<Retention>,
}

/// Periodic retention inside the worker.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Done rows older than this are deleted.
    pub keep_done_for: Duration,
    /// Never delete rows younger than this: the providers' redelivery window.
    pub dedup_window: Duration,
    /// How often to purge.
    pub every: Duration,
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
    #[error("no database connection: {0}")]
    NoConnection(String),
}

/// Whether the events of a transaction run in savepoints of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Savepoints {
    /// No savepoints: any failure rolls the whole transaction back.
    None,
    /// Each event in its own savepoint: a failure undoes only that event's writes.
    PerEvent,
}

/// What one event's part of an attempt came to.
#[derive(Debug)]
enum Outcome {
    /// Completed in the attempt's transaction.
    Done(Handled),
    /// Its handler failed; its writes were rolled back.
    Failed(AttemptError),
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

    /// Runs until `shutdown` turns true: then stops claiming, lets the handlers in flight
    /// finish within the shutdown grace, and returns.
    pub async fn run(&self, shutdown: watch::Receiver<bool>) {
        let housekeeping = tokio::spawn({
            let worker = self.clone();
            let shutdown = shutdown.clone();
            async move { worker.housekeeping(shutdown).await }
        });
        // Several claim loops, so one claim's round trip and commit never leaves the others'
        // slots idle; each owns a share of the concurrency.
        let claimers = self
            .settings
            .claimers
            .clamp(1, self.settings.concurrency.max(1));
        let share = self.settings.concurrency.max(1) / claimers;
        let extra = self.settings.concurrency.max(1) % claimers;
        let loops = (0..claimers).map(|index| {
            let slots = share + usize::from(index < extra);
            self.claim_loop(slots, shutdown.clone())
        });
        futures_util::future::join_all(loops).await;
        housekeeping.abort();
    }

    /// Claims and runs events with `concurrency` slots of its own until shutdown, then lets
    /// its handlers in flight finish within the shutdown grace.
    async fn claim_loop(&self, concurrency: usize, mut shutdown: watch::Receiver<bool>) {
        let mut in_flight: JoinSet<()> = JoinSet::new();
        let concurrency = concurrency.max(1);
        let batch_size = self.settings.batch_size.max(1);
        // One permit per event in flight.
        let slots = Arc::new(Semaphore::new(concurrency));
        // Claim in batches: wait for this many free slots unless the worker is idle.
        let worth_claiming = batch_size.min(concurrency.div_ceil(2));
        loop {
            while in_flight.try_join_next().is_some() {}
            if *shutdown.borrow() {
                break;
            }
            let free = slots.available_permits().min(batch_size);
            if free == 0 || (free < worth_claiming && !in_flight.is_empty()) {
                tokio::select! {
                    _ = in_flight.join_next() => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            let claimed = match self.claim(free).await {
                Ok(claim) => claim,
                Err(err) => {
                    tracing::warn!(error = %err, "claiming events failed; retrying after the poll interval");
                    self.idle(&mut shutdown, None).await;
                    continue;
                }
            };
            if claimed.events.is_empty() {
                let next_due = self.next_due().await;
                self.idle(&mut shutdown, next_due).await;
                continue;
            }
            let token = claimed.lease_token;
            if *shutdown.borrow() {
                // Stopping between claim and start: give the rows back, attempts unspent.
                let ids: Vec<i64> = claimed.events.iter().map(|row| row.id).collect();
                self.release(&ids, token).await;
                break;
            }
            for group in self.groups(claimed.events) {
                let size = u32::try_from(group.len()).unwrap_or(u32::MAX);
                let Ok(permits) = Arc::clone(&slots).try_acquire_many_owned(size) else {
                    // Cannot happen: no more was claimed than there were free slots.
                    let ids: Vec<i64> = group.iter().map(|event| event.id).collect();
                    self.release(&ids, token).await;
                    continue;
                };
                let worker = self.clone();
                in_flight.spawn(async move {
                    worker.attempt(group, token).await;
                    drop(permits);
                });
            }
        }
        let running = in_flight.len();
        if running > 0 {
            tracing::info!(running, grace = ?self.settings.shutdown_grace, "waiting for handlers in flight");
        }
        let drained = tokio::time::timeout(self.settings.shutdown_grace, async {
            while in_flight.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                abandoned = in_flight.len(),
                "shutdown grace exceeded: abandoning handlers in flight; their events return when their leases expire"
            );
            in_flight.abort_all();
            while in_flight.join_next().await.is_some() {}
        }
    }

    /// Rescue of expired leases, backlog gauges and retention, on their own timers, off the
    /// claim path.
    async fn housekeeping(&self, mut shutdown: watch::Receiver<bool>) {
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
            let mut conn = self.pool.get().await?;
            anyhow::Ok(inbox_core::operations::backlog(&mut conn).await?)
        }
        .await;
        match result {
            Ok(backlog) => self.metrics.set_backlog(&backlog),
            Err(err) => tracing::warn!(error = %err, "reading the backlog failed"),
        }
    }

    async fn purge(&self) {
        let Some(retention) = self.settings.retention else {
            return;
        };
        let result = async {
            let mut conn = self.pool.get().await?;
            anyhow::Ok(
                inbox_core::operations::purge_done(
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
            Ok(purged) if purged.events + purged.processed_records > 0 => {
                tracing::info!(
                    events = purged.events,
                    processed_records = purged.processed_records,
                    "purged old done events"
                );
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "purging old done events failed"),
        }
    }

    async fn next_due(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        let mut conn = self.pool.get().await.ok()?;
        inbox_core::operations::next_due(&mut conn)
            .await
            .ok()
            .flatten()
    }

    /// Waits for a notification, the next due retry, the poll interval or shutdown, whichever
    /// comes first.
    async fn idle(
        &self,
        shutdown: &mut watch::Receiver<bool>,
        next_due: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        let mut wait = self.settings.poll_interval;
        if let Some(due) = next_due {
            let until_due = (due - chrono::Utc::now())
                .to_std()
                .unwrap_or(Duration::ZERO);
            // A due row another claimer holds locked right now is not ours to spin on.
            wait = wait.min(until_due.max(Duration::from_millis(10)));
        }
        tokio::select! {
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
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

    /// Splits claimed rows into groups, each completed by one transaction: events no route
    /// matches form one group (they need no more than their completion); events of batchable
    /// handlers share groups of up to `transaction_size`; every other event is alone.
    fn groups(&self, rows: Vec<inbox::ClaimedEvent>) -> Vec<Vec<Event>> {
        let size = self.settings.transaction_size.max(1);
        let mut groups = Vec::new();
        let mut unrouted: Vec<Event> = Vec::new();
        let mut shared: Vec<Event> = Vec::with_capacity(size);
        for event in rows.into_iter().map(Event::from) {
            match self
                .router
                .handler_for(&event.provider, event.event_type.as_deref())
            {
                None => unrouted.push(event),
                Some(handler) if handler.batchable() => {
                    shared.push(event);
                    if shared.len() == size {
                        groups.push(std::mem::replace(&mut shared, Vec::with_capacity(size)));
                    }
                }
                Some(_) => groups.push(vec![event]),
            }
        }
        for rest in [shared, unrouted] {
            if !rest.is_empty() {
                groups.push(rest);
            }
        }
        groups
    }

    /// One attempt at a group of events claimed under `token`: their handlers and their
    /// completion in one transaction, the lease kept alive meanwhile; then fenced retries or
    /// dead-lettering for those that failed.
    async fn attempt(&self, events: Vec<Event>, token: Uuid) {
        let ids: Vec<i64> = events.iter().map(|event| event.id).collect();
        let started = Instant::now();
        let result = if self.settings.heartbeat {
            tokio::select! {
                result = self.run_transaction(&events, token) => result,
                never = self.heartbeat(&ids, token) => match never {},
            }
        } else {
            self.run_transaction(&events, token).await
        };
        let elapsed = started.elapsed().as_secs_f64() / events.len() as f64;
        for event in &events {
            self.metrics
                .handler_duration
                .with_label_values(&[event.provider.as_str()])
                .observe(elapsed);
        }
        match result {
            Ok(outcomes) => {
                for (event, outcome) in events.iter().zip(outcomes) {
                    self.settle(event, token, outcome).await;
                }
            }
            Err(AttemptError::LeaseLost) => {
                tracing::warn!(
                    events = events.len(),
                    "lease lost before completion: the attempt was rolled back"
                );
                for event in &events {
                    self.metrics.lease_lost.inc();
                    self.metrics
                        .count(&event.provider, event.event_type.as_deref(), "lease_lost");
                }
            }
            Err(AttemptError::NoConnection(err)) => {
                tracing::warn!(error = %err, "no database connection to start the attempt; giving the events back");
                self.release(&ids, token).await;
            }
            Err(err) if events.len() > 1 => {
                // The shared transaction itself failed (not one handler: those roll back to
                // their savepoint). Isolate: each event again, in a transaction of its own.
                tracing::warn!(error = %err, events = events.len(), "shared transaction failed; retrying its events one by one");
                for event in events {
                    Box::pin(self.attempt(vec![event], token)).await;
                }
            }
            Err(err) => {
                if let Some(event) = events.first() {
                    self.settle(event, token, Outcome::Failed(err)).await;
                }
            }
        }
    }

    /// Runs the handlers of `events` and completes the ones that succeeded, in one
    /// transaction, so that a failure undoes only its own event's writes.
    ///
    /// A single event needs no more than the transaction. Several events first run side by
    /// side without savepoints, the common case where every handler succeeds, and cheapest:
    /// a savepoint costs two more statements per event. If a handler fails, that whole
    /// transaction rolls back and the events run again, each in its own savepoint.
    async fn run_transaction(
        &self,
        events: &[Event],
        token: Uuid,
    ) -> Result<Vec<Outcome>, AttemptError> {
        let unrouted = events.iter().all(|event| {
            self.router
                .handler_for(&event.provider, event.event_type.as_deref())
                .is_none()
        });
        if unrouted {
            return self.complete_unrouted(events, token).await;
        }
        match self.run_events(events, token, Savepoints::None).await {
            // Alone in its transaction, the event's failure is settled after the rollback.
            Err(AttemptError::Handler(_)) if events.len() > 1 => {
                self.metrics.savepoint_reruns.inc();
                self.run_events(events, token, Savepoints::PerEvent).await
            }
            result => result,
        }
    }

    /// A pooled connection for an attempt; none means the events are given back unstarted.
    async fn attempt_connection(
        &self,
    ) -> Result<
        diesel_async::pooled_connection::bb8::PooledConnection<'_, AsyncPgConnection>,
        AttemptError,
    > {
        self.pool
            .get()
            .await
            .map_err(|err| AttemptError::NoConnection(err.to_string()))
    }

    /// Completes events that no handler takes, as ignored: one statement, no transaction
    /// around it, since there is no effect to commit with it.
    async fn complete_unrouted(
        &self,
        events: &[Event],
        token: Uuid,
    ) -> Result<Vec<Outcome>, AttemptError> {
        let mut conn = self.attempt_connection().await?;
        let ids: Vec<i64> = events.iter().map(|event| event.id).collect();
        inbox::complete_all(&mut conn, &ids, token).await?;
        Ok(events
            .iter()
            .map(|_| Outcome::Done(Handled::Ignored))
            .collect())
    }

    /// One transaction running the handlers of `events` and completing the ones that
    /// succeeded.
    async fn run_events(
        &self,
        events: &[Event],
        token: Uuid,
        savepoints: Savepoints,
    ) -> Result<Vec<Outcome>, AttemptError> {
        let mut conn = self.attempt_connection().await?;
        conn.transaction::<_, AttemptError, _>(async |tx| {
            let mut outcomes = Vec::with_capacity(events.len());
            let mut completed = Vec::with_capacity(events.len());
            for event in events {
                let handler = self
                    .router
                    .handler_for(&event.provider, event.event_type.as_deref());
                let outcome = match handler {
                    None => Outcome::Done(Handled::Ignored),
                    Some(handler) if savepoints == Savepoints::PerEvent => {
                        // A nested transaction is a savepoint.
                        match tx
                            .transaction::<_, AttemptError, _>(async |savepoint| {
                                Ok(self.run_handler(handler.as_ref(), event, savepoint).await?)
                            })
                            .await
                        {
                            Ok(handled) => Outcome::Done(handled),
                            Err(AttemptError::Handler(err)) => {
                                Outcome::Failed(AttemptError::Handler(err))
                            }
                            Err(other) => return Err(other),
                        }
                    }
                    // Without savepoints, a failure rolls the transaction back.
                    Some(handler) => {
                        Outcome::Done(self.run_handler(handler.as_ref(), event, tx).await?)
                    }
                };
                if matches!(outcome, Outcome::Done(_)) {
                    completed.push(event.id);
                }
                outcomes.push(outcome);
            }
            inbox::complete_all(tx, &completed, token).await?;
            Ok(outcomes)
        })
        .await
    }

    /// Runs one handler, turning a timeout or a panic into a retryable failure.
    async fn run_handler(
        &self,
        handler: &dyn crate::Handler,
        event: &Event,
        tx: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        let timeout = self.settings.handler_timeout;
        let run = AssertUnwindSafe(handler.handle(event, tx)).catch_unwind();
        match tokio::time::timeout(timeout, run).await {
            Err(_elapsed) => Err(HandlerError::Retryable(format!(
                "handler timed out after {timeout:?}"
            ))),
            Ok(Err(panic)) => Err(HandlerError::Retryable(format!(
                "handler panicked: {}",
                panic_message(&panic)
            ))),
            Ok(Ok(result)) => result,
        }
    }

    /// Records what became of one event of a committed attempt.
    async fn settle(&self, event: &Event, token: Uuid, outcome: Outcome) {
        let event_type = event.event_type.as_deref();
        match outcome {
            Outcome::Done(Handled::Applied) => {
                self.metrics.count(&event.provider, event_type, "done")
            }
            Outcome::Done(Handled::Ignored) => {
                self.metrics.count(&event.provider, event_type, "ignored")
            }
            Outcome::Failed(AttemptError::Handler(HandlerError::Permanent(reason))) => {
                self.settle_failure(event, token, &format!("permanent: {reason}"), true)
                    .await;
            }
            Outcome::Failed(err) => {
                self.settle_failure(event, token, &err.to_string(), false)
                    .await;
            }
        }
    }

    /// Extends the lease every third of its length for as long as the attempt runs.
    async fn heartbeat(&self, ids: &[i64], token: Uuid) -> std::convert::Infallible {
        let period = self.settings.lease / 3;
        loop {
            tokio::time::sleep(period).await;
            let extended = async {
                let mut conn = self.pool.get().await?;
                anyhow::Ok(inbox::extend_lease(&mut conn, ids, token, self.settings.lease).await?)
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

//! The worker engine, one module per responsibility:
//!
//! - [`claim`]: claim loops that schedule claims against free slots, and idling;
//! - [`batch`]: claimed events grouped into transactions, each event routed once;
//! - [`transaction`]: an attempt's transaction, its savepoints and its handlers;
//! - [`attempt`]: one attempt from start to settlement (retry, dead letter, lease lost);
//! - [`lease_keeper`]: one thread keeping the leases of every attempt in flight alive, and
//!   stopping the attempts whose lease it found lost;
//! - [`housekeeping`]: rescue of expired leases, backlog gauges and retention;
//! - [`error`]: the typed errors of these steps.
//!
//! The claim is one short statement that commits at once; no row lock is held while a
//! handler runs. The lease (token plus expiry, extended by the lease keeper while the handler
//! runs) is what keeps other workers off the row, and every transition presents the token.

use std::sync::Arc;

use diesel_async::pooled_connection::bb8::PooledConnection;
use diesel_async::AsyncPgConnection;
use inbox_core::db::{ConnectionSettings, DatabaseArgs, PgPool, SettingsError};
use tokio::sync::{watch, Notify};

use self::claim::ClaimSpacing;
use self::lease_keeper::LeaseKeeper;
use crate::handler::Router;
use crate::metrics::Metrics;

mod attempt;
mod batch;
mod claim;
mod error;
mod housekeeping;
mod lease_keeper;
mod session;
mod settings;
mod transaction;

pub use error::{AttemptError, WorkerError};
pub use settings::{Retention, WorkerSettings};

/// A worker process's engine. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Worker {
    pool: PgPool,
    router: Arc<Router>,
    settings: Arc<WorkerSettings>,
    metrics: Metrics,
    wake: Arc<Notify>,
    claim_spacing: Arc<ClaimSpacing>,
    leases: Arc<LeaseKeeper>,
    /// How the lease keeper and the claim loops open their own connections, outside the pool.
    connections: ConnectionSettings,
}

impl Worker {
    /// A worker on `database` (a pool of its size, one more connection for the lease keeper
    /// and one for each claim loop) running `router`'s handlers. Fails on unreadable connection settings.
    pub fn new(
        database: &DatabaseArgs,
        router: Router,
        settings: WorkerSettings,
        metrics: Metrics,
    ) -> Result<Self, SettingsError> {
        Ok(Self {
            pool: database.pool()?,
            connections: database.connection_settings()?,
            router: Arc::new(router),
            settings: Arc::new(settings),
            metrics,
            wake: Arc::new(Notify::new()),
            claim_spacing: Arc::new(ClaimSpacing::default()),
            leases: Arc::new(LeaseKeeper::default()),
        })
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
        let journal_days = tokio::spawn(inbox_core::journal::keep_days_ahead(self.pool.clone()));
        // The leases need keeping until the last attempt ends, shutdown grace included.
        let lease_keeper = self.settings.heartbeat.then(|| self.start_lease_keeper());
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
        journal_days.abort();
        if let Some(lease_keeper) = lease_keeper {
            lease_keeper.stop().await;
        }
    }

    /// A pooled connection, or [`WorkerError::NoConnection`].
    async fn connection(&self) -> Result<PooledConnection<'_, AsyncPgConnection>, WorkerError> {
        self.pool
            .get()
            .await
            .map_err(|err| WorkerError::NoConnection(err.to_string()))
    }
}

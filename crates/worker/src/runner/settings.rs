//! How a worker claims and runs events: the settings its binary builds from flags.

use std::time::Duration;

use inbox_core::BackoffPolicy;

use crate::limits::DatabaseLimits;

/// How a worker claims and runs events.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Name recorded in `locked_by` (host and process id by default).
    pub name: String,
    /// How long a claim is valid without a heartbeat.
    pub lease: Duration,
    /// Attempts in flight at once (each one transaction and connection): events of handlers
    /// that wait on the network, or transactions of up to `transaction_size` events when every
    /// route is batchable.
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
    /// Shortest time from a claim that was not full (it took every due event) to the
    /// worker's next claim: events arriving meanwhile share that claim.
    pub claim_spacing: Duration,
    /// How often expired leases are looked for.
    pub rescue_interval: Duration,
    /// Longest a handler may run before its attempt counts as failed (retryable); its
    /// statement is then cancelled and its connection closed.
    pub handler_timeout: Duration,
    /// `statement_timeout` and `lock_timeout` of every attempt's transaction, unless its
    /// route sets its own; unset, derived from the lease (see [`DatabaseLimits::resolve`]).
    pub database_limits: DatabaseLimits,
    /// Retry policy.
    pub backoff: BackoffPolicy,
    /// On shutdown, how long handlers in flight may take to finish before they are abandoned
    /// (their leases then expire and the events are retried).
    pub shutdown_grace: Duration,
    /// Whether the lease keeper extends the leases of running attempts. Off only to simulate
    /// a stalled worker.
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

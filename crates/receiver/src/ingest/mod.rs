//! Durable storage of verified events, in one of two modes:
//!
//! - **group commit** (default): requests hand their event to a few writer tasks, each of
//!   which takes everything waiting (up to a batch size) and stores it with one multi-row
//!   statement. A batch forms while the previous one is in flight, so no delay is ever added
//!   on purpose: a lone request is written alone, at once.
//! - **per request**: every request runs its own statement and commit; simple, and the
//!   baseline group commit is measured against.
//!
//! Either way a request's answer waits for its own row's commit, within one deadline per
//! request (`--db-deadline`, counted once from the request's arrival, see
//! [`crate::http::Arrival`]): what receiving and verifying its body left of it is what
//! waiting for a writer, for a connection and for the statement share. Past it the caller
//! answers 503 and the provider retries (the retry is then harmless, answered "duplicate" if
//! the first write did land). A batch is written until the last of its requests' deadlines;
//! once every one of its requests has given up (deadline passed or client gone) its
//! statement is cancelled on the server. A row the database refuses
//! (a constraint, a data exception) is isolated from the rest of its batch ([`write`]), and
//! only its request is refused.

mod write;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, FutureExt as _};
use inbox_core::db::PgPool;
use inbox_core::inbox::NewEvent;
use inbox_core::pg_connect::ConnectionSettings;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::notifier::Notifier;
use write::Store;

/// Default largest number of events stored by one statement.
pub const DEFAULT_MAX_BATCH: usize = 256;
/// Default number of concurrent group-commit writers: one, so that the requests arriving
/// while a batch is written all go into the next one. More writers mean smaller batches, so
/// more statements and commits for the same load, which cost the database more CPU than the
/// overlap saves where commits are fast (see `bench/history.md`).
pub const DEFAULT_WRITERS: usize = 1;
/// Events that may wait for a writer before new requests are turned away with 503: room for
/// the largest batch a request may carry ([`crate::identify::MAX_BATCH_ITEMS`]) beside others.
const QUEUE_CAPACITY: usize = 2 * crate::identify::MAX_BATCH_ITEMS;

/// How events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IngestMode {
    /// Concurrent requests share multi-row insert transactions.
    GroupCommit,
    /// One insert transaction per request.
    PerRequest,
}

/// Why an event was not stored. Every variant but [`StoreError::InvalidRow`] is answered 503:
/// nothing was acked, and the provider's retry may well succeed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused this event's row: a constraint (SQLSTATE class 23) or a value
    /// its column's type cannot hold (class 22, a data exception). No retry can store it, so
    /// it is refused (422). The other events of its batch were written.
    #[error("the database refuses the event's row")]
    InvalidRow(#[source] diesel::result::Error),
    /// No database connection within the deadline (database down, or pool exhausted).
    #[error("no database connection available")]
    NoConnection,
    /// The statement did not finish within the deadline.
    #[error("database did not answer within the deadline")]
    Deadline,
    /// The statement failed.
    #[error("database error")]
    Database(#[source] diesel::result::Error),
    /// Too many events are already waiting to be written.
    #[error("too many events waiting to be written")]
    Overloaded,
    /// The receiver is shutting down.
    #[error("receiver is shutting down")]
    ShuttingDown,
}

impl StoreError {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidRow(_) => "invalid_row",
            Self::NoConnection => "no_connection",
            Self::Deadline => "deadline",
            Self::Database(_) => "query",
            Self::Overloaded => "overloaded",
            Self::ShuttingDown => "shutting_down",
        }
    }
}

struct Pending {
    event: NewEvent,
    /// When its request stops waiting.
    deadline: Instant,
    reply: Reply,
}

/// Stores events durably; cheap to clone.
#[derive(Clone)]
pub struct Ingestor {
    inner: Inner,
    deadline: Duration,
}

#[derive(Clone)]
enum Inner {
    GroupCommit {
        queue: mpsc::Sender<Pending>,
        metrics: Metrics,
    },
    PerRequest(Box<Store>),
}

impl std::fmt::Debug for Ingestor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.inner {
            Inner::GroupCommit { .. } => IngestMode::GroupCommit,
            Inner::PerRequest(_) => IngestMode::PerRequest,
        };
        f.debug_struct("Ingestor")
            .field("mode", &mode)
            .field("deadline", &self.deadline)
            .finish()
    }
}

/// How the ingest path is set up.
#[derive(Debug, Clone)]
pub struct IngestSettings {
    /// Group commit or one transaction per request.
    pub mode: IngestMode,
    /// A request's whole budget, from its arrival to its events' commit (`--db-deadline`).
    pub deadline: Duration,
    /// Most events per group-commit statement.
    pub max_batch: usize,
    /// Most body bytes per group-commit statement (a larger batch is written as several).
    pub max_batch_bytes: usize,
    /// Group-commit writer tasks.
    pub writers: usize,
    /// Shortest time between two notifications that wake the workers.
    pub notify_spacing: Duration,
}

impl Ingestor {
    /// Starts the ingest path. In group-commit mode this spawns `writers` tasks on the current
    /// tokio runtime; they end once every clone of the returned value is dropped and the
    /// events still queued are written. `connection` is used to cancel statements on the
    /// server (`None`: never cancelled, only abandoned).
    pub fn start(
        settings: &IngestSettings,
        pool: PgPool,
        connection: Option<ConnectionSettings>,
        metrics: Metrics,
    ) -> Self {
        let notifier = Notifier::start(pool.clone(), settings.notify_spacing);
        let store = Store {
            pool,
            notifier,
            metrics: metrics.clone(),
            connection,
        };
        let inner = match settings.mode {
            IngestMode::PerRequest => Inner::PerRequest(Box::new(store)),
            IngestMode::GroupCommit => {
                let (sender, receiver) = mpsc::channel(QUEUE_CAPACITY);
                let receiver = Arc::new(Mutex::new(receiver));
                for _ in 0..settings.writers.max(1) {
                    tokio::spawn(run_writer(
                        Arc::clone(&receiver),
                        store.clone(),
                        settings.max_batch.max(1),
                        settings.max_batch_bytes,
                    ));
                }
                Inner::GroupCommit {
                    queue: sender,
                    metrics,
                }
            }
        };
        Self {
            inner,
            deadline: settings.deadline,
        }
    }

    fn metrics(&self) -> &Metrics {
        match &self.inner {
            Inner::GroupCommit { metrics, .. } => metrics,
            Inner::PerRequest(store) => &store.metrics,
        }
    }

    /// The deadline of a request that arrived at `arrival`: one budget for receiving and
    /// verifying its body, waiting for a writer, for a connection and for the statement,
    /// however they share it.
    pub fn deadline_for(&self, arrival: Instant) -> Instant {
        arrival + self.deadline
    }

    /// Stores the events of one request and returns once each row is committed (or known to
    /// exist), or at `deadline` with [`StoreError::Deadline`]: one answer per event, in order.
    /// In group commit the request's events enter the writers' queue together or not at all
    /// ([`StoreError::Overloaded`]): a batch admitted in part would write its head and be
    /// answered 503 for its tail, again at every retry.
    pub async fn store_all(&self, events: Vec<NewEvent>, deadline: Instant) -> Vec<write::Answer> {
        let refuse_all = |error: StoreError, count: usize| {
            self.metrics().observe_failure(&error);
            let error = Arc::new(error);
            vec![Err(error); count]
        };
        if deadline <= Instant::now() {
            // Receiving and verifying its body took the whole budget: no writer or connection
            // is worth taking for it.
            return refuse_all(StoreError::Deadline, events.len());
        }
        match &self.inner {
            Inner::PerRequest(store) => {
                // Were the request dropped (its client gone), this future would be too.
                let never = std::future::pending();
                store.write_events(&events, deadline, never).await
            }
            Inner::GroupCommit { queue, metrics } => {
                let count = events.len();
                let permits = match queue.try_reserve_many(count) {
                    Ok(permits) => permits,
                    Err(mpsc::error::TrySendError::Full(())) => {
                        return refuse_all(StoreError::Overloaded, count)
                    }
                    Err(mpsc::error::TrySendError::Closed(())) => {
                        return refuse_all(StoreError::ShuttingDown, count)
                    }
                };
                // Counted before they are sent, so a writer never takes them off the gauge first.
                metrics
                    .ingest_queue
                    .add(i64::try_from(count).unwrap_or(i64::MAX));
                let answers: Vec<_> = permits
                    .zip(events)
                    .map(|(permit, event)| {
                        let (reply, answer) = oneshot::channel();
                        permit.send(Pending {
                            event,
                            deadline,
                            reply,
                        });
                        answer
                    })
                    .collect();
                // Dropping an `answer` is what tells the writer its request gave up.
                join_all(answers.into_iter().map(|answer| async move {
                    match tokio::time::timeout_at(deadline, answer).await {
                        Ok(Ok(result)) => result,
                        Ok(Err(_writer_gone)) => Err(Arc::new(StoreError::ShuttingDown)),
                        Err(_elapsed) => Err(Arc::new(StoreError::Deadline)),
                    }
                }))
                .await
            }
        }
    }
}

async fn run_writer(
    queue: Arc<Mutex<mpsc::Receiver<Pending>>>,
    store: Store,
    max_batch: usize,
    max_batch_bytes: usize,
) {
    let mut batch: Vec<Pending> = Vec::with_capacity(max_batch);
    loop {
        {
            // Only one writer collects at a time; the others are writing meanwhile.
            let mut queue = queue.lock().await;
            let taken = queue.recv_many(&mut batch, max_batch).await;
            if taken == 0 {
                return; // every sender is gone and the queue is drained
            }
            store
                .metrics
                .ingest_queue
                .sub(i64::try_from(taken).unwrap_or(i64::MAX));
        }
        // Large bodies make several statements of at most `max_batch_bytes` each (one event
        // at least), in arrival order.
        while !batch.is_empty() {
            let mut bytes = 0;
            let count = batch
                .iter()
                .take_while(|pending| {
                    bytes += pending.event.body.len();
                    bytes <= max_batch_bytes
                })
                .count()
                .max(1);
            let group: Vec<Pending> = batch.drain(..count).collect();
            // A panic costs its group's requests their answer (503: "writer gone"), never the
            // writer: with one writer, every later request would be answered 503.
            if let Err(panic) = AssertUnwindSafe(write_group(&store, group))
                .catch_unwind()
                .await
            {
                tracing::error!(
                    panic = panic
                        .downcast_ref::<&str>()
                        .copied()
                        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                        .unwrap_or("?"),
                    "writing a group of events panicked; its requests were answered 503"
                );
            }
        }
    }
}

/// Writes one group of queued events and answers each of their requests.
async fn write_group(store: &Store, mut group: Vec<Pending>) {
    // Requests that already gave up (deadline passed, client gone) need no write.
    let now = Instant::now();
    group.retain(|pending| !pending.reply.is_closed() && pending.deadline > now);
    // Worth writing while any of its requests still waits.
    let Some(deadline) = group.iter().map(|pending| pending.deadline).max() else {
        return;
    };
    let (events, mut replies): (Vec<NewEvent>, Vec<Reply>) = group
        .into_iter()
        .map(|pending| (pending.event, pending.reply))
        .unzip();
    let all_gave_up = join_all(replies.iter_mut().map(Reply::closed)).map(|_| ());
    let answers = store.write_events(&events, deadline, all_gave_up).await;
    for (reply, answer) in replies.into_iter().zip(answers) {
        let _gone = reply.send(answer);
    }
}

type Reply = oneshot::Sender<write::Answer>;

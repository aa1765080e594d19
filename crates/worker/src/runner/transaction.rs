//! An attempt's transaction: the handlers of a batch and the completion of the events that
//! succeeded commit together, so a handler's effect and its event's `done` are one fact.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use futures_util::FutureExt;
use inbox_core::inbox::{self, ClaimedEvent};
use uuid::Uuid;

use super::batch::Routed;
use super::session::{self, AttemptSession};
use super::{AttemptError, Worker, WorkerError};
use crate::handler::{Event, Handled, Handler, HandlerError, OutsideWork};
use crate::limits::AttemptLimits;

/// Whether the events of a transaction run in savepoints of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Savepoints {
    /// No savepoints: any failure rolls the whole transaction back.
    None,
    /// Each event in its own savepoint: a failure undoes only that event's writes.
    PerEvent,
}

/// What an attempt's transaction came to: each event's outcome, and the events it handed
/// on (claimed, under the attempt's lease, in the transaction that completed their keys'
/// events: see [`inbox::hand_on_keys`]).
#[derive(Debug, Default)]
pub(super) struct Committed {
    pub(super) outcomes: Vec<Outcome>,
    pub(super) handed_on: Vec<ClaimedEvent>,
}

/// What one event's part of an attempt came to.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Completed in the attempt's transaction.
    Done(Handled),
    /// Its handler failed; its writes were rolled back.
    Failed(AttemptError),
}

impl Worker {
    /// Runs the handlers of `batch` and completes the ones that succeeded, in one
    /// transaction, so that a failure undoes only its own event's writes.
    ///
    /// A single event needs no more than the transaction. Several events first run side by
    /// side without savepoints, the common case where every handler succeeds, and cheapest:
    /// a savepoint costs two more statements per event. If a handler fails, that whole
    /// transaction rolls back and the events run again, each in its own savepoint.
    pub(super) async fn run_transaction(
        &self,
        batch: &[Routed],
        token: Uuid,
        session: &AttemptSession,
    ) -> Result<Committed, AttemptError> {
        match self
            .run_events(batch, token, Savepoints::None, session)
            .await
        {
            // Alone in its transaction, the event's failure is settled after the rollback.
            Err(AttemptError::Handler(_)) if batch.len() > 1 => {
                self.metrics.savepoint_reruns.inc();
                self.run_events(batch, token, Savepoints::PerEvent, session)
                    .await
            }
            result => result,
        }
    }

    /// Completes events that no handler takes, as ignored (see [`Self::complete_alone`]).
    pub(super) async fn complete_unrouted(
        &self,
        events: &[Event],
        token: Uuid,
    ) -> Result<Committed, AttemptError> {
        let handed_on = self.complete_alone(events, token).await?;
        Ok(Committed {
            outcomes: events
                .iter()
                .map(|_| Outcome::Done(Handled::Ignored))
                .collect(),
            handed_on,
        })
    }

    /// Runs an event whose handler works outside the database (`work`, its
    /// [`Handler::outside_work`]): the work first, holding no connection however long its
    /// target takes, then, if it succeeded, the completion (see [`Self::complete_alone`]).
    pub(super) async fn run_outside(
        &self,
        routed: &Routed,
        work: &dyn OutsideWork,
        token: Uuid,
        session: &AttemptSession,
    ) -> Result<Committed, AttemptError> {
        let run = AssertUnwindSafe(work.run(&routed.event)).catch_unwind();
        let handled = self.guarded(run, session).await?;
        let handed_on = self
            .complete_alone(std::slice::from_ref(&routed.event), token)
            .await?;
        Ok(Committed {
            outcomes: vec![Outcome::Done(handled)],
            handed_on,
        })
    }

    /// Completes `events`, which have no effect to commit with them: one statement, no
    /// transaction around it; with their keys' next events handed on in the same transaction
    /// when some are ordered.
    async fn complete_alone(
        &self,
        events: &[Event],
        token: Uuid,
    ) -> Result<Vec<ClaimedEvent>, AttemptError> {
        let mut conn = self.connection().await?;
        let ids: Vec<i64> = events.iter().map(|event| event.id).collect();
        let keys: Vec<&str> = events
            .iter()
            .filter_map(|event| event.ordering_key.as_deref())
            .collect();
        if keys.is_empty() {
            complete(&mut conn, &ids, token, false).await?;
            return Ok(Vec::new());
        }
        conn.transaction::<_, AttemptError, _>(async |tx| {
            complete(tx, &ids, token, true).await?;
            Ok(self.hand_on(tx, &keys, token).await?)
        })
        .await
    }

    /// The next events of `keys`, whose events this transaction completed, claimed under
    /// `token` ([`inbox::hand_on_keys`]).
    async fn hand_on(
        &self,
        tx: &mut AsyncPgConnection,
        keys: &[&str],
        token: Uuid,
    ) -> diesel::QueryResult<Vec<ClaimedEvent>> {
        let (name, lease) = (&self.settings.name, self.settings.lease);
        inbox::hand_on_keys(tx, keys, name, token, lease).await
    }

    /// One transaction running the handlers of `batch` and completing the ones that
    /// succeeded, under the statement and lock timeouts of their routes. A connection whose
    /// handler was abandoned mid-statement is closed rather than pooled again.
    async fn run_events(
        &self,
        batch: &[Routed],
        token: Uuid,
        savepoints: Savepoints,
        session: &AttemptSession,
    ) -> Result<Committed, AttemptError> {
        let mut conn = self.connection().await?;
        session.reset();
        let result = conn
            .transaction::<_, AttemptError, _>(async |tx| {
                let mut outcomes = Vec::with_capacity(batch.len());
                let mut completed = Vec::with_capacity(batch.len());
                let mut current_limits = None;
                for run in same_handler_runs(batch, |routed| self.attempt_limits(routed)) {
                    let limits = self.attempt_limits(&run[0]);
                    if current_limits != Some(limits) {
                        session.started_on(session::limit_transaction(tx, limits).await?);
                        current_limits = Some(limits);
                    }
                    let handler = run[0].handler.as_ref();
                    match savepoints {
                        Savepoints::PerEvent => {
                            for Routed { event, .. } in run {
                                outcomes.push(
                                    self.run_in_savepoint(handler, event, tx, session).await?,
                                );
                            }
                        }
                        // Without savepoints, a failure rolls the transaction back.
                        Savepoints::None => {
                            let events: Vec<&Event> = run.iter().map(|r| &r.event).collect();
                            let handled = self.run_handlers(handler, &events, tx, session).await?;
                            outcomes.extend(handled.into_iter().map(Outcome::Done));
                        }
                    }
                }
                let mut keys: Vec<&str> = Vec::new();
                for (routed, outcome) in batch.iter().zip(&outcomes) {
                    if matches!(outcome, Outcome::Done(_)) {
                        completed.push(routed.event.id);
                        keys.extend(routed.event.ordering_key.as_deref());
                    }
                }
                complete(tx, &completed, token, !keys.is_empty()).await?;
                let handed_on = self.hand_on(tx, &keys, token).await?;
                Ok(Committed {
                    outcomes,
                    handed_on,
                })
            })
            .await;
        if session.is_abandoned() {
            session::discard(&mut conn);
        }
        result
    }

    /// The timeouts of `routed`'s attempt: its route's, else the worker's, else the lease's.
    fn attempt_limits(&self, routed: &Routed) -> AttemptLimits {
        routed
            .limits
            .or(self.settings.database_limits)
            .resolve(self.settings.lease)
    }

    /// Runs one handler in a savepoint (a nested transaction): its failure undoes only its
    /// own writes and becomes its event's outcome; any other failure ends the transaction.
    async fn run_in_savepoint(
        &self,
        handler: &dyn Handler,
        event: &Event,
        tx: &mut AsyncPgConnection,
        session: &AttemptSession,
    ) -> Result<Outcome, AttemptError> {
        let result = tx
            .transaction::<_, AttemptError, _>(async |savepoint| {
                Ok(self.run_handler(handler, event, savepoint, session).await?)
            })
            .await;
        match result {
            Ok(handled) => Ok(Outcome::Done(handled)),
            Err(AttemptError::Handler(err)) => Ok(Outcome::Failed(AttemptError::Handler(err))),
            Err(other) => Err(other),
        }
    }

    /// Runs one handler on `events` of a shared transaction (one event: its `handle`; more:
    /// its `handle_batch`), as [`Self::run_handler`] runs one.
    async fn run_handlers(
        &self,
        handler: &dyn Handler,
        events: &[&Event],
        tx: &mut AsyncPgConnection,
        session: &AttemptSession,
    ) -> Result<Vec<Handled>, HandlerError> {
        if let [event] = events {
            return Ok(vec![self.run_handler(handler, event, tx, session).await?]);
        }
        let run = AssertUnwindSafe(handler.handle_batch(events, tx)).catch_unwind();
        let handled = self.guarded(run, session).await?;
        if handled.len() != events.len() {
            return Err(HandlerError::Retryable(format!(
                "handler returned {} results for {} events",
                handled.len(),
                events.len()
            )));
        }
        Ok(handled)
    }

    /// Runs one handler, turning a timeout or a panic into a retryable failure. A handler
    /// that timed out may have left a statement running (waiting on a lock, say): it is
    /// cancelled on the server, so the rollback that follows does not wait behind it.
    async fn run_handler(
        &self,
        handler: &dyn Handler,
        event: &Event,
        tx: &mut AsyncPgConnection,
        session: &AttemptSession,
    ) -> Result<Handled, HandlerError> {
        let run = AssertUnwindSafe(handler.handle(event, tx)).catch_unwind();
        self.guarded(run, session).await
    }

    /// Awaits a handler's `run` within the handler timeout, turning a timeout or a panic into
    /// a retryable failure.
    async fn guarded<T>(
        &self,
        run: impl std::future::Future<Output = std::thread::Result<Result<T, HandlerError>>>,
        session: &AttemptSession,
    ) -> Result<T, HandlerError> {
        let timeout = self.settings.handler_timeout;
        match tokio::time::timeout(timeout, run).await {
            Err(_elapsed) => {
                self.cancel_statement(session).await;
                Err(HandlerError::Retryable(format!(
                    "handler timed out after {timeout:?}"
                )))
            }
            Ok(Err(panic)) => Err(HandlerError::Retryable(format!(
                "handler panicked: {}",
                panic_message(&panic)
            ))),
            Ok(Ok(result)) => result,
        }
    }

    /// Cancels, from another connection, whatever statement the attempt's backend runs, and
    /// marks the attempt's connection for closing.
    pub(super) async fn cancel_statement(&self, session: &AttemptSession) {
        session.abandon();
        let Some(pid) = session.backend() else {
            return;
        };
        let cancelled = async {
            let mut conn = self.connection().await?;
            Ok::<_, WorkerError>(session::cancel_statement(&mut conn, pid).await?)
        }
        .await;
        if let Err(err) = cancelled {
            // The statement still ends at its statement_timeout or lock_timeout.
            tracing::warn!(error = %err, pid, "cancelling an abandoned statement failed");
        }
    }
}

/// `batch` cut into runs of consecutive events with the same handler and the same limits:
/// each run is one call of its handler in the transaction's first pass.
fn same_handler_runs<L: PartialEq>(
    batch: &[Routed],
    limits: impl Fn(&Routed) -> L,
) -> Vec<&[Routed]> {
    let mut runs = Vec::new();
    let mut start = 0;
    for end in 1..=batch.len() {
        let boundary = end == batch.len()
            || !Arc::ptr_eq(&batch[end].handler, &batch[start].handler)
            || limits(&batch[end]) != limits(&batch[start]);
        if boundary {
            runs.push(&batch[start..end]);
            start = end;
        }
    }
    runs
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Completes `ids`, locking their ordering keys in key order first when some are `ordered`
/// (see [`inbox::complete_all_keyed`]); unordered events pay nothing for it.
async fn complete(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    token: Uuid,
    ordered: bool,
) -> Result<(), inbox::TransitionError> {
    if ordered {
        inbox::complete_all_keyed(conn, ids, token).await
    } else {
        inbox::complete_all(conn, ids, token).await
    }
}

//! An attempt's transaction: the handlers of a batch and the completion of the events that
//! succeeded commit together, so a handler's effect and its event's `done` are one fact.
//!
//! A transaction that completes an ordered event claims its key's next event in the same
//! transaction (the hand-on). When those next events can run in the database alone (no
//! route, or a batchable handler) and the transaction has room for them (`transaction_size`
//! events in all), they run in it too, one step after the other: a busy key's events are
//! then handled one at a time with one commit for many of them, instead of one each.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use futures_util::FutureExt;
use inbox_core::inbox::{self, KeyLocks};
use uuid::Uuid;

use super::batch::{Batch, Routed};
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

/// What an attempt's transaction came to: each event's outcome, the events handed on that
/// it ran itself, and the events it handed on to run next (claimed, under the attempt's
/// lease, in the transaction that completed their keys' events: see
/// [`inbox::complete_all_keyed`]).
#[derive(Default)]
pub(super) struct Committed {
    /// The outcomes of the attempt's batch, then of each batch of `continued`, in order.
    pub(super) outcomes: Vec<Outcome>,
    /// Events handed on and run in the same transaction, batch after batch.
    pub(super) continued: Vec<Batch>,
    /// Events handed on to run next, in batches.
    pub(super) handed_on: Vec<Batch>,
}

/// What the steps of one transaction share: how they run their handlers, and the timeouts
/// the transaction is under now.
struct Steps<'a> {
    token: Uuid,
    savepoints: Savepoints,
    session: &'a AttemptSession,
    limits: Option<AttemptLimits>,
    /// Whether the transaction holds the keys of the step's events: it does once a step
    /// handed them on.
    keys: KeyLocks,
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
                self.rerun_in_savepoints(batch, token, session).await
            }
            // An event handed on in the transaction failed: it is not the batch's failure.
            Err(AttemptError::HandedOn(_)) => self.rerun_in_savepoints(batch, token, session).await,
            result => result,
        }
    }

    /// Runs `batch` again after its transaction rolled back, each event in a savepoint.
    ///
    /// Its leases are renewed first: the transaction held the rows locked from its first
    /// completion on, and the lease keeper passes over locked rows, so a long chain of events
    /// handed on may have let their leases run out (the rerun then finds out which at its
    /// completion, fenced as always).
    async fn rerun_in_savepoints(
        &self,
        batch: &[Routed],
        token: Uuid,
        session: &AttemptSession,
    ) -> Result<Committed, AttemptError> {
        self.metrics.savepoint_reruns.inc();
        let ids: Vec<i64> = batch.iter().map(|routed| routed.event.id).collect();
        self.lost_leases(&ids, token).await;
        self.run_events(batch, token, Savepoints::PerEvent, session)
            .await
    }

    /// Completes events that no handler takes, as ignored (see [`Self::complete_alone`]).
    pub(super) async fn complete_unrouted(
        &self,
        events: &[Event],
        token: Uuid,
    ) -> Result<Committed, AttemptError> {
        self.complete_alone(events, Handled::Ignored, token).await
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
        self.complete_alone(std::slice::from_ref(&routed.event), handled, token)
            .await
    }

    /// Completes `events`, which have no effect to commit with them (each was `handled`):
    /// one statement, no transaction around it, which hands the keys of ordered events on to
    /// their next events. When the transaction has room for those, it is opened around the
    /// statement, and the events handed on that need no handler are completed in it too, as
    /// ignored.
    async fn complete_alone(
        &self,
        events: &[Event],
        handled: Handled,
        token: Uuid,
    ) -> Result<Committed, AttemptError> {
        let mut conn = self.connection().await?;
        let mut committed = Committed {
            outcomes: events.iter().map(|_| Outcome::Done(handled)).collect(),
            ..Committed::default()
        };
        if events.iter().all(|event| event.ordering_key.is_none()) {
            let ids: Vec<i64> = events.iter().map(|event| event.id).collect();
            inbox::complete_all(&mut conn, &ids, token).await?;
            return Ok(committed);
        }
        // The keyed completion is one statement: with no room left for the events it hands on,
        // it needs no transaction around it.
        if !self.fits_in_transaction(events.len() + 1) {
            committed.handed_on = self
                .complete_step(&mut conn, events, token, KeyLocks::Take)
                .await?;
            return Ok(committed);
        }
        conn.transaction::<_, AttemptError, _>(async |tx| {
            let mut handed_on = self
                .complete_step(tx, events, token, KeyLocks::Take)
                .await?;
            let mut ran = events.len();
            while self.can_continue(&handed_on, ran, Continuing::Unrouted) {
                ran += self.count_handed_on(&handed_on);
                let mut next = Vec::new();
                for step in std::mem::take(&mut handed_on) {
                    if let Batch::Unrouted(events) = &step {
                        next.extend(
                            self.complete_step(tx, events, token, KeyLocks::Held)
                                .await?,
                        );
                        committed.outcomes.extend(ignored(events.len()));
                    }
                    committed.continued.push(step);
                }
                handed_on = next;
            }
            committed.handed_on = handed_on;
            Ok(committed)
        })
        .await
    }

    /// Completes `events` as ignored in `tx`, and hands their keys on.
    async fn complete_step(
        &self,
        tx: &mut AsyncPgConnection,
        events: &[Event],
        token: Uuid,
        keys: KeyLocks,
    ) -> Result<Vec<Batch>, AttemptError> {
        let ids: Vec<i64> = events.iter().map(|event| event.id).collect();
        let ordered = events.iter().any(|event| event.ordering_key.is_some());
        Ok(self
            .complete_and_hand_on(tx, &ids, ordered, token, keys)
            .await?)
    }

    /// Whether the transaction that handed `handed_on` on, having run `ran` events, runs
    /// them too: there are some, they fit in `transaction_size`, and each needs no handler
    /// (`Continuing::Unrouted`) or, with `Continuing::InDatabase`, one that works in the
    /// database alone.
    fn can_continue(&self, handed_on: &[Batch], ran: usize, continuing: Continuing) -> bool {
        let events: usize = handed_on.iter().map(Batch::len).sum();
        events > 0
            && self.fits_in_transaction(ran + events)
            && handed_on.iter().all(|batch| match batch {
                Batch::Unrouted(_) => true,
                Batch::Routed(routed) => {
                    continuing == Continuing::InDatabase
                        && routed.iter().all(|one| one.handler.batchable())
                }
            })
    }

    /// Whether `events` fit in one transaction (`transaction_size`).
    fn fits_in_transaction(&self, events: usize) -> bool {
        events <= self.settings.transaction_size.max(1)
    }

    /// Counts `handed_on`, events a transaction runs itself, as handed on; returns how many.
    fn count_handed_on(&self, handed_on: &[Batch]) -> usize {
        let events: usize = handed_on.iter().map(Batch::len).sum();
        self.metrics.handed_on.inc_by(events as u64);
        events
    }

    /// Completes `ids` in `tx`; when some are `ordered`, hands their keys on to their next
    /// events ([`inbox::complete_all_keyed`]) and returns these, claimed under
    /// `token`, in batches. Unordered events pay nothing for it.
    async fn complete_and_hand_on(
        &self,
        tx: &mut AsyncPgConnection,
        ids: &[i64],
        ordered: bool,
        token: Uuid,
        keys: KeyLocks,
    ) -> Result<Vec<Batch>, inbox::TransitionError> {
        if !ordered {
            inbox::complete_all(tx, ids, token).await?;
            return Ok(Vec::new());
        }
        let (name, lease) = (&self.settings.name, self.settings.lease);
        let handed_on = inbox::complete_all_keyed(tx, ids, token, name, lease, keys).await?;
        Ok(self.batches_of(handed_on))
    }

    /// One transaction running the handlers of `batch` and completing the ones that
    /// succeeded, under the statement and lock timeouts of their routes; then the events it
    /// hands on, while they can run in it. A connection whose handler was abandoned
    /// mid-statement is closed rather than pooled again.
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
                let mut steps = Steps {
                    token,
                    savepoints,
                    session,
                    limits: None,
                    keys: KeyLocks::Take,
                };
                let (outcomes, mut handed_on) = self.run_step(tx, batch, &mut steps).await?;
                let mut committed = Committed {
                    outcomes,
                    ..Committed::default()
                };
                let mut ran = batch.len();
                steps.keys = KeyLocks::Held;
                while self.can_continue(&handed_on, ran, Continuing::InDatabase) {
                    ran += self.count_handed_on(&handed_on);
                    let mut next = Vec::new();
                    for step in std::mem::take(&mut handed_on) {
                        let (outcomes, more) = match &step {
                            Batch::Unrouted(events) => {
                                let more = self
                                    .complete_step(tx, events, token, KeyLocks::Held)
                                    .await?;
                                (ignored(events.len()), more)
                            }
                            Batch::Routed(routed) => self
                                .run_step(tx, routed, &mut steps)
                                .await
                                .map_err(handed_on_failure)?,
                        };
                        committed.outcomes.extend(outcomes);
                        committed.continued.push(step);
                        next.extend(more);
                    }
                    handed_on = next;
                }
                committed.handed_on = handed_on;
                Ok(committed)
            })
            .await;
        if session.is_abandoned() {
            session::discard(&mut conn);
        }
        // The connection goes back to the pool and its backend to another attempt: nothing may
        // cancel it on this attempt's behalf any more (a lease lost while the rerun waits for a
        // connection).
        session.ended();
        result
    }

    /// One step of a transaction: the handlers of `batch`, the completion of the events that
    /// succeeded, and their keys handed on. Returns each event's outcome and the events
    /// handed on.
    async fn run_step(
        &self,
        tx: &mut AsyncPgConnection,
        batch: &[Routed],
        steps: &mut Steps<'_>,
    ) -> Result<(Vec<Outcome>, Vec<Batch>), AttemptError> {
        let session = steps.session;
        let mut outcomes = Vec::with_capacity(batch.len());
        for run in same_handler_runs(batch, |routed| self.attempt_limits(routed)) {
            let limits = self.attempt_limits(&run[0]);
            if steps.limits != Some(limits) {
                session.started_on(session::limit_transaction(tx, limits).await?);
                steps.limits = Some(limits);
            }
            let handler = run[0].handler.as_ref();
            match steps.savepoints {
                Savepoints::PerEvent => {
                    for Routed { event, .. } in run {
                        outcomes.push(self.run_in_savepoint(handler, event, tx, session).await?);
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
        let mut completed = Vec::with_capacity(batch.len());
        let mut ordered = false;
        for (routed, outcome) in batch.iter().zip(&outcomes) {
            if matches!(outcome, Outcome::Done(_)) {
                completed.push(routed.event.id);
                ordered |= routed.event.ordering_key.is_some();
            }
        }
        let handed_on = self
            .complete_and_hand_on(tx, &completed, ordered, steps.token, steps.keys)
            .await?;
        Ok((outcomes, handed_on))
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

/// Which events handed on a transaction runs itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Continuing {
    /// Only events that need no handler (a transaction with no handler's timeouts set).
    Unrouted,
    /// Those, and events of handlers that work in the database alone.
    InDatabase,
}

/// `count` outcomes of events completed without a handler.
fn ignored(count: usize) -> Vec<Outcome> {
    (0..count)
        .map(|_| Outcome::Done(Handled::Ignored))
        .collect()
}

/// A handler's failure in an event handed on within the transaction, told apart from a
/// failure of the attempt's own events.
fn handed_on_failure(err: AttemptError) -> AttemptError {
    match err {
        AttemptError::Handler(err) => AttemptError::HandedOn(err),
        other => other,
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

//! One attempt at a batch from start to settlement: its transaction runs with the lease kept
//! alive, then each event's outcome is recorded: done, a fenced retry with backoff, a dead
//! letter, or nothing at all when the lease was lost (the transaction rolled back and the
//! row belongs to whoever holds it now).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use inbox_core::backoff::RetryDecision;
use inbox_core::inbox::{self, ClaimedEvent};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use super::batch::{batches, Batch, Routed};
use super::claim::{Claimed, HandedOn};
use super::session::AttemptSession;
use super::transaction::{Committed, Outcome};
use super::{AttemptError, Worker, WorkerError};
use crate::handler::{Event, Handled, HandlerError};

impl Worker {
    /// Runs `batch`, claimed under `token`, in one slot; then, in the same slot, the first
    /// batch of events its transaction handed on (the next events of the ordered keys it
    /// completed) and did not run itself, and so on until none is handed on. A busy key's
    /// events thus follow each other with no claim between them. Further batches handed on at
    /// once (keys whose next events cannot run in one transaction) go back to the claim loop
    /// through `handed_on`, to start in its free slots, their leases kept while they wait; so
    /// does the first when other batches wait for a slot. Once the worker stops, batches
    /// handed on are given back unstarted.
    pub(super) async fn run_slot(
        &self,
        batch: Batch,
        token: Uuid,
        shutdown: &watch::Receiver<bool>,
        handed_on: &HandedOn,
    ) {
        let mut next = Some(batch);
        while let Some(batch) = next.take() {
            let mut handed = self.attempt(batch, token).await.into_iter();
            let events: usize = handed.as_slice().iter().map(Batch::len).sum();
            self.metrics.handed_on.inc_by(events as u64);
            if *shutdown.borrow() {
                for batch in handed {
                    self.release(&batch.ids(), token).await;
                }
                return;
            }
            next = handed.next();
            let mut handed_back: Vec<Batch> = handed.collect();
            // Batches wait for a slot of the loop: the key's next events queue up behind them
            // rather than keep the slot, or a few busy keys could hold every slot for as long
            // as they stay busy, the others waiting, leased, all that time.
            if handed_on.others_waiting() {
                handed_back.splice(0..0, next.take());
            }
            for batch in handed_back {
                let leases = self.leases.hold(batch.ids(), token);
                let claimed = Claimed {
                    batch,
                    token,
                    leases,
                };
                // The loop has stopped reading: it is shutting down.
                if let Err(unsent) = handed_on.send(claimed) {
                    self.release(&unsent.batch.ids(), token).await;
                }
            }
        }
    }

    /// Claimed rows as batches (see [`batches`]), counting the late arrivals among them.
    pub(super) fn batches_of(&self, rows: Vec<ClaimedEvent>) -> Vec<Batch> {
        let on_stale = |provider: &str, skipped: bool| {
            let handling = if skipped { "skipped" } else { "marked" };
            self.metrics
                .stale
                .with_label_values(&[provider, handling])
                .inc();
        };
        batches(&self.router, rows, self.settings.transaction_size, on_stale)
    }

    /// One attempt at `batch`, claimed under `token`: the transaction, then its settlement.
    /// The lease keeper keeps the rows leased meanwhile; should it find some of them lost,
    /// the transaction is abandoned on the spot (it rolls back; a forward in progress is
    /// dropped). Returns the events its transaction handed on, now held under `token`.
    pub(super) async fn attempt(&self, batch: Batch, token: Uuid) -> Vec<Batch> {
        let held = self.leases.hold(batch.ids(), token);
        let session = AttemptSession::default();
        let started = Instant::now();
        let mut lost = None;
        let result = tokio::select! {
            // A transaction that has finished wins over a loss found at the same moment.
            biased;
            result = self.run_batch(&batch, token, &session) => result,
            ids = held.lost() => {
                // The transaction's future is dropped: its connection closes and the server
                // rolls it back; a statement it was waiting on is cancelled.
                self.cancel_statement(&session).await;
                lost = Some(ids);
                Err(AttemptError::Worker(WorkerError::LeaseLost))
            }
        };
        let (result, continued) = match result {
            Ok(Committed {
                outcomes,
                continued,
                handed_on,
            }) => (Ok((outcomes, handed_on)), continued),
            Err(err) => (Err(err), Vec::new()),
        };
        let ordered_keys: HashSet<String> = std::iter::once(&batch)
            .chain(&continued)
            .flat_map(Batch::events)
            .filter_map(|event| event.ordering_key.clone())
            .collect();
        let ran = batch.len() + continued.iter().map(Batch::len).sum::<usize>();
        let elapsed = started.elapsed().as_secs_f64() / ran as f64;
        for event in std::iter::once(&batch)
            .chain(&continued)
            .flat_map(Batch::events)
        {
            self.metrics
                .handler_duration
                .with_label_values(&[event.provider.as_str()])
                .observe(elapsed);
        }
        let handed_on = match result {
            Ok((outcomes, handed_on)) => {
                let ran = std::iter::once(&batch)
                    .chain(&continued)
                    .flat_map(Batch::labelled_events);
                for ((event, label), outcome) in ran.zip(outcomes) {
                    self.settle(event, label, token, outcome).await;
                }
                handed_on
            }
            Err(AttemptError::Worker(WorkerError::LeaseLost)) => {
                drop(held);
                self.after_lease_lost(batch, token, lost).await
            }
            Err(AttemptError::Worker(WorkerError::NoConnection(err))) => {
                tracing::warn!(error = %err, "no database connection to start the attempt; giving the events back");
                self.release(&batch.ids(), token).await;
                Vec::new()
            }
            Err(err) => self.isolate_or_settle(batch, token, err).await,
        };
        // Keys not handed on have a ready head again, or none (a failed event's retry, a key
        // with nothing due): this worker's idle claim loops look for their heads at once (other
        // replicas at their next claim or poll). A key handed on is still this slot's, so a
        // busy key's events do not wake every idle loop into an empty claim each.
        let still_held: HashSet<&str> = handed_on
            .iter()
            .flat_map(Batch::events)
            .filter_map(|event| event.ordering_key.as_deref())
            .collect();
        if ordered_keys
            .iter()
            .any(|key| !still_held.contains(key.as_str()))
        {
            self.wake.notify_waiters();
        }
        handed_on
    }

    /// The batch's transaction (after its route slots).
    async fn run_batch(
        &self,
        batch: &Batch,
        token: Uuid,
        session: &AttemptSession,
    ) -> Result<Committed, AttemptError> {
        match batch {
            Batch::Unrouted(events) => self.complete_unrouted(events, token).await,
            Batch::Routed(routed) => {
                let _slots = self.route_slots(routed).await;
                if let [one] = routed.as_slice() {
                    if let Some(work) = one.handler.outside_work() {
                        return self.run_outside(one, work, token, session).await;
                    }
                }
                self.run_transaction(routed, token, session).await
            }
        }
    }

    /// Some of the batch's leases were lost (`lost`, when the lease keeper found which; else
    /// asked here) and its transaction rolled back. The rows lost belong to whoever holds them
    /// now; the others, still held, run again at once under the same lease: a lost lease
    /// costs the other events of a shared transaction neither an attempt nor their effects.
    async fn after_lease_lost(
        &self,
        batch: Batch,
        token: Uuid,
        lost: Option<Vec<i64>>,
    ) -> Vec<Batch> {
        let lost = match lost {
            Some(ids) => ids,
            None => self.lost_leases(&batch.ids(), token).await,
        };
        let lost_here: Vec<i64> = batch
            .ids()
            .into_iter()
            .filter(|id| lost.contains(id))
            .collect();
        // Unknown which were lost (the check failed): treat them all as lost; the rows still
        // held return through the rescue when their leases expire.
        let lost = if lost_here.is_empty() {
            batch.ids()
        } else {
            lost_here
        };
        tracing::warn!(
            events = lost.len(),
            ids = ?lost,
            "lease lost before completion: the attempt was rolled back"
        );
        for (event, label) in batch.labelled_events() {
            if lost.contains(&event.id) {
                self.metrics.lease_lost.inc();
                self.metrics.count(&event.provider, label, "lease_lost");
            }
        }
        match batch.without(&lost) {
            Some(rest) => Box::pin(self.attempt(rest, token)).await,
            None => Vec::new(),
        }
    }

    /// Which of `ids` are no longer held under `token`, after the attempt's transaction
    /// rolled back (so none was finished by it), extending the others' leases.
    pub(super) async fn lost_leases(&self, ids: &[i64], token: Uuid) -> Vec<i64> {
        let tokens = vec![token; ids.len()];
        let result = async {
            let mut conn = self.connection().await?;
            Ok::<_, WorkerError>(
                inbox::extend_leases(&mut conn, ids, &tokens, self.settings.lease).await?,
            )
        }
        .await;
        match result {
            Ok(not_held) => not_held
                .lost
                .into_iter()
                .map(|(id, _token)| id)
                .chain(not_held.finished)
                .collect(),
            Err(err) => {
                tracing::warn!(error = %err, "checking which leases were lost failed");
                Vec::new()
            }
        }
    }

    /// One slot of each limited route of `routed`, taken before the attempt's connection:
    /// an event waiting for its target holds no database connection meanwhile.
    async fn route_slots(&self, routed: &[Routed]) -> Vec<OwnedSemaphorePermit> {
        let mut limits: Vec<Arc<Semaphore>> = Vec::new();
        for slots in routed.iter().filter_map(|r| r.handler.slots()) {
            if !limits.iter().any(|known| Arc::ptr_eq(known, &slots)) {
                limits.push(slots);
            }
        }
        let mut permits = Vec::with_capacity(limits.len());
        for slots in limits {
            let permit = match Arc::clone(&slots).try_acquire_owned() {
                Ok(permit) => Ok(permit),
                Err(_) => {
                    self.metrics.route_slot_waits.inc();
                    let waited = slots.acquire_owned().await;
                    self.metrics.route_slot_waits.dec();
                    waited
                }
            };
            // A closed semaphore limits nothing any more.
            permits.extend(permit.ok());
        }
        permits
    }

    /// A transaction that failed as a whole. Shared, it failed for itself (not one handler:
    /// those roll back to their savepoint), so each event runs again in a transaction of its
    /// own; alone, its event's failure is settled.
    async fn isolate_or_settle(&self, batch: Batch, token: Uuid, err: AttemptError) -> Vec<Batch> {
        let mut handed_on = Vec::new();
        match batch {
            Batch::Routed(routed) if routed.len() > 1 => {
                tracing::warn!(error = %err, events = routed.len(), "shared transaction failed; retrying its events one by one");
                for one in routed {
                    handed_on.extend(Box::pin(self.attempt(Batch::Routed(vec![one]), token)).await);
                }
            }
            Batch::Unrouted(events) if events.len() > 1 => {
                tracing::warn!(error = %err, events = events.len(), "completing unrouted events failed; retrying them one by one");
                for one in events {
                    handed_on
                        .extend(Box::pin(self.attempt(Batch::Unrouted(vec![one]), token)).await);
                }
            }
            batch => {
                if let Some((event, label)) = batch.labelled_events().first() {
                    self.settle(event, label, token, Outcome::Failed(err)).await;
                }
            }
        }
        handed_on
    }

    /// Records what became of one event of a committed attempt; `label` is its event type
    /// as metrics show it.
    async fn settle(&self, event: &Event, label: &str, token: Uuid, outcome: Outcome) {
        match outcome {
            Outcome::Done(Handled::Applied) => self.metrics.count(&event.provider, label, "done"),
            Outcome::Done(Handled::Ignored) => {
                self.metrics.count(&event.provider, label, "ignored")
            }
            Outcome::Failed(AttemptError::Handler(HandlerError::Permanent(reason))) => {
                let error = format!("permanent: {reason}");
                self.settle_failure(event, label, token, &error, RetryDecision::GiveUp)
                    .await;
            }
            Outcome::Failed(err) => {
                let attempt = u32::try_from(event.attempt).unwrap_or(0);
                let backoff = &self.settings.backoff;
                let decision = match &err {
                    // The target said when it can take the event again.
                    AttemptError::Handler(HandlerError::RetryAfter { after, .. }) => {
                        backoff.decide_not_before(attempt, *after)
                    }
                    _ => backoff.decide(attempt),
                };
                self.settle_failure(event, label, token, &err.to_string(), decision)
                    .await;
            }
        }
    }

    /// A failed attempt, as `decision` says: a fenced retry after its delay, or a dead letter
    /// (a permanent failure, or the attempts are spent).
    async fn settle_failure(
        &self,
        event: &Event,
        label: &str,
        token: Uuid,
        error: &str,
        decision: RetryDecision,
    ) {
        let result = async {
            let mut conn = self.connection().await?;
            match decision {
                RetryDecision::RetryAfter(delay) => {
                    inbox::schedule_retry(&mut conn, event.id, token, delay, error).await?;
                }
                RetryDecision::GiveUp => {
                    inbox::dead_letter(&mut conn, event.id, token, error).await?;
                }
            }
            Ok::<_, WorkerError>(())
        }
        .await;
        // The event as an operator finds it (`worker show`): its row id, provider and id (the
        // sender's choice, so written escaped).
        let (id, provider, event_id) = (event.id, event.provider.as_str(), &event.event_id);
        match (result, decision) {
            (Ok(()), RetryDecision::RetryAfter(delay)) => {
                tracing::info!(id, provider, event_id = ?event_id, error, retry_in = ?delay, "attempt failed; retry scheduled");
                self.metrics.count(&event.provider, label, "retry");
            }
            (Ok(()), RetryDecision::GiveUp) => {
                tracing::error!(id, provider, event_id = ?event_id, error, "event dead-lettered");
                self.metrics.count(&event.provider, label, "dead");
            }
            (Err(err), _) => {
                // The lease will expire and the rescue returns the event.
                tracing::warn!(id, provider, event_id = ?event_id, error = %err, "recording the failure failed; the lease will expire");
                if matches!(err, WorkerError::LeaseLost) {
                    self.metrics.lease_lost.inc();
                }
            }
        }
    }
}

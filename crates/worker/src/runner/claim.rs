//! Claim scheduling: each claim loop owns a share of the worker's slots, claims as many due
//! events as its free slots carry (in batches worth a round trip), hands them to attempts, and
//! idles until a notification, the next due retry or the poll interval when nothing is due.
//!
//! A claim that found fewer due events than it asked for took all there were: the loop idles
//! after it instead of claiming again at once, and the worker's next claim, from any loop,
//! waits until `claim_spacing` after it. Under a steady flow, events arriving meanwhile gather
//! into one claim (about one claim per spacing, instead of one per arrival, each costing the
//! database as much as a claim of a hundred); at a trickle nothing waits, and a backlog is
//! claimed in full batches back to back.
//!
//! An attempt that hands on more batches than its slot runs next (ordered keys whose next
//! events need transactions of their own) hands the rest back to its loop, which starts them
//! in free slots like the batches it claimed, their leases kept while they wait. A slot
//! running a busy key's events one after another gives way to waiting batches between two
//! of them, so that a few busy keys cannot hold every slot while others wait.
//!
//! A slot is one attempt in flight: one transaction, one connection. An attempt of a handler
//! that waits on the network carries one event, so with such routes a slot is claimed per
//! event and the concurrency is the events in flight. When every route is batchable (the
//! handlers work in the database alone, or there are no routes), an attempt carries up to a
//! transaction's worth of events, and a slot is claimed per `transaction_size` events: the
//! default concurrency then keeps claims full and many transactions in flight, with no flags.
//!
//! Each loop claims on a connection of its own, outside the pool, set up for the claim
//! statement alone ([`inbox::prepare_claim_session`]: planned once, never compiled); the
//! pool's sessions keep the server's own planning for the handlers' statements.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use diesel_async::pooled_connection::PoolableConnection;
use diesel_async::AsyncPgConnection;
use inbox_core::inbox;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

use super::batch::Batch;
use super::lease_keeper::HeldLeases;
use super::{Worker, WorkerError};

impl Worker {
    /// Claims and runs events with `concurrency` slots of its own until shutdown, then lets
    /// its handlers in flight finish within the shutdown grace.
    pub(super) async fn claim_loop(&self, concurrency: usize, mut shutdown: watch::Receiver<bool>) {
        let mut in_flight: JoinSet<()> = JoinSet::new();
        let concurrency = concurrency.max(1);
        let batch_size = self.settings.batch_size.max(1);
        let per_slot = self.events_per_slot();
        // One permit per attempt in flight.
        let slots = Arc::new(Semaphore::new(concurrency));
        // Claimed batches waiting for a slot, their leases kept meanwhile.
        let mut waiting = Waiting::default();
        // Batches handed on by attempts beyond the one their slot runs next.
        let (sender, mut handed_back) = mpsc::unbounded_channel();
        let handed_on = HandedOn {
            sender,
            waiting: Arc::clone(&waiting.batches_waiting),
        };
        // Claim in batches: wait for room for this many events unless the worker is idle.
        // Events of network handlers are claimed as soon as there is room: their time goes to
        // waiting on their targets, and a slot kept free for a bigger claim is time lost. For
        // them the loop also claims a few events ahead of its free slots, so that a slot
        // freed starts its next event at once instead of after a claim's round trip.
        let (worth_claiming, ahead) = if per_slot == 1 {
            (1, concurrency.div_ceil(4))
        } else {
            (batch_size.min((concurrency * per_slot).div_ceil(2)), 0)
        };
        // The last claim took every due event: no claim until the loop has idled.
        let mut nothing_more_due = false;
        let mut session = ClaimSession::default();
        loop {
            while in_flight.try_join_next().is_some() {}
            while let Ok(claimed) = handed_back.try_recv() {
                waiting.push(claimed);
            }
            if *shutdown.borrow() {
                break;
            }
            self.start_waiting(&mut waiting, &slots, &mut in_flight, &shutdown, &handed_on);
            if nothing_more_due && waiting.is_empty() {
                let next_due = self.next_due(&mut session).await;
                let woken = self.idle(&mut shutdown, next_due, &mut handed_back).await;
                // Events handed back are not a sign that more are due.
                nothing_more_due = match woken {
                    Woken::HandedBack(claimed) => {
                        waiting.push(claimed);
                        true
                    }
                    Woken::MayBeDue => false,
                };
                continue;
            }
            let room = (slots.available_permits() * per_slot + ahead)
                .saturating_sub(waiting.events())
                .min(batch_size);
            if nothing_more_due || room == 0 || (room < worth_claiming && !in_flight.is_empty()) {
                tokio::select! {
                    _ = in_flight.join_next() => {}
                    Some(claimed) = handed_back.recv() => waiting.push(claimed),
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            if !self.wait_claim_spacing(&mut shutdown).await {
                break;
            }
            let claimed = match self.claim(&mut session, room).await {
                Ok(claim) => claim,
                Err(err) => {
                    tracing::warn!(error = %err, "claiming events failed; retrying after the poll interval");
                    if let Woken::HandedBack(claimed) =
                        self.idle(&mut shutdown, None, &mut handed_back).await
                    {
                        waiting.push(claimed);
                    }
                    continue;
                }
            };
            nothing_more_due = claimed.events.len() < room;
            let found = match claimed.events.len() {
                0 => "none",
                _ if nothing_more_due => "some",
                _ => "full",
            };
            self.metrics.claims.with_label_values(&[found]).inc();
            if nothing_more_due {
                self.claim_spacing.note_partial_claim();
            } else {
                // More may be due: an idle loop joins in rather than waiting for its turn.
                self.wake.notify_one();
            }
            let token = claimed.lease_token;
            for batch in self.batches_of(claimed.events) {
                let leases = self.leases.hold(batch.ids(), token);
                waiting.push(Claimed {
                    batch,
                    token,
                    leases,
                });
            }
        }
        // Stopping: the batches that never started go back, their attempts unspent, and so
        // do those an attempt finishing meanwhile hands back.
        while let Some(claimed) = waiting.pop() {
            self.release(&claimed.batch.ids(), claimed.token).await;
        }
        self.finish_in_flight(in_flight).await;
        handed_back.close();
        while let Ok(claimed) = handed_back.try_recv() {
            self.release(&claimed.batch.ids(), claimed.token).await;
        }
    }

    /// Starts waiting batches, oldest first, while the loop has free slots.
    fn start_waiting(
        &self,
        waiting: &mut Waiting,
        slots: &Arc<Semaphore>,
        in_flight: &mut JoinSet<()>,
        shutdown: &watch::Receiver<bool>,
        handed_on: &HandedOn,
    ) {
        while !waiting.is_empty() {
            let Ok(permit) = Arc::clone(slots).try_acquire_owned() else {
                return;
            };
            let Some(Claimed {
                batch,
                token,
                leases,
            }) = waiting.pop()
            else {
                return;
            };
            let worker = self.clone();
            let shutdown = shutdown.clone();
            let handed_on = handed_on.clone();
            in_flight.spawn(async move {
                // The attempt keeps the leases from here on.
                drop(leases);
                worker.run_slot(batch, token, &shutdown, &handed_on).await;
                drop(permit);
            });
        }
    }

    /// On shutdown: waits for the attempts in flight within the shutdown grace, then abandons
    /// the rest (their leases expire and their events are retried).
    async fn finish_in_flight(&self, mut in_flight: JoinSet<()>) {
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

    /// Events one slot carries: a transaction's worth when every route is batchable, else one.
    fn events_per_slot(&self) -> usize {
        if self.router.batchable_only() {
            self.settings.transaction_size.max(1)
        } else {
            1
        }
    }

    async fn next_due(&self, session: &mut ClaimSession) -> Option<chrono::DateTime<chrono::Utc>> {
        let conn = session.connection(self).await.ok()?;
        let next_due = inbox_core::operations::next_due(conn).await;
        session.forget_unless(next_due.is_ok());
        next_due.ok().flatten()
    }

    /// Waits for a notification, the next due retry, the poll interval, a batch handed back by
    /// one of the loop's attempts or shutdown, whichever comes first.
    async fn idle(
        &self,
        shutdown: &mut watch::Receiver<bool>,
        next_due: Option<chrono::DateTime<chrono::Utc>>,
        handed_back: &mut mpsc::UnboundedReceiver<Claimed>,
    ) -> Woken {
        let mut wait = self.settings.poll_interval;
        if let Some(due) = next_due {
            let until_due = (due - chrono::Utc::now())
                .to_std()
                .unwrap_or(Duration::ZERO);
            // A due row another claimer holds locked right now is not ours to spin on.
            wait = wait.min(until_due.max(Duration::from_millis(10)));
        }
        tokio::select! {
            Some(claimed) = handed_back.recv() => return Woken::HandedBack(claimed),
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
        Woken::MayBeDue
    }

    /// Waits, if need be, until `claim_spacing` after the worker's last claim that was not
    /// full. False when shutdown came first.
    async fn wait_claim_spacing(&self, shutdown: &mut watch::Receiver<bool>) -> bool {
        let Some(until) = self
            .claim_spacing
            .next_claim_at(self.settings.claim_spacing)
        else {
            return true;
        };
        tokio::select! {
            _ = tokio::time::sleep_until(until) => true,
            _ = shutdown.changed() => !*shutdown.borrow(),
        }
    }

    async fn claim(
        &self,
        session: &mut ClaimSession,
        limit: usize,
    ) -> Result<inbox::Claim, WorkerError> {
        let conn = session.connection(self).await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let claimed = inbox::claim_due(conn, &self.settings.name, self.settings.lease, limit).await;
        session.forget_unless(claimed.is_ok());
        Ok(claimed?)
    }

    /// Gives back rows claimed under `token` but never started, their attempts unspent.
    pub(super) async fn release(&self, ids: &[i64], token: Uuid) {
        let result = async {
            let mut conn = self.connection().await?;
            Ok::<_, WorkerError>(inbox::release_unstarted(&mut conn, ids, token).await?)
        }
        .await;
        if let Err(err) = result {
            tracing::warn!(error = %err, "releasing unstarted events failed; their leases will expire");
        }
    }
}

/// A claim loop's own connection: opened when first needed, set up for claims, and opened
/// anew once closed, or after a statement on it failed, which may leave its session gone or
/// in an unknown state.
#[derive(Default)]
struct ClaimSession {
    conn: Option<AsyncPgConnection>,
}

impl ClaimSession {
    async fn connection(&mut self, worker: &Worker) -> Result<&mut AsyncPgConnection, WorkerError> {
        // A connection closed under it (the server restarted, or failed over) is replaced
        // before the claim, as the pool replaces its own.
        if let Some(mut conn) = self.conn.take() {
            if !PoolableConnection::is_broken(&mut conn) {
                return Ok(self.conn.insert(conn));
            }
        }
        let mut conn = worker
            .connections
            .establish()
            .await
            .map_err(|err| WorkerError::NoConnection(err.to_string()))?;
        inbox::prepare_claim_session(&mut conn).await?;
        Ok(self.conn.insert(conn))
    }

    /// Closes the connection unless its last statement succeeded.
    fn forget_unless(&mut self, succeeded: bool) {
        if !succeeded {
            self.conn = None;
        }
    }
}

/// When the worker's last claim that was not full ended, shared by its claim loops: the
/// next such claim of any of them waits for the spacing after it.
#[derive(Debug, Default)]
pub(super) struct ClaimSpacing {
    last_partial_claim: std::sync::Mutex<Option<Instant>>,
}

impl ClaimSpacing {
    fn note_partial_claim(&self) {
        if let Ok(mut last) = self.last_partial_claim.lock() {
            *last = Some(Instant::now());
        }
    }

    /// When the next claim may start, if that is still to come.
    fn next_claim_at(&self, spacing: Duration) -> Option<Instant> {
        let last = (*self.last_partial_claim.lock().ok()?)?;
        let at = last + spacing;
        (at > Instant::now()).then_some(at)
    }
}

/// A batch claimed under `token` and not started yet, its leases kept meanwhile.
pub(super) struct Claimed {
    pub(super) batch: Batch,
    pub(super) token: Uuid,
    pub(super) leases: HeldLeases,
}

/// Where an attempt sends the batches it handed on beyond the one its slot runs next: to its
/// claim loop, which starts them in free slots.
#[derive(Clone)]
pub(super) struct HandedOn {
    sender: mpsc::UnboundedSender<Claimed>,
    /// How many batches wait for one of the loop's slots ([`Waiting`]).
    waiting: Arc<AtomicUsize>,
}

impl HandedOn {
    /// Hands `claimed` back to the claim loop; gives it back when the loop has stopped.
    pub(super) fn send(&self, claimed: Claimed) -> Result<(), Claimed> {
        self.sender.send(claimed).map_err(|unsent| unsent.0)
    }

    /// Whether batches wait for one of the loop's slots.
    pub(super) fn others_waiting(&self) -> bool {
        self.waiting.load(AtomicOrdering::Acquire) > 0
    }
}

/// Why an idle claim loop woke.
enum Woken {
    /// One of its attempts handed a batch back.
    HandedBack(Claimed),
    /// A notification, a retry falling due, the poll interval or shutdown.
    MayBeDue,
}

/// A claim loop's batches waiting for a slot, oldest first.
#[derive(Default)]
struct Waiting {
    batches: VecDeque<Claimed>,
    events: usize,
    /// How many batches wait, for the loop's slots to see (see [`HandedOn::others_waiting`]).
    batches_waiting: Arc<AtomicUsize>,
}

impl Waiting {
    fn push(&mut self, claimed: Claimed) {
        self.events += claimed.batch.len();
        self.batches.push_back(claimed);
        self.batches_waiting
            .store(self.batches.len(), AtomicOrdering::Release);
    }

    fn pop(&mut self) -> Option<Claimed> {
        let claimed = self.batches.pop_front()?;
        self.events -= claimed.batch.len();
        self.batches_waiting
            .store(self.batches.len(), AtomicOrdering::Release);
        Some(claimed)
    }

    fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Events of the waiting batches.
    fn events(&self) -> usize {
        self.events
    }
}

//! One lease keeper per worker, in a task of its own: every third of the lease it extends the
//! leases of every attempt in flight in one statement, whatever those attempts are doing (a
//! CPU-bound or stuck handler no longer stops its own heartbeat), and tells each attempt
//! whose lease it found lost, so that the attempt stops instead of working on for nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use inbox_core::inbox;
use tokio::sync::Notify;
use uuid::Uuid;

use super::{Worker, WorkerError};

/// The leases of the attempts in flight.
#[derive(Debug, Default)]
pub(super) struct LeaseKeeper {
    held: Mutex<HashMap<u64, Held>>,
    next_key: AtomicU64,
}

#[derive(Debug)]
struct Held {
    ids: Vec<i64>,
    token: Uuid,
    lost: Arc<LostLeases>,
}

/// Which of an attempt's rows were found no longer held, and a wake-up for the attempt.
#[derive(Debug, Default)]
struct LostLeases {
    ids: Mutex<Vec<i64>>,
    found: Notify,
}

/// An attempt's rows, kept leased while this lives.
#[derive(Debug)]
pub(super) struct HeldLeases {
    keeper: Arc<LeaseKeeper>,
    key: u64,
    lost: Arc<LostLeases>,
}

impl HeldLeases {
    /// Waits until some of the rows are found lost, and returns their ids.
    pub(super) async fn lost(&self) -> Vec<i64> {
        loop {
            self.lost.found.notified().await;
            let ids = self
                .lost
                .ids
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if !ids.is_empty() {
                return ids;
            }
        }
    }
}

impl Drop for HeldLeases {
    fn drop(&mut self) {
        self.keeper.lock().remove(&self.key);
    }
}

impl LeaseKeeper {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        // The map stays consistent whatever panicked while holding it.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `ids`, claimed under `token`, leased until the returned guard is dropped.
    pub(super) fn hold(self: &Arc<Self>, ids: Vec<i64>, token: Uuid) -> HeldLeases {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        let lost = Arc::new(LostLeases::default());
        self.lock().insert(
            key,
            Held {
                ids,
                token,
                lost: Arc::clone(&lost),
            },
        );
        HeldLeases {
            keeper: Arc::clone(self),
            key,
            lost,
        }
    }

    /// Every row held, with its token, in two parallel lists.
    fn snapshot(&self) -> (Vec<i64>, Vec<Uuid>) {
        let held = self.lock();
        let mut ids = Vec::new();
        let mut tokens = Vec::new();
        for attempt in held.values() {
            ids.extend_from_slice(&attempt.ids);
            tokens.extend(std::iter::repeat_n(attempt.token, attempt.ids.len()));
        }
        (ids, tokens)
    }

    /// Tells every attempt holding one of `lost` which of its rows are gone.
    fn report_lost(&self, lost: &[i64]) {
        for attempt in self.lock().values() {
            let gone: Vec<i64> = attempt
                .ids
                .iter()
                .copied()
                .filter(|id| lost.contains(id))
                .collect();
            if !gone.is_empty() {
                *attempt
                    .lost
                    .ids
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = gone;
                attempt.lost.found.notify_one();
            }
        }
    }
}

impl Worker {
    /// The lease keeper's loop: runs until the worker's task aborts it, after the last
    /// attempt has ended.
    pub(super) async fn keep_leases(&self) {
        let mut tick = tokio::time::interval(self.settings.lease / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate; no lease needs extending yet.
        tick.tick().await;
        loop {
            tick.tick().await;
            self.extend_held_leases().await;
        }
    }

    /// One pass: one statement for every lease in flight.
    async fn extend_held_leases(&self) {
        let (ids, tokens) = self.leases.snapshot();
        if ids.is_empty() {
            return;
        }
        let result = async {
            let mut conn = self.connection().await?;
            Ok::<_, WorkerError>(
                inbox::extend_leases(&mut conn, &ids, &tokens, self.settings.lease).await?,
            )
        }
        .await;
        match result {
            // Finished rows are left to their attempts: most were just completed by them.
            Ok(not_held) if not_held.lost.is_empty() => {}
            Ok(not_held) => {
                tracing::warn!(
                    lost = not_held.lost.len(),
                    "the lease keeper found leases lost: their attempts stop"
                );
                self.leases.report_lost(&not_held.lost);
            }
            // The next pass tries again, well within the lease.
            Err(err) => tracing::warn!(error = %err, "extending leases failed"),
        }
    }
}

//! One lease keeper per worker, on a thread of its own: every third of the lease it extends the
//! leases of every attempt in flight in one statement, whatever those attempts are doing (a
//! CPU-bound or stuck handler no longer stops its own heartbeat), and tells each attempt
//! whose lease it found lost, so that the attempt stops instead of working on for nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use diesel_async::AsyncPgConnection;
use inbox_core::inbox::{self, lease::LeasesNotHeld};
use tokio::sync::{oneshot, Notify};
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

    /// Tells every attempt holding one of `lost` under the token it was lost under which of
    /// its rows are gone. A row this worker claimed again (a retry due at once) is held by two
    /// attempts for a moment, the old one settling it and the new one running it: the new
    /// attempt's lease is not lost.
    fn report_lost(&self, lost: &[(i64, Uuid)]) {
        for attempt in self.lock().values() {
            let gone: Vec<i64> = attempt
                .ids
                .iter()
                .copied()
                .filter(|id| lost.contains(&(*id, attempt.token)))
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

/// The lease keeper's thread, running until [`KeeperThread::stop`].
#[derive(Debug)]
pub(super) struct KeeperThread {
    stop: oneshot::Sender<()>,
    running: Running,
}

#[derive(Debug)]
enum Running {
    Thread(std::thread::JoinHandle<()>),
    /// No thread could be started: the keeper runs as a task of the worker's runtime.
    Task(tokio::task::JoinHandle<()>),
}

impl KeeperThread {
    /// Stops the keeper after its pass in progress, and waits for it.
    pub(super) async fn stop(self) {
        let _ = self.stop.send(());
        match self.running {
            Running::Thread(thread) => {
                if let Ok(Err(_panicked)) = tokio::task::spawn_blocking(|| thread.join()).await {
                    tracing::error!("the lease keeper's thread panicked");
                }
            }
            Running::Task(task) => {
                let _ = task.await;
            }
        }
    }
}

impl Worker {
    /// Starts the lease keeper on a thread of its own, with a runtime and a connection of its
    /// own: a handler that blocks one of the worker's runtime threads (CPU-bound work, a
    /// synchronous call) can stall any task queued behind it on that thread, and so any
    /// connection driven there; it cannot stall another thread.
    pub(super) fn start_lease_keeper(&self) -> KeeperThread {
        let (stop, stopped) = oneshot::channel();
        let keeper = self.clone();
        let thread = std::thread::Builder::new()
            .name("lease-keeper".to_owned())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(keeper.keep_leases(stopped)),
                    Err(err) => tracing::error!(
                        error = %err,
                        "the lease keeper's runtime could not start: leases are not extended"
                    ),
                }
            });
        let running = match thread {
            Ok(thread) => Running::Thread(thread),
            Err(err) => {
                tracing::warn!(error = %err, "no thread for the lease keeper: it runs as a task");
                let (stop, stopped) = oneshot::channel();
                let keeper = self.clone();
                let task = tokio::spawn(async move { keeper.keep_leases(stopped).await });
                return KeeperThread {
                    stop,
                    running: Running::Task(task),
                };
            }
        };
        KeeperThread { stop, running }
    }

    /// The lease keeper's loop, until `stop` fires (after the last attempt has ended).
    async fn keep_leases(&self, mut stop: oneshot::Receiver<()>) {
        let mut tick = tokio::time::interval(self.settings.lease / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate; no lease needs extending yet.
        tick.tick().await;
        let mut conn = None;
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => {}
            }
            self.extend_held_leases(&mut conn).await;
        }
    }

    /// One pass: one statement for every lease in flight. A pass that fails or hangs (a
    /// server gone, a network cut) drops the connection; the next opens another.
    async fn extend_held_leases(&self, conn: &mut Option<AsyncPgConnection>) {
        let (ids, tokens) = self.leases.snapshot();
        if ids.is_empty() {
            return;
        }
        // Half a lease: a pass that gives up still leaves the next one time to extend.
        let pass =
            tokio::time::timeout(self.settings.lease / 2, self.extend_on(conn, &ids, &tokens))
                .await;
        match pass {
            // Finished rows are left to their attempts: most were just completed by them.
            Ok(Ok(not_held)) if not_held.lost.is_empty() => {}
            Ok(Ok(not_held)) => {
                tracing::warn!(
                    lost = not_held.lost.len(),
                    "the lease keeper found leases lost: their attempts stop"
                );
                self.leases.report_lost(&not_held.lost);
            }
            Ok(Err(err)) => {
                *conn = None;
                tracing::warn!(error = %err, "extending leases failed");
            }
            Err(_elapsed) => {
                *conn = None;
                tracing::warn!("extending leases took longer than half the lease: retrying");
            }
        }
    }

    async fn extend_on(
        &self,
        conn: &mut Option<AsyncPgConnection>,
        ids: &[i64],
        tokens: &[Uuid],
    ) -> Result<LeasesNotHeld, WorkerError> {
        let conn = match conn {
            Some(conn) => conn,
            None => conn.insert(
                self.connections
                    .establish()
                    .await
                    .map_err(|err| WorkerError::NoConnection(err.to_string()))?,
            ),
        };
        Ok(inbox::extend_leases(conn, ids, tokens, self.settings.lease).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported(held: &HeldLeases) -> Vec<i64> {
        held.lost
            .ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    #[test]
    fn a_row_lost_under_one_token_stops_only_the_attempt_holding_it_under_that_token() {
        let keeper = Arc::new(LeaseKeeper::default());
        let (old, new) = (Uuid::new_v4(), Uuid::new_v4());
        // An attempt settling rows 1 and 2 while row 1, retried at once, runs again under a new
        // claim.
        let settling = keeper.hold(vec![1, 2], old);
        let running_again = keeper.hold(vec![1], new);

        keeper.report_lost(&[(1, old)]);

        assert_eq!(reported(&settling), vec![1]);
        assert_eq!(reported(&running_again), Vec::<i64>::new());
        keeper.report_lost(&[(1, new)]);
        assert_eq!(reported(&running_again), vec![1]);
    }
}

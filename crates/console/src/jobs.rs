//! Replays by filter, run in the background in batches: each batch is one statement that
//! moves up to `batch` dead events back to ready and commits, so a replay of a million events
//! holds no long transaction, shows its progress, and can be aborted between batches. Every
//! batch also updates the action's audit row, so the audit tells how far it went.
//!
//! A job replays only the dead events counted when it started ([`browse::DeadExtent`]), and
//! never more than that count: events that die while it runs wait for a replay of their own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inbox_core::db::PgPool;
use inbox_core::operations::audit::{self, Outcome};
use inbox_core::operations::browse::{self, DeadExtent, EventQuery};

/// One replay by filter.
#[derive(Debug)]
pub struct ReplayJob {
    /// Its audit row, which is also its id.
    pub id: i64,
    /// Who started it.
    pub actor: String,
    /// The dead events counted when it started: the most it replays.
    pub counted: i64,
    replayed: AtomicI64,
    abort: AtomicBool,
    /// Set, under the outcome's lock, once the job has done all it will: its outcome is
    /// decided and only to be recorded, and an abort is refused from then on.
    ending: AtomicBool,
    outcome: Mutex<Outcome>,
}

impl ReplayJob {
    /// Events replayed so far.
    pub fn replayed(&self) -> i64 {
        self.replayed.load(Ordering::Relaxed)
    }

    /// Running, done, aborted or failed.
    pub fn outcome(&self) -> Outcome {
        *self
            .outcome
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the job to stop after the batch in progress; false (nothing asked) when it has
    /// ended already.
    pub fn abort(&self) -> bool {
        let outcome = self
            .outcome
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *outcome != Outcome::Running || self.ending.load(Ordering::Relaxed) {
            return false;
        }
        self.abort.store(true, Ordering::Relaxed);
        true
    }

    /// Takes back an abort whose audit could not be recorded: an abort the audit does not
    /// hold does not happen (unless the job stopped for it meanwhile).
    pub fn withdraw_abort(&self) {
        self.abort.store(false, Ordering::Relaxed);
    }

    /// The job has done all it will: from now on an abort is refused. False when an abort
    /// was asked first: the job then ends as aborted, as that abort's audit row says.
    fn end(&self) -> bool {
        let _outcome = self
            .outcome
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.ending.store(true, Ordering::Relaxed);
        !self.abort.load(Ordering::Relaxed)
    }

    fn finish(&self, outcome: Outcome) {
        *self
            .outcome
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = outcome;
    }
}

/// How long a stopping console waits for its replays to end their batch in progress.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The replays of this console process.
#[derive(Debug, Default)]
pub struct Jobs {
    jobs: Mutex<HashMap<i64, Arc<ReplayJob>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The statement timeout of their sessions (`None`: the server's).
    statement_timeout: Option<Duration>,
}

impl Jobs {
    /// No replay yet; theirs will run with `statement_timeout` (`None`: the server's).
    pub fn new(statement_timeout: Option<Duration>) -> Self {
        Self {
            statement_timeout,
            ..Self::default()
        }
    }

    /// The job with audit row `id`, if this process runs or ran it.
    pub fn get(&self, id: i64) -> Option<Arc<ReplayJob>> {
        self.lock().get(&id).cloned()
    }

    /// Starts replaying the dead events of `query` that `extent` counted, `batch` per
    /// statement, as audit row `audit_id` (already recorded as running).
    pub fn start(
        &self,
        pool: PgPool,
        query: EventQuery,
        extent: DeadExtent,
        audit_id: i64,
        actor: &str,
        batch: i64,
    ) -> Arc<ReplayJob> {
        let job = Arc::new(ReplayJob {
            id: audit_id,
            actor: actor.to_owned(),
            counted: extent.rows,
            replayed: AtomicI64::new(0),
            abort: AtomicBool::new(false),
            ending: AtomicBool::new(false),
            outcome: Mutex::new(Outcome::Running),
        });
        self.lock().insert(audit_id, Arc::clone(&job));
        let running = Arc::clone(&job);
        let statement_timeout = self.statement_timeout;
        let task = tokio::spawn(async move {
            let session = Session {
                pool: &pool,
                statement_timeout,
            };
            let outcome = match run(&session, &query, &extent, &running, batch).await {
                Ok(outcome) => outcome,
                Err(err) => {
                    running.end();
                    tracing::error!(job = running.id, error = %err, "replay by filter failed");
                    Outcome::Failed
                }
            };
            let recorded = async {
                let mut conn = pool.get().await?;
                audit::update_progress(&mut conn, running.id, running.replayed(), outcome).await?;
                anyhow::Ok(())
            }
            .await;
            if let Err(err) = recorded {
                tracing::error!(job = running.id, error = %err, "recording the replay's outcome failed");
            }
            tracing::info!(
                job = running.id,
                replayed = running.replayed(),
                outcome = outcome.as_str(),
                "replay by filter ended"
            );
            running.finish(outcome);
        });
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tasks.retain(|task| !task.is_finished());
        tasks.push(task);
        job
    }

    /// Stops every replay after its batch in progress, as an abort does, and waits up to
    /// [`STOP_GRACE`] for each to record how far it went. Called before the page server
    /// stops: a replay runs on a page worker's runtime, which ends with the server, and a
    /// replay ended that way would leave its audit row saying "running" for ever. A replay
    /// still blocked past the grace is left; its row keeps the count of its last batch.
    pub async fn stop_all(&self) {
        for job in self.lock().values() {
            job.abort();
        }
        let tasks = std::mem::take(
            &mut *self
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let ended = tokio::time::timeout(STOP_GRACE, async {
            for task in tasks {
                let _ = task.await;
            }
        })
        .await;
        if ended.is_err() {
            tracing::warn!("a replay by filter did not end its batch within the stop grace; its audit row stays running");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<ReplayJob>>> {
        self.jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Done, unless an abort came first (see [`ReplayJob::end`]).
fn done_unless_aborted(job: &ReplayJob) -> Outcome {
    if job.end() {
        Outcome::Done
    } else {
        Outcome::Aborted
    }
}

/// Where a replay gets its connections, and how they are set up.
struct Session<'a> {
    pool: &'a PgPool,
    statement_timeout: Option<Duration>,
}

/// Replays batch after batch until none of the counted events is left, as many as were
/// counted are replayed, or the job is aborted.
async fn run(
    session: &Session<'_>,
    query: &EventQuery,
    extent: &DeadExtent,
    job: &ReplayJob,
    batch: i64,
) -> anyhow::Result<Outcome> {
    let mut after = 0;
    loop {
        if job.abort.load(Ordering::Relaxed) {
            job.end();
            return Ok(Outcome::Aborted);
        }
        // The count is also a cap: whatever the bounds let through, the audit never reports
        // more events changed than the operator was shown.
        let left = extent.rows - job.replayed();
        if left <= 0 {
            return Ok(done_unless_aborted(job));
        }
        let mut conn = session.pool.get().await?;
        browse::tune_session(&mut conn, session.statement_timeout).await?;
        let ids = browse::dead_ids_within(&mut conn, query, extent, after, batch.min(left)).await?;
        let Some(&last) = ids.last() else {
            return Ok(done_unless_aborted(job));
        };
        after = last;
        let replayed = inbox_core::operations::replay(&mut conn, &ids).await?;
        if replayed > 0 {
            // Idle workers start on the batch now instead of at their next poll.
            inbox_core::inbox::notify_new_events(&mut conn).await?;
        }
        let total = job
            .replayed
            .fetch_add(i64::try_from(replayed)?, Ordering::Relaxed)
            + i64::try_from(replayed)?;
        audit::update_progress(&mut conn, job.id, total, Outcome::Running).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> ReplayJob {
        ReplayJob {
            id: 1,
            actor: "olivia".to_owned(),
            counted: 10,
            replayed: AtomicI64::new(0),
            abort: AtomicBool::new(false),
            ending: AtomicBool::new(false),
            outcome: Mutex::new(Outcome::Running),
        }
    }

    #[test]
    fn an_abort_is_refused_once_the_job_has_decided_its_outcome_and_wins_before() {
        // Finished replaying, its outcome not yet recorded: an abort now would be recorded
        // for a job that ends done.
        let ended = job();
        assert_eq!(done_unless_aborted(&ended), Outcome::Done);
        assert!(!ended.abort());

        // Asked before the job decided: it ends aborted, as the abort's audit row says.
        let aborted = job();
        assert!(aborted.abort());
        assert_eq!(done_unless_aborted(&aborted), Outcome::Aborted);
    }
}

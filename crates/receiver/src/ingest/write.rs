//! One write of a group of events, isolating bad rows: the group goes in one multi-row
//! statement, and when PostgreSQL refuses a row of it, the group is halved until the
//! offending rows stand alone. Only they are refused; every other event is stored and
//! acknowledged, instead of the whole group being answered 503 and retried into the same
//! failure by every provider whose events shared its batch.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel_async::{AnsiTransactionManager, TransactionManager};
use futures_util::future::{Fuse, FutureExt as _};
use inbox_core::db::PgPool;
use inbox_core::inbox::{self, InsertOutcome, NewEvent};
use inbox_core::pg_connect::ConnectionSettings;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;

use super::StoreError;
use crate::metrics::Metrics;
use crate::notifier::Notifier;

/// What one event's write came to.
pub(super) type Answer = Result<InsertOutcome, Arc<StoreError>>;

/// Most failed statements one write may run while isolating bad rows. One bad row among 256
/// costs 9; an error that is not a row's (the database out of disk) would otherwise be chased
/// down to every single row. Past it, what is left is answered 503.
const MAX_FAILED_STATEMENTS: usize = 24;

/// How long a connection whose statement was abandoned is kept out of the pool at most while
/// that statement ends on the server (at once when the cancel arrives).
const QUARANTINE: Duration = Duration::from_secs(60);

/// What a failed statement says about its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// SQLSTATE class 23 (integrity constraint violation): some row of the statement can
    /// never be stored as it is.
    RowRefused,
    /// An error diesel-async reports without its SQLSTATE: class 22 (data exception) among
    /// others, some of them passing (disk full). Worth isolating; a row failing alone this way
    /// is refused only if a rehearsal of its insert names class 22 or 23 (see
    /// [`Store::rehearse`]), else answered 503.
    Unclassified,
    /// Nothing to do with the rows (connection lost, read-only server): every row fails.
    NotTheRows,
}

fn classify(error: &DieselError) -> Failure {
    use DatabaseErrorKind as Kind;
    match error {
        // A row no partition of the journal takes (its day was never created) comes back as a
        // check violation naming no constraint: the database's state, not the row's, and
        // passing once the day exists. A CHECK constraint's violation always names it.
        DieselError::DatabaseError(Kind::CheckViolation, info)
            if info.constraint_name().is_none() =>
        {
            Failure::NotTheRows
        }
        DieselError::DatabaseError(
            Kind::UniqueViolation
            | Kind::ForeignKeyViolation
            | Kind::RestrictViolation
            | Kind::ExclusionViolation
            | Kind::NotNullViolation
            | Kind::CheckViolation,
            _,
        ) => Failure::RowRefused,
        DieselError::DatabaseError(Kind::Unknown, _) => Failure::Unclassified,
        _ => Failure::NotTheRows,
    }
}

/// What a write needs; cheap to clone.
#[derive(Clone)]
pub(super) struct Store {
    pub(super) pool: PgPool,
    pub(super) notifier: Notifier,
    pub(super) metrics: Metrics,
    /// To cancel a statement on the server; `None`: abandoned only.
    pub(super) connection: Option<ConnectionSettings>,
}

impl Store {
    /// Writes `events` on one connection before `deadline` and returns one answer per event
    /// in input order. Once `gave_up` completes (every requester gone) or the deadline passes,
    /// the statement in flight is cancelled on the server. Wakes the workers once if anything
    /// new was committed.
    pub(super) async fn write_events(
        &self,
        events: &[NewEvent],
        deadline: Instant,
        gave_up: impl Future<Output = ()>,
    ) -> Vec<Answer> {
        let metrics = &self.metrics;
        // Fused: once every requester gave up, it is never polled to completion again (an
        // unfused future may panic when polled after it finished).
        let mut gave_up = std::pin::pin!(gave_up.fuse());
        let checkout = tokio::time::timeout_at(deadline, self.pool.get_owned());
        let conn = tokio::select! {
            conn = checkout => conn.ok().and_then(Result::ok),
            () = &mut gave_up => None,
        };
        let Some(mut conn) = conn else {
            metrics.observe_failure(&StoreError::NoConnection);
            return vec![Err(Arc::new(StoreError::NoConnection)); events.len()];
        };
        let mut answers: Vec<Option<Answer>> = vec![None; events.len()];
        // Groups still to write, as a stack: the whole batch first.
        let mut groups: Vec<Range<usize>> = Vec::with_capacity(16);
        groups.push(0..events.len());
        let mut failed_statements = 0;
        while let Some(group) = groups.pop() {
            let token = conn.cancel_token();
            let written = tokio::select! {
                written = inbox::insert_events(&mut conn, &events[group.clone()]) => Some(written),
                () = tokio::time::sleep_until(deadline) => None,
                () = &mut gave_up => None,
            };
            metrics.batch_size.observe(group.len() as f64);
            let Some(written) = written else {
                self.abandon(conn, &token);
                fail_rest(&mut answers, StoreError::Deadline, metrics);
                break;
            };
            let error = match written {
                Ok(outcomes) if outcomes.len() == group.len() => {
                    for (slot, outcome) in answers[group].iter_mut().zip(outcomes) {
                        *slot = Some(Ok(outcome));
                    }
                    continue;
                }
                Ok(_) => StoreError::Database(missing_outcome()),
                Err(error) => {
                    failed_statements += 1;
                    let failure = classify(&error);
                    if failure == Failure::NotTheRows || failed_statements >= MAX_FAILED_STATEMENTS
                    {
                        StoreError::Database(error)
                    } else if group.len() > 1 {
                        let middle = group.start + group.len() / 2;
                        // The first half is written first.
                        groups.push(middle..group.end);
                        groups.push(group.start..middle);
                        continue;
                    } else {
                        // The row alone: refused for good, or for now.
                        let refused = match failure {
                            Failure::RowRefused => true,
                            _ => {
                                let event = &events[group.start];
                                match self.rehearse(event, deadline, &mut gave_up).await {
                                    Rehearsal::Refused => true,
                                    Rehearsal::NotRefused => false,
                                    // Nobody waits for an answer any more.
                                    Rehearsal::GaveUp => {
                                        fail_rest(&mut answers, StoreError::Deadline, metrics);
                                        break;
                                    }
                                }
                            }
                        };
                        let alone = if refused {
                            StoreError::InvalidRow(error)
                        } else {
                            StoreError::Database(error)
                        };
                        metrics.observe_failure(&alone);
                        answers[group.start] = Some(Err(Arc::new(alone)));
                        continue;
                    }
                }
            };
            fail_rest(&mut answers, error, metrics);
            break;
        }
        finish(answers, &self.notifier)
    }

    /// Whether the database refuses `event`'s row for good, by the SQLSTATE its insert fails
    /// with when rehearsed alone on a connection of its own (rolled back whatever happens):
    /// class 22 (data exception) or 23 (integrity constraint violation). A rehearsal that
    /// cannot say so before `deadline` or before `gave_up`, or that succeeds (the failure
    /// passed), or that fails otherwise (the disk still full), leaves the row to be retried.
    /// Only rows that failed alone with an error diesel-async reports without its SQLSTATE
    /// are rehearsed, so it costs a connection per such row, never one per batch.
    async fn rehearse(
        &self,
        event: &NewEvent,
        deadline: Instant,
        gave_up: &mut std::pin::Pin<&mut Fuse<impl Future<Output = ()>>>,
    ) -> Rehearsal {
        let Some(connection) = &self.connection else {
            return Rehearsal::NotRefused;
        };
        let rehearsal = async {
            let (mut client, driver) = connection.connect_client().await.ok()?;
            // Ends once the client is dropped.
            tokio::spawn(driver);
            let timeout = deadline.saturating_duration_since(Instant::now());
            let failed = inbox::rehearse_insert(&mut client, std::slice::from_ref(event), timeout)
                .await
                .err()?;
            failed.code().cloned()
        };
        let code = tokio::select! {
            code = tokio::time::timeout_at(deadline, rehearsal) => code.ok().flatten(),
            () = gave_up.as_mut() => return Rehearsal::GaveUp,
        };
        match code {
            Some(code) => {
                tracing::debug!(
                    sqlstate = code.code(),
                    "rehearsed the insert of a failed row"
                );
                if refuses_the_row(&code) {
                    Rehearsal::Refused
                } else {
                    Rehearsal::NotRefused
                }
            }
            None => Rehearsal::NotRefused,
        }
    }

    /// Nobody waits for the statement in flight any more: it is cancelled on the server, and
    /// the connection, which would queue the next batch behind it, stays out of the pool until
    /// a trivial query shows the statement is over; then it is closed, not pooled again. Had
    /// the statement committed first, the providers' retries are answered "duplicate".
    fn abandon<C>(&self, mut conn: C, token: &tokio_postgres::CancelToken)
    where
        C: std::ops::DerefMut<Target = diesel_async::AsyncPgConnection> + Send + 'static,
    {
        let connection = self.connection.clone();
        let token = token.clone();
        self.metrics.statements_cancelled.inc();
        tokio::spawn(async move {
            if let Some(connection) = connection {
                if let Err(err) = connection.cancel_statement(&token).await {
                    tracing::debug!(error = %err, "could not cancel an abandoned statement");
                }
            }
            let drained =
                diesel_async::SimpleAsyncConnection::batch_execute(&mut *conn, "SELECT 1");
            let _ = tokio::time::timeout(QUARANTINE, drained).await;
            // A cancel reaches its backend when the server gets to it: back in the pool, the
            // connection's next statement (another batch's) could be the one cancelled.
            AnsiTransactionManager::transaction_manager_status_mut(&mut *conn).set_in_error();
        });
    }
}

/// What rehearsing a failed row's insert said.
enum Rehearsal {
    /// The database refuses the row for good (class 22 or 23).
    Refused,
    /// Not for good, or it could not say in time: the row is retried.
    NotRefused,
    /// Every request waiting for the batch gave up meanwhile.
    GaveUp,
}

/// Whether a statement failing with `code` can never store its row as it is: a data exception
/// (class 22: a value the column's type cannot hold) or an integrity constraint violation
/// (class 23).
fn refuses_the_row(code: &SqlState) -> bool {
    let class = code.code().get(..2);
    matches!(class, Some("22" | "23"))
}

/// Answers every event not answered yet with `error`.
fn fail_rest(answers: &mut [Option<Answer>], error: StoreError, metrics: &Metrics) {
    metrics.observe_failure(&error);
    let error = Arc::new(error);
    for slot in answers.iter_mut().filter(|slot| slot.is_none()) {
        *slot = Some(Err(Arc::clone(&error)));
    }
}

fn finish(answers: Vec<Option<Answer>>, notifier: &Notifier) -> Vec<Answer> {
    let answers: Vec<Answer> = answers
        .into_iter()
        .map(|answer| {
            answer.unwrap_or_else(|| Err(Arc::new(StoreError::Database(missing_outcome()))))
        })
        .collect();
    if answers
        .iter()
        .any(|answer| matches!(answer, Ok(InsertOutcome::Accepted)))
    {
        notifier.new_events_committed();
    }
    answers
}

fn missing_outcome() -> DieselError {
    DieselError::DeserializationError("insert returned no outcome".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database_error(kind: DatabaseErrorKind) -> DieselError {
        DieselError::DatabaseError(kind, Box::new("refused".to_owned()))
    }

    /// What PostgreSQL reports of a CHECK constraint's violation: the constraint's name.
    #[derive(Debug)]
    struct NamedConstraint;

    impl diesel::result::DatabaseErrorInformation for NamedConstraint {
        fn message(&self) -> &str {
            "new row violates check constraint"
        }
        fn details(&self) -> Option<&str> {
            None
        }
        fn hint(&self) -> Option<&str> {
            None
        }
        fn table_name(&self) -> Option<&str> {
            Some("inbox_dedup")
        }
        fn column_name(&self) -> Option<&str> {
            None
        }
        fn constraint_name(&self) -> Option<&str> {
            Some("inbox_dedup_event_id_length")
        }
        fn statement_position(&self) -> Option<i32> {
            None
        }
    }

    #[test]
    fn constraint_violations_refuse_a_row_and_lost_connections_every_row() {
        assert_eq!(
            classify(&DieselError::DatabaseError(
                DatabaseErrorKind::CheckViolation,
                Box::new(NamedConstraint)
            )),
            Failure::RowRefused
        );
        assert_eq!(
            classify(&database_error(DatabaseErrorKind::CheckViolation)),
            Failure::NotTheRows,
            "no partition for the row: no constraint named"
        );
        assert_eq!(
            classify(&database_error(DatabaseErrorKind::NotNullViolation)),
            Failure::RowRefused
        );
        assert_eq!(
            classify(&database_error(DatabaseErrorKind::Unknown)),
            Failure::Unclassified
        );
        assert_eq!(
            classify(&database_error(DatabaseErrorKind::ClosedConnection)),
            Failure::NotTheRows
        );
        assert_eq!(
            classify(&database_error(DatabaseErrorKind::ReadOnlyTransaction)),
            Failure::NotTheRows
        );
        assert_eq!(classify(&DieselError::NotFound), Failure::NotTheRows);
    }

    #[test]
    fn data_exceptions_and_constraint_violations_refuse_a_row_and_passing_errors_do_not() {
        assert!(refuses_the_row(&SqlState::CHARACTER_NOT_IN_REPERTOIRE));
        assert!(refuses_the_row(&SqlState::UNTRANSLATABLE_CHARACTER));
        assert!(refuses_the_row(&SqlState::INVALID_TEXT_REPRESENTATION));
        assert!(refuses_the_row(&SqlState::CHECK_VIOLATION));
        assert!(!refuses_the_row(&SqlState::DISK_FULL));
        assert!(!refuses_the_row(&SqlState::QUERY_CANCELED));
        assert!(!refuses_the_row(&SqlState::T_R_DEADLOCK_DETECTED));
        assert!(!refuses_the_row(&SqlState::READ_ONLY_SQL_TRANSACTION));
    }
}

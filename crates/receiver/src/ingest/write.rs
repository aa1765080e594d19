//! One write of a group of events, isolating bad rows: the group goes in one multi-row
//! statement, and when PostgreSQL refuses a row of it, the group is halved until the
//! offending rows stand alone. Only they are refused; every other event is stored and
//! acknowledged, instead of the whole group being answered 503 and retried into the same
//! failure by every provider whose events shared its batch.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use diesel::result::{DatabaseErrorKind, Error as DieselError};
use inbox_core::db::PgPool;
use inbox_core::inbox::{self, InsertOutcome, NewEvent};
use tokio::time::Instant;

use super::StoreError;
use crate::metrics::Metrics;
use crate::notifier::Notifier;

/// What one event's write came to.
pub(super) type Answer = Result<InsertOutcome, Arc<StoreError>>;

/// Most failed statements one write may run while isolating bad rows. One bad row among 256
/// costs 9; an error that is not a row's (the database out of disk) would otherwise be chased
/// down to every single row. Past it, what is left is answered 503.
const MAX_FAILED_STATEMENTS: usize = 24;

/// How long a connection whose statement overran the deadline is kept out of the pool while
/// that statement finishes on the server.
const QUARANTINE: Duration = Duration::from_secs(60);

/// What a failed statement says about its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// SQLSTATE class 23 (integrity constraint violation): some row of the statement can
    /// never be stored as it is.
    RowRefused,
    /// An error diesel-async reports without its SQLSTATE: class 22 (data exception) among
    /// others, some of them passing (disk full). Worth isolating, but a row failing alone
    /// this way is answered 503, never refused for good.
    Unclassified,
    /// Nothing to do with the rows (connection lost, read-only server): every row fails.
    NotTheRows,
}

fn classify(error: &DieselError) -> Failure {
    use DatabaseErrorKind as Kind;
    match error {
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

/// Writes `events` on one connection, all before `deadline`, and returns one answer per
/// event in input order. Wakes the workers once if anything new was committed.
pub(super) async fn write_events(
    pool: &PgPool,
    notifier: &Notifier,
    metrics: &Metrics,
    events: &[NewEvent],
    deadline: Instant,
) -> Vec<Answer> {
    let Ok(Ok(mut conn)) = tokio::time::timeout_at(deadline, pool.get_owned()).await else {
        metrics.observe_failure(&StoreError::NoConnection);
        return vec![Err(Arc::new(StoreError::NoConnection)); events.len()];
    };
    let mut answers: Vec<Option<Answer>> = vec![None; events.len()];
    // Groups still to write, as a stack: the whole batch first.
    let mut groups: Vec<Range<usize>> = Vec::with_capacity(16);
    groups.push(0..events.len());
    let mut failed_statements = 0;
    while let Some(group) = groups.pop() {
        let written = tokio::time::timeout_at(
            deadline,
            inbox::insert_events(&mut conn, &events[group.clone()]),
        )
        .await;
        metrics.batch_size.observe(group.len() as f64);
        let error = match written {
            Ok(Ok(outcomes)) if outcomes.len() == group.len() => {
                for (slot, outcome) in answers[group].iter_mut().zip(outcomes) {
                    *slot = Some(Ok(outcome));
                }
                continue;
            }
            Ok(Ok(_)) => StoreError::Database(missing_outcome()),
            Ok(Err(error)) => {
                failed_statements += 1;
                let failure = classify(&error);
                if failure != Failure::NotTheRows && failed_statements < MAX_FAILED_STATEMENTS {
                    if group.len() > 1 {
                        let middle = group.start + group.len() / 2;
                        // The first half is written first.
                        groups.push(middle..group.end);
                        groups.push(group.start..middle);
                        continue;
                    }
                    // The row alone: refused for good, or for now.
                    let alone = match failure {
                        Failure::RowRefused => StoreError::InvalidRow(error),
                        _ => StoreError::Database(error),
                    };
                    metrics.observe_failure(&alone);
                    answers[group.start] = Some(Err(Arc::new(alone)));
                    continue;
                }
                StoreError::Database(error)
            }
            Err(_elapsed) => {
                quarantine(conn);
                fail_rest(&mut answers, StoreError::Deadline, metrics);
                break;
            }
        };
        fail_rest(&mut answers, error, metrics);
        break;
    }
    finish(answers, notifier)
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

/// The statement may still run, and commit, on the server: the caller answers 503 and the
/// provider's retry finds out ("duplicate" if it landed). The connection would queue the next
/// batch behind that statement, so it stays out of the pool until a trivial query shows the
/// statement is over.
fn quarantine<C>(mut conn: C)
where
    C: std::ops::DerefMut<Target = diesel_async::AsyncPgConnection> + Send + 'static,
{
    tokio::spawn(async move {
        let drained = diesel_async::SimpleAsyncConnection::batch_execute(&mut *conn, "SELECT 1");
        let _ = tokio::time::timeout(QUARANTINE, drained).await;
    });
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

    #[test]
    fn constraint_violations_refuse_a_row_and_lost_connections_every_row() {
        assert_eq!(
            classify(&database_error(DatabaseErrorKind::CheckViolation)),
            Failure::RowRefused
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
}

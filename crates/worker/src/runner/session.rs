//! The database session of an attempt: its timeouts, its backend process (so that a stuck
//! statement can be cancelled from another connection), and discarding a connection whose
//! state is no longer known.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use diesel::sql_types::{Bool, Integer, Text};
use diesel::QueryableByName;
use diesel_async::{AnsiTransactionManager, AsyncPgConnection, RunQueryDsl, TransactionManager};
use inbox_core::prepared::{bind, cached_sql};

use crate::limits::AttemptLimits;

#[derive(QueryableByName)]
struct Backend {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

#[derive(QueryableByName)]
struct Signalled {
    #[diesel(sql_type = Bool)]
    signalled: bool,
}

fn millis(duration: std::time::Duration) -> String {
    format!("{}ms", duration.as_millis().max(1))
}

/// Sets the transaction's `statement_timeout` and `lock_timeout` (`SET LOCAL`: they end with
/// the transaction, the pooled session keeps its own) and returns the backend's process id.
/// Call it inside the attempt's transaction, before its handlers. Locks nothing.
///
/// Inside a savepoint that later rolls back, the settings would roll back too: call it at
/// the transaction's level.
pub(super) async fn limit_transaction(
    tx: &mut AsyncPgConnection,
    limits: AttemptLimits,
) -> diesel::QueryResult<i32> {
    let backend: Backend = cached_sql(
        "SELECT pg_backend_pid() AS pid, \
                set_config('statement_timeout', $1, true) AS statement_timeout, \
                set_config('lock_timeout', $2, true) AS lock_timeout",
        (
            bind::<Text, _>(millis(limits.statement_timeout)),
            bind::<Text, _>(millis(limits.lock_timeout)),
        ),
    )
    .get_result(tx)
    .await?;
    Ok(backend.pid)
}

/// Cancels the statement backend `pid` is running, if any (`pg_cancel_backend`: the
/// statement fails, its transaction is aborted, the session stays). Run it on another
/// connection than the one cancelled. Returns whether the signal was sent.
pub(super) async fn cancel_statement(
    conn: &mut AsyncPgConnection,
    pid: i32,
) -> diesel::QueryResult<bool> {
    let sent: Signalled = cached_sql(
        "SELECT pg_cancel_backend($1) AS signalled",
        (bind::<Integer, _>(pid),),
    )
    .get_result(conn)
    .await?;
    Ok(sent.signalled)
}

/// Marks a connection as broken, so that the pool closes it instead of handing it out
/// again: after a handler was abandoned mid-statement, what the session still holds (an
/// open savepoint, a result not read) is unknown.
pub(super) fn discard(conn: &mut AsyncPgConnection) {
    AnsiTransactionManager::transaction_manager_status_mut(conn).set_in_error();
}

/// What an attempt knows of the session its transaction runs on, shared with whatever may
/// have to stop it (its handler's timeout, a lost lease).
#[derive(Debug, Default)]
pub(super) struct AttemptSession {
    /// The backend's process id, 0 until the transaction has started.
    pid: AtomicI32,
    /// Set when the attempt was abandoned mid-statement: the connection must not be reused.
    abandoned: AtomicBool,
}

impl AttemptSession {
    /// A new transaction, on a new connection.
    pub(super) fn reset(&self) {
        self.pid.store(0, Ordering::Release);
        self.abandoned.store(false, Ordering::Release);
    }

    /// The transaction has ended and its connection is given back: no backend to cancel.
    pub(super) fn ended(&self) {
        self.pid.store(0, Ordering::Release);
    }

    pub(super) fn started_on(&self, pid: i32) {
        self.pid.store(pid, Ordering::Release);
    }

    /// The backend running the attempt's transaction, once it has started.
    pub(super) fn backend(&self) -> Option<i32> {
        match AtomicI32::load(&self.pid, Ordering::Acquire) {
            0 => None,
            pid => Some(pid),
        }
    }

    pub(super) fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
    }

    pub(super) fn is_abandoned(&self) -> bool {
        AtomicBool::load(&self.abandoned, Ordering::Acquire)
    }
}

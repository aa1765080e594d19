//! The worker's typed errors: what went wrong talking to the database, and why an attempt's
//! transaction did not commit.

use inbox_core::inbox::TransitionError;
use inbox_core::operations::PurgeError;

use crate::handler::HandlerError;

/// A database step of the worker that failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The pool gave no connection in time.
    #[error("no database connection: {0}")]
    NoConnection(String),
    /// A fenced transition found the lease no longer held.
    #[error("lease lost")]
    LeaseLost,
    /// A statement failed.
    #[error("database: {0}")]
    Database(#[from] diesel::result::Error),
    /// The retention was refused.
    #[error(transparent)]
    Purge(#[from] PurgeError),
}

impl From<TransitionError> for WorkerError {
    fn from(err: TransitionError) -> Self {
        match err {
            TransitionError::LeaseLost => Self::LeaseLost,
            TransitionError::Database(err) => Self::Database(err),
        }
    }
}

/// Why an attempt's transaction did not commit: its handler failed, or the worker's own
/// database step did.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// The handler returned an error, timed out or panicked.
    #[error(transparent)]
    Handler(#[from] HandlerError),
    /// The handler of an event handed on and run in the same transaction failed (without
    /// savepoints, so the whole transaction rolled back): the attempt runs again with one
    /// savepoint per event.
    #[error("an event handed on in the transaction failed: {0}")]
    HandedOn(HandlerError),
    /// The connection, a statement or the lease failed.
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

impl From<diesel::result::Error> for AttemptError {
    fn from(err: diesel::result::Error) -> Self {
        Self::Worker(WorkerError::Database(err))
    }
}

impl From<TransitionError> for AttemptError {
    fn from(err: TransitionError) -> Self {
        Self::Worker(err.into())
    }
}

//! The worker: turns the inbox into business effects, exactly once per event.
//!
//! It claims due rows with `FOR UPDATE SKIP LOCKED` under a lease, runs each event's handler in
//! the transaction that also marks the row done (fenced by the lease token), retries failures
//! with backoff, dead-letters after the last attempt, and rescues rows whose worker died.
//! Usable as a library: implement [`Handler`], build a [`Router`], run a [`Worker`].
#![forbid(unsafe_code)]

pub mod demo;
pub mod forward;
pub mod handler;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod routes;
pub mod runner;
pub mod tls;

pub use handler::{Event, Handled, Handler, HandlerError, OutsideWork, RouteMatch, Router};
pub use runner::{Worker, WorkerSettings};

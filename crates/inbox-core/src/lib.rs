//! The shared core of webhook-inbox.
//!
//! The receiver and the worker never talk to each other: they coordinate only through row
//! states and leases in PostgreSQL. This crate is the one place that defines that contract:
//! the diesel [`schema`], the row [`InboxStatus`], every query that moves a row between states
//! ([`inbox`]), the retry [`BackoffPolicy`], and the database setup both binaries share ([`db`]).
#![forbid(unsafe_code)]

pub mod backoff;
pub mod db;
pub mod durations;
pub mod inbox;
pub mod journal;
pub mod limits;
pub mod metrics;
pub mod operations;
pub mod ordering;
pub mod pg_connect;
pub mod pg_tls;
pub mod pg_url;
pub mod prepared;
pub mod rejections;
pub mod replays;
#[cfg(feature = "http")]
pub mod request_span;
pub mod schema;
mod status;
pub mod telemetry;

pub use backoff::BackoffPolicy;
pub use status::InboxStatus;

/// The PostgreSQL notification channel on which a committed insert wakes idle workers.
pub const NOTIFY_CHANNEL: &str = "webhook_inbox";

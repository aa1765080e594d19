//! The receiver: the inbox's front door.
//!
//! It only ingests. For `POST /webhooks/{provider}` it checks the body's size and arrival
//! time, verifies the provider's signature over the exact bytes, finds the event id, and
//! stores the event with `INSERT ... ON CONFLICT (provider, event_id) DO NOTHING`. It answers
//! 2xx only after the row is committed — for a duplicate too — and 503 with Retry-After when
//! the database cannot confirm the write in time, so the provider retries and nothing acked
//! is ever lost.
#![forbid(unsafe_code)]

pub mod accept;
pub mod budget;
pub mod error;
pub mod head_guard;
pub mod http;
pub mod identify;
pub mod ingest;
pub mod json_field;
pub mod metrics;
pub mod notifier;
pub mod ordering;
pub mod providers;
pub mod rejections;
pub mod server;

//! The operator console of webhook-inbox: a server-rendered web application to see, search
//! and repair the inbox from a browser, on a listener of its own (never the receiver's public
//! port). It reads and writes only through `inbox-core`'s operator functions, like the CLI.
//!
//! Two roles (viewer, operator) with argon2 password hashes ([`users`]), sessions that expire
//! ([`sessions`]), failed logins limited per client and per name ([`login_throttle`]), a CSRF
//! token on every state change and a content security policy that lets no script run
//! ([`http`]); every repair is written to the audit table.
#![forbid(unsafe_code)]

pub mod client_address;
pub mod error;
pub mod http;
pub mod jobs;
pub mod login_throttle;
pub mod metrics;
pub mod pages;
pub mod server;
pub mod sessions;
pub mod users;

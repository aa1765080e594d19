//! Webhook signature schemes of the major providers: verify and sign, over the raw body.
//!
//! This crate is pure and does no I/O. The HTTP receiver hands it the request headers (through
//! [`HeaderSource`]), the raw body bytes and the configured keys, and learns whether the request
//! is authentic and which key matched. Tests, the provider simulator and the benchmarks use
//! [`Scheme::sign`] to produce the headers a provider would send.
//!
//! Supported schemes, named as in the configuration file: `stripe`, `github`,
//! `standard-webhooks` (also Svix's `svix-*` headers), `shopify`, `slack` and a generic
//! `hmac-sha256`. Every scheme is HMAC-SHA256 over the exact bytes the provider documents;
//! digests are compared in constant time, several keys can be configured for rotation, and
//! timestamped schemes reject requests outside a tolerance in both directions.
//!
//! The header parsers are public so fuzz targets can exercise them directly.
//!
//! ```
//! use inbox_signature::{Scheme, Verified};
//!
//! let scheme = Scheme::github();
//! let key = scheme.key_from_secret("It's a Secret to Everybody")?;
//! let headers = scheme.sign(&key, b"Hello, World!", "", 0);
//! let verified = scheme.verify(&headers, b"Hello, World!", &[key], 0)?;
//! assert_eq!(verified, Verified { key_index: 0, timestamp: None });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod error;
mod headers;
mod key;
mod parse;
mod scheme;

pub use error::{KeyError, VerifyError};
pub use headers::{header_names, HeaderSource};
pub use key::SigningKey;
pub use parse::{
    parse_generic_signature, parse_github_header, parse_shopify_header, parse_slack_signature,
    parse_standard_signatures, parse_stripe_header, parse_timestamp, StripeSignatureHeader,
};
pub use scheme::{DigestEncoding, GenericHmac, Scheme, Verified, DEFAULT_TOLERANCE};

//! Webhook signature schemes of 25 named providers, in three families: verify and sign, over
//! the raw body.
//!
//! This crate is pure and does no I/O. The HTTP receiver hands it a [`Request`] (method, the
//! URL the provider called, headers through [`HeaderSource`], the raw body) and the configured
//! keys, and learns whether the request is authentic and which key matched. Tests, the provider
//! simulator and the benchmarks use [`Scheme::sign`] to produce what a provider would send.
//!
//! Every provider is one module of [`providers`] behind the one [`Scheme`] trait, with the
//! vectors that pin it beside it, and one line of [`providers::CATALOG`]. The families:
//! HMAC over a signed string ([`family::template`]: method, URL, timestamp, id and body with
//! separators and prefixes, hex or base64, SHA-1/256/512), public-key signatures
//! ([`family::asymmetric`]: Ed25519, ECDSA P-256, keys configured, never fetched) and static
//! credentials ([`family::credential`]: a token header, Basic auth). Every comparison is
//! constant-time, several keys can be configured for rotation, and timestamped schemes reject
//! requests outside a tolerance in both directions. A scheme's [`Profile`] says where the
//! event id and type are, batches, handshakes and the acknowledgement the provider expects.
//!
//! The header and body parsers are public so fuzz targets can exercise them directly.
//!
//! ```
//! use inbox_signature::{providers, Outgoing, Request, Verified};
//!
//! let scheme = providers::build("github", &providers::Options::default())?;
//! let key = scheme.key_from_secret("It's a Secret to Everybody")?;
//! let signed = scheme.sign(&key, &Outgoing::post(b"Hello, World!", "", 0))?;
//! let verified = scheme.verify(&Request::post(&signed.headers, &signed.body), &[key], 0)?;
//! assert_eq!(verified, Verified { key_index: 0, timestamp: None });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod error;
pub mod family;
mod headers;
mod json_scalar;
mod key;
mod parse;
pub mod providers;
mod scheme;
mod time;

pub use error::{KeyError, SignError, VerifyError};
pub use family::template::{parse_signed, Part, Template};
pub use headers::{header_names, HeaderSource};
pub use key::{Algorithm, SigningKey};
pub use parse::{
    parse_generic_signature, parse_github_header, parse_shopify_header, parse_slack_signature,
    parse_standard_signatures, parse_stripe_header, parse_timestamp, parse_timestamped_list,
    DigestEncoding, StripeSignatureHeader,
};
pub use scheme::{
    Ack, Batch, Family, Field, HandshakeKind, HandshakeReply, ItemId, Outgoing, Profile, Request,
    Scheme, Signed, Verified, DEFAULT_TOLERANCE,
};
pub use time::{check_tolerance, TimestampFormat};

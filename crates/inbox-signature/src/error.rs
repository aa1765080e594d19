//! The two error types of the crate: why a request failed verification, and why a configured
//! secret could not become a key.
//!
//! Neither type ever carries a secret or a header value: errors end up in logs and in HTTP
//! answers, and echoing attacker-controlled text there helps nobody.

/// Why a request was not accepted as authentic.
///
/// The receiver answers every variant with 401; the variants exist so logs and metrics can tell
/// a misconfigured sender (missing or malformed header), a clock or replay problem (timestamp)
/// and a wrong secret or forged request (no match) apart.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum VerifyError {
    /// A header the scheme needs is absent. Carries the header name.
    #[error("missing header {0}")]
    MissingHeader(String),
    /// A header is present but cannot be parsed. Carries the header name, never its value.
    #[error("malformed header {0}")]
    MalformedHeader(String),
    /// The signed timestamp is older than the scheme's tolerance.
    #[error("timestamp is older than the tolerance")]
    StaleTimestamp,
    /// The signed timestamp is further in the future than the scheme's tolerance.
    #[error("timestamp is further in the future than the tolerance")]
    FutureTimestamp,
    /// None of the provided signatures matched any of the keys.
    #[error("no signature matched")]
    NoMatch,
}

/// Why a configured secret could not be turned into a [`SigningKey`](crate::SigningKey).
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The secret, or the key it decodes to, is empty.
    #[error("secret is empty")]
    Empty,
    /// A Standard Webhooks secret whose part after `whsec_` is not base64.
    #[error("secret is not valid base64")]
    NotBase64,
    /// The HMAC implementation refused the key. HMAC-SHA256 takes keys of any length, so this is
    /// not expected to happen; it exists so that no library error is silently swallowed.
    #[error("key rejected by the HMAC implementation")]
    Rejected,
}

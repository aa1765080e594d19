//! The error types of the crate: why a request failed verification, why a configured secret
//! could not become a key, and why a message could not be signed.
//!
//! None of them ever carries a secret or a header value: errors end up in logs and in HTTP
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
    /// The signature travels in the body (Adyen, Mailgun) and the body does not carry it in the
    /// documented shape. Says which part is missing, never its value.
    #[error("malformed body: {0}")]
    MalformedBody(&'static str),
    /// The scheme signs the URL the provider called, and none is known.
    #[error("the scheme signs the request URL and no public_url is configured")]
    MissingUrl,
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

/// Why a configured secret or public key could not be turned into a
/// [`SigningKey`](crate::SigningKey).
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The secret, or the key it decodes to, is empty.
    #[error("secret is empty")]
    Empty,
    /// A secret whose documented encoding is base64 (Standard Webhooks' `whsec_...`) is not.
    #[error("secret is not valid base64")]
    NotBase64,
    /// A secret whose documented encoding is hexadecimal (Adyen's HMAC key) is not.
    #[error("secret is not valid hexadecimal")]
    NotHex,
    /// An asymmetric key that is not in one of the accepted forms. Names the form expected.
    #[error("not a valid key: {0}")]
    Invalid(&'static str),
    /// The HMAC implementation refused the key. HMAC takes keys of any length, so this is not
    /// expected to happen; it exists so that no library error is silently swallowed.
    #[error("key rejected by the HMAC implementation")]
    Rejected,
}

/// Why a message could not be signed (tests, the simulator, `receiver sign`, the benchmark).
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum SignError {
    /// An asymmetric scheme was given only the public half of a key.
    #[error("only a public key is configured: signing needs the private key")]
    PublicKeyOnly,
    /// The key is of another kind than the scheme uses.
    #[error("the key does not belong to this scheme")]
    WrongKey,
    /// The scheme signs the URL and none was given.
    #[error("the scheme signs the request URL: give one")]
    MissingUrl,
    /// The scheme puts its signature inside the body and the body does not have that shape.
    #[error("the body cannot carry the signature: {0}")]
    Body(&'static str),
}

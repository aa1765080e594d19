//! Helpers for the vector tests of the provider modules.

use crate::{HeaderSource, Request, Scheme, SigningKey, Verified, VerifyError};

/// The key `secret` becomes under `scheme`.
pub(crate) fn key(scheme: &dyn Scheme, secret: &str) -> SigningKey {
    scheme
        .key_from_secret(secret)
        .unwrap_or_else(|err| panic!("{}: test secret refused: {err}", scheme.name()))
}

/// Verifies a POST of `body` with `headers` at `url` against the one key of `secret`.
pub(crate) fn verify(
    scheme: &dyn Scheme,
    secret: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    now: i64,
) -> Result<Verified, VerifyError> {
    let headers: &dyn HeaderSource = &headers;
    let request = Request::post(headers, body).at(url);
    scheme.verify(&request, &[key(scheme, secret)], now)
}

/// A vector passes, and fails once its body loses its last byte or the secret changes.
pub(crate) fn assert_vector(
    scheme: &dyn Scheme,
    secret: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    now: i64,
) -> Verified {
    let verified = verify(scheme, secret, url, headers, body, now)
        .unwrap_or_else(|err| panic!("{}: vector refused: {err}", scheme.name()));
    let shorter = &body[..body.len().saturating_sub(1)];
    assert!(
        verify(scheme, secret, url, headers, shorter, now).is_err(),
        "{}: tampered body accepted",
        scheme.name()
    );
    let wrong = format!("{secret}x");
    if let Ok(other) = scheme.key_from_secret(&wrong) {
        let headers_source: &dyn HeaderSource = &headers;
        let request = Request::post(headers_source, body).at(url);
        assert!(
            scheme.verify(&request, &[other], now).is_err(),
            "{}: wrong key accepted",
            scheme.name()
        );
    }
    verified
}

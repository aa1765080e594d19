//! Mailgun: the signature travels in the JSON body, `"signature": {"timestamp", "token",
//! "signature"}`, the last being hex HMAC-SHA256 with the Webhook Signing Key over `timestamp +
//! token` (no separator): the rest of the body is not covered, which is Mailgun's design, so
//! a token must not be taken twice: the scheme hands it to the receiver as its signed nonce,
//! and a delivery carrying a token seen before under another event id is a suppressed replay
//! (the same id is a duplicate already).
//! Mailgun suggests a loose timestamp check: 5 minutes by default.
//! Event id: body `event-data.id`; type: body `event-data.event`.

use std::time::Duration;

use serde::Deserialize;

use crate::family::first_match;
use crate::json_scalar::{is_json, JsonScalar};
use crate::parse::parse_timestamp;
use crate::providers::{fields, tolerance_or, Options};
use crate::time::check_tolerance;
use crate::{
    Algorithm, Field, KeyError, Outgoing, Profile, Request, Scheme, SignError, Signed, SigningKey,
    Verified, VerifyError, DEFAULT_TOLERANCE,
};

/// The Mailgun scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mailgun {
    /// Accepted clock distance, both ways.
    pub tolerance: Duration,
}

/// Builds the scheme (`tolerance` is the only option).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(options: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(Mailgun {
        tolerance: tolerance_or(options, DEFAULT_TOLERANCE),
    }))
}

/// The body's `signature` object: timestamp text, token and the decoded digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailgunSignature {
    /// `signature.timestamp` as sent (unix seconds, a string).
    pub timestamp: String,
    /// `signature.token`.
    pub token: String,
    /// `signature.signature`, hex-decoded.
    pub digest: Vec<u8>,
}

/// A Mailgun body, read for its `signature` object alone (see [`crate::json_scalar`]).
#[derive(Deserialize)]
struct Body {
    signature: Option<SignatureObject>,
}

#[derive(Deserialize)]
struct SignatureObject {
    timestamp: Option<JsonScalar>,
    token: Option<JsonScalar>,
    signature: Option<JsonScalar>,
}

/// Reads the `signature` object of a Mailgun body.
///
/// # Errors
/// [`VerifyError::MalformedBody`] naming the missing part.
pub fn parse_mailgun_body(body: &[u8]) -> Result<MailgunSignature, VerifyError> {
    const MISSING: VerifyError =
        VerifyError::MalformedBody("no signature.timestamp, token and signature");
    let parsed: Body = serde_json::from_slice(body).map_err(|_| {
        if is_json(body) {
            MISSING
        } else {
            VerifyError::MalformedBody("not JSON")
        }
    })?;
    let text = |value: Option<JsonScalar>| value.and_then(JsonScalar::text_or_number);
    let Some(SignatureObject {
        timestamp,
        token,
        signature,
    }) = parsed.signature
    else {
        return Err(MISSING);
    };
    let (Some(timestamp), Some(token), Some(signature)) =
        (text(timestamp), text(token), text(signature))
    else {
        return Err(MISSING);
    };
    let digest = hex::decode(signature.trim())
        .map_err(|_| VerifyError::MalformedBody("signature.signature is not hex"))?;
    Ok(MailgunSignature {
        timestamp,
        token,
        digest,
    })
}

impl Scheme for Mailgun {
    fn name(&self) -> &'static str {
        "mailgun"
    }

    fn tolerance(&self) -> Option<Duration> {
        Some(self.tolerance)
    }

    fn signature_headers(&self) -> Vec<&str> {
        Vec::new()
    }

    fn signs_nonce_not_id(&self) -> bool {
        true
    }

    fn signed_nonce(&self, body: &[u8]) -> Option<String> {
        parse_mailgun_body(body)
            .ok()
            .map(|signature| signature.token)
    }

    fn key_from_secret(&self, secret: &str) -> Result<SigningKey, KeyError> {
        SigningKey::from_bytes(secret.as_bytes())
    }

    fn verify(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        now: i64,
    ) -> Result<Verified, VerifyError> {
        let signature = parse_mailgun_body(request.body)?;
        let timestamp = parse_timestamp(&signature.timestamp).ok_or(VerifyError::MalformedBody(
            "signature.timestamp is not unix seconds",
        ))?;
        let key_index = first_match(
            keys,
            Algorithm::Sha256,
            &[signature.timestamp.as_bytes(), signature.token.as_bytes()],
            &[signature.digest],
        )?;
        check_tolerance(timestamp, now, self.tolerance)?;
        Ok(Verified {
            key_index,
            timestamp: Some(timestamp),
        })
    }

    /// Puts a `signature` object into a JSON object body, its token derived from the id.
    fn sign(&self, key: &SigningKey, message: &Outgoing<'_>) -> Result<Signed, SignError> {
        use sha2::Digest as _;
        let mut json: serde_json::Value = serde_json::from_slice(message.body)
            .map_err(|_| SignError::Body("Mailgun bodies are JSON objects"))?;
        let object = json
            .as_object_mut()
            .ok_or(SignError::Body("Mailgun bodies are JSON objects"))?;
        let timestamp = message.timestamp.to_string();
        let token = hex::encode(sha2::Sha256::digest(format!("{}:{timestamp}", message.id)))[..50]
            .to_owned();
        let digest = key.hmac(Algorithm::Sha256, &[timestamp.as_bytes(), token.as_bytes()]);
        object.insert(
            "signature".into(),
            serde_json::json!({ "timestamp": timestamp, "token": token, "signature": hex::encode(digest) }),
        );
        Ok(Signed {
            headers: Vec::new(),
            body: json.to_string().into_bytes(),
        })
    }

    fn profile(&self) -> Profile {
        fields(
            &[Field::pointer("/event-data/id")],
            &[Field::pointer("/event-data/event")],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::assert_vector;

    #[test]
    fn mailgun_vector_verifies() {
        // Mailgun ships no verification helper: the digest is `openssl dgst -sha256 -hmac
        // key-mailgun-signing` over "1700000000" + token, confirmed with Python's hmac.
        let body = br#"{"signature":{"timestamp":"1700000000","token":"a8ce0edb2dd8301dee6c2405235584e45aa91d1e9f979f3de0","signature":"bc1d4695b271aaa416998b45ddede459c204863b78219cf9fc0d64a057a67253"},"event-data":{"id":"CPgfbmQMTCKtHW6uIWtuVe","event":"delivered"}}"#;
        assert_vector(
            &Mailgun {
                tolerance: DEFAULT_TOLERANCE,
            },
            "key-mailgun-signing",
            "",
            &[],
            body,
            1_700_000_000,
        );
    }

    #[test]
    fn the_signed_token_is_the_nonce() {
        let scheme = Mailgun {
            tolerance: DEFAULT_TOLERANCE,
        };
        assert!(scheme.signs_nonce_not_id());
        let body = br#"{"signature":{"timestamp":"1","token":"tok-1","signature":"00"},"event-data":{"id":"e"}}"#;
        assert_eq!(scheme.signed_nonce(body).as_deref(), Some("tok-1"));
        assert_eq!(scheme.signed_nonce(b"{}"), None);
    }

    #[test]
    fn bodies_without_the_signature_object_are_malformed() {
        assert!(matches!(
            parse_mailgun_body(b"{}"),
            Err(VerifyError::MalformedBody(_))
        ));
        assert!(matches!(
            parse_mailgun_body(b"token=1"),
            Err(VerifyError::MalformedBody(_))
        ));
        assert!(matches!(
            parse_mailgun_body(br#"{"signature":{"timestamp":"1","token":"t","signature":"zz"}}"#),
            Err(VerifyError::MalformedBody(_))
        ));
    }
}

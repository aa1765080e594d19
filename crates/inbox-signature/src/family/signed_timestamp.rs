//! Public-key schemes that sign `timestamp + body` with the signature and the timestamp in two
//! headers: Discord (Ed25519, hex) and SendGrid (ECDSA P-256, base64 DER).

use std::time::Duration;

use base64::Engine as _;

use crate::parse::{parse_timestamp, DIGEST_BASE64};
use crate::time::check_tolerance;
use crate::{
    Family, HandshakeReply, KeyError, Outgoing, Profile, Request, Scheme, SignError, Signed,
    SigningKey, Verified, VerifyError,
};

/// The curve and the signature's encoding in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Curve {
    /// Ed25519, the 64-byte signature in hex.
    Ed25519Hex,
    /// ECDSA P-256 with SHA-256, the DER signature in base64.
    P256Base64Der,
}

/// A `timestamp + body` public-key scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedTimestamp {
    /// The configuration name.
    pub name: &'static str,
    /// The signature header (lowercase).
    pub signature_header: &'static str,
    /// The timestamp header (lowercase, unix seconds).
    pub timestamp_header: &'static str,
    /// The curve.
    pub curve: Curve,
    /// Accepted clock distance, both ways.
    pub tolerance: Duration,
    /// Where ids and types are.
    pub profile: Profile,
    /// Which signed body is a PING to answer, if any.
    pub ping: Ping,
}

/// The PING a [`SignedTimestamp`] scheme answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ping {
    /// None (SendGrid).
    None,
    /// Discord's interactions: `{"type": 1}` without an `event`, answered `{"type":1}`.
    Interaction,
    /// Discord's webhook events: `{"type": 0}`, answered 204.
    WebhookEvent,
}

impl Scheme for SignedTimestamp {
    fn name(&self) -> &'static str {
        self.name
    }

    fn family(&self) -> Family {
        Family::Asymmetric
    }

    fn tolerance(&self) -> Option<Duration> {
        Some(self.tolerance)
    }

    fn signature_headers(&self) -> Vec<&str> {
        vec![self.signature_header, self.timestamp_header]
    }

    fn signed_headers(&self) -> Vec<&str> {
        vec![self.timestamp_header]
    }

    fn key_from_secret(&self, secret: &str) -> Result<SigningKey, KeyError> {
        self.key(secret)
    }

    fn verify(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        now: i64,
    ) -> Result<Verified, VerifyError> {
        self.verify_request(request, keys, now)
    }

    fn sign(&self, key: &SigningKey, message: &Outgoing<'_>) -> Result<Signed, SignError> {
        self.sign_message(key, message)
    }

    fn profile(&self) -> Profile {
        self.profile.clone()
    }

    fn handshake(
        &self,
        request: &Request<'_>,
        _key: Option<&SigningKey>,
    ) -> Option<Result<HandshakeReply, VerifyError>> {
        if self.ping == Ping::None {
            return None;
        }
        let json: serde_json::Value = serde_json::from_slice(request.body).ok()?;
        let kind = json.get("type").and_then(serde_json::Value::as_i64);
        match self.ping {
            // A webhook event (`"type": 1` too, with an `event`) is no interaction PING: never
            // answered as one and so never stored.
            Ping::Interaction if kind == Some(1) && json.get("event").is_none() => Some(Ok(
                HandshakeReply::ok("application/json", br#"{"type":1}"#.to_vec()),
            )),
            Ping::WebhookEvent if kind == Some(0) => Some(Ok(HandshakeReply::no_content())),
            _ => None,
        }
    }
}

impl SignedTimestamp {
    /// The key of a public key (or a private key, for signing) written as the provider shows it.
    pub(crate) fn key(&self, text: &str) -> Result<SigningKey, KeyError> {
        match self.curve {
            Curve::Ed25519Hex => crate::family::asymmetric::ed25519_key(text),
            Curve::P256Base64Der => crate::family::asymmetric::p256_key(text),
        }
    }

    pub(crate) fn verify_request(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        now: i64,
    ) -> Result<Verified, VerifyError> {
        let malformed = || VerifyError::MalformedHeader(self.signature_header.to_owned());
        let encoded = request.required(self.signature_header)?.trim();
        let signature = match self.curve {
            Curve::Ed25519Hex => hex::decode(encoded).map_err(|_| malformed())?,
            Curve::P256Base64Der => DIGEST_BASE64.decode(encoded).map_err(|_| malformed())?,
        };
        let text = request.required(self.timestamp_header)?;
        let timestamp = parse_timestamp(text)
            .ok_or_else(|| VerifyError::MalformedHeader(self.timestamp_header.to_owned()))?;
        let message = [text.as_bytes(), request.body].concat();
        let key_index = keys
            .iter()
            .position(|key| match self.curve {
                Curve::Ed25519Hex => key.ed25519_verifies(&message, &signature),
                Curve::P256Base64Der => key.p256_verifies(&message, &signature),
            })
            .ok_or(VerifyError::NoMatch)?;
        check_tolerance(timestamp, now, self.tolerance)?;
        Ok(Verified {
            key_index,
            timestamp: Some(timestamp),
        })
    }

    pub(crate) fn sign_message(
        &self,
        key: &SigningKey,
        message: &Outgoing<'_>,
    ) -> Result<Signed, SignError> {
        let timestamp = message.timestamp.to_string();
        let signed = [timestamp.as_bytes(), message.body].concat();
        let signature = match self.curve {
            Curve::Ed25519Hex => hex::encode(key.ed25519_sign(&signed)?),
            Curve::P256Base64Der => DIGEST_BASE64.encode(key.p256_sign(&signed)?),
        };
        Ok(Signed {
            headers: vec![
                (self.timestamp_header.to_owned(), timestamp),
                (self.signature_header.to_owned(), signature),
            ],
            body: message.body.to_vec(),
        })
    }
}

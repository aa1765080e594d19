//! Linear: `Linear-Signature: <hex HMAC-SHA256(secret, body)>`; the timestamp is the body's
//! `webhookTimestamp` (unix milliseconds), which the official SDK requires within **60 s**
//! both ways (`Math.abs(Date.now() - timestamp) > 1000 * 60`). Event id `Linear-Delivery`;
//! type `Linear-Event`, else body `type`.

use std::time::Duration;

use crate::family::template::Template;
use crate::providers::{fields, tolerance_or, Options};
use crate::time::check_tolerance;
use crate::{
    Algorithm, DigestEncoding, Field, KeyError, Outgoing, Profile, Request, Scheme, SignError,
    Signed, SigningKey, Verified, VerifyError,
};

/// The tolerance of Linear's own SDK.
pub const LINEAR_TOLERANCE: Duration = Duration::from_secs(60);

/// The body field carrying the timestamp.
const TIMESTAMP_FIELD: &str = "webhookTimestamp";

/// The Linear scheme.
#[derive(Debug, Clone)]
pub struct Linear {
    template: Template,
    tolerance: Duration,
}

/// The Linear scheme with this tolerance.
#[must_use]
pub fn scheme(tolerance: Duration) -> Linear {
    Linear {
        template: Template::body_only(
            "linear",
            "linear-signature",
            None,
            DigestEncoding::Hex,
            Algorithm::Sha256,
            fields(
                &[
                    Field::header("linear-delivery"),
                    Field::pointer("/webhookId"),
                ],
                &[Field::header("linear-event"), Field::pointer("/type")],
            ),
        ),
        tolerance,
    }
}

/// Builds the scheme (`tolerance` is the only option).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(options: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(scheme(tolerance_or(options, LINEAR_TOLERANCE))))
}

/// The body's `webhookTimestamp` in unix seconds.
fn body_timestamp(body: &[u8]) -> Result<i64, VerifyError> {
    let json: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| VerifyError::MalformedBody("not JSON"))?;
    let millis = json
        .get(TIMESTAMP_FIELD)
        .and_then(serde_json::Value::as_i64)
        .ok_or(VerifyError::MalformedBody("no numeric webhookTimestamp"))?;
    Ok(millis.div_euclid(1_000))
}

impl Scheme for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn tolerance(&self) -> Option<Duration> {
        Some(self.tolerance)
    }

    fn signature_headers(&self) -> Vec<&str> {
        self.template.headers()
    }

    fn key_from_secret(&self, secret: &str) -> Result<SigningKey, KeyError> {
        self.template.key(secret)
    }

    fn verify(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        now: i64,
    ) -> Result<Verified, VerifyError> {
        let verified = self.template.verify_request(request, keys, now)?;
        let timestamp = body_timestamp(request.body)?;
        check_tolerance(timestamp, now, self.tolerance)?;
        Ok(Verified {
            timestamp: Some(timestamp),
            ..verified
        })
    }

    /// Adds `webhookTimestamp` to a JSON object body that has none, then signs.
    fn sign(&self, key: &SigningKey, message: &Outgoing<'_>) -> Result<Signed, SignError> {
        let mut json: serde_json::Value = serde_json::from_slice(message.body)
            .map_err(|_| SignError::Body("Linear bodies are JSON objects"))?;
        let object = json
            .as_object_mut()
            .ok_or(SignError::Body("Linear bodies are JSON objects"))?;
        let body = if object.contains_key(TIMESTAMP_FIELD) {
            message.body.to_vec()
        } else {
            object.insert(
                TIMESTAMP_FIELD.into(),
                message.timestamp.saturating_mul(1_000).into(),
            );
            json.to_string().into_bytes()
        };
        self.template.sign_message(
            key,
            &Outgoing {
                body: &body,
                ..*message
            },
        )
    }

    fn profile(&self) -> Profile {
        self.template.profile.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::{assert_vector, verify};

    const SECRET: &str = "lin_wh_secret";
    /// Accepted by `new LinearWebhookClient(SECRET).verify(BODY, SIGNATURE)` of npm
    /// `@linear/sdk` 98.0.0 when generated (its clock within 60 s of webhookTimestamp).
    const BODY: &[u8] = br#"{"action":"create","type":"Issue","data":{"id":"2174add1"},"webhookTimestamp":1796149119608,"webhookId":"000042e3"}"#;
    const SIGNATURE: &str = "ee68bfcf1b8417b3617ced18e509244d8b594a21c98fff31d481cf3de136504a";
    const TS: i64 = 1_796_149_119;

    #[test]
    fn linear_sdk_vector_verifies_within_sixty_seconds() {
        let headers = [("Linear-Signature", SIGNATURE), ("Linear-Delivery", "d1")];
        let scheme = scheme(LINEAR_TOLERANCE);
        let verified = assert_vector(&scheme, SECRET, "", &headers, BODY, TS + 60);
        assert_eq!(verified.timestamp, Some(TS));
        assert_eq!(
            verify(&scheme, SECRET, "", &headers, BODY, TS + 61),
            Err(VerifyError::StaleTimestamp)
        );
        assert_eq!(
            verify(&scheme, SECRET, "", &headers, BODY, TS - 61),
            Err(VerifyError::FutureTimestamp)
        );
    }
}

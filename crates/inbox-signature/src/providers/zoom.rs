//! Zoom: `x-zm-signature: v0=<hex>` and `x-zm-request-timestamp`, HMAC-SHA256 with the app's
//! secret token over `"v0:{timestamp}:{body}"`. Handshake: the signed
//! `endpoint.url_validation` event, answered with `{"plainToken": p, "encryptedToken":
//! hex(HMAC-SHA256(secret, p))}`. Zoom sends no event id: the id joins `event`, `event_ts`
//! (milliseconds), which a retry repeats, and the object the event is about, so that two
//! events of one kind in the same millisecond (participants joining as a meeting starts) are
//! not taken for one: `payload.object.uuid` and, for participant events,
//! `payload.object.participant.user_id`; else `payload.object.id`; else the first two alone.

use crate::family::template::Template;
use crate::providers::{fields, template_scheme, tolerance_or, Options};
use crate::time::TimestampFormat;
use crate::{
    Algorithm, DigestEncoding, Field, HandshakeKind, HandshakeReply, Request, Scheme, SigningKey,
    VerifyError, DEFAULT_TOLERANCE,
};

/// The Zoom scheme.
#[derive(Debug, Clone)]
pub struct Zoom(pub Template);

/// The Zoom scheme with this tolerance.
#[must_use]
pub fn scheme(tolerance: std::time::Duration) -> Zoom {
    let profile = fields(
        &[
            Field::joined(&[
                "/event",
                "/event_ts",
                "/payload/object/uuid",
                "/payload/object/participant/user_id",
            ]),
            Field::joined(&["/event", "/event_ts", "/payload/object/uuid"]),
            Field::joined(&["/event", "/event_ts", "/payload/object/id"]),
            Field::joined(&["/event", "/event_ts"]),
        ],
        &[Field::pointer("/event")],
    )
    .with_handshake(HandshakeKind::SignedPost);
    Zoom(
        Template::body_only(
            "zoom",
            "x-zm-signature",
            Some("v0="),
            DigestEncoding::Hex,
            Algorithm::Sha256,
            profile,
        )
        .timestamped(
            "x-zm-request-timestamp",
            TimestampFormat::UnixSeconds,
            tolerance,
        )
        .signing("v0:{timestamp}:{body}"),
    )
}

/// Builds the scheme (`tolerance` is the only option).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(options: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(scheme(tolerance_or(options, DEFAULT_TOLERANCE))))
}

template_scheme!(Zoom {
    fn handshake(
        &self,
        request: &Request<'_>,
        key: Option<&SigningKey>,
    ) -> Option<Result<HandshakeReply, VerifyError>> {
        let json: serde_json::Value = serde_json::from_slice(request.body).ok()?;
        if json.get("event").and_then(serde_json::Value::as_str) != Some("endpoint.url_validation") {
            return None;
        }
        let (Some(plain), Some(key)) = (
            json.pointer("/payload/plainToken").and_then(serde_json::Value::as_str),
            key,
        ) else {
            return Some(Err(VerifyError::MalformedBody("url_validation without plainToken")));
        };
        let encrypted = hex::encode(key.hmac(Algorithm::Sha256, &[plain.as_bytes()]));
        Some(Ok(HandshakeReply::ok(
            "application/json",
            serde_json::json!({ "plainToken": plain, "encryptedToken": encrypted })
                .to_string()
                .into_bytes(),
        )))
    }
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::{assert_vector, key};

    // Zoom publishes no SDK that verifies: every digest below is `openssl dgst -sha256 -hmac
    // zoom-secret-token` over the signed string, confirmed with Python's hmac module.
    const SECRET: &str = "zoom-secret-token";

    #[test]
    fn zoom_event_vector_verifies() {
        assert_vector(
            &scheme(DEFAULT_TOLERANCE),
            SECRET,
            "",
            &[
                ("x-zm-request-timestamp", "1700000000"),
                ("x-zm-signature", "v0=f389c9b883a20e77c63c8cc4862cb175a93b5ef861a6e743bc9cccacb3a8af19"),
            ],
            br#"{"event":"meeting.started","event_ts":1700000000123,"payload":{"object":{"uuid":"4444AAAiAAAAAiAiAiiAii=="}}}"#,
            1_700_000_000,
        );
    }

    #[test]
    fn url_validation_is_verified_and_answered_with_the_encrypted_token() {
        let scheme = scheme(DEFAULT_TOLERANCE);
        let body = br#"{"event":"endpoint.url_validation","payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1700000000123}"#;
        let headers = [
            ("x-zm-request-timestamp", "1700000000"),
            (
                "x-zm-signature",
                "v0=a1983a1ea777565bee8c5ee22e3f2e9368704106e00b22094bd2f305fa0d1d4e",
            ),
        ];
        assert_vector(&scheme, SECRET, "", &headers, body, 1_700_000_000);
        let key = key(&scheme, SECRET);
        let reply = scheme
            .handshake(&Request::post(&headers, body), Some(&key))
            .expect("a handshake")
            .expect("answered");
        let reply: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
        assert_eq!(reply["plainToken"], "qgg8vlvZRS6UYooatFL8Aw");
        assert_eq!(
            reply["encryptedToken"],
            "d9e0d764a78494688ba3f2d5c0ed4ca311394b4834d959759213424d2df961e3"
        );
    }
}

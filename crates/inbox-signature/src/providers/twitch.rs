//! Twitch EventSub: `Twitch-Eventsub-Message-Signature: sha256=<hex>` over
//! `message_id + timestamp + body` (HMAC-SHA256 with the subscription secret), the timestamp
//! RFC 3339 in `Twitch-Eventsub-Message-Timestamp`, 10 minutes of tolerance as Twitch's docs
//! require. Event id `Twitch-Eventsub-Message-Id` (the same on a resend); type: body
//! `subscription.type`. Handshake: the signed `webhook_callback_verification` message,
//! answered with its raw `challenge` as text/plain. `revocation` messages are stored as events.

use std::time::Duration;

use crate::family::template::Template;
use crate::providers::{fields, template_scheme, tolerance_or, Options};
use crate::time::TimestampFormat;
use crate::{
    Algorithm, DigestEncoding, Field, HandshakeKind, HandshakeReply, Request, Scheme, SigningKey,
    VerifyError,
};

/// Twitch's documented replay window.
pub const TWITCH_TOLERANCE: Duration = Duration::from_secs(600);

/// The header naming the kind of message.
pub const MESSAGE_TYPE: &str = "twitch-eventsub-message-type";

/// The Twitch scheme.
#[derive(Debug, Clone)]
pub struct Twitch(pub Template);

/// The Twitch scheme with this tolerance.
#[must_use]
pub fn scheme(tolerance: Duration) -> Twitch {
    let profile = fields(
        &[Field::header("twitch-eventsub-message-id")],
        &[Field::pointer("/subscription/type")],
    )
    .with_handshake(HandshakeKind::SignedPost);
    Twitch(
        Template::body_only(
            "twitch",
            "twitch-eventsub-message-signature",
            Some("sha256="),
            DigestEncoding::Hex,
            Algorithm::Sha256,
            profile,
        )
        .timestamped(
            "twitch-eventsub-message-timestamp",
            TimestampFormat::Rfc3339,
            tolerance,
        )
        .with_id_header("twitch-eventsub-message-id")
        .signing("{id}{timestamp}{body}"),
    )
}

/// Builds the scheme (`tolerance` is the only option).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(options: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(scheme(tolerance_or(options, TWITCH_TOLERANCE))))
}

template_scheme!(Twitch {
    fn handshake(
        &self,
        request: &Request<'_>,
        _key: Option<&SigningKey>,
    ) -> Option<Result<HandshakeReply, VerifyError>> {
        if request.headers.header(MESSAGE_TYPE) != Some("webhook_callback_verification") {
            return None;
        }
        let json: Option<serde_json::Value> = serde_json::from_slice(request.body).ok();
        let challenge = json
            .as_ref()
            .and_then(|json| json.get("challenge"))
            .and_then(serde_json::Value::as_str);
        Some(match challenge {
            Some(challenge) => Ok(HandshakeReply::ok(
                "text/plain",
                challenge.as_bytes().to_vec(),
            )),
            None => Err(VerifyError::MalformedBody("verification without challenge")),
        })
    }
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::assert_vector;

    // No official SDK verifies EventSub: the digests are `openssl dgst -sha256 -hmac
    // twitch-subscription-secret` over id + timestamp + body, confirmed with Python's hmac.
    const SECRET: &str = "twitch-subscription-secret";
    const TIMESTAMP: &str = "2023-11-14T22:13:20.123456789Z";
    const NOW: i64 = 1_700_000_000;

    #[test]
    fn twitch_notification_vector_verifies() {
        let verified = assert_vector(
            &scheme(TWITCH_TOLERANCE),
            SECRET,
            "",
            &[
                (
                    "Twitch-Eventsub-Message-Id",
                    "e76c6bd4-55c9-4987-8304-da1588d8988b",
                ),
                ("Twitch-Eventsub-Message-Timestamp", TIMESTAMP),
                ("Twitch-Eventsub-Message-Type", "notification"),
                (
                    "Twitch-Eventsub-Message-Signature",
                    "sha256=5a3b1474cc58802afe8d135efc3b0aa3fe2b39a9ff0e3524bb163b1effb074b4",
                ),
            ],
            br#"{"subscription":{"type":"channel.follow"},"event":{"user_id":"1234"}}"#,
            NOW + 599,
        );
        assert_eq!(verified.timestamp, Some(NOW));
    }

    #[test]
    fn callback_verification_answers_the_raw_challenge() {
        let headers = [
            (
                "Twitch-Eventsub-Message-Id",
                "f1c2a387-161a-49f9-a165-0f21d7a4e1c4",
            ),
            ("Twitch-Eventsub-Message-Timestamp", TIMESTAMP),
            (
                "Twitch-Eventsub-Message-Type",
                "webhook_callback_verification",
            ),
            (
                "Twitch-Eventsub-Message-Signature",
                "sha256=6ebf66c5ad68610af88e3defc83c7cec6b7dc25112f01a731aada31a48667b8c",
            ),
        ];
        let body = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"type":"channel.follow"}}"#;
        let scheme = scheme(TWITCH_TOLERANCE);
        assert_vector(&scheme, SECRET, "", &headers, body, NOW);
        let reply = scheme
            .handshake(&Request::post(&headers, body), None)
            .expect("a handshake")
            .expect("answered");
        assert_eq!(reply.content_type, "text/plain");
        assert_eq!(reply.body, b"pogchamp-kappa-360noscope-vohiyo");
    }
}

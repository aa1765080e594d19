//! Discord interactions: `X-Signature-Ed25519: <hex>` over `timestamp + body` with the
//! application's Ed25519 public key (hex, from the developer portal), the timestamp in
//! `X-Signature-Timestamp` (unix seconds; 5 minutes of tolerance). Discord probes endpoints
//! with deliberately bad signatures and expects 401, which every failure here is. Handshake:
//! the signed PING (`"type": 1`, no `event` member), answered `{"type":1}`. Event id: body `id`;
//! type: body `type`.
//!
//! Discord wants an interaction response within 3 seconds: a stored interaction is answered
//! `{"type":5}` (deferred: the user sees the application thinking), and its handler follows it
//! up through the interaction's token within 15 minutes. Autocomplete interactions cannot be
//! deferred and are not for an inbox.
//!
//! Discord's webhook events (`discord-events`, the application's "Webhook Events URL") are
//! signed the same way: `{"version": 1, "application_id", "type", "event"}`, `type` 0 the
//! PING and 1 an event, both answered 204 with no body. An event has no id: the id joins the
//! event's `type` and `timestamp` (microseconds, which a retry repeats) with the object it is
//! about, `data.id` (an entitlement, a message) or else `data.user.id` and `data.guild.id`
//! (an authorization).

use std::time::Duration;

use crate::family::signed_timestamp::{Curve, Ping, SignedTimestamp};
use crate::providers::{fields, tolerance_or, Options};
use crate::{Ack, Field, HandshakeKind, Profile, Scheme, DEFAULT_TOLERANCE};

/// The signature header.
pub const SIGNATURE: &str = "x-signature-ed25519";
/// The timestamp header.
pub const TIMESTAMP: &str = "x-signature-timestamp";
/// The interaction response of a stored interaction: `DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE`,
/// valid for commands, components and modal submissions.
pub const DEFERRED: &str = r#"{"type":5}"#;

/// The Discord scheme with this tolerance. Keys: the application's public key in hex (or PEM);
/// a PKCS#8 PEM private key for signing.
#[must_use]
pub fn scheme(tolerance: Duration) -> SignedTimestamp {
    SignedTimestamp {
        name: "discord",
        signature_header: SIGNATURE,
        timestamp_header: TIMESTAMP,
        curve: Curve::Ed25519Hex,
        tolerance,
        profile: Profile {
            ack: Ack::Json(DEFERRED.into()),
            ..fields(&[Field::pointer("/id")], &[Field::pointer("/type")])
                .with_handshake(HandshakeKind::SignedPost)
        },
        ping: Ping::Interaction,
    }
}

/// The scheme of Discord's webhook events with this tolerance; keys as [`scheme`]'s.
#[must_use]
pub fn events_scheme(tolerance: Duration) -> SignedTimestamp {
    const TYPE: &str = "/event/type";
    const AT: &str = "/event/timestamp";
    SignedTimestamp {
        name: "discord-events",
        signature_header: SIGNATURE,
        timestamp_header: TIMESTAMP,
        curve: Curve::Ed25519Hex,
        tolerance,
        profile: Profile {
            ack: Ack::NoContent,
            ..fields(
                &[
                    Field::joined(&[TYPE, AT, "/event/data/id"]),
                    Field::joined(&[TYPE, AT, "/event/data/user/id", "/event/data/guild/id"]),
                    Field::joined(&[TYPE, AT, "/event/data/user/id"]),
                    Field::joined(&[TYPE, AT]),
                ],
                &[Field::pointer(TYPE)],
            )
            .with_handshake(HandshakeKind::SignedPost)
        },
        ping: Ping::WebhookEvent,
    }
}

/// Builds the scheme (`tolerance` is the only option).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(options: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(scheme(tolerance_or(options, DEFAULT_TOLERANCE))))
}

/// Builds the webhook events' scheme (`tolerance` is the only option).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build_events(options: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(events_scheme(tolerance_or(
        options,
        DEFAULT_TOLERANCE,
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::{assert_vector, verify};
    use crate::{Request, VerifyError};

    /// RFC 8032 section 7.1 test 1's public key, as Discord shows keys (hex).
    const PUBLIC_KEY: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    const BODY: &[u8] = br#"{"type":2,"id":"1234567890","data":{"name":"ping"}}"#;
    /// Signed with RFC 8032 test 1's secret key by Node's crypto over "1700000000" + BODY;
    /// accepted by `verifyKey(BODY, SIGNATURE, "1700000000", PUBLIC_KEY)` of npm
    /// `discord-interactions` 4.4.0.
    const SIGNATURE: &str = "15485c6297b13334676ce6adae4f9eda670f7cdfa15903b8177decf7eec935dfab0632be45c5806f488daed5ea491199ea7fbe9aa5ab85dc3b20f3f0c02e480b";

    #[test]
    fn discord_interactions_vector_verifies() {
        let headers = [
            ("X-Signature-Ed25519", SIGNATURE),
            ("X-Signature-Timestamp", "1700000000"),
        ];
        let scheme = scheme(DEFAULT_TOLERANCE);
        assert_vector(&scheme, PUBLIC_KEY, "", &headers, BODY, 1_700_000_000);
        let other_key = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"; // RFC 8032 test 2
        assert_eq!(
            verify(&scheme, other_key, "", &headers, BODY, 1_700_000_000),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn the_signed_ping_is_answered_with_a_pong() {
        let body = br#"{"type":1,"id":"1111","application_id":"2222"}"#;
        // Signed like the vector above; accepted by the same verifyKey.
        let headers = [
            ("X-Signature-Ed25519", "76d68dc1a81de331bd2779bd0ccde4694edffee65d0f23be6b9cf757d078e72b921ee772da5f1bf8db397457606fcd2d93a3bd9a30bddae1287bb98620235a0d"),
            ("X-Signature-Timestamp", "1700000000"),
        ];
        let scheme = scheme(DEFAULT_TOLERANCE);
        assert_vector(&scheme, PUBLIC_KEY, "", &headers, body, 1_700_000_000);
        let reply = scheme
            .handshake(&Request::post(&headers, body), None)
            .expect("PING")
            .expect("PONG");
        assert_eq!(reply.body, br#"{"type":1}"#);
        assert!(scheme
            .handshake(&Request::post(&headers, BODY), None)
            .is_none());
        // Discord's webhook events are `"type": 1` too, with an `event`: not a PING.
        let event = br#"{"version":1,"application_id":"2222","type":1,"event":{"type":"APPLICATION_AUTHORIZED","timestamp":"2026-12-01T10:00:00.000000","data":{}}}"#;
        assert!(scheme
            .handshake(&Request::post(&headers, event), None)
            .is_none());
    }

    #[test]
    fn the_webhook_events_ping_is_type_0_and_is_answered_204() {
        // The same signature as interactions: the vector of discord-interactions' verifyKey
        // verifies under this scheme too.
        let headers = [
            ("X-Signature-Ed25519", SIGNATURE),
            ("X-Signature-Timestamp", "1700000000"),
        ];
        let events = events_scheme(DEFAULT_TOLERANCE);
        assert_vector(&events, PUBLIC_KEY, "", &headers, BODY, 1_700_000_000);
        let ping = br#"{"version":1,"application_id":"2222","type":0}"#;
        let reply = events
            .handshake(&Request::post(&headers, ping), None)
            .expect("PING")
            .expect("answer");
        assert_eq!((reply.status, reply.body.as_slice()), (204, b"".as_slice()));
        let event = br#"{"version":1,"application_id":"2222","type":1,"event":{"type":"ENTITLEMENT_CREATE","timestamp":"2026-12-01T10:00:00.123456","data":{"id":"e-1"}}}"#;
        assert!(events
            .handshake(&Request::post(&headers, event), None)
            .is_none());
        assert_eq!(events.profile().ack, Ack::NoContent);
    }

    #[test]
    fn a_stored_interaction_is_answered_with_a_deferred_response() {
        assert_eq!(
            scheme(DEFAULT_TOLERANCE).profile().ack,
            Ack::Json(r#"{"type":5}"#.into())
        );
    }
}

//! SendGrid (Twilio SendGrid Event Webhook): `X-Twilio-Email-Event-Webhook-Signature` (base64
//! of a DER ECDSA P-256 / SHA-256 signature) over `timestamp + body`, the timestamp in
//! `X-Twilio-Email-Event-Webhook-Timestamp`; the verification key is the base64 DER public key
//! from the Mail Settings page. SendGrid documents no tolerance; 5 minutes is used. Bodies are
//! batches: a JSON array, one event per element keyed by `sg_event_id`, typed by `event`.

use std::time::Duration;

use crate::family::signed_timestamp::{Curve, Ping, SignedTimestamp};
use crate::providers::{tolerance_or, Options};
use crate::{Batch, ItemId, Profile, Scheme, DEFAULT_TOLERANCE};

/// The signature header.
pub const SIGNATURE: &str = "x-twilio-email-event-webhook-signature";
/// The timestamp header.
pub const TIMESTAMP: &str = "x-twilio-email-event-webhook-timestamp";

/// The SendGrid scheme with this tolerance. Keys: the base64 DER public key SendGrid shows (or
/// PEM); a PKCS#8 PEM private key for signing.
#[must_use]
pub fn scheme(tolerance: Duration) -> SignedTimestamp {
    SignedTimestamp {
        name: "sendgrid",
        signature_header: SIGNATURE,
        timestamp_header: TIMESTAMP,
        curve: Curve::P256Base64Der,
        tolerance,
        profile: Profile {
            batch: Some(Batch {
                items: String::new(),
                unwrap: String::new(),
                id: ItemId::Pointers(vec!["/sg_event_id".into()]),
                event_type: Some("/event".into()),
            }),
            ..Profile::fields(Vec::new(), Vec::new())
        },
        ping: Ping::None,
    }
}

/// Builds the scheme (`tolerance` is the only option).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(options: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(scheme(tolerance_or(options, DEFAULT_TOLERANCE))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::assert_vector;

    // The official vector of sendgrid/sendgrid-nodejs
    // packages/eventwebhook/src/eventwebhook.spec.js (PUBLIC_KEY, SIGNATURE, TIMESTAMP,
    // PAYLOAD), also accepted by `EventWebhook.verifySignature` of npm @sendgrid/eventwebhook 8.0.0.
    const PUBLIC_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==";
    const SIGNATURE_VALUE: &str = "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0=";
    const PAYLOAD: &[u8] =
        br#"{"category":"example_payload","event":"test_event","message_id":"message_id"}"#;

    #[test]
    fn sendgrid_official_vector_verifies() {
        let headers = [
            ("X-Twilio-Email-Event-Webhook-Signature", SIGNATURE_VALUE),
            ("X-Twilio-Email-Event-Webhook-Timestamp", "1588788367"),
        ];
        assert_vector(
            &scheme(DEFAULT_TOLERANCE),
            PUBLIC_KEY,
            "",
            &headers,
            PAYLOAD,
            1_588_788_367,
        );
    }
}

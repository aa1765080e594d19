//! Calendly: `Calendly-Webhook-Signature: t=<unix>,v1=<hex>`, HMAC-SHA256 with the
//! subscription's signing key over `"{t}.{body}"` (Stripe's shape). Calendly states no
//! tolerance; 5 minutes is used. Event id: body `event` and `payload.uri` joined (an invitee
//! is created once and canceled once); type: body `event`.

use std::time::Duration;

use crate::family::timestamped_list::TimestampedList;
use crate::providers::{fields, tolerance_or, Options};
use crate::{Field, Scheme, DEFAULT_TOLERANCE};

/// Calendly's signature header.
pub const HEADER: &str = "calendly-webhook-signature";

/// The Calendly scheme with this tolerance.
#[must_use]
pub fn scheme(tolerance: Duration) -> TimestampedList {
    TimestampedList {
        name: "calendly",
        header: HEADER,
        separator: ',',
        time_key: "t",
        digest_key: "v1",
        joiner: ".",
        tolerance,
        profile: fields(
            &[Field::joined(&["/event", "/payload/uri"])],
            &[Field::pointer("/event")],
        ),
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

    #[test]
    fn calendly_vector_verifies() {
        // Calendly publishes no verifying SDK: the digest is `openssl dgst -sha256 -hmac
        // calendly-signing-key` over "1700000000." + body, confirmed with Python's hmac.
        assert_vector(
            &scheme(DEFAULT_TOLERANCE),
            "calendly-signing-key",
            "",
            &[("Calendly-Webhook-Signature", "t=1700000000,v1=f60a689b5e8a8dadc86c1f9851458594816c3cfc29d49c847da1331a14d4b23a")],
            br#"{"event":"invitee.created","created_at":"2023-11-14T22:13:20.000000Z","payload":{"uri":"https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2/invitees/AAAAAAAAAAAAAAAA"}}"#,
            1_700_000_000,
        );
    }
}

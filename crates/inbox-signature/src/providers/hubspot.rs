//! HubSpot (signature v3): `X-HubSpot-Signature-v3: <base64 HMAC-SHA256(client secret,
//! method + url + body + timestamp)>`, the timestamp in milliseconds in
//! `X-HubSpot-Request-Timestamp`, 5 minutes of tolerance (`MAX_ALLOWED_TIMESTAMP = 300000` in
//! the SDK). The URL is the one HubSpot called, taken as the SDK takes it (configure
//! `public_url`). Bodies are batches: a JSON array, one event per element keyed by `eventId`,
//! typed by `subscriptionType`. Versions 1 and 2 carry no timestamp and are not supported.

use crate::family::template::Template;
use crate::providers::{tolerance_or, Options};
use crate::time::TimestampFormat;
use crate::{Algorithm, Batch, DigestEncoding, ItemId, Profile, Scheme, DEFAULT_TOLERANCE};

/// The HubSpot scheme with this tolerance.
#[must_use]
pub fn scheme(tolerance: std::time::Duration) -> Template {
    let profile = Profile {
        batch: Some(Batch {
            items: String::new(),
            unwrap: String::new(),
            id: ItemId::Pointers(vec!["/eventId".into()]),
            event_type: Some("/subscriptionType".into()),
        }),
        ..Profile::fields(Vec::new(), Vec::new())
    }
    .signing_url();
    Template::body_only(
        "hubspot",
        "x-hubspot-signature-v3",
        None,
        DigestEncoding::Base64,
        Algorithm::Sha256,
        profile,
    )
    .timestamped(
        "x-hubspot-request-timestamp",
        TimestampFormat::UnixMillis,
        tolerance,
    )
    .signing("{method}{url}{body}{timestamp}")
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
    use crate::providers::testing::{assert_vector, verify};
    use crate::VerifyError;

    const URL: &str = "https://example.com/webhooks/hubspot";
    const BODY: &[u8] =
        br#"[{"eventId":100,"subscriptionType":"contact.creation","objectId":123}]"#;
    /// `Signature.getSignature("POST", "v3", {clientSecret: "hs-client-secret", requestBody:
    /// BODY, url: URL, timestamp: 1796149119609})`, accepted by `Signature.isValid`,
    /// npm `@hubspot/api-client` 13.5.0 (lib/src/utils/signature.js).
    const HEADERS: [(&str, &str); 2] = [
        ("X-HubSpot-Request-Timestamp", "1796149119609"),
        (
            "X-HubSpot-Signature-v3",
            "LqVRptNf6aOvo0jNd66qrJFmVnoOZS5hBWjT0rcYddw=",
        ),
    ];
    const NOW: i64 = 1_796_149_119;

    #[test]
    fn hubspot_sdk_vector_verifies() {
        let verified = assert_vector(
            &scheme(DEFAULT_TOLERANCE),
            "hs-client-secret",
            URL,
            &HEADERS,
            BODY,
            NOW,
        );
        assert_eq!(verified.timestamp, Some(NOW));
    }

    #[test]
    fn hubspot_rejects_a_timestamp_older_than_five_minutes() {
        assert_eq!(
            verify(
                &scheme(DEFAULT_TOLERANCE),
                "hs-client-secret",
                URL,
                &HEADERS,
                BODY,
                NOW + 301
            ),
            Err(VerifyError::StaleTimestamp)
        );
    }
}

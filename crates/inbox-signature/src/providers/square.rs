//! Square: `x-square-hmacsha256-signature: <base64 HMAC-SHA256(signature key, url + body)>`,
//! where the URL is the subscription's notification URL exactly as registered (configure it as
//! `public_url`: behind a load balancer the receiver cannot see it). No timestamp.
//! Event id: body `event_id`; type: body `type`.

use crate::family::template::Template;
use crate::providers::{fields, Options};
use crate::{Algorithm, DigestEncoding, Field, Scheme};

/// The Square scheme.
#[must_use]
pub fn scheme() -> Template {
    Template::body_only(
        "square",
        "x-square-hmacsha256-signature",
        None,
        DigestEncoding::Base64,
        Algorithm::Sha256,
        fields(&[Field::pointer("/event_id")], &[Field::pointer("/type")]).signing_url(),
    )
    .signing("{url}{body}")
}

/// Builds the scheme (no options).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(_: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(scheme()))
}

#[cfg(test)]
mod tests {
    use crate::providers::testing::{assert_vector, verify};
    use crate::VerifyError;

    const URL: &str = "https://example.com/webhooks/square";
    const BODY: &[u8] = br#"{"merchant_id":"MLEFBHHSJGVHD","type":"payment.updated","event_id":"d7e9d8fb-6a8c-4c2a-9b2b-6ff7a2d4a7a1","data":{}}"#;
    /// Accepted by `WebhooksHelper.verifySignature({requestBody: BODY, signatureHeader,
    /// signatureKey: "sq-signature-key", notificationUrl: URL})`, npm `square` 46.0.0.
    const SIGNATURE: &str = "QL0egrt/BUeTBk4+XrTenOU/aIyoWKlUDAkViPuvpQ4=";

    #[test]
    fn square_sdk_vector_verifies_at_the_registered_url_only() {
        let headers = [("x-square-hmacsha256-signature", SIGNATURE)];
        assert_vector(&super::scheme(), "sq-signature-key", URL, &headers, BODY, 0);
        assert_eq!(
            verify(
                &super::scheme(),
                "sq-signature-key",
                "http://10.0.0.7:8080/webhooks/square",
                &headers,
                BODY,
                0
            ),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            verify(&super::scheme(), "sq-signature-key", "", &headers, BODY, 0),
            Err(VerifyError::MissingUrl)
        );
    }
}

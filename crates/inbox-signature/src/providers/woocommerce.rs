//! WooCommerce: `X-WC-Webhook-Signature: <base64 HMAC-SHA256(secret, body)>`; no timestamp.
//! Event id `X-WC-Webhook-Delivery-ID`; type `X-WC-Webhook-Topic`.

use crate::family::template::Template;
use crate::providers::{fields, Options};
use crate::{Algorithm, DigestEncoding, Field, Scheme};

/// The woocommerce scheme.
#[must_use]
pub fn scheme() -> Template {
    Template::body_only(
        "woocommerce",
        "X-WC-Webhook-Signature",
        None,
        DigestEncoding::Base64,
        Algorithm::Sha256,
        fields(
            &[Field::header("x-wc-webhook-delivery-id")],
            &[Field::header("x-wc-webhook-topic")],
        ),
    )
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
    use crate::providers::testing::assert_vector;

    #[test]
    fn woocommerce_vector_verifies() {
        // No official SDK verifies these: the digest is `openssl dgst -hmac` over the body,
        // confirmed with Python's hmac module (two independent implementations).
        assert_vector(
            &super::scheme(),
            "wc-secret",
            "",
            &[(
                "X-WC-Webhook-Signature",
                "UjBhNunaPTdStdItIqf0+pgfft27av0pqucaSIXs1kw=",
            )],
            br#"{"id":537,"status":"processing"}"#,
            0,
        );
    }
}

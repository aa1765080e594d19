//! Shopify: `X-Shopify-Hmac-Sha256: <base64 HMAC-SHA256(secret, body)>`; no timestamp.
//! Event id `X-Shopify-Event-Id` (Shopify's documented duplicate key), falling back to
//! `X-Shopify-Webhook-Id`; type `X-Shopify-Topic`.

use crate::family::template::Template;
use crate::providers::{fields, Options};
use crate::{Algorithm, DigestEncoding, Field, Scheme};

/// The Shopify scheme.
#[must_use]
pub fn scheme() -> Template {
    Template::body_only(
        "shopify",
        crate::header_names::SHOPIFY_HMAC_SHA256,
        None,
        DigestEncoding::Base64,
        Algorithm::Sha256,
        fields(
            &[
                Field::header("x-shopify-event-id"),
                Field::header("x-shopify-webhook-id"),
            ],
            &[Field::header("x-shopify-topic")],
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
    fn shopify_vector_verifies() {
        // No official verification SDK is used here: the value is
        // `openssl dgst -sha256 -hmac shop-secret -binary | base64`, confirmed with Python's hmac.
        assert_vector(
            &super::scheme(),
            "shop-secret",
            "",
            &[(
                "X-Shopify-Hmac-Sha256",
                "plW8VGqq0nDMIEhDqaNNW99asdUCy7EIqLZVcQwtAZ0=",
            )],
            br#"{"id":1}"#,
            0,
        );
    }
}

//! Typeform: `Typeform-Signature: sha256=<base64 HMAC-SHA256(secret, body)>` (base64, not hex);
//! no timestamp. Event id: body `event_id`; type: body `event_type`.

use crate::family::template::Template;
use crate::providers::{fields, Options};
use crate::{Algorithm, DigestEncoding, Field, Scheme};

/// The typeform scheme.
#[must_use]
pub fn scheme() -> Template {
    Template::body_only(
        "typeform",
        "Typeform-Signature",
        Some("sha256="),
        DigestEncoding::Base64,
        Algorithm::Sha256,
        fields(
            &[Field::pointer("/event_id")],
            &[Field::pointer("/event_type")],
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
    fn typeform_vector_verifies() {
        // No official SDK verifies these: the digest is `openssl dgst -hmac` over the body,
        // confirmed with Python's hmac module (two independent implementations).
        assert_vector(
            &super::scheme(),
            "typeform-secret",
            "",
            &[(
                "Typeform-Signature",
                "sha256=Y6xEzV3Z5ljQX0rXUPsGHwxHkN3oTyWuLA/oiqgoLjU=",
            )],
            br#"{"event_id":"01HBZ4Q1","event_type":"form_response","form_response":{}}"#,
            0,
        );
    }
}

//! Intercom: `X-Hub-Signature: sha1=<hex HMAC-SHA1(client_secret, body)>`; no timestamp.
//! Event id: body `id` (`notif_...`); type: body `topic`.

use crate::family::template::Template;
use crate::providers::{fields, Options};
use crate::{Algorithm, DigestEncoding, Field, Scheme};

/// The intercom scheme.
#[must_use]
pub fn scheme() -> Template {
    Template::body_only(
        "intercom",
        "X-Hub-Signature",
        Some("sha1="),
        DigestEncoding::Hex,
        Algorithm::Sha1,
        fields(&[Field::pointer("/id")], &[Field::pointer("/topic")]),
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
    fn intercom_vector_verifies() {
        // No official SDK verifies these: the digest is `openssl dgst -hmac` over the body,
        // confirmed with Python's hmac module (two independent implementations).
        assert_vector(
            &super::scheme(),
            "intercom-client-secret",
            "",
            &[("X-Hub-Signature", "sha1=6472b816579902aa4b38176647c4234707ea3b41")],
            br#"{"type":"notification_event","id":"notif_ccd8a4d0","topic":"conversation.user.created"}"#,
            0,
        );
    }
}

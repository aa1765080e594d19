//! Jira (Cloud admin webhooks with a secret, Data Center): `X-Hub-Signature: sha256=<hex\n//! HMAC-SHA256(secret, body)>`; no timestamp. Event id `X-Atlassian-Webhook-Identifier`;\n//! type: body `webhookEvent`.

use crate::family::template::Template;
use crate::providers::{fields, Options};
use crate::{Algorithm, DigestEncoding, Field, Scheme};

/// The jira scheme.
#[must_use]
pub fn scheme() -> Template {
    Template::body_only(
        "jira",
        "X-Hub-Signature",
        Some("sha256="),
        DigestEncoding::Hex,
        Algorithm::Sha256,
        fields(
            &[Field::header("x-atlassian-webhook-identifier")],
            &[Field::pointer("/webhookEvent")],
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
    fn jira_vector_verifies() {
        // No official SDK verifies these: the digest is `openssl dgst -hmac` over the body,
        // confirmed with Python's hmac module (two independent implementations).
        assert_vector(
            &super::scheme(),
            "jira-secret",
            "",
            &[("X-Hub-Signature", "sha256=06651b4af196c47f52eaba114c20edad04f4f253802486b7edc4c43a66a85d44")],
            br#"{"timestamp":1700000000000,"webhookEvent":"jira:issue_created","issue":{"id":"10002"}}"#,
            0,
        );
    }
}

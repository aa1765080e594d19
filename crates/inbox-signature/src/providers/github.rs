//! GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>`; no timestamp.
//! Event id `X-GitHub-Delivery` (kept on manual redelivery); type `X-GitHub-Event`.

use crate::family::template::Template;
use crate::providers::{fields, Options};
use crate::{Algorithm, DigestEncoding, Field, Scheme};

/// The GitHub scheme.
#[must_use]
pub fn scheme() -> Template {
    Template::body_only(
        "github",
        crate::header_names::GITHUB_SIGNATURE_256,
        Some("sha256="),
        DigestEncoding::Hex,
        Algorithm::Sha256,
        fields(
            &[Field::header("x-github-delivery")],
            &[Field::header("x-github-event")],
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
    fn github_documentation_vector_verifies() {
        // docs.github.com "Validating webhook deliveries", reproduced by
        // `@octokit/webhooks-methods` 6.0.0 `sign(secret, payload)`.
        assert_vector(
            &super::scheme(),
            "It's a Secret to Everybody",
            "",
            &[(
                "X-Hub-Signature-256",
                "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            )],
            b"Hello, World!",
            0,
        );
    }
}

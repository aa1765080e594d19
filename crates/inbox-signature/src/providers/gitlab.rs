//! GitLab: a static token, `X-Gitlab-Token: <the webhook's secret token>`, compared in
//! constant time (as hashes, so the presented length does not show either). No signature over
//! the body, no timestamp: use HTTPS. Event id `Idempotency-Key` (the same across retries),
//! else `X-Gitlab-Event-UUID`; type `X-Gitlab-Event`.

use crate::family::credential_header::CredentialHeader;
use crate::providers::{fields, Options};
use crate::{Field, Scheme};

/// GitLab's token header.
pub const HEADER: &str = "x-gitlab-token";

/// The GitLab scheme.
#[must_use]
pub fn scheme() -> CredentialHeader {
    CredentialHeader {
        name: "gitlab",
        header: HEADER,
        read: |value| Some(value.to_owned()),
        write: |token| String::from_utf8_lossy(token).into_owned(),
        check_secret: |_| Ok(()),
        profile: fields(
            &[
                Field::header("idempotency-key"),
                Field::header("x-gitlab-event-uuid"),
            ],
            &[Field::header("x-gitlab-event")],
        ),
    }
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
    use super::*;
    use crate::providers::testing::verify;
    use crate::{Verified, VerifyError};

    #[test]
    fn the_token_must_match_exactly() {
        // A token check has no published vector: the header carries the secret itself.
        let ok = verify(
            &scheme(),
            "glpat-hook-secret",
            "",
            &[("X-Gitlab-Token", "glpat-hook-secret")],
            b"{}",
            0,
        );
        assert_eq!(
            ok,
            Ok(Verified {
                key_index: 0,
                timestamp: None
            })
        );
        for wrong in [
            "glpat-hook-secre",
            "glpat-hook-secret ",
            "GLPAT-HOOK-SECRET",
            "",
        ] {
            assert_eq!(
                verify(
                    &scheme(),
                    "glpat-hook-secret",
                    "",
                    &[("X-Gitlab-Token", wrong)],
                    b"{}",
                    0
                ),
                Err(VerifyError::NoMatch),
                "{wrong:?}"
            );
        }
        assert_eq!(
            verify(&scheme(), "glpat-hook-secret", "", &[], b"{}", 0),
            Err(VerifyError::MissingHeader(HEADER.into()))
        );
    }
}

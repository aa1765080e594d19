//! Razorpay: `X-Razorpay-Signature: <hex HMAC-SHA256(webhook secret, body)>`; no timestamp.
//! Event id `x-razorpay-event-id`; type: body `event`.

use crate::family::template::Template;
use crate::providers::{fields, Options};
use crate::{Algorithm, DigestEncoding, Field, Scheme};

/// The Razorpay scheme.
#[must_use]
pub fn scheme() -> Template {
    Template::body_only(
        "razorpay",
        "x-razorpay-signature",
        None,
        DigestEncoding::Hex,
        Algorithm::Sha256,
        fields(
            &[Field::header("x-razorpay-event-id")],
            &[Field::pointer("/event")],
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
    fn razorpay_sdk_accepts_this_vector() {
        // Accepted by `validateWebhookSignature(body, signature, "rzp_webhook_secret")` of the
        // official SDK, npm `razorpay` 2.9.8 (dist/utils/razorpay-utils.js).
        assert_vector(
            &super::scheme(),
            "rzp_webhook_secret",
            "",
            &[(
                "X-Razorpay-Signature",
                "83d59cbdabc5ebdc88c614dba118c6fa62dba3a7415f4bde0b1879198e8ea9d5",
            )],
            br#"{"entity":"event","event":"payment.captured","payload":{}}"#,
            0,
        );
    }
}

//! Slack: `X-Slack-Signature: v0=<hex>` and `X-Slack-Request-Timestamp`, HMAC-SHA256 over
//! `"v0:{timestamp}:{body}"`, 5 minutes of tolerance. Events API bodies carry `event_id`;
//! slash commands and interactivity are form-encoded (the receiver reads their id field).
//! Handshake: the signed `{"type":"url_verification","challenge":...}`, answered with the
//! challenge.

use crate::family::template::Template;
use crate::header_names::{SLACK_REQUEST_TIMESTAMP, SLACK_SIGNATURE};
use crate::providers::{fields, template_scheme, tolerance_or, Options};
use crate::time::TimestampFormat;
use crate::{
    Algorithm, DigestEncoding, Field, HandshakeKind, HandshakeReply, Request, Scheme, SigningKey,
    VerifyError, DEFAULT_TOLERANCE,
};

/// The Slack scheme.
#[derive(Debug, Clone)]
pub struct Slack(pub Template);

/// The Slack scheme with this tolerance.
#[must_use]
pub fn scheme(tolerance: std::time::Duration) -> Slack {
    let profile = fields(
        &[Field::pointer("/event_id")],
        &[Field::pointer("/event/type")],
    )
    .with_handshake(HandshakeKind::SignedPost);
    Slack(
        Template::body_only(
            "slack",
            SLACK_SIGNATURE,
            Some("v0="),
            DigestEncoding::Hex,
            Algorithm::Sha256,
            profile,
        )
        .timestamped(
            SLACK_REQUEST_TIMESTAMP,
            TimestampFormat::UnixSeconds,
            tolerance,
        )
        .signing("v0:{timestamp}:{body}"),
    )
}

/// Builds the scheme (`tolerance` is the only option).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(options: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(scheme(tolerance_or(options, DEFAULT_TOLERANCE))))
}

template_scheme!(Slack {
    fn handshake(
        &self,
        request: &Request<'_>,
        _key: Option<&SigningKey>,
    ) -> Option<Result<HandshakeReply, VerifyError>> {
        let json: serde_json::Value = serde_json::from_slice(request.body).ok()?;
        if json.get("type").and_then(serde_json::Value::as_str) != Some("url_verification") {
            return None;
        }
        let Some(challenge) = json.get("challenge").and_then(serde_json::Value::as_str) else {
            return Some(Err(VerifyError::MalformedBody("url_verification without challenge")));
        };
        Some(Ok(HandshakeReply::ok(
            "application/json",
            serde_json::json!({ "challenge": challenge }).to_string().into_bytes(),
        )))
    }
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::assert_vector;

    /// The example of api.slack.com/authentication/verifying-requests-from-slack.
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";

    #[test]
    fn slack_documentation_vector_verifies() {
        let verified = assert_vector(
            &scheme(DEFAULT_TOLERANCE),
            SECRET,
            "",
            &[
                ("X-Slack-Request-Timestamp", "1531420618"),
                (
                    "X-Slack-Signature",
                    "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
                ),
            ],
            BODY,
            1_531_420_618,
        );
        assert_eq!(verified.timestamp, Some(1_531_420_618));
    }

    #[test]
    fn url_verification_is_answered_with_its_challenge() {
        let headers: [(&str, &str); 0] = [];
        let body = br#"{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
        let reply = scheme(DEFAULT_TOLERANCE)
            .handshake(&Request::post(&headers, body), None)
            .expect("a handshake")
            .expect("answered");
        assert_eq!(
            reply.body,
            br#"{"challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}"#
        );
        let event = br#"{"type":"event_callback","event_id":"Ev1"}"#;
        assert!(scheme(DEFAULT_TOLERANCE)
            .handshake(&Request::post(&headers, event), None)
            .is_none());
    }
}

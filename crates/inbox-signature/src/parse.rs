//! Parsers for the signature headers of each scheme.
//!
//! They are public so fuzz targets can call them directly. Each one turns a header value into
//! the decoded digests it carries, and never panics, whatever the input. A digest that decodes
//! but has the wrong length is kept: it simply never matches, which the constant-time comparison
//! handles without a special case.

use base64::alphabet;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;

use crate::header_names::{
    GITHUB_SIGNATURE_256, SHOPIFY_HMAC_SHA256, SLACK_SIGNATURE, STRIPE_SIGNATURE, WEBHOOK_SIGNATURE,
};
use crate::VerifyError;

/// Standard base64 for secrets: Standard Webhooks secrets circulate both padded and unpadded.
pub(crate) const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Standard base64 for digests, padding required: every provider pads, their reference
/// libraries compare the encoded text, and so a digest cut short by even its `=` must not pass.
pub(crate) const DIGEST_BASE64: GeneralPurpose = STANDARD;

/// A parsed header of the Stripe shape (Stripe, Calendly, Paddle): its timestamp and every
/// digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeSignatureHeader {
    /// The `t=` value, in unix seconds.
    pub timestamp: i64,
    /// The decoded `v1=` digests, in header order. Values that are not hex are left out, since
    /// they could never match.
    pub signatures: Vec<Vec<u8>>,
}

/// Parses a unix timestamp in seconds: ASCII digits only (surrounding whitespace tolerated),
/// within `i64`. Signs are refused because no provider sends them, and accepting `+` would let
/// two different strings stand for one signed value.
#[must_use]
pub fn parse_timestamp(value: &str) -> Option<i64> {
    let digits = value.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Parses `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]`.
///
/// Other schemes such as `v0` and items without `=` are ignored, as Stripe's libraries do.
/// A header without `t`, with more than one `t`, with a non-numeric `t`, or without any `v1` is
/// malformed. Whitespace around items, keys and values is tolerated.
pub fn parse_stripe_header(value: &str) -> Result<StripeSignatureHeader, VerifyError> {
    parse_timestamped_list(value, STRIPE_SIGNATURE, ',', "t", "v1")
}

/// Parses a header of the Stripe shape under other names: items separated by `separator`,
/// one `time_key=<unix>` and one or more `digest_key=<hex>` (Calendly: `,`, `t`, `v1`; Paddle:
/// `;`, `ts`, `h1`). `header` names the header in errors.
pub fn parse_timestamped_list(
    value: &str,
    header: &str,
    separator: char,
    time_key: &str,
    digest_key: &str,
) -> Result<StripeSignatureHeader, VerifyError> {
    let malformed = || VerifyError::MalformedHeader(header.to_owned());
    let mut timestamp = None;
    let mut signatures = Vec::new();
    let mut saw_digest = false;
    for item in value.split(separator) {
        let Some((key, item_value)) = item.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key == time_key {
            // Two timestamps would leave it to the parser which one is checked against the
            // tolerance and which one was signed; refuse rather than pick.
            if timestamp.is_some() {
                return Err(malformed());
            }
            timestamp = Some(parse_timestamp(item_value).ok_or_else(malformed)?);
        } else if key == digest_key {
            saw_digest = true;
            if let Ok(digest) = hex::decode(item_value.trim()) {
                signatures.push(digest);
            }
        }
    }
    match timestamp {
        Some(timestamp) if saw_digest => Ok(StripeSignatureHeader {
            timestamp,
            signatures,
        }),
        _ => Err(malformed()),
    }
}

/// Parses a Standard Webhooks signature list: space-separated `v1,<base64>` entries.
///
/// Entries of other versions (such as the asymmetric `v1a`) are ignored, and `v1` entries that
/// are not base64 are left out: neither can ever match, which verification reports as
/// [`VerifyError::NoMatch`]. Only an empty or all-whitespace value is malformed.
pub fn parse_standard_signatures(value: &str) -> Result<Vec<Vec<u8>>, VerifyError> {
    if value.trim().is_empty() {
        return Err(VerifyError::MalformedHeader(WEBHOOK_SIGNATURE.to_owned()));
    }
    Ok(value
        .split_ascii_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(|encoded| DIGEST_BASE64.decode(encoded).ok())
        .collect())
}

/// Parses GitHub's `X-Hub-Signature-256: sha256=<hex>`.
pub fn parse_github_header(value: &str) -> Result<Vec<u8>, VerifyError> {
    prefixed_hex(value, "sha256=")
        .ok_or_else(|| VerifyError::MalformedHeader(GITHUB_SIGNATURE_256.to_owned()))
}

/// Parses Slack's `X-Slack-Signature: v0=<hex>`.
pub fn parse_slack_signature(value: &str) -> Result<Vec<u8>, VerifyError> {
    prefixed_hex(value, "v0=")
        .ok_or_else(|| VerifyError::MalformedHeader(SLACK_SIGNATURE.to_owned()))
}

/// Parses Shopify's `X-Shopify-Hmac-Sha256: <base64>`.
pub fn parse_shopify_header(value: &str) -> Result<Vec<u8>, VerifyError> {
    DIGEST_BASE64
        .decode(value.trim())
        .map_err(|_| VerifyError::MalformedHeader(SHOPIFY_HMAC_SHA256.to_owned()))
}

/// Parses the header of an HMAC-template provider: the configured prefix, when there is one,
/// must be present; the rest is the digest in the configured encoding. `header` names the
/// header in the error.
pub fn parse_generic_signature(
    value: &str,
    header: &str,
    prefix: Option<&str>,
    encoding: DigestEncoding,
) -> Result<Vec<u8>, VerifyError> {
    let malformed = || VerifyError::MalformedHeader(header.to_owned());
    let value = value.trim();
    let encoded = match prefix {
        Some(prefix) => value.strip_prefix(prefix).ok_or_else(malformed)?,
        None => value,
    };
    encoding.decode(encoded).ok_or_else(malformed)
}

/// How a digest is written in a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestEncoding {
    /// Hexadecimal; either case is accepted, lowercase is written.
    Hex,
    /// Standard base64 with its `=` padding, which providers always send.
    Base64,
}

impl DigestEncoding {
    /// `digest` written in this encoding.
    #[must_use]
    pub fn encode(self, digest: &[u8]) -> String {
        match self {
            Self::Hex => hex::encode(digest),
            Self::Base64 => DIGEST_BASE64.encode(digest),
        }
    }

    /// The bytes of `text`, or `None` when it is not in this encoding.
    #[must_use]
    pub fn decode(self, text: &str) -> Option<Vec<u8>> {
        match self {
            Self::Hex => hex::decode(text).ok(),
            Self::Base64 => DIGEST_BASE64.decode(text).ok(),
        }
    }
}

fn prefixed_hex(value: &str, prefix: &str) -> Option<Vec<u8>> {
    hex::decode(value.trim().strip_prefix(prefix)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripe_malformed() -> Result<StripeSignatureHeader, VerifyError> {
        Err(VerifyError::MalformedHeader("stripe-signature".to_owned()))
    }

    #[test]
    fn timestamps_are_plain_decimal_digits() {
        assert_eq!(parse_timestamp("1614556800"), Some(1_614_556_800));
        assert_eq!(parse_timestamp(" 0 "), Some(0));
        assert_eq!(parse_timestamp("9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_timestamp("9223372036854775808"), None);
        assert_eq!(parse_timestamp("99999999999999999999999999"), None);
        assert_eq!(parse_timestamp("+1"), None);
        assert_eq!(parse_timestamp("-1"), None);
        assert_eq!(parse_timestamp(""), None);
        assert_eq!(parse_timestamp("  "), None);
        assert_eq!(parse_timestamp("12a"), None);
        assert_eq!(parse_timestamp("１２"), None);
        assert_eq!(parse_timestamp("1.5"), None);
    }

    #[test]
    fn stripe_header_keeps_every_v1_and_ignores_other_schemes() {
        let parsed = parse_stripe_header(" t=12 , v0=ff, v1=0a0b ,v1 = 0c ,junk, v1=zz")
            .expect("well-formed header");
        assert_eq!(
            parsed,
            StripeSignatureHeader {
                timestamp: 12,
                signatures: vec![vec![0x0a, 0x0b], vec![0x0c]],
            }
        );
    }

    #[test]
    fn stripe_header_without_t_or_v1_is_malformed() {
        assert_eq!(parse_stripe_header("v1=00"), stripe_malformed());
        assert_eq!(parse_stripe_header("t=1"), stripe_malformed());
        assert_eq!(parse_stripe_header("t=1,v0=00"), stripe_malformed());
        assert_eq!(parse_stripe_header(""), stripe_malformed());
        assert_eq!(parse_stripe_header(",,,"), stripe_malformed());
    }

    #[test]
    fn stripe_header_with_bad_or_repeated_t_is_malformed() {
        assert_eq!(parse_stripe_header("t=,v1=00"), stripe_malformed());
        assert_eq!(parse_stripe_header("t=abc,v1=00"), stripe_malformed());
        assert_eq!(parse_stripe_header("t=-5,v1=00"), stripe_malformed());
        assert_eq!(parse_stripe_header("t=1,t=1,v1=00"), stripe_malformed());
        assert_eq!(
            parse_stripe_header("t=99999999999999999999,v1=00"),
            stripe_malformed()
        );
    }

    #[test]
    fn stripe_v1_that_is_not_hex_is_dropped_but_counts_as_present() {
        let parsed = parse_stripe_header("t=1,v1=not-hex").expect("t and v1 are present");
        assert_eq!(parsed.signatures, Vec::<Vec<u8>>::new());
    }

    #[test]
    fn standard_signatures_keep_decodable_v1_entries_only() {
        let parsed =
            parse_standard_signatures("v1,AAE= v1a,AAE= v2,AAE=  v1,AAI= v1,AAM v1,@@ v1, x")
                .expect("non-empty header");
        assert_eq!(parsed, vec![vec![0, 1], vec![0, 2], vec![]]);
    }

    #[test]
    fn empty_standard_signature_header_is_malformed() {
        let malformed = Err(VerifyError::MalformedHeader("webhook-signature".to_owned()));
        assert_eq!(parse_standard_signatures(""), malformed);
        assert_eq!(parse_standard_signatures(" \t "), malformed);
    }

    #[test]
    fn github_and_slack_need_their_prefix_and_hex() {
        assert_eq!(parse_github_header("sha256=00ff"), Ok(vec![0, 255]));
        assert_eq!(parse_github_header(" sha256=00FF "), Ok(vec![0, 255]));
        let github_malformed = Err(VerifyError::MalformedHeader("x-hub-signature-256".into()));
        assert_eq!(parse_github_header("sha1=00ff"), github_malformed);
        assert_eq!(parse_github_header("00ff"), github_malformed);
        assert_eq!(parse_github_header("sha256=0"), github_malformed);
        assert_eq!(parse_github_header("sha256=zz"), github_malformed);

        assert_eq!(parse_slack_signature("v0=0102"), Ok(vec![1, 2]));
        let slack_malformed = Err(VerifyError::MalformedHeader("x-slack-signature".into()));
        assert_eq!(parse_slack_signature("v1=0102"), slack_malformed);
        assert_eq!(parse_slack_signature("v0=é"), slack_malformed);
    }

    #[test]
    fn shopify_needs_padded_base64() {
        assert_eq!(parse_shopify_header(" AAE= "), Ok(vec![0, 1]));
        let malformed = Err(VerifyError::MalformedHeader("x-shopify-hmac-sha256".into()));
        assert_eq!(parse_shopify_header("AAE"), malformed);
        assert_eq!(parse_shopify_header("not base64!"), malformed);
    }

    #[test]
    fn generic_signature_honours_prefix_and_encoding() {
        let parse = |value, prefix, encoding| {
            parse_generic_signature(value, "X-Signature", prefix, encoding)
        };
        let malformed = Err(VerifyError::MalformedHeader("X-Signature".into()));
        let hex = DigestEncoding::Hex;
        assert_eq!(parse("sha256=0a", Some("sha256="), hex), Ok(vec![10]));
        assert_eq!(parse("0a", Some("sha256="), hex), malformed);
        assert_eq!(parse("sha256=AAE=", Some("sha256="), hex), malformed);

        let base64 = DigestEncoding::Base64;
        assert_eq!(parse("AAE=", None, base64), Ok(vec![0, 1]));
        assert_eq!(parse("AAE", None, base64), malformed);
        assert_eq!(parse("sha256=AAE=", None, base64), malformed);
    }
}

//! The schemes themselves: which bytes each provider signs, where the signature travels, how a
//! configured secret becomes a key, and the verify and sign operations built on that.

use std::time::Duration;

use base64::Engine as _;
use subtle::ConstantTimeEq;

use crate::header_names::{
    GITHUB_SIGNATURE_256, SHOPIFY_HMAC_SHA256, SLACK_REQUEST_TIMESTAMP, SLACK_SIGNATURE,
    STRIPE_SIGNATURE, SVIX_ID, SVIX_SIGNATURE, SVIX_TIMESTAMP, WEBHOOK_ID, WEBHOOK_SIGNATURE,
    WEBHOOK_TIMESTAMP,
};
use crate::parse::{
    parse_generic_signature, parse_github_header, parse_shopify_header, parse_slack_signature,
    parse_standard_signatures, parse_stripe_header, parse_timestamp, DIGEST_BASE64, SECRET_BASE64,
};
use crate::{HeaderSource, KeyError, SigningKey, VerifyError};

/// Default tolerance of the timestamped schemes, in both directions: 300 s, as in the
/// providers' reference libraries.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// Secrets of Standard Webhooks carry this prefix in front of the base64 key.
const STANDARD_SECRET_PREFIX: &str = "whsec_";

/// A signature scheme plus its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    /// Stripe: `Stripe-Signature: t=<unix>,v1=<hex>`, over `"{t}.{body}"`.
    ///
    /// Stripe's own library only rejects old timestamps; this one also rejects timestamps more
    /// than `tolerance` in the future, so a captured request cannot be replayed later.
    Stripe {
        /// How far the timestamp may be from now, in both directions.
        tolerance: Duration,
    },
    /// GitHub: `X-Hub-Signature-256: sha256=<hex>`, over the body. No timestamp.
    Github,
    /// Standard Webhooks (Svix and others): `webhook-id`, `webhook-timestamp` and
    /// `webhook-signature: v1,<base64> ...`, over `"{id}.{timestamp}.{body}"`. The `svix-*`
    /// headers are used when no `webhook-*` header is present.
    StandardWebhooks {
        /// How far the timestamp may be from now, in both directions.
        tolerance: Duration,
    },
    /// Shopify: `X-Shopify-Hmac-Sha256: <base64>`, over the body. No timestamp.
    Shopify,
    /// Slack: `X-Slack-Signature: v0=<hex>` and `X-Slack-Request-Timestamp`, over
    /// `"v0:{timestamp}:{body}"`.
    Slack {
        /// How far the timestamp may be from now, in both directions.
        tolerance: Duration,
    },
    /// A provider that sends HMAC-SHA256 of the body in one header of its choosing.
    HmacSha256(GenericHmac),
}

/// Parameters of the generic `hmac-sha256` scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenericHmac {
    /// The header carrying the digest.
    pub header: String,
    /// How the digest is written in the header.
    pub encoding: DigestEncoding,
    /// Text in front of the digest, such as `sha256=`. When set, it is required.
    pub prefix: Option<String>,
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
    fn encode(self, digest: &[u8]) -> String {
        match self {
            Self::Hex => hex::encode(digest),
            Self::Base64 => DIGEST_BASE64.encode(digest),
        }
    }

    pub(crate) fn decode(self, text: &str) -> Option<Vec<u8>> {
        match self {
            Self::Hex => hex::decode(text).ok(),
            Self::Base64 => DIGEST_BASE64.decode(text).ok(),
        }
    }
}

/// A successful verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// Index in the `keys` slice of the first key that matched, so the caller can tell whether
    /// an old secret is still in use during a rotation.
    pub key_index: usize,
    /// The signed timestamp (unix seconds) for the timestamped schemes, `None` otherwise.
    pub timestamp: Option<i64>,
}

/// The three header names of one Standard Webhooks spelling.
struct StandardHeaders {
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
}

const WEBHOOK_HEADERS: StandardHeaders = StandardHeaders {
    id: WEBHOOK_ID,
    timestamp: WEBHOOK_TIMESTAMP,
    signature: WEBHOOK_SIGNATURE,
};

const SVIX_HEADERS: StandardHeaders = StandardHeaders {
    id: SVIX_ID,
    timestamp: SVIX_TIMESTAMP,
    signature: SVIX_SIGNATURE,
};

impl Scheme {
    /// Stripe with [`DEFAULT_TOLERANCE`].
    #[must_use]
    pub const fn stripe() -> Self {
        Self::Stripe {
            tolerance: DEFAULT_TOLERANCE,
        }
    }

    /// GitHub.
    #[must_use]
    pub const fn github() -> Self {
        Self::Github
    }

    /// Standard Webhooks with [`DEFAULT_TOLERANCE`].
    #[must_use]
    pub const fn standard_webhooks() -> Self {
        Self::StandardWebhooks {
            tolerance: DEFAULT_TOLERANCE,
        }
    }

    /// Shopify.
    #[must_use]
    pub const fn shopify() -> Self {
        Self::Shopify
    }

    /// Slack with [`DEFAULT_TOLERANCE`].
    #[must_use]
    pub const fn slack() -> Self {
        Self::Slack {
            tolerance: DEFAULT_TOLERANCE,
        }
    }

    /// The scheme's name as written in the configuration file (kebab-case).
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Stripe { .. } => "stripe",
            Self::Github => "github",
            Self::StandardWebhooks { .. } => "standard-webhooks",
            Self::Shopify => "shopify",
            Self::Slack { .. } => "slack",
            Self::HmacSha256(_) => "hmac-sha256",
        }
    }

    /// The timestamp tolerance, for the schemes that sign a timestamp.
    #[must_use]
    pub const fn tolerance(&self) -> Option<Duration> {
        match self {
            Self::Stripe { tolerance }
            | Self::StandardWebhooks { tolerance }
            | Self::Slack { tolerance } => Some(*tolerance),
            Self::Github | Self::Shopify | Self::HmacSha256(_) => None,
        }
    }

    /// Turns a configured secret string into the key bytes.
    ///
    /// Standard Webhooks strips `whsec_` and base64-decodes the rest (padded or not). Every other
    /// scheme uses the string's bytes as they are; in particular Stripe keeps its `whsec_`
    /// prefix, which is part of its key. Secrets read from files should be trimmed by the caller:
    /// a trailing newline would otherwise become part of the key.
    ///
    /// # Errors
    /// [`KeyError::Empty`] for an empty secret (or one that decodes to nothing),
    /// [`KeyError::NotBase64`] for a Standard Webhooks secret that is not base64.
    pub fn key_from_secret(&self, secret: &str) -> Result<SigningKey, KeyError> {
        match self {
            Self::StandardWebhooks { .. } => {
                let encoded = secret
                    .strip_prefix(STANDARD_SECRET_PREFIX)
                    .unwrap_or(secret);
                if encoded.is_empty() {
                    return Err(KeyError::Empty);
                }
                let bytes = SECRET_BASE64
                    .decode(encoded)
                    .map_err(|_| KeyError::NotBase64)?;
                SigningKey::from_bytes(&bytes)
            }
            Self::Stripe { .. }
            | Self::Github
            | Self::Shopify
            | Self::Slack { .. }
            | Self::HmacSha256(_) => SigningKey::from_bytes(secret.as_bytes()),
        }
    }

    /// Verifies a request.
    ///
    /// `keys` are tried in order (rotation); the index of the first key that matched is
    /// returned. `now_unix` is the current unix time in seconds, injected so tests are
    /// deterministic. With no keys, a well-formed request fails with [`VerifyError::NoMatch`].
    ///
    /// Headers are parsed first, then the signature is checked, and only then the timestamp, so
    /// that a stale or future timestamp is reported only for a request that is otherwise
    /// authentic: that tells an operator about clock skew or a replay, not about a forgery.
    ///
    /// # Errors
    /// [`VerifyError::MissingHeader`] or [`VerifyError::MalformedHeader`] naming the header at
    /// fault, [`VerifyError::NoMatch`] when no key produced any of the signatures, and
    /// [`VerifyError::StaleTimestamp`] or [`VerifyError::FutureTimestamp`] for an authentic
    /// request signed outside the tolerance.
    pub fn verify(
        &self,
        headers: &dyn HeaderSource,
        body: &[u8],
        keys: &[SigningKey],
        now_unix: i64,
    ) -> Result<Verified, VerifyError> {
        match self {
            Self::Stripe { tolerance } => {
                let parsed = parse_stripe_header(required(headers, STRIPE_SIGNATURE)?)?;
                let timestamp = parsed.timestamp.to_string();
                let key_index = first_match(
                    keys,
                    &[timestamp.as_bytes(), b".", body],
                    &parsed.signatures,
                )?;
                check_tolerance(parsed.timestamp, now_unix, *tolerance)?;
                Ok(Verified {
                    key_index,
                    timestamp: Some(parsed.timestamp),
                })
            }
            Self::Github => {
                let signature = parse_github_header(required(headers, GITHUB_SIGNATURE_256)?)?;
                Ok(untimed(first_match(keys, &[body], &[signature])?))
            }
            Self::StandardWebhooks { tolerance } => {
                let names = standard_headers_in(headers);
                let signatures = required(headers, names.signature)?;
                let id = required(headers, names.id)?;
                let raw_timestamp = required(headers, names.timestamp)?;
                let timestamp = parse_timestamp(raw_timestamp)
                    .ok_or_else(|| VerifyError::MalformedHeader(names.timestamp.to_owned()))?;
                // The parser names the `webhook-*` header; name the one actually read.
                let signatures = parse_standard_signatures(signatures)
                    .map_err(|_| VerifyError::MalformedHeader(names.signature.to_owned()))?;
                let timestamp_text = timestamp.to_string();
                let key_index = first_match(
                    keys,
                    &[id.as_bytes(), b".", timestamp_text.as_bytes(), b".", body],
                    &signatures,
                )?;
                check_tolerance(timestamp, now_unix, *tolerance)?;
                Ok(Verified {
                    key_index,
                    timestamp: Some(timestamp),
                })
            }
            Self::Shopify => {
                let signature = parse_shopify_header(required(headers, SHOPIFY_HMAC_SHA256)?)?;
                Ok(untimed(first_match(keys, &[body], &[signature])?))
            }
            Self::Slack { tolerance } => {
                let signature = parse_slack_signature(required(headers, SLACK_SIGNATURE)?)?;
                let timestamp = parse_timestamp(required(headers, SLACK_REQUEST_TIMESTAMP)?)
                    .ok_or_else(|| {
                        VerifyError::MalformedHeader(SLACK_REQUEST_TIMESTAMP.to_owned())
                    })?;
                let timestamp_text = timestamp.to_string();
                let key_index = first_match(
                    keys,
                    &[b"v0:", timestamp_text.as_bytes(), b":", body],
                    &[signature],
                )?;
                check_tolerance(timestamp, now_unix, *tolerance)?;
                Ok(Verified {
                    key_index,
                    timestamp: Some(timestamp),
                })
            }
            Self::HmacSha256(config) => {
                let signature =
                    parse_generic_signature(required(headers, &config.header)?, config)?;
                Ok(untimed(first_match(keys, &[body], &[signature])?))
            }
        }
    }

    /// The header(s) a provider would send for this body, for tests, the simulator and the
    /// benchmarks. `id` is only used by Standard Webhooks (`webhook-id`); `timestamp` only by
    /// the timestamped schemes. Header names are lowercase.
    #[must_use]
    pub fn sign(
        &self,
        key: &SigningKey,
        body: &[u8],
        id: &str,
        timestamp: i64,
    ) -> Vec<(String, String)> {
        let timestamp_text = timestamp.to_string();
        match self {
            Self::Stripe { .. } => {
                let digest = key.digest(&[timestamp_text.as_bytes(), b".", body]);
                vec![(
                    STRIPE_SIGNATURE.to_owned(),
                    format!("t={timestamp_text},v1={}", hex::encode(digest)),
                )]
            }
            Self::Github => vec![(
                GITHUB_SIGNATURE_256.to_owned(),
                format!("sha256={}", hex::encode(key.digest(&[body]))),
            )],
            Self::StandardWebhooks { .. } => {
                let digest =
                    key.digest(&[id.as_bytes(), b".", timestamp_text.as_bytes(), b".", body]);
                vec![
                    (WEBHOOK_ID.to_owned(), id.to_owned()),
                    (WEBHOOK_TIMESTAMP.to_owned(), timestamp_text),
                    (
                        WEBHOOK_SIGNATURE.to_owned(),
                        format!("v1,{}", DIGEST_BASE64.encode(digest)),
                    ),
                ]
            }
            Self::Shopify => vec![(
                SHOPIFY_HMAC_SHA256.to_owned(),
                DIGEST_BASE64.encode(key.digest(&[body])),
            )],
            Self::Slack { .. } => {
                let digest = key.digest(&[b"v0:", timestamp_text.as_bytes(), b":", body]);
                vec![
                    (SLACK_REQUEST_TIMESTAMP.to_owned(), timestamp_text),
                    (
                        SLACK_SIGNATURE.to_owned(),
                        format!("v0={}", hex::encode(digest)),
                    ),
                ]
            }
            Self::HmacSha256(config) => {
                let encoded = config.encoding.encode(&key.digest(&[body]));
                let value = match &config.prefix {
                    Some(prefix) => format!("{prefix}{encoded}"),
                    None => encoded,
                };
                vec![(config.header.clone(), value)]
            }
        }
    }

    /// The header names that carry signature material for this scheme, so the receiver can
    /// reject a request that repeats one of them. For Standard Webhooks this includes the
    /// `svix-*` spellings.
    #[must_use]
    pub fn signature_headers(&self) -> Vec<&str> {
        match self {
            Self::Stripe { .. } => vec![STRIPE_SIGNATURE],
            Self::Github => vec![GITHUB_SIGNATURE_256],
            Self::StandardWebhooks { .. } => vec![
                WEBHOOK_ID,
                WEBHOOK_TIMESTAMP,
                WEBHOOK_SIGNATURE,
                SVIX_ID,
                SVIX_TIMESTAMP,
                SVIX_SIGNATURE,
            ],
            Self::Shopify => vec![SHOPIFY_HMAC_SHA256],
            Self::Slack { .. } => vec![SLACK_SIGNATURE, SLACK_REQUEST_TIMESTAMP],
            Self::HmacSha256(config) => vec![config.header.as_str()],
        }
    }
}

fn required<'h>(headers: &'h dyn HeaderSource, name: &str) -> Result<&'h str, VerifyError> {
    headers
        .header(name)
        .ok_or_else(|| VerifyError::MissingHeader(name.to_owned()))
}

/// Picks one spelling as a whole: mixing a `webhook-id` with a `svix-signature` is not something
/// a real sender does, so the missing half is reported instead of being borrowed from the other.
fn standard_headers_in(headers: &dyn HeaderSource) -> &'static StandardHeaders {
    let present = |names: &StandardHeaders| {
        [names.id, names.timestamp, names.signature]
            .iter()
            .any(|name| headers.header(name).is_some())
    };
    if !present(&WEBHOOK_HEADERS) && present(&SVIX_HEADERS) {
        &SVIX_HEADERS
    } else {
        &WEBHOOK_HEADERS
    }
}

/// Index of the first key whose MAC over `parts` equals one of `candidates`.
fn first_match(
    keys: &[SigningKey],
    parts: &[&[u8]],
    candidates: &[Vec<u8>],
) -> Result<usize, VerifyError> {
    keys.iter()
        .position(|key| {
            let expected = key.digest(parts);
            // Slices of different lengths compare unequal here instead of panicking, which is
            // what makes truncated or oversized digests harmless.
            candidates
                .iter()
                .any(|candidate| bool::from(expected.as_slice().ct_eq(candidate)))
        })
        .ok_or(VerifyError::NoMatch)
}

fn untimed(key_index: usize) -> Verified {
    Verified {
        key_index,
        timestamp: None,
    }
}

/// Accepts `timestamp` when it is at most `tolerance` away from `now`, either way. Saturating
/// arithmetic keeps extreme values (a forged `t=9223372036854775807`) from overflowing; they
/// end up far outside any tolerance instead.
fn check_tolerance(timestamp: i64, now: i64, tolerance: Duration) -> Result<(), VerifyError> {
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if now.saturating_sub(timestamp) > tolerance {
        Err(VerifyError::StaleTimestamp)
    } else if timestamp.saturating_sub(now) > tolerance {
        Err(VerifyError::FutureTimestamp)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOLERANCE: Duration = Duration::from_secs(300);

    #[test]
    fn timestamps_exactly_at_the_tolerance_are_accepted() {
        assert_eq!(check_tolerance(1_000, 1_300, TOLERANCE), Ok(()));
        assert_eq!(check_tolerance(1_600, 1_300, TOLERANCE), Ok(()));
        assert_eq!(check_tolerance(1_300, 1_300, TOLERANCE), Ok(()));
    }

    #[test]
    fn timestamps_one_second_beyond_the_tolerance_are_rejected() {
        assert_eq!(
            check_tolerance(999, 1_300, TOLERANCE),
            Err(VerifyError::StaleTimestamp)
        );
        assert_eq!(
            check_tolerance(1_601, 1_300, TOLERANCE),
            Err(VerifyError::FutureTimestamp)
        );
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        assert_eq!(
            check_tolerance(i64::MAX, 0, TOLERANCE),
            Err(VerifyError::FutureTimestamp)
        );
        assert_eq!(
            check_tolerance(i64::MIN, i64::MAX, TOLERANCE),
            Err(VerifyError::StaleTimestamp)
        );
        assert_eq!(
            check_tolerance(i64::MAX, i64::MIN, TOLERANCE),
            Err(VerifyError::FutureTimestamp)
        );
        assert_eq!(check_tolerance(0, 0, Duration::from_secs(u64::MAX)), Ok(()));
        assert_eq!(check_tolerance(i64::MAX, i64::MIN, Duration::MAX), Ok(()));
    }

    #[test]
    fn zero_tolerance_accepts_only_the_current_second() {
        assert_eq!(check_tolerance(5, 5, Duration::ZERO), Ok(()));
        assert_eq!(
            check_tolerance(4, 5, Duration::ZERO),
            Err(VerifyError::StaleTimestamp)
        );
        assert_eq!(
            check_tolerance(6, 5, Duration::ZERO),
            Err(VerifyError::FutureTimestamp)
        );
    }

    #[test]
    fn standard_webhooks_secret_is_base64_after_whsec() {
        let scheme = Scheme::standard_webhooks();
        // "AAE=" and "AAE" both decode to [0, 1]; the prefix is optional as in Svix's library.
        let padded = scheme.key_from_secret("whsec_AAE=").expect("valid secret");
        let unpadded = scheme.key_from_secret("whsec_AAE").expect("valid secret");
        let bare = scheme.key_from_secret("AAE=").expect("valid secret");
        let raw = SigningKey::from_bytes(&[0, 1]).expect("non-empty key");
        let reference = raw.digest(&[b"x"]);
        assert_eq!(padded.digest(&[b"x"]), reference);
        assert_eq!(unpadded.digest(&[b"x"]), reference);
        assert_eq!(bare.digest(&[b"x"]), reference);
    }

    #[test]
    fn bad_standard_webhooks_secrets_are_refused() {
        let scheme = Scheme::standard_webhooks();
        assert_eq!(scheme.key_from_secret("").err(), Some(KeyError::Empty));
        assert_eq!(
            scheme.key_from_secret("whsec_").err(),
            Some(KeyError::Empty)
        );
        assert_eq!(
            scheme.key_from_secret("whsec_not base64!").err(),
            Some(KeyError::NotBase64)
        );
        assert_eq!(
            scheme.key_from_secret("whsec_AAE=\n").err(),
            Some(KeyError::NotBase64)
        );
    }

    #[test]
    fn other_schemes_use_the_secret_bytes_as_they_are() {
        let raw = SigningKey::from_bytes(b"whsec_test_secret").expect("non-empty key");
        for scheme in [
            Scheme::stripe(),
            Scheme::github(),
            Scheme::shopify(),
            Scheme::slack(),
        ] {
            let key = scheme
                .key_from_secret("whsec_test_secret")
                .expect("valid secret");
            assert_eq!(
                key.digest(&[b"x"]),
                raw.digest(&[b"x"]),
                "{}",
                scheme.name()
            );
            assert_eq!(scheme.key_from_secret("").err(), Some(KeyError::Empty));
        }
    }

    #[test]
    fn names_are_the_configuration_spellings() {
        let generic = Scheme::HmacSha256(GenericHmac {
            header: "X-Signature".into(),
            encoding: DigestEncoding::Hex,
            prefix: None,
        });
        let names: Vec<_> = [
            Scheme::stripe(),
            Scheme::github(),
            Scheme::standard_webhooks(),
            Scheme::shopify(),
            Scheme::slack(),
            generic,
        ]
        .iter()
        .map(Scheme::name)
        .collect();
        assert_eq!(
            names,
            [
                "stripe",
                "github",
                "standard-webhooks",
                "shopify",
                "slack",
                "hmac-sha256"
            ]
        );
    }
}

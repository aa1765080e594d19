//! The bodies of the fuzz targets, on raw bytes.
//!
//! Shared by the libFuzzer binaries (`fuzz_targets/*.rs`, built by cargo-fuzz) and by the
//! stable regression test `crates/inbox-signature/tests/fuzz_regressions.rs`, which includes
//! this file and replays every input kept under `fuzz/regressions/<target>/` through the same
//! function: a crash input reproduces exactly, without libFuzzer or a nightly toolchain.
//!
//! Structured targets decode their bytes with [`Input`]: a length byte before each piece,
//! the last piece takes the rest. Text is the longest valid UTF-8 prefix of its piece.

use inbox_signature::family::asymmetric::{ed25519_key, p256_key};
use inbox_signature::family::credential::parse_basic_auth;
use inbox_signature::providers::{self, adyen, mailgun, paddle, standard_webhooks, twilio};
use inbox_signature::{
    parse_generic_signature, parse_github_header, parse_shopify_header, parse_signed,
    parse_slack_signature, parse_standard_signatures, parse_stripe_header, parse_timestamp,
    parse_timestamped_list, Algorithm, DigestEncoding, Outgoing, Request, Scheme, TimestampFormat,
    Verified,
};

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target, by name (the name of its binary and of its regressions folder).
pub const TARGETS: [(&str, Target); 19] = [
    ("parse_timestamp", parse_timestamp_target),
    ("parse_stripe_header", parse_stripe_header_target),
    (
        "parse_standard_signatures",
        parse_standard_signatures_target,
    ),
    ("parse_github_header", parse_github_header_target),
    ("parse_slack_signature", parse_slack_signature_target),
    ("parse_shopify_header", parse_shopify_header_target),
    ("parse_generic_signature", parse_generic_signature_target),
    ("parse_timestamped_list", parse_timestamped_list_target),
    ("parse_paddle_header", parse_paddle_header_target),
    ("parse_v1a_signatures", parse_v1a_signatures_target),
    ("parse_rfc3339_timestamp", parse_rfc3339_timestamp_target),
    ("parse_basic_auth", parse_basic_auth_target),
    ("parse_public_key", parse_public_key_target),
    ("parse_signed_template", parse_signed_template_target),
    ("parse_mailgun_body", parse_mailgun_body_target),
    ("parse_adyen_body", parse_adyen_body_target),
    ("twilio_request", twilio_request_target),
    ("handshake", handshake_target),
    ("verify", verify_target),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS
        .iter()
        .find(|(candidate, _)| *candidate == name)
        .map(|(_, run)| *run)
}

/// The longest valid UTF-8 prefix of `bytes`.
pub fn text(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(err) => std::str::from_utf8(&bytes[..err.valid_up_to()]).unwrap_or_default(),
    }
}

/// Reads a fuzz input as a sequence of pieces.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// Reads `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// One byte (0 once the input is used up).
    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((first, rest)) => {
                self.data = rest;
                *first
            }
            None => 0,
        }
    }

    /// A piece of up to 255 bytes, its length given by the byte before it.
    pub fn piece(&mut self) -> &'a [u8] {
        let length = usize::from(self.byte()).min(self.data.len());
        let (piece, rest) = self.data.split_at(length);
        self.data = rest;
        piece
    }

    /// A little-endian integer of the next 8 bytes (missing bytes are zeros).
    pub fn int(&mut self) -> i64 {
        let mut bytes = [0_u8; 8];
        for byte in &mut bytes {
            *byte = self.byte();
        }
        i64::from_le_bytes(bytes)
    }

    /// Everything left.
    pub fn rest(self) -> &'a [u8] {
        self.data
    }
}

/// `parse_timestamp` never panics, and accepts only non-negative values.
pub fn parse_timestamp_target(data: &[u8]) {
    if let Some(timestamp) = parse_timestamp(text(data)) {
        // Only plain digits are accepted, so the result can never be negative.
        assert!(timestamp >= 0);
    }
}

/// `parse_stripe_header` never panics, and never yields a negative timestamp.
pub fn parse_stripe_header_target(data: &[u8]) {
    if let Ok(parsed) = parse_stripe_header(text(data)) {
        assert!(parsed.timestamp >= 0);
    }
}

/// `parse_standard_signatures` never panics, and yields no more signatures than fit.
pub fn parse_standard_signatures_target(data: &[u8]) {
    let value = text(data);
    if let Ok(signatures) = parse_standard_signatures(value) {
        // Every entry came from at least "v1," plus its base64 text.
        assert!(signatures.len() <= value.len() / 3);
    }
}

/// `parse_github_header` never panics.
pub fn parse_github_header_target(data: &[u8]) {
    let _ = parse_github_header(text(data));
}

/// `parse_slack_signature` never panics.
pub fn parse_slack_signature_target(data: &[u8]) {
    let _ = parse_slack_signature(text(data));
}

/// `parse_shopify_header` never panics.
pub fn parse_shopify_header_target(data: &[u8]) {
    let _ = parse_shopify_header(text(data));
}

/// `parse_generic_signature` never panics, whatever the configuration and header value.
/// Input: flags byte (bit 0: hex, bit 1: a prefix), prefix piece, then the value.
pub fn parse_generic_signature_target(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.byte();
    let prefix = text(input.piece());
    let value = text(input.rest());
    let encoding = if flags & 1 == 1 {
        DigestEncoding::Hex
    } else {
        DigestEncoding::Base64
    };
    let prefix = (flags & 2 == 2).then_some(prefix);
    let _ = parse_generic_signature(value, "x-signature", prefix, encoding);
}

/// `parse_timestamped_list` (Calendly's `t=,v1=`) never panics; timestamps are never negative.
/// Input: separator byte, then the value.
pub fn parse_timestamped_list_target(data: &[u8]) {
    let mut input = Input::new(data);
    let separator = char::from(input.byte());
    let value = text(input.rest());
    if let Ok(parsed) = parse_timestamped_list(value, "h", separator, "t", "v1") {
        assert!(parsed.timestamp >= 0);
    }
}

/// `parse_paddle_header` never panics; timestamps are never negative.
pub fn parse_paddle_header_target(data: &[u8]) {
    if let Ok(parsed) = paddle::parse_paddle_header(text(data)) {
        assert!(parsed.timestamp >= 0);
    }
}

/// `parse_v1a_signatures` never panics, and yields no more signatures than fit.
pub fn parse_v1a_signatures_target(data: &[u8]) {
    let value = text(data);
    assert!(standard_webhooks::parse_v1a_signatures(value).len() <= value.len() / 4);
}

/// RFC 3339 timestamps (Twitch) never panic to parse, and what is written parses back.
pub fn parse_rfc3339_timestamp_target(data: &[u8]) {
    let _ = TimestampFormat::Rfc3339.parse(text(data));
    let seconds = Input::new(data).int().rem_euclid(253_402_300_799);
    let written = TimestampFormat::Rfc3339.format(seconds);
    assert_eq!(TimestampFormat::Rfc3339.parse(&written), Some(seconds));
}

/// `parse_basic_auth` never panics, and what it returns holds the `:` separator.
pub fn parse_basic_auth_target(data: &[u8]) {
    if let Some(credentials) = parse_basic_auth(text(data)) {
        assert!(credentials.contains(':'));
    }
}

/// Public and private key texts (hex, base64, PEM) never panic to parse.
pub fn parse_public_key_target(data: &[u8]) {
    let _ = ed25519_key(text(data));
    let _ = p256_key(text(data));
}

/// Signed-string descriptions of the `template` scheme never panic, and always hold the body.
pub fn parse_signed_template_target(data: &[u8]) {
    if let Ok(parts) = parse_signed(text(data)) {
        assert!(parts.contains(&inbox_signature::Part::Body));
    }
}

/// Mailgun's body parser never panics.
pub fn parse_mailgun_body_target(data: &[u8]) {
    let _ = mailgun::parse_mailgun_body(data);
}

/// Adyen's body parser never panics, and yields one entry per item.
pub fn parse_adyen_body_target(data: &[u8]) {
    if let Ok(items) = adyen::parse_adyen_body(data) {
        assert!(!items.is_empty());
    }
}

/// Twilio's URL spellings and parameter sorting never panic; the URL as received is first.
/// Input: URL piece, then the form body.
pub fn twilio_request_target(data: &[u8]) {
    let mut input = Input::new(data);
    let url = text(input.piece());
    let body = input.rest();
    let candidates = twilio::candidate_urls(url);
    assert!(!candidates.is_empty());
    let _ = twilio::sorted_params(body);
}

/// Every scheme's handshake check never panics on an arbitrary GET or POST.
/// Input: flags byte (bit 0: GET), URL piece, then the body.
pub fn handshake_target(data: &[u8]) {
    let mut input = Input::new(data);
    let method = if input.byte() & 1 == 1 { "GET" } else { "POST" };
    let url = text(input.piece());
    let body = input.rest();
    let headers: [(&str, &str); 1] = [(
        "twitch-eventsub-message-type",
        "webhook_callback_verification",
    )];
    for (scheme, secrets) in schemes() {
        let key = secrets
            .first()
            .and_then(|secret| scheme.key_from_secret(secret).ok());
        let request = Request {
            method,
            url,
            headers: &headers,
            body,
        };
        let _ = scheme.handshake(&request, key.as_ref());
    }
}

/// A secret (or private key) each scheme accepts and can sign with.
fn secrets_for(name: &str) -> Vec<&'static str> {
    match name {
        "standard-webhooks" => vec![
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=",
        ],
        "discord" | "discord-events" => vec![ED25519_PRIVATE],
        "sendgrid" => vec![P256_PRIVATE],
        "adyen" => vec!["DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00"],
        "postmark" => vec!["user:password"],
        _ => vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    }
}

/// RFC 8032 section 7.1 test 1's secret key, PKCS#8 PEM.
pub const ED25519_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJ1hsZ3v/VpguoRK9JLsLMREScVpezJpGXA7rAMcrn9g\n-----END PRIVATE KEY-----\n";
/// A P-256 test key (`openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`).
pub const P256_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQga7zR+NutwVfbD0B5\n1+Jh3Y1es9NUGsUnzeWQdHTTI2ahRANCAAT0bJYaJbgrlPSVLxOSuCNqTA1m/n++\nhZjulFPmW+ifVGEIpdf2+4GgTyjlArQViME6BFk87FS6Uj4ViBAAzuBp\n-----END PRIVATE KEY-----\n";

fn schemes() -> Vec<(std::sync::Arc<dyn Scheme>, Vec<&'static str>)> {
    let template = providers::TemplateOptions {
        signature_header: "x-signature".into(),
        signed: Some("{method} {url} {timestamp}.{id}.{body}".into()),
        algorithm: Algorithm::Sha512,
        encoding: DigestEncoding::Base64,
        prefix: Some("v1=".into()),
        timestamp_header: Some("x-timestamp".into()),
        timestamp_format: TimestampFormat::UnixSeconds,
        id_header: Some("x-id".into()),
        hex_key: false,
    };
    let generic = providers::TemplateOptions {
        signed: None,
        algorithm: Algorithm::Sha256,
        timestamp_header: None,
        id_header: None,
        ..template.clone()
    };
    providers::CATALOG
        .iter()
        .filter_map(|entry| {
            let options = providers::Options {
                template: match entry.name {
                    "template" => Some(template.clone()),
                    "hmac-sha256" => Some(generic.clone()),
                    _ => None,
                },
                ..providers::Options::default()
            };
            let scheme = providers::build(entry.name, &options).ok()?;
            Some((scheme, secrets_for(entry.name)))
        })
        .collect()
}

/// The URL signed requests go to, for the schemes that sign it.
const URL: &str = "https://hooks.example.com/webhooks/provider?x=1";

/// `Scheme::verify` of every scheme never panics; arbitrary header values never verify, and
/// what `sign` produces for the same body always does.
/// Input: count byte (values: count % 4), that many value pieces, body piece, clock (8 bytes),
/// then the message id.
pub fn verify_target(data: &[u8]) {
    let mut input = Input::new(data);
    let count = input.byte() % 4;
    let values: Vec<&str> = (0..count).map(|_| text(input.piece())).collect();
    let body = input.piece();
    let now = input.int();
    let id = text(input.rest());
    for (scheme, secrets) in schemes() {
        for secret in secrets {
            let Ok(key) = scheme.key_from_secret(secret) else {
                continue;
            };
            let keys = [key];
            let names = scheme.signature_headers();
            // Arbitrary values in the scheme's own headers: reaching the comparison is the
            // point. Schemes that sign inside the body see the arbitrary body instead.
            let headers: Vec<(String, String)> = names
                .iter()
                .zip(values.iter().cycle())
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect();
            let request = Request::post(&headers, body).at(URL);
            if !names.is_empty() {
                assert!(
                    scheme.verify(&request, &keys, now).is_err(),
                    "{}",
                    scheme.name()
                );
            } else {
                let _ = scheme.verify(&request, &keys, now);
            }
            round_trip(scheme.as_ref(), &keys, body, id, now);
        }
    }
}

/// What the scheme signs verifies, for clocks within the formats' range.
fn round_trip(
    scheme: &dyn Scheme,
    keys: &[inbox_signature::SigningKey],
    body: &[u8],
    id: &str,
    now: i64,
) {
    if !(0..100_000_000_000).contains(&now) {
        return;
    }
    // Linear's timestamp is in the body: one already there is what it is.
    if scheme.name() == "linear" && body.windows(16).any(|w| w == b"webhookTimestamp") {
        return;
    }
    let message = Outgoing {
        method: "POST",
        url: URL,
        body,
        id,
        timestamp: now,
    };
    let Ok(signed) = scheme.sign(&keys[0], &message) else {
        return; // bodies that cannot carry the signature (Adyen, Mailgun) or no id
    };
    let request = Request::post(&signed.headers, &signed.body).at(URL);
    let expected = Verified {
        key_index: 0,
        timestamp: scheme.tolerance().map(|_| now),
    };
    assert_eq!(
        scheme.verify(&request, keys, now),
        Ok(expected),
        "{}",
        scheme.name()
    );
}

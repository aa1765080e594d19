//! The bodies of the fuzz targets, on raw bytes.
//!
//! Shared by the libFuzzer binaries (`fuzz_targets/*.rs`, built by cargo-fuzz) and by the
//! stable regression test `crates/inbox-signature/tests/fuzz_regressions.rs`, which includes
//! this file and replays every input kept under `fuzz/regressions/<target>/` through the same
//! function: a crash input reproduces exactly, without libFuzzer or a nightly toolchain.
//!
//! Structured targets decode their bytes with [`Input`]: a length byte before each piece,
//! the last piece takes the rest. Text is the longest valid UTF-8 prefix of its piece.

use inbox_signature::{
    parse_generic_signature, parse_github_header, parse_shopify_header, parse_slack_signature,
    parse_standard_signatures, parse_stripe_header, parse_timestamp, DigestEncoding, GenericHmac,
    Scheme, Verified,
};

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target, by name (the name of its binary and of its regressions folder).
pub const TARGETS: [(&str, Target); 8] = [
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
    let config = GenericHmac {
        header: "x-signature".to_owned(),
        encoding: if flags & 1 == 1 {
            DigestEncoding::Hex
        } else {
            DigestEncoding::Base64
        },
        prefix: (flags & 2 == 2).then(|| prefix.to_owned()),
    };
    let _ = parse_generic_signature(value, &config);
}

fn schemes() -> Vec<Scheme> {
    vec![
        Scheme::stripe(),
        Scheme::github(),
        Scheme::standard_webhooks(),
        Scheme::shopify(),
        Scheme::slack(),
        Scheme::HmacSha256(GenericHmac {
            header: "x-signature".to_owned(),
            encoding: DigestEncoding::Hex,
            prefix: Some("sha256=".to_owned()),
        }),
        Scheme::HmacSha256(GenericHmac {
            header: "x-signature".to_owned(),
            encoding: DigestEncoding::Base64,
            prefix: None,
        }),
    ]
}

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
    for scheme in schemes() {
        let Ok(key) = scheme.key_from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") else {
            continue;
        };
        let keys = [key];

        // Arbitrary values in the scheme's own headers: reaching the MAC comparison is the point.
        let headers: Vec<(String, String)> = scheme
            .signature_headers()
            .into_iter()
            .zip(values.iter().cycle())
            .map(|(name, value)| (name.to_owned(), (*value).to_owned()))
            .collect();
        assert!(scheme.verify(&headers, body, &keys, now).is_err());

        // What the scheme signs for this body verifies, whatever the body and id.
        if now >= 0 {
            let signed = scheme.sign(&keys[0], body, id, now);
            let expected = Verified {
                key_index: 0,
                timestamp: scheme.tolerance().map(|_| now),
            };
            assert_eq!(scheme.verify(&signed, body, &keys, now), Ok(expected));
        }
    }
}

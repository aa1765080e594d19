//! Fuzz target: `Scheme::verify` for every scheme, on arbitrary header values, body and clock.
//!
//! Besides "never panics", it checks two properties: garbage never verifies, and what `sign`
//! produces for the same body always does.
#![no_main]

use inbox_signature::{DigestEncoding, GenericHmac, Scheme, Verified};
use libfuzzer_sys::fuzz_target;

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

fuzz_target!(|input: (Vec<&str>, &[u8], i64, &str)| {
    let (values, body, now, id) = input;
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
});

//! Fuzz target: `parse_generic_signature` must never panic, whatever the header value.
#![no_main]

use inbox_signature::{parse_generic_signature, DigestEncoding, GenericHmac};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (bool, Option<&str>, &str)| {
    let (hex, prefix, value) = input;
    let config = GenericHmac {
        header: "x-signature".to_owned(),
        encoding: if hex {
            DigestEncoding::Hex
        } else {
            DigestEncoding::Base64
        },
        prefix: prefix.map(str::to_owned),
    };
    let _ = parse_generic_signature(value, &config);
});

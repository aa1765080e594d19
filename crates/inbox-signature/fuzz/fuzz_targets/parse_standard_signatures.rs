//! Fuzz target: `parse_standard_signatures` must never panic, whatever the header value.
#![no_main]

use inbox_signature::parse_standard_signatures;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|value: &str| {
    if let Ok(signatures) = parse_standard_signatures(value) {
        // Every entry came from at least "v1," plus its base64 text.
        assert!(signatures.len() <= value.len() / 3);
    }
});

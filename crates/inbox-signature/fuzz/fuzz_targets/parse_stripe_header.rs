//! Fuzz target: `parse_stripe_header` must never panic, whatever the header value.
#![no_main]

use inbox_signature::parse_stripe_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|value: &str| {
    if let Ok(parsed) = parse_stripe_header(value) {
        assert!(parsed.timestamp >= 0);
    }
});

//! Fuzz target: `parse_timestamp` must never panic, whatever the header value.
#![no_main]

use inbox_signature::parse_timestamp;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|value: &str| {
    if let Some(timestamp) = parse_timestamp(value) {
        // Only plain digits are accepted, so the result can never be negative.
        assert!(timestamp >= 0);
    }
});

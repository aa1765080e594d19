//! Fuzz target: `parse_slack_signature` must never panic, whatever the header value.
#![no_main]

use inbox_signature::parse_slack_signature;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|value: &str| {
    let _ = parse_slack_signature(value);
});

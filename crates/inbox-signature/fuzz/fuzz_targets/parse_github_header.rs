//! Fuzz target: `parse_github_header` must never panic, whatever the header value.
#![no_main]

use inbox_signature::parse_github_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|value: &str| {
    let _ = parse_github_header(value);
});

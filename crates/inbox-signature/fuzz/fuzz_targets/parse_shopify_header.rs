//! Fuzz target: `parse_shopify_header` must never panic, whatever the header value.
#![no_main]

use inbox_signature::parse_shopify_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|value: &str| {
    let _ = parse_shopify_header(value);
});

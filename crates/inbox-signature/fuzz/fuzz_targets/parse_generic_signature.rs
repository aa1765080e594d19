//! Fuzz target: `parse_generic_signature` never panics, whatever the configuration (hex or
//! base64, with or without a prefix) and the header value.
//! The body is shared with the stable regression test (see `src/targets.rs`).
#![no_main]

use inbox_signature_fuzz::targets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| targets::parse_generic_signature_target(data));

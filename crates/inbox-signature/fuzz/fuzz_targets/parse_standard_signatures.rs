//! Fuzz target: `parse_standard_signatures` never panics, whatever the header value.
//! The body is shared with the stable regression test (see `src/targets.rs`).
#![no_main]

use inbox_signature_fuzz::targets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| targets::parse_standard_signatures_target(data));

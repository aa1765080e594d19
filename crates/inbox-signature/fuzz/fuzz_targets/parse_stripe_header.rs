//! Fuzz target: `parse_stripe_header` never panics and never yields a negative timestamp.
//! The body is shared with the stable regression test (see `src/targets.rs`).
#![no_main]

use inbox_signature_fuzz::targets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| targets::parse_stripe_header_target(data));

//! Fuzz target: `Scheme::verify` of every scheme on arbitrary headers, body, clock and id:
//! never panics, garbage never verifies, what `sign` produces always does.
//! The body is shared with the stable regression test (see `src/targets.rs`).
#![no_main]

use inbox_signature_fuzz::targets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| targets::verify_target(data));

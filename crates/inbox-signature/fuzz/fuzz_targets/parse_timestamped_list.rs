//! Fuzz target: `parse_timestamped_list` never panics, whatever the bytes.
//! The body is shared with the stable regression test (see `src/targets.rs`).
#![no_main]

use inbox_signature_fuzz::targets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| targets::parse_timestamped_list_target(data));

//! Fuzz targets of `inbox-signature`: the header parsers and `Scheme::verify` must never
//! panic, whatever the bytes. The target bodies live in [`targets`], shared with the stable
//! regression test that replays `regressions/<target>/*`.
#![forbid(unsafe_code)]

pub mod targets;

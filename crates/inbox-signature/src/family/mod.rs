//! The building blocks of the three verification families, shared by the provider modules:
//! HMAC over a signed string ([`template`], [`timestamped_list`]), public-key signatures
//! ([`asymmetric`], [`signed_timestamp`]) and static credentials ([`credential`],
//! [`credential_header`]).

pub mod asymmetric;
pub mod credential;
pub mod credential_header;
pub mod signed_timestamp;
pub mod template;
pub mod timestamped_list;

use subtle::ConstantTimeEq;

use crate::{Algorithm, SigningKey, VerifyError};

/// Index of the first key whose HMAC over `parts` equals one of `candidates`, compared in
/// constant time. Slices of different lengths compare unequal instead of panicking, which is
/// what makes truncated or oversized digests harmless.
pub(crate) fn first_match(
    keys: &[SigningKey],
    algorithm: Algorithm,
    parts: &[&[u8]],
    candidates: &[Vec<u8>],
) -> Result<usize, VerifyError> {
    keys.iter()
        .position(|key| {
            let expected = key.hmac(algorithm, parts);
            !expected.is_empty()
                && candidates
                    .iter()
                    .any(|candidate| bool::from(expected.as_slice().ct_eq(candidate)))
        })
        .ok_or(VerifyError::NoMatch)
}

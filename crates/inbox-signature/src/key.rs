//! Keys: a configured secret, already turned into an HMAC-SHA256 key for its scheme.
//!
//! The key is kept as a keyed HMAC state rather than raw bytes: the two padded key blocks are
//! hashed once when the configuration is loaded, and each request only clones that state.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// One secret, already turned into the HMAC key for its scheme.
///
/// Built with [`Scheme::key_from_secret`](crate::Scheme::key_from_secret), which knows how each
/// provider derives the key from the secret string, or with [`SigningKey::from_bytes`]. `Debug`
/// prints `SigningKey([redacted])` and there is no `Display`, so a key cannot leak into logs.
#[derive(Clone)]
pub struct SigningKey {
    mac: HmacSha256,
}

impl SigningKey {
    /// A key made of exactly these bytes. Empty keys are refused: an empty secret is always a
    /// configuration mistake, and anyone could forge signatures with it.
    ///
    /// # Errors
    /// [`KeyError::Empty`](crate::KeyError::Empty) for no bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, crate::KeyError> {
        if bytes.is_empty() {
            return Err(crate::KeyError::Empty);
        }
        let mac = HmacSha256::new_from_slice(bytes).map_err(|_| crate::KeyError::Rejected)?;
        Ok(Self { mac })
    }

    /// HMAC-SHA256 of the concatenation of `parts`, fed piece by piece so that the body is never
    /// copied next to its prefix.
    pub(crate) fn digest(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = self.mac.clone();
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyError;

    #[test]
    fn debug_output_is_redacted() {
        let key = SigningKey::from_bytes(b"very secret").expect("non-empty key");
        assert_eq!(format!("{key:?}"), "SigningKey([redacted])");
        assert_eq!(format!("{key:#?}"), "SigningKey([redacted])");
    }

    #[test]
    fn empty_key_is_refused() {
        assert_eq!(SigningKey::from_bytes(b"").err(), Some(KeyError::Empty));
    }

    #[test]
    fn digest_of_parts_equals_digest_of_concatenation() {
        let key = SigningKey::from_bytes(b"test_secret").expect("non-empty key");
        assert_eq!(key.digest(&[b"a", b".", b"bc"]), key.digest(&[b"a.bc"]));
        assert_ne!(key.digest(&[b"a.bc"]), key.digest(&[b"a.bd"]));
    }

    #[test]
    fn keys_longer_than_a_block_work() {
        // HMAC hashes keys longer than the 64-byte block first; the library must handle it.
        let long = [7_u8; 200];
        let key = SigningKey::from_bytes(&long).expect("non-empty key");
        assert_ne!(key.digest(&[b"x"]), [0; 32]);
    }
}

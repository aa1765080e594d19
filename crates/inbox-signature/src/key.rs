//! Keys: a configured secret or public key, already in the form its scheme uses.
//!
//! HMAC keys are kept with a keyed HMAC-SHA256 state: the two padded key blocks are hashed once
//! when the configuration is loaded, and each request only clones that state. SHA-1 and
//! SHA-512 schemes are rarer and key their state per request. Asymmetric keys hold the public
//! half, and the private half only where one was given (tests, the simulator, the benchmark).

use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::{Digest as _, Sha256, Sha512};
use subtle::ConstantTimeEq;

use crate::KeyError;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// The hash function under an HMAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// HMAC-SHA1 (Twilio, Intercom): 20-byte digests.
    Sha1,
    /// HMAC-SHA256, what most providers use: 32-byte digests.
    Sha256,
    /// HMAC-SHA512: 64-byte digests.
    Sha512,
}

/// One verification (and, where possible, signing) key.
///
/// Built by a scheme's `key_from_secret`, which knows how each provider writes its secrets and
/// keys, or with the constructors here. `Debug` prints `SigningKey([redacted])` and there is no
/// `Display`, so a key cannot leak into logs.
#[derive(Clone)]
pub struct SigningKey {
    material: Material,
}

// Keys are few and live as long as the configuration: their size does not matter, and boxing
// would put a pointer chase in front of every HMAC.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Material {
    Hmac {
        bytes: Vec<u8>,
        sha256: HmacSha256,
    },
    Ed25519 {
        verifying: ed25519_dalek::VerifyingKey,
        signing: Option<ed25519_dalek::SigningKey>,
    },
    P256 {
        verifying: p256::ecdsa::VerifyingKey,
        signing: Option<p256::ecdsa::SigningKey>,
    },
    /// A static credential (token, Basic auth password): kept with its SHA-256, which is what
    /// is compared, so the comparison takes the same time whatever the presented length.
    Credential {
        secret: Vec<u8>,
        sha256: [u8; 32],
    },
}

impl SigningKey {
    /// An HMAC key made of exactly these bytes. Empty keys are refused: an empty secret is
    /// always a configuration mistake, and anyone could forge signatures with it.
    ///
    /// # Errors
    /// [`KeyError::Empty`] for no bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        if bytes.is_empty() {
            return Err(KeyError::Empty);
        }
        let sha256 = HmacSha256::new_from_slice(bytes).map_err(|_| KeyError::Rejected)?;
        Ok(Self {
            material: Material::Hmac {
                bytes: bytes.to_vec(),
                sha256,
            },
        })
    }

    /// Whether `other` is the same key (same secret, or same public key), compared in
    /// constant time. Two providers sharing a key verify each other's deliveries.
    #[must_use]
    pub fn same_key(&self, other: &Self) -> bool {
        match (&self.material, &other.material) {
            (Material::Hmac { bytes: a, .. }, Material::Hmac { bytes: b, .. }) => {
                bool::from(a.as_slice().ct_eq(b.as_slice()))
            }
            (Material::Credential { sha256: a, .. }, Material::Credential { sha256: b, .. }) => {
                bool::from(a.ct_eq(b))
            }
            (Material::Ed25519 { verifying: a, .. }, Material::Ed25519 { verifying: b, .. }) => {
                a == b
            }
            (Material::P256 { verifying: a, .. }, Material::P256 { verifying: b, .. }) => a == b,
            _ => false,
        }
    }

    /// A static credential compared as a whole (GitLab's token, a Basic auth password).
    ///
    /// # Errors
    /// [`KeyError::Empty`] for no bytes.
    pub fn credential(secret: &[u8]) -> Result<Self, KeyError> {
        if secret.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(Self {
            material: Material::Credential {
                secret: secret.to_vec(),
                sha256: Sha256::digest(secret).into(),
            },
        })
    }

    /// An Ed25519 public key (verification only).
    ///
    /// # Errors
    /// [`KeyError::Invalid`] when the bytes are not a point of the curve.
    pub fn ed25519_public(bytes: &[u8; 32]) -> Result<Self, KeyError> {
        let verifying = ed25519_dalek::VerifyingKey::from_bytes(bytes)
            .map_err(|_| KeyError::Invalid("an Ed25519 public key"))?;
        Ok(Self {
            material: Material::Ed25519 {
                verifying,
                signing: None,
            },
        })
    }

    /// An Ed25519 private key from its 32-byte seed; it verifies with its public half.
    #[must_use]
    pub fn ed25519_private(seed: &[u8; 32]) -> Self {
        let signing = ed25519_dalek::SigningKey::from_bytes(seed);
        Self {
            material: Material::Ed25519 {
                verifying: signing.verifying_key(),
                signing: Some(signing),
            },
        }
    }

    /// An ECDSA P-256 public key, from its SEC1 or DER (SubjectPublicKeyInfo) encoding.
    ///
    /// # Errors
    /// [`KeyError::Invalid`] when the bytes are neither.
    pub fn p256_public(bytes: &[u8]) -> Result<Self, KeyError> {
        use p256::pkcs8::DecodePublicKey as _;
        let verifying = p256::ecdsa::VerifyingKey::from_public_key_der(bytes)
            .or_else(|_| p256::ecdsa::VerifyingKey::from_sec1_bytes(bytes))
            .map_err(|_| KeyError::Invalid("a P-256 public key (base64 DER or PEM)"))?;
        Ok(Self {
            material: Material::P256 {
                verifying,
                signing: None,
            },
        })
    }

    /// An ECDSA P-256 private key from its 32-byte scalar; it verifies with its public half.
    ///
    /// # Errors
    /// [`KeyError::Invalid`] when the scalar is zero or not below the group order.
    pub fn p256_private(scalar: &[u8; 32]) -> Result<Self, KeyError> {
        let signing = p256::ecdsa::SigningKey::from_bytes(scalar.into())
            .map_err(|_| KeyError::Invalid("a P-256 private key"))?;
        Ok(Self {
            material: Material::P256 {
                verifying: *signing.verifying_key(),
                signing: Some(signing),
            },
        })
    }

    /// HMAC-SHA256 of the concatenation of `parts`, fed piece by piece so that the body is never
    /// copied next to its prefix. Any other kind of key yields an all-zero digest, which never
    /// matches a real one.
    pub(crate) fn digest(&self, parts: &[&[u8]]) -> [u8; 32] {
        match &self.material {
            Material::Hmac { sha256, .. } => {
                let mut mac = sha256.clone();
                for part in parts {
                    mac.update(part);
                }
                mac.finalize().into_bytes().into()
            }
            _ => [0; 32],
        }
    }

    /// HMAC of the concatenation of `parts` with `algorithm`; empty for a key that is not an
    /// HMAC key, which never matches.
    pub(crate) fn hmac(&self, algorithm: Algorithm, parts: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            match <M as hmac::digest::KeyInit>::new_from_slice(key) {
                Ok(mut mac) => {
                    for part in parts {
                        mac.update(part);
                    }
                    mac.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            }
        }
        let Material::Hmac { bytes, .. } = &self.material else {
            return Vec::new();
        };
        match algorithm {
            Algorithm::Sha256 => self.digest(parts).to_vec(),
            Algorithm::Sha1 => run::<Hmac<Sha1>>(bytes, parts),
            Algorithm::Sha512 => run::<Hmac<Sha512>>(bytes, parts),
        }
    }

    /// Whether `presented` equals the credential, in time independent of where they differ
    /// and of the presented length (both sides are hashed first).
    pub(crate) fn credential_matches(&self, presented: &[u8]) -> bool {
        match &self.material {
            Material::Credential { sha256, .. } => {
                let presented: [u8; 32] = Sha256::digest(presented).into();
                bool::from(presented.ct_eq(sha256))
            }
            _ => false,
        }
    }

    /// The credential itself, for signing (tests and the simulator send it).
    pub(crate) fn credential_secret(&self) -> Option<&[u8]> {
        match &self.material {
            Material::Credential { secret, .. } => Some(secret),
            _ => None,
        }
    }

    /// Whether an Ed25519 `signature` over `message` verifies with this key (strict RFC 8032
    /// checks: no malleable or small-order encodings).
    pub(crate) fn ed25519_verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        let Material::Ed25519 { verifying, .. } = &self.material else {
            return false;
        };
        let Ok(signature) = ed25519_dalek::Signature::from_slice(signature) else {
            return false;
        };
        verifying.verify_strict(message, &signature).is_ok()
    }

    /// Whether a DER-encoded ECDSA P-256 / SHA-256 `signature` over `message` verifies.
    pub(crate) fn p256_verifies(&self, message: &[u8], der_signature: &[u8]) -> bool {
        use p256::ecdsa::signature::Verifier as _;
        let Material::P256 { verifying, .. } = &self.material else {
            return false;
        };
        let Ok(signature) = p256::ecdsa::Signature::from_der(der_signature) else {
            return false;
        };
        verifying.verify(message, &signature).is_ok()
    }

    /// Ed25519 signature of `message`.
    pub(crate) fn ed25519_sign(&self, message: &[u8]) -> Result<[u8; 64], crate::SignError> {
        use ed25519_dalek::Signer as _;
        match &self.material {
            Material::Ed25519 {
                signing: Some(signing),
                ..
            } => Ok(signing.sign(message).to_bytes()),
            Material::Ed25519 { signing: None, .. } => Err(crate::SignError::PublicKeyOnly),
            _ => Err(crate::SignError::WrongKey),
        }
    }

    /// DER-encoded ECDSA P-256 / SHA-256 signature of `message` (RFC 6979, deterministic).
    pub(crate) fn p256_sign(&self, message: &[u8]) -> Result<Vec<u8>, crate::SignError> {
        use p256::ecdsa::signature::Signer as _;
        match &self.material {
            Material::P256 {
                signing: Some(signing),
                ..
            } => {
                let signature: p256::ecdsa::Signature = signing.sign(message);
                Ok(signature.to_der().as_bytes().to_vec())
            }
            Material::P256 { signing: None, .. } => Err(crate::SignError::PublicKeyOnly),
            _ => Err(crate::SignError::WrongKey),
        }
    }

    /// Whether this is an Ed25519 key (Standard Webhooks mixes both kinds in one list).
    pub(crate) fn is_ed25519(&self) -> bool {
        matches!(self.material, Material::Ed25519 { .. })
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

    #[test]
    fn debug_output_is_redacted() {
        let key = SigningKey::from_bytes(b"very secret").expect("non-empty key");
        assert_eq!(format!("{key:?}"), "SigningKey([redacted])");
        assert_eq!(format!("{key:#?}"), "SigningKey([redacted])");
        let token = SigningKey::credential(b"very secret").expect("non-empty token");
        assert_eq!(format!("{token:#?}"), "SigningKey([redacted])");
    }

    #[test]
    fn empty_key_is_refused() {
        assert_eq!(SigningKey::from_bytes(b"").err(), Some(KeyError::Empty));
        assert_eq!(SigningKey::credential(b"").err(), Some(KeyError::Empty));
    }

    #[test]
    fn digest_of_parts_equals_digest_of_concatenation() {
        let key = SigningKey::from_bytes(b"test_secret").expect("non-empty key");
        assert_eq!(key.digest(&[b"a", b".", b"bc"]), key.digest(&[b"a.bc"]));
        assert_ne!(key.digest(&[b"a.bc"]), key.digest(&[b"a.bd"]));
        for algorithm in [Algorithm::Sha1, Algorithm::Sha256, Algorithm::Sha512] {
            assert_eq!(
                key.hmac(algorithm, &[b"a", b"bc"]),
                key.hmac(algorithm, &[b"abc"])
            );
        }
    }

    #[test]
    fn digest_lengths_follow_the_algorithm() {
        let key = SigningKey::from_bytes(b"k").expect("non-empty key");
        assert_eq!(key.hmac(Algorithm::Sha1, &[b"x"]).len(), 20);
        assert_eq!(key.hmac(Algorithm::Sha256, &[b"x"]).len(), 32);
        assert_eq!(key.hmac(Algorithm::Sha512, &[b"x"]).len(), 64);
    }

    #[test]
    fn keys_longer_than_a_block_work() {
        // HMAC hashes keys longer than the 64-byte block first; the library must handle it.
        let long = [7_u8; 200];
        let key = SigningKey::from_bytes(&long).expect("non-empty key");
        assert_ne!(key.digest(&[b"x"]), [0; 32]);
    }

    #[test]
    fn credentials_compare_whole_values_only() {
        let token = SigningKey::credential(b"glpat-token").expect("non-empty token");
        assert!(token.credential_matches(b"glpat-token"));
        assert!(!token.credential_matches(b"glpat-toke"));
        assert!(!token.credential_matches(b"glpat-token2"));
        assert!(!token.credential_matches(b""));
        let hmac = SigningKey::from_bytes(b"glpat-token").expect("non-empty key");
        assert!(!hmac.credential_matches(b"glpat-token"));
    }

    #[test]
    fn a_public_key_cannot_sign() {
        let private = SigningKey::ed25519_private(&[1; 32]);
        let signature = private.ed25519_sign(b"m").expect("private key");
        assert!(private.ed25519_verifies(b"m", &signature));
        assert!(!private.ed25519_verifies(b"n", &signature));
        let p256 = SigningKey::p256_private(&[3; 32]).expect("valid scalar");
        let der = p256.p256_sign(b"m").expect("private key");
        assert!(p256.p256_verifies(b"m", &der));
        assert!(!p256.p256_verifies(b"n", &der));
        assert_eq!(
            SigningKey::from_bytes(b"k")
                .expect("key")
                .ed25519_sign(b"m"),
            Err(crate::SignError::WrongKey)
        );
    }
}

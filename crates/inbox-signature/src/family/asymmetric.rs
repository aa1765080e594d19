//! Public-key keys as providers publish them. Public keys go in the provider file (they are
//! not secret) and are never fetched at request time; private keys are accepted only so that
//! tests, the simulator and the benchmark can sign.

use base64::Engine as _;

use crate::parse::SECRET_BASE64;
use crate::{KeyError, SigningKey};

const PRIVATE_PEM: &str = "-----BEGIN PRIVATE KEY-----";
const PUBLIC_PEM: &str = "-----BEGIN PUBLIC KEY-----";

/// An Ed25519 key from a 64-digit hex public key (Discord), base64 of the 32 public bytes,
/// a PEM public key, or a PKCS#8 PEM private key.
///
/// # Errors
/// [`KeyError::Invalid`] for anything else.
pub fn ed25519_key(text: &str) -> Result<SigningKey, KeyError> {
    use ed25519_dalek::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _};
    let text = text.trim();
    let invalid = KeyError::Invalid("an Ed25519 key: hex or base64 public key, or PEM");
    if text.is_empty() {
        return Err(KeyError::Empty);
    }
    if text.starts_with(PRIVATE_PEM) {
        let signing = ed25519_dalek::SigningKey::from_pkcs8_pem(text).map_err(|_| invalid)?;
        return Ok(SigningKey::ed25519_private(&signing.to_bytes()));
    }
    if text.starts_with(PUBLIC_PEM) {
        let verifying =
            ed25519_dalek::VerifyingKey::from_public_key_pem(text).map_err(|_| invalid)?;
        return SigningKey::ed25519_public(verifying.as_bytes());
    }
    let bytes = hex::decode(text)
        .ok()
        .or_else(|| SECRET_BASE64.decode(text).ok())
        .ok_or(invalid.clone())?;
    let bytes: [u8; 32] = bytes.try_into().map_err(|_| invalid)?;
    SigningKey::ed25519_public(&bytes)
}

/// An ECDSA P-256 key from base64 DER (SubjectPublicKeyInfo, as SendGrid shows it), a PEM
/// public key, or a PKCS#8 PEM private key.
///
/// # Errors
/// [`KeyError::Invalid`] for anything else.
pub fn p256_key(text: &str) -> Result<SigningKey, KeyError> {
    use p256::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _};
    let text = text.trim();
    let invalid = KeyError::Invalid("a P-256 key: base64 DER public key, or PEM");
    if text.is_empty() {
        return Err(KeyError::Empty);
    }
    if text.starts_with(PRIVATE_PEM) {
        let signing = p256::ecdsa::SigningKey::from_pkcs8_pem(text).map_err(|_| invalid)?;
        return SigningKey::p256_private(&signing.to_bytes().into());
    }
    if text.starts_with(PUBLIC_PEM) {
        let verifying =
            p256::ecdsa::VerifyingKey::from_public_key_pem(text).map_err(|_| invalid)?;
        return SigningKey::p256_public(verifying.to_encoded_point(false).as_bytes());
    }
    let der = SECRET_BASE64.decode(text).map_err(|_| invalid)?;
    SigningKey::p256_public(&der)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8032 section 7.1, test 1: the secret key and its public key.
    const RFC8032_SECRET: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    const RFC8032_PUBLIC: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    /// RFC 8032 section 7.1, test 1: the signature of the empty message.
    const RFC8032_SIGNATURE: &str = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";

    #[test]
    fn rfc8032_test_1_signs_and_verifies() {
        let seed: [u8; 32] = hex::decode(RFC8032_SECRET)
            .expect("hex")
            .try_into()
            .expect("32 bytes");
        let private = SigningKey::ed25519_private(&seed);
        let signature = private.ed25519_sign(b"").expect("private key");
        assert_eq!(hex::encode(signature), RFC8032_SIGNATURE);
        let public = ed25519_key(RFC8032_PUBLIC).expect("hex public key");
        assert!(public.ed25519_verifies(b"", &signature));
        assert!(!public.ed25519_verifies(b"x", &signature));
    }

    #[test]
    fn malformed_keys_are_refused_without_echo() {
        for text in ["", "00", "zz", "-----BEGIN PRIVATE KEY-----\nAAAA\n"] {
            let err = ed25519_key(text).expect_err("not a key");
            assert!(!err.to_string().contains("AAAA"));
            assert!(p256_key(text).is_err());
        }
    }
}

//! Standard Webhooks (Svix and others): `webhook-id`, `webhook-timestamp` and
//! `webhook-signature` (a space-separated list), over `"{id}.{timestamp}.{body}"`. Two versions
//! share the list: `v1,<base64 HMAC-SHA256>` with a `whsec_<base64>` secret, and
//! `v1a,<base64 Ed25519>` with a `whpk_<base64>` public key (`whsk_<base64>` private key for
//! signing). The `svix-*` headers are used when no `webhook-*` header is present.
//! Event id: the signed `webhook-id`; type: body `type`.

use std::time::Duration;

use base64::Engine as _;

use crate::family::first_match;
use crate::header_names::{
    SVIX_ID, SVIX_SIGNATURE, SVIX_TIMESTAMP, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP,
};
use crate::parse::{parse_timestamp, DIGEST_BASE64, SECRET_BASE64};
use crate::providers::{fields, tolerance_or, Options};
use crate::time::check_tolerance;
use crate::{
    Algorithm, Field, HeaderSource, KeyError, Outgoing, Profile, Request, Scheme, SignError,
    Signed, SigningKey, Verified, VerifyError, DEFAULT_TOLERANCE,
};

const HMAC_SECRET_PREFIX: &str = "whsec_";
const PUBLIC_KEY_PREFIX: &str = "whpk_";
const PRIVATE_KEY_PREFIX: &str = "whsk_";

/// The Standard Webhooks scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandardWebhooks {
    /// Accepted clock distance, both ways.
    pub tolerance: Duration,
}

/// Builds the scheme (`tolerance` is the only option).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(options: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(StandardWebhooks {
        tolerance: tolerance_or(options, DEFAULT_TOLERANCE),
    }))
}

/// The three header names of one spelling.
struct Names {
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
}

const WEBHOOK: Names = Names {
    id: WEBHOOK_ID,
    timestamp: WEBHOOK_TIMESTAMP,
    signature: WEBHOOK_SIGNATURE,
};
const SVIX: Names = Names {
    id: SVIX_ID,
    timestamp: SVIX_TIMESTAMP,
    signature: SVIX_SIGNATURE,
};

/// Picks one spelling as a whole: mixing a `webhook-id` with a `svix-signature` is not something
/// a real sender does, so the missing half is reported instead of being borrowed from the other.
fn names_in(headers: &dyn HeaderSource) -> &'static Names {
    let present = |names: &Names| {
        [names.id, names.timestamp, names.signature]
            .iter()
            .any(|name| headers.header(name).is_some())
    };
    if !present(&WEBHOOK) && present(&SVIX) {
        &SVIX
    } else {
        &WEBHOOK
    }
}

/// The most signatures a signature header may list.
pub const MAX_LISTED_SIGNATURES: usize = 8;

/// The `v1a,<base64>` (Ed25519) entries of a signature list, decoded; others are skipped.
#[must_use]
pub fn parse_v1a_signatures(value: &str) -> Vec<Vec<u8>> {
    value
        .split_ascii_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1a,"))
        .filter_map(|encoded| DIGEST_BASE64.decode(encoded).ok())
        .collect()
}

fn decode_key(encoded: &str) -> Result<Vec<u8>, KeyError> {
    if encoded.is_empty() {
        return Err(KeyError::Empty);
    }
    SECRET_BASE64
        .decode(encoded)
        .map_err(|_| KeyError::NotBase64)
}

impl Scheme for StandardWebhooks {
    fn name(&self) -> &'static str {
        "standard-webhooks"
    }

    fn tolerance(&self) -> Option<Duration> {
        Some(self.tolerance)
    }

    fn signature_headers(&self) -> Vec<&str> {
        vec![
            WEBHOOK_ID,
            WEBHOOK_TIMESTAMP,
            WEBHOOK_SIGNATURE,
            SVIX_ID,
            SVIX_TIMESTAMP,
            SVIX_SIGNATURE,
        ]
    }

    /// The id and timestamp of either spelling: the id is read from the spelling verified.
    fn signed_headers(&self) -> Vec<&str> {
        vec![WEBHOOK_ID, WEBHOOK_TIMESTAMP, SVIX_ID, SVIX_TIMESTAMP]
    }

    /// `whsec_<base64>` (or bare base64) is an HMAC secret, `whpk_<base64>` an Ed25519 public
    /// key, `whsk_<base64>` an Ed25519 private key (its first 32 bytes are the seed).
    fn key_from_secret(&self, secret: &str) -> Result<SigningKey, KeyError> {
        if let Some(encoded) = secret.strip_prefix(PUBLIC_KEY_PREFIX) {
            let bytes: [u8; 32] = decode_key(encoded)?
                .try_into()
                .map_err(|_| KeyError::Invalid("whpk_ with 32 bytes of Ed25519 public key"))?;
            return SigningKey::ed25519_public(&bytes);
        }
        if let Some(encoded) = secret.strip_prefix(PRIVATE_KEY_PREFIX) {
            let bytes = decode_key(encoded)?;
            let seed: [u8; 32] = bytes
                .get(..32)
                .and_then(|seed| seed.try_into().ok())
                .ok_or(KeyError::Invalid(
                    "whsk_ with at least 32 bytes of Ed25519 seed",
                ))?;
            return Ok(SigningKey::ed25519_private(&seed));
        }
        let encoded = secret.strip_prefix(HMAC_SECRET_PREFIX).unwrap_or(secret);
        SigningKey::from_bytes(&decode_key(encoded)?)
    }

    fn verify(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        now: i64,
    ) -> Result<Verified, VerifyError> {
        let names = names_in(request.headers);
        let list = request.required(names.signature)?;
        let id = request.required(names.id)?;
        let raw_timestamp = request.required(names.timestamp)?;
        let timestamp = parse_timestamp(raw_timestamp)
            .ok_or_else(|| VerifyError::MalformedHeader(names.timestamp.to_owned()))?;
        // Each listed Ed25519 signature costs a hash of the whole body per key: a sender
        // rotating its keys lists two or three, and a longer list is refused unread.
        if list.split_ascii_whitespace().count() > MAX_LISTED_SIGNATURES {
            return Err(VerifyError::MalformedHeader(names.signature.to_owned()));
        }
        // The parser names the `webhook-*` header; name the one actually read.
        let v1 = crate::parse_standard_signatures(list)
            .map_err(|_| VerifyError::MalformedHeader(names.signature.to_owned()))?;
        let v1a = parse_v1a_signatures(list);
        let timestamp_text = timestamp.to_string();
        let parts: [&[u8]; 5] = [
            id.as_bytes(),
            b".",
            timestamp_text.as_bytes(),
            b".",
            request.body,
        ];
        let message = parts.concat();
        let key_index = keys
            .iter()
            .position(|key| {
                if key.is_ed25519() {
                    v1a.iter()
                        .any(|signature| key.ed25519_verifies(&message, signature))
                } else {
                    first_match(std::slice::from_ref(key), Algorithm::Sha256, &parts, &v1).is_ok()
                }
            })
            .ok_or(VerifyError::NoMatch)?;
        check_tolerance(timestamp, now, self.tolerance)?;
        Ok(Verified {
            key_index,
            timestamp: Some(timestamp),
        })
    }

    fn sign(&self, key: &SigningKey, message: &Outgoing<'_>) -> Result<Signed, SignError> {
        let timestamp = message.timestamp.to_string();
        let signed = [
            message.id.as_bytes(),
            b".",
            timestamp.as_bytes(),
            b".",
            message.body,
        ]
        .concat();
        let signature = if key.is_ed25519() {
            format!("v1a,{}", DIGEST_BASE64.encode(key.ed25519_sign(&signed)?))
        } else {
            format!(
                "v1,{}",
                DIGEST_BASE64.encode(key.hmac(Algorithm::Sha256, &[&signed]))
            )
        };
        Ok(Signed {
            headers: vec![
                (WEBHOOK_ID.to_owned(), message.id.to_owned()),
                (WEBHOOK_TIMESTAMP.to_owned(), timestamp),
                (WEBHOOK_SIGNATURE.to_owned(), signature),
            ],
            body: message.body.to_vec(),
        })
    }

    fn profile(&self) -> Profile {
        fields(
            &[Field::header(WEBHOOK_ID), Field::header(SVIX_ID)],
            &[Field::pointer("/type")],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::{assert_vector, key, verify};

    const SCHEME: StandardWebhooks = StandardWebhooks {
        tolerance: DEFAULT_TOLERANCE,
    };
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const HEADERS_FOR: fn(&'static str) -> [(&'static str, &'static str); 3] = |signature| {
        [
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("webhook-timestamp", "1614265330"),
            ("webhook-signature", signature),
        ]
    };

    #[test]
    fn v1_vector_of_the_reference_libraries_verifies() {
        // standard-webhooks/standard-webhooks libraries/go/webhook_test.go TestWebhookSign (the
        // same vector in the C#, Java, JS and PHP tests); reproduced by `new
        // Webhook(...).sign(...)` of npm standardwebhooks 1.1.1.
        assert_vector(
            &SCHEME,
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "",
            &HEADERS_FOR("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
            BODY,
            1_614_265_330,
        );
    }

    #[test]
    fn svix_bridge_vector_needs_its_own_signature_in_the_list() {
        // svix/svix-webhooks bridge/svix-bridge/src/webhook_receiver/verification.rs.
        let secret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
        let body = br#"{"email":"test@example.com","username":"test_user"}"#;
        let wrong = "v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ= v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q= v1,9DfC1c3eeOrXB6w/5dIDydLNQaEyww5KalE5jLBZucE=";
        let headers = |list: &str| {
            vec![
                ("svix-id", "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk".to_owned()),
                ("svix-timestamp", "1649367553".to_owned()),
                ("svix-signature", list.to_owned()),
            ]
        };
        let run = |list: &str| {
            let owned = headers(list);
            let pairs: Vec<(&str, &str)> = owned.iter().map(|(n, v)| (*n, v.as_str())).collect();
            verify(&SCHEME, secret, "", &pairs, body, 1_649_367_553)
        };
        assert_eq!(run(wrong), Err(VerifyError::NoMatch));
        assert!(run(&format!(
            "{wrong} v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        ))
        .is_ok());
        assert_eq!(run("v1,"), Err(VerifyError::NoMatch));
        assert_eq!(
            run("v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kk"),
            Err(VerifyError::NoMatch)
        );
    }

    /// RFC 8032 section 7.1 test 1's key pair, as `whpk_` / `whsk_` base64.
    const PUBLIC: &str = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
    const PRIVATE: &str = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=";
    /// There is no released v1a vector: this signature of "{id}.{timestamp}.{body}" with RFC
    /// 8032 test 1's secret key was made by Node's crypto and, independently, by
    /// `openssl pkeyutl -sign -rawin` (identical output, as Ed25519 is deterministic).
    const V1A: &str = "v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw==";

    #[test]
    fn v1a_ed25519_vector_verifies_with_the_public_key() {
        assert_vector(&SCHEME, PUBLIC, "", &HEADERS_FOR(V1A), BODY, 1_614_265_330);
        let signed = SCHEME
            .sign(
                &key(&SCHEME, PRIVATE),
                &Outgoing::post(BODY, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330),
            )
            .expect("private key");
        assert_eq!(signed.headers[2].1, V1A);
        assert_eq!(
            SCHEME.sign(&key(&SCHEME, PUBLIC), &Outgoing::post(BODY, "m", 0)),
            Err(SignError::PublicKeyOnly)
        );
    }

    #[test]
    fn a_mixed_list_verifies_each_kind_with_its_own_key() {
        let mixed = "v1,AAAA v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw==";
        assert!(verify(
            &SCHEME,
            PUBLIC,
            "",
            &HEADERS_FOR(mixed),
            BODY,
            1_614_265_330
        )
        .is_ok());
        // The HMAC secret never checks a v1a entry.
        assert_eq!(
            verify(
                &SCHEME,
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                "",
                &HEADERS_FOR(V1A),
                BODY,
                1_614_265_330
            ),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn a_list_longer_than_a_rotation_needs_is_refused_unread() {
        let run = |list: &str| {
            let headers = [
                ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
                ("webhook-timestamp", "1614265330"),
                ("webhook-signature", list),
            ];
            verify(&SCHEME, PUBLIC, "", &headers, BODY, 1_614_265_330)
        };
        let decoys = ["v1a,AAAA"; MAX_LISTED_SIGNATURES - 1].join(" ");
        let at_most = format!("{decoys} {V1A}");
        assert!(run(&at_most).is_ok());
        assert_eq!(
            run(&format!("v1a,AAAA {at_most}")),
            Err(VerifyError::MalformedHeader("webhook-signature".to_owned()))
        );
    }

    #[test]
    fn secrets_are_base64_after_their_prefix() {
        let padded = key(&SCHEME, "whsec_AAE=");
        let unpadded = key(&SCHEME, "whsec_AAE");
        let bare = key(&SCHEME, "AAE=");
        let raw = SigningKey::from_bytes(&[0, 1]).expect("non-empty key");
        let reference = raw.digest(&[b"x"]);
        assert_eq!(padded.digest(&[b"x"]), reference);
        assert_eq!(unpadded.digest(&[b"x"]), reference);
        assert_eq!(bare.digest(&[b"x"]), reference);
        assert_eq!(SCHEME.key_from_secret("").err(), Some(KeyError::Empty));
        assert_eq!(
            SCHEME.key_from_secret("whsec_").err(),
            Some(KeyError::Empty)
        );
        assert_eq!(
            SCHEME.key_from_secret("whsec_not base64!").err(),
            Some(KeyError::NotBase64)
        );
        assert_eq!(
            SCHEME.key_from_secret("whsec_AAE=\n").err(),
            Some(KeyError::NotBase64)
        );
        assert!(matches!(
            SCHEME.key_from_secret("whpk_AAE="),
            Err(KeyError::Invalid(_))
        ));
    }
}

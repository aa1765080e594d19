//! Behaviour every provider's scheme must share: what `sign` produces verifies; a tampered
//! body, a wrong key, a timestamp outside the tolerance, a missing header or garbage input is
//! refused without a panic; rotation reports the key that matched. The published vectors live
//! beside each provider, in `src/providers/*.rs`.

use std::sync::Arc;

use inbox_signature::providers::{self, Options, TemplateOptions};
use inbox_signature::{
    Algorithm, DigestEncoding, Outgoing, Request, Scheme, SigningKey, TimestampFormat, Verified,
    VerifyError,
};

const NOW: i64 = 1_700_000_000;
const BODY: &[u8] = br#"{"id":"evt_1","type":"invoice.paid","amount":1200}"#;
const ADYEN_BODY: &[u8] = br#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"pspReference":"7914073381342284","merchantAccountCode":"TestMerchant","merchantReference":"r1","amount":{"value":1130,"currency":"EUR"},"eventCode":"AUTHORISATION","success":"true"}}]}"#;
const MESSAGE_ID: &str = "msg_2Lz7Qk";
const URL: &str = "https://hooks.example.com/webhooks/provider?tenant=7";

/// RFC 8032 section 7.1, tests 1 and 2: secret keys as PKCS#8 PEM.
const ED25519_A: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJ1hsZ3v/VpguoRK9JLsLMREScVpezJpGXA7rAMcrn9g\n-----END PRIVATE KEY-----";
const ED25519_B: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIEzNCJso/5banbbDRuwRTg9bijGfNaumJNqM9u1PuKb7\n-----END PRIVATE KEY-----";
/// Two P-256 test keys made with `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`.
const P256_A: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQga7zR+NutwVfbD0B5\n1+Jh3Y1es9NUGsUnzeWQdHTTI2ahRANCAAT0bJYaJbgrlPSVLxOSuCNqTA1m/n++\nhZjulFPmW+ifVGEIpdf2+4GgTyjlArQViME6BFk87FS6Uj4ViBAAzuBp\n-----END PRIVATE KEY-----";
const P256_B: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgLVHkAUUiGc3ckVsE\nQqdzrZXO+nEqCFe13u1JURXX/bKhRANCAAS0mDkFXQ8ukEgayTNzL71irw4YwjfA\n7tD9l1jrH8His+dxn0U1aAech7BbzWewMBUoGaXcvHZayW8VxuwvXPGP\n-----END PRIVATE KEY-----";

/// One scheme under test, with a secret it signs with and another one.
struct Case {
    scheme: Arc<dyn Scheme>,
    secret: &'static str,
    other: &'static str,
}

impl Case {
    fn key(&self, secret: &str) -> SigningKey {
        self.scheme
            .key_from_secret(secret)
            .unwrap_or_else(|err| panic!("{}: {err}", self.scheme.name()))
    }

    fn body(&self) -> &'static [u8] {
        if self.scheme.name() == "adyen" {
            ADYEN_BODY
        } else {
            BODY
        }
    }

    fn signed_at(&self, timestamp: i64) -> (Vec<(String, String)>, Vec<u8>) {
        let message = Outgoing {
            method: "POST",
            url: URL,
            body: self.body(),
            id: MESSAGE_ID,
            timestamp,
        };
        let signed = self
            .scheme
            .sign(&self.key(self.secret), &message)
            .unwrap_or_else(|err| panic!("{}: {err}", self.scheme.name()));
        (signed.headers, signed.body)
    }

    fn verify_with(
        &self,
        headers: &[(String, String)],
        body: &[u8],
        keys: &[SigningKey],
        now: i64,
    ) -> Result<Verified, VerifyError> {
        self.scheme
            .verify(&Request::post(&headers, body).at(URL), keys, now)
    }

    fn verify(&self, headers: &[(String, String)], body: &[u8]) -> Result<Verified, VerifyError> {
        self.verify_with(headers, body, &[self.key(self.secret)], NOW)
    }

    fn name(&self) -> &'static str {
        self.scheme.name()
    }
}

fn template(
    signed: &str,
    algorithm: Algorithm,
    encoding: DigestEncoding,
    prefix: Option<&str>,
) -> TemplateOptions {
    TemplateOptions {
        signature_header: "X-Acme-Signature".into(),
        signed: Some(signed.into()),
        algorithm,
        encoding,
        prefix: prefix.map(str::to_owned),
        timestamp_header: signed
            .contains("{timestamp}")
            .then(|| "X-Acme-Timestamp".into()),
        timestamp_format: TimestampFormat::UnixSeconds,
        id_header: signed.contains("{id}").then(|| "X-Acme-Id".into()),
        hex_key: false,
    }
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for entry in providers::CATALOG {
        let (secret, other) = match entry.name {
            "standard-webhooks" => (
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
            ),
            "discord" | "discord-events" => (ED25519_A, ED25519_B),
            "sendgrid" => (P256_A, P256_B),
            "adyen" => (
                "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00",
                "00B1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00",
            ),
            "postmark" => ("hooks:s3cr3t", "hooks:s3cr3u"),
            _ => ("shared-secret-value", "shared-secret-valuf"),
        };
        let templates = match entry.name {
            "hmac-sha256" => vec![
                template(
                    "{body}",
                    Algorithm::Sha256,
                    DigestEncoding::Hex,
                    Some("sha256="),
                ),
                template("{body}", Algorithm::Sha256, DigestEncoding::Base64, None),
            ],
            "template" => vec![
                template(
                    "{timestamp}.{body}",
                    Algorithm::Sha256,
                    DigestEncoding::Hex,
                    Some("v1="),
                ),
                template(
                    "{method}\n{url}\n{id}\n{timestamp}\n{body}",
                    Algorithm::Sha512,
                    DigestEncoding::Base64,
                    None,
                ),
                template(
                    "{id}:{body}",
                    Algorithm::Sha1,
                    DigestEncoding::Hex,
                    Some("sha1="),
                ),
            ],
            _ => vec![],
        };
        let options: Vec<Options> = if templates.is_empty() {
            vec![Options::default()]
        } else {
            templates
                .into_iter()
                .map(|t| Options {
                    template: Some(t),
                    ..Options::default()
                })
                .collect()
        };
        for options in options {
            let scheme = providers::build(entry.name, &options).expect("builds");
            cases.push(Case {
                scheme,
                secret,
                other,
            });
        }
    }
    // The second Standard Webhooks key kind.
    let standard = providers::build("standard-webhooks", &Options::default()).expect("builds");
    cases.push(Case {
        scheme: standard,
        secret: "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=",
        other: "whsk_TM0Imyj/ltqdtsNG7BFOD1uKMZ81q6Yk2oz27U+4pvs=",
    });
    cases
}

#[test]
fn what_every_provider_signs_verifies() {
    for case in cases() {
        let (headers, body) = case.signed_at(NOW);
        let expected = Verified {
            key_index: 0,
            timestamp: case.scheme.tolerance().map(|_| NOW),
        };
        assert_eq!(
            case.verify(&headers, &body),
            Ok(expected),
            "{}",
            case.name()
        );
    }
}

#[test]
fn header_names_match_case_insensitively() {
    for case in cases() {
        let (headers, body) = case.signed_at(NOW);
        let shouting: Vec<(String, String)> = headers
            .iter()
            .map(|(name, value)| (name.to_ascii_uppercase(), value.clone()))
            .collect();
        assert!(case.verify(&shouting, &body).is_ok(), "{}", case.name());
    }
}

#[test]
fn a_tampered_body_fails_for_every_provider() {
    for case in cases() {
        let (headers, body) = case.signed_at(NOW);
        if case.name() == "adyen" {
            // Adyen signs eight fields of each item, not the bytes: change a signed one.
            let text = String::from_utf8(body.clone()).expect("utf-8");
            let tampered = text.replace("1130", "1131");
            assert!(
                case.verify(&headers, tampered.as_bytes()).is_err(),
                "adyen amount"
            );
            continue;
        }
        // Static credentials do not cover the body, and Mailgun signs only its timestamp and
        // token (its providers' designs, stated in their modules): change what they sign.
        if case.scheme.family() == inbox_signature::Family::Credential {
            continue;
        }
        if case.name() == "mailgun" {
            let text = String::from_utf8(body.clone()).expect("utf-8");
            let tampered = text.replace(
                "\"timestamp\":\"1700000000\"",
                "\"timestamp\":\"1700000001\"",
            );
            assert_ne!(tampered, text);
            assert!(
                case.verify(&headers, tampered.as_bytes()).is_err(),
                "mailgun timestamp"
            );
            continue;
        }
        for index in [0, body.len() / 2, body.len() - 2, body.len() - 1] {
            let mut tampered = body.clone();
            tampered[index] ^= 0x01;
            assert!(
                case.verify(&headers, &tampered).is_err(),
                "{} byte {index}",
                case.name()
            );
        }
        let mut longer = body.clone();
        longer.push(b' ');
        assert!(
            case.verify(&headers, &longer).is_err(),
            "{} longer",
            case.name()
        );
    }
}

#[test]
fn a_wrong_key_fails_for_every_provider() {
    for case in cases() {
        let (headers, body) = case.signed_at(NOW);
        assert_eq!(
            case.verify_with(&headers, &body, &[case.key(case.other)], NOW),
            Err(VerifyError::NoMatch),
            "{}",
            case.name()
        );
        assert_eq!(
            case.verify_with(&headers, &body, &[], NOW),
            Err(VerifyError::NoMatch),
            "{}",
            case.name()
        );
    }
}

#[test]
fn rotation_reports_the_index_of_the_matching_key() {
    for case in cases() {
        let (headers, body) = case.signed_at(NOW);
        let keys = [case.key(case.other), case.key(case.secret)];
        assert_eq!(
            case.verify_with(&headers, &body, &keys, NOW)
                .map(|v| v.key_index),
            Ok(1),
            "{}",
            case.name()
        );
    }
}

#[test]
fn stale_and_future_timestamps_are_rejected_beyond_the_tolerance_only() {
    for case in cases() {
        let Some(tolerance) = case.scheme.tolerance() else {
            continue;
        };
        let tolerance = i64::try_from(tolerance.as_secs()).expect("small tolerance");
        for (signed_at, expected) in [
            (NOW - tolerance, Ok(NOW - tolerance)),
            (NOW + tolerance, Ok(NOW + tolerance)),
            (NOW - tolerance - 1, Err(VerifyError::StaleTimestamp)),
            (NOW + tolerance + 1, Err(VerifyError::FutureTimestamp)),
        ] {
            let (headers, body) = case.signed_at(signed_at);
            let result = case
                .verify(&headers, &body)
                .map(|v| v.timestamp.unwrap_or_default());
            assert_eq!(
                result,
                expected,
                "{} signed at now{:+}",
                case.name(),
                signed_at - NOW
            );
        }
    }
}

#[test]
fn a_forged_request_with_a_stale_timestamp_reports_no_match() {
    for case in cases() {
        let Some(tolerance) = case.scheme.tolerance() else {
            continue;
        };
        let stale = NOW - i64::try_from(tolerance.as_secs()).expect("small") - 1_000;
        let (headers, body) = case.signed_at(stale);
        assert_eq!(
            case.verify_with(&headers, &body, &[case.key(case.other)], NOW),
            Err(VerifyError::NoMatch),
            "{}",
            case.name()
        );
    }
}

#[test]
fn each_missing_signature_header_fails() {
    for case in cases() {
        let (headers, body) = case.signed_at(NOW);
        for (name, _) in &headers {
            if name == "i-twilio-idempotency-token" {
                continue; // an id, not signature material
            }
            let without: Vec<(String, String)> =
                headers.iter().filter(|(n, _)| n != name).cloned().collect();
            let result = case.verify(&without, &body);
            assert!(result.is_err(), "{} without {name}", case.name());
        }
    }
}

#[test]
fn every_signed_header_is_listed_as_signature_material() {
    for case in cases() {
        let (headers, _) = case.signed_at(NOW);
        let listed = case.scheme.signature_headers();
        for (name, _) in &headers {
            if ["i-twilio-idempotency-token"].contains(&name.as_str()) {
                continue;
            }
            assert!(
                listed.contains(&name.as_str()),
                "{}: {name} not listed",
                case.name()
            );
        }
    }
}

/// Small deterministic generator, so a failure reproduces without a seed to chase.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: usize) -> usize {
        usize::try_from(self.next() % bound as u64).expect("bound fits in usize")
    }
}

fn garbage_values() -> Vec<String> {
    let mut values: Vec<String> = [
        "",
        " ",
        ",",
        "=",
        "t=",
        "t=,v1=",
        "t=1",
        "v1,",
        "v1a,",
        "v0=",
        "sha256=",
        "ts=;h1=",
        "t=9223372036854775807,v1=00",
        "9223372036854775807",
        "-1",
        "0",
        "é",
        "\u{0}",
        "🦀",
        "Basic",
        "Basic Og==",
        "2023-13-40T99:99:99Z",
        "v1,====",
        "v1a,AAAA",
        "zz",
    ]
    .iter()
    .map(|value| (*value).to_owned())
    .collect();
    values.extend([
        "a".repeat(10_000),
        format!("t=1,{}", "v1=00,".repeat(1_666)),
        "v1a,AAAA ".repeat(1_250),
        format!("sha256={}", "0".repeat(9_993)),
    ]);
    const PIECES: &[&str] = &[
        "t",
        "ts",
        "h1",
        "=",
        ",",
        ";",
        " ",
        "v1",
        "v1a",
        "v0",
        "sha256=",
        "0",
        "9",
        "a",
        "f",
        "A",
        "+",
        "/",
        "-",
        ":",
        "T",
        "Z",
        "é",
        "\u{0}",
        "1614556800",
        "Basic ",
    ];
    let mut random = XorShift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..400 {
        let length = random.below(24);
        values.push(
            (0..length)
                .map(|_| PIECES[random.below(PIECES.len())])
                .collect(),
        );
    }
    values
}

#[test]
fn garbage_header_values_never_panic_and_never_verify() {
    let values = garbage_values();
    let mut random = XorShift(42);
    for case in cases() {
        let names = case.scheme.signature_headers();
        if names.is_empty() {
            continue;
        }
        let key = case.key(case.secret);
        for (round, value) in values.iter().enumerate() {
            let other = &values[random.below(values.len())];
            let headers: Vec<(String, String)> = names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    (
                        (*name).to_owned(),
                        if (i + round) % 2 == 0 { value } else { other }.clone(),
                    )
                })
                .collect();
            for now in [NOW, i64::MIN, i64::MAX] {
                let result =
                    case.verify_with(&headers, case.body(), std::slice::from_ref(&key), now);
                assert!(result.is_err(), "{} {headers:?} verified", case.name());
            }
        }
    }
}

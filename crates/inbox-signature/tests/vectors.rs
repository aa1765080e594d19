//! The providers' published test vectors (and the computed ones) from `shared/test-vectors.md`:
//! each must verify, and `sign` must reproduce the published header values.

use inbox_signature::{HeaderSource, Scheme, SigningKey, Verified, VerifyError};

fn key(scheme: &Scheme, secret: &str) -> SigningKey {
    scheme
        .key_from_secret(secret)
        .expect("vector secrets are valid")
}

fn header_value<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .header(name)
        .expect("sign() emits every header of its scheme")
}

mod standard_webhooks {
    use super::*;

    const FIRST_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const FIRST_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const FIRST_TIMESTAMP: i64 = 1_614_265_330;
    const FIRST_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const FIRST_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    const SECOND_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const SECOND_ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const SECOND_TIMESTAMP: i64 = 1_649_367_553;
    const SECOND_BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const SECOND_SIGNATURE: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";
    const WRONG_SIGNATURES: &str = "v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ= \
         v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q= \
         v1,9DfC1c3eeOrXB6w/5dIDydLNQaEyww5KalE5jLBZucE=";

    fn verify_second(signature: &str) -> Result<Verified, VerifyError> {
        let scheme = Scheme::standard_webhooks();
        let timestamp = SECOND_TIMESTAMP.to_string();
        let headers = [
            ("webhook-id", SECOND_ID),
            ("webhook-timestamp", timestamp.as_str()),
            ("webhook-signature", signature),
        ];
        scheme.verify(
            &headers,
            SECOND_BODY,
            &[key(&scheme, SECOND_SECRET)],
            SECOND_TIMESTAMP,
        )
    }

    #[test]
    fn first_vector_verifies() {
        let scheme = Scheme::standard_webhooks();
        let timestamp = FIRST_TIMESTAMP.to_string();
        let headers = [
            ("webhook-id", FIRST_ID),
            ("webhook-timestamp", timestamp.as_str()),
            ("webhook-signature", FIRST_SIGNATURE),
        ];
        let verified = scheme.verify(
            &headers,
            FIRST_BODY,
            &[key(&scheme, FIRST_SECRET)],
            FIRST_TIMESTAMP,
        );
        assert_eq!(
            verified,
            Ok(Verified {
                key_index: 0,
                timestamp: Some(FIRST_TIMESTAMP)
            })
        );
    }

    #[test]
    fn second_vector_verifies() {
        assert_eq!(
            verify_second(SECOND_SIGNATURE),
            Ok(Verified {
                key_index: 0,
                timestamp: Some(SECOND_TIMESTAMP)
            })
        );
    }

    #[test]
    fn second_vector_fails_against_the_three_wrong_signatures() {
        assert_eq!(verify_second(WRONG_SIGNATURES), Err(VerifyError::NoMatch));
    }

    #[test]
    fn second_vector_passes_once_its_signature_joins_the_list() {
        let at_end = format!("{WRONG_SIGNATURES} {SECOND_SIGNATURE}");
        let at_start = format!("{SECOND_SIGNATURE} {WRONG_SIGNATURES}");
        for list in [at_end, at_start] {
            assert_eq!(
                verify_second(&list),
                Ok(Verified {
                    key_index: 0,
                    timestamp: Some(SECOND_TIMESTAMP)
                }),
                "{list}"
            );
        }
    }

    #[test]
    fn empty_v1_entry_fails() {
        assert_eq!(verify_second("v1,"), Err(VerifyError::NoMatch));
    }

    #[test]
    fn truncated_signatures_fail() {
        // Cut at several places: inside the padding, inside the data, down to one character.
        for cut in [1, 2, 3, 5, 20, 40] {
            let truncated = &SECOND_SIGNATURE[..SECOND_SIGNATURE.len() - cut];
            assert_eq!(
                verify_second(truncated),
                Err(VerifyError::NoMatch),
                "{truncated}"
            );
        }
    }

    #[test]
    fn sign_reproduces_both_published_signatures() {
        let scheme = Scheme::standard_webhooks();
        let first = scheme.sign(
            &key(&scheme, FIRST_SECRET),
            FIRST_BODY,
            FIRST_ID,
            FIRST_TIMESTAMP,
        );
        assert_eq!(
            first,
            vec![
                ("webhook-id".to_owned(), FIRST_ID.to_owned()),
                ("webhook-timestamp".to_owned(), "1614265330".to_owned()),
                ("webhook-signature".to_owned(), FIRST_SIGNATURE.to_owned()),
            ]
        );
        let second = scheme.sign(
            &key(&scheme, SECOND_SECRET),
            SECOND_BODY,
            SECOND_ID,
            SECOND_TIMESTAMP,
        );
        assert_eq!(header_value(&second, "webhook-signature"), SECOND_SIGNATURE);
    }
}

mod stripe {
    use super::*;

    const SECRET: &str = "whsec_test_secret";
    const TIMESTAMP: i64 = 1_614_556_800;
    const BODY: &[u8] = br#"{"id":"evt_test_webhook","object":"event"}"#;
    const HEADER: &str =
        "t=1614556800,v1=96943a0ceebda8d3913e8b90697d39bbe16342f950890d77a41a248e4fb22794";

    #[test]
    fn hmac_primitive_vectors_match() {
        // Stripe's library tests sign the body alone with key `test_secret`; a GitHub-style
        // scheme signs exactly that, so it exposes the bare HMAC.
        let scheme = Scheme::github();
        let key = key(&scheme, "test_secret");
        let empty = scheme.sign(&key, b"", "", 0);
        assert_eq!(
            header_value(&empty, "x-hub-signature-256"),
            "sha256=f7f9bd47fb987337b5796fdc1fdb9ba221d0d5396814bfcaf9521f43fd8927fd"
        );
        let object = scheme.sign(&key, br#"{"obj1":"hello","obj2":"world"}"#, "", 0);
        assert_eq!(
            header_value(&object, "x-hub-signature-256"),
            "sha256=bebb1a643997f419b315ddba19e6f5411e1ce7f810ba6d3617ce72823092f363"
        );
    }

    #[test]
    fn computed_header_verifies_with_the_whsec_prefix_in_the_key() {
        let scheme = Scheme::stripe();
        let verified = scheme.verify(
            &[("Stripe-Signature", HEADER)],
            BODY,
            &[key(&scheme, SECRET)],
            TIMESTAMP,
        );
        assert_eq!(
            verified,
            Ok(Verified {
                key_index: 0,
                timestamp: Some(TIMESTAMP)
            })
        );
    }

    #[test]
    fn computed_header_fails_when_the_prefix_is_dropped_from_the_key() {
        let scheme = Scheme::stripe();
        let verified = scheme.verify(
            &[("Stripe-Signature", HEADER)],
            BODY,
            &[key(&scheme, "test_secret")],
            TIMESTAMP,
        );
        assert_eq!(verified, Err(VerifyError::NoMatch));
    }

    #[test]
    fn sign_reproduces_the_computed_header() {
        let scheme = Scheme::stripe();
        let headers = scheme.sign(&key(&scheme, SECRET), BODY, "ignored", TIMESTAMP);
        assert_eq!(
            headers,
            vec![("stripe-signature".to_owned(), HEADER.to_owned())]
        );
    }
}

mod github {
    use super::*;

    const SECRET: &str = "It's a Secret to Everybody";
    const BODY: &[u8] = b"Hello, World!";
    const HEADER: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    #[test]
    fn published_vector_verifies() {
        let scheme = Scheme::github();
        let verified = scheme.verify(
            &[("X-Hub-Signature-256", HEADER)],
            BODY,
            &[key(&scheme, SECRET)],
            0,
        );
        assert_eq!(
            verified,
            Ok(Verified {
                key_index: 0,
                timestamp: None
            })
        );
    }

    #[test]
    fn sign_reproduces_the_published_header() {
        let scheme = Scheme::github();
        let headers = scheme.sign(&key(&scheme, SECRET), BODY, "", 0);
        assert_eq!(
            headers,
            vec![("x-hub-signature-256".to_owned(), HEADER.to_owned())]
        );
    }
}

mod shopify {
    use super::*;

    const SECRET: &str = "shop-secret";
    const BODY: &[u8] = br#"{"id":1}"#;
    const HEADER: &str = "plW8VGqq0nDMIEhDqaNNW99asdUCy7EIqLZVcQwtAZ0=";

    #[test]
    fn computed_vector_verifies() {
        let scheme = Scheme::shopify();
        let verified = scheme.verify(
            &[("X-Shopify-Hmac-Sha256", HEADER)],
            BODY,
            &[key(&scheme, SECRET)],
            0,
        );
        assert_eq!(
            verified,
            Ok(Verified {
                key_index: 0,
                timestamp: None
            })
        );
    }

    #[test]
    fn sign_reproduces_the_computed_header() {
        let scheme = Scheme::shopify();
        let headers = scheme.sign(&key(&scheme, SECRET), BODY, "", 0);
        assert_eq!(
            headers,
            vec![("x-shopify-hmac-sha256".to_owned(), HEADER.to_owned())]
        );
    }
}

mod slack {
    use super::*;

    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const TIMESTAMP: i64 = 1_531_420_618;
    const BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SIGNATURE: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    #[test]
    fn published_vector_verifies() {
        let scheme = Scheme::slack();
        let verified = scheme.verify(
            &[
                ("X-Slack-Request-Timestamp", "1531420618"),
                ("X-Slack-Signature", SIGNATURE),
            ],
            BODY,
            &[key(&scheme, SECRET)],
            TIMESTAMP,
        );
        assert_eq!(
            verified,
            Ok(Verified {
                key_index: 0,
                timestamp: Some(TIMESTAMP)
            })
        );
    }

    #[test]
    fn sign_reproduces_the_published_headers() {
        let scheme = Scheme::slack();
        let headers = scheme.sign(&key(&scheme, SECRET), BODY, "", TIMESTAMP);
        assert_eq!(
            headers,
            vec![
                (
                    "x-slack-request-timestamp".to_owned(),
                    "1531420618".to_owned()
                ),
                ("x-slack-signature".to_owned(), SIGNATURE.to_owned()),
            ]
        );
    }
}

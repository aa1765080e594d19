//! The provider catalog end to end, through the running receiver on a real database: every
//! provider accepts what it signs once and answers its redelivery "duplicate", and refuses a
//! tampered body, a wrong key and (where the scheme signs one) a stale or future timestamp;
//! each handshake is answered and never stored; a batch becomes one row per item and its
//! redelivery stores only the new items; a URL-signed provider verifies behind another `Host`.
//! The published vectors themselves are pinned beside each provider in `inbox-signature`.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use inbox_signature::{Outgoing, Request};
use inbox_tests::*;
use receiver::ingest::IngestMode;
use receiver::providers::Providers;
use serde_json::json;
use test_db::TestDatabase;

/// RFC 8032 section 7.1 test 1's secret key (PKCS#8 PEM): signs for discord and svix-ed25519.
const ED25519_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJ1hsZ3v/VpguoRK9JLsLMREScVpezJpGXA7rAMcrn9g\n-----END PRIVATE KEY-----";
/// A P-256 test key (`openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`).
const P256_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQga7zR+NutwVfbD0B5\n1+Jh3Y1es9NUGsUnzeWQdHTTI2ahRANCAAT0bJYaJbgrlPSVLxOSuCNqTA1m/n++\nhZjulFPmW+ifVGEIpdf2+4GgTyjlArQViME6BFk87FS6Uj4ViBAAzuBp\n-----END PRIVATE KEY-----";

const PROVIDERS: &str = r#"
[providers.stripe]
scheme = "stripe"
secrets = [{ env = "HMAC" }]
[providers.github]
scheme = "github"
secrets = [{ env = "HMAC" }]
[providers.svix]
scheme = "standard-webhooks"
secrets = [{ env = "WHSEC" }]
[providers.svix-ed25519]
scheme = "standard-webhooks"
secrets = [{ env = "WHSK" }]
[providers.shopify]
scheme = "shopify"
secrets = [{ env = "HMAC" }]
[providers.slack]
scheme = "slack"
secrets = [{ env = "HMAC" }]
[providers.twilio]
scheme = "twilio"
public_url = "https://hooks.example.com/webhooks/twilio"
secrets = [{ env = "HMAC" }]
[providers.twilio-direct]
scheme = "twilio"
secrets = [{ env = "HMAC" }]
[providers.square]
scheme = "square"
public_url = "https://hooks.example.com/webhooks/square"
secrets = [{ env = "HMAC" }]
[providers.paddle]
scheme = "paddle"
tolerance = "5m"
secrets = [{ env = "HMAC" }]
[providers.mailgun]
scheme = "mailgun"
secrets = [{ env = "HMAC" }]
[providers.sendgrid]
scheme = "sendgrid"
secrets = [{ env = "P256" }]
[providers.sendgrid-public]
scheme = "sendgrid"
tolerance = "100000days"
public_keys = ["MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA=="]
[providers.discord]
scheme = "discord"
secrets = [{ env = "ED25519" }]
[providers.discord-events]
scheme = "discord-events"
secrets = [{ env = "ED25519" }]
[providers.zoom]
scheme = "zoom"
secrets = [{ env = "HMAC" }]
[providers.linear]
scheme = "linear"
secrets = [{ env = "HMAC" }]
[providers.intercom]
scheme = "intercom"
secrets = [{ env = "HMAC" }]
[providers.gitlab]
scheme = "gitlab"
secrets = [{ env = "HMAC" }]
[providers.adyen]
scheme = "adyen"
secrets = [{ env = "ADYEN" }]
[providers.hubspot]
scheme = "hubspot"
public_url = "https://hooks.example.com/webhooks/hubspot"
secrets = [{ env = "HMAC" }]
[providers.typeform]
scheme = "typeform"
secrets = [{ env = "HMAC" }]
[providers.calendly]
scheme = "calendly"
secrets = [{ env = "HMAC" }]
[providers.twitch]
scheme = "twitch"
secrets = [{ env = "HMAC" }]
[providers.woocommerce]
scheme = "woocommerce"
secrets = [{ env = "HMAC" }]
[providers.razorpay]
scheme = "razorpay"
secrets = [{ env = "HMAC" }]
[providers.meta]
scheme = "meta"
verify_token = { env = "META_VERIFY_TOKEN" }
secrets = [{ env = "HMAC" }]
[providers.dropbox]
scheme = "dropbox"
secrets = [{ env = "HMAC" }]
[providers.jira]
scheme = "jira"
secrets = [{ env = "HMAC" }]
[providers.postmark]
scheme = "postmark"
secrets = [{ env = "BASIC" }]
[providers.acme]
scheme = "template"
signature_header = "X-Acme-Signature"
signed = "{method} {url} {timestamp} {body}"
algorithm = "sha512"
encoding = "base64"
prefix = "v1="
timestamp_header = "X-Acme-Timestamp"
public_url = "https://hooks.example.com/webhooks/acme"
event_id = { json_pointer = "/id" }
event_type = { json_pointer = "/type" }
secrets = [{ env = "HMAC" }]
"#;

const ENV: &[(&str, &str)] = &[
    ("HMAC", "catalog-shared-secret"),
    ("WHSEC", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    ("WHSK", "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A="),
    ("P256", P256_PRIVATE),
    ("ED25519", ED25519_PRIVATE),
    (
        "ADYEN",
        "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00",
    ),
    ("BASIC", "hooks:catalog-password"),
    ("META_VERIFY_TOKEN", "catalog-verify-token"),
];

fn catalog() -> Providers {
    providers(PROVIDERS, ENV)
}

async fn start(db: &TestDatabase) -> TestReceiver {
    TestReceiver::start(serve_args(db, IngestMode::GroupCommit), catalog()).await
}

/// The URL the receiver sees for `provider` when no public_url is configured.
fn direct_url(receiver: &TestReceiver, provider: &str) -> String {
    receiver.url(&format!("/webhooks/{provider}"))
}

/// What `provider` sends for a new event: composed the way the simulator composes it (id and
/// type where the provider puts them), signed at `at` with `secret`, for `url`.
fn delivery(
    provider: &receiver::providers::Provider,
    planned_id: &str,
    at: i64,
    url: &str,
    key: &inbox_signature::SigningKey,
) -> (Vec<(String, String)>, Vec<u8>, String) {
    let (body, mut headers, event_id) = inbox_simulator::wire::compose(
        provider,
        planned_id,
        Some("order.created"),
        json!({ "order_id": planned_id }),
        None,
    )
    .unwrap();
    let signed_url = provider
        .public_url
        .clone()
        .unwrap_or_else(|| url.to_owned());
    let message = Outgoing {
        method: "POST",
        url: &signed_url,
        body: &body,
        id: planned_id,
        timestamp: at,
    };
    let signed = provider.scheme.sign(key, &message).unwrap();
    headers.retain(|(name, _)| !signed.headers.iter().any(|(n, _)| n == name));
    headers.extend(signed.headers);
    headers.push(("content-type".into(), "application/json".into()));
    (headers, signed.body, event_id)
}

/// Names of every provider of the file that stores ordinary events (Dropbox's deliveries are
/// each their own event, so it is tested on its own).
fn event_providers(providers: &Providers) -> Vec<String> {
    providers
        .iter()
        .filter(|p| p.name != "dropbox" && p.name != "sendgrid-public")
        .map(|p| p.name.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_provider_stores_what_it_signs_once_and_refuses_tampering_wrong_keys_and_clock_skew()
{
    let db = TestDatabase::new().await;
    let receiver = start(&db).await;
    let providers = catalog();
    let now = unix_now();
    let forged = catalog();
    for name in event_providers(&providers) {
        let provider = providers.get(&name).unwrap();
        let url = direct_url(&receiver, &name);
        let key = &provider.keys[0];
        let (headers, body, event_id) = delivery(provider, &format!("{name}-1"), now, &url, key);
        let first = receiver.post_webhook(&name, &headers, body.clone()).await;
        let stored = if provider.ack == inbox_signature::Ack::NoContent {
            204
        } else {
            200
        };
        assert_eq!(
            first.status,
            stored,
            "{name}: {:?} {:?}",
            first.json,
            String::from_utf8_lossy(&first.body)
        );
        let again = receiver.post_webhook(&name, &headers, body.clone()).await;
        assert_eq!(again.status, stored, "{name}: redelivery");
        match &provider.ack {
            inbox_signature::Ack::Status => assert_eq!(
                again.json["status"], "duplicate",
                "{name}: {:?}",
                again.json
            ),
            // A fixed answer, to the first delivery and to its redelivery alike.
            inbox_signature::Ack::Json(answer) => {
                for reply in [&first, &again] {
                    assert_eq!(reply.body, answer.as_bytes(), "{name}");
                    assert_eq!(
                        reply.header("content-type"),
                        Some("application/json"),
                        "{name}"
                    );
                }
            }
            inbox_signature::Ack::Text(answer) => {
                assert_eq!(again.body, answer.as_bytes(), "{name}")
            }
            inbox_signature::Ack::NoContent => {
                for reply in [&first, &again] {
                    assert_eq!((reply.status, reply.body.len()), (204, 0), "{name}");
                }
            }
        }

        // Adyen signs eight fields of each item and Mailgun its timestamp and token, not the
        // bytes: change what they sign; for the others, a byte near the end.
        let tampered = match name.as_str() {
            "adyen" => String::from_utf8(body.clone())
                .unwrap()
                .replace("\"eventCode\":\"", "\"eventCode\":\"X")
                .into_bytes(),
            "mailgun" => String::from_utf8(body.clone())
                .unwrap()
                .replace("\"token\":\"", "\"token\":\"0")
                .into_bytes(),
            _ => {
                let mut tampered = body.clone();
                let at = tampered.len() - 3;
                tampered[at] ^= 0x01;
                tampered
            }
        };
        assert_ne!(tampered, body, "{name}: the tampering changed something");
        // Static credentials do not cover the body (GitLab, Postmark: their design).
        if provider.scheme.family() != inbox_signature::Family::Credential {
            let refused = receiver.post_webhook(&name, &headers, tampered).await;
            assert!(
                matches!(refused.status, 400 | 401),
                "{name}: tampered body got {}",
                refused.status
            );
        }

        // A key of the same kind no one configured.
        let other = forged.get(&name).unwrap();
        let wrong = match provider.scheme.family() {
            inbox_signature::Family::Credential => {
                other.scheme.key_from_secret("hooks:someone-else").unwrap()
            }
            _ if name == "adyen" => other
                .scheme
                .key_from_secret("00B1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00")
                .unwrap(),
            _ if name.starts_with("discord") || name == "svix-ed25519" => {
                inbox_signature::SigningKey::ed25519_private(&[9; 32])
            }
            _ if name == "sendgrid" => inbox_signature::SigningKey::p256_private(&[9; 32]).unwrap(),
            _ if name == "svix" => other
                .scheme
                .key_from_secret("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")
                .unwrap(),
            _ => other.scheme.key_from_secret("not-the-secret").unwrap(),
        };
        let (headers, body, _) = delivery(provider, &format!("{name}-2"), now, &url, &wrong);
        let refused = receiver.post_webhook(&name, &headers, body).await;
        assert_eq!(refused.status, 401, "{name}: wrong key");

        if let Some(tolerance) = provider.scheme.tolerance() {
            let tolerance = i64::try_from(tolerance.as_secs()).unwrap();
            for (at, what) in [
                (now - tolerance - 30, "stale"),
                (now + tolerance + 30, "future"),
            ] {
                let (headers, body, _) =
                    delivery(provider, &format!("{name}-{what}"), at, &url, key);
                let refused = receiver.post_webhook(&name, &headers, body).await;
                assert_eq!(
                    (refused.status, refused.json["code"].as_str()),
                    (401, Some("stale_timestamp")),
                    "{name}: {what}"
                );
            }
        }
        let mut conn = db.connect().await;
        let stored: Vec<String> = stored_events(&mut conn, &name)
            .await
            .into_iter()
            .map(|e| e.event_id)
            .collect();
        assert_eq!(stored, [event_id], "{name}: exactly the genuine event");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sendgrid_public_key_configured_inline_accepts_the_official_vector() {
    let db = TestDatabase::new().await;
    let receiver = start(&db).await;
    // sendgrid/sendgrid-nodejs packages/eventwebhook/src/eventwebhook.spec.js: a single event,
    // not an array, so it is refused as a batch after its signature passed.
    let headers = [
        ("X-Twilio-Email-Event-Webhook-Signature".to_owned(), "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0=".to_owned()),
        ("X-Twilio-Email-Event-Webhook-Timestamp".to_owned(), "1588788367".to_owned()),
    ];
    let payload =
        br#"{"category":"example_payload","event":"test_event","message_id":"message_id"}"#;
    let answer = receiver
        .post_webhook("sendgrid-public", &headers, payload.as_slice())
        .await;
    assert_eq!(
        (answer.status, answer.json["code"].as_str()),
        (400, Some("invalid_body"))
    );
    let tampered =
        br#"{"category":"example_payload","event":"test_event","message_id":"message_iD"}"#;
    let answer = receiver
        .post_webhook("sendgrid-public", &headers, tampered.as_slice())
        .await;
    assert_eq!(answer.status, 401);
}

/// The providers whose handshake the simulator makes (Meta's needs its verify token).
const SIMULATED_HANDSHAKES: [&str; 6] = [
    "slack",
    "zoom",
    "twitch",
    "discord",
    "discord-events",
    "dropbox",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_handshake_is_answered_and_never_stored() {
    let db = TestDatabase::new().await;
    let receiver = start(&db).await;
    let providers = catalog();
    let now = unix_now();
    for name in SIMULATED_HANDSHAKES {
        let provider = providers.get(name).unwrap();
        let url = direct_url(&receiver, name);
        let handshake = inbox_simulator::wire::handshake(provider, now, &url).unwrap();
        let answer = if handshake.method == "GET" {
            receiver
                .get(&format!("/webhooks/{name}?{}", handshake.query))
                .await
        } else {
            receiver
                .post_webhook(name, &handshake.headers, handshake.body.clone())
                .await
        };
        let text = String::from_utf8_lossy(&answer.body).into_owned();
        let status = if name == "discord-events" { 204 } else { 200 };
        assert_eq!(answer.status, status, "{name}: {text}");
        assert!(text.contains(&handshake.expect), "{name}: {text}");
        assert_eq!(
            answer.header("x-content-type-options"),
            Some("nosniff"),
            "{name}"
        );
        if handshake.method == "POST" {
            // The same handshake with a wrong signature is refused.
            let forged: Vec<(String, String)> = handshake
                .headers
                .iter()
                .map(|(n, v)| {
                    let forged = provider.scheme.signature_headers().contains(&n.as_str())
                        && !n.contains("timestamp")
                        && !n.contains("message-id")
                        && !n.contains("message-type");
                    (
                        n.clone(),
                        if forged {
                            v.replacen(|c: char| c.is_ascii_hexdigit(), "0", 6)
                                .replacen("00", "11", 1)
                        } else {
                            v.clone()
                        },
                    )
                })
                .collect();
            let refused = receiver
                .post_webhook(name, &forged, handshake.body.clone())
                .await;
            assert_eq!(refused.status, 401, "{name}: forged handshake");
        }
    }
    // Zoom's answer is the HMAC of the plain token with the configured secret.
    let zoom = providers.get("zoom").unwrap();
    let handshake = inbox_simulator::wire::handshake(zoom, now, "").unwrap();
    let answer = receiver
        .post_webhook("zoom", &handshake.headers, handshake.body.clone())
        .await;
    let plain = answer.json["plainToken"].as_str().unwrap().to_owned();
    let request_headers: [(&str, &str); 0] = [];
    let echo = zoom
        .scheme
        .handshake(
            &Request::post(&request_headers, &handshake.body),
            Some(&zoom.keys[0]),
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&echo.body).unwrap()["plainToken"],
        plain
    );
    assert_eq!(
        answer.json,
        serde_json::from_slice::<serde_json::Value>(&echo.body).unwrap()
    );

    // Meta's GET needs the verify token.
    let ok = receiver
        .get("/webhooks/meta?hub.mode=subscribe&hub.verify_token=catalog-verify-token&hub.challenge=1158201444")
        .await;
    assert_eq!(
        (ok.status, ok.body.as_slice()),
        (200, b"1158201444".as_slice())
    );
    let wrong = receiver
        .get("/webhooks/meta?hub.mode=subscribe&hub.verify_token=guess&hub.challenge=1")
        .await;
    assert_eq!(wrong.status, 401);
    // Providers without a GET handshake still answer 405.
    assert_eq!(receiver.get("/webhooks/stripe").await.status, 405);

    let mut conn = db.connect().await;
    for name in SIMULATED_HANDSHAKES.into_iter().chain(["meta"]) {
        assert!(
            stored_events(&mut conn, name).await.is_empty(),
            "{name} stored a handshake"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_one_row_per_item_and_a_redelivery_stores_only_new_items() {
    let db = TestDatabase::new().await;
    let receiver = start(&db).await;
    let providers = catalog();
    let sendgrid = providers.get("sendgrid").unwrap();
    let now = unix_now();
    let send = |body: &'static str| {
        let message = Outgoing::post(body.as_bytes(), "", now);
        let signed = sendgrid.scheme.sign(&sendgrid.keys[0], &message).unwrap();
        (signed.headers, signed.body)
    };
    let (headers, body) = send(
        r#"[{"sg_event_id":"sg-1","event":"delivered"},{"sg_event_id":"sg-2","event":"open"},{"sg_event_id":"sg-1","event":"delivered"}]"#,
    );
    let answer = receiver.post_webhook("sendgrid", &headers, body).await;
    assert_eq!(
        answer.json,
        json!({"status": "accepted", "accepted": 2, "duplicates": 1})
    );
    let (headers, body) = send(
        r#"[{"sg_event_id":"sg-2","event":"open"},{"sg_event_id":"sg-3","event":"click"},{"sg_event_id":"sg-1","event":"delivered"}]"#,
    );
    let answer = receiver.post_webhook("sendgrid", &headers, body).await;
    assert_eq!(
        answer.json,
        json!({"status": "accepted", "accepted": 1, "duplicates": 2})
    );
    let mut conn = db.connect().await;
    let stored = stored_events(&mut conn, "sendgrid").await;
    let ids: Vec<&str> = stored.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, ["sg-1", "sg-2", "sg-3"]);
    assert_eq!(stored[2].event_type.as_deref(), Some("click"));
    assert_eq!(stored[2].body, br#"{"sg_event_id":"sg-3","event":"click"}"#);

    // Adyen: signatures inside each item, the answer it expects.
    let adyen = providers.get("adyen").unwrap();
    let body = br#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"pspReference":"p1","merchantAccountCode":"M","merchantReference":"r1","amount":{"value":100,"currency":"EUR"},"eventCode":"AUTHORISATION","success":"true"}},{"NotificationRequestItem":{"pspReference":"p1","merchantAccountCode":"M","merchantReference":"r1","amount":{"value":100,"currency":"EUR"},"eventCode":"CAPTURE","success":"true"}}]}"#;
    let signed = adyen
        .scheme
        .sign(&adyen.keys[0], &Outgoing::post(body, "", now))
        .unwrap();
    let answer = receiver
        .post_webhook("adyen", &[], signed.body.clone())
        .await;
    assert_eq!(
        (answer.status, answer.body.as_slice()),
        (200, b"[accepted]".as_slice())
    );
    let answer = receiver.post_webhook("adyen", &[], signed.body).await;
    assert_eq!(
        (answer.status, answer.body.as_slice()),
        (200, b"[accepted]".as_slice())
    );
    let ids: Vec<String> = stored_events(&mut conn, "adyen")
        .await
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    assert_eq!(ids, ["p1:AUTHORISATION:true", "p1:CAPTURE:true"]);
}

/// SendGrid posts its events when a batch reaches 768 KB (its Event Webhook overview): some
/// 2,500 events of ~300 bytes. All are stored; only a batch beyond what any provider sends is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_as_large_as_sendgrid_sends_is_stored_whole() {
    const EVENTS: usize = 2_600;
    let db = TestDatabase::new().await;
    let receiver = start(&db).await;
    let providers = catalog();
    let sendgrid = providers.get("sendgrid").unwrap();
    let now = unix_now();
    let sign = |items: Vec<String>| {
        let body = format!("[{}]", items.join(","));
        let signed = sendgrid
            .scheme
            .sign(&sendgrid.keys[0], &Outgoing::post(body.as_bytes(), "", now))
            .unwrap();
        (signed.headers, signed.body)
    };
    let padding = "p".repeat(160);
    let (headers, body) = sign(
        (0..EVENTS)
            .map(|n| {
                format!(
                    r#"{{"email":"user{n}@example.com","timestamp":{now},"event":"processed","sg_event_id":"sg-{n:05}","sg_message_id":"msg-{n}.filter0001{padding}"}}"#
                )
            })
            .collect(),
    );
    assert!(
        body.len() > 700_000 && body.len() < 800_000,
        "{}",
        body.len()
    );
    let answer = receiver.post_webhook("sendgrid", &headers, body).await;
    assert_eq!(
        answer.json,
        json!({"status": "accepted", "accepted": EVENTS, "duplicates": 0})
    );
    let mut conn = db.connect().await;
    assert_eq!(stored_events(&mut conn, "sendgrid").await.len(), EVENTS);

    let (headers, body) = sign(
        (0..=receiver::identify::MAX_BATCH_ITEMS)
            .map(|n| format!(r#"{{"sg_event_id":"{n}"}}"#))
            .collect(),
    );
    let answer = receiver.post_webhook("sendgrid", &headers, body).await;
    assert_eq!(answer.status, 400);
}

/// The largest batch a request may carry enters the writers' queue whole: admitted event by
/// event, its tail found the queue full, and every retry was answered 503 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_batch_allowed_is_stored_whole() {
    let db = TestDatabase::new().await;
    let mut args = serve_args(&db, IngestMode::GroupCommit);
    // Ten thousand rows take a debug build longer than the default deadline.
    args.db_deadline = std::time::Duration::from_secs(60);
    let receiver = TestReceiver::start(args, catalog()).await;
    let providers = catalog();
    let sendgrid = providers.get("sendgrid").unwrap();
    let items: Vec<String> = (0..receiver::identify::MAX_BATCH_ITEMS)
        .map(|n| format!(r#"{{"sg_event_id":"sg-{n}","event":"open"}}"#))
        .collect();
    let body = format!("[{}]", items.join(","));
    let signed = sendgrid
        .scheme
        .sign(
            &sendgrid.keys[0],
            &Outgoing::post(body.as_bytes(), "", unix_now()),
        )
        .unwrap();
    let answer = receiver
        .post_webhook("sendgrid", &signed.headers, signed.body)
        .await;
    assert_eq!(
        answer.json,
        json!({"status": "accepted", "accepted": items.len(), "duplicates": 0})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_signed_providers_verify_against_their_public_url_behind_another_host() {
    let db = TestDatabase::new().await;
    let receiver = start(&db).await;
    let providers = catalog();
    let twilio = providers.get("twilio").unwrap();
    let form = b"AccountSid=AC1&MessageSid=SM1&MessageStatus=delivered";
    let sign_for = |url: &str| {
        let message = Outgoing {
            method: "POST",
            url,
            body: form,
            id: "tok-1",
            timestamp: 0,
        };
        twilio
            .scheme
            .sign(&twilio.keys[0], &message)
            .unwrap()
            .headers
    };
    // The receiver is reached at 127.0.0.1 (its Host), Twilio signed the public URL.
    let signed = sign_for("https://hooks.example.com/webhooks/twilio");
    let answer = receiver
        .post_webhook("twilio", &signed, form.as_slice())
        .await;
    assert_eq!(answer.json, json!({"status": "accepted"}));
    // twilio-node accepts the :443 spelling of the same URL.
    let mut ported = sign_for("https://hooks.example.com:443/webhooks/twilio");
    ported.retain(|(n, _)| n != "i-twilio-idempotency-token");
    ported.push(("i-twilio-idempotency-token".into(), "tok-2".into()));
    let answer = receiver
        .post_webhook("twilio", &ported, form.as_slice())
        .await;
    assert_eq!(answer.json, json!({"status": "accepted"}));
    // Without public_url the URL is the one the receiver sees; the public one does not verify.
    let answer = receiver
        .post_webhook("twilio-direct", &signed, form.as_slice())
        .await;
    assert_eq!(answer.status, 401);
    let direct = sign_for(&direct_url(&receiver, "twilio-direct"));
    let answer = receiver
        .post_webhook("twilio-direct", &direct, form.as_slice())
        .await;
    assert_eq!(answer.json, json!({"status": "accepted"}));
    // A query Twilio adds is part of what it signs.
    let query_url = format!("{}?tenant=7", direct_url(&receiver, "twilio-direct"));
    let with_query = sign_for(&query_url);
    let mut request = receiver.client.post(&query_url);
    for (name, value) in &with_query {
        request = request.header(
            name.as_str(),
            if name == "i-twilio-idempotency-token" {
                "tok-3"
            } else {
                value.as_str()
            },
        );
    }
    let answer = Answer::from_response(request.body(form.to_vec()).send().await.unwrap()).await;
    assert_eq!(answer.json, json!({"status": "accepted"}));
    let mut conn = db.connect().await;
    assert_eq!(stored_events(&mut conn, "twilio").await.len(), 2);
    assert_eq!(stored_events(&mut conn, "twilio-direct").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dropbox_delivery_is_its_own_event() {
    let db = TestDatabase::new().await;
    let receiver = start(&db).await;
    let providers = catalog();
    let dropbox = providers.get("dropbox").unwrap();
    let body = br#"{"list_folder":{"accounts":["dbid:A"]},"delta":{"users":[1]}}"#;
    let signed = dropbox
        .scheme
        .sign(&dropbox.keys[0], &Outgoing::post(body, "", 0))
        .unwrap();
    for _ in 0..2 {
        let answer = receiver
            .post_webhook("dropbox", &signed.headers, body.as_slice())
            .await;
        assert_eq!(answer.json, json!({"status": "accepted"}));
    }
    let mut conn = db.connect().await;
    assert_eq!(stored_events(&mut conn, "dropbox").await.len(), 2);
}

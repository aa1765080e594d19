//! Every provider scheme end to end, through the running receiver on a real database.
//!
//! Each scheme accepts a request signed the way its provider signs: the published (or
//! independently computed) vectors of `shared/test-vectors.md` as literal header values, and,
//! for timestamped schemes, requests signed now with `Scheme::sign`. Each one rejects (401) a
//! one-byte change of the body, the signature, the timestamp or the secret, and stale or
//! future timestamps. Bodies that are not JSON are stored byte for byte where the scheme allows.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use inbox_tests::*;
use receiver::ingest::IngestMode;
use serde_json::json;
use test_db::TestDatabase;

/// Every scheme, plus twins with a tolerance wide enough for vectors signed years ago.
const ALL_PROVIDERS: &str = r#"
[providers.stripe]
scheme = "stripe"
secrets = [{ env = "STRIPE_SECRET" }]

[providers.stripe-vectors]
scheme = "stripe"
tolerance = "100000days"
secrets = [{ env = "STRIPE_SECRET" }]

[providers.github]
scheme = "github"
secrets = [{ env = "GITHUB_SECRET" }]

[providers.svix]
scheme = "standard-webhooks"
secrets = [{ env = "SVIX_SECRET" }]

[providers.svix-vectors]
scheme = "standard-webhooks"
tolerance = "100000days"
secrets = [{ env = "SVIX_VECTOR_SECRET_1", name = "first" }, { env = "SVIX_VECTOR_SECRET_2", name = "second" }]

[providers.shopify]
scheme = "shopify"
secrets = [{ env = "SHOPIFY_SECRET" }]

[providers.slack]
scheme = "slack"
secrets = [{ env = "SLACK_SECRET" }]

[providers.slack-vectors]
scheme = "slack"
tolerance = "100000days"
secrets = [{ env = "SLACK_SECRET" }]

[providers.acme]
scheme = "hmac-sha256"
signature_header = "X-Acme-Signature"
encoding = "hex"
prefix = "sha256="
event_id = { json_pointer = "/id" }
event_type = { json_pointer = "/type" }
secrets = [{ env = "ACME_SECRET" }]

[providers.acme-b64]
scheme = "hmac-sha256"
signature_header = "X-Acme-Signature"
encoding = "base64"
event_id = { header = "X-Acme-Delivery" }
event_type = { header = "X-Acme-Topic" }
secrets = [{ env = "ACME_SECRET" }]

[providers.rotating]
scheme = "github"
secrets = [{ env = "GITHUB_SECRET", name = "current" }, { env = "OLD_GITHUB_SECRET", name = "previous" }]
"#;

const STRIPE_SECRET: &str = "whsec_test_secret";
const GITHUB_SECRET: &str = "It's a Secret to Everybody";
const SVIX_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SVIX_VECTOR_SECRET_2: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const SHOPIFY_SECRET: &str = "shop-secret";
const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const ACME_SECRET: &str = "test_secret";
const OLD_GITHUB_SECRET: &str = "the secret we are retiring";

async fn start_receiver(db: &TestDatabase) -> TestReceiver {
    TestReceiver::start(
        serve_args(db, IngestMode::GroupCommit),
        providers(
            ALL_PROVIDERS,
            &[
                ("STRIPE_SECRET", STRIPE_SECRET),
                ("GITHUB_SECRET", GITHUB_SECRET),
                ("SVIX_SECRET", SVIX_SECRET),
                ("SVIX_VECTOR_SECRET_1", SVIX_SECRET),
                ("SVIX_VECTOR_SECRET_2", SVIX_VECTOR_SECRET_2),
                ("SHOPIFY_SECRET", SHOPIFY_SECRET),
                ("SLACK_SECRET", SLACK_SECRET),
                ("ACME_SECRET", ACME_SECRET),
                ("OLD_GITHUB_SECRET", OLD_GITHUB_SECRET),
            ],
        ),
    )
    .await
}

fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

fn with_header(
    mut headers: Vec<(String, String)>,
    name: &str,
    value: &str,
) -> Vec<(String, String)> {
    headers.retain(|(candidate, _)| !candidate.eq_ignore_ascii_case(name));
    headers.push((name.to_owned(), value.to_owned()));
    headers
}

fn header_of<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(candidate, _)| candidate.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
        .unwrap_or_else(|| panic!("no header {name}"))
}

/// The same text with one character in its middle replaced by another of the same kind (a hex
/// digit by a hex digit, a letter by a letter), so the encoding stays valid and only the
/// value changes.
fn one_char_changed(text: &str) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let at = (chars.len() / 2..chars.len())
        .chain(0..chars.len() / 2)
        .find(|&i| chars[i].is_ascii_alphanumeric())
        .expect("an alphanumeric character");
    chars[at] = match chars[at] {
        '0' => '1',
        '1'..='9' => '0',
        'f' => 'a',
        'F' => 'A',
        c @ ('a'..='e' | 'A'..='E') => char::from(c as u8 + 1),
        c if c.is_ascii_lowercase() => 'a',
        _ => 'A',
    };
    chars.into_iter().collect()
}

/// The body with one byte in its middle changed.
fn one_byte_changed(body: &[u8]) -> Vec<u8> {
    let mut changed = body.to_vec();
    let at = changed.len() / 2;
    changed[at] ^= 0x01;
    changed
}

async fn assert_answer(
    receiver: &TestReceiver,
    provider: &str,
    headers: &[(String, String)],
    body: &[u8],
    expected_status: u16,
    expected_json: serde_json::Value,
    what: &str,
) {
    let answer = receiver.post_webhook(provider, headers, body).await;
    assert_eq!(
        (answer.status, &answer.json),
        (expected_status, &expected_json),
        "{provider}: {what}"
    );
}

async fn assert_accepted(
    receiver: &TestReceiver,
    provider: &str,
    headers: &[(String, String)],
    body: &[u8],
    what: &str,
) {
    let accepted = json!({"status": "accepted"});
    assert_answer(receiver, provider, headers, body, 200, accepted, what).await;
}

async fn assert_unauthorized(
    receiver: &TestReceiver,
    provider: &str,
    headers: &[(String, String)],
    body: &[u8],
    what: &str,
) -> String {
    let answer = receiver.post_webhook(provider, headers, body).await;
    assert_eq!(answer.status, 401, "{provider}: {what}: {:?}", answer.json);
    answer.json["code"].as_str().unwrap_or_default().to_owned()
}

/// A correctly signed request passes, and each one-byte change of body, signature or secret
/// (and of the timestamp, when `timestamp_header` names where it travels) is refused.
async fn assert_one_byte_changes_are_refused(
    receiver: &TestReceiver,
    provider: &str,
    sign: impl Fn(&[u8], &str, i64) -> Vec<(String, String)>,
    secret: &str,
    signature_header: &str,
    timestamp_header: Option<&str>,
    body: &[u8],
) {
    let now = unix_now();
    let signed = sign(body, secret, now);

    assert_unauthorized(
        receiver,
        provider,
        &signed,
        &one_byte_changed(body),
        "body changed",
    )
    .await;
    let signature = header_of(&signed, signature_header);
    let forged = with_header(
        signed.clone(),
        signature_header,
        &one_char_changed(signature),
    );
    assert_unauthorized(receiver, provider, &forged, body, "signature changed").await;
    let wrong_key = sign(body, &one_char_changed(secret), now);
    assert_unauthorized(receiver, provider, &wrong_key, body, "secret changed").await;
    if let Some(timestamp_header) = timestamp_header {
        let original = header_of(&signed, timestamp_header);
        let moved = original.replace(&now.to_string(), &(now + 1).to_string());
        assert_ne!(moved, original, "the timestamp is in {timestamp_header}");
        let replayed = with_header(signed.clone(), timestamp_header, &moved);
        assert_unauthorized(receiver, provider, &replayed, body, "timestamp changed").await;
    }
    let missing: Vec<(String, String)> = signed
        .iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case(signature_header))
        .cloned()
        .collect();
    assert_unauthorized(receiver, provider, &missing, body, "signature missing").await;
    // The untouched request is still good: the refusals were about the changes.
    assert_accepted(receiver, provider, &signed, body, "the original").await;
}

/// Requests signed further in the past or future than the tolerance (300 s by default) are
/// refused even though their signature is right.
async fn assert_stale_and_future_timestamps_are_refused(
    receiver: &TestReceiver,
    provider: &str,
    sign: impl Fn(&[u8], &str, i64) -> Vec<(String, String)>,
    secret: &str,
    body: &[u8],
) {
    let now = unix_now();
    for (timestamp, what) in [(now - 400, "stale"), (now + 400, "future")] {
        let code = assert_unauthorized(
            receiver,
            provider,
            &sign(body, secret, timestamp),
            body,
            what,
        )
        .await;
        assert_eq!(code, "stale_timestamp", "{provider}: {what}");
    }
}

async fn nothing_stored(db: &TestDatabase, provider: &str) -> bool {
    let mut conn = db.connect().await;
    stored_events(&mut conn, provider).await.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_accepts_what_stripe_signs_and_refuses_any_one_byte_change() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;

    // The computed vector, literally (signed in 2021, hence the wide-tolerance twin).
    let vector_body = br#"{"id":"evt_test_webhook","object":"event"}"#;
    let vector = headers(&[(
        "Stripe-Signature",
        "t=1614556800,v1=96943a0ceebda8d3913e8b90697d39bbe16342f950890d77a41a248e4fb22794",
    )]);
    assert_accepted(&receiver, "stripe-vectors", &vector, vector_body, "vector").await;
    assert_unauthorized(
        &receiver,
        "stripe",
        &vector,
        vector_body,
        "vector is years old",
    )
    .await;

    let scheme = scheme("stripe");
    let sign = |body: &[u8], secret: &str, at: i64| signed_headers(&*scheme, secret, body, "", at);
    let body = br#"{"id":"evt_1","type":"payment_intent.succeeded","data":{"amount":2000}}"#;
    assert_one_byte_changes_are_refused(
        &receiver,
        "stripe",
        sign,
        STRIPE_SECRET,
        "stripe-signature",
        Some("stripe-signature"),
        body,
    )
    .await;
    assert_stale_and_future_timestamps_are_refused(&receiver, "stripe", sign, STRIPE_SECRET, body)
        .await;

    // Any matching v1 passes: Stripe sends several while its own secret rotates.
    let rotated_body = br#"{"id":"evt_2","type":"charge.refunded"}"#;
    let good = header_of(
        &sign(rotated_body, STRIPE_SECRET, unix_now()),
        "stripe-signature",
    )
    .to_owned();
    let (timestamp, digest) = good.split_once(",v1=").unwrap();
    let several = headers(&[(
        "Stripe-Signature",
        &format!("{timestamp},v0=00,v1={},v1={digest}", "ab".repeat(32)),
    )]);
    assert_accepted(
        &receiver,
        "stripe",
        &several,
        rotated_body,
        "v1 among others",
    )
    .await;

    // The id is in the body, so the body must be JSON.
    let text = b"id=evt_3";
    let answer = receiver
        .post_webhook("stripe", &sign(text, STRIPE_SECRET, unix_now()), *text)
        .await;
    assert_eq!(
        (answer.status, answer.json["code"].as_str()),
        (400, Some("invalid_body"))
    );

    let mut conn = db.connect().await;
    let stored = stored_event(&mut conn, "stripe", "evt_1").await.unwrap();
    assert_eq!(
        stored.event_type.as_deref(),
        Some("payment_intent.succeeded")
    );
    assert_eq!(stored.body, body);
    let ids: Vec<String> = stored_events(&mut conn, "stripe")
        .await
        .into_iter()
        .map(|event| event.event_id)
        .collect();
    assert_eq!(
        ids,
        ["evt_1", "evt_2"],
        "only authentic requests are stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_accepts_the_published_vector_and_stores_non_json_bodies_as_received() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;

    // GitHub's published vector: a body that is not JSON at all.
    let vector = headers(&[
        (
            "X-Hub-Signature-256",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        ),
        ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ("X-GitHub-Event", "ping"),
    ]);
    assert_accepted(&receiver, "github", &vector, b"Hello, World!", "vector").await;
    assert_answer(
        &receiver,
        "github",
        &vector,
        b"Hello, World!",
        200,
        json!({"status": "duplicate"}),
        "redelivery keeps X-GitHub-Delivery",
    )
    .await;

    let scheme = scheme("github");
    let delivery = [
        ("X-GitHub-Delivery", "d-form-1"),
        ("X-GitHub-Event", "push"),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    let sign = |body: &[u8], secret: &str, _at: i64| {
        let mut signed = signed_headers(&*scheme, secret, body, "", 0);
        signed.extend(headers(&delivery));
        signed
    };
    let form_body = b"payload=%7B%22ref%22%3A%22refs%2Fheads%2Fmain%22%7D";
    assert_one_byte_changes_are_refused(
        &receiver,
        "github",
        sign,
        GITHUB_SECRET,
        "x-hub-signature-256",
        None,
        form_body,
    )
    .await;

    let without_delivery = signed_headers(&*scheme, GITHUB_SECRET, b"{}", "", 0);
    let answer = receiver
        .post_webhook("github", &without_delivery, *b"{}")
        .await;
    assert_eq!(
        (answer.status, answer.json["code"].as_str()),
        (400, Some("missing_event_id"))
    );

    let mut conn = db.connect().await;
    let ping = stored_event(&mut conn, "github", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
        .await
        .unwrap();
    assert_eq!(ping.body, b"Hello, World!");
    assert_eq!(ping.event_type.as_deref(), Some("ping"));
    let push = stored_event(&mut conn, "github", "d-form-1").await.unwrap();
    assert_eq!(push.body, form_body);
    assert_eq!(push.event_type.as_deref(), Some("push"));
    assert_eq!(stored_events(&mut conn, "github").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_accepts_the_published_vectors_and_svix_headers() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;

    let first = headers(&[
        ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
        ("webhook-timestamp", "1614265330"),
        (
            "webhook-signature",
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ),
    ]);
    assert_accepted(
        &receiver,
        "svix-vectors",
        &first,
        br#"{"test": 2432232314}"#,
        "first",
    )
    .await;

    let second_body = br#"{"email":"test@example.com","username":"test_user"}"#;
    let wrong = "v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ= \
                 v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q= \
                 v1,9DfC1c3eeOrXB6w/5dIDydLNQaEyww5KalE5jLBZucE=";
    let second = |signatures: &str| {
        headers(&[
            ("webhook-id", "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"),
            ("webhook-timestamp", "1649367553"),
            ("webhook-signature", signatures),
        ])
    };
    assert_unauthorized(
        &receiver,
        "svix-vectors",
        &second(wrong),
        second_body,
        "wrong list",
    )
    .await;
    let with_correct = format!("{wrong} v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=");
    assert_accepted(
        &receiver,
        "svix-vectors",
        &second(&with_correct),
        second_body,
        "list",
    )
    .await;
    let verified = |secret: &str| {
        format!(
            "inbox_receiver_signature_verified_total{{provider=\"svix-vectors\",secret=\"{secret}\"}}"
        )
    };
    assert_eq!(receiver.metric(&verified("first")).await, 1.0);
    assert_eq!(receiver.metric(&verified("second")).await, 1.0);

    let scheme = scheme("standard-webhooks");
    let sign = |body: &[u8], secret: &str, at: i64| {
        signed_headers(&*scheme, secret, body, "msg_live_1", at)
    };
    let body = br#"{"type":"invoice.paid","data":{"id":"in_1"}}"#;
    assert_one_byte_changes_are_refused(
        &receiver,
        "svix",
        sign,
        SVIX_SECRET,
        "webhook-signature",
        Some("webhook-timestamp"),
        body,
    )
    .await;
    assert_stale_and_future_timestamps_are_refused(&receiver, "svix", sign, SVIX_SECRET, body)
        .await;
    // The id is signed too.
    let signed = sign(body, SVIX_SECRET, unix_now());
    let other_id = with_header(signed, "webhook-id", "msg_live_2");
    assert_unauthorized(&receiver, "svix", &other_id, body, "id changed").await;

    // Svix's own spelling: svix-id, svix-timestamp, svix-signature; the id is svix-id.
    let svix_body = b"not JSON: stored as received";
    let svix_headers: Vec<(String, String)> =
        signed_headers(&*scheme, SVIX_SECRET, svix_body, "msg_svix_1", unix_now())
            .into_iter()
            .map(|(name, value)| (name.replace("webhook-", "svix-"), value))
            .collect();
    assert!(svix_headers
        .iter()
        .all(|(name, _)| name.starts_with("svix-")));
    assert_accepted(&receiver, "svix", &svix_headers, svix_body, "svix- headers").await;
    let forged = with_header(
        svix_headers.clone(),
        "svix-signature",
        &one_char_changed(header_of(&svix_headers, "svix-signature")),
    );
    assert_unauthorized(
        &receiver,
        "svix",
        &forged,
        svix_body,
        "svix signature changed",
    )
    .await;

    let mut conn = db.connect().await;
    let live = stored_event(&mut conn, "svix", "msg_live_1").await.unwrap();
    assert_eq!(live.event_type.as_deref(), Some("invoice.paid"));
    let from_svix = stored_event(&mut conn, "svix", "msg_svix_1").await.unwrap();
    assert_eq!(from_svix.body, svix_body);
    assert_eq!(from_svix.event_type, None);
    assert_eq!(stored_events(&mut conn, "svix").await.len(), 2);
    assert_eq!(stored_events(&mut conn, "svix-vectors").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shopify_accepts_its_vector_falls_back_to_the_webhook_id_and_keeps_xml_bodies() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;

    let vector = headers(&[
        (
            "X-Shopify-Hmac-Sha256",
            "plW8VGqq0nDMIEhDqaNNW99asdUCy7EIqLZVcQwtAZ0=",
        ),
        ("X-Shopify-Event-Id", "ev-vector"),
        ("X-Shopify-Webhook-Id", "wh-vector"),
        ("X-Shopify-Topic", "orders/create"),
    ]);
    assert_accepted(&receiver, "shopify", &vector, br#"{"id":1}"#, "vector").await;

    let scheme = scheme("shopify");
    let sign = |body: &[u8], secret: &str, _at: i64| {
        let mut signed = signed_headers(&*scheme, secret, body, "", 0);
        signed.extend(headers(&[
            ("X-Shopify-Webhook-Id", "wh-xml"),
            ("X-Shopify-Topic", "products/update"),
        ]));
        signed
    };
    let xml = b"<?xml version=\"1.0\"?><product><id>7</id></product>";
    assert_one_byte_changes_are_refused(
        &receiver,
        "shopify",
        sign,
        SHOPIFY_SECRET,
        "x-shopify-hmac-sha256",
        None,
        xml,
    )
    .await;

    let mut conn = db.connect().await;
    let by_event_id = stored_event(&mut conn, "shopify", "ev-vector")
        .await
        .unwrap();
    assert_eq!(by_event_id.event_type.as_deref(), Some("orders/create"));
    let by_webhook_id = stored_event(&mut conn, "shopify", "wh-xml").await.unwrap();
    assert_eq!(by_webhook_id.body, xml);
    assert_eq!(stored_events(&mut conn, "shopify").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_answers_the_challenge_and_accepts_events_and_slash_commands() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;

    // Slack's published vector: a form-encoded slash command, keyed by its trigger_id.
    let command = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    let vector = headers(&[
        ("X-Slack-Request-Timestamp", "1531420618"),
        (
            "X-Slack-Signature",
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
        ),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ]);
    assert_accepted(
        &receiver,
        "slack-vectors",
        &vector,
        command.as_bytes(),
        "vector",
    )
    .await;

    let scheme = scheme("slack");
    let sign = |body: &[u8], secret: &str, at: i64| signed_headers(&*scheme, secret, body, "", at);

    let handshake = br#"{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    assert_answer(
        &receiver,
        "slack",
        &sign(handshake, SLACK_SECRET, unix_now()),
        handshake,
        200,
        json!({"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}),
        "url_verification",
    )
    .await;
    assert!(
        nothing_stored(&db, "slack").await,
        "the handshake is not an event"
    );
    let forged_handshake = sign(handshake, "not the signing secret", unix_now());
    assert_unauthorized(
        &receiver,
        "slack",
        &forged_handshake,
        handshake,
        "forged handshake",
    )
    .await;

    let event = br#"{"type":"event_callback","event_id":"Ev08MFMKH6","event":{"type":"app_mention","text":"hi"}}"#;
    assert_one_byte_changes_are_refused(
        &receiver,
        "slack",
        sign,
        SLACK_SECRET,
        "x-slack-signature",
        Some("x-slack-request-timestamp"),
        event,
    )
    .await;
    assert_stale_and_future_timestamps_are_refused(&receiver, "slack", sign, SLACK_SECRET, event)
        .await;

    let mut conn = db.connect().await;
    let slash = stored_event(
        &mut conn,
        "slack-vectors",
        "398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c",
    )
    .await
    .unwrap();
    assert_eq!(slash.body, command.as_bytes());
    assert_eq!(slash.event_type.as_deref(), Some("/webhook-collect"));
    let mention = stored_event(&mut conn, "slack", "Ev08MFMKH6")
        .await
        .unwrap();
    assert_eq!(mention.event_type.as_deref(), Some("app_mention"));
    assert_eq!(stored_events(&mut conn, "slack").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_hmac_accepts_hex_with_prefix_and_base64_with_ids_from_body_or_header() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;

    // Computed independently (Python's hmac module), hex with a prefix, id from a JSON pointer.
    let body = br#"{"id":"evt_generic_1","type":"thing.happened"}"#;
    let hex = headers(&[(
        "X-Acme-Signature",
        "sha256=ff076028cc497a46719588ba3f4b146811e881675b262a30625baac765c13bcf",
    )]);
    assert_accepted(&receiver, "acme", &hex, body, "hex vector").await;
    let unprefixed = headers(&[(
        "X-Acme-Signature",
        "ff076028cc497a46719588ba3f4b146811e881675b262a30625baac765c13bcf",
    )]);
    let code = assert_unauthorized(&receiver, "acme", &unprefixed, body, "prefix missing").await;
    assert_eq!(code, "invalid_signature");

    // Base64 of Stripe's published HMAC primitive vector, id from a header.
    let primitive = br#"{"obj1":"hello","obj2":"world"}"#;
    let base64 = headers(&[
        (
            "X-Acme-Signature",
            "vrsaZDmX9BmzFd26Geb1QR4c5/gQum02F85ygjCS82M=",
        ),
        ("X-Acme-Delivery", "delivery-1"),
        ("X-Acme-Topic", "greeting"),
    ]);
    assert_accepted(&receiver, "acme-b64", &base64, primitive, "base64 vector").await;
    let as_hex = with_header(
        base64.clone(),
        "X-Acme-Signature",
        "bebb1a643997f419b315ddba19e6f5411e1ce7f810ba6d3617ce72823092f363",
    );
    assert_unauthorized(
        &receiver,
        "acme-b64",
        &as_hex,
        primitive,
        "hex where base64 is due",
    )
    .await;

    let hex_scheme = inbox_signature::Template::body_only(
        "hmac-sha256",
        "X-Acme-Signature",
        Some("sha256="),
        inbox_signature::DigestEncoding::Hex,
        inbox_signature::Algorithm::Sha256,
        inbox_signature::Profile::fields(Vec::new(), Vec::new()),
    );
    let sign_hex =
        |body: &[u8], secret: &str, _at: i64| signed_headers(&hex_scheme, secret, body, "", 0);
    assert_one_byte_changes_are_refused(
        &receiver,
        "acme",
        sign_hex,
        ACME_SECRET,
        "x-acme-signature",
        None,
        br#"{"id":"evt_generic_2","type":"thing.happened"}"#,
    )
    .await;

    let base64_scheme = inbox_signature::Template::body_only(
        "hmac-sha256",
        "X-Acme-Signature",
        None,
        inbox_signature::DigestEncoding::Base64,
        inbox_signature::Algorithm::Sha256,
        inbox_signature::Profile::fields(Vec::new(), Vec::new()),
    );
    let sign_base64 = |body: &[u8], secret: &str, _at: i64| {
        let mut signed = signed_headers(&base64_scheme, secret, body, "", 0);
        signed.extend(headers(&[("X-Acme-Delivery", "delivery-2")]));
        signed
    };
    let plain_text = b"a body that is not JSON, identified by its header";
    assert_one_byte_changes_are_refused(
        &receiver,
        "acme-b64",
        sign_base64,
        ACME_SECRET,
        "x-acme-signature",
        None,
        plain_text,
    )
    .await;

    let mut conn = db.connect().await;
    let from_body = stored_event(&mut conn, "acme", "evt_generic_1")
        .await
        .unwrap();
    assert_eq!(from_body.event_type.as_deref(), Some("thing.happened"));
    let from_header = stored_event(&mut conn, "acme-b64", "delivery-1")
        .await
        .unwrap();
    assert_eq!(from_header.event_type.as_deref(), Some("greeting"));
    let text = stored_event(&mut conn, "acme-b64", "delivery-2")
        .await
        .unwrap();
    assert_eq!(text.body, plain_text);
    assert_eq!(stored_events(&mut conn, "acme").await.len(), 2);
    assert_eq!(stored_events(&mut conn, "acme-b64").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_that_verified_each_request_is_counted_so_an_old_one_can_be_retired() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db).await;
    let scheme = scheme("github");
    let send = async |secret: &str, delivery: &str| {
        let mut signed = signed_headers(&*scheme, secret, b"{}", "", 0);
        signed.extend(headers(&[("X-GitHub-Delivery", delivery)]));
        receiver
            .post_webhook("rotating", &signed, *b"{}")
            .await
            .status
    };
    assert_eq!(send(OLD_GITHUB_SECRET, "r-1").await, 200);
    assert_eq!(send(GITHUB_SECRET, "r-2").await, 200);
    assert_eq!(send(GITHUB_SECRET, "r-3").await, 200);
    assert_eq!(send("neither secret", "r-4").await, 401);

    let page = receiver.metrics().await;
    let series = |secret: &str| {
        format!(
            "inbox_receiver_signature_verified_total{{provider=\"rotating\",secret=\"{secret}\"}}"
        )
    };
    assert_eq!(metric_value(&page, &series("current")), Some(2.0), "{page}");
    assert_eq!(
        metric_value(&page, &series("previous")),
        Some(1.0),
        "{page}"
    );
    for secret in [GITHUB_SECRET, OLD_GITHUB_SECRET] {
        assert!(!page.contains(secret), "a secret leaked into the metrics");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_read_from_files_named_in_the_provider_file() {
    let db = TestDatabase::new().await;
    let folder = temp_folder("receiver-secret-files");
    // Relative to the provider file, and with the trailing newline editors add.
    std::fs::write(folder.join("github.secret"), format!("{GITHUB_SECRET}\n")).unwrap();
    let absolute = folder.join("shopify.secret");
    std::fs::write(&absolute, SHOPIFY_SECRET).unwrap();
    let config = folder.join("providers.toml");
    std::fs::write(
        &config,
        format!(
            "[providers.github]\nscheme = \"github\"\nsecrets = [{{ file = \"github.secret\" }}]\n\
             [providers.shopify]\nscheme = \"shopify\"\nsecrets = [{{ file = {:?} }}]\n",
            absolute.display().to_string()
        ),
    )
    .unwrap();
    let loaded = receiver::providers::Providers::load(&config).unwrap();
    let receiver = TestReceiver::start(serve_args(&db, IngestMode::GroupCommit), loaded).await;

    let github = headers(&[
        (
            "X-Hub-Signature-256",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        ),
        ("X-GitHub-Delivery", "from-file"),
    ]);
    assert_accepted(&receiver, "github", &github, b"Hello, World!", "github").await;
    let shopify = headers(&[
        (
            "X-Shopify-Hmac-Sha256",
            "plW8VGqq0nDMIEhDqaNNW99asdUCy7EIqLZVcQwtAZ0=",
        ),
        ("X-Shopify-Event-Id", "from-file"),
    ]);
    assert_accepted(&receiver, "shopify", &shopify, br#"{"id":1}"#, "shopify").await;

    // A file that cannot be read stops start-up with its name, never a secret's value.
    std::fs::remove_file(&absolute).unwrap();
    let err = receiver::providers::Providers::load(&config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("shopify.secret"), "{err}");
    assert!(!err.contains(GITHUB_SECRET), "{err}");
    std::fs::remove_dir_all(&folder).unwrap();
}

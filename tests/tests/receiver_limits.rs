//! The receiver's hard limits and answers, against the running receiver: the design's table
//! (404, 405, 400, 413, 408), credentials never stored, and a table of malformed requests
//! that must each get their answer without ever bringing the process down.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::{Duration, Instant};

use inbox_tests::*;
use receiver::ingest::IngestMode;
use serde_json::json;
use test_db::TestDatabase;
use tokio::io::AsyncWriteExt as _;

/// Body limit of these tests: small, so over-limit bodies are cheap to send.
const BODY_LIMIT: usize = 64 * 1024;
/// Body timeout of these tests.
const BODY_TIMEOUT: Duration = Duration::from_secs(1);

async fn start_receiver(db: &TestDatabase, pool_size: u32) -> TestReceiver {
    let mut args = serve_args(db, IngestMode::GroupCommit);
    args.max_body_bytes = BODY_LIMIT;
    args.body_timeout = BODY_TIMEOUT;
    args.db = db.args(pool_size);
    TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await
}

/// A raw `POST /webhooks/demo` with these headers and body, and `Connection: close`.
fn raw_post(path: &str, headers: &[(&[u8], &[u8])], body: &[u8]) -> Vec<u8> {
    let mut request =
        format!("POST {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n").into_bytes();
    for (name, value) in headers {
        request.extend_from_slice(name);
        request.extend_from_slice(b": ");
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    request.extend_from_slice(body);
    request
}

/// A raw demo request signed correctly for its body, plus `extra` headers.
fn signed_raw(body: &[u8], extra: &[(&[u8], &[u8])]) -> Vec<u8> {
    let signature = demo_signature(body, DEMO_SECRET);
    let mut headers: Vec<(&[u8], &[u8])> = vec![
        (b"Content-Type", b"application/json"),
        (b"X-Signature", signature.as_bytes()),
    ];
    headers.extend_from_slice(extra);
    raw_post("/webhooks/demo", &headers, body)
}

async fn assert_still_answering(receiver: &TestReceiver, after: &str) {
    let health = receiver.get("/healthz").await;
    assert_eq!(health.status, 200, "no answer from /healthz after {after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_follow_the_design_table() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db, 4).await;

    let body = r#"{"id":"evt_table","type":"t"}"#;
    let unknown = receiver
        .client
        .post(receiver.url("/webhooks/nobody"))
        .header("x-signature", demo_signature(body.as_bytes(), DEMO_SECRET))
        .body(body)
        .send()
        .await
        .unwrap();
    let unknown = Answer::from_response(unknown).await;
    assert_eq!(
        (unknown.status, unknown.json["code"].as_str()),
        (404, Some("unknown_provider"))
    );
    assert_eq!(receiver.get("/somewhere/else").await.status, 404);

    for method in [
        reqwest::Method::GET,
        reqwest::Method::PUT,
        reqwest::Method::DELETE,
    ] {
        let response = receiver
            .client
            .request(method.clone(), receiver.url("/webhooks/demo"))
            .send()
            .await
            .unwrap();
        let answer = Answer::from_response(response).await;
        assert_eq!(answer.status, 405, "{method}");
        assert_eq!(answer.header("allow"), Some("POST"), "{method}");
    }

    let bad = |body: &str| {
        let receiver = &receiver;
        let body = body.to_owned();
        async move { receiver.post_demo(&body, DEMO_SECRET).await }
    };
    let (status, json) = bad(r#"{"id":"evt_trunc","#).await;
    assert_eq!((status, json["code"].as_str()), (400, Some("invalid_body")));
    let (status, json) = bad(r#"{"type":"no id"}"#).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (400, Some("missing_event_id"))
    );
    let (status, json) = bad(&json!({"id": "x".repeat(256)}).to_string()).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (400, Some("invalid_event_id"))
    );
    let longest = "é".repeat(255);
    let (status, json) = bad(&json!({"id": longest}).to_string()).await;
    assert_eq!(
        (status, json),
        (200, json!({"status": "accepted"})),
        "255 characters fit"
    );

    // A body of exactly the limit is accepted; one byte more is 413.
    let exact = {
        let frame = json!({"id": "evt_exact", "pad": ""}).to_string();
        json!({"id": "evt_exact", "pad": "p".repeat(BODY_LIMIT - frame.len())}).to_string()
    };
    assert_eq!(exact.len(), BODY_LIMIT);
    assert_eq!(receiver.post_demo(&exact, DEMO_SECRET).await.0, 200);
    let over = format!("{exact} ");
    let (status, json) = receiver.post_demo(&over, DEMO_SECRET).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (413, Some("body_too_large"))
    );

    // Refused on the declared length alone, before any byte of the body is sent.
    let started = Instant::now();
    let declared = format!(
        "POST /webhooks/demo HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
        BODY_LIMIT + 1
    );
    let answer = raw_exchange(receiver.running.addr, declared.as_bytes()).await;
    assert_eq!(answer.status, 413, "{}", answer.head);
    assert!(
        started.elapsed() < BODY_TIMEOUT,
        "413 took {:?}: it waited for the body",
        started.elapsed()
    );

    // Chunked, without any Content-Length: counted as it arrives.
    let mut chunked =
        b"POST /webhooks/demo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    for _ in 0..(BODY_LIMIT / 4096 + 1) {
        chunked.extend_from_slice(b"1000\r\n");
        chunked.extend_from_slice(&[b'a'; 4096]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let answer = raw_exchange(receiver.running.addr, &chunked).await;
    assert_eq!(answer.status, 413, "{}", answer.head);

    // A chunked body under the limit is read whole and stored.
    let small = br#"{"id":"evt_chunked","type":"t"}"#;
    let mut request = format!(
        "POST /webhooks/demo HTTP/1.1\r\nHost: test\r\nConnection: close\r\nX-Signature: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        demo_signature(small, DEMO_SECRET)
    )
    .into_bytes();
    for piece in small.chunks(10) {
        request.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        request.extend_from_slice(piece);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let answer = raw_exchange(receiver.running.addr, &request).await;
    assert_eq!(answer.status, 200, "{}", answer.head);

    let mut conn = db.connect().await;
    let ids: Vec<String> = stored_events(&mut conn, "demo")
        .await
        .into_iter()
        .map(|event| event.event_id)
        .collect();
    assert_eq!(ids, ["evt_chunked", "evt_exact", longest.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_its_body_too_slowly_is_cut_off_without_holding_a_database_connection()
{
    let db = TestDatabase::new().await;
    // One pooled connection: a slow client that held it would starve everybody else.
    let receiver = start_receiver(&db, 1).await;
    let addr = receiver.running.addr;

    let mut slow_clients = Vec::new();
    for n in 0..3 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let start = format!(
            "POST /webhooks/demo HTTP/1.1\r\nHost: test\r\nX-Signature: sha256=00\r\nContent-Length: 100\r\n\r\n{{\"id\":\"slow-{n}\""
        );
        stream.write_all(start.as_bytes()).await.unwrap();
        slow_clients.push((Instant::now(), stream));
    }

    // While all of them stall, a normal delivery goes through on the only connection.
    let body = r#"{"id":"evt_meanwhile","type":"t"}"#;
    let (status, json) = receiver.post_demo(body, DEMO_SECRET).await;
    assert_eq!((status, json), (200, json!({"status": "accepted"})));

    for (sent_at, mut stream) in slow_clients {
        let answer = read_raw_answer(&mut stream).await;
        let waited = sent_at.elapsed();
        assert_eq!(answer.status, 408, "{}", answer.head);
        assert!(
            waited >= BODY_TIMEOUT - Duration::from_millis(50),
            "cut off after {waited:?}, before the body timeout"
        );
        assert!(
            waited <= BODY_TIMEOUT + Duration::from_secs(2),
            "cut off only after {waited:?}"
        );
    }
    let timeouts = receiver
        .metric(r#"inbox_receiver_requests_total{outcome="timeout",provider="demo"}"#)
        .await;
    assert_eq!(timeouts, 3.0);
    let mut conn = db.connect().await;
    assert_eq!(stored_events(&mut conn, "demo").await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_headers_are_never_stored() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db, 4).await;
    let body = r#"{"id":"evt_creds","type":"t"}"#;
    let response = receiver
        .client
        .post(receiver.url("/webhooks/demo"))
        .header("x-signature", demo_signature(body.as_bytes(), DEMO_SECRET))
        .header("authorization", "Bearer very-secret-token")
        .header("proxy-authorization", "Basic c2VjcmV0")
        .header("cookie", "session=secret-cookie")
        .header("x-api-key", "secret-api-key")
        .header("x-trace", "kept")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);

    let mut conn = db.connect().await;
    let stored = stored_event(&mut conn, "demo", "evt_creds").await.unwrap();
    let headers = stored.headers.as_object().unwrap();
    for credential in [
        "authorization",
        "proxy-authorization",
        "cookie",
        "x-api-key",
    ] {
        assert!(
            !headers.contains_key(credential),
            "{credential} stored: {headers:?}"
        );
    }
    let text = stored.headers.to_string();
    assert!(!text.contains("secret"), "a credential leaked: {text}");
    assert_eq!(headers.get("x-trace"), Some(&json!("kept")));
    assert!(headers.contains_key("x-signature"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_each_get_their_answer_and_the_server_keeps_answering() {
    let db = TestDatabase::new().await;
    let receiver = start_receiver(&db, 4).await;

    let good = br#"{"id":"evt_good","type":"t"}"#;
    let huge_value = vec![b'v'; 200 * 1024];
    let many_headers: Vec<(Vec<u8>, Vec<u8>)> = (0..200)
        .map(|n| (format!("X-Filler-{n}").into_bytes(), b"1".to_vec()))
        .collect();
    let many_headers: Vec<(&[u8], &[u8])> = many_headers
        .iter()
        .map(|(name, value)| (name.as_slice(), value.as_slice()))
        .collect();
    let long_id = json!({"id": "i".repeat(10_000)}).to_string();
    let signature = demo_signature(good, DEMO_SECRET);
    let doubled = raw_post(
        "/webhooks/demo",
        &[
            (b"X-Signature", signature.as_bytes()),
            (b"X-Signature", signature.as_bytes()),
        ],
        good,
    );

    // (what, raw request, the answers allowed)
    let table: Vec<(&str, Vec<u8>, &[u16])> = vec![
        (
            "bad UTF-8 in the signature header",
            raw_post("/webhooks/demo", &[(b"X-Signature", b"sha256=\xff\xfe\xfd")], good),
            &[401],
        ),
        (
            "bad UTF-8 in a header nobody reads",
            signed_raw(br#"{"id":"evt_odd_header","type":"t"}"#, &[(b"X-Note", b"caf\xe9")]),
            &[200],
        ),
        (
            "bad UTF-8 in a header name",
            signed_raw(good, &[(b"X-N\xffme", b"1")]),
            &[400],
        ),
        ("bad UTF-8 in the body", signed_raw(b"{\"id\":\"\xff\xfe\"}", &[]), &[400]),
        ("NUL bytes in the body", signed_raw(b"\0\0\0\0", &[]), &[400]),
        ("empty body", signed_raw(b"", &[]), &[400]),
        ("truncated JSON", signed_raw(br#"{"id":"evt_tr"#, &[]), &[400]),
        ("JSON that is not an object", signed_raw(b"[1,2,3]", &[]), &[400]),
        ("event id of 10,000 characters", signed_raw(long_id.as_bytes(), &[]), &[400]),
        ("duplicate signature headers", doubled, &[400]),
        ("a 200 KiB header", signed_raw(good, &[(b"X-Huge", &huge_value)]), &[431]),
        ("200 headers", signed_raw(good, &many_headers), &[431]),
        (
            "Content-Length that is not a number",
            b"POST /webhooks/demo HTTP/1.1\r\nHost: t\r\nContent-Length: ten\r\n\r\n".to_vec(),
            &[400],
        ),
        (
            "two different Content-Lengths",
            b"POST /webhooks/demo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}".to_vec(),
            &[400],
        ),
        (
            "a malformed chunk size",
            b"POST /webhooks/demo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n".to_vec(),
            &[400],
        ),
        ("a garbage request line", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n".to_vec(), &[400]),
        (
            "a provider name of 10,000 characters",
            raw_post(&format!("/webhooks/{}", "p".repeat(10_000)), &[], good),
            &[404],
        ),
        (
            "a provider name in bad percent-encoding",
            raw_post("/webhooks/%ff%fe", &[], good),
            &[404],
        ),
    ];

    for (what, request, expected) in &table {
        let answer = raw_exchange(receiver.running.addr, request).await;
        assert!(
            expected.contains(&answer.status),
            "{what}: answered {} ({}), expected one of {expected:?}",
            answer.status,
            answer.head.lines().next().unwrap_or("no answer")
        );
        assert_still_answering(&receiver, what).await;
    }

    // Still fully working: a good delivery is stored, and only the good ones were.
    let (status, _) = receiver
        .post_demo(std::str::from_utf8(good).unwrap(), DEMO_SECRET)
        .await;
    assert_eq!(status, 200);
    let mut conn = db.connect().await;
    let ids: Vec<String> = stored_events(&mut conn, "demo")
        .await
        .into_iter()
        .map(|event| event.event_id)
        .collect();
    assert_eq!(ids, ["evt_good", "evt_odd_header"]);
    let odd = stored_event(&mut conn, "demo", "evt_odd_header")
        .await
        .unwrap();
    assert_eq!(odd.headers["x-note"], json!("caf\u{fffd}"), "kept, lossily");
}

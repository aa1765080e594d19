//! Request heads: a head over `--max-head-bytes` is answered 431 (with `X-Request-Id`, like
//! every answer of the app), and so are the heads the HTTP layer would refuse on its own —
//! unparseable (400), past its 128 KiB buffer (431), not received within `--head-timeout`
//! (408) — each with a well-formed request id of its own, pipelined ones after the answers
//! before them; the headers kept with an event are capped in bytes, and `/readyz` answers
//! from a result cached for about a second, so probes cannot open a database connection each.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use futures_util::future::join_all;
use inbox_tests::*;
use receiver::accept::{MAX_STORED_HEADER_BYTES, TRUNCATED_MARKER};
use receiver::head_guard::HTTP_LAYER_MAX_HEAD_BYTES;
use receiver::ingest::IngestMode;
use serde_json::json;
use test_db::TestDatabase;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const READINESS_CHECKS: &str = "inbox_receiver_readiness_checks_total";

fn signed(body: &str) -> Vec<(String, String)> {
    vec![(
        "x-signature".to_owned(),
        demo_signature(body.as_bytes(), DEMO_SECRET),
    )]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_the_budget_is_answered_431_with_a_request_id() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let body = json!({"id": "evt-big-head", "type": "t"}).to_string();
    let mut headers = signed(&body);
    // 100 KB of headers: under actix's own limits (128 KiB, 96 headers), far over the budget.
    for n in 0..25 {
        headers.push((format!("x-filler-{n}"), "f".repeat(4000)));
    }
    let answer = receiver.post_webhook("demo", &headers, body.clone()).await;
    assert_eq!(answer.status, 431, "{:?}", answer.json);
    assert_eq!(answer.json["code"], "headers_too_large");
    assert!(answer.header("x-request-id").is_some());
    let mut conn = db.connect().await;
    assert!(stored_events(&mut conn, "demo").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_headers_kept_with_an_event_are_capped_in_bytes() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let body = json!({"id": "evt-many-headers", "type": "t"}).to_string();
    let mut headers = signed(&body);
    // 12 KB of headers: within the head budget, over what a row keeps.
    for n in 0..12 {
        headers.push((format!("x-filler-{n:02}"), "f".repeat(1000)));
    }
    let answer = receiver.post_webhook("demo", &headers, body).await;
    assert_eq!(answer.status, 200, "{:?}", answer.json);
    let mut conn = db.connect().await;
    let stored = stored_event(&mut conn, "demo", "evt-many-headers")
        .await
        .unwrap();
    let kept = stored.headers.as_object().unwrap();
    let bytes: usize = kept
        .iter()
        .map(|(name, value)| name.len() + value.as_str().map_or(0, str::len))
        .sum();
    assert!(bytes <= MAX_STORED_HEADER_BYTES + 64, "{bytes} bytes kept");
    assert!(
        kept.contains_key("x-signature"),
        "the early headers are kept"
    );
    assert_eq!(kept[TRUNCATED_MARKER], "true");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_probes_share_one_database_check_a_second() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let answers = join_all((0..50).map(|_| receiver.get("/readyz"))).await;
    assert!(answers.iter().all(|answer| answer.status == 200));
    // 50 concurrent probes make one check (two if the second turned over in between).
    let checks = receiver.metric(READINESS_CHECKS).await;
    assert!((1.0..=2.0).contains(&checks), "{checks} database checks");
}

/// Reads answers off `stream` until the receiver closes it (bounded by 10 s).
async fn answers_until_closed(stream: &mut TcpStream) -> Vec<RawAnswer> {
    let mut received = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut received)).await;
    let mut answers = Vec::new();
    let mut rest = received.as_slice();
    while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        let mut answer = RawAnswer {
            status,
            head,
            body: Vec::new(),
        };
        let length: usize = answer
            .header("content-length")
            .and_then(|length| length.parse().ok())
            .unwrap_or(0);
        let body_end = (end + 4 + length).min(rest.len());
        answer.body = rest[end + 4..body_end].to_vec();
        answers.push(answer);
        rest = &rest[body_end..];
    }
    answers
}

/// Checks an answer's status and code, and that it carries a well-formed request id; returns
/// the id.
fn request_id_of(answer: &RawAnswer, status: u16, code: &str) -> String {
    assert_eq!(answer.status, status, "{}", answer.head);
    let id = answer
        .header("x-request-id")
        .unwrap_or_else(|| panic!("no X-Request-Id in {:?}", answer.head));
    assert!(
        uuid::Uuid::parse_str(id).is_ok(),
        "malformed request id {id:?}"
    );
    let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
    assert_eq!(body["code"], code, "{}", answer.head);
    id.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_the_http_layer_cannot_parse_are_answered_400_with_a_request_id() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let malformed: [(&str, &[u8]); 2] = [
        ("a malformed request line", b"NOT A REQUEST\r\n\r\n"),
        (
            "a header line without a colon",
            b"POST /webhooks/demo HTTP/1.1\r\nHost: t\r\nno colon here\r\n\r\n",
        ),
    ];
    for (what, request) in malformed {
        let answer = raw_exchange(receiver.running.addr, request).await;
        assert_eq!(answer.status, 400, "{what}: {}", answer.head);
        request_id_of(&answer, 400, "malformed_request");
        assert_eq!(answer.header("connection"), Some("close"), "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_past_the_http_layers_buffer_is_answered_431_with_a_request_id() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    // Exactly the HTTP layer's buffer and still no end: every byte sent is read before the
    // answer, so closing cannot reset the connection under it.
    let mut request = b"POST /webhooks/demo HTTP/1.1\r\nHost: t\r\nX-Filler: ".to_vec();
    request.resize(HTTP_LAYER_MAX_HEAD_BYTES, b'f');
    let answer = raw_exchange(receiver.running.addr, &request).await;
    request_id_of(&answer, 431, "headers_too_large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_not_received_within_the_head_timeout_is_answered_408_with_a_request_id() {
    let db = TestDatabase::new().await;
    let mut args = serve_args(&db, IngestMode::GroupCommit);
    args.head_timeout = Duration::from_millis(500);
    let receiver = TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;
    let mut stream = TcpStream::connect(receiver.running.addr).await.unwrap();
    stream
        .write_all(b"POST /webhooks/demo HTTP/1.1\r\nHost: t\r\nX-Signature: sha256=00\r\n")
        .await
        .unwrap();
    let answer = read_raw_answer(&mut stream).await;
    request_id_of(&answer, 408, "head_timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_head_pipelined_behind_a_webhook_is_answered_after_it_with_an_id_of_its_own() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let body = json!({"id": "evt-pipelined", "type": "t"}).to_string();
    let webhook = format!(
        "POST /webhooks/demo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         X-Signature: {}\r\nContent-Length: {}\r\n\r\n{body}",
        demo_signature(body.as_bytes(), DEMO_SECRET),
        body.len()
    );
    let mut stream = TcpStream::connect(receiver.running.addr).await.unwrap();
    stream
        .write_all(format!("{webhook}GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let answers = answers_until_closed(&mut stream).await;
    assert_eq!(answers.len(), 2, "{answers:?}");
    let delivered = answers[0].header("x-request-id").map(str::to_owned);
    assert_eq!(answers[0].status, 200, "{}", answers[0].head);
    let refused = request_id_of(&answers[1], 400, "malformed_request");
    assert!(delivered.is_some_and(|id| id != refused));
    let mut conn = db.connect().await;
    assert!(stored_event(&mut conn, "demo", "evt-pipelined")
        .await
        .is_some());
}

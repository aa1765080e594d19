//! The record of refusals: every 4xx on a configured provider's path is kept in
//! `inbox_rejections` (cause, request id, kept headers, body size and hash, never the body),
//! within a per-provider rate, trimmed by age and count, and listed by `worker rejections`.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Bytea, Jsonb, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_tests::*;
use receiver::ingest::IngestMode;
use sha2::{Digest, Sha256};
use test_db::TestDatabase;

#[derive(QueryableByName, Debug)]
struct Row {
    #[diesel(sql_type = Text)]
    provider: String,
    #[diesel(sql_type = Text)]
    cause: String,
    #[diesel(sql_type = SmallInt)]
    status: i16,
    #[diesel(sql_type = Text)]
    request_id: String,
    #[diesel(sql_type = Jsonb)]
    headers: serde_json::Value,
    #[diesel(sql_type = BigInt)]
    body_bytes: i64,
    #[diesel(sql_type = Nullable<Bytea>)]
    body_sha256: Option<Vec<u8>>,
}

async fn rows(conn: &mut AsyncPgConnection) -> Vec<Row> {
    diesel::sql_query(
        "SELECT provider, cause, status, request_id, headers, body_bytes, body_sha256 \
         FROM inbox_rejections ORDER BY id",
    )
    .load(conn)
    .await
    .unwrap()
}

fn signed(body: &str) -> Vec<(String, String)> {
    vec![(
        "x-signature".to_owned(),
        demo_signature(body.as_bytes(), DEMO_SECRET),
    )]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_is_recorded_with_its_cause_request_id_size_and_hash_but_never_its_body() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::demo(&db).await;
    let forged_body = r#"{"id":"evt-1","type":"t","card":"4242424242424242"}"#;
    let forged = receiver
        .post_webhook(
            "demo",
            &[
                ("x-signature".to_owned(), "sha256=00".to_owned()),
                ("authorization".to_owned(), "Bearer hunter2".to_owned()),
                ("x-delivery".to_owned(), "d-1".to_owned()),
            ],
            forged_body,
        )
        .await;
    assert_eq!(forged.status, 401);
    let malformed = receiver
        .post_webhook("demo", &signed("not json"), "not json")
        .await;
    assert_eq!(malformed.status, 400);
    let missing_id = receiver
        .post_webhook("demo", &signed(r#"{"type":"t"}"#), r#"{"type":"t"}"#)
        .await;
    assert_eq!(missing_id.status, 400);
    let too_large = receiver
        .post_webhook("demo", &[], vec![b'x'; 2 * 1024 * 1024])
        .await;
    assert_eq!(too_large.status, 413);
    // Not a configured provider's path: nothing to record against.
    let unknown = receiver.post_webhook("nobody", &[], "{}").await;
    assert_eq!(unknown.status, 404);
    // Accepted deliveries are not refusals.
    let body = r#"{"id":"evt-2","type":"t"}"#;
    assert_eq!(
        receiver
            .post_webhook("demo", &signed(body), body)
            .await
            .status,
        200
    );

    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "four refusals are recorded",
        "SELECT count(*) AS n FROM inbox_rejections",
        4,
        Duration::from_secs(10),
    )
    .await;
    let rows = rows(&mut conn).await;
    let causes: Vec<(&str, i16)> = rows.iter().map(|r| (r.cause.as_str(), r.status)).collect();
    assert_eq!(
        causes,
        [
            ("invalid_signature", 401),
            ("invalid_body", 400),
            ("missing_event_id", 400),
            ("body_too_large", 413)
        ]
    );
    assert!(rows.iter().all(|r| r.provider == "demo"));
    let forged_row = &rows[0];
    assert_eq!(
        Some(forged_row.request_id.as_str()),
        forged.header("x-request-id"),
        "the row names the answer's request id"
    );
    assert_eq!(forged_row.body_bytes, forged_body.len() as i64);
    assert_eq!(
        forged_row.body_sha256.as_deref(),
        Some(Sha256::digest(forged_body).as_slice())
    );
    assert_eq!(forged_row.headers["x-delivery"], "d-1");
    assert!(forged_row.headers.get("authorization").is_none());
    let everything =
        serde_json::to_string(&rows.iter().map(|r| &r.headers).collect::<Vec<_>>()).unwrap();
    assert!(!everything.contains("4242") && !everything.contains("hunter2"));
    assert!(!everything.contains(DEMO_SECRET));
    // Refused before its body was read: the declared size, no hash.
    assert_eq!(rows[3].body_bytes, 2 * 1024 * 1024);
    assert_eq!(rows[3].body_sha256, None);
    wait_until(
        "the recorded refusals are counted",
        Duration::from_secs(5),
        async || {
            receiver
                .metric(r#"inbox_receiver_rejections_recorded_total{provider="demo"}"#)
                .await
                == 4.0
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refusals_is_recorded_within_the_rate_and_the_rest_counted() {
    let db = TestDatabase::new().await;
    let mut args = serve_args(&db, IngestMode::GroupCommit);
    args.rejections_per_second = 3;
    let receiver = TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;
    let started = Instant::now();
    let sent = 60;
    for n in 0..sent {
        let body = format!(r#"{{"id":"evt-{n}","type":"t"}}"#);
        let answer = receiver
            .post_webhook(
                "demo",
                &[("x-signature".to_owned(), "sha256=00".to_owned())],
                body,
            )
            .await;
        assert_eq!(answer.status, 401);
    }
    let seconds = started.elapsed().as_secs() as i64 + 1;
    let mut conn = db.connect().await;
    let limited =
        r#"inbox_receiver_rejections_unrecorded_total{provider="demo",reason="rate_limited"}"#;
    wait_until(
        "every refusal is recorded or counted",
        Duration::from_secs(10),
        async || {
            let recorded = count(&mut conn, "SELECT count(*) AS n FROM inbox_rejections").await;
            recorded + receiver.metric(limited).await as i64 == sent
        },
    )
    .await;
    let recorded = count(&mut conn, "SELECT count(*) AS n FROM inbox_rejections").await;
    assert!(
        recorded >= 3,
        "the first second's refusals are kept: {recorded}"
    );
    assert!(
        recorded <= 3 * seconds,
        "{recorded} rows in {seconds} s at 3 a second"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trimming_deletes_rows_past_the_age_then_beyond_the_count_in_bounded_batches() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    diesel::sql_query(
        "INSERT INTO inbox_rejections (at, provider, cause, status, request_id, body_bytes) \
         SELECT now() - CASE WHEN n <= 5 THEN interval '30 days' ELSE interval '1 minute' END, \
                'demo', 'invalid_signature', 401, 'r-' || n, 10 \
         FROM generate_series(1, 12) AS n",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let fortnight = Duration::from_secs(14 * 86_400);
    let deleted = inbox_core::rejections::trim(&mut conn, fortnight, 100, 2)
        .await
        .unwrap();
    assert_eq!(deleted, 2, "one batch at most");
    while inbox_core::rejections::trim(&mut conn, fortnight, 100, 2)
        .await
        .unwrap()
        > 0
    {}
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_rejections").await,
        7,
        "the five older than the age are gone"
    );
    while inbox_core::rejections::trim(&mut conn, fortnight, 3, 100)
        .await
        .unwrap()
        > 0
    {}
    let kept: Vec<String> = rows(&mut conn)
        .await
        .into_iter()
        .map(|r| r.request_id)
        .collect();
    assert_eq!(kept, ["r-10", "r-11", "r-12"], "the newest three are kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_rejections_lists_them_grouped_by_cause_for_a_provider_and_since_a_time() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    diesel::sql_query(
        "INSERT INTO inbox_rejections (at, provider, cause, status, request_id, body_bytes) VALUES \
           ('2026-11-30T01:00:00Z', 'stripe', 'stale_timestamp', 401, 'r-old', 10), \
           ('2026-12-01T02:00:00Z', 'stripe', 'invalid_signature', 401, 'r-1', 10), \
           ('2026-12-01T02:05:00Z', 'stripe', 'invalid_signature', 401, 'r-2', 10), \
           ('2026-12-01T02:10:00Z', 'stripe', 'invalid_body', 400, 'r-3', 10), \
           ('2026-12-01T02:20:00Z', 'github', 'invalid_signature', 401, 'r-gh', 10)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let (ok, out) = operator(
        &db,
        &[
            "rejections",
            "--provider",
            "stripe",
            "--since",
            "2026-12-01T00:00:00Z",
        ],
    );
    assert!(ok, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two causes: {out}");
    assert!(lines[0].starts_with("provider"), "{out}");
    let first: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        first,
        [
            "stripe",
            "invalid_signature",
            "401",
            "2",
            "2026-12-01T02:00:00Z",
            "2026-12-01T02:05:00Z",
            "r-2"
        ]
    );
    assert!(
        lines[2].contains("invalid_body") && lines[2].contains("r-3"),
        "{out}"
    );
    assert!(
        !out.contains("github") && !out.contains("stale_timestamp"),
        "{out}"
    );
    let (ok, all) = operator(&db, &["rejections"]);
    assert!(
        ok && all.contains("github") && all.contains("stale_timestamp"),
        "{all}"
    );
    let (ok, help) = operator(&db, &["rejections", "--help"]);
    assert!(
        ok && help.contains("grouped by provider and cause"),
        "{help}"
    );
}

fn operator(db: &TestDatabase, args: &[&str]) -> (bool, String) {
    let output = std::process::Command::new(inbox_tests::chaos::bin_dir().join("worker"))
        .args(args)
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

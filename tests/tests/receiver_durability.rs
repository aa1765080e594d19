//! Acked means durable: the receiver answers 2xx only after the row is committed, and 503 with
//! Retry-After whenever the database cannot confirm the write in time (down, stalled past the
//! deadline, pool exhausted); it recovers by itself when the database returns.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use futures_util::future::join_all;
use inbox_core::db::DatabaseArgs;
use inbox_tests::*;
use receiver::ingest::IngestMode;
use serde_json::json;
use test_db::TestDatabase;

/// A PostgreSQL server of this test's own, so it can be killed without disturbing the other
/// tests' shared server. Dropping it kills the server and removes its folder, pass or fail.
struct OwnPostgres {
    name: String,
    url: String,
}

impl OwnPostgres {
    fn script() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/local-postgres")
    }

    fn folder(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/postgres")
            .join(name)
    }

    async fn run(command: &str, name: &str, extra: &[&str]) -> String {
        let output = tokio::process::Command::new(Self::script())
            .arg(command)
            .arg(name)
            .args(extra)
            .output()
            .await
            .unwrap();
        assert!(
            output.status.success(),
            "local-postgres {command} {name} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    }

    /// Starts a new server. The `dev` profile, not `test`: `test` turns synchronous_commit
    /// off, so a killed server would lose commits it had confirmed, and this test is about
    /// exactly those.
    async fn start() -> Self {
        let unique = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let mut server = Self {
            name: format!("recv-durable-{}-{unique}", std::process::id()),
            url: String::new(),
        };
        // Assigned after the guard exists, so a failed start is cleaned up too.
        server.url = Self::run("start", &server.name, &["dev"]).await;
        server
    }

    /// Stops it abruptly: immediate shutdown, no checkpoint, connections cut.
    async fn kill(&self) {
        Self::run("kill", &self.name, &[]).await;
    }

    async fn restart(&self) {
        Self::run("restart", &self.name, &[]).await;
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new(Self::script())
            .args(["kill", &self.name])
            .output();
        let _ = std::fs::remove_dir_all(Self::folder(&self.name));
    }
}

/// One answer seen by the load generator.
#[derive(Debug, Clone)]
struct Delivery {
    event_id: String,
    status: u16,
    retry_after: Option<String>,
}

async fn deliver(receiver: &TestReceiver, event_id: &str) -> Delivery {
    let body = json!({"id": event_id, "type": "load"}).to_string();
    let signature = demo_signature(body.as_bytes(), DEMO_SECRET);
    let answer = receiver
        .post_webhook("demo", &[("x-signature".to_owned(), signature)], body)
        .await;
    Delivery {
        event_id: event_id.to_owned(),
        status: answer.status,
        retry_after: answer.header("retry-after").map(str::to_owned),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_event_survives_the_database_being_killed_and_restarted_under_load() {
    let postgres = OwnPostgres::start().await;
    inbox_core::db::run_migrations(&postgres.url).await.unwrap();
    let mut args = serve_args_for_database(
        DatabaseArgs {
            db_pool_size: 4,
            db_connect_timeout: Duration::from_millis(500),
            ..DatabaseArgs::for_url(postgres.url.clone())
        },
        IngestMode::GroupCommit,
    );
    args.db_deadline = Duration::from_secs(1);
    let receiver = Arc::new(
        TestReceiver::start(
            args,
            providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
        )
        .await,
    );

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::<Delivery>::new()));
    let senders: Vec<_> = (0..8)
        .map(|sender| {
            let (receiver, stop, acked, refused, seen) = (
                Arc::clone(&receiver),
                Arc::clone(&stop),
                Arc::clone(&acked),
                Arc::clone(&refused),
                Arc::clone(&seen),
            );
            tokio::spawn(async move {
                // Bounded: the test ends by itself even if a phase never comes.
                for n in 0..20_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let delivery = deliver(&receiver, &format!("evt-{sender}-{n}")).await;
                    match delivery.status {
                        200 => acked.fetch_add(1, Ordering::Relaxed),
                        _ => refused.fetch_add(1, Ordering::Relaxed),
                    };
                    seen.lock().unwrap().push(delivery);
                }
            })
        })
        .collect();

    let load = Duration::from_secs(30);
    wait_until("200 events are acked", load, async || {
        acked.load(Ordering::Relaxed) >= 200
    })
    .await;
    postgres.kill().await;
    let killed_at = Instant::now();
    wait_until(
        "deliveries are refused with the database down",
        load,
        async || refused.load(Ordering::Relaxed) >= 20,
    )
    .await;
    wait_until("not ready while the database is down", load, async || {
        receiver.get("/readyz").await.status == 503
    })
    .await;
    assert_eq!(
        receiver.get("/healthz").await.status,
        200,
        "alive all the same"
    );
    let acked_before_restart = acked.load(Ordering::Relaxed);
    postgres.restart().await;
    wait_until(
        "deliveries are acked again, without any help",
        load,
        async || acked.load(Ordering::Relaxed) >= acked_before_restart + 200,
    )
    .await;
    let outage = killed_at.elapsed();
    stop.store(true, Ordering::Relaxed);
    for sender in senders {
        sender.await.unwrap();
    }
    // Readiness answers from a check at most a second old: ready again within it.
    wait_until("ready again", Duration::from_secs(5), async || {
        receiver.get("/readyz").await.status == 200
    })
    .await;

    let seen = seen.lock().unwrap().clone();
    for delivery in &seen {
        match delivery.status {
            200 => {}
            503 => assert!(delivery.retry_after.is_some(), "503 without Retry-After"),
            other => panic!("{} was answered {other}", delivery.event_id),
        }
    }
    let acked_ids: HashSet<&str> = seen
        .iter()
        .filter(|delivery| delivery.status == 200)
        .map(|delivery| delivery.event_id.as_str())
        .collect();
    let mut conn = AsyncPgConnection::establish(&postgres.url).await.unwrap();
    let stored: HashSet<String> = stored_events(&mut conn, "demo")
        .await
        .into_iter()
        .map(|event| event.event_id)
        .collect();
    let lost: Vec<&&str> = acked_ids
        .iter()
        .filter(|id| !stored.contains(**id))
        .collect();
    assert!(lost.is_empty(), "acked but not stored: {lost:?}");
    let refused = seen.iter().filter(|d| d.status == 503).count();
    eprintln!(
        "{} deliveries: {} acked, {refused} refused with 503; outage to recovery {outage:?}",
        seen.len(),
        acked_ids.len()
    );
}

/// Starts a receiver whose only pooled connection, and every insert, will wait behind a lock
/// the test holds.
async fn stalled_receiver(db: &TestDatabase, mode: IngestMode) -> TestReceiver {
    let mut args = serve_args(db, mode);
    args.db = db.args(1);
    args.db_deadline = Duration::from_millis(700);
    args.commit_writers = 1;
    args.retry_after_secs = 7;
    TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await
}

async fn a_stalled_database_is_answered_503_and_recovered_from(mode: IngestMode) {
    let db = TestDatabase::new().await;
    let receiver = stalled_receiver(&db, mode).await;
    // Warm the pool so the stall, not the first connect, is what the requests wait for.
    assert_eq!(deliver(&receiver, "evt-warm").await.status, 200);

    let mut locker = db.connect().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE webhook_inbox IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let started = Instant::now();
    let stalled = join_all((0..4).map(|n| {
        let receiver = &receiver;
        async move { deliver(receiver, &format!("evt-stalled-{n}")).await }
    }))
    .await;
    let waited = started.elapsed();
    for delivery in &stalled {
        assert_eq!(delivery.status, 503, "{delivery:?}");
        assert_eq!(delivery.retry_after.as_deref(), Some("7"));
    }
    assert!(waited < Duration::from_secs(3), "503s took {waited:?}");
    let page = receiver.metrics().await;
    let errors = |kind: &str| {
        metric_value(
            &page,
            &format!("inbox_receiver_db_errors_total{{kind=\"{kind}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(
        errors("deadline") + errors("no_connection") >= 1.0,
        "{page}"
    );
    if mode == IngestMode::PerRequest {
        // Three requests found the only connection taken by the first one.
        assert!(errors("no_connection") >= 1.0, "{page}");
    }

    locker.batch_execute("COMMIT").await.unwrap();
    let mut attempt = 0;
    wait_until(
        "deliveries are acked again",
        Duration::from_secs(10),
        async || {
            attempt += 1;
            deliver(&receiver, &format!("evt-after-{attempt}"))
                .await
                .status
                == 200
        },
    )
    .await;
    // The providers' retries of the refused deliveries are harmless: accepted, or duplicate
    // when the stalled write did land after its 503.
    for n in 0..4 {
        let retry = deliver(&receiver, &format!("evt-stalled-{n}")).await;
        assert_eq!(retry.status, 200, "{retry:?}");
    }
    let mut conn = db.connect().await;
    let stored = stored_events(&mut conn, "demo").await;
    assert!(stored.iter().any(|event| event.event_id == "evt-stalled-3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_stalled_past_the_deadline_is_answered_503_per_request_and_recovered_from() {
    a_stalled_database_is_answered_503_and_recovered_from(IngestMode::PerRequest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_stalled_past_the_deadline_is_answered_503_with_group_commit_and_recovered_from()
{
    a_stalled_database_is_answered_503_and_recovered_from(IngestMode::GroupCommit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_whose_database_is_unreachable_is_alive_not_ready_and_acks_nothing() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut args = serve_args_for_database(
        DatabaseArgs {
            db_pool_size: 2,
            db_connect_timeout: Duration::from_millis(300),
            ..DatabaseArgs::for_url(format!("postgres://postgres@127.0.0.1:{port}/inbox"))
        },
        IngestMode::GroupCommit,
    );
    args.db_deadline = Duration::from_millis(500);
    let receiver = TestReceiver::start(
        args,
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;

    assert_eq!(receiver.get("/healthz").await.status, 200);
    let ready = receiver.get("/readyz").await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.header("retry-after"), Some("1"));
    let started = Instant::now();
    let delivery = deliver(&receiver, "evt-nowhere").await;
    assert_eq!(
        (delivery.status, delivery.retry_after.as_deref()),
        (503, Some("1"))
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

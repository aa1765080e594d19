//! Harness for end-to-end tests: a receiver and workers started in-process on a test
//! database of their own, and helpers to sign requests and wait for conditions.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used)] // test support: failures should stop the test loudly

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use diesel::sql_types::BigInt;
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::BackoffPolicy;
use receiver::ingest::IngestMode;
use receiver::providers::Providers;
use receiver::server::{RunningReceiver, ServeArgs};
use test_db::TestDatabase;
use tokio::sync::watch;
use worker::metrics::Metrics as WorkerMetrics;
use worker::{Router, Worker, WorkerSettings};

/// Secret of the `demo` provider in [`DEMO_PROVIDERS`].
pub const DEMO_SECRET: &str = "test-secret-one";

/// A provider file with one generic HMAC provider, `demo`.
pub const DEMO_PROVIDERS: &str = r#"
[providers.demo]
scheme = "hmac-sha256"
signature_header = "X-Signature"
encoding = "hex"
prefix = "sha256="
event_id = { json_pointer = "/id" }
event_type = { json_pointer = "/type" }
secrets = [{ env = "DEMO_SECRET", name = "current" }]
"#;

/// Parses a provider file whose secrets come from `env` (name, value) pairs.
pub fn providers(toml: &str, env: &[(&str, &str)]) -> Providers {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Providers::parse(toml, Path::new("test-providers.toml"), &move |name| {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    })
    .unwrap()
}

/// `serve` flags for tests: ephemeral loopback ports, short deadlines.
pub fn serve_args(db: &TestDatabase, mode: IngestMode) -> ServeArgs {
    ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        config: "unused.toml".into(),
        ingest_mode: mode,
        max_batch: 256,
        commit_writers: 4,
        db_deadline: Duration::from_secs(3),
        max_body_bytes: 1024 * 1024,
        body_timeout: Duration::from_secs(2),
        retry_after_secs: 1,
        shutdown_timeout: Duration::from_secs(5),
        http_workers: Some(2),
        db: db.args(8),
    }
}

/// A receiver running in this process.
#[derive(Debug)]
pub struct TestReceiver {
    /// The running servers.
    pub running: RunningReceiver,
    /// HTTP client.
    pub client: reqwest::Client,
}

impl TestReceiver {
    /// Starts a receiver for the `demo` provider.
    pub async fn demo(db: &TestDatabase) -> Self {
        Self::start(
            serve_args(db, IngestMode::GroupCommit),
            providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
        )
        .await
    }

    /// Starts a receiver with these flags and providers.
    pub async fn start(args: ServeArgs, providers: Providers) -> Self {
        let running = receiver::server::start(&args, providers).await.unwrap();
        Self {
            running,
            client: reqwest::Client::new(),
        }
    }

    /// `http://addr{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.running.addr, path)
    }

    /// Posts `body` to the `demo` provider, signed with `secret`.
    pub async fn post_demo(&self, body: &str, secret: &str) -> (u16, serde_json::Value) {
        let response = self
            .client
            .post(self.url("/webhooks/demo"))
            .header("content-type", "application/json")
            .header("x-signature", demo_signature(body.as_bytes(), secret))
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let json = response.json().await.unwrap_or(serde_json::Value::Null);
        (status, json)
    }

    /// The metrics page.
    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("http://{}/metrics", self.running.metrics_addr))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// The `X-Signature` value of the demo provider, computed independently of the receiver.
pub fn demo_signature(body: &[u8], secret: &str) -> String {
    let scheme = inbox_signature::Scheme::HmacSha256(inbox_signature::GenericHmac {
        header: "X-Signature".into(),
        encoding: inbox_signature::DigestEncoding::Hex,
        prefix: Some("sha256=".into()),
    });
    let key = scheme.key_from_secret(secret).unwrap();
    scheme.sign(&key, body, "", 0).remove(0).1
}

/// Worker settings for tests: short leases, fast polling, quick retries.
pub fn worker_settings(name: &str) -> WorkerSettings {
    WorkerSettings {
        name: name.to_owned(),
        lease: Duration::from_secs(10),
        concurrency: 8,
        batch_size: 50,
        poll_interval: Duration::from_millis(50),
        rescue_interval: Duration::from_millis(200),
        handler_timeout: Duration::from_secs(5),
        backoff: BackoffPolicy {
            base: Duration::from_millis(5),
            cap: Duration::from_millis(20),
            max_attempts: 3,
        },
    }
}

/// A worker running in the background until stopped.
#[derive(Debug)]
pub struct RunningWorker {
    /// The worker (for its metrics and waker).
    pub worker: Worker,
    /// Its metrics.
    pub metrics: WorkerMetrics,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningWorker {
    /// Starts a worker on `db` with its own pool.
    pub fn start(db: &TestDatabase, router: Router, settings: WorkerSettings) -> Self {
        let metrics = WorkerMetrics::new();
        let worker = Worker::new(db.pool(10), router, settings, metrics.clone());
        let (stop, stopped) = watch::channel(false);
        let task = {
            let worker = worker.clone();
            tokio::spawn(async move { worker.run(stopped).await })
        };
        Self {
            worker,
            metrics,
            stop,
            task,
        }
    }

    /// Asks it to stop and waits until it has.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap();
    }
}

/// A router that sends everything to the demo ledger handler.
pub fn demo_router() -> Router {
    Router::new().route(None, None, Arc::new(worker::demo::DemoLedger))
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Runs a `SELECT count(*) AS n ...`-style query returning one bigint column named `n`.
pub async fn count(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    let rows: Vec<Count> = diesel::sql_query(sql).load(conn).await.unwrap();
    rows.iter().map(|row| row.n).sum()
}

/// Polls `condition` every 20 ms until it holds; panics with `what` after `timeout`.
pub async fn wait_until(what: &str, timeout: Duration, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

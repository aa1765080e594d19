//! Harness for end-to-end tests: a receiver and workers started in-process on a test
//! database of their own, and helpers to sign requests and wait for conditions.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used)] // test support: failures should stop the test loudly

pub mod chaos;
pub mod pgbouncer;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use diesel::sql_types::BigInt;
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::inbox::{complete_all_keyed, ClaimedEvent, KeyLocks, TransitionError};
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
    serve_args_for_database(db.args(8), mode)
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
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Worker settings for tests: short leases, fast polling, quick retries.
pub fn worker_settings(name: &str) -> WorkerSettings {
    WorkerSettings {
        name: name.to_owned(),
        lease: Duration::from_secs(10),
        concurrency: 8,
        batch_size: 50,
        transaction_size: 10,
        claimers: 2,
        poll_interval: Duration::from_millis(50),
        claim_spacing: Duration::from_millis(5),
        rescue_interval: Duration::from_millis(200),
        handler_timeout: Duration::from_secs(5),
        database_limits: worker::limits::DatabaseLimits::default(),
        backoff: BackoffPolicy {
            base: Duration::from_millis(5),
            cap: Duration::from_millis(20),
            max_attempts: 3,
        },
        shutdown_grace: Duration::from_secs(10),
        heartbeat: true,
        stats_interval: Duration::from_millis(200),
        retention: None,
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
        Self::start_on(&db.args(10), router, settings)
    }

    /// Starts a worker on any database (a multi-host URL, say), with a pool of its own.
    pub fn start_on(
        database: &inbox_core::db::DatabaseArgs,
        router: Router,
        settings: WorkerSettings,
    ) -> Self {
        let metrics = WorkerMetrics::new();
        let worker = Worker::new(database, router, settings, metrics.clone()).unwrap();
        let (stop, stopped) = watch::channel(false);
        // As in the binary: new events wake the worker through LISTEN/NOTIFY.
        tokio::spawn(worker::listener::listen_for_new_events(
            database.connection_settings().unwrap(),
            worker.waker(),
            stopped.clone(),
        ));
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

    /// Asks it to stop, waits until it has, and hands back its metrics: counters move just
    /// after each commit, so they are final only once the worker has stopped.
    pub async fn stop(self) -> WorkerMetrics {
        let _ = self.stop.send(true);
        self.task.await.unwrap();
        self.metrics
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

/// Completes `ids`, claimed under `token` by a worker `w1` with leases of 30 s, as the worker
/// completes ordered events it runs alone: the completion takes its keys' locks and returns the
/// events it hands on, claimed under `token`.
pub async fn complete_keyed(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    token: uuid::Uuid,
) -> Result<Vec<ClaimedEvent>, TransitionError> {
    complete_all_keyed(
        conn,
        ids,
        token,
        "w1",
        Duration::from_secs(30),
        KeyLocks::Take,
    )
    .await
}

/// Runs a `SELECT count(*) AS n ...`-style query returning one bigint column named `n`.
pub async fn count(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    let rows: Vec<Count> = diesel::sql_query(sql).load(conn).await.unwrap();
    rows.iter().map(|row| row.n).sum()
}

/// Polls the one-bigint-column query `sql` (see [`count`]) until it returns `expected`;
/// panics with `what` after `timeout`.
pub async fn wait_for_count(
    conn: &mut AsyncPgConnection,
    what: &str,
    sql: &str,
    expected: i64,
    timeout: Duration,
) {
    wait_until(what, timeout, async || count(conn, sql).await == expected).await;
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

// ---------------------------------------------------------------------------------------------
// Receiver test helpers: signed and raw requests, stored rows, metrics, clocks, temp folders.
// ---------------------------------------------------------------------------------------------

/// `serve` flags for tests against any database (not only a [`TestDatabase`]): ephemeral
/// loopback ports, short deadlines.
pub fn serve_args_for_database(
    database: inbox_core::db::DatabaseArgs,
    mode: IngestMode,
) -> ServeArgs {
    ServeArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        config: "unused.toml".into(),
        ingest_mode: mode,
        max_batch: 256,
        commit_writers: 4,
        notify_spacing: Duration::from_millis(2),
        db_deadline: Duration::from_secs(3),
        max_body_bytes: 1024 * 1024,
        max_head_bytes: receiver::server::DEFAULT_MAX_HEAD_BYTES,
        max_body_bytes_in_flight: receiver::server::DEFAULT_MAX_BODY_BYTES_IN_FLIGHT,
        max_connections: receiver::server::DEFAULT_MAX_CONNECTIONS,
        max_batch_bytes: receiver::server::DEFAULT_MAX_BATCH_BYTES,
        head_timeout: Duration::from_secs(5),
        body_timeout: Duration::from_secs(2),
        retry_after_secs: 1,
        shutdown_timeout: Duration::from_secs(5),
        rejections_per_second: 10,
        rejections_max_age: Duration::from_secs(14 * 86_400),
        rejections_max_rows: 100_000,
        http_workers: Some(2),
        db: database,
    }
}

/// An HTTP answer, with the headers a test looks at.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// Response headers (lowercase names).
    pub headers: Vec<(String, String)>,
    /// The body, parsed as JSON (`Null` when it is not JSON).
    pub json: serde_json::Value,
    /// The body as received.
    pub body: Vec<u8>,
}

impl Answer {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(candidate, _)| candidate.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

impl TestReceiver {
    /// Posts `body` to `/webhooks/{provider}` with exactly these extra headers.
    pub async fn post_webhook(
        &self,
        provider: &str,
        headers: &[(String, String)],
        body: impl Into<Vec<u8>>,
    ) -> Answer {
        let mut request = self.client.post(self.url(&format!("/webhooks/{provider}")));
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str());
        }
        Answer::from_response(request.body(body.into()).send().await.unwrap()).await
    }

    /// `GET` on the webhook listener.
    pub async fn get(&self, path: &str) -> Answer {
        Answer::from_response(self.client.get(self.url(path)).send().await.unwrap()).await
    }

    /// The value of one series of the metrics page, e.g.
    /// `inbox_receiver_requests_total{outcome="accepted",provider="demo"}` (0 when absent).
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics().await, series).unwrap_or(0.0)
    }
}

impl Answer {
    /// Reads a reqwest response whole.
    pub async fn from_response(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        let bytes = response.bytes().await.unwrap_or_default();
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        Self {
            status,
            headers,
            json,
            body: bytes.to_vec(),
        }
    }
}

/// The value of `series` (name and labels exactly as exposed) on a Prometheus text page.
pub fn metric_value(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    })
}

/// The current unix time in seconds.
pub fn unix_now() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(now.as_secs()).unwrap()
}

/// The catalog's scheme `name` with its defaults.
pub fn scheme(name: &str) -> std::sync::Arc<dyn inbox_signature::Scheme> {
    inbox_signature::providers::build(name, &inbox_signature::providers::Options::default())
        .unwrap()
}

/// The headers `scheme` signs `body` with, using `secret` (as configured) at `timestamp`.
pub fn signed_headers(
    scheme: &dyn inbox_signature::Scheme,
    secret: &str,
    body: &[u8],
    id: &str,
    timestamp: i64,
) -> Vec<(String, String)> {
    signed_request(scheme, secret, "", body, id, timestamp).headers
}

/// What `scheme` sends for `body` to `url` with `secret` at `timestamp`: headers, and the
/// body (changed by the schemes that sign inside it).
pub fn signed_request(
    scheme: &dyn inbox_signature::Scheme,
    secret: &str,
    url: &str,
    body: &[u8],
    id: &str,
    timestamp: i64,
) -> inbox_signature::Signed {
    let key = scheme.key_from_secret(secret).unwrap();
    let message = inbox_signature::Outgoing {
        method: "POST",
        url,
        body,
        id,
        timestamp,
    };
    scheme.sign(&key, &message).unwrap()
}

/// A stored inbox row, as a test inspects it.
#[derive(Debug, Clone, QueryableByName)]
pub struct StoredEvent {
    /// The provider's event id.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub event_id: String,
    /// The provider's event type.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub event_type: Option<String>,
    /// The stored headers.
    #[diesel(sql_type = diesel::sql_types::Jsonb)]
    pub headers: serde_json::Value,
    /// The exact body bytes.
    #[diesel(sql_type = diesel::sql_types::Bytea)]
    pub body: Vec<u8>,
}

/// Every row of `provider`, ordered by event id.
pub async fn stored_events(conn: &mut AsyncPgConnection, provider: &str) -> Vec<StoredEvent> {
    diesel::sql_query(
        "SELECT event_id, event_type, headers, body FROM webhook_inbox \
         WHERE provider = $1 ORDER BY event_id",
    )
    .bind::<diesel::sql_types::Text, _>(provider)
    .load(conn)
    .await
    .unwrap()
}

/// The row of `(provider, event_id)`, if stored.
pub async fn stored_event(
    conn: &mut AsyncPgConnection,
    provider: &str,
    event_id: &str,
) -> Option<StoredEvent> {
    stored_events(conn, provider)
        .await
        .into_iter()
        .find(|event| event.event_id == event_id)
}

/// A raw HTTP/1.1 exchange: writes `request` as is and reads the answer until the server
/// closes the connection or the answer's Content-Length is complete. For requests no HTTP
/// client would send (bad bytes, stalls, lies about lengths).
pub async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> RawAnswer {
    use tokio::io::AsyncWriteExt as _;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before taking everything (413); what matters is the answer.
    let _ = stream.write_all(request).await;
    read_raw_answer(&mut stream).await
}

/// An answer read off a raw connection.
#[derive(Debug, Clone)]
pub struct RawAnswer {
    /// Status code (0 when the connection closed without an answer).
    pub status: u16,
    /// The status line and headers.
    pub head: String,
    /// The body bytes.
    pub body: Vec<u8>,
}

impl RawAnswer {
    /// The value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (candidate, value) = line.split_once(':')?;
            candidate
                .trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim())
        })
    }
}

/// Reads one HTTP/1.1 answer from `stream` (bounded by 10 s).
pub async fn read_raw_answer(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> RawAnswer {
    use tokio::io::AsyncReadExt as _;
    let mut received = Vec::new();
    let read = async {
        let mut buffer = [0_u8; 8192];
        loop {
            if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&received[..end]).into_owned();
                let length = head.lines().find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.trim()
                        .eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                });
                if length.is_some_and(|length| received.len() >= end + 4 + length) {
                    return;
                }
            }
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    let end = received
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(received.len());
    let head = String::from_utf8_lossy(&received[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = received.get(end + 4..).unwrap_or_default().to_vec();
    RawAnswer { status, head, body }
}

/// A new empty folder under the system's temporary folder, named after `label`.
pub fn temp_folder(label: &str) -> std::path::PathBuf {
    let unique = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let path = std::env::temp_dir().join(format!("{label}-{}-{unique}", std::process::id()));
    std::fs::create_dir_all(&path).unwrap();
    path
}

//! Chaos scenarios: the real `receiver` and `worker` binaries as processes, on a PostgreSQL
//! server of the scenario's own, under the provider simulator's traffic, while a seeded
//! timeline kills workers and receivers with SIGKILL and stops the database abruptly; then
//! the design's invariants are checked by querying the database, those of ordered processing
//! on the demo handler's trace ([`ordered`]).
//!
//! The binaries come from `INBOX_BIN_DIR`, or else from the target folder the running test
//! was built into: build them first (`cargo build --workspace --bins`; `make test` does).
//! `CHAOS_SEED` replaces a scenario's seed (its plan and its timeline; the moments of the
//! answers are the machine's).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Double, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::BackoffPolicy;
use inbox_simulator::{Fate, Mix, Plan, Progress, Report, RetryPolicy, SendSettings};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub mod ordered;

/// The providers of every scenario: the original six schemes, Stripe with two secrets
/// (rotation), and the other families and shapes: Ed25519 (Discord, with its PING handshake),
/// ECDSA P-256 batches (SendGrid), static credentials (GitLab), HMAC inside batch items with a
/// fixed answer (Adyen), a signed URL (Twilio, HubSpot batches), a handshake (Twitch) and
/// batches keyed by content (Meta); and an ordered provider (`ordered`: one event of an
/// order at a time, in version order, late versions marked stale), whose events the simulator
/// plans as several versions of each order.
pub const PROVIDERS: &str = r#"
[providers.stripe]
scheme = "stripe"
secrets = [{ env = "CHAOS_STRIPE_SECRET", name = "current" }, { env = "CHAOS_STRIPE_PREVIOUS", name = "previous" }]

[providers.github]
scheme = "github"
secrets = [{ env = "CHAOS_GITHUB_SECRET" }]

[providers.svix]
scheme = "standard-webhooks"
secrets = [{ env = "CHAOS_SVIX_SECRET" }]

[providers.shopify]
scheme = "shopify"
secrets = [{ env = "CHAOS_SHOPIFY_SECRET" }]

[providers.slack]
scheme = "slack"
secrets = [{ env = "CHAOS_SLACK_SECRET" }]

[providers.demo]
scheme = "hmac-sha256"
signature_header = "X-Signature"
encoding = "hex"
prefix = "sha256="
event_id = { json_pointer = "/id" }
event_type = { json_pointer = "/type" }
secrets = [{ env = "CHAOS_DEMO_SECRET" }]

[providers.discord]
scheme = "discord"
secrets = [{ env = "CHAOS_ED25519_KEY" }]

[providers.sendgrid]
scheme = "sendgrid"
secrets = [{ env = "CHAOS_P256_KEY" }]

[providers.gitlab]
scheme = "gitlab"
secrets = [{ env = "CHAOS_GITLAB_TOKEN" }]

[providers.adyen]
scheme = "adyen"
secrets = [{ env = "CHAOS_ADYEN_KEY" }]

[providers.twilio]
scheme = "twilio"
secrets = [{ env = "CHAOS_TWILIO_TOKEN" }]

[providers.hubspot]
scheme = "hubspot"
secrets = [{ env = "CHAOS_HUBSPOT_SECRET" }]

[providers.twitch]
scheme = "twitch"
secrets = [{ env = "CHAOS_TWITCH_SECRET" }]

[providers.meta]
scheme = "meta"
secrets = [{ env = "CHAOS_META_SECRET" }]

[providers.ordered]
scheme = "hmac-sha256"
signature_header = "X-Signature"
encoding = "hex"
prefix = "sha256="
event_id = { json_pointer = "/id" }
event_type = { json_pointer = "/type" }
secrets = [{ env = "CHAOS_ORDERED_SECRET" }]

[providers.ordered.ordering]
key = { json_pointer = "/data/order_id" }
sequence = { json_pointer = "/data/version" }
reorder_window = "250ms"
on_stale = "mark"
"#;

/// The secrets of [`PROVIDERS`], as environment variables of the receivers.
pub const SECRETS: [(&str, &str); 16] = [
    ("CHAOS_STRIPE_SECRET", "whsec_chaos_stripe_current"),
    ("CHAOS_STRIPE_PREVIOUS", "whsec_chaos_stripe_previous"),
    ("CHAOS_GITHUB_SECRET", "chaos github secret"),
    (
        "CHAOS_SVIX_SECRET",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ),
    ("CHAOS_SHOPIFY_SECRET", "chaos-shopify-secret"),
    ("CHAOS_SLACK_SECRET", "8f742231b10e8888abcd99yyyzzz85a5"),
    ("CHAOS_DEMO_SECRET", "chaos-demo-secret"),
    // RFC 8032 section 7.1 test 1's secret key: the simulator signs with it, the receiver
    // verifies with its public half.
    (
        "CHAOS_ED25519_KEY",
        "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJ1hsZ3v/VpguoRK9JLsLMREScVpezJpGXA7rAMcrn9g\n-----END PRIVATE KEY-----",
    ),
    (
        "CHAOS_P256_KEY",
        "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQga7zR+NutwVfbD0B5\n1+Jh3Y1es9NUGsUnzeWQdHTTI2ahRANCAAT0bJYaJbgrlPSVLxOSuCNqTA1m/n++\nhZjulFPmW+ifVGEIpdf2+4GgTyjlArQViME6BFk87FS6Uj4ViBAAzuBp\n-----END PRIVATE KEY-----",
    ),
    ("CHAOS_GITLAB_TOKEN", "chaos-gitlab-token"),
    (
        "CHAOS_ADYEN_KEY",
        "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00",
    ),
    ("CHAOS_TWILIO_TOKEN", "chaos-twilio-token"),
    ("CHAOS_HUBSPOT_SECRET", "chaos-hubspot-secret"),
    ("CHAOS_TWITCH_SECRET", "chaos-twitch-secret"),
    ("CHAOS_META_SECRET", "chaos-meta-secret"),
    ("CHAOS_ORDERED_SECRET", "chaos-ordered-secret"),
];

/// Lease of the chaos workers: short, so a killed worker's events come back quickly.
pub const LEASE: Duration = Duration::from_secs(2);

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where the `receiver` and `worker` binaries are: `INBOX_BIN_DIR`, or the profile folder
/// (`target/debug`) of the running test executable (`target/debug/deps/...`).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("INBOX_BIN_DIR") {
        return PathBuf::from(dir);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.to_owned()))
        .unwrap_or_else(|| repo_root().join("target/debug"))
}

/// The two binaries under test.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `receiver`.
    pub receiver: PathBuf,
    /// `worker`.
    pub worker: PathBuf,
}

impl Binaries {
    /// Finds them, or panics saying how to build them.
    pub fn locate() -> Self {
        let dir = bin_dir();
        let found = Self {
            receiver: dir.join("receiver"),
            worker: dir.join("worker"),
        };
        for binary in [&found.receiver, &found.worker] {
            assert!(
                binary.is_file(),
                "{} not found: build the binaries first (`cargo build --workspace --bins`, \
                 which `make test` runs), or point INBOX_BIN_DIR at the folder holding them",
                binary.display()
            );
        }
        found
    }
}

/// A PostgreSQL server of one scenario (`scripts/local-postgres`, `dev` profile: synchronous
/// commits, so an abrupt stop loses nothing that was confirmed). Dropping it stops it
/// immediately and removes its folder, pass or fail.
#[derive(Debug)]
pub struct Postgres {
    name: String,
    /// Its DATABASE_URL.
    pub url: String,
    placeholder: Option<tokio::task::JoinHandle<()>>,
}

impl Postgres {
    fn script() -> PathBuf {
        repo_root().join("scripts/local-postgres")
    }

    async fn run(
        command: &str,
        name: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<String, String> {
        let output = tokio::process::Command::new(Self::script())
            .arg(command)
            .arg(name)
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|err| format!("running local-postgres {command}: {err}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        } else {
            Err(format!(
                "local-postgres {command} {name} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    /// Runs `command`, again a few times when it fails: servers started at the same moment
    /// by concurrent tests can pick the same port, and the loser fails to bind.
    async fn run_with_retries(
        command: &str,
        name: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> String {
        let mut failures = Vec::new();
        for attempt in 0..6_u64 {
            match Self::run(command, name, extra, env).await {
                Ok(out) => return out,
                Err(err) => failures.push(err),
            }
            let pause = 200 + 300 * attempt + u64::from(std::process::id() % 200);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        panic!("{}", failures.join("\n"));
    }

    /// Starts a new server for scenario `label`.
    pub async fn start(label: &str) -> Self {
        Self::start_with(label, &[]).await
    }

    /// Starts a new server with `local-postgres` settings from `env` (`LOCAL_POSTGRES_TLS`,
    /// `LOCAL_POSTGRES_OPTIONS`).
    pub async fn start_with(label: &str, env: &[(&str, &str)]) -> Self {
        let unique = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut server = Self {
            name: format!("chaos-{label}-{}-{unique}", std::process::id()),
            url: String::new(),
            placeholder: None,
        };
        // Assigned once the guard exists, so that a failed start is cleaned up too.
        server.url = Self::run_with_retries("start", &server.name, &["dev"], env).await;
        server
    }

    /// Starts a streaming-replication standby of this server (`pg_basebackup`), known to it
    /// by the standby's name (for `synchronous_standby_names`), and waits until it streams
    /// (and, when `synchronous`, until the primary counts it as its synchronous standby).
    pub async fn start_standby(&self, synchronous: bool) -> Self {
        let mut standby = Self {
            name: format!("{}-standby", self.name),
            url: String::new(),
            placeholder: None,
        };
        standby.url = Self::run("standby", &standby.name, &[&self.name], &[])
            .await
            .unwrap_or_else(|err| panic!("{err}"));
        if synchronous {
            let mut conn = test_db::establish(&self.url)
                .await
                .unwrap_or_else(|err| panic!("{err}"));
            let sql = format!(
                "ALTER SYSTEM SET synchronous_standby_names = '\"{}\"'",
                standby.name
            );
            for statement in [sql.as_str(), "SELECT pg_reload_conf()"] {
                diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, statement)
                    .await
                    .unwrap_or_else(|err| panic!("{statement}: {err}"));
            }
        }
        let wanted = if synchronous { "sync" } else { "async" };
        let query = format!(
            "SELECT count(*) AS n FROM pg_stat_replication \
             WHERE state = 'streaming' AND sync_state = '{wanted}'"
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut conn = test_db::establish(&self.url)
                .await
                .unwrap_or_else(|err| panic!("{err}"));
            if number(&mut conn, &query).await.unwrap_or(0) == 1 {
                return standby;
            }
            assert!(
                Instant::now() < deadline,
                "the standby never became {wanted}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Promotes this standby to primary and waits until it accepts writes.
    pub async fn promote(&self) {
        Self::run("promote", &self.name, &[], &[])
            .await
            .unwrap_or_else(|err| panic!("{err}"));
    }

    /// Kills the server and its processes with SIGKILL: a crash of its machine. Its port is
    /// then held by a placeholder that closes every connection at once, so that no server
    /// started meanwhile (by another test) takes it.
    pub async fn sigkill(&mut self) {
        Self::run("sigkill", &self.name, &[], &[])
            .await
            .unwrap_or_else(|err| panic!("{err}"));
        self.hold_port();
    }

    /// Its folder (data, logs, and `tls/` when started with TLS).
    pub fn folder(&self) -> PathBuf {
        repo_root().join("target/postgres").join(&self.name)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.url
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no port in {}", self.url))
    }

    /// Stops it abruptly: immediate shutdown, no checkpoint, every connection cut. While it
    /// is down its port stays taken by a placeholder that closes every connection at once
    /// (as a stopped server's host would refuse them), so that no other test's server
    /// starting meanwhile takes the port.
    pub async fn kill(&mut self) {
        Self::run_with_retries("kill", &self.name, &[], &[]).await;
        self.hold_port();
    }

    /// Takes the stopped server's port with a listener that closes every connection.
    fn hold_port(&mut self) {
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], self.port()));
        // Reusable at once, despite the killed server's connections in TIME_WAIT.
        let listener = tokio::net::TcpSocket::new_v4()
            .and_then(|socket| {
                socket.set_reuseaddr(true)?;
                socket.bind(address)?;
                socket.listen(128)
            })
            .unwrap_or_else(|err| panic!("holding port {}: {err}", self.port()));
        self.placeholder = Some(tokio::spawn(async move {
            while let Ok((connection, _)) = listener.accept().await {
                drop(connection);
            }
        }));
    }

    /// Starts it again (crash recovery) on the same port.
    pub async fn restart(&mut self) {
        if let Some(placeholder) = self.placeholder.take() {
            placeholder.abort();
            let _ = placeholder.await; // the listener is closed once the task is gone
        }
        Self::run_with_retries("restart", &self.name, &[], &[]).await;
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new(Self::script())
            .args(["kill", &self.name])
            .stdin(Stdio::null())
            .output();
        let _ = std::fs::remove_dir_all(repo_root().join("target/postgres").join(&self.name));
    }
}

/// A folder for a scenario's files and process logs: removed when the scenario passes, kept
/// (and named on standard error) when the test panics.
#[derive(Debug)]
pub struct LogFolder {
    /// The folder.
    pub path: PathBuf,
}

impl LogFolder {
    fn new(label: &str) -> Self {
        Self {
            path: crate::temp_folder(&format!("chaos-{label}")),
        }
    }
}

impl Drop for LogFolder {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("chaos: logs and files kept in {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// One process of the cluster, restartable; killed with SIGKILL when dropped.
#[derive(Debug)]
struct Service {
    label: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    generation: u32,
    /// Exits nobody asked for, seen before a kill or at the end.
    unexpected_exits: Vec<String>,
}

impl Service {
    fn new(label: String, program: PathBuf, args: Vec<String>, folder: &Path) -> Self {
        Self {
            log: folder.join(format!("{label}.log")),
            label,
            program,
            args,
            env: SECRETS
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            child: None,
            generation: 0,
            unexpected_exits: Vec::new(),
        }
    }

    fn spawn(&mut self) {
        self.generation += 1;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|err| panic!("opening {}: {err}", self.log.display()));
        let _ = writeln!(log, "--- {} generation {} ---", self.label, self.generation);
        let stderr = log
            .try_clone()
            .unwrap_or_else(|err| panic!("log handle: {err}"));
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            // Warnings, and the receiver's own start-up line ("receiver ready").
            .env("RUST_LOG", "warn,receiver=info")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        if self.label.starts_with("worker") {
            command.args(["--name", &format!("{}-g{}", self.label, self.generation)]);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|err| panic!("starting {}: {err}", self.program.display()));
        self.child = Some(child);
    }

    /// Whether the current generation has logged a line containing `text`.
    fn logged_since_spawn(&self, text: &str) -> bool {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let marker = format!("--- {} generation {} ---", self.label, self.generation);
        log.rfind(&marker)
            .is_some_and(|start| log[start..].contains(text))
    }

    /// Whether the process has exited (recorded as unexpected: nobody killed it).
    fn check_alive(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                self.unexpected_exits.push(format!(
                    "{} generation {} exited by itself ({status}); log {}:\n{}",
                    self.label,
                    self.generation,
                    self.log.display(),
                    tail(&self.log, 15)
                ));
                self.child = None;
                false
            }
            Err(_) => false,
        }
    }

    /// SIGKILL (`kill -9`), then reaps it. Returns whether a running process was killed.
    fn kill9(&mut self) -> bool {
        let alive = self.check_alive();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        alive
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The last `lines` lines of a log file.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A free loopback port outside the usual ephemeral range, so that a receiver restarted on
/// it does not find it taken by some client connection, and below the ports
/// `scripts/local-postgres` gives its servers (25432 and up), so that a receiver cannot take
/// one between the script's check and its server's bind. Drawn from the thread's random
/// source, not the scenario's seed: scenarios running side by side must not draw alike.
pub fn free_port() -> u16 {
    let mut rng = rand::rng();
    for _ in 0..1_000 {
        let port = rng.random_range(RECEIVER_PORTS);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {RECEIVER_PORTS:?}");
}

/// Where [`free_port`] draws from.
const RECEIVER_PORTS: std::ops::Range<u16> = 15_000..25_000;

/// Receivers and workers on one database. Fields drop in order: processes first, then the
/// database server.
#[derive(Debug)]
struct Cluster {
    receivers: Vec<Service>,
    ports: Vec<u16>,
    workers: Vec<Service>,
    postgres: Postgres,
    /// The failover's standby, and how long its promotion and ingest's recovery took.
    standby: Option<Postgres>,
    promote_after: Duration,
    failover_times: Option<FailoverTimes>,
    /// The binaries' DATABASE_URL.
    url: String,
    in_flight: InFlight,
}

/// Events that killed workers held in processing when they were killed: each had to be
/// rescued, an ordered one keeping its key from every other worker until then.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Events in processing under a killed worker's lease.
    pub events: u64,
    /// Those of them with an ordering key.
    pub ordered: u64,
}

#[derive(QueryableByName)]
struct Held {
    #[diesel(sql_type = BigInt)]
    events: i64,
    #[diesel(sql_type = BigInt)]
    ordered: i64,
}

/// What one worker holds in processing; nothing when the database cannot say (stopped on
/// purpose).
async fn held_by(url: &str, worker: &str) -> InFlight {
    let Ok(mut conn) = test_db::establish(url).await else {
        return InFlight::default();
    };
    let rows: Vec<Held> = diesel::sql_query(
        "SELECT count(*) AS events, count(ordering_key) AS ordered FROM inbox_queue \
         WHERE status = 1 AND locked_by = $1",
    )
    .bind::<Text, _>(worker)
    .load(&mut conn)
    .await
    .unwrap_or_default();
    rows.into_iter()
        .next()
        .map_or_else(InFlight::default, |held| InFlight {
            events: held.events.max(0) as u64,
            ordered: held.ordered.max(0) as u64,
        })
}

/// What a scenario does. Every count is exact: the timeline performs each kill it plans.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short name (logs, server folder).
    pub name: &'static str,
    /// Seed of the simulator's plan and of the chaos timeline.
    pub seed: u64,
    /// Events the simulator sends (each 2-5 times).
    pub events: usize,
    /// Receiver processes (the simulator sends to each in turn).
    pub receivers: usize,
    /// Worker processes.
    pub workers: usize,
    /// Planned sending time: sets the simulator's rate, and the window of the kills.
    pub send_for: Duration,
    /// Workers killed with SIGKILL (and started again at once), at random moments.
    pub worker_kills: usize,
    /// Receivers killed with SIGKILL, then started again on the same port.
    pub receiver_kills: usize,
    /// Abrupt stops of PostgreSQL (immediate shutdown), each followed by a restart.
    pub database_restarts: usize,
    /// How long the database stays down (drawn in this range).
    pub database_downtime: (Duration, Duration),
    /// How long a killed receiver stays down (drawn in this range).
    pub receiver_downtime: (Duration, Duration),
    /// Bound of the whole scenario after sending ends: the inbox must be drained by then.
    pub drain_within: Duration,
    /// A standby, and one failover: the primary killed with SIGKILL, the standby promoted
    /// after `promote_after`; the binaries find it through a multi-host URL.
    pub failover: Option<Standby>,
    /// How long the failover takes to promote the standby (failure detection).
    pub promote_after: Duration,
}

/// How a failover scenario's standby replicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standby {
    /// `synchronous_standby_names` names it: a commit is acknowledged once the standby has
    /// it, so no acknowledged event may be lost.
    Synchronous,
    /// Streaming only: a commit is acknowledged before the standby has it; the scenario
    /// reports how many acknowledged events the failover lost.
    Asynchronous,
}

impl Scenario {
    /// A scenario with one receiver, two workers, no kills; `CHAOS_SEED` overrides the seed.
    pub fn new(name: &'static str, events: usize) -> Self {
        Self {
            name,
            seed: env_number("CHAOS_SEED").unwrap_or(20_261_201),
            events,
            receivers: 1,
            workers: 2,
            send_for: Duration::from_secs(8),
            worker_kills: 0,
            receiver_kills: 0,
            database_restarts: 0,
            database_downtime: (Duration::from_secs(2), Duration::from_secs(4)),
            receiver_downtime: (Duration::from_millis(200), Duration::from_millis(1_500)),
            drain_within: Duration::from_secs(120),
            failover: None,
            promote_after: Duration::from_secs(1),
        }
    }

    /// The failover scenario of `make chaos`: `CHAOS_FAILOVER_EVENTS` (10,000) over
    /// `CHAOS_FAILOVER_DURATION` (60s of sending), two receivers, three workers.
    pub fn long_failover(name: &'static str, standby: Standby) -> Self {
        let send_for = env_duration("CHAOS_FAILOVER_DURATION").unwrap_or(Duration::from_secs(60));
        Self {
            receivers: 2,
            workers: 3,
            send_for,
            failover: Some(standby),
            promote_after: Duration::from_secs(2),
            drain_within: Duration::from_secs(300),
            ..Self::new(name, env_number("CHAOS_FAILOVER_EVENTS").unwrap_or(10_000))
        }
    }

    /// The long run of `make chaos`, sized by the environment: `CHAOS_EVENTS` (50,000),
    /// `CHAOS_DURATION` (sending time, 240s), `CHAOS_WORKER_KILLS` (24),
    /// `CHAOS_RECEIVER_KILLS` (4), `CHAOS_DATABASE_RESTARTS` (2), `CHAOS_SEED`.
    pub fn long_from_env() -> Self {
        let send_for = env_duration("CHAOS_DURATION").unwrap_or(Duration::from_secs(240));
        Self {
            receivers: 2,
            workers: 3,
            send_for,
            worker_kills: env_number("CHAOS_WORKER_KILLS").unwrap_or(24),
            receiver_kills: env_number("CHAOS_RECEIVER_KILLS").unwrap_or(4),
            database_restarts: env_number("CHAOS_DATABASE_RESTARTS").unwrap_or(2),
            drain_within: Duration::from_secs(600),
            ..Self::new("long", env_number("CHAOS_EVENTS").unwrap_or(50_000))
        }
    }

    /// How long a row may stay in processing after its lease expired before it counts as
    /// stuck: the rescuer runs every 200 ms, but not while the database is down.
    fn stuck_after(&self) -> Duration {
        let outage = if self.database_restarts > 0 {
            self.database_downtime.1
        } else if self.failover.is_some() {
            self.promote_after + Duration::from_secs(5)
        } else {
            Duration::ZERO
        };
        LEASE + outage + Duration::from_secs(5)
    }
}

fn env_duration(name: &str) -> Option<Duration> {
    let text = std::env::var(name).ok()?;
    Some(humantime::parse_duration(&text).unwrap_or_else(|err| panic!("{name} {text:?}: {err}")))
}

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    let text = std::env::var(name).ok()?;
    Some(
        text.replace(['_', ','], "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
    )
}

/// One planned act of chaos.
#[derive(Debug, Clone, Copy)]
enum Act {
    KillWorker(usize),
    KillReceiver(usize, Duration),
    StopDatabase(Duration),
    Failover,
}

/// Kills performed, per component.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kills {
    /// Workers killed with SIGKILL.
    pub workers: usize,
    /// Receivers killed with SIGKILL.
    pub receivers: usize,
    /// Abrupt database stops (each followed by a restart).
    pub database: usize,
    /// Primaries killed with SIGKILL and replaced by their promoted standby.
    pub failovers: usize,
}

/// What a failover took, seen from outside.
#[derive(Debug, Clone, Copy)]
pub struct FailoverTimes {
    /// The standby's flush lag as the primary last reported it before the kill (the window
    /// of acknowledged commits an asynchronous standby may not have).
    pub lag_before_kill: Option<Duration>,
    /// From the SIGKILL to the standby accepting writes.
    pub promoted_after: Duration,
    /// From the SIGKILL to the first webhook a receiver answered 2xx again.
    pub ingest_after: Duration,
}

fn draw(rng: &mut StdRng, (low, high): (Duration, Duration)) -> Duration {
    if high <= low {
        return low;
    }
    rng.random_range(low..high)
}

/// The acts of `scenario`, at moments drawn within `window`: kills anywhere in it, database
/// stops spread out so that each outage ends before the next.
fn timeline(scenario: &Scenario, window: Duration, rng: &mut StdRng) -> Vec<(Duration, Act)> {
    let mut acts = Vec::new();
    let at = |rng: &mut StdRng, from: f64, to: f64| window.mul_f64(rng.random_range(from..to));
    for _ in 0..scenario.worker_kills {
        let moment = at(rng, 0.05, 0.95);
        acts.push((
            moment,
            Act::KillWorker(rng.random_range(0..scenario.workers)),
        ));
    }
    for _ in 0..scenario.receiver_kills {
        let moment = at(rng, 0.1, 0.9);
        let down = draw(rng, scenario.receiver_downtime);
        acts.push((
            moment,
            Act::KillReceiver(rng.random_range(0..scenario.receivers), down),
        ));
    }
    let restarts = scenario.database_restarts;
    for index in 0..restarts {
        let slot = 0.8 / restarts as f64;
        let start = 0.1 + slot * index as f64;
        let moment = at(rng, start, start + slot * 0.5);
        acts.push((
            moment,
            Act::StopDatabase(draw(rng, scenario.database_downtime)),
        ));
    }
    if scenario.failover.is_some() {
        acts.push((at(rng, 0.35, 0.5), Act::Failover));
    }
    acts.sort_by_key(|(moment, _)| *moment);
    acts
}

impl Cluster {
    async fn start(
        scenario: &Scenario,
        binaries: &Binaries,
        (postgres, standby): (Postgres, Option<Postgres>),
        url: &str,
        folder: &Path,
    ) -> Self {
        let providers_file = folder.join("providers.toml");
        let routes_file = folder.join("routes.toml");
        std::fs::write(&providers_file, PROVIDERS).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&routes_file, inbox_simulator::ROUTES).unwrap_or_else(|e| panic!("{e}"));
        let url = url.to_owned();
        let ports: Vec<u16> = (0..scenario.receivers).map(|_| free_port()).collect();
        let receivers = ports
            .iter()
            .enumerate()
            .map(|(index, port)| {
                let args = [
                    "serve",
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--metrics-listen",
                    "127.0.0.1:0",
                    "--config",
                    &providers_file.to_string_lossy(),
                    "--database-url",
                    &url,
                    "--db-pool-size",
                    "8",
                    "--db-connect-timeout",
                    "1s",
                    "--db-deadline",
                    "2s",
                    "--retry-after-secs",
                    "1",
                    "--http-workers",
                    "2",
                    "--shutdown-timeout",
                    "1s",
                ];
                Service::new(
                    format!("receiver-{}", index + 1),
                    binaries.receiver.clone(),
                    args.iter().map(|s| (*s).to_owned()).collect(),
                    folder,
                )
            })
            .collect();
        let lease = format!("{}ms", LEASE.as_millis());
        let workers = (0..scenario.workers)
            .map(|index| {
                let args = [
                    "run",
                    "--routes",
                    &routes_file.to_string_lossy(),
                    "--metrics-listen",
                    "127.0.0.1:0",
                    "--lease",
                    &lease,
                    "--rescue-interval",
                    "200ms",
                    "--poll-interval",
                    "100ms",
                    "--stats-interval",
                    "1s",
                    "--retry-base",
                    "10ms",
                    "--retry-cap",
                    "200ms",
                    "--max-attempts",
                    "20",
                    "--concurrency",
                    "8",
                    "--batch-size",
                    "16",
                    "--shutdown-grace",
                    "1s",
                    "--database-url",
                    &url,
                    "--db-pool-size",
                    "6",
                    "--db-connect-timeout",
                    "1s",
                ];
                Service::new(
                    format!("worker-{}", index + 1),
                    binaries.worker.clone(),
                    args.iter().map(|s| (*s).to_owned()).collect(),
                    folder,
                )
            })
            .collect();
        let mut cluster = Self {
            receivers,
            ports,
            workers,
            postgres,
            standby,
            promote_after: scenario.promote_after,
            failover_times: None,
            url,
            in_flight: InFlight::default(),
        };
        for index in 0..cluster.receivers.len() {
            cluster.start_receiver(index).await;
        }
        for worker in &mut cluster.workers {
            worker.spawn();
        }
        cluster
    }

    fn receiver_urls(&self) -> Vec<reqwest::Url> {
        self.ports
            .iter()
            .map(|port| {
                format!("http://127.0.0.1:{port}")
                    .parse()
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect()
    }

    /// Starts receiver `index` and waits until that very process logs that it is ready
    /// (an answer on the port could come from another process that took it); starts it
    /// again if it exits at once (its port briefly unavailable).
    async fn start_receiver(&mut self, index: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for _ in 0..20 {
            self.receivers[index].spawn();
            loop {
                let service = &mut self.receivers[index];
                if service.logged_since_spawn("receiver ready") {
                    return;
                }
                if let Some(Ok(Some(_))) = service.child.as_mut().map(Child::try_wait) {
                    service.child = None;
                    break; // exited: try again
                }
                assert!(
                    Instant::now() < deadline,
                    "{} did not become ready within 60 s; log:\n{}",
                    service.label,
                    tail(&service.log, 20)
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "{} keeps exiting at start; log:\n{}",
            self.receivers[index].label,
            tail(&self.receivers[index].log, 20)
        );
    }

    /// Plays `acts`, each at its moment after `start`.
    async fn play(
        &mut self,
        acts: Vec<(Duration, Act)>,
        start: tokio::time::Instant,
        rng: &mut StdRng,
    ) -> Kills {
        let mut kills = Kills::default();
        for (moment, act) in acts {
            tokio::time::sleep_until(start + moment).await;
            match act {
                Act::KillWorker(index) => {
                    if self.workers[index].kill9() {
                        kills.workers += 1;
                        // Its rows stay in processing under its lease until rescued.
                        let worker = &self.workers[index];
                        let name = format!("{}-g{}", worker.label, worker.generation);
                        let held = held_by(&self.url, &name).await;
                        self.in_flight.events += held.events;
                        self.in_flight.ordered += held.ordered;
                    }
                    // A supervisor starts a replacement soon after.
                    tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
                    self.workers[index].spawn();
                }
                Act::KillReceiver(index, down) => {
                    if self.receivers[index].kill9() {
                        kills.receivers += 1;
                    }
                    tokio::time::sleep(down).await;
                    self.start_receiver(index).await;
                }
                Act::StopDatabase(down) => {
                    self.postgres.kill().await;
                    kills.database += 1;
                    tokio::time::sleep(down).await;
                    self.postgres.restart().await;
                }
                Act::Failover => {
                    self.failover_times = Some(self.fail_over().await);
                    kills.failovers += 1;
                }
            }
        }
        kills
    }

    /// Kills the primary with SIGKILL, promotes the standby `promote_after` later, and
    /// measures until a receiver answers a webhook 2xx again.
    async fn fail_over(&mut self) -> FailoverTimes {
        let standby = self
            .standby
            .as_ref()
            .unwrap_or_else(|| panic!("no standby"));
        let receiver = self.receiver_urls().swap_remove(0);
        let lag_before_kill = flush_lag(&self.postgres.url).await;
        let killed_at = Instant::now();
        self.postgres.sigkill().await;
        let probe = tokio::spawn(first_ingest_after(receiver, killed_at));
        tokio::time::sleep(self.promote_after).await;
        standby.promote().await;
        let promoted_after = killed_at.elapsed();
        let ingest_after = match tokio::time::timeout(Duration::from_secs(120), probe).await {
            Ok(Ok(elapsed)) => elapsed,
            Ok(Err(err)) => std::panic::resume_unwind(err.into_panic()),
            Err(_) => panic!("no webhook answered 2xx within 120 s of the failover"),
        };
        FailoverTimes {
            lag_before_kill,
            promoted_after,
            ingest_after,
        }
    }

    /// Every exit nobody asked for, over the whole run.
    fn unexpected_exits(&mut self) -> Vec<String> {
        let mut exits = Vec::new();
        for service in self.receivers.iter_mut().chain(self.workers.iter_mut()) {
            service.check_alive();
            exits.append(&mut service.unexpected_exits);
        }
        exits
    }
}

/// What a scenario did and found.
#[derive(Debug)]
pub struct Outcome {
    /// The scenario.
    pub scenario: Scenario,
    /// The simulator's report.
    pub report: Report,
    /// Kills performed.
    pub kills: Kills,
    /// What the failover took (failover scenarios).
    pub failover: Option<FailoverTimes>,
    /// What the killed workers held at their kills.
    pub in_flight: InFlight,
    /// The invariant check.
    pub check: Check,
    /// Wall-clock time, start to verdict.
    pub elapsed: Duration,
    /// Files and logs (kept if the test fails).
    pub logs: LogFolder,
}

/// A broken promise.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The invariant.
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
}

/// The database's state against the simulator's report.
#[derive(Debug, Default)]
pub struct Check {
    /// Rows in the inbox.
    pub rows: u64,
    /// Rows done with one effect.
    pub effects_expected: u64,
    /// demo_ledger lines.
    pub ledger_lines: u64,
    /// Rows done without effect (unrouted).
    pub ignored: u64,
    /// Rows dead-lettered.
    pub dead: u64,
    /// Poison events stored.
    pub poison: u64,
    /// Events stored whose every answer was lost (stored, but never acknowledged).
    pub stored_unacked: u64,
    /// Acknowledged events the database lost: missing, or answered `accepted` a second time
    /// (the first row vanished, a later copy was stored again).
    pub acked_lost: u64,
    /// Rows whose attempt failed and was retried. A killed worker's rows are not among them:
    /// the rescue gives their attempt back (it counts rescues instead).
    pub retried_rows: u64,
    /// Most rows seen in processing well past their lease, at one time.
    pub stuck_leases_seen: u64,
    /// The ordered provider's events: how many, of how many keys, how many came stale.
    pub ordered: ordered::Tally,
    /// Violations of the per-key invariants of ordered events (all of them, where
    /// [`Check::violations`] keeps a few examples of each invariant).
    pub ordered_violations: u64,
    /// Every violation found.
    pub violations: Vec<Violation>,
}

mod invariant {
    pub const ACKED_DURABLE: &str = "1 acked means durable";
    pub const ONE_ROW: &str = "2 one row per (provider, event id)";
    pub const ONE_EFFECT: &str = "3 one business effect per event";
    pub const NOTHING_STUCK: &str = "4 nothing stuck (drained, leases rescued)";
    pub const DEAD_ARE_POISON: &str = "4 dead letters are exactly the poison events";
    pub const ORDER_FREE: &str = "5/6 payments: every event applied once, in any order";
    pub const FORGERIES: &str = "forged deliveries never accepted nor stored";
    pub const PROVIDER_GAVE_UP: &str = "every genuine event acknowledged within the retry budget";
    pub const CRASHES: &str = "processes exit only when killed";
    pub const HANDSHAKES: &str = "handshakes answered as the providers expect, never stored";
    pub const ORDERED_ONE_AT_A_TIME: &str = "7 ordered: one event of a key in processing at a time";
    pub const ORDERED_SEQUENCE: &str =
        "7 ordered: a key's events in sequence order, late arrivals marked stale";
    pub const ORDERED_ONCE: &str = "7 ordered: each handled once, under its key and sequence";
    /// The per-key invariants of ordered events.
    pub const ORDERED: [&str; 3] = [ORDERED_ONE_AT_A_TIME, ORDERED_SEQUENCE, ORDERED_ONCE];
}

#[derive(QueryableByName)]
struct InboxRow {
    #[diesel(sql_type = Text)]
    provider: String,
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = SmallInt)]
    status: i16,
}

#[derive(QueryableByName)]
struct LedgerCount {
    #[diesel(sql_type = Text)]
    provider: String,
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct PaymentRow {
    #[diesel(sql_type = Text)]
    payment_id: String,
    #[diesel(sql_type = Nullable<BigInt>)]
    amount: Option<i64>,
    #[diesel(sql_type = BigInt)]
    refunded_amount: i64,
    #[diesel(sql_type = BigInt)]
    refund_count: i64,
}

#[derive(QueryableByName)]
struct Number {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn number(conn: &mut AsyncPgConnection, sql: &str) -> diesel::QueryResult<i64> {
    let rows: Vec<Number> = diesel::sql_query(sql).load(conn).await?;
    Ok(rows.into_iter().next().map_or(0, |row| row.n))
}

#[derive(QueryableByName)]
struct Lag {
    #[diesel(sql_type = Nullable<Double>)]
    seconds: Option<f64>,
}

/// The standby's `flush_lag` in `pg_stat_replication` of the primary at `url`.
async fn flush_lag(url: &str) -> Option<Duration> {
    let mut conn = test_db::establish(url).await.ok()?;
    let rows: Vec<Lag> = diesel::sql_query(
        "SELECT extract(epoch FROM flush_lag)::float8 AS seconds FROM pg_stat_replication",
    )
    .load(&mut conn)
    .await
    .ok()?;
    let seconds = rows.into_iter().next()?.seconds.unwrap_or(0.0);
    Some(Duration::from_secs_f64(seconds.max(0.0)))
}

/// Event ids of the failover probe's webhooks: not the simulator's, so the check skips them.
const PROBE_PREFIX: &str = "failover-probe-";

/// Sends a signed webhook (`demo` provider, unrouted) every 20 ms until one is answered 2xx;
/// returns how long after `since` that was.
async fn first_ingest_after(receiver: reqwest::Url, since: Instant) -> Duration {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap_or_else(|err| panic!("{err}"));
    let endpoint = receiver
        .join("/webhooks/demo")
        .unwrap_or_else(|err| panic!("{err}"));
    let secret = SECRETS
        .iter()
        .find(|(name, _)| *name == "CHAOS_DEMO_SECRET")
        .map_or("", |(_, value)| value);
    for attempt in 0_u64.. {
        let body = format!(
            r#"{{"id":"{PROBE_PREFIX}{}-{attempt}","type":"unrouted.failover-probe"}}"#,
            std::process::id()
        );
        let signature = crate::demo_signature(body.as_bytes(), secret);
        let answer = client
            .post(endpoint.clone())
            .header("X-Signature", signature)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await;
        if answer.is_ok_and(|answer| answer.status().is_success()) {
            return since.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    unreachable!("the probe loop only ends by returning")
}

/// Samples, every 250 ms until aborted, how many rows are in processing more than
/// `stuck_after` past their lease; keeps the largest count seen. Database errors (it is
/// stopped on purpose) are skipped.
async fn watch_leases(url: String, stuck_after: Duration, worst: Arc<AtomicU64>) {
    let mut conn: Option<AsyncPgConnection> = None;
    loop {
        if conn.is_none() {
            conn = test_db::establish(&url).await.ok();
        }
        if let Some(connection) = conn.as_mut() {
            let query = diesel::sql_query(
                "SELECT count(*) AS n FROM webhook_inbox \
                 WHERE status = 1 AND locked_until < now() - make_interval(secs => $1)",
            )
            .bind::<Double, _>(stuck_after.as_secs_f64());
            match query.load::<Number>(connection).await {
                Ok(rows) => {
                    let n = rows.into_iter().next().map_or(0, |row| row.n).max(0) as u64;
                    worst.fetch_max(n, Ordering::Relaxed);
                }
                Err(_) => conn = None,
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until no row is ready or processing, and the row count held still for a moment.
async fn wait_drained(url: &str, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    let mut last_total = -1;
    loop {
        let state = async {
            let mut conn = test_db::establish(url).await.map_err(|e| e.to_string())?;
            let pending = number(
                &mut conn,
                "SELECT count(*) AS n FROM webhook_inbox WHERE status IN (0, 1)",
            )
            .await
            .map_err(|e| e.to_string())?;
            let total = number(&mut conn, "SELECT count(*) AS n FROM webhook_inbox")
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((pending, total))
        }
        .await;
        match state {
            Ok((0, total)) if total == last_total => return Ok(()),
            Ok((0, total)) => last_total = total,
            Ok((pending, _)) if Instant::now() >= deadline => {
                return Err(format!(
                    "{pending} rows still ready or processing after {within:?}"
                ))
            }
            Err(err) if Instant::now() >= deadline => return Err(err),
            _ => last_total = -1,
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Keeps at most this many examples per invariant.
const EXAMPLES: usize = 5;

#[derive(Debug, Default)]
struct Violations {
    list: Vec<Violation>,
    per_invariant: HashMap<&'static str, usize>,
}

impl Violations {
    fn add(&mut self, invariant: &'static str, detail: String) {
        let seen = self.per_invariant.entry(invariant).or_default();
        *seen += 1;
        if *seen <= EXAMPLES {
            self.list.push(Violation { invariant, detail });
        }
    }

    /// How many violations of `invariants` were found, examples or not.
    fn count_of(&self, invariants: &[&str]) -> u64 {
        invariants
            .iter()
            .filter_map(|invariant| self.per_invariant.get(invariant))
            .sum::<usize>() as u64
    }

    fn finish(mut self) -> Vec<Violation> {
        for (invariant, count) in &self.per_invariant {
            if *count > EXAMPLES {
                self.list.push(Violation {
                    invariant,
                    detail: format!("... and {} more", count - EXAMPLES),
                });
            }
        }
        self.list
    }
}

/// Checks the invariants of DESIGN.md against the database and the report.
///
/// With `loss_expected` (an asynchronous standby took over), acknowledged events lost are
/// counted in [`Check::acked_lost`] instead of being violations.
async fn check(
    url: &str,
    report: &Report,
    stuck: u64,
    exits: Vec<String>,
    loss_expected: bool,
) -> Check {
    let mut conn = test_db::establish(url)
        .await
        .unwrap_or_else(|err| panic!("connecting for the check: {err}"));
    let rows: Vec<InboxRow> = diesel::sql_query(
        "SELECT provider, event_id, status FROM webhook_inbox WHERE event_id NOT LIKE $1",
    )
    .bind::<Text, _>(format!("{PROBE_PREFIX}%"))
    .load(&mut conn)
    .await
    .unwrap_or_else(|err| panic!("{err}"));
    let ledger: Vec<LedgerCount> = diesel::sql_query(
        "SELECT provider, event_id, count(*) AS n FROM demo_ledger GROUP BY provider, event_id",
    )
    .load(&mut conn)
    .await
    .unwrap_or_else(|err| panic!("{err}"));
    let payments: Vec<PaymentRow> = diesel::sql_query(
        "SELECT payment_id, amount, refunded_amount::bigint AS refunded_amount, \
         refund_count::bigint AS refund_count FROM demo_payments",
    )
    .load(&mut conn)
    .await
    .unwrap_or_else(|err| panic!("{err}"));
    let processed = number(&mut conn, "SELECT count(*) AS n FROM processed_events")
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    let retried_rows = number(
        &mut conn,
        "SELECT count(*) AS n FROM webhook_inbox WHERE attempt > 1",
    )
    .await
    .unwrap_or_else(|err| panic!("{err}"));
    let trace = ordered::load_trace(&mut conn)
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    let keys_taken = ordered::keys_left_taken(&mut conn)
        .await
        .unwrap_or_else(|err| panic!("{err}"));

    let mut found = Check {
        rows: rows.len() as u64,
        dead: rows.iter().filter(|row| row.status == 3).count() as u64,
        ledger_lines: ledger.iter().map(|l| l.n as u64).sum(),
        stuck_leases_seen: stuck,
        retried_rows: retried_rows as u64,
        ..Check::default()
    };
    let mut v = Violations::default();
    for exit in exits {
        v.add(invariant::CRASHES, exit);
    }
    if report.totals.handshakes_failed > 0 {
        v.add(
            invariant::HANDSHAKES,
            format!(
                "{} handshakes not answered as expected",
                report.totals.handshakes_failed
            ),
        );
    }
    if report.totals.forged_accepted > 0 {
        v.add(
            invariant::FORGERIES,
            format!(
                "{} forged deliveries answered 2xx",
                report.totals.forged_accepted
            ),
        );
    }
    if stuck > 0 {
        v.add(
            invariant::NOTHING_STUCK,
            format!("up to {stuck} rows seen in processing long past their lease"),
        );
    }
    if keys_taken > 0 {
        v.add(
            invariant::NOTHING_STUCK,
            format!("{keys_taken} ordering keys still held or blocked once drained"),
        );
    }

    let stored: HashMap<(&str, &str), i16> = rows
        .iter()
        .map(|row| ((row.provider.as_str(), row.event_id.as_str()), row.status))
        .collect();
    let effects: HashMap<(&str, &str), i64> = ledger
        .iter()
        .map(|line| ((line.provider.as_str(), line.event_id.as_str()), line.n))
        .collect();
    let mut sent: HashMap<(&str, &str), Fate> = HashMap::with_capacity(report.events.len());
    // Expected payment state: amount from the success, refunds summed, among stored events.
    let mut expected_payments: BTreeMap<&str, (Option<i64>, i64, i64)> = BTreeMap::new();

    for event in &report.events {
        let key = (event.provider.as_str(), event.event_id.as_str());
        sent.insert(key, event.expected);
        let what = format!(
            "{}/{} ({:?})",
            event.provider, event.event_id, event.event_type
        );
        if event.copies > 0 && !event.acked {
            v.add(
                invariant::PROVIDER_GAVE_UP,
                format!("{what} never acknowledged"),
            );
        }
        if event.accepted > 1 {
            found.acked_lost += 1;
            if !loss_expected {
                v.add(
                    invariant::ONE_ROW,
                    format!("{what} answered `accepted` {} times", event.accepted),
                );
            }
        }
        let status = stored.get(&key).copied();
        let lines = effects.get(&key).copied().unwrap_or(0);
        let Some(status) = status else {
            if event.acked {
                found.acked_lost += 1;
                if !loss_expected {
                    v.add(
                        invariant::ACKED_DURABLE,
                        format!("{what} acknowledged but not in the inbox"),
                    );
                }
            }
            if lines > 0 {
                v.add(
                    invariant::ONE_EFFECT,
                    format!("{what} has {lines} effects but no row"),
                );
            }
            continue;
        };
        if !event.acked {
            found.stored_unacked += u64::from(event.expected != Fate::Rejected);
        }
        match event.expected {
            Fate::Rejected => {
                v.add(
                    invariant::FORGERIES,
                    format!("{what} was only forged, yet stored"),
                );
            }
            Fate::Effect => {
                found.effects_expected += 1;
                if status == 3 {
                    v.add(invariant::DEAD_ARE_POISON, format!("{what} dead-lettered"));
                } else if status != 2 {
                    v.add(
                        invariant::NOTHING_STUCK,
                        format!("{what} left in status {status}"),
                    );
                }
                if lines != 1 {
                    v.add(invariant::ONE_EFFECT, format!("{what} has {lines} effects"));
                }
                if let (Some(payment), Some(amount)) = (&event.object, event.amount) {
                    let entry = expected_payments.entry(payment).or_insert((None, 0, 0));
                    match event.event_type.as_deref() {
                        Some("payment.succeeded") => entry.0 = Some(amount),
                        Some("payment.refunded") => {
                            entry.1 += amount;
                            entry.2 += 1;
                        }
                        _ => {}
                    }
                }
            }
            Fate::Ignored => {
                found.ignored += 1;
                if status == 3 {
                    v.add(invariant::DEAD_ARE_POISON, format!("{what} dead-lettered"));
                } else if status != 2 {
                    v.add(
                        invariant::NOTHING_STUCK,
                        format!("{what} left in status {status}"),
                    );
                }
                if lines != 0 {
                    v.add(
                        invariant::ONE_EFFECT,
                        format!("unrouted {what} has {lines} effects"),
                    );
                }
            }
            Fate::Dead => {
                found.poison += 1;
                if status != 3 {
                    v.add(
                        invariant::DEAD_ARE_POISON,
                        format!("poison {what} in status {status}, not dead"),
                    );
                }
                if lines != 0 {
                    v.add(
                        invariant::ONE_EFFECT,
                        format!("poison {what} has {lines} effects"),
                    );
                }
            }
        }
    }
    let stored_ids: std::collections::HashSet<(&str, &str)> = stored.keys().copied().collect();
    found.ordered = ordered::check(&trace, report, &stored_ids, &mut v);
    found.ordered_violations = v.count_of(&invariant::ORDERED);
    for row in &rows {
        if !sent.contains_key(&(row.provider.as_str(), row.event_id.as_str())) {
            v.add(
                invariant::ONE_ROW,
                format!("row {}/{} that nobody sent", row.provider, row.event_id),
            );
        }
    }
    if processed as u64 != found.effects_expected {
        v.add(
            invariant::ONE_EFFECT,
            format!(
                "{processed} processed_events records for {} events with an effect",
                found.effects_expected
            ),
        );
    }
    let actual_payments: HashMap<&str, &PaymentRow> = payments
        .iter()
        .map(|p| (p.payment_id.as_str(), p))
        .collect();
    for (payment, (amount, refunded, refunds)) in &expected_payments {
        match actual_payments.get(payment) {
            None => v.add(invariant::ORDER_FREE, format!("payment {payment} missing")),
            Some(row) => {
                if row.amount != *amount
                    || row.refunded_amount != *refunded
                    || row.refund_count != *refunds
                {
                    v.add(
                        invariant::ORDER_FREE,
                        format!(
                            "payment {payment}: amount {:?}, refunded {} in {} refunds; expected {amount:?}, {refunded} in {refunds}",
                            row.amount, row.refunded_amount, row.refund_count
                        ),
                    );
                }
            }
        }
    }
    found.violations = v.finish();
    found
}

/// Runs `scenario` to its verdict. Every process and the database server are gone when this
/// returns or panics.
pub async fn run(scenario: Scenario) -> Outcome {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(scenario.seed);
    let binaries = Binaries::locate();
    let logs = LogFolder::new(scenario.name);
    let postgres = Postgres::start(scenario.name).await;
    let standby = match scenario.failover {
        Some(kind) => Some(postgres.start_standby(kind == Standby::Synchronous).await),
        None => None,
    };
    // With a standby, the binaries get both hosts and look for the read-write one.
    let url = match &standby {
        Some(standby) => format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            postgres.port(),
            standby.port()
        ),
        None => postgres.url.clone(),
    };
    let migrated = tokio::process::Command::new(&binaries.worker)
        .args(["migrate", "--database-url", &url])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|err| panic!("worker migrate: {err}"));
    assert!(
        migrated.status.success(),
        "worker migrate failed: {}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let mut cluster =
        Cluster::start(&scenario, &binaries, (postgres, standby), &url, &logs.path).await;

    let providers = Arc::new(crate::providers(PROVIDERS, &SECRETS));
    // Unique per run (not drawn from the seed), so no two runs ever share an event id.
    let run_id = format!("{}-{}", scenario.name, inbox_simulator::random_run_id());
    let plan = Plan::new(
        &providers,
        &[],
        &Mix::default(),
        scenario.events,
        scenario.seed,
        &run_id,
    )
    .unwrap_or_else(|err| panic!("{err}"));
    let rate = plan.deliveries() as f64 / scenario.send_for.as_secs_f64().max(0.1);
    let settings = SendSettings {
        concurrency: 32,
        rate: Some(rate),
        late_delay: Duration::from_millis(500),
        retry: RetryPolicy {
            backoff: BackoffPolicy {
                base: Duration::from_millis(50),
                cap: Duration::from_secs(1),
                max_attempts: 10_000,
            },
            give_up_after: scenario.drain_within,
        },
        request_timeout: Duration::from_secs(10),
        ..SendSettings::new(cluster.receiver_urls())
    };
    let acts = timeline(&scenario, scenario.send_for, &mut rng);
    let stuck = Arc::new(AtomicU64::new(0));
    let watcher = tokio::spawn(watch_leases(
        url.clone(),
        scenario.stuck_after(),
        Arc::clone(&stuck),
    ));
    let chaos_start = tokio::time::Instant::now();
    let chaos = tokio::spawn(async move {
        let kills = cluster.play(acts, chaos_start, &mut rng).await;
        (cluster, kills)
    });
    let report = inbox_simulator::send::send(
        providers,
        Arc::new(plan),
        &settings,
        Arc::new(Progress::default()),
    )
    .await
    .unwrap_or_else(|err| panic!("simulator: {err}"));
    let (mut cluster, kills) = match chaos.await {
        Ok(done) => done,
        Err(err) => std::panic::resume_unwind(err.into_panic()),
    };
    let drained = wait_drained(&url, scenario.drain_within).await;
    watcher.abort();
    let exits = cluster.unexpected_exits();
    let mut check = check(
        &url,
        &report,
        AtomicU64::load(&stuck, Ordering::Relaxed),
        exits,
        scenario.failover == Some(Standby::Asynchronous),
    )
    .await;
    if let Err(why) = drained {
        check.violations.push(Violation {
            invariant: invariant::NOTHING_STUCK,
            detail: why,
        });
    }
    let failover = cluster.failover_times;
    let in_flight = cluster.in_flight;
    drop(cluster);
    Outcome {
        scenario,
        report,
        kills,
        failover,
        in_flight,
        check,
        elapsed: started.elapsed(),
        logs,
    }
}

impl Outcome {
    /// The summary table of `make chaos`.
    pub fn table(&self) -> String {
        let t = &self.report.totals;
        let s = &self.scenario;
        let c = &self.check;
        let mut rows: Vec<(&str, String)> = vec![
            (
                "events sent",
                format!(
                    "{} ({} genuine, {} forged only)",
                    t.events,
                    t.genuine_events,
                    t.events - t.genuine_events
                ),
            ),
            (
                "deliveries",
                format!(
                    "{} ({} genuine copies, {} forged); {} requests with retries",
                    t.deliveries, t.genuine_deliveries, t.forged_deliveries, t.requests
                ),
            ),
            (
                "acked",
                format!(
                    "{} events ({} never acked)",
                    t.acked_events, t.unacked_events
                ),
            ),
            (
                "effects",
                format!(
                    "{} demo_ledger lines for {} events routed to the handler",
                    c.ledger_lines, c.effects_expected
                ),
            ),
            (
                "duplicates suppressed",
                format!("{} deliveries answered `duplicate`", t.duplicates),
            ),
            (
                "ignored (unrouted)",
                format!("{} events done without effect", c.ignored),
            ),
            (
                "ordered per key",
                format!(
                    "{} events of {} keys ({} late ones marked stale); {} violations of \
                     the per-key invariants",
                    c.ordered.events, c.ordered.keys, c.ordered.stale, c.ordered_violations
                ),
            ),
            (
                "rows attempted twice or more",
                format!(
                    "{} (a failed attempt retried; a rescue gives its attempt back)",
                    c.retried_rows
                ),
            ),
            (
                "dead letters",
                format!("{} rows dead ({} poison events stored)", c.dead, c.poison),
            ),
            (
                "forgeries",
                format!(
                    "{} answered 401, {} accepted",
                    t.forged_rejected, t.forged_accepted
                ),
            ),
            (
                "retried answers",
                format!(
                    "{} non-2xx, {} without answer",
                    t.refused, t.transport_errors
                ),
            ),
            (
                "kills",
                format!(
                    "worker {} ({} events in flight, {} of them ordered) / receiver {} / \
                     database {} / failover {}",
                    self.kills.workers,
                    self.in_flight.events,
                    self.in_flight.ordered,
                    self.kills.receivers,
                    self.kills.database,
                    self.kills.failovers
                ),
            ),
            ("invariant violations", c.violations.len().to_string()),
        ];
        if let (Some(standby), Some(times)) = (s.failover, self.failover) {
            let at = rows.len() - 1;
            rows.insert(at, ("acknowledged events lost", c.acked_lost.to_string()));
            rows.insert(
                at,
                (
                    "failover",
                    format!(
                        "{standby:?} standby (flush lag {} before the kill) promoted {:.1} s \
                         after the primary's SIGKILL; ingest answered 2xx again after {:.1} s",
                        times
                            .lag_before_kill
                            .map_or("unknown".to_owned(), |lag| format!(
                                "{:.1} ms",
                                lag.as_secs_f64() * 1000.0
                            )),
                        times.promoted_after.as_secs_f64(),
                        times.ingest_after.as_secs_f64()
                    ),
                ),
            );
        }
        let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "chaos `{}`: seed {}, {} receivers, {} workers, {:.1} s",
            s.name,
            s.seed,
            s.receivers,
            s.workers,
            self.elapsed.as_secs_f64()
        );
        for (name, value) in rows {
            let _ = writeln!(out, "| {name:<width$} | {value}");
        }
        for violation in &c.violations {
            let _ = writeln!(
                out,
                "  violation [{}]: {}",
                violation.invariant, violation.detail
            );
        }
        out
    }

    /// Panics with the table and every violation unless the run kept every invariant,
    /// performed every planned kill, and had ordered events to check the per-key invariants on.
    pub fn assert_clean(&self) {
        let s = &self.scenario;
        let planned = Kills {
            workers: s.worker_kills,
            receivers: s.receiver_kills,
            database: s.database_restarts,
            failovers: usize::from(s.failover.is_some()),
        };
        assert!(
            self.check.violations.is_empty()
                && self.check.ordered_violations == 0
                && self.check.ordered.events > 0
                && self.kills == planned,
            "chaos `{}` failed (planned kills {planned:?}); logs in {}\n{}",
            s.name,
            self.logs.path.display(),
            self.table()
        );
    }
}

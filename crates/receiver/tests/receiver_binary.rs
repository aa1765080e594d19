//! The real `receiver` binary as an operator runs it: its `--help`, request ids in answers and
//! logs, the warning for a redelivery with another body, secrets kept out of the logs, and a
//! graceful SIGTERM that lets an in-flight request finish before the process exits 0.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inbox_signature::{Algorithm, DigestEncoding, Outgoing, Profile, Scheme, Template};
use test_db::TestDatabase;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

const SECRET: &str = "binary-test-secret-value";

const PROVIDERS: &str = r#"
[providers.demo]
scheme = "hmac-sha256"
signature_header = "X-Signature"
encoding = "hex"
prefix = "sha256="
event_id = { json_pointer = "/id" }
event_type = { json_pointer = "/type" }
secrets = [{ env = "DEMO_WEBHOOK_SECRET", name = "current" }]
"#;

fn signature(body: &[u8]) -> String {
    let scheme = Template::body_only(
        "hmac-sha256",
        "X-Signature",
        Some("sha256="),
        DigestEncoding::Hex,
        Algorithm::Sha256,
        Profile::fields(Vec::new(), Vec::new()),
    );
    let key = scheme.key_from_secret(SECRET).unwrap();
    let signed = scheme.sign(&key, &Outgoing::post(body, "", 0)).unwrap();
    signed.headers[0].1.clone()
}

/// Polls `condition` every 20 ms until it holds; panics with `what` after `timeout`.
async fn wait_until(what: &str, timeout: Duration, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A `receiver serve` child process and the log lines it has written so far.
struct Served {
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
    addr: SocketAddr,
    folder: PathBuf,
}

impl Served {
    async fn start(db: &TestDatabase) -> Self {
        let unique = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let folder =
            std::env::temp_dir().join(format!("receiver-binary-{}-{unique}", std::process::id()));
        std::fs::create_dir_all(&folder).unwrap();
        let config = folder.join("providers.toml");
        std::fs::write(&config, PROVIDERS).unwrap();

        let mut child = Command::new(env!("CARGO_BIN_EXE_receiver"))
            .args(["--log-format", "json", "--log", "info", "serve"])
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .arg("--config")
            .arg(&config)
            .args(["--body-timeout", "20s", "--shutdown-timeout", "20s"])
            .env("DATABASE_URL", db.url())
            .env("DEMO_WEBHOOK_SECRET", SECRET)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let collected = Arc::clone(&logs);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                collected.lock().unwrap().push(line);
            }
        });

        let mut served = Self {
            child,
            logs,
            addr: "127.0.0.1:0".parse().unwrap(),
            folder,
        };
        wait_until(
            "the receiver is ready",
            Duration::from_secs(20),
            async || served.log_field("receiver ready", "listen").is_some(),
        )
        .await;
        served.addr = served
            .log_field("receiver ready", "listen")
            .unwrap()
            .parse()
            .unwrap();
        served
    }

    /// Field `field` of the first JSON log line whose message is `message`.
    fn log_field(&self, message: &str, field: &str) -> Option<String> {
        self.logs.lock().unwrap().iter().find_map(|line| {
            let json: serde_json::Value = serde_json::from_str(line).ok()?;
            (json["message"] == message).then(|| json[field].as_str().map(str::to_owned))?
        })
    }

    fn logs_containing(&self, needle: &str) -> Vec<String> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line.contains(needle))
            .cloned()
            .collect()
    }

    fn all_logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn terminate(&self) {
        let pid = self.child.id().unwrap().to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.folder);
    }
}

async fn post(
    client: &reqwest::Client,
    served: &Served,
    body: &str,
    signed: bool,
) -> reqwest::Response {
    let signature = if signed {
        signature(body.as_bytes())
    } else {
        "sha256=00".into()
    };
    client
        .post(served.url("/webhooks/demo"))
        .header("x-signature", signature)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

#[test]
fn help_explains_every_flag_and_the_provider_file() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_receiver"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();

    // Every flag `serve` has, found from its definition rather than listed by hand.
    let definition =
        <receiver::server::ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
    for arg in definition.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        assert!(
            help.contains(&format!("--{long}")),
            "--{long} missing from:\n{help}"
        );
        assert!(
            arg.get_help()
                .is_some_and(|text| !text.to_string().is_empty()),
            "--{long} has no explanation"
        );
    }
    for needed in [
        "[providers.<name>]",
        "\"stripe\"",
        "\"github\"",
        "\"standard-webhooks\"",
        "\"shopify\"",
        "\"slack\"",
        "\"hmac-sha256\"",
        "secrets = [{ env = ",
        "file = ",
        "json_pointer",
        "signature_header",
        "tolerance",
        "unsigned = true",
        "form_event_id_field",
    ] {
        assert!(help.contains(needed), "{needed} missing from:\n{help}");
    }

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_receiver"))
        .arg("--help")
        .output()
        .unwrap();
    let top = String::from_utf8(output.stdout).unwrap();
    for needed in [
        "serve",
        "migrate",
        "sign",
        "check-config",
        "--log-format",
        "--log ",
    ] {
        assert!(top.contains(needed), "{needed} missing from:\n{top}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_in_the_answers_and_the_logs_and_secrets_are_not() {
    let db = TestDatabase::new().await;
    let served = Served::start(&db).await;
    let client = reqwest::Client::new();

    let forged = post(&client, &served, r#"{"id":"evt_forged"}"#, false).await;
    assert_eq!(forged.status().as_u16(), 401);
    let forged_id = forged.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let accepted = post(&client, &served, r#"{"id":"evt_1","v":1}"#, true).await;
    assert_eq!(accepted.status().as_u16(), 200);
    let accepted_id = accepted.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_ne!(forged_id, accepted_id, "one id per request");

    // A redelivery whose body differs: answered duplicate, and a warning names the event.
    let changed = post(&client, &served, r#"{"id":"evt_1","v":2}"#, true).await;
    assert_eq!(changed.status().as_u16(), 200);
    let changed_id = changed.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(changed.text().await.unwrap(), r#"{"status":"duplicate"}"#);

    wait_until(
        "the rejection is logged",
        Duration::from_secs(10),
        async || {
            served
                .logs_containing(&forged_id)
                .iter()
                .any(|line| line.contains("webhook rejected"))
        },
    )
    .await;
    wait_until(
        "the body mismatch is logged",
        Duration::from_secs(10),
        async || {
            served.logs_containing(&changed_id).iter().any(|line| {
                line.contains("\"WARN\"")
                    && line.contains("different body")
                    && line.contains("evt_1")
            })
        },
    )
    .await;
    served.terminate();
    let logs = served.all_logs();
    assert!(!logs.contains(SECRET), "the secret is in the logs");
    assert!(
        !logs.contains(&signature(br#"{"id":"evt_1","v":1}"#)),
        "a signature is in the logs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_request_in_flight_finish_then_the_process_exits_cleanly() {
    let db = TestDatabase::new().await;
    let mut served = Served::start(&db).await;

    // A delivery whose body is still arriving when SIGTERM comes. A first, complete request on
    // the same connection proves the server has taken the connection before the signal.
    let mut stream = TcpStream::connect(served.addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut first = vec![0_u8; 4096];
    let read = stream.read(&mut first).await.unwrap();
    assert!(first[..read].starts_with(b"HTTP/1.1 200"));

    let body = br#"{"id":"evt_in_flight","type":"t"}"#;
    let head = format!(
        "POST /webhooks/demo HTTP/1.1\r\nHost: test\r\nConnection: close\r\nX-Signature: {}\r\nContent-Length: {}\r\n\r\n",
        signature(body),
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body[..10]).await.unwrap();
    // The signal must find the request begun (the body's bytes sent so far reserved), not its
    // head still unread in the socket: a connection without a request in progress is closed at
    // shutdown.
    let metrics = format!(
        "http://{}/metrics",
        served.log_field("receiver ready", "metrics").unwrap()
    );
    let reserved = "inbox_receiver_body_bytes_in_flight 10";
    wait_until(
        "the request's body is reserved",
        Duration::from_secs(10),
        async || {
            let page = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
            page.lines().any(|line| line == reserved)
        },
    )
    .await;

    served.terminate();
    wait_until(
        "the shutdown has begun",
        Duration::from_secs(10),
        async || {
            !served
                .logs_containing("starting graceful shutdown")
                .is_empty()
        },
    )
    .await;
    // New connections are soon refused, while the old one is still served.
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(served.addr).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "still accepting connections during the shutdown"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    stream.write_all(&body[10..]).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(r#"{"status":"accepted"}"#), "{answer}");

    let status = tokio::time::timeout(Duration::from_secs(20), served.child.wait())
        .await
        .expect("the process exits")
        .unwrap();
    assert!(status.success(), "exited with {status}");
    // The process has exited; its last lines may still be on their way through the pipe.
    wait_until(
        "the receiver logs that it stopped",
        Duration::from_secs(10),
        async || !served.logs_containing("receiver stopped").is_empty(),
    )
    .await;

    use diesel_async::RunQueryDsl as _;
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut conn = db.connect().await;
    let rows: Vec<Count> = diesel::sql_query(
        "SELECT count(*) AS n FROM webhook_inbox WHERE event_id = 'evt_in_flight'",
    )
    .load(&mut conn)
    .await
    .unwrap();
    assert_eq!(rows[0].n, 1, "the answered event is stored");
}

//! The HTTP forward handler over TLS, against a local TLS server whose CA the test makes:
//! a route trusting that CA (and presenting a client certificate, for mutual TLS) delivers;
//! a route trusting another CA, or presenting no client certificate, gets a clear retryable
//! error naming the host.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inbox_core::inbox::{insert_events, NewEvent};
use inbox_tests::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use test_db::TestDatabase;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A certificate authority made for one test, and the files it wrote.
struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
}

impl TestCa {
    fn new(dir: &Path, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca = Self {
            issuer,
            dir: dir.to_owned(),
        };
        std::fs::write(ca.file(&format!("{name}-ca.pem")), ca.issuer.pem()).unwrap();
        ca
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A leaf certificate for `localhost` with its key, also written as PEM files
    /// `{name}.pem` and `{name}-key.pem`.
    fn leaf(
        &self,
        name: &str,
        usage: ExtendedKeyUsagePurpose,
    ) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(self.file(&format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(self.file(&format!("{name}-key.pem")), key.serialize_pem()).unwrap();
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (cert.der().clone(), der)
    }
}

/// What the TLS server saw of one connection.
#[derive(Debug, Clone)]
struct Seen {
    client_certificate: bool,
    request_line: Option<String>,
}

/// A TLS server on loopback that requires a client certificate signed by `ca` and answers
/// every request 200.
async fn start_tls_server(ca: &TestCa) -> (u16, Arc<Mutex<Vec<Seen>>>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client_roots = RootCertStore::empty();
    client_roots.add(ca.der()).unwrap();
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(client_roots), Arc::clone(&provider))
            .build()
            .unwrap();
    let (cert, key) = ca.leaf("server", ExtendedKeyUsagePurpose::ServerAuth);
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert, ca.der()], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let client_certificate = tls.get_ref().1.peer_certificates().is_some();
                let request_line = read_request_line(&mut tls).await;
                let answered = request_line.is_some();
                log.lock().unwrap().push(Seen {
                    client_certificate,
                    request_line,
                });
                if answered {
                    let _ = tls
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    (port, seen)
}

/// Reads one request's head and body; its first line, if a whole request arrived.
async fn read_request_line(stream: &mut (impl AsyncReadExt + Unpin)) -> Option<String> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|line| {
            line.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    head.lines().next().map(str::to_owned)
}

fn event(id: &str, event_type: &str) -> NewEvent {
    NewEvent {
        provider: "demo".into(),
        event_id: id.into(),
        event_type: Some(event_type.into()),
        headers: serde_json::json!({"content-type": "application/json"}),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: None,
        body: format!(r#"{{"id":"{id}"}}"#).into_bytes(),
    }
}

fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("inbox-tls-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_forward_trusts_the_route_ca_presents_its_client_certificate_and_names_the_host_on_certificate_errors(
) {
    let dir = test_dir("forward");
    let ca = TestCa::new(&dir, "inbox");
    TestCa::new(&dir, "other"); // a CA the server does not use
    ca.leaf("worker", ExtendedKeyUsagePurpose::ClientAuth);
    let (port, seen) = start_tls_server(&ca).await;

    // Relative file names resolve against the routes file's directory.
    let routes = format!(
        r#"
        [[routes]]
        event_type = "mtls.*"
        handler = "forward"
        url = "https://localhost:{port}/mtls"
        ca_file = "inbox-ca.pem"
        client_cert = "worker.pem"
        client_key = "worker-key.pem"
        [[routes]]
        event_type = "wrong-ca.*"
        handler = "forward"
        url = "https://localhost:{port}/wrong-ca"
        ca_file = "other-ca.pem"
        client_cert = "worker.pem"
        client_key = "worker-key.pem"
        [[routes]]
        event_type = "no-client-cert.*"
        handler = "forward"
        url = "https://localhost:{port}/no-client-cert"
        ca_file = "inbox-ca.pem"
        "#
    );
    let router = worker::routes::parse_routes(&routes, &dir.join("routes.toml")).unwrap();

    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    insert_events(
        &mut conn,
        &[
            event("evt_mtls", "mtls.thing"),
            event("evt_wrong_ca", "wrong-ca.thing"),
            event("evt_no_cert", "no-client-cert.thing"),
        ],
    )
    .await
    .unwrap();
    let worker = RunningWorker::start(&db, router, worker_settings("w1"));
    wait_for_count(
        &mut conn,
        "the mutual-TLS event delivered",
        "SELECT count(*) AS n FROM webhook_inbox WHERE event_id = 'evt_mtls' AND status = 2",
        1,
        Duration::from_secs(30),
    )
    .await;
    wait_for_count(
        &mut conn,
        "the wrong-CA event failed with a retryable certificate error naming the host",
        "SELECT count(*) AS n FROM webhook_inbox WHERE event_id = 'evt_wrong_ca' AND status <> 2 \
         AND last_error LIKE 'retryable: forward to https://localhost:%/wrong-ca: TLS certificate of localhost rejected: %UnknownIssuer%'",
        1,
        Duration::from_secs(30),
    )
    .await;
    wait_for_count(
        &mut conn,
        "the event without a client certificate failed with a retryable TLS error naming the host",
        "SELECT count(*) AS n FROM webhook_inbox WHERE event_id = 'evt_no_cert' AND status <> 2 \
         AND last_error LIKE 'retryable: forward to https://localhost:%/no-client-cert: TLS handshake with localhost failed: %'",
        1,
        Duration::from_secs(30),
    )
    .await;
    worker.stop().await;

    let seen = seen.lock().unwrap().clone();
    let answered: Vec<&Seen> = seen.iter().filter(|s| s.request_line.is_some()).collect();
    assert_eq!(
        answered.len(),
        1,
        "only the mutual-TLS request got through: {seen:?}"
    );
    assert!(
        answered[0].client_certificate,
        "it presented the client certificate"
    );
    assert_eq!(
        answered[0].request_line.as_deref(),
        Some("POST /mtls HTTP/1.1")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

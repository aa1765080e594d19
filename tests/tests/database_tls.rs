//! TLS to PostgreSQL with libpq's `sslmode` meanings, against a server started with
//! `ssl = on` and a certificate for `localhost` signed by a CA made for the test
//! (`scripts/local-postgres`, `LOCAL_POSTGRES_TLS=1`). The binaries are run as processes for
//! their `migrate` and operator commands; the pool is the one both binaries serve with.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::path::Path;
use std::process::Output;

use diesel::sql_types::{Bool, Text};
use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use inbox_core::db::{establish, DatabaseArgs, SessionLimits};
use inbox_tests::chaos::{Binaries, Postgres};

#[derive(QueryableByName, Debug)]
struct Session {
    #[diesel(sql_type = Bool)]
    ssl: bool,
    #[diesel(sql_type = Text)]
    application_name: String,
    #[diesel(sql_type = Text)]
    statement_timeout: String,
    #[diesel(sql_type = Text)]
    idle_in_transaction_timeout: String,
}

const SESSION: &str = "SELECT s.ssl, a.application_name, \
     current_setting('statement_timeout') AS statement_timeout, \
     current_setting('idle_in_transaction_session_timeout') AS idle_in_transaction_timeout \
     FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE pid = pg_backend_pid()";

/// A password the server (trust authentication) ignores, to check it is never printed.
const PASSWORD: &str = "never-printed-7Hq";

async fn tls_server(label: &str) -> Postgres {
    Postgres::start_with(label, &[("LOCAL_POSTGRES_TLS", "1")]).await
}

fn url(server: &Postgres, host: &str, options: &str) -> String {
    format!(
        "postgres://postgres:{PASSWORD}@{host}:{}/postgres?{options}",
        server.port()
    )
}

fn root(server: &Postgres, file: &str) -> String {
    server.folder().join("tls").join(file).display().to_string()
}

async fn run(binary: &Path, args: &[&str], database_url: &str) -> Output {
    tokio::process::Command::new(binary)
        .args(args)
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "info")
        .output()
        .await
        .unwrap_or_else(|err| panic!("running {}: {err}", binary.display()))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn session_of(database_url: &str) -> Session {
    let mut conn = establish(database_url, "tls-test", SessionLimits::default())
        .await
        .unwrap_or_else(|err| panic!("connecting: {err}"));
    diesel::sql_query(SESSION)
        .get_result(&mut conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_against_the_test_ca_serves_migrates_and_runs_operator_commands_over_tls() {
    let server = tls_server("tls-ok").await;
    let binaries = Binaries::locate();
    let verified = url(
        &server,
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            root(&server, "ca.crt")
        ),
    );

    let migrated = run(&binaries.receiver, &["migrate"], &verified).await;
    assert!(
        migrated.status.success(),
        "receiver migrate: {}",
        stderr(&migrated)
    );
    let stats = run(&binaries.worker, &["stats"], &verified).await;
    assert!(stats.status.success(), "worker stats: {}", stderr(&stats));

    let args = DatabaseArgs {
        db_application_name: Some("receiver-tls-test".into()),
        ..DatabaseArgs::for_url(verified.clone())
    };
    let pool = args.pool().unwrap();
    let mut conn = pool.get().await.unwrap();
    let session: Session = diesel::sql_query(SESSION)
        .get_result(&mut *conn)
        .await
        .unwrap();
    assert!(session.ssl, "{session:?}");
    assert_eq!(session.application_name, "receiver-tls-test");
    assert_eq!(session.statement_timeout, "30s");
    assert_eq!(session.idle_in_transaction_timeout, "1min");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_or_host_name_is_refused_with_a_message_saying_which_and_no_password() {
    let server = tls_server("tls-wrong").await;
    let binaries = Binaries::locate();

    let wrong_ca = url(
        &server,
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            root(&server, "other-ca.crt")
        ),
    );
    let refused = run(&binaries.receiver, &["migrate"], &wrong_ca).await;
    let message = stderr(&refused);
    assert!(!refused.status.success());
    assert!(
        message.contains("not signed by a CA of sslrootcert=") && message.contains("other-ca.crt"),
        "{message}"
    );
    assert!(!message.contains(PASSWORD), "{message}");

    // The certificate names localhost only.
    let wrong_host = url(
        &server,
        "127.0.0.1",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            root(&server, "ca.crt")
        ),
    );
    let err = establish(&wrong_host, "tls-test", SessionLimits::default())
        .await
        .err()
        .expect("a certificate for localhost must not pass for 127.0.0.1");
    let message = err.to_string();
    assert!(
        message.contains("not valid for host name 127.0.0.1"),
        "{message}"
    );
    assert!(!message.contains(PASSWORD), "{message}");
    let stats = run(&binaries.worker, &["stats"], &wrong_host).await;
    assert!(!stats.status.success());
    assert!(
        stderr(&stats).contains("not valid for host name"),
        "{}",
        stderr(&stats)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weaker_modes_keep_their_libpq_meaning() {
    let server = tls_server("tls-modes").await;
    let ca = root(&server, "ca.crt");
    // verify-ca checks the chain, not the name.
    let chain_only = url(
        &server,
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    );
    assert!(session_of(&chain_only).await.ssl);
    // require without a root file encrypts without checking the certificate.
    let require = url(&server, "127.0.0.1", "sslmode=require");
    assert!(session_of(&require).await.ssl);
    // ... but with one, checks the chain like verify-ca.
    let require_with_root = url(
        &server,
        "localhost",
        &format!(
            "sslmode=require&sslrootcert={}",
            root(&server, "other-ca.crt")
        ),
    );
    assert!(
        establish(&require_with_root, "tls-test", SessionLimits::default())
            .await
            .is_err()
    );
    // prefer (the default) takes TLS when offered; disable never.
    assert!(session_of(&url(&server, "localhost", "")).await.ssl);
    assert!(
        !session_of(&url(&server, "localhost", "sslmode=disable"))
            .await
            .ssl
    );
    // verify-full without any root file is refused before connecting.
    let no_root = url(&server, "localhost", "sslmode=verify-full");
    let err = DatabaseArgs::for_url(no_root)
        .pool()
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("needs sslrootcert")),
        "{err:?}"
    );
}

//! Connections and failover: a pooled connection that meets a read-only server (a standby, a
//! demoted primary) is closed and replaced, and a multi-host URL with
//! `target_session_attrs=read-write` finds the primary whatever the order of the hosts. The
//! full failover (SIGKILL, promotion, signed load) is a chaos scenario
//! (`chaos_scenarios.rs`).
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use diesel::sql_types::{Bool, Integer, Text};
use diesel::QueryableByName;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use inbox_core::db::DatabaseArgs;
use inbox_core::inbox::{insert_events, notify_new_events, NewEvent};
use inbox_tests::chaos::Postgres;
use inbox_tests::{demo_router, wait_for_count, worker_settings, RunningWorker};

#[derive(QueryableByName)]
struct Backend {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = Text)]
    setting: String,
}

#[derive(QueryableByName)]
struct Recovery {
    #[diesel(sql_type = Bool)]
    in_recovery: bool,
}

async fn backend_pid(conn: &mut diesel_async::AsyncPgConnection) -> diesel::QueryResult<i32> {
    diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result::<Backend>(conn)
        .await
        .map(|backend| backend.pid)
}

/// Both servers, the read-write one wherever it is.
fn multi_host_url(first: &Postgres, second: &Postgres) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        first.port(),
        second.port()
    )
}

fn demo_event(n: usize) -> NewEvent {
    let body = format!(r#"{{"id":"evt_{n}","type":"order.created"}}"#).into_bytes();
    NewEvent {
        provider: "demo".into(),
        event_id: format!("evt_{n}"),
        event_type: Some("order.created".into()),
        headers: serde_json::json!({}),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: None,
        body,
    }
}

async fn set_read_only(url: &str, read_only: bool) {
    let mut admin = test_db::establish(url).await.unwrap();
    admin
        .batch_execute(&format!(
            "ALTER SYSTEM SET default_transaction_read_only = {read_only}"
        ))
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_that_meets_a_read_only_server_is_closed_and_replaced() {
    let server = Postgres::start("read-only").await;
    let pool = DatabaseArgs {
        db_pool_size: 1,
        ..DatabaseArgs::for_url(server.url.clone())
    }
    .pool()
    .unwrap();
    let first_pid = {
        let mut conn = pool.get().await.unwrap();
        conn.batch_execute("CREATE TABLE writes (n int)")
            .await
            .unwrap();
        backend_pid(&mut conn).await.unwrap()
    };

    set_read_only(&server.url, true).await;
    {
        let mut conn = pool.get().await.unwrap();
        assert_eq!(
            backend_pid(&mut conn).await.unwrap(),
            first_pid,
            "the pool's only connection"
        );
        // Each session applies the reloaded setting between two statements of its own.
        inbox_tests::wait_until(
            "the session sees the server read-only",
            Duration::from_secs(10),
            async || {
                diesel::sql_query(
                    "SELECT current_setting('default_transaction_read_only') AS setting",
                )
                .get_result::<Setting>(&mut *conn)
                .await
                .is_ok_and(|row| row.setting == "on")
            },
        )
        .await;
        let refused = conn.batch_execute("INSERT INTO writes VALUES (1)").await;
        assert!(refused.is_err(), "a read-only server refuses the write");
    }
    let mut admin = test_db::establish(&server.url).await.unwrap();
    inbox_tests::wait_until(
        "the refused connection's session ended",
        Duration::from_secs(10),
        async || {
            inbox_tests::count(
                &mut admin,
                &format!("SELECT count(*) AS n FROM pg_stat_activity WHERE pid = {first_pid}"),
            )
            .await
                == 0
        },
    )
    .await;
    set_read_only(&server.url, false).await;

    // The pool opens a new connection, which writes. (The closed one may still be handed out
    // once, if it went back to the pool before it closed: it fails, and is dropped.)
    inbox_tests::wait_until(
        "the pool replaced the connection",
        Duration::from_secs(10),
        async || {
            let Ok(mut conn) = pool.get().await else {
                return false;
            };
            backend_pid(&mut conn)
                .await
                .is_ok_and(|pid| pid != first_pid)
                && conn
                    .batch_execute("INSERT INTO writes VALUES (2)")
                    .await
                    .is_ok()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_host_url_with_target_session_attrs_read_write_skips_the_standby() {
    let primary = Postgres::start("multi-host").await;
    let standby = primary.start_standby(false).await;
    // The standby first: a read-write session must still land on the primary.
    let url = multi_host_url(&standby, &primary);
    let pool = DatabaseArgs::for_url(url).pool().unwrap();
    let mut conn = pool.get().await.unwrap();
    let recovery: Recovery = diesel::sql_query("SELECT pg_is_in_recovery() AS in_recovery")
        .get_result(&mut *conn)
        .await
        .unwrap();
    assert!(!recovery.in_recovery, "connected to the standby");
    conn.batch_execute("CREATE TABLE on_the_primary (n int)")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_worker_listens_on_the_new_primary_and_is_woken_there() {
    let mut primary = Postgres::start("listen-failover").await;
    inbox_core::db::run_migrations(&primary.url).await.unwrap();
    let standby = primary.start_standby(false).await;
    let mut settings = worker_settings("failover");
    // Only a notification can wake it in time.
    settings.poll_interval = Duration::from_secs(600);
    settings.rescue_interval = Duration::from_secs(600);
    let args = DatabaseArgs {
        db_pool_size: 10,
        db_connect_timeout: Duration::from_secs(1),
        ..DatabaseArgs::for_url(multi_host_url(&primary, &standby))
    };
    let worker = RunningWorker::start_on(&args, demo_router(), settings);
    let listening = "SELECT count(*) AS n FROM pg_stat_activity \
                     WHERE datname = current_database() AND query LIKE 'LISTEN %'";
    let done = "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2";
    let mut conn = test_db::establish(&primary.url).await.unwrap();
    wait_for_count(
        &mut conn,
        "the worker listens",
        listening,
        1,
        Duration::from_secs(30),
    )
    .await;

    primary.sigkill().await;
    standby.promote().await;
    let mut conn = test_db::establish(&standby.url).await.unwrap();
    wait_for_count(
        &mut conn,
        "the worker listens on the new primary",
        listening,
        1,
        Duration::from_secs(30),
    )
    .await;
    insert_events(&mut conn, &[demo_event(1)]).await.unwrap();
    notify_new_events(&mut conn).await.unwrap();
    wait_for_count(
        &mut conn,
        "the event is done, long before any poll",
        done,
        1,
        Duration::from_secs(30),
    )
    .await;
    worker.stop().await;
}

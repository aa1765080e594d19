//! Through PgBouncer in session mode (the distribution's `pgbouncer`, installed when
//! missing): migrations, ingest by the receiver and drain by a worker woken by `LISTEN`, all
//! through the pooler.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::time::Duration;

use inbox_core::db::DatabaseArgs;
use inbox_tests::chaos::Postgres;
use inbox_tests::pgbouncer::PgBouncer;
use inbox_tests::*;
use receiver::ingest::IngestMode;

const EVENTS: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_in_session_mode_webhooks_are_migrated_ingested_and_drained() {
    let server = Postgres::start("pgbouncer").await;
    let bouncer = PgBouncer::start(&server, "session").await;
    inbox_core::db::run_migrations(&bouncer.url).await.unwrap();
    let args = DatabaseArgs {
        db_pool_size: 8,
        ..DatabaseArgs::for_url(bouncer.url.clone())
    };
    let receiver = TestReceiver::start(
        serve_args_for_database(args.clone(), IngestMode::GroupCommit),
        providers(DEMO_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;
    let mut settings = worker_settings("pgbouncer");
    // Only notifications, through the pooler, wake it in time.
    settings.poll_interval = Duration::from_secs(600);
    settings.rescue_interval = Duration::from_secs(600);
    let worker = RunningWorker::start_on(&args, demo_router(), settings);

    for n in 0..EVENTS {
        let body = format!(r#"{{"id":"evt-{n}","type":"order.created"}}"#);
        let (status, answer) = receiver.post_demo(&body, DEMO_SECRET).await;
        assert_eq!((status, answer["status"].as_str()), (200, Some("accepted")));
    }
    let mut conn = test_db::establish(&bouncer.url).await.unwrap();
    wait_for_count(
        &mut conn,
        "every event is done",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        EVENTS as i64,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger").await,
        EVENTS as i64
    );
    worker.stop().await;
}

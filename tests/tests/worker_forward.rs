//! The HTTP forward handler against a real HTTP server: exact body, original headers, the
//! idempotency key, retries on 5xx, dead letters on 4xx, `Retry-After` honoured within the
//! retry cap.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use inbox_core::inbox::{insert_events, NewEvent};
use inbox_tests::*;
use test_db::TestDatabase;
use worker::Router;

#[derive(Debug, Clone)]
struct Received {
    path: String,
    idempotency_key: Option<String>,
    signature: Option<String>,
    host: Option<String>,
    body: Vec<u8>,
    at: Instant,
}

#[derive(Default)]
struct Target {
    received: Mutex<Vec<Received>>,
}

async fn record(request: HttpRequest, body: web::Bytes, target: web::Data<Target>) -> HttpResponse {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let path = request.path().to_owned();
    let mut received = target.received.lock().unwrap();
    let attempts_here = received.iter().filter(|r| r.path == path).count();
    received.push(Received {
        path: path.clone(),
        idempotency_key: header("idempotency-key"),
        signature: header("x-signature"),
        host: header("host"),
        body: body.to_vec(),
        at: Instant::now(),
    });
    match path.as_str() {
        // Fails once, then accepts: a retryable failure.
        "/flaky" if attempts_here == 0 => HttpResponse::ServiceUnavailable().finish(),
        "/flaky" => HttpResponse::Ok().finish(),
        // Asks for a pause, then accepts.
        "/throttled" if attempts_here == 0 => HttpResponse::TooManyRequests()
            .insert_header(("retry-after", "2"))
            .finish(),
        // Asks for an hour, more than the retry cap, then accepts.
        "/unavailable-for-an-hour" if attempts_here == 0 => HttpResponse::ServiceUnavailable()
            .insert_header(("retry-after", "3600"))
            .finish(),
        "/throttled" | "/unavailable-for-an-hour" => HttpResponse::Ok().finish(),
        // Rejects: a permanent failure.
        _ => HttpResponse::UnprocessableEntity().finish(),
    }
}

fn event(id: &str, event_type: &str) -> NewEvent {
    NewEvent {
        provider: "demo".into(),
        event_id: id.into(),
        event_type: Some(event_type.into()),
        headers: serde_json::json!({
            "host": "inbox.example",
            "x-signature": "sha256=abc",
            "content-type": "application/json",
        }),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: None,
        body: format!(r#"{{"id":"{id}", "spacing" :  "kept exactly"}}"#).into_bytes(),
    }
}

struct TargetServer {
    addr: std::net::SocketAddr,
    target: web::Data<Target>,
    handle: actix_web::dev::ServerHandle,
}

fn start_target() -> TargetServer {
    let target = web::Data::new(Target::default());
    let (addr, handle) = serve({
        let target = target.clone();
        move |app| {
            app.app_data(target.clone())
                .default_service(web::to(record));
        }
    });
    TargetServer {
        addr,
        target,
        handle,
    }
}

/// An HTTP server of one worker on a port of its own, its app set up by `configure`.
fn serve(
    configure: impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static,
) -> (std::net::SocketAddr, actix_web::dev::ServerHandle) {
    let server = HttpServer::new(move || App::new().configure(configure.clone()))
        .workers(1)
        .disable_signals()
        .bind("127.0.0.1:0")
        .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    tokio::spawn(server);
    (addr, handle)
}

/// Time between the first and the second request the target received on `path`.
fn gap_between_attempts(target: &Target, path: &str) -> Duration {
    let received = target.received.lock().unwrap();
    let at: Vec<Instant> = received
        .iter()
        .filter(|r| r.path == path)
        .map(|r| r.at)
        .collect();
    assert_eq!(at.len(), 2, "{path}: one refusal, then the accepted retry");
    at[1] - at[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_on_429_and_503_delays_the_next_attempt_within_the_retry_cap() {
    let server = start_target();
    let addr = server.addr;
    let routes = format!(
        r#"
        [[routes]]
        event_type = "throttled.*"
        handler = "forward"
        url = "http://{addr}/throttled"
        [[routes]]
        event_type = "unavailable.*"
        handler = "forward"
        url = "http://{addr}/unavailable-for-an-hour"
        "#
    );
    let router =
        worker::routes::parse_routes(&routes, std::path::Path::new("routes.toml")).unwrap();
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    insert_events(
        &mut conn,
        &[
            event("evt_throttled", "throttled.thing"),
            event("evt_unavailable", "unavailable.thing"),
        ],
    )
    .await
    .unwrap();
    // Backoff alone would retry within 20 ms; the cap allows Retry-After up to 3 s.
    let mut settings = worker_settings("w1");
    settings.backoff.cap = Duration::from_secs(3);
    let worker = RunningWorker::start(&db, router, settings);
    wait_for_count(
        &mut conn,
        "both events delivered on their second attempt",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2 AND attempt = 2",
        2,
        Duration::from_secs(30),
    )
    .await;
    worker.stop().await;
    server.handle.stop(true).await;

    let throttled = gap_between_attempts(&server.target, "/throttled");
    assert!(
        throttled >= Duration::from_secs(2),
        "429 with Retry-After: 2 retried after {throttled:?}"
    );
    let unavailable = gap_between_attempts(&server.target, "/unavailable-for-an-hour");
    assert!(
        unavailable >= Duration::from_secs(3) && unavailable < Duration::from_secs(30),
        "503 with Retry-After: 3600 retried at the 3 s cap, after {unavailable:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_events_carry_the_exact_body_and_an_idempotency_key_and_retry_on_5xx_only() {
    let server = start_target();
    let (addr, target, handle) = (server.addr, server.target, server.handle);
    let routes = format!(
        r#"
        [[routes]]
        event_type = "flaky.*"
        handler = "forward"
        url = "http://{addr}/flaky"
        timeout = "5s"
        [[routes]]
        event_type = "rejected.*"
        handler = "forward"
        url = "http://{addr}/rejected"
        "#
    );
    let router =
        worker::routes::parse_routes(&routes, std::path::Path::new("routes.toml")).unwrap();

    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    insert_events(
        &mut conn,
        &[
            event("evt_flaky", "flaky.thing"),
            event("evt_rejected", "rejected.thing"),
        ],
    )
    .await
    .unwrap();
    let worker = RunningWorker::start(&db, router, worker_settings("w1"));
    wait_for_count(&mut conn, "one event done and one dead", "SELECT count(*) AS n FROM webhook_inbox WHERE (event_id = 'evt_flaky' AND status = 2) OR (event_id = 'evt_rejected' AND status = 3)", 2, Duration::from_secs(30)).await;
    worker.stop().await;
    handle.stop(true).await;

    let received = target.received.lock().unwrap().clone();
    let flaky: Vec<&Received> = received.iter().filter(|r| r.path == "/flaky").collect();
    let rejected: Vec<&Received> = received.iter().filter(|r| r.path == "/rejected").collect();
    assert_eq!(flaky.len(), 2, "503 retried once, then accepted");
    assert_eq!(rejected.len(), 1, "422 is permanent: not retried");
    for request in &flaky {
        assert_eq!(request.idempotency_key.as_deref(), Some("demo:evt_flaky"));
        assert_eq!(
            request.signature.as_deref(),
            Some("sha256=abc"),
            "original headers forwarded"
        );
        assert_eq!(
            request.host.as_deref(),
            Some(addr.to_string().as_str()),
            "hop-by-hop headers not"
        );
        assert_eq!(
            request.body,
            br#"{"id":"evt_flaky", "spacing" :  "kept exactly"}"#
        );
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox WHERE event_id = 'evt_rejected' AND last_error LIKE 'permanent: %422%'").await,
        1
    );
}

/// A target that takes requests and answers none until told to.
#[derive(Default)]
struct HeldTarget {
    received: std::sync::atomic::AtomicUsize,
    release: tokio::sync::Notify,
}

async fn hold(target: web::Data<HeldTarget>) -> HttpResponse {
    target
        .received
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    target.release.notified().await;
    HttpResponse::Ok().finish()
}

/// A [`HeldTarget`] serving on a port of its own, and a router forwarding every event to it
/// with `route_options` (TOML lines) in its route.
fn start_held_target(
    route_options: &str,
) -> (web::Data<HeldTarget>, actix_web::dev::ServerHandle, Router) {
    let target = web::Data::new(HeldTarget::default());
    let (addr, handle) = serve({
        let target = target.clone();
        move |app| {
            app.app_data(target.clone()).default_service(web::to(hold));
        }
    });
    let routes = format!(
        "[[routes]]\nhandler = \"forward\"\nurl = \"http://{addr}/slow\"\ntimeout = \"30s\"\n{route_options}"
    );
    let router =
        worker::routes::parse_routes(&routes, std::path::Path::new("routes.toml")).unwrap();
    (target, handle, router)
}

/// `n` events of type `slow.thing`: `evt_0`, `evt_1` and on.
async fn insert_slow_events(conn: &mut diesel_async::AsyncPgConnection, n: usize) {
    let events: Vec<NewEvent> = (0..n)
        .map(|n| event(&format!("evt_{n}"), "slow.thing"))
        .collect();
    insert_events(conn, &events).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_waiting_for_a_routes_max_in_flight_slot_hold_no_database_connection() {
    let (target, handle, router) = start_held_target("max_in_flight = 1\n");
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    insert_slow_events(&mut conn, 6).await;
    let mut settings = worker_settings("w1");
    settings.claimers = 1;
    let worker = RunningWorker::start(&db, router, settings);

    // One request in flight, the five other events waiting for its slot.
    wait_until(
        "five events wait for the route's slot",
        Duration::from_secs(20),
        async || {
            worker.metrics.route_slot_waits.get() == 5
                && target.received.load(std::sync::atomic::Ordering::SeqCst) == 1
        },
    )
    .await;
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND state LIKE 'idle in transaction%'"
        )
        .await,
        0,
        "no event holds a transaction open: neither those waiting for the slot nor the one \
         whose forward is in flight"
    );
    // Each poll lets one held request answer.
    wait_until("every event done", Duration::from_secs(20), async || {
        target.release.notify_one();
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        )
        .await
            == 6
    })
    .await;
    worker.stop().await;
    handle.stop(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_claimed_ahead_of_a_free_slot_are_kept_leased_and_go_back_unspent_at_shutdown() {
    let (target, handle, router) = start_held_target("");
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    insert_slow_events(&mut conn, 10).await;
    let mut settings = worker_settings("w1");
    settings.concurrency = 4;
    settings.claimers = 1;
    settings.lease = Duration::from_secs(2);
    settings.shutdown_grace = Duration::from_millis(200);
    let worker = RunningWorker::start(&db, router, settings);

    // Four forwards in flight, and one event claimed ahead (a quarter of the slots) for the
    // first slot that frees; the five others are left to any worker.
    wait_until(
        "four forwards in flight and one event claimed ahead",
        Duration::from_secs(20),
        async || {
            target.received.load(std::sync::atomic::Ordering::SeqCst) == 4
                && count(
                    &mut conn,
                    "SELECT count(*) AS n FROM webhook_inbox WHERE status = 1",
                )
                .await
                    == 5
        },
    )
    .await;
    // The lease keeper extends the waiting event's lease with the others'.
    let first_expiry = count(
        &mut conn,
        "SELECT (extract(epoch FROM max(locked_until)) * 1000)::bigint AS n \
         FROM webhook_inbox WHERE status = 1",
    )
    .await;
    wait_until(
        "every claimed event's lease extended, the waiting one's included",
        Duration::from_secs(20),
        async || {
            count(
                &mut conn,
                &format!(
                    "SELECT count(*) AS n FROM webhook_inbox WHERE status = 1 \
                     AND locked_until > to_timestamp({first_expiry} / 1000.0)"
                ),
            )
            .await
                == 5
        },
    )
    .await;
    // Stopping abandons the held forwards (past the grace) and gives the waiting event back.
    worker.stop().await;
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE status = 0 AND attempt = 0"
        )
        .await,
        6,
        "the event claimed ahead is ready again, its attempt unspent, beside the five never claimed"
    );
    target.release.notify_waiters();
    handle.stop(true).await;
}

//! The HTTP forward handler against a real HTTP server: exact body, original headers, the
//! idempotency key, retries on 5xx, dead letters on 4xx.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::sync::Mutex;
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use inbox_core::inbox::{insert_events, NewEvent};
use inbox_tests::*;
use test_db::TestDatabase;

#[derive(Debug, Clone)]
struct Received {
    path: String,
    idempotency_key: Option<String>,
    signature: Option<String>,
    host: Option<String>,
    body: Vec<u8>,
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
    });
    match path.as_str() {
        // Fails once, then accepts: a retryable failure.
        "/flaky" if attempts_here == 0 => HttpResponse::ServiceUnavailable().finish(),
        "/flaky" => HttpResponse::Ok().finish(),
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
        body: format!(r#"{{"id":"{id}", "spacing" :  "kept exactly"}}"#).into_bytes(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_events_carry_the_exact_body_and_an_idempotency_key_and_retry_on_5xx_only() {
    let target = web::Data::new(Target::default());
    let server = {
        let target = target.clone();
        HttpServer::new(move || {
            App::new()
                .app_data(target.clone())
                .default_service(web::to(record))
        })
        .workers(1)
        .disable_signals()
        .bind("127.0.0.1:0")
        .unwrap()
    };
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    tokio::spawn(server);

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

//! `inbox-simulator send` against a stand-in receiver that verifies signatures with the
//! receiver's own code and refuses the first attempt at every event with a 503: every
//! genuine event is retried until acknowledged, every forgery is refused, and the report
//! file says so.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use inbox_simulator::{Fate, Report};
use receiver::identify::{identify, Identified};
use receiver::providers::Providers;

const SIMULATOR: &str = env!("CARGO_BIN_EXE_inbox-simulator");

const PROVIDERS: &str = r#"
[providers.stripe]
scheme = "stripe"
secrets = [{ env = "SIM_TEST_STRIPE" }, { env = "SIM_TEST_STRIPE_OLD" }]
[providers.github]
scheme = "github"
secrets = [{ env = "SIM_TEST_GITHUB" }]
[providers.svix]
scheme = "standard-webhooks"
secrets = [{ env = "SIM_TEST_SVIX" }]
[providers.shopify]
scheme = "shopify"
secrets = [{ env = "SIM_TEST_SHOPIFY" }]
[providers.slack]
scheme = "slack"
secrets = [{ env = "SIM_TEST_SLACK" }]
[providers.demo]
scheme = "hmac-sha256"
signature_header = "X-Signature"
prefix = "sha256="
event_id = { json_pointer = "/id" }
event_type = { json_pointer = "/type" }
secrets = [{ env = "SIM_TEST_DEMO" }]
"#;

const SECRETS: [(&str, &str); 7] = [
    ("SIM_TEST_STRIPE", "whsec_sim_test_stripe"),
    ("SIM_TEST_STRIPE_OLD", "whsec_sim_test_stripe_old"),
    ("SIM_TEST_GITHUB", "sim test github"),
    ("SIM_TEST_SVIX", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    ("SIM_TEST_SHOPIFY", "sim-test-shopify"),
    ("SIM_TEST_SLACK", "sim-test-slack"),
    ("SIM_TEST_DEMO", "sim-test-demo"),
];

/// What the stand-in receiver saw, per (provider, event id): attempts, and whether stored.
#[derive(Debug, Default)]
struct Seen {
    attempts: HashMap<(String, String), u32>,
    stored: HashMap<(String, String), Option<String>>,
}

struct State {
    providers: Providers,
    seen: Mutex<Seen>,
}

async fn webhook(
    request: HttpRequest,
    provider: web::Path<String>,
    body: web::Bytes,
    state: web::Data<State>,
) -> HttpResponse {
    let Some(provider) = state.providers.get(&provider) else {
        return HttpResponse::NotFound().finish();
    };
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let url = format!(
        "http://{}{}",
        request.connection_info().host(),
        request.uri()
    );
    let signed = inbox_signature::Request::post(&headers, &body).at(&url);
    if provider
        .scheme
        .verify(&signed, &provider.keys, now)
        .is_err()
    {
        return HttpResponse::Unauthorized().finish();
    }
    let Some(Identified {
        event_id,
        event_type,
        ..
    }) = identify(&provider.identity, &headers, &body)
        .ok()
        .and_then(|mut events| events.pop())
    else {
        return HttpResponse::BadRequest().finish();
    };
    let key = (provider.name.clone(), event_id);
    let mut seen = state.seen.lock().unwrap();
    let attempts = seen.attempts.entry(key.clone()).or_default();
    *attempts += 1;
    if *attempts == 1 {
        // The database blinked: the provider must come back.
        return HttpResponse::ServiceUnavailable()
            .insert_header(("retry-after", "1"))
            .finish();
    }
    let status = match seen.stored.entry(key) {
        std::collections::hash_map::Entry::Occupied(_) => "duplicate",
        std::collections::hash_map::Entry::Vacant(slot) => {
            slot.insert(event_type);
            "accepted"
        }
    };
    HttpResponse::Ok().json(serde_json::json!({ "status": status }))
}

fn providers() -> Providers {
    Providers::parse(PROVIDERS, Path::new("providers.toml"), &|var| {
        SECRETS
            .iter()
            .find(|(name, _)| *name == var)
            .map(|(_, value)| (*value).to_owned())
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_is_retried_until_acknowledged_forgeries_are_refused_and_the_report_says_so() {
    let state = web::Data::new(State {
        providers: providers(),
        seen: Mutex::new(Seen::default()),
    });
    let server_state = state.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(server_state.clone())
            .route("/webhooks/{provider}", web::post().to(webhook))
    })
    .workers(2)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    tokio::spawn(server);

    let folder = std::env::temp_dir().join(format!("simulator-binary-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let config = folder.join("providers.toml");
    let report_file = folder.join("report.json");
    std::fs::write(&config, PROVIDERS).unwrap();

    let run = tokio::process::Command::new(SIMULATOR)
        .args(["send", "--url", &format!("http://{addr}"), "--config"])
        .arg(&config)
        .args(["--events", "300", "--seed", "9", "--run-id", "bin"])
        .args(["--retry-base", "10ms", "--retry-cap", "50ms"])
        .args(["--late-delay", "10ms", "--progress-every", "0s", "--report"])
        .arg(&report_file)
        .envs(SECRETS)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the simulator finishes within 2 minutes")
        .unwrap();
    handle.stop(true).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("never acked: 0"), "{stdout}");

    let report: Report = serde_json::from_slice(&std::fs::read(&report_file).unwrap()).unwrap();
    std::fs::remove_dir_all(&folder).unwrap();
    let totals = &report.totals;
    assert_eq!(report.events.len(), 300);
    assert_eq!(totals.unacked_events, 0);
    assert_eq!(totals.forged_accepted, 0);
    assert_eq!(totals.forged_rejected, totals.forged_deliveries);
    assert!(totals.forged_deliveries > 0 && totals.duplicates > 0);
    assert_eq!(
        totals.accepted, totals.genuine_events,
        "one `accepted` per event"
    );
    assert_eq!(
        totals.refused, totals.genuine_events,
        "each event's first attempt got 503"
    );
    assert_eq!(totals.requests, totals.deliveries + totals.refused);

    let seen = state.seen.lock().unwrap();
    assert_eq!(seen.stored.len() as u64, totals.genuine_events);
    for event in &report.events {
        let key = (event.provider.clone(), event.event_id.clone());
        match event.expected {
            Fate::Rejected => assert!(!seen.stored.contains_key(&key), "{event:?}"),
            _ => {
                assert!(event.acked, "{event:?}");
                assert_eq!(seen.stored.get(&key), Some(&event.event_type), "{event:?}");
            }
        }
    }
}

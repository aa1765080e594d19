//! The console in a real headless Chromium, driven through WebDriver (chromedriver): log in as
//! viewer and as operator, filter by payload, open an event whose body, header and id hold
//! script (nothing runs), replay by filter with the estimate shown first, pause a route and
//! see its events wait, read the refusals and release a suppressed replay, find the audit
//! entries, and be refused a repair as viewer and without a CSRF token. Screenshots go to
//! target/console-screenshots/.
//!
//! The distribution's `chromium` and `chromium-driver` are installed when missing (as root,
//! through apt-get), like PostgreSQL for the other tests.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use inbox_core::inbox::pause;
use support::{claim_all, event, store, TestConsole, OPERATOR, VIEWER};

const SCRIPT_BODY: &str = r#"{"note": "<script>window.__pwned = 'body'</script>", "html": "<img src=x onerror=\"window.__pwned='img'\">"}"#;
const SCRIPT_EVENT_ID: &str = "<svg onload=\"window.__pwned='id'\">";

fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Installs the distribution's chromium and chromedriver when either is missing.
fn ensure_chromium() {
    if installed("chromium") && installed("chromedriver") {
        return;
    }
    assert!(running_as_root(), "chromium and chromedriver are missing: install the distribution's chromium and chromium-driver");
    let update = Command::new("apt-get").arg("update").status().unwrap();
    assert!(update.success(), "apt-get update failed");
    let install = Command::new("apt-get")
        .args(["install", "-y", "chromium", "chromium-driver"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .unwrap();
    assert!(install.success(), "installing chromium failed");
}

/// A chromedriver process, stopped when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_driver() -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let driver = Driver { child, port };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = reqwest::get(format!("http://127.0.0.1:{port}/status")).await;
        if ready.is_ok_and(|answer| answer.status().is_success()) {
            return driver;
        }
        assert!(
            Instant::now() < deadline,
            "chromedriver did not answer within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn browser(driver: &Driver) -> Client {
    let mut args = vec![
        "--headless=new",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ];
    if running_as_root() {
        args.push("--no-sandbox");
    }
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({ "args": args }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .unwrap()
}

fn screenshot_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    std::fs::write(screenshot_dir().join(format!("{name}.png")), png).unwrap();
}

/// The text of the element `css` selects, once the page has it.
async fn text(client: &Client, css: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(element) = client.wait().for_element(Locator::Css(css)).await {
            if let Ok(text) = element.text().await {
                return text;
            }
        }
        assert!(Instant::now() < deadline, "no element {css}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Clicks a link or a form's button, then waits until the browser has left the page (its
/// old document is gone), so what follows reads the next page.
async fn click(client: &Client, locator: Locator<'_>) {
    let old_page = client.find(Locator::Css("html")).await.unwrap();
    client
        .wait()
        .for_element(locator)
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while old_page.tag_name().await.is_ok() {
        assert!(Instant::now() < deadline, "the click led to no new page");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn log_in(client: &Client, console: &TestConsole, (user, password): (&str, &str)) {
    client.goto(&console.url("/login")).await.unwrap();
    client
        .find(Locator::Css("input[name=username]"))
        .await
        .unwrap()
        .send_keys(user)
        .await
        .unwrap();
    client
        .find(Locator::Css("input[name=password]"))
        .await
        .unwrap()
        .send_keys(password)
        .await
        .unwrap();
    click(client, Locator::Id("login")).await;
    assert_eq!(
        text(client, "header .who span").await,
        format!(
            "{user} ({})",
            if user == OPERATOR.0 {
                "operator"
            } else {
                "viewer"
            }
        )
    );
}

async fn log_out(client: &Client) {
    click(client, Locator::Css("header form button")).await;
    client
        .wait()
        .for_element(Locator::Id("login"))
        .await
        .unwrap();
}

/// Nothing an event held ran: the marker its scripts would set is absent.
async fn nothing_ran(client: &Client) {
    let marker = client
        .execute(
            "return window.__pwned === undefined ? null : String(window.__pwned);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        marker,
        serde_json::Value::Null,
        "a script from an event ran"
    );
}

/// Posts a form with the browser's session cookie but the given CSRF token (or none).
async fn post_with_session(
    client: &Client,
    console: &TestConsole,
    path: &str,
    form: &[(&str, &str)],
) -> (u16, String) {
    let name = console.cookies.session;
    let cookie = client.get_named_cookie(name).await.unwrap();
    let answer = reqwest::Client::new()
        .post(console.url(path))
        .header("cookie", format!("{name}={}", cookie.value()))
        .form(form)
        .send()
        .await
        .unwrap();
    (answer.status().as_u16(), answer.text().await.unwrap())
}

#[tokio::test]
async fn an_operator_and_a_viewer_use_the_console_in_chromium() {
    ensure_chromium();
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    let mut script_event = event("evil", SCRIPT_EVENT_ID, "<b>bold</b>", SCRIPT_BODY);
    script_event.headers = serde_json::json!({"x-note": "<script>window.__pwned='header'</script>", "x-api-key": "sk_live_secret"});
    let ids = store(
        &mut conn,
        &[
            event(
                "stripe",
                "evt_ok",
                "charge.succeeded",
                r#"{"data": {"customer": "cus_A"}}"#,
            ),
            event(
                "stripe",
                "evt_b1",
                "charge.failed",
                r#"{"data": {"customer": "cus_B", "amount": 1}}"#,
            ),
            event(
                "stripe",
                "evt_b2",
                "charge.failed",
                r#"{"data": {"customer": "cus_B", "amount": 2}}"#,
            ),
            event(
                "stripe",
                "evt_c",
                "charge.failed",
                r#"{"data": {"customer": "cus_C"}}"#,
            ),
            script_event,
        ],
    )
    .await;
    claim_all(&mut conn, &ids[1..]).await;

    let driver = start_driver().await;
    let client = browser(&driver).await;

    // A viewer sees the overview and the events, and no repair form.
    log_in(&client, &console, VIEWER).await;
    assert_eq!(text(&client, "#dead-24h").await, "4");
    screenshot(&client, "overview").await;
    client.goto(&console.url("/events")).await.unwrap();
    assert!(client.find(Locator::Id("replay-matching")).await.is_err());
    let viewer_csrf = client
        .find(Locator::Css("input[name=csrf_token]"))
        .await
        .unwrap()
        .attr("value")
        .await
        .unwrap()
        .unwrap();
    let (status, page) = post_with_session(
        &client,
        &console,
        "/replay",
        &[
            ("csrf_token", &viewer_csrf),
            ("provider", "stripe"),
            ("estimated", "3"),
        ],
    )
    .await;
    assert_eq!(status, 403);
    assert!(page.contains("Viewers cannot repair"));

    // The event holding script in its body, a header and its id: shown as text, nothing runs,
    // the credential header is hidden.
    client
        .goto(&console.url(&format!("/events/{}", ids[4])))
        .await
        .unwrap();
    assert_eq!(text(&client, "#event-id").await, SCRIPT_EVENT_ID);
    assert!(text(&client, "#body")
        .await
        .contains("<script>window.__pwned = 'body'</script>"));
    let headers = text(&client, "#headers").await;
    assert!(headers.contains("<script>window.__pwned='header'</script>"));
    assert!(!headers.contains("sk_live_secret"));
    nothing_ran(&client).await;
    screenshot(&client, "event-with-script").await;
    log_out(&client).await;

    // An operator filters by payload and replays what matches, the estimate shown first.
    log_in(&client, &console, OPERATOR).await;
    client.goto(&console.url("/events")).await.unwrap();
    client
        .find(Locator::Css("input[name=body]"))
        .await
        .unwrap()
        .send_keys(r#"{"data": {"customer": "cus_B"}}"#)
        .await
        .unwrap();
    click(&client, Locator::Id("apply-filter")).await;
    let listed = text(&client, "#events").await;
    assert!(
        listed.contains("evt_b1") && listed.contains("evt_b2"),
        "{listed}"
    );
    assert!(
        !listed.contains("evt_c") && !listed.contains("evt_ok"),
        "{listed}"
    );
    screenshot(&client, "events-filtered-by-payload").await;
    click(&client, Locator::Id("replay-matching")).await;
    assert_eq!(text(&client, "#estimated").await, "2");
    screenshot(&client, "replay-estimate").await;
    // Without the CSRF token the same replay is refused.
    let (status, page) = post_with_session(
        &client,
        &console,
        "/replay",
        &[
            ("body", r#"{"data": {"customer": "cus_B"}}"#),
            ("estimated", "2"),
        ],
    )
    .await;
    assert_eq!(status, 403);
    assert!(page.contains("CSRF token"));
    click(&client, Locator::Id("confirm-replay")).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while text(&client, "#job-state").await != "done" {
        assert!(Instant::now() < deadline, "the replay did not finish");
        client.refresh().await.unwrap();
    }
    assert_eq!(text(&client, "#job-replayed").await, "2");
    screenshot(&client, "replay-done").await;
    let claimed = claim_all(&mut conn, &[]).await;
    assert!(
        claimed.contains(&ids[1]) && claimed.contains(&ids[2]),
        "the replayed events are ready again"
    );
    assert!(
        !claimed.contains(&ids[3]),
        "an event outside the filter was replayed"
    );

    // Pausing a route: its events wait, ready, while the others are claimed.
    client.goto(&console.url("/routes")).await.unwrap();
    client
        .find(Locator::Css("form input[name=provider]"))
        .await
        .unwrap()
        .send_keys("github")
        .await
        .unwrap();
    click(&client, Locator::Id("pause")).await;
    assert!(text(&client, "#paused").await.contains("github"));
    screenshot(&client, "route-paused").await;
    let waiting = store(
        &mut conn,
        &[
            event("github", "push_1", "push", "{}"),
            event("github", "push_2", "push", "{}"),
        ],
    )
    .await;
    let claimed = claim_all(&mut conn, &[]).await;
    assert!(
        !claimed.contains(&waiting[0]) && !claimed.contains(&waiting[1]),
        "paused events were claimed"
    );
    client
        .goto(&console.url("/events?provider=github"))
        .await
        .unwrap();
    let listed = text(&client, "#events").await;
    assert_eq!(listed.matches("ready").count(), 2, "{listed}");
    client.goto(&console.url("/routes")).await.unwrap();
    click(&client, Locator::Css("button.resume")).await;
    assert!(pause::paused_routes(&mut conn).await.unwrap().is_empty());
    let claimed = claim_all(&mut conn, &[]).await;
    assert!(
        claimed.contains(&waiting[0]) && claimed.contains(&waiting[1]),
        "resumed events were not claimed"
    );

    // Refusals grouped by cause, and a suppressed replay (its id chosen by the sender)
    // released from its row.
    let refusal = |cause: &str, request_id: &str| inbox_core::rejections::NewRejection {
        at: chrono::Utc::now(),
        provider: "github".into(),
        cause: cause.into(),
        status: 401,
        request_id: request_id.into(),
        headers: serde_json::json!({}),
        body_bytes: 180,
        body_sha256: None,
    };
    inbox_core::rejections::insert(
        &mut conn,
        &[
            refusal("invalid_signature", "2f1c0a9e-7d41"),
            refusal("invalid_signature", "8b3e55d2-0c17"),
            refusal("missing_signature", "c40d1e7a-93b2"),
        ],
    )
    .await
    .unwrap();
    let guarded = |event_id: &str| inbox_core::inbox::NewEvent {
        replays: inbox_core::inbox::ReplayCheck::SameBody,
        ..event("github", event_id, "push", r#"{"ref":"refs/heads/main"}"#)
    };
    inbox_core::inbox::insert_events(
        &mut conn,
        &[guarded("delivery-1"), guarded(SCRIPT_EVENT_ID)],
    )
    .await
    .unwrap();
    client.goto(&console.url("/refusals")).await.unwrap();
    let refusals = text(&client, "#refusals").await;
    assert!(
        refusals.contains("github invalid_signature 401 2"),
        "{refusals}"
    );
    assert!(text(&client, "#suppressed-replays")
        .await
        .contains(SCRIPT_EVENT_ID));
    screenshot(&client, "refusals").await;
    nothing_ran(&client).await;
    click(&client, Locator::Css("button.release")).await;
    assert!(inbox_core::replays::list(&mut conn, None, None, 10)
        .await
        .unwrap()
        .is_empty());

    // The audit shows who did what, on which filter, estimated and done.
    client.goto(&console.url("/audit")).await.unwrap();
    let audit = text(&client, "#audit").await;
    for expected in [
        "replay_filter",
        "cus_B",
        "pause",
        "resume",
        "release_replay",
        OPERATOR.0,
    ] {
        assert!(audit.contains(expected), "audit lacks {expected}: {audit}");
    }
    let replay_row = client
        .find(Locator::XPath(
            "//table[@id='audit']//tr[td[3]='replay_filter']",
        ))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(replay_row.contains("2 2 done"), "{replay_row}");
    screenshot(&client, "audit").await;
    nothing_ran(&client).await;

    client.close().await.unwrap();
    drop(driver);
    console.running.stop().await;
}

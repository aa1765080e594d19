//! What the console's tests share: a console on its own test database with two users, events
//! put into given states through inbox-core's transitions, and a plain HTTP client that logs
//! in the way a browser does.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use argon2::Argon2;
use console::server::{self, RunningConsole, ServeArgs};
use console::sessions::CookieNames;
use diesel_async::AsyncPgConnection;
use inbox_core::inbox::{self, NewEvent};
use sha2::{Digest, Sha256};
use test_db::TestDatabase;

pub const OPERATOR: (&str, &str) = ("olivia", "olivia-password");
pub const VIEWER: (&str, &str) = ("victor", "victor-password");

/// Cheap argon2 parameters: the tests log in often, and debug builds hash slowly.
fn cheap_hash(password: &str) -> String {
    let params = argon2::Params::new(8, 1, 1, None).unwrap();
    let argon2 = Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    console::users::hash_with(&argon2, password).unwrap()
}

pub struct TestConsole {
    pub db: TestDatabase,
    pub running: RunningConsole,
    pub cookies: CookieNames,
}

impl TestConsole {
    pub async fn start(read_only: bool) -> Self {
        Self::start_with(read_only, false, Duration::from_secs(10)).await
    }

    /// A console whose searches of the bodies end after `timeout`.
    pub async fn start_with_body_search_timeout(timeout: Duration) -> Self {
        Self::start_with(false, false, timeout).await
    }

    /// A console whose cookies are `Secure` (and `__Host-` named), as in production; the tests
    /// still reach it over plain HTTP, which the server does not check.
    pub async fn start_with_secure_cookies() -> Self {
        Self::start_with(false, true, Duration::from_secs(10)).await
    }

    async fn start_with(
        read_only: bool,
        cookie_secure: bool,
        body_search_timeout: Duration,
    ) -> Self {
        let db = TestDatabase::new().await;
        let users = format!(
            "{}:operator:{} {}:viewer:{}",
            OPERATOR.0,
            cheap_hash(OPERATOR.1),
            VIEWER.0,
            cheap_hash(VIEWER.1)
        );
        let args = ServeArgs {
            listen: "127.0.0.1:0".parse().unwrap(),
            metrics_listen: "127.0.0.1:0".parse().unwrap(),
            users_file: None,
            users: Some(users),
            session_lifetime: Duration::from_secs(3600),
            cookie_secure,
            read_only,
            replay_batch: 1,
            body_search_timeout,
            trusted_proxies: "127.0.0.1".parse().unwrap(),
            db: db.args(4),
        };
        let running = server::start(&args).await.unwrap();
        Self {
            db,
            running,
            cookies: CookieNames::new(cookie_secure),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.running.addr)
    }

    /// The text of its /metrics.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.running.metrics_addr))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

pub fn event(provider: &str, event_id: &str, event_type: &str, body: &str) -> NewEvent {
    NewEvent {
        provider: provider.to_owned(),
        event_id: event_id.to_owned(),
        event_type: Some(event_type.to_owned()),
        headers: serde_json::json!({"content-type": "application/json"}),
        body: body.as_bytes().to_vec(),
        body_sha256: Sha256::digest(body.as_bytes()).into(),
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: None,
    }
}

/// Stores `events` (ready) and returns their row ids, in order.
pub async fn store(conn: &mut AsyncPgConnection, events: &[NewEvent]) -> Vec<i64> {
    inbox::insert_events(conn, events).await.unwrap();
    let mut ids = Vec::new();
    for event in events {
        let detail = inbox_core::operations::show(conn, &event.provider, &event.event_id)
            .await
            .unwrap()
            .unwrap();
        ids.push(detail.summary.id);
    }
    ids
}

/// Claims every due event as a worker would, and returns the claimed ids (their leases are
/// then given back, attempts unspent, unless `kill` names them: those go dead).
pub async fn claim_all(conn: &mut AsyncPgConnection, kill: &[i64]) -> Vec<i64> {
    let claim = inbox::claim_due(conn, "test-worker", Duration::from_secs(30), 1_000)
        .await
        .unwrap();
    let ids: Vec<i64> = claim.events.iter().map(|event| event.id).collect();
    let mut release = Vec::new();
    for id in &ids {
        if kill.contains(id) {
            inbox::dead_letter(conn, *id, claim.lease_token, "downstream said 500")
                .await
                .unwrap();
        } else {
            release.push(*id);
        }
    }
    inbox::release_unstarted(conn, &release, claim.lease_token)
        .await
        .unwrap();
    ids
}

/// A logged-in plain HTTP client (no cookie jar: the session cookie is sent by hand).
pub struct HttpSession {
    pub client: reqwest::Client,
    pub cookie: String,
    pub csrf_token: String,
}

pub fn set_cookie_value(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .filter_map(|value| value.split(';').next())
        .filter_map(|pair| pair.split_once('='))
        .find(|(cookie, value)| *cookie == name && !value.is_empty())
        .map(|(_, value)| value.to_owned())
}

/// The value of the first hidden input named `name` in `html`.
pub fn hidden_value(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html.find(&marker).unwrap() + marker.len();
    html[start..].split('"').next().unwrap().to_owned()
}

/// Submits the login form as a browser does (the form first, for its token and cookie).
pub async fn try_log_in(
    client: &reqwest::Client,
    console: &TestConsole,
    (user, password): (&str, &str),
) -> reqwest::Response {
    let form = client.get(console.url("/login")).send().await.unwrap();
    let login = console.cookies.login;
    let login_cookie = set_cookie_value(&form, login).unwrap();
    let token = hidden_value(&form.text().await.unwrap(), "login_token");
    client
        .post(console.url("/login"))
        .header("cookie", format!("{login}={login_cookie}"))
        .form(&[
            ("username", user),
            ("password", password),
            ("login_token", &token),
        ])
        .send()
        .await
        .unwrap()
}

impl HttpSession {
    pub async fn log_in(console: &TestConsole, (user, password): (&str, &str)) -> Self {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let answer = try_log_in(&client, console, (user, password)).await;
        assert_eq!(answer.status(), 303, "login of {user}");
        let cookie = set_cookie_value(&answer, console.cookies.session).unwrap();
        let mut session = Self {
            client,
            cookie,
            csrf_token: String::new(),
        };
        let overview = session.get(console, "/").await;
        session.csrf_token = hidden_value(&overview.text().await.unwrap(), "csrf_token");
        session
    }

    pub async fn get(&self, console: &TestConsole, path: &str) -> reqwest::Response {
        self.client
            .get(console.url(path))
            .header("cookie", self.cookie_header(console))
            .send()
            .await
            .unwrap()
    }

    /// The `Cookie` header that carries the session.
    pub fn cookie_header(&self, console: &TestConsole) -> String {
        format!("{}={}", console.cookies.session, self.cookie)
    }

    /// The page of the replay job at `job` once it no longer runs (within ten seconds).
    pub async fn job_page_once_ended(&self, console: &TestConsole, job: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let page = self.get(console, job).await.text().await.unwrap();
            if !page.contains(r#"id="job-state">running<"#) {
                return page;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the replay at {job} did not end"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    pub async fn post(
        &self,
        console: &TestConsole,
        path: &str,
        form: &[(&str, &str)],
    ) -> reqwest::Response {
        self.client
            .post(console.url(path))
            .header("cookie", self.cookie_header(console))
            .form(form)
            .send()
            .await
            .unwrap()
    }
}

/// The one bigint column `n` of `sql`'s row.
pub async fn count_of(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let row: Count = diesel_async::RunQueryDsl::get_result(diesel::sql_query(sql), conn)
        .await
        .unwrap();
    row.n
}

/// A connection holding the finished row `id` locked in an open transaction (`COMMIT` it to
/// let go): a replay's batch that reaches the row waits there.
pub async fn holding_finished_row(db: &TestDatabase, id: i64) -> AsyncPgConnection {
    let mut blocker = db.connect().await;
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut blocker,
        &format!("BEGIN; SELECT id FROM inbox_finished WHERE id = {id} FOR UPDATE"),
    )
    .await
    .unwrap();
    blocker
}

/// Key `pi_1` blocked by its dead head `head` (sequence 1), with the queued event `behind`
/// (sequence 2) waiting behind it.
pub async fn block_key_behind_dead_head(conn: &mut AsyncPgConnection, head: i64, behind: i64) {
    diesel_async::SimpleAsyncConnection::batch_execute(
        conn,
        &format!(
            "INSERT INTO inbox_dead_ordering (id, ordering_key, ordering_sequence) VALUES ({head}, 'pi_1', 1); \
             INSERT INTO inbox_keys (ordering_key, blocked_by, blocked_since) VALUES ('pi_1', {head}, now()) \
             ON CONFLICT (ordering_key) DO UPDATE SET blocked_by = excluded.blocked_by, blocked_since = excluded.blocked_since; \
             UPDATE inbox_queue SET ordering_key = 'pi_1', ordering_sequence = 2 WHERE id = {behind}"
        ),
    )
    .await
    .unwrap();
}

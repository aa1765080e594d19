//! The console over plain HTTP: keyset pages, paused routes against a worker's claim, and
//! every refusal of a state change (no session, viewer, no CSRF token, read-only mode).
#![allow(clippy::unwrap_used)]

mod support;

use inbox_core::inbox::pause;
use inbox_core::operations::browse::{self, EventQuery};
use inbox_core::InboxStatus;
use support::{
    block_key_behind_dead_head, claim_all, count_of, event, holding_finished_row, store,
    HttpSession, TestConsole, OPERATOR, VIEWER,
};

#[tokio::test]
async fn keyset_pages_cover_every_matching_event_once_newest_first() {
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    let events: Vec<_> = (0..120)
        .map(|n| {
            let provider = if n % 3 == 0 { "github" } else { "stripe" };
            event(
                provider,
                &format!("evt_{n}"),
                "push",
                &format!(r#"{{"n": {n}, "even": {}}}"#, n % 2 == 0),
            )
        })
        .collect();
    // Three statements, three arrival times: pages cross from one to the next.
    let mut ids = Vec::new();
    for chunk in events.chunks(40) {
        ids.extend(store(&mut conn, chunk).await);
    }
    let query = EventQuery {
        provider: Some("stripe".into()),
        body_contains: Some(serde_json::json!({"even": true})),
        ..EventQuery::default()
    };
    browse::tune_session(&mut conn, None).await.unwrap();
    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let page = browse::list_page(&mut conn, &query, before, 7)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        seen.extend(page.iter().map(|row| row.id));
    }
    let mut expected: Vec<i64> = ids
        .iter()
        .enumerate()
        .filter(|(n, _)| n % 3 != 0 && n % 2 == 0)
        .map(|(_, id)| *id)
        .collect();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(seen, expected);

    #[derive(diesel::QueryableByName)]
    struct Settings {
        #[diesel(sql_type = diesel::sql_types::Text)]
        plan_cache_mode: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        jit: String,
    }
    let settings: Settings = diesel_async::RunQueryDsl::get_result(
        diesel::sql_query("SELECT current_setting('plan_cache_mode') AS plan_cache_mode, current_setting('jit') AS jit"),
        &mut conn,
    )
    .await
    .unwrap();
    assert_eq!(
        (settings.plan_cache_mode.as_str(), settings.jit.as_str()),
        ("force_custom_plan", "off")
    );

    // The state filter and the dead count agree with the transitions.
    let mut dead: Vec<i64> = ids.iter().copied().take(5).collect();
    dead.sort_unstable();
    claim_all(&mut conn, &dead).await;
    let dead_query = EventQuery {
        status: Some(InboxStatus::Dead),
        ..EventQuery::default()
    };
    let listed = browse::list_page(&mut conn, &dead_query, None, 50)
        .await
        .unwrap();
    assert_eq!(
        listed.iter().map(|row| row.id).rev().collect::<Vec<_>>(),
        dead
    );
    assert_eq!(
        browse::count_dead(&mut conn, &EventQuery::default())
            .await
            .unwrap(),
        5
    );
    let extent = browse::dead_extent(&mut conn, &EventQuery::default())
        .await
        .unwrap();
    assert_eq!((extent.rows, extent.last_id), (5, dead.last().copied()));
    assert_eq!(
        browse::dead_ids_within(&mut conn, &EventQuery::default(), &extent, dead[1], 2)
            .await
            .unwrap(),
        dead[2..4]
    );
    console.running.stop().await;
}

/// The purge deletes a day's outcomes before it detaches the day's partition: meanwhile its
/// events have a journal row and no state. Pages and lists leave them out rather than fail.
#[tokio::test]
async fn an_event_whose_day_is_being_dropped_is_left_out_instead_of_failing_the_page() {
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    let events: Vec<_> = (0..3)
        .map(|n| event("stripe", &format!("evt_{n}"), "push", "{}"))
        .collect();
    let ids = store(&mut conn, &events).await;
    let dropping = ids[1];
    claim_all(&mut conn, &[dropping]).await;
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(format!("DELETE FROM inbox_finished WHERE id = {dropping}")),
        &mut conn,
    )
    .await
    .unwrap();

    let listed = browse::list_page(&mut conn, &EventQuery::default(), None, 50)
        .await
        .unwrap();
    assert_eq!(
        listed.iter().map(|row| row.id).collect::<Vec<_>>(),
        [ids[2], ids[0]]
    );
    assert!(browse::event_by_id(&mut conn, dropping)
        .await
        .unwrap()
        .is_none());
    let session = HttpSession::log_in(&console, VIEWER).await;
    assert_eq!(session.get(&console, "/events").await.status(), 200);
    assert_eq!(
        session
            .get(&console, &format!("/events/{dropping}"))
            .await
            .status(),
        404
    );
    console.running.stop().await;
}

/// Searches of the bodies parse every body they reach: two run at once, a third is refused
/// (429) rather than take another pooled connection, and one that outlasts
/// `--body-search-timeout` is cancelled on the server and answered 503 with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_of_the_bodies_take_turns_and_end_at_their_timeout() {
    let console =
        TestConsole::start_with_body_search_timeout(std::time::Duration::from_secs(1)).await;
    let mut conn = console.db.connect().await;
    store(
        &mut conn,
        &[event("stripe", "evt_1", "push", r#"{"n": 1}"#)],
    )
    .await;
    let session = HttpSession::log_in(&console, VIEWER).await;
    // Searches wait behind this lock as they would behind a long scan.
    let mut holder = console.db.connect().await;
    for sql in ["BEGIN", "LOCK TABLE inbox_events IN ACCESS EXCLUSIVE MODE"] {
        diesel_async::RunQueryDsl::execute(diesel::sql_query(sql), &mut holder)
            .await
            .unwrap();
    }
    let search = "/events?body=%7B%22n%22%3A1%7D";
    let (first, second, third) = tokio::join!(
        session.get(&console, search),
        session.get(&console, search),
        async {
            wait_for_lock_waits(&mut conn, 2).await;
            session.get(&console, search).await
        }
    );
    assert_eq!(third.status(), 429, "a third search at once");
    for answer in [first, second] {
        assert_eq!(answer.status(), 503);
        let page = answer.text().await.unwrap();
        assert!(page.contains("did not finish within 1s"), "{page}");
    }
    diesel_async::RunQueryDsl::execute(diesel::sql_query("ROLLBACK"), &mut holder)
        .await
        .unwrap();
    let page = session.get(&console, search).await;
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("evt_1"));
    console.running.stop().await;
}

/// Waits until `sessions` sessions of the test's database wait for a lock.
async fn wait_for_lock_waits(conn: &mut diesel_async::AsyncPgConnection, sessions: i64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let waiting = count_of(
            conn,
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .await;
        if waiting == sessions {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{waiting} session(s) wait for a lock, not {sessions}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_paused_routes_events_stay_ready_and_are_not_claimed_until_resumed() {
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    assert!(
        pause::pause_route(&mut conn, "github", pause::EVERY_EVENT_TYPE, "olivia")
            .await
            .unwrap()
    );
    assert!(
        pause::pause_route(&mut conn, "stripe", "charge.failed", "olivia")
            .await
            .unwrap()
    );
    assert!(!pause::pause_route(&mut conn, "github", "*", "olivia")
        .await
        .unwrap());
    let ids = store(
        &mut conn,
        &[
            event("github", "g1", "push", "{}"),
            event("stripe", "s1", "charge.failed", "{}"),
            event("stripe", "s2", "charge.succeeded", "{}"),
        ],
    )
    .await;
    assert_eq!(claim_all(&mut conn, &[ids[2]]).await, vec![ids[2]]);
    // Nothing claimable is due, so a worker does not wake for the paused ones.
    assert_eq!(
        inbox_core::operations::next_due(&mut conn).await.unwrap(),
        None
    );
    assert!(pause::resume_route(&mut conn, "github", "*").await.unwrap());
    assert_eq!(claim_all(&mut conn, &[]).await, vec![ids[0]]);
    assert_eq!(pause::paused_routes(&mut conn).await.unwrap().len(), 1);
    console.running.stop().await;
}

#[tokio::test]
async fn state_changes_are_refused_without_session_role_csrf_token_or_when_read_only() {
    let console = TestConsole::start(false).await;
    let pause_form = |token: &str| {
        vec![
            ("csrf_token", token.to_owned()),
            ("provider", "github".to_owned()),
        ]
    };

    let anonymous = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let answer = anonymous.get(console.url("/events")).send().await.unwrap();
    assert_eq!(answer.status(), 303);
    assert_eq!(answer.headers()["location"], "/login");
    let answer = anonymous
        .post(console.url("/routes/pause"))
        .form(&pause_form("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 303);

    let viewer = HttpSession::log_in(&console, VIEWER).await;
    let form = pause_form(&viewer.csrf_token);
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let answer = viewer.post(&console, "/routes/pause", &form).await;
    assert_eq!(answer.status(), 403);
    assert!(answer
        .text()
        .await
        .unwrap()
        .contains("Viewers cannot repair"));

    let operator = HttpSession::log_in(&console, OPERATOR).await;
    for token in ["", "0123", viewer.csrf_token.as_str()] {
        let answer = operator
            .post(
                &console,
                "/routes/pause",
                &[("csrf_token", token), ("provider", "github")],
            )
            .await;
        assert_eq!(answer.status(), 403, "token {token:?}");
        assert!(answer.text().await.unwrap().contains("CSRF token"));
    }
    let mut conn = console.db.connect().await;
    assert!(pause::paused_routes(&mut conn).await.unwrap().is_empty());
    let answer = operator
        .post(
            &console,
            "/routes/pause",
            &[("csrf_token", &operator.csrf_token), ("provider", "github")],
        )
        .await;
    assert_eq!(answer.status(), 303);
    assert_eq!(pause::paused_routes(&mut conn).await.unwrap().len(), 1);

    // A logout with a wrong token is refused (and counted), the session kept.
    let answer = operator
        .post(&console, "/logout", &[("csrf_token", "forged")])
        .await;
    assert_eq!(answer.status(), 403);
    assert_eq!(operator.get(&console, "/").await.status(), 200);
    // Logged out, the session is gone.
    let answer = operator
        .post(&console, "/logout", &[("csrf_token", &operator.csrf_token)])
        .await;
    assert_eq!(answer.status(), 303);
    assert_eq!(operator.get(&console, "/").await.status(), 303);

    let metrics = reqwest::get(format!("http://{}/metrics", console.running.metrics_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"inbox_console_refusals_total{reason="csrf"} 4"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"inbox_console_refusals_total{reason="role"} 1"#));
    assert!(
        metrics.contains(r#"inbox_console_requests_total{route="/routes/pause",status="403"} 4"#)
    );
    console.running.stop().await;

    let read_only = TestConsole::start(true).await;
    let operator = HttpSession::log_in(&read_only, OPERATOR).await;
    let answer = operator
        .post(
            &read_only,
            "/routes/pause",
            &[("csrf_token", &operator.csrf_token), ("provider", "github")],
        )
        .await;
    assert_eq!(answer.status(), 403);
    assert!(answer.text().await.unwrap().contains("read-only"));
    read_only.running.stop().await;
}

#[tokio::test]
async fn a_wrong_password_or_a_forged_login_form_opens_no_session() {
    let console = TestConsole::start(false).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let answer = client
        .post(console.url("/login"))
        .form(&[
            ("username", OPERATOR.0),
            ("password", OPERATOR.1),
            ("login_token", "forged"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 403);
    let form = client.get(console.url("/login")).send().await.unwrap();
    let cookie = form.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let token = support::hidden_value(&form.text().await.unwrap(), "login_token");
    let answer = client
        .post(console.url("/login"))
        .header("cookie", cookie)
        .form(&[
            ("username", OPERATOR.0),
            ("password", "wrong"),
            ("login_token", &token),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 401);
    assert!(answer.headers().get("set-cookie").is_none_or(|c| !c
        .to_str()
        .unwrap()
        .contains(&format!("{}=", console.cookies.session))));
    assert!(answer
        .text()
        .await
        .unwrap()
        .contains("Wrong user name or password"));
    console.running.stop().await;
}

/// Logging in again from a browser that holds a session ends that session: a login never
/// leaves an older one alive behind it.
#[tokio::test]
async fn logging_in_again_ends_the_session_the_browser_held() {
    let console = TestConsole::start(false).await;
    let first = HttpSession::log_in(&console, OPERATOR).await;
    let client = &first.client;
    let form = client.get(console.url("/login")).send().await.unwrap();
    let login = console.cookies.login;
    let login_cookie = support::set_cookie_value(&form, login).unwrap();
    let token = support::hidden_value(&form.text().await.unwrap(), "login_token");
    let answer = client
        .post(console.url("/login"))
        .header(
            "cookie",
            format!("{login}={login_cookie}; {}", first.cookie_header(&console)),
        )
        .form(&[
            ("username", OPERATOR.0),
            ("password", OPERATOR.1),
            ("login_token", &token),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 303);
    let second = support::set_cookie_value(&answer, console.cookies.session).unwrap();
    assert_ne!(second, first.cookie);

    let with_first = first.get(&console, "/").await;
    assert_eq!(
        with_first.status(),
        303,
        "the first session still opens pages"
    );
    assert_eq!(with_first.headers()["location"], "/login");
    let with_second = client
        .get(console.url("/"))
        .header("cookie", format!("{}={second}", console.cookies.session))
        .send()
        .await
        .unwrap();
    assert_eq!(with_second.status(), 200);
}

/// With `Secure` cookies (the default), both cookies are `__Host-` named, `Secure`, `Path=/`
/// and without `Domain`, and only the prefixed session cookie opens a session.
#[tokio::test]
async fn secure_cookies_are_host_only_and_prefixed() {
    let console = TestConsole::start_with_secure_cookies().await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let form = client.get(console.url("/login")).send().await.unwrap();
    let set_cookie = |response: &reqwest::Response| -> Vec<String> {
        response
            .headers()
            .get_all("set-cookie")
            .iter()
            .map(|value| value.to_str().unwrap().to_owned())
            .collect()
    };
    let login_cookies = set_cookie(&form);
    let [login_cookie] = login_cookies.as_slice() else {
        panic!("one cookie: {login_cookies:?}");
    };
    assert!(
        login_cookie.starts_with("__Host-console_login="),
        "{login_cookie}"
    );
    let session = HttpSession::log_in(&console, OPERATOR).await;
    let answer = support::try_log_in(&client, &console, OPERATOR).await;
    let session_cookie = set_cookie(&answer)
        .into_iter()
        .find(|cookie| cookie.starts_with("__Host-console_session="))
        .unwrap();
    for cookie in [login_cookie, &session_cookie] {
        let attributes: Vec<&str> = cookie.split("; ").skip(1).collect();
        assert!(attributes.contains(&"Secure"), "{cookie}");
        assert!(attributes.contains(&"Path=/"), "{cookie}");
        assert!(
            !attributes.iter().any(|a| a.starts_with("Domain")),
            "{cookie}"
        );
    }

    assert_eq!(session.get(&console, "/").await.status(), 200);
    let unprefixed = client
        .get(console.url("/"))
        .header("cookie", format!("console_session={}", session.cookie))
        .send()
        .await
        .unwrap();
    assert_eq!(
        unprefixed.status(),
        303,
        "a session cookie without the prefix is taken"
    );
}

/// Behind a trusted proxy (the tests' consoles trust 127.0.0.1) each client is counted by the
/// address the proxy forwarded: one client's guesses do not lock its colleagues out.
#[tokio::test]
async fn behind_a_trusted_proxy_one_clients_guesses_do_not_lock_out_another() {
    let console = TestConsole::start(false).await;
    let client_from = |address: &str| {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("x-forwarded-for", address.parse().unwrap());
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .default_headers(headers)
            .build()
            .unwrap()
    };
    let guesser = client_from("198.51.100.1");
    // Five names, so that only the address's limit is reached.
    for n in 0..5 {
        let name = format!("nobody-{n}");
        let answer = support::try_log_in(&guesser, &console, (&name, "wrong")).await;
        assert_eq!(answer.status(), 401);
    }
    let answer = support::try_log_in(&guesser, &console, VIEWER).await;
    assert_eq!(answer.status(), 429, "the guessing client is held back");
    let colleague = client_from("198.51.100.2");
    let answer = support::try_log_in(&colleague, &console, VIEWER).await;
    assert_eq!(
        answer.status(),
        303,
        "another client behind the same proxy logs in"
    );
    console.running.stop().await;
}

#[tokio::test]
async fn a_flood_of_wrong_passwords_is_throttled_without_checking_them() {
    let console = TestConsole::start(false).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // Twenty guesses at once: each counts from its start, so only the first five are checked.
    let guesses = (0..20).map(|n| {
        let client = client.clone();
        let console = &console;
        async move {
            let password = format!("guess-{n}");
            support::try_log_in(&client, console, (OPERATOR.0, &password))
                .await
                .status()
                .as_u16()
        }
    });
    let mut statuses = futures_util::future::join_all(guesses).await;
    statuses.sort_unstable();
    assert_eq!(statuses, [[401; 5].as_slice(), &[429; 15]].concat());

    // The right password waits for the window too, and so does another name from the same
    // address.
    for user in [OPERATOR, VIEWER] {
        let answer = support::try_log_in(&client, &console, user).await;
        assert_eq!(answer.status(), 429, "{}", user.0);
        let retry_after: u64 = answer.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&retry_after), "{retry_after}");
        assert!(answer
            .text()
            .await
            .unwrap()
            .contains("Too many failed logins"));
    }
    let metrics = console.metrics().await;
    assert!(
        metrics.contains(r#"inbox_console_logins_total{outcome="refused"} 5"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"inbox_console_logins_total{outcome="throttled"} 17"#),
        "{metrics}"
    );
    console.running.stop().await;
}

/// A console replaying five dead events by filter, its first batch (one event: the tests'
/// batch size) waiting on a row lock the returned connection holds, so that whatever the
/// test does next arrives while the replay runs. Returns the console, a connection, the
/// blocker, the operator's session, the job's path and the events' ids.
async fn a_replay_held_at_its_first_batch() -> (
    TestConsole,
    diesel_async::AsyncPgConnection,
    diesel_async::AsyncPgConnection,
    HttpSession,
    String,
    Vec<i64>,
) {
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    let events: Vec<_> = (0..5)
        .map(|n| event("stripe", &format!("evt_{n}"), "charge.failed", "{}"))
        .collect();
    let mut ids = store(&mut conn, &events).await;
    ids.sort_unstable();
    claim_all(&mut conn, &ids).await;
    let blocker = holding_finished_row(&console.db, ids[0]).await;
    let operator = HttpSession::log_in(&console, OPERATOR).await;
    let estimate = operator
        .get(&console, "/replay?provider=stripe")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        estimate.contains(r#"<strong id="estimated">5</strong>"#),
        "{estimate}"
    );
    let started = operator
        .post(
            &console,
            "/replay",
            &[
                ("csrf_token", &operator.csrf_token),
                ("provider", "stripe"),
                ("estimated", "5"),
            ],
        )
        .await;
    assert_eq!(started.status(), 303);
    let job = started.headers()["location"].to_str().unwrap().to_owned();
    (console, conn, blocker, operator, job, ids)
}

#[tokio::test]
async fn a_replay_by_filter_runs_in_batches_and_stops_at_an_abort() {
    let (console, mut conn, mut blocker, operator, job, ids) =
        a_replay_held_at_its_first_batch().await;
    let aborted = operator
        .post(
            &console,
            &format!("{job}/abort"),
            &[("csrf_token", &operator.csrf_token)],
        )
        .await;
    assert_eq!(aborted.status(), 303);
    diesel_async::SimpleAsyncConnection::batch_execute(&mut blocker, "COMMIT")
        .await
        .unwrap();

    let page = operator.job_page_once_ended(&console, &job).await;
    assert!(page.contains(r#"id="job-state">aborted<"#), "{page}");
    assert!(page.contains(r#"id="job-replayed">1<"#), "{page}");
    assert_eq!(
        browse::count_dead(&mut conn, &EventQuery::default())
            .await
            .unwrap(),
        4
    );
    let audit = inbox_core::operations::audit::recent(&mut conn, 10)
        .await
        .unwrap();
    let replay = audit
        .iter()
        .find(|entry| entry.action == "replay_filter")
        .unwrap();
    assert_eq!(
        (replay.estimated, replay.affected, replay.outcome.as_str()),
        (Some(5), 1, "aborted")
    );
    assert_eq!(
        replay.target,
        serde_json::json!({"provider": "stripe", "up_to_id": ids[4]})
    );
    assert!(audit
        .iter()
        .any(|entry| entry.action == "abort" && entry.actor == OPERATOR.0));
    console.running.stop().await;
}

#[tokio::test]
async fn a_console_stopped_mid_replay_records_the_replay_as_aborted_with_how_far_it_went() {
    let (console, mut conn, mut blocker, _operator, _job, _ids) =
        a_replay_held_at_its_first_batch().await;
    // The replay's first batch is waiting for the blocker's lock.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while count_of(
        &mut conn,
        "SELECT count(*) AS n FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .await
        == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the replay never began"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let stopping = tokio::spawn(console.running.stop());
    diesel_async::SimpleAsyncConnection::batch_execute(&mut blocker, "COMMIT")
        .await
        .unwrap();
    stopping.await.unwrap();
    let audit = inbox_core::operations::audit::recent(&mut conn, 10)
        .await
        .unwrap();
    let replay = audit
        .iter()
        .find(|entry| entry.action == "replay_filter")
        .unwrap();
    assert_eq!(
        (replay.affected, replay.outcome.as_str()),
        (1, "aborted"),
        "the batch in progress ended, and no other began"
    );
}

#[tokio::test]
async fn a_replay_by_filter_replays_only_the_dead_events_the_server_counted() {
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    // `late` lies among the counted events (by id) but dies only once the replay runs.
    let events: Vec<_> = (0..5)
        .map(|n| event("stripe", &format!("evt_{n}"), "charge.failed", "{}"))
        .collect();
    let mut ids = store(&mut conn, &events[..2]).await;
    let late = store(&mut conn, &[event("stripe", "late", "charge.failed", "{}")]).await[0];
    ids.extend(store(&mut conn, &events[2..]).await);
    ids.sort_unstable();
    assert!(ids[0] < late && late < ids[4]);
    claim_all(&mut conn, &ids).await;
    let operator = HttpSession::log_in(&console, OPERATOR).await;
    let replay = |confirmed: &'static str| {
        let operator = &operator;
        let console = &console;
        async move {
            operator
                .post(
                    console,
                    "/replay",
                    &[
                        ("csrf_token", &operator.csrf_token),
                        ("estimated", confirmed),
                    ],
                )
                .await
        }
    };

    // A confirmed count below the server's is refused, whatever the form says.
    let refused = replay("1").await;
    assert_eq!(refused.status(), 409);
    assert!(refused
        .text()
        .await
        .unwrap()
        .contains("now selects 5 dead event(s), more than the 1 you confirmed"));
    let audit = inbox_core::operations::audit::recent(&mut conn, 10)
        .await
        .unwrap();
    assert!(audit.is_empty(), "{audit:?}");
    assert_eq!(
        browse::count_dead(&mut conn, &EventQuery::default())
            .await
            .unwrap(),
        5
    );

    // The first batch waits on a row lock held here while more events die.
    let mut blocker = holding_finished_row(&console.db, ids[0]).await;
    let started = replay("6").await;
    assert_eq!(started.status(), 303);
    let job = started.headers()["location"].to_str().unwrap().to_owned();
    let newer = store(
        &mut conn,
        &[event("stripe", "newer", "charge.failed", "{}")],
    )
    .await[0];
    let mut died = claim_all(&mut conn, &[late, newer]).await;
    died.sort_unstable();
    assert_eq!(died, [late, newer]);
    diesel_async::SimpleAsyncConnection::batch_execute(&mut blocker, "COMMIT")
        .await
        .unwrap();

    let page = operator.job_page_once_ended(&console, &job).await;
    assert!(page.contains(r#"id="job-state">done<"#), "{page}");
    assert!(page.contains(r#"id="job-replayed">5<"#), "{page}");
    assert!(page.contains(r#"id="job-counted">5<"#), "{page}");
    let still_dead = browse::list_page(
        &mut conn,
        &EventQuery {
            status: Some(InboxStatus::Dead),
            ..EventQuery::default()
        },
        None,
        10,
    )
    .await
    .unwrap();
    let mut still_dead: Vec<i64> = still_dead.iter().map(|row| row.id).collect();
    still_dead.sort_unstable();
    assert_eq!(still_dead, [late, newer]);
    let audit = inbox_core::operations::audit::recent(&mut conn, 10)
        .await
        .unwrap();
    assert_eq!(
        (
            audit[0].estimated,
            audit[0].affected,
            audit[0].outcome.as_str()
        ),
        (Some(5), 5, "done"),
        "the server's count is recorded, not the form's"
    );
    assert_eq!(audit[0].target, serde_json::json!({"up_to_id": ids[4]}));
    console.running.stop().await;
}

#[tokio::test]
async fn a_repair_whose_audit_row_cannot_be_written_does_not_happen() {
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    let ids = store(
        &mut conn,
        &[
            event("shopify", "d-1", "order.paid", "{}"),
            event("acme", "pi_1-1", "payment_intent.created", "{}"),
            event("acme", "pi_1-2", "payment_intent.succeeded", "{}"),
            event("stripe", "j-1", "charge.failed", "{}"),
            event("stripe", "j-2", "charge.failed", "{}"),
        ],
    )
    .await;
    let [dead, head, behind, job_first, job_second] = ids[..] else {
        unreachable!()
    };
    claim_all(&mut conn, &[dead, head, job_first, job_second]).await;
    block_key_behind_dead_head(&mut conn, head, behind).await;
    let guarded = |event_id: &str| inbox_core::inbox::NewEvent {
        replays: inbox_core::inbox::ReplayCheck::SameBody,
        ..event("github", event_id, "push", r#"{"ref":"main"}"#)
    };
    inbox_core::inbox::insert_events(&mut conn, &[guarded("g-1"), guarded("g-2")])
        .await
        .unwrap();
    let suppressed = inbox_core::replays::list(&mut conn, None, None, 1)
        .await
        .unwrap()[0]
        .id;
    assert!(pause::pause_route(&mut conn, "github", "*", "someone")
        .await
        .unwrap());

    // A replay by filter, started while the audit works, held on its first batch.
    let operator = HttpSession::log_in(&console, OPERATOR).await;
    let mut blocker = holding_finished_row(&console.db, job_first).await;
    let token = operator.csrf_token.clone();
    let started = operator
        .post(
            &console,
            "/replay",
            &[
                ("csrf_token", &token),
                ("provider", "stripe"),
                ("estimated", "2"),
            ],
        )
        .await;
    assert_eq!(started.status(), 303);
    let job = started.headers()["location"].to_str().unwrap().to_owned();

    // From here on the audit refuses new rows (the job's own row still takes its progress).
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "DO $$ BEGIN EXECUTE format( \
             'ALTER TABLE console_audit ADD CONSTRAINT no_new_rows CHECK (id <= %s) NOT VALID', \
             (SELECT max(id) FROM console_audit)); END $$",
    )
    .await
    .unwrap();
    let head_id = head.to_string();
    let suppressed_id = suppressed.to_string();
    for (path, form) in [
        (format!("/events/{dead}/replay"), vec![]),
        ("/routes/pause".to_owned(), vec![("provider", "zendesk")]),
        ("/routes/resume".to_owned(), vec![("provider", "github")]),
        (
            "/keys/skip".to_owned(),
            vec![("head_id", head_id.as_str()), ("reason", "by hand")],
        ),
        (
            "/replays/release".to_owned(),
            vec![("id", suppressed_id.as_str())],
        ),
        (format!("{job}/abort"), vec![]),
    ] {
        let mut form = form;
        form.push(("csrf_token", &token));
        let answer = operator.post(&console, &path, &form).await;
        assert_eq!(answer.status(), 500, "{path}");
    }

    assert_eq!(
        inbox_core::operations::show(&mut conn, "shopify", "d-1")
            .await
            .unwrap()
            .unwrap()
            .summary
            .status,
        InboxStatus::Dead,
        "not replayed"
    );
    let paused: Vec<String> = pause::paused_routes(&mut conn)
        .await
        .unwrap()
        .into_iter()
        .map(|route| route.provider)
        .collect();
    assert_eq!(paused, ["github"], "neither paused nor resumed");
    assert_eq!(
        browse::blocked_keys(&mut conn, 10).await.unwrap().len(),
        1,
        "not skipped"
    );
    assert_eq!(
        inbox_core::replays::count(&mut conn).await.unwrap(),
        1,
        "not released"
    );
    diesel_async::SimpleAsyncConnection::batch_execute(&mut blocker, "COMMIT")
        .await
        .unwrap();
    let page = operator.job_page_once_ended(&console, &job).await;
    assert!(
        page.contains(r#"id="job-state">done<"#),
        "not aborted: {page}"
    );
    let audit = inbox_core::operations::audit::recent(&mut conn, 10)
        .await
        .unwrap();
    assert_eq!(
        audit
            .iter()
            .map(|entry| (entry.action.as_str(), entry.affected))
            .collect::<Vec<_>>(),
        [("replay_filter", 2)]
    );
    console.running.stop().await;
}

#[tokio::test]
async fn an_events_body_is_shown_as_received_only_reindented() {
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    let body = r#"{"id":"evt_1","id":"evt_2","amount":123456789012345678901234567890,"rate":1e2,"z":1,"a":[]}"#;
    let id = store(
        &mut conn,
        &[event("stripe", "evt_1", "charge.failed", body)],
    )
    .await[0];
    let viewer = HttpSession::log_in(&console, VIEWER).await;
    let page = viewer
        .get(&console, &format!("/events/{id}"))
        .await
        .text()
        .await
        .unwrap();
    let shown = "{\n  \"id\": \"evt_1\",\n  \"id\": \"evt_2\",\n  \"amount\": 123456789012345678901234567890,\n  \"rate\": 1e2,\n  \"z\": 1,\n  \"a\": []\n}"
        .replace('"', "&quot;");
    assert!(
        page.contains(&format!(r#"<pre id="body">{shown}</pre>"#)),
        "{page}"
    );
    console.running.stop().await;
}

#[tokio::test]
async fn credential_like_headers_are_hidden_on_an_events_page() {
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    let hidden = [
        ("X-Auth", "supersecret-auth"),
        ("Proxy-Authorization", "Basic c2VjcmV0"),
        ("apikey", "secret-apikey"),
        ("Api_Key", "secret-api-key"),
        ("X-Gitlab-Token", "secret-token"),
        ("X-Webhook-Secret", "secret-secret"),
        ("X-Hub-Signature-256", "sha256=secret-signature"),
        ("X-Shopify-Hmac-Sha256", "secret-hmac"),
        ("X-Password", "secret-password"),
        ("Cookie", "sid=secret-cookie"),
        ("X-Session-Id", "secret-session"),
    ];
    let mut headers: serde_json::Map<String, serde_json::Value> = hidden
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).into()))
        .collect();
    headers.insert("User-Agent".to_owned(), "Shopify-Captain-Hook".into());
    let stored = inbox_core::inbox::NewEvent {
        headers: serde_json::Value::Object(headers),
        ..event("shopify", "h-1", "orders/create", "{}")
    };
    let id = store(&mut conn, &[stored]).await[0];
    let viewer = HttpSession::log_in(&console, VIEWER).await;
    let page = viewer
        .get(&console, &format!("/events/{id}"))
        .await
        .text()
        .await
        .unwrap();
    for (name, value) in hidden {
        assert!(
            page.contains(&format!("<th>{name}</th><td>[hidden]</td>")),
            "{name} shown: {page}"
        );
        assert!(!page.contains(value), "{value} shown");
    }
    assert!(page.contains("<th>User-Agent</th><td>Shopify-Captain-Hook</td>"));
    console.running.stop().await;
}

#[tokio::test]
async fn a_repair_that_would_change_nothing_is_refused_and_not_audited() {
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    let id = store(&mut conn, &[event("stripe", "s-1", "charge.failed", "{}")]).await[0];
    claim_all(&mut conn, &[id]).await;
    let operator = HttpSession::log_in(&console, OPERATOR).await;
    let token = operator.csrf_token.clone();
    let route = |provider: &'static str| [("csrf_token", token.as_str()), ("provider", provider)];
    for (path, provider, status) in [
        ("/routes/pause", "github", 303),
        ("/routes/pause", "github", 409),
        ("/routes/resume", "zendesk", 409),
        ("/routes/resume", "github", 303),
        ("/routes/resume", "github", 409),
    ] {
        let answer = operator.post(&console, path, &route(provider)).await;
        assert_eq!(answer.status(), status, "{path} {provider}");
        if status == 409 {
            assert!(answer.text().await.unwrap().contains("nothing changed"));
        }
    }

    let started = operator
        .post(
            &console,
            "/replay",
            &[("csrf_token", &token), ("estimated", "1")],
        )
        .await;
    let job = started.headers()["location"].to_str().unwrap().to_owned();
    operator.job_page_once_ended(&console, &job).await;
    let answer = operator
        .post(&console, &format!("{job}/abort"), &[("csrf_token", &token)])
        .await;
    assert_eq!(answer.status(), 409);
    assert!(answer
        .text()
        .await
        .unwrap()
        .contains("has ended already (done): nothing to abort"));
    // The replay made the event ready: replaying it again (a second click) changes nothing.
    let answer = operator
        .post(
            &console,
            &format!("/events/{id}/replay"),
            &[("csrf_token", &token)],
        )
        .await;
    assert_eq!(answer.status(), 409);
    assert!(answer
        .text()
        .await
        .unwrap()
        .contains("nothing was replayed"));

    let audit = inbox_core::operations::audit::recent(&mut conn, 10)
        .await
        .unwrap();
    assert_eq!(
        audit
            .iter()
            .map(|entry| (entry.action.as_str(), entry.outcome.as_str()))
            .collect::<Vec<_>>(),
        [
            ("replay_filter", "done"),
            ("resume", "done"),
            ("pause", "done")
        ]
    );
    console.running.stop().await;
}

#[tokio::test]
async fn the_audit_is_paged_by_row_id_and_every_action_is_reachable() {
    use inbox_core::operations::audit::{self, NewAction, Outcome};
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    let mut ids = Vec::new();
    for n in 0..205 {
        let id = audit::record(
            &mut conn,
            NewAction {
                actor: "olivia",
                action: "replay",
                target: serde_json::json!({ "id": n }),
                estimated: None,
                affected: 1,
                outcome: Outcome::Done,
            },
        )
        .await
        .unwrap();
        ids.push(id);
    }
    let viewer = HttpSession::log_in(&console, VIEWER).await;
    let first = viewer.get(&console, "/audit").await.text().await.unwrap();
    assert_eq!(first.matches("<tr><td>").count(), 200);
    assert!(
        first.contains("<code>{&quot;id&quot;:204}</code>"),
        "newest first"
    );
    let older = ids[5];
    let next = format!(r#"<a id="next-page" href="/audit?before={older}">"#);
    assert!(first.contains(&next), "{first}");
    let second = viewer
        .get(&console, &format!("/audit?before={older}"))
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(second.matches("<tr><td>").count(), 5);
    assert!(
        second.contains("<code>{&quot;id&quot;:0}</code>"),
        "{second}"
    );
    assert!(!second.contains("next-page"));
    console.running.stop().await;
}

#[tokio::test]
async fn an_ordered_events_key_is_shown_and_a_blocked_keys_dead_head_is_listed_and_skipped() {
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    let ids = store(
        &mut conn,
        &[
            event("stripe", "pi_1-1", "payment_intent.created", "{}"),
            event("stripe", "pi_1-2", "payment_intent.succeeded", "{}"),
        ],
    )
    .await;
    let (head, behind) = (ids[0].min(ids[1]), ids[0].max(ids[1]));
    claim_all(&mut conn, &[head]).await;
    block_key_behind_dead_head(&mut conn, head, behind).await;
    let viewer = HttpSession::log_in(&console, VIEWER).await;
    let detail = viewer
        .get(&console, &format!("/events/{behind}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        detail.contains(r#"<td id="ordering-key">pi_1 (sequence 2)</td>"#),
        "{detail}"
    );
    let detail = viewer
        .get(&console, &format!("/events/{head}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        detail.contains(r#"<td id="ordering-key">pi_1 (sequence 1)</td>"#),
        "{detail}"
    );
    let routes = viewer.get(&console, "/routes").await.text().await.unwrap();
    let blocked = &routes[routes.find(r#"id="blocked-keys""#).unwrap()..];
    assert!(
        blocked.contains(&format!(r#"<a href="/events/{head}">stripe pi_1-1</a>"#)),
        "{blocked}"
    );
    assert!(blocked.contains(r#"<td class="num">1</td>"#), "{blocked}");

    // Skipping the head: refused to a viewer and without a reason, then done and audited.
    let head_id = head.to_string();
    let answer = viewer
        .post(
            &console,
            "/keys/skip",
            &[
                ("csrf_token", &viewer.csrf_token),
                ("head_id", &head_id),
                ("reason", "x"),
            ],
        )
        .await;
    assert_eq!(answer.status(), 403);
    let operator = HttpSession::log_in(&console, OPERATOR).await;
    let answer = operator
        .post(
            &console,
            "/keys/skip",
            &[
                ("csrf_token", &operator.csrf_token),
                ("head_id", &head_id),
                ("reason", " "),
            ],
        )
        .await;
    assert_eq!(answer.status(), 400);
    let answer = operator
        .post(
            &console,
            "/keys/skip",
            &[
                ("csrf_token", &operator.csrf_token),
                ("head_id", &head_id),
                ("reason", "refund issued by hand"),
            ],
        )
        .await;
    assert_eq!(answer.status(), 303);
    assert!(browse::blocked_keys(&mut conn, 10)
        .await
        .unwrap()
        .is_empty());
    let audit = inbox_core::operations::audit::recent(&mut conn, 10)
        .await
        .unwrap();
    assert_eq!(audit[0].action, "skip");
    assert_eq!(
        audit[0].target,
        serde_json::json!({"id": head, "ordering_key": "pi_1", "reason": "refund issued by hand"})
    );
    let answer = operator
        .post(
            &console,
            "/keys/skip",
            &[
                ("csrf_token", &operator.csrf_token),
                ("head_id", &head_id),
                ("reason", "again"),
            ],
        )
        .await;
    assert_eq!(answer.status(), 409, "a released key is not released twice");
    console.running.stop().await;
}

#[tokio::test]
async fn refusals_are_grouped_by_cause_and_a_suppressed_replay_is_released_by_an_operator_only() {
    let console = TestConsole::start(false).await;
    let mut conn = console.db.connect().await;
    let refusal = |cause: &str, request_id: &str| inbox_core::rejections::NewRejection {
        at: chrono::Utc::now(),
        provider: "stripe".into(),
        cause: cause.into(),
        status: 401,
        request_id: request_id.into(),
        headers: serde_json::json!({}),
        body_bytes: 10,
        body_sha256: None,
    };
    inbox_core::rejections::insert(
        &mut conn,
        &[
            refusal("invalid_signature", "req-1"),
            refusal("invalid_signature", "req-2"),
            refusal("stale_timestamp", "req-3"),
        ],
    )
    .await
    .unwrap();
    let guarded = |event_id: &str| inbox_core::inbox::NewEvent {
        replays: inbox_core::inbox::ReplayCheck::SameBody,
        ..event("github", event_id, "push", r#"{"ref":"main"}"#)
    };
    let outcomes = inbox_core::inbox::insert_events(&mut conn, &[guarded("d-1"), guarded("d-2")])
        .await
        .unwrap();
    assert!(matches!(
        outcomes[1],
        inbox_core::inbox::InsertOutcome::SuppressedReplay { .. }
    ));
    let replay_id = inbox_core::replays::list(&mut conn, None, None, 1)
        .await
        .unwrap()[0]
        .id;

    let viewer = HttpSession::log_in(&console, VIEWER).await;
    let overview = viewer.get(&console, "/").await.text().await.unwrap();
    assert!(
        overview.contains(r#"<div class="figure" id="refused-24h">3</div>"#),
        "{overview}"
    );
    assert!(
        overview.contains(r#"<div class="figure" id="suppressed-replays">1</div>"#),
        "{overview}"
    );
    // Each chart's caption follows its closed axis line (inside an unclosed one it is not
    // drawn).
    assert_eq!(
        overview.matches(r##"stroke="#888"></line><text "##).count(),
        2,
        "{overview}"
    );
    let page = viewer
        .get(&console, "/refusals")
        .await
        .text()
        .await
        .unwrap();
    let refusals = &page[page.find(r#"id="refusals""#).unwrap()..];
    assert!(
        refusals.contains(
            r#"<td>stripe</td><td><code>invalid_signature</code></td><td class="num">401</td><td class="num">2</td>"#
        ),
        "{refusals}"
    );
    assert!(refusals.contains("<code>req-2</code>"), "{refusals}");
    assert!(refusals.contains("stale_timestamp"), "{refusals}");
    let replays = &page[page.find(r#"id="suppressed-replays""#).unwrap()..];
    assert!(replays.contains("<code>d-2</code>"), "{replays}");
    assert!(!replays.contains("Release"), "a viewer gets no button");

    let id = replay_id.to_string();
    let answer = viewer
        .post(
            &console,
            "/replays/release",
            &[("csrf_token", &viewer.csrf_token), ("id", &id)],
        )
        .await;
    assert_eq!(answer.status(), 403);
    let operator = HttpSession::log_in(&console, OPERATOR).await;
    let answer = operator
        .post(
            &console,
            "/replays/release",
            &[("csrf_token", "forged"), ("id", &id)],
        )
        .await;
    assert_eq!(answer.status(), 403);
    assert_eq!(
        inbox_core::replays::count(&mut conn).await.unwrap(),
        1,
        "nothing released yet"
    );
    let page = operator
        .get(&console, "/refusals")
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains(r#"class="release""#), "{page}");
    let answer = operator
        .post(
            &console,
            "/replays/release",
            &[("csrf_token", &operator.csrf_token), ("id", &id)],
        )
        .await;
    assert_eq!(answer.status(), 303);
    assert_eq!(inbox_core::replays::count(&mut conn).await.unwrap(), 0);
    assert_eq!(
        inbox_core::operations::show(&mut conn, "github", "d-2")
            .await
            .unwrap()
            .unwrap()
            .summary
            .status,
        InboxStatus::Ready
    );
    let audit = inbox_core::operations::audit::recent(&mut conn, 10)
        .await
        .unwrap();
    assert_eq!(audit[0].action, "release_replay");
    assert_eq!(audit[0].actor, OPERATOR.0);
    assert_eq!(audit[0].target, serde_json::json!({ "id": replay_id }));
    let answer = operator
        .post(
            &console,
            "/replays/release",
            &[("csrf_token", &operator.csrf_token), ("id", &id)],
        )
        .await;
    assert_eq!(answer.status(), 409, "released once");
    console.running.stop().await;
}

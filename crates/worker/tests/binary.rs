//! The `worker` binary as an operator runs it: graceful shutdown on SIGTERM, and the operator
//! subcommands.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use inbox_core::inbox::{insert_events, NewEvent};
use inbox_tests::{count, wait_for_count, wait_until};
use test_db::TestDatabase;

const WORKER: &str = env!("CARGO_BIN_EXE_worker");

fn event(n: usize, event_type: &str) -> NewEvent {
    let body = format!(r#"{{"id":"evt_{n}","type":"{event_type}"}}"#).into_bytes();
    NewEvent {
        provider: "demo".into(),
        event_id: format!("evt_{n}"),
        event_type: Some(event_type.into()),
        headers: serde_json::json!({"content-type": "application/json"}),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: None,
        body,
    }
}

fn worker(db: &TestDatabase, args: &[&str]) -> Command {
    let mut command = Command::new(WORKER);
    command
        .args(args)
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    command
}

fn run_worker(db: &TestDatabase) -> Child {
    worker(
        db,
        &[
            "run",
            "--demo-handler",
            "--metrics-listen",
            "127.0.0.1:0",
            "--concurrency",
            "16",
            "--batch-size",
            "50",
        ],
    )
    .stdout(Stdio::null())
    .spawn()
    .unwrap()
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

async fn wait_for_exit(mut child: Child, within: Duration) -> std::process::ExitStatus {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "worker did not exit within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_batch_loses_nothing_and_processes_nothing_twice() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let events: Vec<NewEvent> = (0..5_000).map(|n| event(n, "test.event")).collect();
    for chunk in events.chunks(1_000) {
        insert_events(&mut conn, chunk).await.unwrap();
    }

    let first = run_worker(&db);
    wait_until(
        "the worker is mid-way",
        Duration::from_secs(60),
        async || {
            count(
                &mut conn,
                "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
            )
            .await
                >= 300
        },
    )
    .await;
    sigterm(&first);
    let status = wait_for_exit(first, Duration::from_secs(30)).await;
    assert!(status.success(), "graceful shutdown exits 0, got {status}");

    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE status = 1"
        )
        .await,
        0,
        "nothing left under a lease: finished or given back"
    );
    let done = count(
        &mut conn,
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
    )
    .await;
    assert!(done < 5_000, "the shutdown came mid-batch (done: {done})");
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger").await,
        done,
        "exactly the done events have their effect"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE status = 0 AND attempt <> 0"
        )
        .await,
        0,
        "rows given back did not spend an attempt"
    );

    let second = run_worker(&db);
    wait_for_count(
        &mut conn,
        "a second worker finishes the rest",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 2",
        5_000,
        Duration::from_secs(120),
    )
    .await;
    sigterm(&second);
    assert!(wait_for_exit(second, Duration::from_secs(30))
        .await
        .success());
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM demo_ledger").await,
        5_000
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(DISTINCT event_id) AS n FROM demo_ledger"
        )
        .await,
        5_000
    );
}

fn output(db: &TestDatabase, args: &[&str]) -> Output {
    worker(db, args).output().unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_show_the_backlog_list_replay_and_purge() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    insert_events(
        &mut conn,
        &[
            event(1, "test.event"),
            event(2, "demo.poison"),
            event(3, "demo.poison"),
        ],
    )
    .await
    .unwrap();

    let stats = stdout(&output(&db, &["stats"]));
    assert!(stats.contains("ready:       3 (3 due now)"), "{stats}");

    // Process them: the two poison events are dead-lettered.
    let child = run_worker(&db);
    wait_for_count(
        &mut conn,
        "one done and two dead",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status IN (2, 3)",
        3,
        Duration::from_secs(30),
    )
    .await;
    sigterm(&child);
    assert!(wait_for_exit(child, Duration::from_secs(30))
        .await
        .success());

    let stats = stdout(&output(&db, &["stats"]));
    assert!(stats.contains("done:        1"), "{stats}");
    assert!(stats.contains("dead:        2"), "{stats}");
    assert!(stats.contains("permanent: poison event (demo)"), "{stats}");

    let list = stdout(&output(&db, &["list", "--status", "dead"]));
    assert_eq!(
        list.lines().count(),
        3,
        "a header and two dead events:\n{list}"
    );
    assert!(
        list.contains("evt_2") && list.contains("evt_3") && !list.contains("evt_1"),
        "{list}"
    );
    // The status column is as wide as its header says.
    let status_column = list.lines().nth(1).and_then(|line| line.get(12..24));
    assert_eq!(status_column, Some("dead        "), "{list}");
    for args in [
        &["list", "--limit=-1"][..],
        &["keys", "--blocked", "--limit=-1"],
        &["replays", "--limit=-1"],
    ] {
        let refused = output(&db, args);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("--limit"), "{args:?}: {stderr}");
    }

    let show = stdout(&output(&db, &["show", "demo", "evt_2"]));
    assert!(show.contains("status:          dead"), "{show}");
    assert!(
        show.contains(r#"{"id":"evt_2","type":"demo.poison"}"#),
        "{show}"
    );
    let missing = output(&db, &["show", "demo", "evt_404"]);
    assert!(!missing.status.success());

    let refused = output(&db, &["replay"]);
    assert!(
        !refused.status.success(),
        "replay without a selection is refused"
    );
    let dry = stdout(&output(
        &db,
        &[
            "replay",
            "--all-matching",
            "--provider",
            "demo",
            "--dry-run",
        ],
    ));
    assert!(dry.contains("would replay 2 dead event(s)"), "{dry}");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE status = 3"
        )
        .await,
        2
    );
    let done_id = count(
        &mut conn,
        "SELECT id AS n FROM webhook_inbox WHERE event_id = 'evt_1'",
    )
    .await;
    let not_dead = stdout(&output(&db, &["replay", "--id", &done_id.to_string()]));
    assert!(
        not_dead.contains("replayed 0 dead event(s)")
            && not_dead.contains(&format!("not dead (ready, processing, done, or no such event), left as they are: [{done_id}]")),
        "{not_dead}"
    );
    let replayed = stdout(&output(
        &db,
        &["replay", "--all-matching", "--provider", "demo"],
    ));
    assert!(replayed.contains("replayed 2 dead event(s)"), "{replayed}");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE status = 0 AND attempt = 0"
        )
        .await,
        2
    );

    let refused = output(&db, &["purge", "--older-than", "1h"]);
    assert!(
        !refused.status.success(),
        "a retention inside the dedup window is refused"
    );
    assert!(String::from_utf8_lossy(&refused.stderr).contains("dedup window"));
    let refused = output(
        &db,
        &["purge", "--older-than", "0s", "--dedup-window", "0s"],
    );
    assert!(!refused.status.success(), "a zero dedup window is refused");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--dedup-window"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // Age every event past a retention of 4 days (into the journal's partition of 5 days
    // ago), then purge: the done one goes with its day, the replayed ones are kept.
    for statement in [
        "SELECT inbox_create_journal_day((now() AT TIME ZONE 'UTC')::date - 5)",
        "UPDATE inbox_finished SET processed_at = now() - interval '5 days' WHERE status = 2",
        "UPDATE inbox_events SET received_at = now() - interval '5 days', \
                journal_day = (now() AT TIME ZONE 'UTC')::date - 5",
    ] {
        diesel_async::RunQueryDsl::execute(diesel::sql_query(statement), &mut conn)
            .await
            .unwrap();
    }
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query("UPDATE processed_events SET processed_at = now() - interval '5 days'"),
        &mut conn,
    )
    .await
    .unwrap();
    let purged = stdout(&output(&db, &["purge", "--older-than", "4days"]));
    assert!(
        purged.contains(
            "purged 1 done event(s) (1 journal day(s) dropped), 1 processed-event record(s) and 0 suppressed replay(s); forgot 0 idle ordering key(s)"
        ),
        "{purged}"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_events_kept").await,
        2,
        "the replayed events stay, moved out of their dropped day"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM webhook_inbox").await,
        2
    );
}

/// More dead events than one statement replays: all are replayed, batch after batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_every_matching_dead_event_replays_them_all_in_batches() {
    const DEAD: i64 = 1_201;
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let events: Vec<_> = (0..DEAD as usize)
        .map(|n| event(n, "demo.poison"))
        .collect();
    insert_events(&mut conn, &events).await.unwrap();
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(
            "WITH dead AS (DELETE FROM inbox_queue RETURNING id, attempt) \
             INSERT INTO inbox_finished (id, status, attempt, locked_by, last_error, processed_at) \
             SELECT id, 3, 1, 'w1', 'poison', now() FROM dead",
        ),
        &mut conn,
    )
    .await
    .unwrap();
    let replayed = stdout(&output(
        &db,
        &["replay", "--all-matching", "--provider", "demo"],
    ));
    assert!(
        replayed.contains(&format!("replayed {DEAD} dead event(s)")),
        "{replayed}"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE status = 0"
        )
        .await,
        DEAD
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_logged_with_the_event_it_is_about() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    insert_events(&mut conn, &[event(7, "demo.poison")])
        .await
        .unwrap();
    let child = worker(
        &db,
        &[
            "--log-format",
            "json",
            "run",
            "--demo-handler",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_for_count(
        &mut conn,
        "the poison event is dead",
        "SELECT count(*) AS n FROM webhook_inbox WHERE status = 3",
        1,
        Duration::from_secs(30),
    )
    .await;
    sigterm(&child);
    let logged = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let logged = String::from_utf8_lossy(&logged.stderr);
    let line: serde_json::Value = logged
        .lines()
        .find(|line| line.contains("event dead-lettered"))
        .map(|line| serde_json::from_str(line).unwrap())
        .unwrap_or_else(|| panic!("no dead letter logged:\n{logged}"));
    let id = count(&mut conn, "SELECT id AS n FROM webhook_inbox").await;
    assert_eq!(line["id"], id, "{line}");
    assert_eq!(line["provider"], "demo", "{line}");
    assert!(
        line["event_id"]
            .as_str()
            .is_some_and(|shown| shown.contains("evt_7")),
        "{line}"
    );
}

#[test]
fn help_explains_every_subcommand() {
    let help = Command::new(WORKER).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for subcommand in [
        "run", "migrate", "stats", "list", "show", "replay", "replays", "release", "purge",
    ] {
        assert!(
            text.contains(subcommand),
            "{subcommand} missing from:\n{text}"
        );
    }
    let run_help = Command::new(WORKER)
        .args(["run", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run_help.stdout);
    for flag in [
        "--lease",
        "--concurrency",
        "--shutdown-grace",
        "--routes",
        "--max-attempts",
        "WORKER_LEASE",
    ] {
        assert!(text.contains(flag), "{flag} missing from:\n{text}");
    }
}

#[test]
fn zero_and_absurd_durations_are_refused_at_start_with_the_flag_named() {
    // Refused before any connection is attempted: the database URL is never used.
    for (flag, value) in [
        ("--lease", "0s"),
        ("--rescue-interval", "0s"),
        ("--poll-interval", "0s"),
        ("--stats-interval", "0s"),
        ("--handler-timeout", "0s"),
        ("--retry-base", "0s"),
        ("--lease", "2days"),
    ] {
        let output = Command::new(WORKER)
            .args(["run", "--metrics-listen", "127.0.0.1:0", flag, value])
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flag} {value} accepted");
        assert!(
            stderr.contains(&format!("{flag} {value} is out of range")),
            "{flag} {value}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_into_a_closed_pipe_ends_quietly_and_show_escapes_control_characters() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let mut hostile = event(0, "x\u{1b}]0;owned\u{7}");
    hostile.event_id = "evt_\u{1b}[2J".into();
    hostile.body = b"{\"note\":\"\x1b[31mred\x1b[0m\"}\n".to_vec();
    insert_events(&mut conn, &[hostile]).await.unwrap();
    // More rows than a pipe buffers, so the writer is still writing when the reader leaves.
    let events: Vec<NewEvent> = (1..=3_000).map(|n| event(n, "test.event")).collect();
    for chunk in events.chunks(1_000) {
        insert_events(&mut conn, chunk).await.unwrap();
    }

    // `worker list --limit 5000 | head -1`
    let mut list = worker(&db, &["list", "--limit", "5000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    {
        use std::io::BufRead;
        let mut reader = std::io::BufReader::new(list.stdout.take().unwrap());
        reader.read_line(&mut first_line).unwrap();
    } // the reader closes its end here
    let output = list.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(first_line.contains("event_id"), "{first_line}");
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    assert!(!stderr.contains("panicked"), "{stderr}");

    let shown = output_of_show(&db, &[]);
    assert!(
        !shown.contains(&0x1b) && !shown.contains(&0x07),
        "no raw control characters"
    );
    let shown = String::from_utf8(shown).unwrap();
    assert!(shown.contains("event_id:        evt_\\u{1b}[2J"), "{shown}");
    assert!(
        shown.contains("event_type:      x\\u{1b}]0;owned\\u{7}"),
        "{shown}"
    );
    assert!(
        shown.contains("{\"note\":\"\\u{1b}[31mred\\u{1b}[0m\"}"),
        "{shown}"
    );
    let raw = output_of_show(&db, &["--raw"]);
    assert!(
        raw.windows(5).any(|w| w == b"\x1b[31m"),
        "--raw prints the body as stored"
    );
}

/// `worker show demo 'evt_ESC[2J' ARGS...`, its standard output.
fn output_of_show(db: &TestDatabase, args: &[&str]) -> Vec<u8> {
    let mut all = vec!["show", "demo", "evt_\u{1b}[2J"];
    all.extend_from_slice(args);
    let output = output(db, &all);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_lists_the_suppressed_replays_and_release_queues_one() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let guarded = |event_id: &str| NewEvent {
        event_id: event_id.into(),
        replays: inbox_core::inbox::ReplayCheck::SameBody,
        ..event(1, "push")
    };
    let outcomes = insert_events(&mut conn, &[guarded("d-1"), guarded("d-2")])
        .await
        .unwrap();
    let inbox_core::inbox::InsertOutcome::SuppressedReplay { original_id } = outcomes[1] else {
        panic!("the second is a replay: {outcomes:?}");
    };

    let listed = stdout(&output(&db, &["replays", "--provider", "demo"]));
    let line = listed
        .lines()
        .find(|line| line.contains("d-2"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(line.contains(&format!("{original_id} (d-1)")), "{line}");
    let id = line.split_whitespace().next().unwrap();
    assert_eq!(
        stdout(&output(&db, &["release", "--id", id])),
        "released 1 suppressed replay(s)\n"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_queue").await,
        2
    );
    let again = stdout(&output(&db, &["release", "--id", id]));
    assert!(
        again.starts_with("released 0 suppressed replay(s)"),
        "{again}"
    );
    assert!(again.contains(&format!("[{id}]")), "{again}");
    assert_eq!(
        stdout(&output(&db, &["replays"])),
        "no suppressed replays\n"
    );
}

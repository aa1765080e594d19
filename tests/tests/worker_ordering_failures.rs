//! Failure semantics of ordered keys: a failing head blocks its key while it retries, a dead
//! head blocks it until an operator replays or skips it (or releases it, per provider), other
//! keys carry on, and the operator commands show and release blocked keys.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::inbox::{insert_events, ordering_key, EventOrdering, NewEvent};
use inbox_core::ordering::{self, SkipError};
use inbox_tests::*;
use test_db::TestDatabase;
use worker::{Event, Handled, Handler, HandlerError, Router};

const PROVIDER: &str = "ordered";

fn ordered_event(key: &str, sequence: i64) -> NewEvent {
    let event_id = format!("{key}-{sequence}");
    NewEvent {
        provider: PROVIDER.into(),
        body: format!(r#"{{"id":"{event_id}"}}"#).into_bytes(),
        event_id,
        event_type: Some("thing.updated".into()),
        headers: serde_json::json!({}),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: Some(EventOrdering {
            key: ordering_key(PROVIDER, key),
            sequence,
            hold: Duration::ZERO,
        }),
    }
}

/// Fails each event as many times as `failures` says (retryable), or for ever (permanent)
/// while `poisoned` holds its id; records every attempt in order.
#[derive(Default)]
struct Scripted {
    failures: Mutex<HashMap<String, usize>>,
    poisoned: Mutex<Vec<String>>,
    attempts: Mutex<Vec<(String, bool)>>,
}

impl Scripted {
    fn attempts(&self) -> Vec<(String, bool)> {
        self.attempts.lock().unwrap().clone()
    }

    fn cure(&self) {
        self.poisoned.lock().unwrap().clear();
    }
}

#[async_trait]
impl Handler for Scripted {
    async fn handle(
        &self,
        event: &Event,
        _: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        let poisoned = self.poisoned.lock().unwrap().contains(&event.event_id);
        let retry = {
            let mut failures = self.failures.lock().unwrap();
            match failures.get_mut(&event.event_id) {
                Some(left) if *left > 0 => {
                    *left -= 1;
                    true
                }
                _ => false,
            }
        };
        let ok = !poisoned && !retry;
        self.attempts
            .lock()
            .unwrap()
            .push((event.event_id.clone(), ok));
        if poisoned {
            Err(HandlerError::Permanent("poisoned".into()))
        } else if retry {
            Err(HandlerError::Retryable("not yet".into()))
        } else {
            Ok(Handled::Applied)
        }
    }
}

fn start(db: &TestDatabase, handler: &Arc<Scripted>) -> RunningWorker {
    let router = Router::new().route(None, None, Arc::clone(handler) as Arc<dyn Handler>);
    RunningWorker::start(db, router, worker_settings("w1"))
}

async fn done(conn: &mut AsyncPgConnection, expected: i64) {
    wait_for_count(
        conn,
        &format!("{expected} events are done"),
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        expected,
        Duration::from_secs(30),
    )
    .await;
}

async fn dead_id(conn: &mut AsyncPgConnection, event_id: &str) -> i64 {
    wait_for_count(
        conn,
        &format!("{event_id} is dead"),
        &format!(
            "SELECT count(*) AS n FROM webhook_inbox WHERE event_id = '{event_id}' AND status = 3"
        ),
        1,
        Duration::from_secs(30),
    )
    .await;
    count(
        conn,
        &format!("SELECT id AS n FROM inbox_events WHERE event_id = '{event_id}'"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_head_blocks_its_key_while_it_retries_and_no_other_key() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let handler = Arc::new(Scripted::default());
    handler.failures.lock().unwrap().insert("a-1".into(), 2);
    insert_events(
        &mut conn,
        &[
            ordered_event("a", 1),
            ordered_event("a", 2),
            ordered_event("b", 1),
        ],
    )
    .await
    .unwrap();
    let worker = start(&db, &handler);
    done(&mut conn, 3).await;
    worker.stop().await;
    let attempts = handler.attempts();
    let of_a: Vec<(String, bool)> = attempts
        .iter()
        .filter(|(id, _)| id.starts_with("a-"))
        .cloned()
        .collect();
    assert_eq!(
        of_a,
        [
            ("a-1".to_owned(), false),
            ("a-1".to_owned(), false),
            ("a-1".to_owned(), true),
            ("a-2".to_owned(), true),
        ],
        "the key's second event waits for its head's retries"
    );
    // The other key did not wait for them.
    let b = attempts.iter().position(|(id, _)| id == "b-1").unwrap();
    let a_done = attempts
        .iter()
        .position(|a| a == &("a-1".to_owned(), true))
        .unwrap();
    assert!(b < a_done, "{attempts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_blocks_its_key_until_skipped_with_a_reason_that_is_kept() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let handler = Arc::new(Scripted::default());
    handler.poisoned.lock().unwrap().push("a-1".into());
    insert_events(
        &mut conn,
        &[
            ordered_event("a", 1),
            ordered_event("a", 2),
            ordered_event("b", 1),
        ],
    )
    .await
    .unwrap();
    let worker = start(&db, &handler);
    let dead = dead_id(&mut conn, "a-1").await;
    done(&mut conn, 1).await;
    let blocked = ordering::blocked_keys(&mut conn, 10).await.unwrap();
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(
        (
            blocked[0].ordering_key.as_str(),
            blocked[0].event_row_id,
            blocked[0].waiting
        ),
        ("ordered:a", dead, 1)
    );
    assert_eq!(
        blocked[0].last_error.as_deref(),
        Some("permanent: poisoned")
    );
    // The gauges the alert reads.
    wait_until(
        "the blocked-key gauge is set",
        Duration::from_secs(10),
        async || {
            let page = String::from_utf8(worker.metrics.render()).unwrap();
            metric_value(&page, "inbox_ordering_blocked_keys") == Some(1.0)
        },
    )
    .await;
    // Blocked: the key's second event is not claimed, however long the worker runs.
    let second_ready =
        "SELECT count(*) AS n FROM webhook_inbox WHERE event_id = 'a-2' AND status = 0 AND attempt = 0";
    assert_eq!(count(&mut conn, second_ready).await, 1);

    assert!(matches!(
        ordering::skip_dead_head(&mut conn, dead, "  ").await,
        Err(SkipError::Reason)
    ));
    let key = ordering::skip_dead_head(&mut conn, dead, "refund handled by hand")
        .await
        .unwrap();
    assert_eq!(key, "ordered:a");
    assert!(matches!(
        ordering::skip_dead_head(&mut conn, dead, "again").await,
        Err(SkipError::NotBlocking(_))
    ));
    done(&mut conn, 2).await;
    worker.stop().await;
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) AS n FROM inbox_key_skips WHERE ordering_key = 'ordered:a' \
                 AND event_row_id = {dead} AND reason = 'refund handled by hand'"
            )
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM webhook_inbox WHERE event_id = 'a-1' AND status = 3"
        )
        .await,
        1,
        "the skipped head stays dead"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_dead_head_runs_again_before_the_rest_of_its_key() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let handler = Arc::new(Scripted::default());
    handler.poisoned.lock().unwrap().push("a-1".into());
    insert_events(&mut conn, &[ordered_event("a", 1), ordered_event("a", 2)])
        .await
        .unwrap();
    let worker = start(&db, &handler);
    let dead = dead_id(&mut conn, "a-1").await;
    handler.cure();
    assert_eq!(
        inbox_core::operations::replay(&mut conn, &[dead])
            .await
            .unwrap(),
        1
    );
    done(&mut conn, 2).await;
    worker.stop().await;
    assert_eq!(
        handler.attempts(),
        [
            ("a-1".to_owned(), false),
            ("a-1".to_owned(), true),
            ("a-2".to_owned(), true),
        ]
    );
    assert!(ordering::blocked_keys(&mut conn, 10)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_releases_dead_heads_lets_the_key_carry_on() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    diesel::sql_query(
        "INSERT INTO inbox_ordering_providers (provider, release_dead) VALUES ('ordered', true)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let handler = Arc::new(Scripted::default());
    handler.poisoned.lock().unwrap().push("a-1".into());
    insert_events(&mut conn, &[ordered_event("a", 1), ordered_event("a", 2)])
        .await
        .unwrap();
    let worker = start(&db, &handler);
    dead_id(&mut conn, "a-1").await;
    done(&mut conn, 1).await;
    worker.stop().await;
    assert_eq!(
        handler.attempts(),
        [("a-1".to_owned(), false), ("a-2".to_owned(), true)]
    );
    assert!(ordering::blocked_keys(&mut conn, 10)
        .await
        .unwrap()
        .is_empty());
}

fn operator(db: &TestDatabase, args: &[&str]) -> (bool, String) {
    let output = std::process::Command::new(inbox_tests::chaos::bin_dir().join("worker"))
        .args(args)
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_lists_blocked_keys_shows_an_events_key_and_position_and_skips_its_head() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let handler = Arc::new(Scripted::default());
    handler.poisoned.lock().unwrap().push("a-1".into());
    insert_events(
        &mut conn,
        &[
            ordered_event("a", 1),
            ordered_event("a", 2),
            ordered_event("a", 3),
        ],
    )
    .await
    .unwrap();
    let worker = start(&db, &handler);
    let dead = dead_id(&mut conn, "a-1").await;
    worker.stop().await;

    let (ok, keys) = operator(&db, &["keys", "--blocked"]);
    assert!(ok, "{keys}");
    let line = keys.lines().find(|l| l.starts_with("ordered:a")).unwrap();
    assert!(
        line.contains(&dead.to_string()) && line.contains("a-1"),
        "{keys}"
    );
    assert!(line.contains("permanent: poisoned"), "{keys}");

    let (ok, shown) = operator(&db, &["show", PROVIDER, "a-3"]);
    assert!(ok, "{shown}");
    assert!(shown.contains("ordering_key:    ordered:a"), "{shown}");
    assert!(shown.contains("sequence:        3"), "{shown}");
    assert!(
        shown.contains("position:        1 event(s) of its key ahead; 2 queued"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("key:             blocked by dead event {dead}")),
        "{shown}"
    );
    let (ok, head) = operator(&db, &["show", PROVIDER, "a-2"]);
    assert!(
        ok && head.contains("position:        head of its key"),
        "{head}"
    );

    let (ok, stats) = operator(&db, &["stats"]);
    assert!(ok && stats.contains("blocked keys: 1"), "{stats}");

    let (ok, refused) = operator(&db, &["skip", &dead.to_string()]);
    assert!(!ok, "a skip needs --reason: {refused}");
    let (ok, skipped) = operator(
        &db,
        &[
            "skip",
            &dead.to_string(),
            "--reason",
            "customer refunded by hand",
        ],
    );
    assert!(ok, "{skipped}");
    assert!(skipped.contains("released key ordered:a"), "{skipped}");
    let (ok, keys) = operator(&db, &["keys", "--blocked"]);
    assert!(ok && !keys.contains("ordered:a"), "{keys}");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_key_skips WHERE reason = 'customer refunded by hand'"
        )
        .await,
        1
    );
}

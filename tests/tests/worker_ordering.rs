//! Ordered processing per key: at most one event of a key in processing across every worker,
//! the key's events in sequence order (the reorder window lets an earlier one slot in), late
//! arrivals handed over marked stale.
#![allow(clippy::unwrap_used)] // a test stops at the first failed step

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use diesel_async::AsyncPgConnection;
use inbox_core::inbox::{insert_events, ordering_key, EventOrdering, NewEvent};
use inbox_tests::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use test_db::TestDatabase;
use worker::metrics::Metrics as WorkerMetrics;
use worker::{Event, Handled, Handler, HandlerError, Router, WorkerSettings};

const PROVIDER: &str = "ordered";

fn ordered_event(key: &str, sequence: i64, hold: Duration) -> NewEvent {
    let event_id = format!("{key}-{sequence}");
    NewEvent {
        provider: PROVIDER.into(),
        body: format!(r#"{{"id":"{event_id}","object":"{key}","seq":{sequence}}}"#).into_bytes(),
        event_id,
        event_type: Some("thing.updated".into()),
        headers: serde_json::json!({}),
        body_sha256: [0; 32],
        replays: inbox_core::inbox::ReplayCheck::Off,
        ordering: Some(EventOrdering {
            key: ordering_key(PROVIDER, key),
            sequence,
            hold,
        }),
    }
}

/// What the handler saw of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    event_id: String,
    sequence: i64,
    stale: bool,
}

/// Records per key what it handles, and counts every time it found another event of the same
/// key already running when one started.
#[derive(Default)]
struct Recorder {
    running: Mutex<HashMap<String, usize>>,
    overlaps: AtomicUsize,
    seen: Mutex<HashMap<String, Vec<Seen>>>,
}

impl Recorder {
    fn seen(&self, key: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .get(&ordering_key(PROVIDER, key))
            .cloned()
            .unwrap_or_default()
    }
}

#[async_trait]
impl Handler for Recorder {
    async fn handle(
        &self,
        event: &Event,
        _: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        let key = event.ordering_key.clone().unwrap();
        {
            let mut running = self.running.lock().unwrap();
            let count = running.entry(key.clone()).or_default();
            if *count > 0 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            *count += 1;
        }
        // Long enough for another worker to claim the key's next event, were it allowed to.
        tokio::task::yield_now().await;
        self.seen
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .push(Seen {
                event_id: event.event_id.clone(),
                sequence: event.sequence.unwrap(),
                stale: event.stale,
            });
        *self.running.lock().unwrap().get_mut(&key).unwrap() -= 1;
        Ok(Handled::Applied)
    }

    fn batchable(&self) -> bool {
        true
    }
}

/// Checks one key's history: each event handled has a sequence above every one handled
/// before it, or is marked stale and below; a run again (a rolled-back attempt) is skipped.
fn check_order(key: &str, seen: &[Seen]) -> usize {
    let mut highest = i64::MIN;
    let mut stale = 0;
    let mut previous: Option<&str> = None;
    for event in seen {
        if previous == Some(event.event_id.as_str()) {
            continue;
        }
        previous = Some(event.event_id.as_str());
        if event.stale {
            assert!(
                event.sequence < highest,
                "key {key}: {event:?} marked stale after at most {highest}: {seen:?}"
            );
            stale += 1;
        } else {
            assert!(
                event.sequence > highest,
                "key {key}: {event:?} handled after {highest} and not marked stale: {seen:?}"
            );
            highest = event.sequence;
        }
    }
    stale
}

async fn deliver_concurrently(db: &TestDatabase, events: Vec<NewEvent>, tasks: usize) {
    let chunk = events.len().div_ceil(tasks);
    let mut senders = tokio::task::JoinSet::new();
    for part in events.chunks(chunk) {
        let part = part.to_vec();
        let mut conn = db.connect().await;
        senders.spawn(async move {
            for batch in part.chunks(50) {
                insert_events(&mut conn, batch).await.unwrap();
            }
        });
    }
    while let Some(result) = senders.join_next().await {
        result.unwrap();
    }
}

fn start_workers(db: &TestDatabase, recorder: &Arc<Recorder>, count: usize) -> Vec<RunningWorker> {
    (0..count)
        .map(|n| {
            let router = Router::new().route(None, None, Arc::clone(recorder) as Arc<dyn Handler>);
            RunningWorker::start(db, router, worker_settings(&format!("w{n}")))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_workers_handle_each_key_one_event_at_a_time_in_sequence_order_and_mark_late_ones() {
    const KEYS: usize = 500;
    const PER_KEY: i64 = 20;
    // One event of each key comes late, after everything else of its key is done.
    const LATE: i64 = 10;
    let db = TestDatabase::new().await;
    let recorder = Arc::new(Recorder::default());
    let workers = start_workers(&db, &recorder, 4);

    let mut rng = StdRng::seed_from_u64(14);
    let hold = Duration::from_millis(500);
    let mut first_wave: Vec<NewEvent> = (0..KEYS)
        .flat_map(|key| {
            (1..=PER_KEY)
                .filter(|&sequence| sequence != LATE)
                .map(move |sequence| ordered_event(&format!("k{key}"), sequence, hold))
        })
        .collect();
    // Providers redeliver: copies of a tenth of the events, sent concurrently with them.
    let copies: Vec<NewEvent> = (0..first_wave.len() / 10)
        .map(|_| first_wave[rng.random_range(0..first_wave.len())].clone())
        .collect();
    first_wave.extend(copies);
    first_wave.shuffle(&mut rng);
    deliver_concurrently(&db, first_wave, 8).await;

    let mut conn = db.connect().await;
    let first_wave_events = KEYS as i64 * (PER_KEY - 1);
    wait_for_count(
        &mut conn,
        "the first wave is done",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        first_wave_events,
        Duration::from_secs(120),
    )
    .await;
    let late: Vec<NewEvent> = (0..KEYS)
        .map(|key| ordered_event(&format!("k{key}"), LATE, Duration::ZERO))
        .collect();
    deliver_concurrently(&db, late, 4).await;
    wait_for_count(
        &mut conn,
        "every event is done",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        KEYS as i64 * PER_KEY,
        Duration::from_secs(60),
    )
    .await;
    for worker in workers {
        worker.stop().await;
    }

    assert_eq!(
        recorder.overlaps.load(Ordering::SeqCst),
        0,
        "two events of a key ran at once"
    );
    let mut stale = 0;
    for key in 0..KEYS {
        let key = format!("k{key}");
        let seen = recorder.seen(&key);
        let mut handled: Vec<&str> = seen.iter().map(|s| s.event_id.as_str()).collect();
        handled.sort_unstable();
        handled.dedup();
        assert_eq!(handled.len(), PER_KEY as usize, "key {key}: {seen:?}");
        stale += check_order(&key, &seen);
        let last = seen.last().unwrap();
        assert_eq!(
            (last.sequence, last.stale),
            (LATE, true),
            "key {key}: the late event is handled last, marked stale"
        );
    }
    assert!(stale >= KEYS, "at least every late event is stale: {stale}");
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_queue").await,
        0
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_keys WHERE processed_sequence = 20"
        )
        .await,
        KEYS as i64,
        "every key is free, its high-water mark the highest sequence"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reorder_window_lets_an_earlier_event_received_later_run_first() {
    let db = TestDatabase::new().await;
    let recorder = Arc::new(Recorder::default());
    let workers = start_workers(&db, &recorder, 1);
    let mut conn = db.connect().await;
    let window = Duration::from_secs(1);
    insert_events(&mut conn, &[ordered_event("pi_1", 2, window)])
        .await
        .unwrap();
    // The earlier event arrives late, but within the window of the first.
    insert_events(&mut conn, &[ordered_event("pi_1", 1, window)])
        .await
        .unwrap();
    wait_for_count(
        &mut conn,
        "both are done",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        2,
        Duration::from_secs(20),
    )
    .await;
    for worker in workers {
        worker.stop().await;
    }
    let seen: Vec<(i64, bool)> = recorder
        .seen("pi_1")
        .iter()
        .map(|s| (s.sequence, s.stale))
        .collect();
    assert_eq!(seen, [(1, false), (2, false)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_skips_late_arrivals_completes_them_without_its_handler() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(
            "INSERT INTO inbox_ordering_providers (provider, skip_stale) VALUES ('ordered', true)",
        ),
        &mut conn,
    )
    .await
    .unwrap();
    let recorder = Arc::new(Recorder::default());
    let workers = start_workers(&db, &recorder, 1);
    insert_events(&mut conn, &[ordered_event("pi_1", 5, Duration::ZERO)])
        .await
        .unwrap();
    wait_for_count(
        &mut conn,
        "the first is done",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        1,
        Duration::from_secs(20),
    )
    .await;
    insert_events(&mut conn, &[ordered_event("pi_1", 4, Duration::ZERO)])
        .await
        .unwrap();
    wait_for_count(
        &mut conn,
        "the late one is completed",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        2,
        Duration::from_secs(20),
    )
    .await;
    let mut stopped = Vec::new();
    for worker in workers {
        stopped.push(worker.stop().await);
    }
    let metrics = String::from_utf8(stopped[0].render()).unwrap();
    assert_eq!(
        recorder.seen("pi_1"),
        [Seen {
            event_id: "pi_1-5".into(),
            sequence: 5,
            stale: false
        }]
    );
    assert_eq!(
        metric_value(
            &metrics,
            r#"inbox_worker_stale_events_total{handling="skipped",provider="ordered"}"#
        ),
        Some(1.0)
    );
}

const ORDERED_PROVIDERS: &str = r#"
[providers.ordered]
scheme = "hmac-sha256"
signature_header = "X-Signature"
encoding = "hex"
prefix = "sha256="
event_id = { json_pointer = "/id" }
event_type = { json_pointer = "/type" }
secrets = [{ env = "DEMO_SECRET", name = "current" }]

[providers.ordered.ordering]
key = { json_pointer = "/data/object/id" }
sequence = { json_pointer = "/created" }
reorder_window = "300ms"
on_stale = "skip"
on_dead = "release"

[providers.demo]
scheme = "hmac-sha256"
signature_header = "X-Signature"
encoding = "hex"
prefix = "sha256="
event_id = { json_pointer = "/id" }
secrets = [{ env = "DEMO_SECRET", name = "current" }]
"#;

#[derive(diesel::QueryableByName, Debug, PartialEq)]
struct QueuedOrdering {
    #[diesel(sql_type = diesel::sql_types::Text)]
    event_id: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    ordering_key: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    ordering_sequence: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    held: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receiver_stores_an_ordered_providers_key_sequence_and_window_and_its_policies() {
    let db = TestDatabase::new().await;
    let receiver = TestReceiver::start(
        serve_args(&db, receiver::ingest::IngestMode::GroupCommit),
        providers(ORDERED_PROVIDERS, &[("DEMO_SECRET", DEMO_SECRET)]),
    )
    .await;
    let sign = |body: &str| {
        vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            (
                "x-signature".to_owned(),
                demo_signature(body.as_bytes(), DEMO_SECRET),
            ),
        ]
    };
    let ordered = r#"{"id":"evt_1","type":"payment_intent.succeeded","created":1700000001,"data":{"object":{"id":"pi_9"}}}"#;
    let keyless = r#"{"id":"evt_2","type":"balance.available","created":1700000002,"data":{}}"#;
    let unordered = r#"{"id":"evt_3","data":{"object":{"id":"pi_9"}}}"#;
    for (provider, body) in [
        ("ordered", ordered),
        ("ordered", keyless),
        ("demo", unordered),
    ] {
        let answer = receiver.post_webhook(provider, &sign(body), body).await;
        assert_eq!(answer.status, 200, "{provider}: {answer:?}");
    }
    let mut conn = db.connect().await;
    let rows: Vec<QueuedOrdering> = diesel_async::RunQueryDsl::load(
        diesel::sql_query(
            "SELECT event.event_id, queue.ordering_key, queue.ordering_sequence, \
                    queue.next_attempt_at > event.received_at + interval '200 milliseconds' AS held \
             FROM inbox_queue AS queue JOIN inbox_events AS event USING (id) ORDER BY event.event_id",
        ),
        &mut conn,
    )
    .await
    .unwrap();
    let row =
        |event_id: &str, key: Option<&str>, sequence: Option<i64>, held: bool| QueuedOrdering {
            event_id: event_id.into(),
            ordering_key: key.map(Into::into),
            ordering_sequence: sequence,
            held,
        };
    assert_eq!(
        rows,
        [
            row("evt_1", Some("ordered:pi_9"), Some(1_700_000_001), true),
            // No key: processed unordered.
            row("evt_2", None, None, false),
            row("evt_3", None, None, false),
        ]
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_ordering_providers \
             WHERE provider = 'ordered' AND release_dead AND skip_stale"
        )
        .await,
        1
    );
}

#[derive(diesel::QueryableByName, Debug)]
struct KeyState {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    processing: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    second_started: i64,
}

/// A worker process SIGKILLed while its forward of a key's first event hangs: until that
/// event's lease expires and is rescued, no worker starts the key's second event; then the
/// first runs again, before the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_while_holding_a_key_lets_no_other_event_of_it_start_before_the_rescue() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    insert_events(
        &mut conn,
        &[
            ordered_event("pi_1", 1, Duration::ZERO),
            ordered_event("pi_1", 2, Duration::ZERO),
        ],
    )
    .await
    .unwrap();
    // A target that accepts the forward and never answers: the worker holds the key.
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let folder = temp_folder("ordering-kill");
    let routes = folder.join("routes.toml");
    std::fs::write(
        &routes,
        format!(
            "[[routes]]\nprovider = \"ordered\"\nhandler = \"forward\"\nurl = \"http://{}/\"\ntimeout = \"60s\"\n",
            target.local_addr().unwrap()
        ),
    )
    .unwrap();
    let lease = Duration::from_secs(2);
    let mut process = std::process::Command::new(inbox_tests::chaos::bin_dir().join("worker"))
        .args([
            "run",
            "--metrics-listen",
            "127.0.0.1:0",
            "--poll-interval",
            "50ms",
        ])
        .arg("--routes")
        .arg(&routes)
        .args(["--lease", "2s", "--handler-timeout", "60s"])
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The forward of the first event is in flight.
    target.set_nonblocking(false).unwrap();
    let (_held, _) = tokio::task::spawn_blocking(move || target.accept().map(|c| (c, target)))
        .await
        .unwrap()
        .unwrap();
    process.kill().unwrap();
    process.wait().unwrap();
    let killed_at = std::time::Instant::now();

    // A healthy worker now claims and rescues; the key's second event waits for the rescue.
    let recorder = Arc::new(Recorder::default());
    let workers = start_workers(&db, &recorder, 1);
    let state_sql = "SELECT count(*) FILTER (WHERE queue.status = 1) AS processing, \
                            count(*) FILTER (WHERE event.event_id = 'pi_1-2' AND queue.attempt > 0) \
                                AS second_started \
                     FROM inbox_queue AS queue JOIN inbox_events AS event USING (id)";
    while killed_at.elapsed() < lease {
        let state: KeyState =
            diesel_async::RunQueryDsl::get_result(diesel::sql_query(state_sql), &mut conn)
                .await
                .unwrap();
        assert_eq!(
            state.second_started, 0,
            "the second event started before the rescue"
        );
        assert!(state.processing <= 1, "{state:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for_count(
        &mut conn,
        "both are done",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        2,
        Duration::from_secs(30),
    )
    .await;
    for worker in workers {
        worker.stop().await;
    }
    let seen: Vec<(String, bool)> = recorder
        .seen("pi_1")
        .into_iter()
        .map(|s| (s.event_id, s.stale))
        .collect();
    assert_eq!(
        seen,
        [("pi_1-1".to_owned(), false), ("pi_1-2".to_owned(), false)]
    );
    assert_eq!(
        recorder.overlaps.load(Ordering::SeqCst),
        0,
        "the two events ran at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_keys_next_event_is_handed_on_by_the_transaction_that_completes_the_one_before() {
    const EVENTS: i64 = 200;
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let events: Vec<NewEvent> = (1..=EVENTS)
        .map(|sequence| ordered_event("hot", sequence, Duration::ZERO))
        .collect();
    insert_events(&mut conn, &events).await.unwrap();
    let recorder = Arc::new(Recorder::default());
    // Two workers: the key's events still run one at a time, in sequence order.
    let workers = start_workers(&db, &recorder, 2);
    wait_for_count(
        &mut conn,
        "the hot key is drained",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        EVENTS,
        Duration::from_secs(60),
    )
    .await;
    let mut handed_on = 0;
    for worker in workers {
        handed_on += worker.stop().await.handed_on.get();
    }
    assert_eq!(recorder.overlaps.load(Ordering::SeqCst), 0);
    let seen = recorder.seen("hot");
    assert_eq!(check_order("hot", &seen), 0, "none is late");
    let sequences: Vec<i64> = seen.iter().map(|s| s.sequence).collect();
    assert_eq!(sequences, (1..=EVENTS).collect::<Vec<_>>());
    // Every event but the first is claimed by its predecessor's completion, not by a claim.
    assert_eq!(handed_on, EVENTS as u64 - 1);
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_keys WHERE processed_sequence = 200"
        )
        .await,
        1
    );
}

/// Inserts `events` events of one key no route takes, drains them with one worker of
/// `settings` and returns its metrics.
async fn drain_one_unrouted_key(key: &str, events: i64, settings: WorkerSettings) -> WorkerMetrics {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let ordered: Vec<NewEvent> = (1..=events)
        .map(|sequence| ordered_event(key, sequence, Duration::ZERO))
        .collect();
    insert_events(&mut conn, &ordered).await.unwrap();
    let worker = RunningWorker::start(&db, Router::new(), settings);
    wait_for_count(
        &mut conn,
        "the key is drained",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        events,
        Duration::from_secs(60),
    )
    .await;
    worker.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_no_route_takes_hand_their_key_on_as_well() {
    const EVENTS: i64 = 100;
    let metrics = drain_one_unrouted_key("unrouted", EVENTS, worker_settings("w-unrouted")).await;
    assert_eq!(metrics.handed_on.get(), EVENTS as u64 - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_key_handed_on_from_event_to_event_wakes_no_idle_claim_loop() {
    const EVENTS: i64 = 100;
    let mut settings = worker_settings("w-quiet");
    settings.claimers = 4;
    // Nothing but a wake-up makes an idle loop claim, and nothing spaces its claims.
    settings.poll_interval = Duration::from_secs(600);
    settings.claim_spacing = Duration::ZERO;
    let metrics = drain_one_unrouted_key("hot", EVENTS, settings).await;
    assert_eq!(metrics.handed_on.get(), EVENTS as u64 - 1);
    let claims: u64 = ["none", "some", "full"]
        .iter()
        .map(|found| metrics.claims.with_label_values(&[found]).get())
        .sum();
    // A few at the start and once the key is free; woken at every event, the three idle
    // loops would have claimed about three hundred times, finding nothing.
    assert!(
        claims < 20,
        "{claims} claims for {EVENTS} events of one key"
    );
}

/// One `demo_ledger` line, with the trace it keeps of an ordered event.
#[derive(Debug, PartialEq, Eq, diesel::QueryableByName)]
struct LedgerTrace {
    #[diesel(sql_type = diesel::sql_types::Text)]
    event_id: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    ordering_key: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    ordering_sequence: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Bool>)]
    stale: Option<bool>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Bool>)]
    written_after_it_started: Option<bool>,
    /// Its transaction kept, and its statement's start between the transaction's and the write.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Bool>)]
    statement_traced: Option<bool>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_handler_traces_each_ordered_event_with_its_key_sequence_stale_mark_and_moment() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    let worker = RunningWorker::start(&db, demo_router(), worker_settings("w-demo"));
    let done = "SELECT count(*) AS n FROM inbox_finished WHERE status = 2";
    let unordered = NewEvent {
        event_id: "plain-1".into(),
        ordering: None,
        ..ordered_event("plain", 1, Duration::ZERO)
    };
    // The second comes after the first is done, below it: late, handed over stale.
    for (n, event) in [
        ordered_event("pi_1", 5, Duration::ZERO),
        ordered_event("pi_1", 4, Duration::ZERO),
        unordered,
    ]
    .into_iter()
    .enumerate()
    {
        insert_events(&mut conn, &[event]).await.unwrap();
        wait_for_count(
            &mut conn,
            "done",
            done,
            n as i64 + 1,
            Duration::from_secs(20),
        )
        .await;
    }
    worker.stop().await;
    let lines: Vec<LedgerTrace> = diesel_async::RunQueryDsl::load(
        diesel::sql_query(
            "SELECT event_id, ordering_key, ordering_sequence, stale, \
                 written_at >= recorded_at AS written_after_it_started, \
                 CASE WHEN transaction_id IS NOT NULL OR statement_started_at IS NOT NULL \
                      THEN transaction_id IS NOT NULL \
                           AND statement_started_at BETWEEN recorded_at AND written_at \
                 END AS statement_traced \
             FROM demo_ledger ORDER BY id",
        ),
        &mut conn,
    )
    .await
    .unwrap();
    let ordered = |event_id: &str, sequence, stale| LedgerTrace {
        event_id: event_id.into(),
        ordering_key: Some(ordering_key(PROVIDER, "pi_1")),
        ordering_sequence: Some(sequence),
        stale: Some(stale),
        written_after_it_started: Some(true),
        statement_traced: Some(true),
    };
    assert_eq!(
        lines,
        [
            ordered("pi_1-5", 5, false),
            ordered("pi_1-4", 4, true),
            LedgerTrace {
                event_id: "plain-1".into(),
                ordering_key: None,
                ordering_sequence: None,
                stale: None,
                written_after_it_started: None,
                statement_traced: None,
            },
        ]
    );
}

/// Writes a `handled` line for each event in the attempt's transaction: its event id, its
/// sequence and the transaction's id; fails the events of `failures` (retryable) as many
/// times as it says.
#[derive(Default)]
struct TransactionTracer {
    failures: Mutex<HashMap<String, usize>>,
}

const HANDLED_TABLE: &str = "CREATE TABLE handled ( \
     line bigserial PRIMARY KEY, event_id text NOT NULL UNIQUE, sequence bigint NOT NULL, \
     transaction_id bigint NOT NULL)";

#[async_trait]
impl Handler for TransactionTracer {
    async fn handle(
        &self,
        event: &Event,
        conn: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        let fails = match self.failures.lock().unwrap().get_mut(&event.event_id) {
            Some(left) if *left > 0 => {
                *left -= 1;
                true
            }
            _ => false,
        };
        if fails {
            return Err(HandlerError::Retryable("not yet".into()));
        }
        diesel_async::RunQueryDsl::execute(
            diesel::sql_query(
                "INSERT INTO handled (event_id, sequence, transaction_id) \
                 VALUES ($1, $2, txid_current())",
            )
            .bind::<diesel::sql_types::Text, _>(&event.event_id)
            .bind::<diesel::sql_types::BigInt, _>(event.sequence.unwrap()),
            conn,
        )
        .await
        .map_err(|err| HandlerError::Retryable(err.to_string()))?;
        Ok(Handled::Applied)
    }

    fn batchable(&self) -> bool {
        true
    }
}

/// Drains `events` events of one key through `tracer` with one worker of transactions of
/// `transaction_size`; returns the sequences in the order their lines were written and the
/// number of transactions that wrote them.
async fn drain_traced_key(
    db: &TestDatabase,
    tracer: &Arc<TransactionTracer>,
    events: i64,
    transaction_size: usize,
) -> (Vec<i64>, i64) {
    let mut conn = db.connect().await;
    diesel_async::RunQueryDsl::execute(diesel::sql_query(HANDLED_TABLE), &mut conn)
        .await
        .unwrap();
    let ordered: Vec<NewEvent> = (1..=events)
        .map(|sequence| ordered_event("traced", sequence, Duration::ZERO))
        .collect();
    insert_events(&mut conn, &ordered).await.unwrap();
    let router = Router::new().route(None, None, Arc::clone(tracer) as Arc<dyn Handler>);
    let mut settings = worker_settings("w-traced");
    settings.transaction_size = transaction_size;
    let worker = RunningWorker::start(db, router, settings);
    wait_for_count(
        &mut conn,
        "the key is drained",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        events,
        Duration::from_secs(60),
    )
    .await;
    worker.stop().await;
    #[derive(diesel::QueryableByName)]
    struct Line {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        sequence: i64,
    }
    let lines: Vec<Line> = diesel_async::RunQueryDsl::load(
        diesel::sql_query("SELECT sequence FROM handled ORDER BY line"),
        &mut conn,
    )
    .await
    .unwrap();
    let transactions = count(
        &mut conn,
        "SELECT count(DISTINCT transaction_id) AS n FROM handled",
    )
    .await;
    (
        lines.iter().map(|line| line.sequence).collect(),
        transactions,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_keys_events_handed_on_run_in_the_transaction_that_handed_them_on() {
    const EVENTS: i64 = 100;
    let db = TestDatabase::new().await;
    let tracer = Arc::new(TransactionTracer::default());
    let (sequences, transactions) = drain_traced_key(&db, &tracer, EVENTS, 10).await;
    assert_eq!(sequences, (1..=EVENTS).collect::<Vec<_>>());
    // Ten events a transaction (its size): one commit per event would make a hundred.
    assert!(
        transactions <= 12,
        "{transactions} transactions for {EVENTS} events of one key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_event_handed_on_in_a_transaction_costs_the_events_before_it_nothing() {
    const EVENTS: i64 = 20;
    let db = TestDatabase::new().await;
    let tracer = Arc::new(TransactionTracer::default());
    // Its first failure rolls back the transaction it was handed on in, events before it
    // included, which runs again with a savepoint per event; its second is its own.
    tracer.failures.lock().unwrap().insert("traced-5".into(), 2);
    let (sequences, _) = drain_traced_key(&db, &tracer, EVENTS, 10).await;
    // Each written once, in sequence order: the key waited for the failing event's retry.
    assert_eq!(sequences, (1..=EVENTS).collect::<Vec<_>>());
    let mut conn = db.connect().await;
    let attempts = |event_id: &str| {
        format!(
            "SELECT finished.attempt::bigint AS n FROM inbox_finished AS finished \
             JOIN inbox_events AS event USING (id) WHERE event.event_id = '{event_id}'"
        )
    };
    assert_eq!(count(&mut conn, &attempts("traced-5")).await, 2);
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM inbox_finished WHERE attempt <> 1"
        )
        .await,
        1,
        "only the failing event took a second attempt"
    );
}

/// Counts the calls for each event, and takes `takes` over each.
struct CountingHandler {
    calls: Mutex<HashMap<String, usize>>,
    /// Event ids in the order their handling started.
    order: Mutex<Vec<String>>,
    takes: Duration,
    batchable: bool,
    running: AtomicUsize,
    most_running: AtomicUsize,
}

impl CountingHandler {
    fn new(takes: Duration, batchable: bool) -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::default(),
            order: Mutex::default(),
            takes,
            batchable,
            running: AtomicUsize::new(0),
            most_running: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl Handler for CountingHandler {
    async fn handle(
        &self,
        event: &Event,
        _: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        *self
            .calls
            .lock()
            .unwrap()
            .entry(event.event_id.clone())
            .or_default() += 1;
        self.order.lock().unwrap().push(event.event_id.clone());
        let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_running.fetch_max(running, Ordering::SeqCst);
        tokio::time::sleep(self.takes).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(Handled::Applied)
    }

    fn batchable(&self) -> bool {
        self.batchable
    }
}

/// Two events for each of `keys` keys: a `quick` one, then a `slow` one.
fn quick_then_slow(keys: usize) -> Vec<NewEvent> {
    (0..keys)
        .flat_map(|n| {
            let key = format!("k{n}");
            let mut first = ordered_event(&key, 1, Duration::ZERO);
            first.event_type = Some("quick".into());
            let mut second = ordered_event(&key, 2, Duration::ZERO);
            second.event_type = Some("slow".into());
            [first, second]
        })
        .collect()
}

/// Routes `quick` events to `quick` and `slow` events to `slow`.
fn quick_and_slow_routes(quick: &Arc<CountingHandler>, slow: &Arc<CountingHandler>) -> Router {
    Router::new()
        .route(None, Some("quick"), Arc::clone(quick) as Arc<dyn Handler>)
        .route(None, Some("slow"), Arc::clone(slow) as Arc<dyn Handler>)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_handed_on_keep_their_leases_while_they_wait_for_a_slot() {
    const KEYS: usize = 3;
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    // Each key's first event is quick and batchable: one transaction completes them and hands
    // on their second events, which need a transaction each and run one after another in the
    // worker's one slot, each for longer than a lease.
    insert_events(&mut conn, &quick_then_slow(KEYS))
        .await
        .unwrap();
    let quick = CountingHandler::new(Duration::ZERO, true);
    let slow = CountingHandler::new(Duration::from_millis(1500), false);
    let router = quick_and_slow_routes(&quick, &slow);
    let mut settings = worker_settings("w-handed-on");
    settings.lease = Duration::from_secs(1);
    settings.claimers = 1;
    settings.concurrency = 1;
    settings.handler_timeout = Duration::from_secs(5);
    let worker = RunningWorker::start(&db, router, settings);
    wait_for_count(
        &mut conn,
        "every event is done",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        2 * KEYS as i64,
        Duration::from_secs(30),
    )
    .await;
    let metrics = worker.stop().await;
    assert_eq!(
        metrics.handed_on.get(),
        KEYS as u64,
        "the second events were handed on"
    );
    let rescued = metrics.rescued.with_label_values(&["ready"]).get()
        + metrics.rescued.with_label_values(&["dead"]).get();
    assert_eq!(rescued, 0, "a waiting event's lease expired");
    assert_eq!(metrics.lease_lost.get(), 0);
    let calls = slow.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), KEYS);
    assert!(
        calls.values().all(|&calls| calls == 1),
        "a slow event ran more than once: {calls:?}"
    );
}

/// Events handed on together that cannot run in the transaction that handed them on (each
/// needs a transaction of its own) start at once in the worker's free slots, not one after
/// another in the slot that handed them on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_handed_on_together_run_in_free_slots_at_once() {
    const KEYS: usize = 4;
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    insert_events(&mut conn, &quick_then_slow(KEYS))
        .await
        .unwrap();
    // Long enough that quick events in slots of their own would overlap.
    let quick = CountingHandler::new(Duration::from_millis(50), true);
    let slow = CountingHandler::new(Duration::from_millis(500), false);
    let router = quick_and_slow_routes(&quick, &slow);
    let mut settings = worker_settings("w-handed-on-together");
    settings.claimers = 1;
    settings.concurrency = KEYS;
    let worker = RunningWorker::start(&db, router, settings);
    wait_for_count(
        &mut conn,
        "every event is done",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        2 * KEYS as i64,
        Duration::from_secs(30),
    )
    .await;
    let metrics = worker.stop().await;
    assert_eq!(
        quick.most_running.load(Ordering::SeqCst),
        1,
        "the first events ran one after another, in one transaction"
    );
    assert_eq!(
        metrics.handed_on.get(),
        KEYS as u64,
        "the second events were handed on"
    );
    assert_eq!(
        slow.most_running.load(Ordering::SeqCst),
        KEYS,
        "the events handed on ran side by side"
    );
    assert!(slow.calls.lock().unwrap().values().all(|&calls| calls == 1));
}

/// A slot running a busy key's events one after another gives way, between two of them, to
/// events handed on beside them that wait for a slot: a few busy keys cannot keep every slot
/// while other keys' events wait, leased, for as long as they stay busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_keys_events_give_way_to_events_waiting_for_a_slot() {
    let db = TestDatabase::new().await;
    let mut conn = db.connect().await;
    // Each key's first event is quick and batchable: one transaction completes both and hands
    // on their second events, which need a transaction each. Key k0 has five slow events.
    let mut events = Vec::new();
    for (key, slow_events) in [("k0", 5), ("k1", 1)] {
        let mut first = ordered_event(key, 1, Duration::ZERO);
        first.event_type = Some("quick".into());
        events.push(first);
        for sequence in 2..2 + slow_events {
            let mut slow = ordered_event(key, sequence, Duration::ZERO);
            slow.event_type = Some("slow".into());
            events.push(slow);
        }
    }
    insert_events(&mut conn, &events).await.unwrap();
    let quick = CountingHandler::new(Duration::ZERO, true);
    let slow = CountingHandler::new(Duration::from_millis(50), false);
    let router = quick_and_slow_routes(&quick, &slow);
    let mut settings = worker_settings("w-give-way");
    settings.claimers = 1;
    settings.concurrency = 1;
    let worker = RunningWorker::start(&db, router, settings);
    wait_for_count(
        &mut conn,
        "every event is done",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        events.len() as i64,
        Duration::from_secs(30),
    )
    .await;
    worker.stop().await;
    let order = slow.order.lock().unwrap().clone();
    assert_eq!(order.len(), 6, "{order:?}");
    assert_eq!(
        order[..2],
        ["k0-2", "k1-2"],
        "k1's event ran right after k0's first, not after all of k0's: {order:?}"
    );
}

/// Retention forgetting keys while their events arrive and four workers run them: every key
/// idle at a moment is forgotten (the cutoff is in the future), again and again, beside
/// arrivals that make the keys anew. Each key's events still run one at a time, in sequence
/// order, each once, and none is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forgetting_idle_keys_beside_arrivals_and_four_workers_keeps_each_key_in_order() {
    const KEYS: usize = 200;
    const PER_KEY: i64 = 10;
    const SENDERS: usize = 4;
    let db = TestDatabase::new().await;
    let recorder = Arc::new(Recorder::default());
    let workers = start_workers(&db, &recorder, 4);

    let delivering = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut forgetter = db.connect().await;
    let still_delivering = Arc::clone(&delivering);
    // After each pass, no queued event may have lost its key's row (the row every writer of
    // the key locks, and where its processed sequence is kept).
    let keyless = "SELECT count(*) AS n FROM inbox_queue AS queue \
                   WHERE queue.ordering_key IS NOT NULL AND NOT EXISTS ( \
                       SELECT 1 FROM inbox_keys AS key \
                       WHERE key.ordering_key = queue.ordering_key)";
    let forgetting = tokio::spawn(async move {
        let (mut forgotten, mut keyless_seen, mut rounds) = (0, 0, 0);
        while still_delivering.load(Ordering::SeqCst) || rounds == 0 {
            let cutoff = chrono::Utc::now() + chrono::TimeDelta::days(1);
            forgotten += inbox_core::ordering::forget_idle_keys(&mut forgetter, cutoff, 7)
                .await
                .unwrap();
            keyless_seen += count(&mut forgetter, keyless).await;
            rounds += 1;
        }
        (forgotten, keyless_seen)
    });

    // Each sender owns a share of the keys and sends their events in sequence order, one
    // round of sequences after another, its keys shuffled within each round.
    let mut senders = tokio::task::JoinSet::new();
    for sender in 0..SENDERS {
        let mut conn = db.connect().await;
        let mut rng = StdRng::seed_from_u64(sender as u64);
        senders.spawn(async move {
            let mut keys: Vec<usize> = (sender..KEYS).step_by(SENDERS).collect();
            for sequence in 1..=PER_KEY {
                keys.shuffle(&mut rng);
                for batch in keys.chunks(5) {
                    let events: Vec<NewEvent> = batch
                        .iter()
                        .map(|key| ordered_event(&format!("k{key}"), sequence, Duration::ZERO))
                        .collect();
                    insert_events(&mut conn, &events).await.unwrap();
                }
            }
        });
    }
    while let Some(result) = senders.join_next().await {
        result.unwrap();
    }
    let mut conn = db.connect().await;
    wait_for_count(
        &mut conn,
        "every event is done",
        "SELECT count(*) AS n FROM inbox_finished WHERE status = 2",
        KEYS as i64 * PER_KEY,
        Duration::from_secs(120),
    )
    .await;
    delivering.store(false, Ordering::SeqCst);
    let (forgotten, keyless_seen) = forgetting.await.unwrap();
    for worker in workers {
        worker.stop().await;
    }

    assert!(forgotten > 0, "no key was forgotten meanwhile");
    assert_eq!(
        keyless_seen, 0,
        "queued events found without their key's row"
    );
    assert_eq!(
        recorder.overlaps.load(Ordering::SeqCst),
        0,
        "two events of a key ran at once"
    );
    for key in 0..KEYS {
        let key = format!("k{key}");
        let seen = recorder.seen(&key);
        let sequences: Vec<i64> = seen.iter().map(|s| s.sequence).collect();
        assert_eq!(
            sequences,
            (1..=PER_KEY).collect::<Vec<_>>(),
            "key {key}: each event once, in order: {seen:?}"
        );
        assert!(seen.iter().all(|s| !s.stale), "key {key}: {seen:?}");
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_queue").await,
        0
    );
}

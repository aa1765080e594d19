//! `inbox-bench soak`: hours of traffic in one command. Open-loop signed webhooks at a fixed
//! rate, a sample of the database and the binaries every interval, and once everything is
//! drained, the time from each acknowledgement to its handler's commit, read back per event.
//!
//! The end-to-end pass runs after the load, so measuring it never loads the database being
//! measured; during the run each sample is one cheap statement and two `/proc` reads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use diesel::sql_types::{Array, BigInt, Double, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use hdrhistogram::Histogram;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::drained::wait_empty;
use crate::{connect, send, unix_seconds, Signer, Target};

/// What `soak` is told.
pub struct SoakPlan<'a> {
    pub target: &'a Target,
    pub rate: u64,
    pub duration: Duration,
    pub interval: Duration,
    pub database_url: &'a str,
    /// `host:port` of the worker's `/metrics`, for processed events per interval.
    pub worker_metrics: Option<&'a str>,
    /// `host:port` of the receiver's `/metrics`, for its own view of the answer times.
    pub receiver_metrics: Option<&'a str>,
    pub receiver_pid: Option<u32>,
    pub worker_pid: Option<u32>,
    /// How long to wait for the backlog to drain after the last send.
    pub drain_timeout: Duration,
}

/// The sender's record of one interval of schedule time.
struct IntervalTally {
    answers: Mutex<Histogram<u64>>,
    acked: AtomicU64,
    failed: AtomicU64,
}

/// The acknowledgement time of every event (unix seconds as f64 bits; 0 = not acknowledged),
/// indexed by the number in its event id.
struct Acks(Vec<AtomicU64>);

impl Acks {
    fn new(events: u64) -> Self {
        Self((0..events).map(|_| AtomicU64::new(0)).collect())
    }

    fn record(&self, n: u64, at: f64) {
        if let Some(slot) = self.0.get(n as usize) {
            slot.store(at.to_bits(), Ordering::Relaxed);
        }
    }

    fn get(&self, n: usize) -> Option<f64> {
        let bits = AtomicU64::load(self.0.get(n)?, Ordering::Relaxed);
        (bits != 0).then(|| f64::from_bits(bits))
    }
}

/// A counter's value (`load` by name would be diesel's).
fn read(counter: &AtomicU64) -> u64 {
    AtomicU64::load(counter, Ordering::Relaxed)
}

pub async fn soak(plan: SoakPlan<'_>) -> anyhow::Result<()> {
    let signer = Arc::new(Signer::new(plan.target)?);
    let total = plan.rate * plan.duration.as_secs();
    let intervals = plan
        .duration
        .as_secs()
        .div_ceil(plan.interval.as_secs().max(1)) as usize;
    let tallies: Arc<Vec<IntervalTally>> = Arc::new(
        (0..intervals)
            .map(|_| {
                Ok(IntervalTally {
                    answers: Mutex::new(Histogram::new(3)?),
                    acked: AtomicU64::new(0),
                    failed: AtomicU64::new(0),
                })
            })
            .collect::<anyhow::Result<_>>()?,
    );
    let acks = Arc::new(Acks::new(total));

    let mut conn = AsyncPgConnection::establish(plan.database_url)
        .await
        .context("connecting to the database")?;
    let mut samples = vec![take_sample(&mut conn, &plan).await?];
    let started = Instant::now();
    let sender = tokio::spawn(send_schedule(
        Arc::clone(&signer),
        plan.target.addr.clone(),
        plan.rate,
        total,
        plan.interval,
        Arc::clone(&tallies),
        Arc::clone(&acks),
    ));
    for i in 1..=intervals {
        tokio::time::sleep_until((started + plan.interval * i as u32).into()).await;
        let sample = take_sample(&mut conn, &plan).await?;
        eprintln!(
            "soak: {}",
            progress_line(i, samples.last(), &sample, &tallies[i - 1])
        );
        samples.push(sample);
    }
    sender.await??;
    let drained_in = wait_drained(&mut conn, plan.drain_timeout).await?;
    let end_to_end = read_back(&mut conn, &plan, &acks, &tallies, started).await?;
    let report = summarize(&plan, &samples, &tallies, &end_to_end, drained_in);
    println!("{report}");
    Ok(())
}

async fn send_schedule(
    signer: Arc<Signer>,
    addr: String,
    rate: u64,
    total: u64,
    interval: Duration,
    tallies: Arc<Vec<IntervalTally>>,
    acks: Arc<Acks>,
) -> anyhow::Result<()> {
    // Enough connections that a slow answer never holds back the schedule; a request waiting
    // for one counts its wait, from the time it was due.
    let (slots_tx, slots_rx) = tokio::sync::mpsc::channel(128);
    for _ in 0..128 {
        slots_tx.send(connect(&addr).await?).await?;
    }
    let slots = Arc::new(tokio::sync::Mutex::new(slots_rx));
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate.max(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut in_flight = JoinSet::new();
    for n in 0..total {
        ticker.tick().await;
        while in_flight.try_join_next().is_some() {}
        let scheduled = Instant::now();
        let index = ((scheduled - started).as_secs() / interval.as_secs().max(1)) as usize;
        let index = index.min(tallies.len().saturating_sub(1));
        let (_, request) = signer.request();
        let (slots, slots_tx, addr) = (Arc::clone(&slots), slots_tx.clone(), addr.clone());
        let (tallies, acks) = (Arc::clone(&tallies), Arc::clone(&acks));
        in_flight.spawn(async move {
            let Some(mut sender) = slots.lock().await.recv().await else {
                return;
            };
            let tally = &tallies[index];
            match send(&mut sender, request).await {
                Ok(true) => {
                    if let Ok(mut answers) = tally.answers.lock() {
                        let _ = answers.record(scheduled.elapsed().as_micros() as u64);
                    }
                    tally.acked.fetch_add(1, Ordering::Relaxed);
                    acks.record(n, unix_seconds(SystemTime::now()));
                }
                Ok(false) => {
                    tally.failed.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    tally.failed.fetch_add(1, Ordering::Relaxed);
                    // A broken connection is replaced, so the pool keeps its size.
                    match connect(&addr).await {
                        Ok(fresh) => sender = fresh,
                        Err(_) => return,
                    }
                }
            }
            let _ = slots_tx.send(sender).await;
        });
    }
    while in_flight.join_next().await.is_some() {}
    Ok(())
}

#[derive(QueryableByName, Clone, Copy)]
struct DatabaseSample {
    #[diesel(sql_type = Double)]
    wal_bytes: f64,
    #[diesel(sql_type = BigInt)]
    wal_full_page_images: i64,
    #[diesel(sql_type = BigInt)]
    checkpoints_timed: i64,
    #[diesel(sql_type = BigInt)]
    checkpoints_requested: i64,
    #[diesel(sql_type = Double)]
    checkpoint_write_ms: f64,
    #[diesel(sql_type = Double)]
    checkpoint_sync_ms: f64,
    #[diesel(sql_type = BigInt)]
    autovacuums: i64,
    #[diesel(sql_type = BigInt)]
    autoanalyzes: i64,
    #[diesel(sql_type = BigInt)]
    backlog: i64,
}

#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    database: DatabaseSample,
    processed: Option<f64>,
    receiver_answers: Option<ReceiverAnswers>,
    receiver_rss_kib: Option<u64>,
    worker_rss_kib: Option<u64>,
    cpu: CpuSeconds,
}

/// CPU seconds (user + system) spent so far, by whom.
#[derive(Clone, Copy, Default)]
struct CpuSeconds {
    receiver: f64,
    worker: f64,
    /// Every process named `postgres` on this machine: the server, when it runs here.
    database: f64,
    /// This load generator.
    load: f64,
}

impl CpuSeconds {
    fn read(plan: &SoakPlan<'_>) -> Self {
        let of = |pid: Option<u32>| {
            pid.and_then(|pid| cpu_seconds(&pid.to_string()))
                .unwrap_or(0.0)
        };
        let database = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let pid = entry.file_name().into_string().ok()?;
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                (comm.trim() == "postgres")
                    .then(|| cpu_seconds(&pid))
                    .flatten()
            })
            .sum();
        Self {
            receiver: of(plan.receiver_pid),
            worker: of(plan.worker_pid),
            database,
            load: cpu_seconds("self").unwrap_or(0.0),
        }
    }
}

/// utime + stime of a process, from `/proc/PID/stat` (in clock ticks of 1/100 s on Linux).
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: count fields after its closing parenthesis.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

async fn take_sample(conn: &mut AsyncPgConnection, plan: &SoakPlan<'_>) -> anyhow::Result<Sample> {
    let database: DatabaseSample = diesel::sql_query(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8 AS wal_bytes, \
                (SELECT wal_fpi FROM pg_stat_wal) AS wal_full_page_images, \
                checkpoints_timed, checkpoints_req AS checkpoints_requested, \
                checkpoint_write_time AS checkpoint_write_ms, \
                checkpoint_sync_time AS checkpoint_sync_ms, \
                (SELECT coalesce(sum(autovacuum_count), 0)::bigint FROM pg_stat_all_tables) AS autovacuums, \
                (SELECT coalesce(sum(autoanalyze_count), 0)::bigint FROM pg_stat_all_tables) AS autoanalyzes, \
                (SELECT count(*) FROM inbox_queue) AS backlog \
         FROM pg_stat_bgwriter",
    )
    .get_result(conn)
    .await
    .context("sampling the database")?;
    let processed = match plan.worker_metrics {
        Some(addr) => Some(processed_events(addr).await?),
        None => None,
    };
    let receiver_answers = match plan.receiver_metrics {
        Some(addr) => Some(receiver_answers(addr).await?),
        None => None,
    };
    Ok(Sample {
        at: Instant::now(),
        database,
        processed,
        receiver_answers,
        receiver_rss_kib: plan.receiver_pid.and_then(rss_kib),
        worker_rss_kib: plan.worker_pid.and_then(rss_kib),
        cpu: CpuSeconds::read(plan),
    })
}

/// Resident set size of a process, from `/proc`.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A binary's `/metrics` page.
async fn metrics_page(addr: &str) -> anyhow::Result<String> {
    let mut sender = connect(addr).await?;
    let request = hyper::Request::get("/metrics")
        .header("host", addr)
        .body(http_body_util::Full::new(bytes::Bytes::new()))?;
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let body = response.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The sum over every series of `metric` (its name and the `{` of its labels) whose labels
/// contain `label`.
fn sum_of(page: &str, metric: &str, label: &str) -> f64 {
    page.lines()
        .filter(|line| line.starts_with(metric) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Events the worker has finished, every outcome: the sum of `inbox_worker_events_total`.
async fn processed_events(addr: &str) -> anyhow::Result<f64> {
    let page = metrics_page(addr).await?;
    Ok(sum_of(&page, "inbox_worker_events_total{", ""))
}

/// The receiver's own count of answers, from a request's arrival in its handler to its answer
/// (`inbox_receiver_ingest_duration_seconds`): how many, and how many within 20 ms. Beside the
/// load generator's figure it tells the receiver's time from the time the load generator,
/// sharing the cores, took to send and to read the answer.
#[derive(Clone, Copy)]
struct ReceiverAnswers {
    total: f64,
    within_20ms: f64,
}

async fn receiver_answers(addr: &str) -> anyhow::Result<ReceiverAnswers> {
    let page = metrics_page(addr).await?;
    let histogram = "inbox_receiver_ingest_duration_seconds";
    Ok(ReceiverAnswers {
        total: sum_of(&page, &format!("{histogram}_count{{"), ""),
        within_20ms: sum_of(&page, &format!("{histogram}_bucket{{"), "le=\"0.02\""),
    })
}

fn progress_line(
    index: usize,
    before: Option<&Sample>,
    after: &Sample,
    tally: &IntervalTally,
) -> String {
    let seconds = before
        .map_or(1.0, |b| (after.at - b.at).as_secs_f64())
        .max(1e-3);
    let p99 = tally
        .answers
        .lock()
        .map_or(0.0, |h| h.value_at_quantile(0.99) as f64 / 1000.0);
    let processed = match (before.and_then(|b| b.processed), after.processed) {
        (Some(b), Some(a)) => format!("{:.0}/s", (a - b) / seconds),
        _ => "-".into(),
    };
    format!(
        "interval {index}: acked {:.0}/s, failed {}, answer p99 {p99:.1} ms, processed {processed}, backlog {}",
        read(&tally.acked) as f64 / seconds,
        read(&tally.failed),
        after.database.backlog,
    )
}

/// Waits until no event is ready or processing; how long that took after the last send.
async fn wait_drained(conn: &mut AsyncPgConnection, timeout: Duration) -> anyhow::Result<f64> {
    let drained_in = wait_empty(conn, Duration::from_millis(100), timeout)
        .await?
        .with_context(|| format!("backlog not drained {timeout:?} after the last send"))?;
    Ok(drained_in.as_secs_f64())
}

#[derive(QueryableByName)]
struct Finished {
    #[diesel(sql_type = BigInt)]
    n: i64,
    #[diesel(sql_type = Nullable<Double>)]
    processed_at: Option<f64>,
    #[diesel(sql_type = Nullable<SmallInt>)]
    status: Option<i16>,
}

/// Per interval of schedule time: end-to-end latency of its acknowledged events.
struct EndToEnd {
    per_interval: Vec<Histogram<u64>>,
    /// Acknowledged events without a finished row: lost, whatever the reason.
    lost: u64,
    /// Acknowledged events finished other than done (dead): none should be.
    not_done: u64,
    /// The seconds of the run with the slowest event, and that event's latency in ms.
    worst_seconds: Vec<(u64, f64)>,
}

async fn read_back(
    conn: &mut AsyncPgConnection,
    plan: &SoakPlan<'_>,
    acks: &Acks,
    tallies: &[IntervalTally],
    started: Instant,
) -> anyhow::Result<EndToEnd> {
    let started_unix = unix_seconds(SystemTime::now()) - started.elapsed().as_secs_f64();
    let interval = plan.interval.as_secs_f64().max(1.0);
    let mut result = EndToEnd {
        per_interval: (0..tallies.len())
            .map(|_| Histogram::new(3))
            .collect::<Result<_, _>>()?,
        lost: 0,
        not_done: 0,
        worst_seconds: Vec::new(),
    };
    let mut worst_per_second: HashMap<u64, u64> = HashMap::new();
    let acked: Vec<i64> = (0..acks.0.len())
        .filter(|&n| acks.get(n).is_some())
        .map(|n| n as i64)
        .collect();
    for chunk in acked.chunks(10_000) {
        let rows: Vec<Finished> = diesel::sql_query(
            // By key, one lookup per event: joined plainly, a big chunk is hashed against the
            // whole dedup table, which spills to disk at millions of events.
            "SELECT x.n, extract(epoch FROM f.processed_at)::float8 AS processed_at, f.status \
             FROM unnest($1::bigint[]) AS x(n) \
             LEFT JOIN LATERAL (SELECT id FROM inbox_dedup \
                 WHERE provider = $2 AND event_id = $3 || '-' || x.n LIMIT 1) AS d ON true \
             LEFT JOIN LATERAL (SELECT processed_at, status FROM inbox_finished \
                 WHERE inbox_finished.id = d.id LIMIT 1) AS f ON true",
        )
        .bind::<Array<BigInt>, _>(chunk)
        .bind::<Text, _>(&plan.target.provider)
        .bind::<Text, _>(&plan.target.run_id)
        .load(conn)
        .await
        .context("reading back the finished events")?;
        for row in rows {
            let (Some(processed_at), Some(acked_at)) = (row.processed_at, acks.get(row.n as usize))
            else {
                result.lost += 1;
                continue;
            };
            if row.status != Some(2) {
                result.not_done += 1;
            }
            // The handler may commit before the client reads its answer: that counts as 0.
            let micros = ((processed_at - acked_at) * 1e6).max(0.0) as u64;
            let since_start = (acked_at - started_unix).max(0.0);
            let index = ((since_start / interval) as usize).min(result.per_interval.len() - 1);
            result.per_interval[index].record(micros)?;
            let worst = worst_per_second.entry(since_start as u64).or_default();
            *worst = (*worst).max(micros);
        }
    }
    let mut worst: Vec<(u64, u64)> = worst_per_second.into_iter().collect();
    worst.sort_by_key(|second| std::cmp::Reverse(second.1));
    result.worst_seconds = worst
        .into_iter()
        .take(10)
        .map(|(second, micros)| (second, micros as f64 / 1000.0))
        .collect();
    Ok(result)
}

fn quantiles_ms(histogram: &Histogram<u64>) -> Value {
    let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    json!({
        "count": histogram.len(),
        "p50_ms": ms(0.50),
        "p99_ms": ms(0.99),
        "p999_ms": ms(0.999),
        "max_ms": histogram.max() as f64 / 1000.0,
    })
}

fn summarize(
    plan: &SoakPlan<'_>,
    samples: &[Sample],
    tallies: &[IntervalTally],
    end_to_end: &EndToEnd,
    drained_in: f64,
) -> Value {
    let intervals: Vec<Value> = samples
        .windows(2)
        .zip(tallies)
        .zip(&end_to_end.per_interval)
        .enumerate()
        .map(|(index, ((pair, tally), e2e))| {
            let (before, after) = (&pair[0], &pair[1]);
            let seconds = (after.at - before.at).as_secs_f64().max(1e-3);
            let (b, a) = (&before.database, &after.database);
            let answers = tally
                .answers
                .lock()
                .map_or(Value::Null, |h| quantiles_ms(&h));
            json!({
                "interval": index,
                "end_s": (after.at - samples[0].at).as_secs_f64(),
                "acked_per_s": read(&tally.acked) as f64 / seconds,
                "failed": read(&tally.failed),
                "answer": answers,
                "end_to_end": quantiles_ms(e2e),
                "processed_per_s": match (before.processed, after.processed) {
                    (Some(b), Some(a)) => json!((a - b) / seconds),
                    _ => Value::Null,
                },
                // Answers of this interval (by the time they were answered) that the receiver
                // gave within 20 ms of their arrival, as a share.
                "receiver_within_20ms": match (before.receiver_answers, after.receiver_answers) {
                    (Some(b), Some(a)) if a.total > b.total => {
                        json!((a.within_20ms - b.within_20ms) / (a.total - b.total))
                    }
                    _ => Value::Null,
                },
                "backlog": a.backlog,
                "receiver_rss_kib": after.receiver_rss_kib,
                "worker_rss_kib": after.worker_rss_kib,
                "wal_bytes": a.wal_bytes - b.wal_bytes,
                "wal_full_page_images": a.wal_full_page_images - b.wal_full_page_images,
                "checkpoints_timed": a.checkpoints_timed - b.checkpoints_timed,
                "checkpoints_requested": a.checkpoints_requested - b.checkpoints_requested,
                "checkpoint_write_ms": a.checkpoint_write_ms - b.checkpoint_write_ms,
                "checkpoint_sync_ms": a.checkpoint_sync_ms - b.checkpoint_sync_ms,
                "autovacuums": a.autovacuums - b.autovacuums,
                "autoanalyzes": a.autoanalyzes - b.autoanalyzes,
                "cpu_seconds": {
                    "receiver": after.cpu.receiver - before.cpu.receiver,
                    "worker": after.cpu.worker - before.cpu.worker,
                    "database": after.cpu.database - before.cpu.database,
                    "load": after.cpu.load - before.cpu.load,
                },
            })
        })
        .collect();
    let acked: u64 = tallies.iter().map(|t| read(&t.acked)).sum();
    let failed: u64 = tallies.iter().map(|t| read(&t.failed)).sum();
    let wal_bytes = match (samples.first(), samples.last()) {
        (Some(first), Some(last)) => last.database.wal_bytes - first.database.wal_bytes,
        _ => 0.0,
    };
    let per_event_ms = |part: fn(&CpuSeconds) -> f64| match (samples.first(), samples.last()) {
        (Some(first), Some(last)) if acked > 0 => {
            (part(&last.cpu) - part(&first.cpu)) * 1000.0 / acked as f64
        }
        _ => 0.0,
    };
    json!({
        "rate": plan.rate,
        // CPU time per acknowledged event during the sending, by process.
        "cpu_ms_per_event": {
            "receiver": per_event_ms(|cpu| cpu.receiver),
            "worker": per_event_ms(|cpu| cpu.worker),
            "database": per_event_ms(|cpu| cpu.database),
            "load": per_event_ms(|cpu| cpu.load),
        },
        "seconds": plan.duration.as_secs_f64(),
        "interval_seconds": plan.interval.as_secs_f64(),
        "body_bytes": plan.target.body_bytes,
        "sent": plan.rate * plan.duration.as_secs(),
        "acked": acked,
        "failed": failed,
        "lost": end_to_end.lost,
        "not_done": end_to_end.not_done,
        "drained_seconds_after_last_send": drained_in,
        // Everything the database wrote during the sending, per acknowledged event.
        "wal_bytes_per_event": if acked > 0 { wal_bytes / acked as f64 } else { 0.0 },
        "worst_seconds": end_to_end.worst_seconds.iter()
            .map(|(second, ms)| json!({"second": second, "end_to_end_ms": ms}))
            .collect::<Vec<_>>(),
        "intervals": intervals,
    })
}

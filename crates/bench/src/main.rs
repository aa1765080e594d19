//! `inbox-bench`: the load generator and measurements behind `make bench`.
//!
//! - `ingest`: closed-loop load on a receiver (each connection sends its next signed webhook as
//!   soon as the previous one is answered), reporting accepted webhooks per second and latency
//!   quantiles.
//! - `steady`: open-loop load at a fixed rate, then the time from each 2xx to its handler's
//!   commit, read from the database.
//! - `prefill` and `wait-drained`: a backlog for the worker, and the time it takes to empty it.
//! - `soak`: `steady` for as long as it takes to see a database in its steady state, sampled
//!   every interval (see `soak.rs`).
//!
//! Results are printed as one JSON object per run, for `bench/run` to collect.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use clap::{Parser, Subcommand};
use diesel::sql_types::{BigInt, Double, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use inbox_signature::providers::{self, Options, TemplateOptions};
use inbox_signature::{Algorithm, DigestEncoding, Outgoing, Scheme, SigningKey, TimestampFormat};

mod drained;
mod soak;

/// Load generator and measurements for webhook-inbox benchmarks.
#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
struct Target {
    /// Receiver address (host:port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: String,
    /// Provider name; its event id must be at `/id` or where its scheme signs it. With the
    /// default scheme it is a generic hmac-sha256 provider with an `X-Signature: sha256=<hex>`
    /// header (the `demo` provider of the example file).
    #[arg(long, default_value = "demo")]
    provider: String,
    /// The provider's scheme, a catalog name: `hmac-sha256` (as `demo`), or e.g.
    /// `standard-webhooks` to measure Ed25519 (`v1a`) with a `whsk_` secret.
    #[arg(long, default_value = "hmac-sha256")]
    scheme: String,
    /// The provider's secret (a private key for public-key schemes).
    #[arg(long, env = "BENCH_SECRET", hide_env_values = true)]
    secret: String,
    /// Size of each JSON body in bytes.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// Prefix of the event ids, unique per run.
    #[arg(long)]
    run_id: String,
    /// Also send each event's id in this header (for a provider that reads its id there,
    /// e.g. one that suppresses replays).
    #[arg(long)]
    id_header: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Closed-loop load at a fixed concurrency.
    Ingest {
        #[command(flatten)]
        target: Target,
        /// Concurrent connections, each with one request in flight.
        #[arg(long)]
        concurrency: usize,
        /// Measured duration.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
        duration: Duration,
        /// Unmeasured warm-up before it.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
        warmup: Duration,
    },
    /// Open-loop load at a fixed rate; then, from the database, the time from each 2xx to the
    /// handler's commit.
    Steady {
        #[command(flatten)]
        target: Target,
        /// Webhooks per second.
        #[arg(long, default_value_t = 1000)]
        rate: u64,
        /// How long to send.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
        duration: Duration,
        /// Database holding the inbox.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Only measure the answers' latency; do not wait for the handlers.
        #[arg(long)]
        no_e2e: bool,
    },
    /// Open-loop load at a fixed rate for a long time, sampled every interval (answers,
    /// processed events, backlog, RSS of the binaries, WAL, checkpoints, autovacuum); once
    /// drained, the time from each 2xx to its handler's commit, per interval. Prints one JSON
    /// document; progress goes to stderr.
    Soak {
        #[command(flatten)]
        target: Target,
        /// Webhooks per second.
        #[arg(long)]
        rate: u64,
        /// How long to send.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "30m")]
        duration: Duration,
        /// Length of each sampled interval.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1m")]
        interval: Duration,
        /// The worker's metrics address (host:port), for processed events per interval.
        #[arg(long)]
        worker_metrics: Option<String>,
        /// The receiver's metrics address (host:port), for its own share of answers within
        /// 20 ms per interval.
        #[arg(long)]
        receiver_metrics: Option<String>,
        /// The receiver's process id, for its RSS.
        #[arg(long)]
        receiver_pid: Option<u32>,
        /// The worker's process id, for its RSS.
        #[arg(long)]
        worker_pid: Option<u32>,
        /// How long the backlog may take to drain after the last send.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
        drain_timeout: Duration,
        /// Database holding the inbox.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Inserts a backlog of ready events directly (1 KiB bodies).
    Prefill {
        /// Events to insert.
        #[arg(long)]
        events: i64,
        /// Event type of the events.
        #[arg(long, default_value = "bench.event")]
        event_type: String,
        /// Database holding the inbox.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// A forward target for the worker: answers every request 200, after `delay`.
    Sink {
        /// Address to listen on.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// How long each answer waits.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
        delay: Duration,
    },
    /// Waits until no event is ready or processing, and reports how long that took.
    WaitDrained {
        /// Events the backlog held when the clock started.
        #[arg(long)]
        events: i64,
        /// Give up after this long.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
        timeout: Duration,
        /// Database holding the inbox.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Ingest {
            target,
            concurrency,
            duration,
            warmup,
        } => ingest(&target, concurrency, duration, warmup).await,
        Command::Steady {
            target,
            rate,
            duration,
            database_url,
            no_e2e,
        } => steady(&target, rate, duration, &database_url, !no_e2e).await,
        Command::Soak {
            target,
            rate,
            duration,
            interval,
            worker_metrics,
            receiver_metrics,
            receiver_pid,
            worker_pid,
            drain_timeout,
            database_url,
        } => {
            anyhow::ensure!(rate > 0, "--rate must be at least 1");
            anyhow::ensure!(
                interval >= Duration::from_secs(1) && interval <= duration,
                "--interval must be at least 1s and at most --duration"
            );
            soak::soak(soak::SoakPlan {
                target: &target,
                rate,
                duration,
                interval,
                database_url: &database_url,
                worker_metrics: worker_metrics.as_deref(),
                receiver_metrics: receiver_metrics.as_deref(),
                receiver_pid,
                worker_pid,
                drain_timeout,
            })
            .await
        }
        Command::Prefill {
            events,
            event_type,
            database_url,
        } => prefill(&database_url, events, &event_type).await,
        Command::WaitDrained {
            events,
            timeout,
            database_url,
        } => wait_drained(&database_url, events, timeout).await,
        Command::Sink { listen, delay } => sink(listen, delay).await,
    }
}

/// Builds signed requests with unique event ids.
struct Signer {
    scheme: std::sync::Arc<dyn Scheme>,
    key: SigningKey,
    path: String,
    host: String,
    padding: String,
    run_id: String,
    id_header: Option<String>,
    next: AtomicU64,
}

impl Signer {
    fn new(target: &Target) -> anyhow::Result<Self> {
        let template = (target.scheme == "hmac-sha256").then(|| TemplateOptions {
            signature_header: "X-Signature".into(),
            signed: None,
            algorithm: Algorithm::Sha256,
            encoding: DigestEncoding::Hex,
            prefix: Some("sha256=".into()),
            timestamp_header: None,
            timestamp_format: TimestampFormat::UnixSeconds,
            id_header: None,
            hex_key: false,
        });
        let options = Options {
            template,
            ..Options::default()
        };
        let scheme = providers::build(&target.scheme, &options)
            .map_err(|err| anyhow::anyhow!("scheme {}: {err}", target.scheme))?;
        let key = scheme
            .key_from_secret(&target.secret)
            .map_err(|err| anyhow::anyhow!("secret: {err}"))?;
        Ok(Self {
            scheme,
            key,
            path: format!("/webhooks/{}", target.provider),
            host: target.addr.clone(),
            padding: "x".repeat(target.body_bytes.saturating_sub(112)),
            run_id: target.run_id.clone(),
            id_header: target.id_header.clone(),
            next: AtomicU64::new(0),
        })
    }

    fn request(&self) -> (String, hyper::Request<Full<Bytes>>) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let event_id = format!("{}-{n}", self.run_id);
        // An object among 10,000, for providers that order events per object.
        let body = format!(
            r#"{{"id":"{event_id}","type":"bench.event","data":{{"object":"o{:04}","padding":"{}"}}}}"#,
            n % 10_000,
            self.padding
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(0));
        let signed = self
            .scheme
            .sign(&self.key, &Outgoing::post(body.as_bytes(), &event_id, now))
            .ok();
        let (headers, body) = signed.map_or((Vec::new(), body.clone().into_bytes()), |signed| {
            (signed.headers, signed.body)
        });
        let mut builder = hyper::Request::post(self.path.as_str())
            .header("host", self.host.as_str())
            .header("content-type", "application/json");
        for (name, value) in headers {
            builder = builder.header(name, value);
        }
        if let Some(name) = &self.id_header {
            builder = builder.header(name.as_str(), event_id.as_str());
        }
        let request = builder
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_default();
        (event_id, request)
    }
}

async fn connect(addr: &str) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Sends one request; returns whether it was a 2xx.
async fn send(
    sender: &mut SendRequest<Full<Bytes>>,
    request: hyper::Request<Full<Bytes>>,
) -> anyhow::Result<bool> {
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let ok = response.status().is_success();
    // Read the body to completion so the connection can carry the next request.
    response.into_body().collect().await?;
    Ok(ok)
}

#[derive(Default)]
struct Tally {
    accepted: u64,
    failed: u64,
}

async fn ingest(
    target: &Target,
    concurrency: usize,
    duration: Duration,
    warmup: Duration,
) -> anyhow::Result<()> {
    let signer = Arc::new(Signer::new(target)?);
    let started = Instant::now();
    let measure_from = started + warmup;
    let stop_at = measure_from + duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let signer = Arc::clone(&signer);
        let addr = target.addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new(3)?;
            let mut tally = Tally::default();
            let mut sender = connect(&addr).await?;
            loop {
                let now = Instant::now();
                if now >= stop_at {
                    break;
                }
                let (_, request) = signer.request();
                let ok = match send(&mut sender, request).await {
                    Ok(ok) => ok,
                    Err(_) => {
                        sender = connect(&addr).await?;
                        false
                    }
                };
                let done = Instant::now();
                if now >= measure_from && done <= stop_at {
                    if ok {
                        tally.accepted += 1;
                        histogram.record(done.duration_since(now).as_micros() as u64)?;
                    } else {
                        tally.failed += 1;
                    }
                }
            }
            anyhow::Ok((histogram, tally))
        }));
    }
    let mut histogram = Histogram::<u64>::new(3)?;
    let mut tally = Tally::default();
    for task in tasks {
        let (h, t) = task.await??;
        histogram.add(h)?;
        tally.accepted += t.accepted;
        tally.failed += t.failed;
    }
    let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{}",
        serde_json::json!({
            "concurrency": concurrency,
            "seconds": duration.as_secs_f64(),
            "accepted": tally.accepted,
            "failed": tally.failed,
            "per_second": tally.accepted as f64 / duration.as_secs_f64(),
            "p50_ms": ms(0.50),
            "p99_ms": ms(0.99),
            "p999_ms": ms(0.999),
        })
    );
    Ok(())
}

fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[derive(QueryableByName)]
struct Processed {
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = Double)]
    processed_at: f64,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn steady(
    target: &Target,
    rate: u64,
    duration: Duration,
    database_url: &str,
    end_to_end: bool,
) -> anyhow::Result<()> {
    let signer = Arc::new(Signer::new(target)?);
    let acks: Arc<Mutex<Vec<(String, f64)>>> = Arc::new(Mutex::new(Vec::new()));
    let latencies = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let failed = Arc::new(AtomicU64::new(0));
    // Enough connections that a slow answer never holds back the schedule.
    let (slots_tx, slots_rx) = tokio::sync::mpsc::channel(64);
    for _ in 0..64 {
        slots_tx.send(connect(&target.addr).await?).await?;
    }
    let slots = Arc::new(tokio::sync::Mutex::new(slots_rx));
    let mut ticker = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate.max(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = rate * duration.as_secs();
    let mut tasks = Vec::with_capacity(total as usize);
    for _ in 0..total {
        ticker.tick().await;
        let (event_id, request) = signer.request();
        let slots = Arc::clone(&slots);
        let slots_tx = slots_tx.clone();
        let acks = Arc::clone(&acks);
        let failed = Arc::clone(&failed);
        let latencies = Arc::clone(&latencies);
        let scheduled = Instant::now();
        tasks.push(tokio::spawn(async move {
            let Some(mut sender) = slots.lock().await.recv().await else {
                return;
            };
            match send(&mut sender, request).await {
                Ok(true) => {
                    // From the scheduled send time, so a queue in the client counts too.
                    if let Ok(mut latencies) = latencies.lock() {
                        let _ = latencies.record(scheduled.elapsed().as_micros() as u64);
                    }
                    let at = unix_seconds(SystemTime::now());
                    if let Ok(mut acks) = acks.lock() {
                        acks.push((event_id, at));
                    }
                }
                _ => {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            let _ = slots_tx.send(sender).await;
        }));
    }
    for task in tasks {
        task.await?;
    }
    let acks = std::mem::take(&mut *acks.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    let latencies = latencies
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let answer_ms = |q: f64| latencies.value_at_quantile(q) as f64 / 1000.0;
    let mut summary = serde_json::json!({
        "rate": rate,
        "seconds": duration.as_secs_f64(),
        "acked": acks.len(),
        "failed": AtomicU64::load(&failed, Ordering::Relaxed),
        "answer_p50_ms": answer_ms(0.50),
        "answer_p99_ms": answer_ms(0.99),
        "answer_p999_ms": answer_ms(0.999),
    });
    if !end_to_end {
        println!("{summary}");
        return Ok(());
    }
    let mut conn = AsyncPgConnection::establish(database_url).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let rows: Vec<Count> = diesel::sql_query(
            "SELECT count(*) AS n FROM inbox_finished JOIN inbox_events USING (id) \
             WHERE status = 2 AND event_id LIKE $1 || '-%'",
        )
        .bind::<Text, _>(&target.run_id)
        .load(&mut conn)
        .await?;
        if rows.iter().map(|r| r.n).sum::<i64>() >= acks.len() as i64 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let processed: Vec<Processed> = diesel::sql_query(
        "SELECT event_id, extract(epoch FROM processed_at)::float8 AS processed_at \
         FROM inbox_finished JOIN inbox_events USING (id) \
         WHERE status = 2 AND event_id LIKE $1 || '-%'",
    )
    .bind::<Text, _>(&target.run_id)
    .load(&mut conn)
    .await?;
    let processed: std::collections::HashMap<String, f64> = processed
        .into_iter()
        .map(|p| (p.event_id, p.processed_at))
        .collect();
    let mut histogram = Histogram::<u64>::new(3)?;
    let mut negative = 0u64;
    for (event_id, acked_at) in &acks {
        if let Some(done) = processed.get(event_id) {
            let micros = (done - acked_at) * 1e6;
            if micros < 0.0 {
                // The handler committed before the client read the answer.
                negative += 1;
            }
            histogram.record(micros.max(0.0) as u64)?;
        }
    }
    let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    if let Some(fields) = summary.as_object_mut() {
        fields.extend([
            ("processed".to_owned(), histogram.len().into()),
            ("committed_before_ack_seen".to_owned(), negative.into()),
            ("p50_ms".to_owned(), ms(0.50).into()),
            ("p99_ms".to_owned(), ms(0.99).into()),
            (
                "max_ms".to_owned(),
                (histogram.max() as f64 / 1000.0).into(),
            ),
        ]);
    }
    println!("{summary}");
    Ok(())
}

async fn prefill(database_url: &str, events: i64, event_type: &str) -> anyhow::Result<()> {
    let mut conn = AsyncPgConnection::establish(database_url).await?;
    let started = Instant::now();
    // In chunks, so no single statement holds everything in memory.
    let chunk = 50_000;
    let mut from = 0;
    while from < events {
        let to = (from + chunk).min(events);
        diesel::sql_query(
            "WITH keyed AS ( \
                 INSERT INTO inbox_dedup (provider, event_id, body_sha256) \
                 SELECT 'bench', 'prefill-' || g, sha256(convert_to(g::text, 'UTF8')) \
                 FROM generate_series($1::bigint, $2::bigint - 1) AS g \
                 RETURNING id, event_id, body_sha256 \
             ), journaled AS ( \
                 INSERT INTO inbox_events (id, provider, event_id, event_type, headers, body, body_sha256) \
                 SELECT id, 'bench', event_id, $3, '{\"content-type\":\"application/json\"}'::jsonb, \
                        convert_to('{\"id\":\"' || event_id || '\",\"padding\":\"' || repeat('x', 990) || '\"}', 'UTF8'), \
                        body_sha256 \
                 FROM keyed \
             ) \
             INSERT INTO inbox_queue (id) SELECT id FROM keyed",
        )
        .bind::<BigInt, _>(from)
        .bind::<BigInt, _>(to)
        .bind::<Text, _>(event_type)
        .execute(&mut conn)
        .await?;
        from = to;
    }
    // One statement per call: several would form a transaction block, which VACUUM refuses.
    for table in ["inbox_dedup", "inbox_events", "inbox_queue"] {
        conn.batch_execute(&format!("VACUUM ANALYZE {table}"))
            .await?;
    }
    println!(
        "{}",
        serde_json::json!({"prefilled": events, "seconds": started.elapsed().as_secs_f64()})
    );
    Ok(())
}

async fn wait_drained(database_url: &str, events: i64, timeout: Duration) -> anyhow::Result<()> {
    let mut conn = AsyncPgConnection::establish(database_url).await?;
    let seconds = drained::wait_empty(&mut conn, Duration::from_millis(20), timeout)
        .await?
        .with_context(|| format!("backlog not drained within {timeout:?}"))?
        .as_secs_f64();
    println!(
        "{}",
        serde_json::json!({"events": events, "seconds": seconds, "per_second": events as f64 / seconds})
    );
    Ok(())
}

/// Serves HTTP/1.1 keep-alive connections, answering each request `200` with an empty body
/// after `delay`. Only what a forwarding worker sends is understood: a `Content-Length` body.
async fn sink(listen: std::net::SocketAddr, delay: Duration) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            // A connection that breaks is the client's business.
            let _ = sink_connection(stream, delay).await;
        });
    }
}

async fn sink_connection(mut stream: tokio::net::TcpStream, delay: Duration) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer: Vec<u8> = Vec::with_capacity(8192);
    let mut chunk = [0u8; 8192];
    loop {
        // Until the end of the request's headers, then its body.
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let read = stream.read(&mut chunk).await?;
            if read == 0 {
                return Ok(());
            }
            buffer.extend_from_slice(&chunk[..read]);
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            let read = stream.read(&mut chunk).await?;
            anyhow::ensure!(read > 0, "connection closed inside a request body");
            buffer.extend_from_slice(&chunk[..read]);
        }
        buffer.drain(..head_end + length);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await?;
    }
}

//! Start-up: the `serve` flags, and the two HTTP servers (webhooks, metrics) they describe.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::Duration;

use actix_http::error::DispatchError;
use actix_http::{Extensions, HttpService};
use actix_service::{fn_service, map_config, ServiceFactoryExt as _};
use actix_web::dev::{AppConfig, ServerHandle};
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use clap::builder::TypedValueParser as _;
use inbox_core::db::DatabaseArgs;
use inbox_core::durations::{self, DurationFlag};
use tokio::net::TcpStream;

use crate::budget::BodyBudget;
use crate::head_guard::{self, ConnectionGuard, GuardedConnection};
use crate::http::{self, AppState, Limits};
use crate::ingest::{IngestMode, IngestSettings, Ingestor, DEFAULT_MAX_BATCH, DEFAULT_WRITERS};
use crate::metrics::Metrics;
use crate::providers::Providers;
use crate::rejections::{RejectionLog, RejectionSettings};
use inbox_core::request_span::RequestSpan;

/// Default body size limit: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// Default budget of body bytes in flight: 64 MiB, for the 512 MiB a receiver pod is given.
pub const DEFAULT_MAX_BODY_BYTES_IN_FLIGHT: usize = 64 * 1024 * 1024;
/// Default connection limit, over every HTTP worker.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default largest group-commit statement in body bytes: 2 MiB. Each pooled database
/// connection keeps buffers as large as the largest statement it has sent, for as long as it
/// lives: at 8 MiB, a burst of large bodies left about 100 MiB held by the pool.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 2 * 1024 * 1024;
/// Default request head limit: 16 KiB, several times what any provider's headers take.
pub const DEFAULT_MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a connection being closed may take to acknowledge it, as `HttpServer` allows.
const CLIENT_DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Flags of `receiver serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address the webhook endpoints listen on.
    #[arg(long, env = "RECEIVER_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Address of the Prometheus endpoint (GET /metrics), kept off the public listener.
    #[arg(long, env = "RECEIVER_METRICS_LISTEN", default_value = "0.0.0.0:9091")]
    pub metrics_listen: SocketAddr,
    /// Provider file (TOML): the providers accepted at POST /webhooks/{name}, their signature
    /// schemes and where their secrets are read from. See config/providers.example.toml.
    #[arg(long, env = "INBOX_CONFIG")]
    pub config: PathBuf,
    /// How events are written: group-commit shares one insert transaction among concurrent
    /// requests; per-request commits each request on its own.
    #[arg(long, env = "RECEIVER_INGEST_MODE", value_enum, default_value_t = IngestMode::GroupCommit)]
    pub ingest_mode: IngestMode,
    /// Largest number of events written by one group-commit statement.
    #[arg(long, env = "RECEIVER_MAX_BATCH", default_value_t = DEFAULT_MAX_BATCH, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    pub max_batch: usize,
    /// Concurrent group-commit writers (each holds one database connection while writing).
    /// With one, the requests arriving while a batch is written gather into the next; more
    /// write smaller batches side by side, which helps only when commits are slow (remote
    /// storage) and the database has cores to spare.
    #[arg(long, env = "RECEIVER_COMMIT_WRITERS", default_value_t = DEFAULT_WRITERS, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    pub commit_writers: usize,
    /// Shortest time between two notifications that wake the workers (LISTEN/NOTIFY, one
    /// small commit each). The first after a quiet spell goes at once; under a steady flow
    /// the events committed meanwhile share the next one. 0s notifies after every commit.
    #[arg(long, env = "RECEIVER_NOTIFY_SPACING", value_parser = humantime::parse_duration, default_value = "2ms")]
    pub notify_spacing: Duration,
    /// Longest a request waits for its events to be committed, counted once from its arrival
    /// (its head received, before its body is read): receiving and verifying its body,
    /// waiting for a writer, for a connection and for the statement all come out of it. Past
    /// it the answer is 503 and the provider retries; a statement every one of whose requests
    /// gave up is cancelled on the server.
    #[arg(long, env = "RECEIVER_DB_DEADLINE", value_parser = humantime::parse_duration, default_value = "3s")]
    pub db_deadline: Duration,
    /// Largest request body accepted; larger ones are answered 413.
    #[arg(long, env = "RECEIVER_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Body bytes that requests in flight may hold together (reserved as bodies arrive, so a
    /// declared length costs nothing until its bytes come); a request whose next bytes would
    /// exceed it is answered 503 with Retry-After, the rest of its body unread. Bodies over
    /// 64 KiB may use only three quarters of it, which must hold --max-body-bytes.
    #[arg(long, env = "RECEIVER_MAX_BODY_BYTES_IN_FLIGHT", default_value_t = DEFAULT_MAX_BODY_BYTES_IN_FLIGHT)]
    pub max_body_bytes_in_flight: usize,
    /// Open connections accepted at once, over every HTTP worker; past it new connections
    /// wait in the listen backlog.
    #[arg(long, env = "RECEIVER_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Largest group-commit statement in body bytes; a larger batch is written as several.
    #[arg(long, env = "RECEIVER_MAX_BATCH_BYTES", default_value_t = DEFAULT_MAX_BATCH_BYTES)]
    pub max_batch_bytes: usize,
    /// Largest request head (request line and headers) accepted; larger ones are answered 431.
    #[arg(long, env = "RECEIVER_MAX_HEAD_BYTES", default_value_t = DEFAULT_MAX_HEAD_BYTES)]
    pub max_head_bytes: usize,
    /// Time allowed for a connection's first request head (request line and headers) to
    /// arrive; a slower one is answered 408. 0 allows any time.
    #[arg(long, env = "RECEIVER_HEAD_TIMEOUT", value_parser = humantime::parse_duration, default_value = "5s")]
    pub head_timeout: Duration,
    /// Time allowed for a whole request body to arrive; slower clients are answered 408.
    #[arg(long, env = "RECEIVER_BODY_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub body_timeout: Duration,
    /// Seconds announced in Retry-After when answering 503.
    #[arg(long, env = "RECEIVER_RETRY_AFTER", default_value_t = 5)]
    pub retry_after_secs: u64,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, env = "RECEIVER_SHUTDOWN_TIMEOUT", value_parser = humantime::parse_duration, default_value = "30s")]
    pub shutdown_timeout: Duration,
    /// Refusals (4xx on a configured provider's path) recorded in inbox_rejections per
    /// provider per second at most; the rest are counted in
    /// inbox_receiver_rejections_unrecorded_total. 0 records none.
    #[arg(long, env = "RECEIVER_REJECTIONS_PER_SECOND", default_value_t = 10)]
    pub rejections_per_second: u32,
    /// Refusals older than this are deleted from inbox_rejections (checked every minute).
    #[arg(long, env = "RECEIVER_REJECTIONS_MAX_AGE", value_parser = humantime::parse_duration, default_value = "14days")]
    pub rejections_max_age: Duration,
    /// Rows kept in inbox_rejections at most: older ones beyond it are deleted.
    #[arg(long, env = "RECEIVER_REJECTIONS_MAX_ROWS", default_value_t = 100_000, value_parser = clap::value_parser!(i64).range(1..))]
    pub rejections_max_rows: i64,
    /// HTTP worker threads (default: one per CPU core).
    #[arg(long, env = "RECEIVER_HTTP_WORKERS")]
    pub http_workers: Option<usize>,
    /// Database connection settings.
    #[command(flatten)]
    pub db: DatabaseArgs,
}

/// A started receiver.
#[derive(Debug)]
pub struct RunningReceiver {
    /// Where the webhook endpoints listen.
    pub addr: SocketAddr,
    /// Where /metrics listens.
    pub metrics_addr: SocketAddr,
    /// Stops the webhook server.
    pub handle: ServerHandle,
    metrics_handle: ServerHandle,
    journal_days: tokio::task::JoinHandle<()>,
    rejection_writer: tokio::task::JoinHandle<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    metrics_server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RunningReceiver {
    /// Waits until the webhook server stops (SIGTERM/SIGINT, or [`ServerHandle::stop`]), then
    /// stops the metrics server.
    pub async fn wait(self) -> anyhow::Result<()> {
        let served = self.server.await.context("webhook server task failed")?;
        self.journal_days.abort();
        self.rejection_writer.abort();
        self.metrics_handle.stop(true).await;
        let _ = self.metrics_server.await;
        served.context("webhook server failed")
    }
}

/// Binds both listeners and starts serving. Must run inside a tokio runtime.
pub async fn start(args: &ServeArgs, providers: Providers) -> anyhow::Result<RunningReceiver> {
    check_body_limits(args.max_body_bytes, args.max_body_bytes_in_flight)?;
    check_durations(args)?;
    let metrics = Metrics::new();
    let pool = args.db.pool().context("reading the database settings")?;
    let connection = args
        .db
        .connection_settings()
        .context("reading the database settings")?;
    record_ordering_policies(&pool, &providers).await;
    // Receivers and workers both keep the journal's days ahead: ingest needs today's.
    let journal_days = tokio::spawn(inbox_core::journal::keep_days_ahead(pool.clone()));
    let ingestor = Ingestor::start(
        &IngestSettings {
            mode: args.ingest_mode,
            deadline: args.db_deadline,
            max_batch: args.max_batch,
            max_batch_bytes: args.max_batch_bytes,
            writers: args.commit_writers,
            notify_spacing: args.notify_spacing,
        },
        pool.clone(),
        Some(connection),
        metrics.clone(),
    );
    let (rejections, rejection_writer) = RejectionLog::start(
        RejectionSettings {
            per_second: args.rejections_per_second,
            max_age: args.rejections_max_age,
            max_rows: args.rejections_max_rows,
        },
        pool.clone(),
        metrics.clone(),
    );
    let state = web::Data::new(AppState {
        rejections,
        providers,
        ingestor,
        metrics: metrics.clone(),
        limits: Limits {
            max_body_bytes: args.max_body_bytes,
            max_head_bytes: args.max_head_bytes,
            body_timeout: args.body_timeout,
            retry_after_secs: args.retry_after_secs,
        },
        pool,
        readiness_timeout: args.db.db_connect_timeout,
        readiness: tokio::sync::Mutex::new(None),
        budget: BodyBudget::new(
            args.max_body_bytes_in_flight,
            metrics.body_bytes_in_flight.clone(),
        ),
    });

    let listener = TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let metrics_listener = TcpListener::bind(args.metrics_listen)
        .with_context(|| format!("cannot listen on {}", args.metrics_listen))?;
    let metrics_addr = metrics_listener.local_addr()?;

    let server = webhook_server(listener, addr, state, args)?;
    let handle = server.handle();

    let metrics_data = web::Data::new(metrics);
    let metrics_server = HttpServer::new(move || {
        App::new()
            .app_data(metrics_data.clone())
            .configure(http::configure_metrics)
    })
    .workers(1)
    .disable_signals()
    .listen(metrics_listener)?
    .run();
    let metrics_handle = metrics_server.handle();

    Ok(RunningReceiver {
        addr,
        metrics_addr,
        handle,
        metrics_handle,
        journal_days,
        rejection_writer,
        server: tokio::spawn(server),
        metrics_server: tokio::spawn(metrics_server),
    })
}

/// Refuses duration flags that would quietly refuse every request (a zero `--db-deadline`
/// answers every one 503 while `/readyz` says ready) or that are typing errors.
pub fn check_durations(args: &ServeArgs) -> anyhow::Result<()> {
    let mut flags = vec![
        DurationFlag::interval("--db-deadline", args.db_deadline),
        DurationFlag::interval("--body-timeout", args.body_timeout),
        DurationFlag::wait("--head-timeout", args.head_timeout),
        DurationFlag::wait("--notify-spacing", args.notify_spacing),
        DurationFlag::wait("--shutdown-timeout", args.shutdown_timeout),
        DurationFlag::period("--rejections-max-age", args.rejections_max_age),
    ];
    flags.extend(args.db.duration_flags());
    durations::check_all(&flags).map_err(anyhow::Error::msg)
}

/// Refuses a body limit the budget of bytes in flight could never take: bodies between the two
/// would be answered 503 on every retry, forever, instead of 413 once.
pub fn check_body_limits(max_body_bytes: usize, in_flight: usize) -> anyhow::Result<()> {
    let largest = BodyBudget::largest_body(in_flight);
    if max_body_bytes > largest {
        anyhow::bail!(
            "--max-body-bytes ({max_body_bytes}) is more than --max-body-bytes-in-flight \
             ({in_flight}) can ever hold for one body ({largest}: bodies over 64 KiB may use only \
             three quarters of it): raise --max-body-bytes-in-flight to at least {} or lower \
             --max-body-bytes",
            in_flight_for(max_body_bytes)
        );
    }
    Ok(())
}

/// The smallest budget whose largest body is `max_body_bytes`.
fn in_flight_for(max_body_bytes: usize) -> usize {
    if max_body_bytes <= crate::budget::SMALL_BODY_BYTES {
        return max_body_bytes;
    }
    // total - total / 4 >= max: from just below max * 4 / 3, up until it holds.
    let mut total = (max_body_bytes.saturating_mul(4) / 3).saturating_sub(2);
    while BodyBudget::largest_body(total) < max_body_bytes && total < usize::MAX {
        total += 1;
    }
    total
}

/// The webhook server: the app, served by actix-http over connections read through a
/// [`ConnectionGuard`] (rather than by `HttpServer`, which offers no way to wrap them).
fn webhook_server(
    listener: TcpListener,
    addr: SocketAddr,
    state: web::Data<AppState>,
    args: &ServeArgs,
) -> std::io::Result<actix_server::Server> {
    let workers = args.http_workers.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        |workers| workers.max(1),
    );
    let head_timeout = args.head_timeout;
    let mut builder = actix_server::Server::build();
    let shutting_down = builder.graceful_shutdown_signal();
    builder = builder
        .workers(workers)
        .max_concurrent_connections(args.max_connections.div_ceil(workers).max(1))
        .shutdown_timeout(args.shutdown_timeout.as_secs().max(1));
    Ok(builder
        .listen("webhooks", listener, move || {
            let app = App::new()
                .app_data(state.clone())
                .configure(http::configure)
                .wrap_fn(http::limit_head)
                .wrap_fn(head_guard::answer_refused_head)
                // Registered before the logger, so it runs inside it and finds the request id
                // the logger put in the request's span.
                .wrap_fn(http::echo_request_id)
                // Its span records the target without query values (Meta's verify token).
                .wrap(tracing_actix_web::TracingLogger::<RequestSpan>::new())
                // Registered last, so it runs first: a request's deadline counts from here.
                .wrap_fn(http::note_arrival);
            let shutting_down = shutting_down.clone();
            let http = HttpService::build()
                // Kept-alive connections close once the server begins to stop.
                .graceful_shutdown_signal(move || {
                    let shutting_down = shutting_down.clone();
                    async move { shutting_down.notified().await }
                })
                // The guarded connection times the first head itself, to answer it with an id.
                .client_request_timeout(Duration::ZERO)
                .client_disconnect_timeout(CLIENT_DISCONNECT_TIMEOUT)
                // A client that closes its side has given up (providers do not half-close): its
                // request is dropped, so a batch whose clients all left has its statement
                // cancelled.
                .h1_allow_half_closed(false)
                .local_addr(addr)
                .on_connect_ext(
                    |connection: &GuardedConnection<TcpStream>, data: &mut Extensions| {
                        data.insert(connection.refused_head());
                    },
                )
                // `AppConfig`'s own constructor is private: the default differs from
                // `HttpServer`'s in the host and local address it assumes, which only an
                // HTTP/1.0 request without `Host` would see (HTTP/1.1 requires one).
                .h1(map_config(app, |()| AppConfig::default()));
            let guard = ConnectionGuard::new(head_timeout);
            fn_service(move |stream: TcpStream| {
                let peer = stream.peer_addr().ok();
                let guarded = guard.guard(stream);
                std::future::ready(Ok::<_, DispatchError>((guarded, peer)))
            })
            .and_then(http)
        })?
        .run())
}

/// Writes the ordered providers' policies for the workers. A receiver that cannot reach the
/// database yet still starts (it answers 503 until it can); the policies stay as the last
/// receiver wrote them, or the defaults.
async fn record_ordering_policies(pool: &inbox_core::db::PgPool, providers: &Providers) {
    let result = async {
        let mut conn = pool.get().await.map_err(|err| err.to_string())?;
        crate::ordering::record_policies(&mut conn, providers)
            .await
            .map_err(|err| err.to_string())
    }
    .await;
    if let Err(err) = result {
        tracing::warn!(error = %err, "recording the ordered providers' policies failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_limit_the_budget_can_never_hold_refuses_to_start_naming_both_flags() {
        assert!(
            check_body_limits(DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_BODY_BYTES_IN_FLIGHT).is_ok()
        );
        assert!(check_body_limits(3 * 1024 * 1024, 4 * 1024 * 1024).is_ok());
        let err = check_body_limits(3 * 1024 * 1024 + 1, 4 * 1024 * 1024)
            .expect_err("over three quarters");
        let message = err.to_string();
        assert!(message.contains("--max-body-bytes (3145729)"), "{message}");
        assert!(
            message.contains("--max-body-bytes-in-flight (4194304)"),
            "{message}"
        );
        assert!(message.contains("at least 4194305"), "{message}");
        assert!(
            check_body_limits(64 * 1024, 64 * 1024).is_ok(),
            "a small body may use all"
        );
        assert!(check_body_limits(64 * 1024 + 1, 80 * 1024).is_err());
    }

    /// `receiver serve`'s flags as the command line would give them.
    fn serve_args(flags: &[&str]) -> ServeArgs {
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let fixed = [
            "receiver",
            "--config",
            "p.toml",
            "--database-url",
            "postgres://db",
        ];
        <Command as clap::Parser>::try_parse_from(fixed.iter().chain(flags))
            .expect("flags")
            .serve
    }

    #[test]
    fn a_zero_deadline_or_timeout_refuses_to_start_naming_the_flags() {
        assert!(check_durations(&serve_args(&[])).is_ok());
        assert!(check_durations(&serve_args(&[
            "--head-timeout",
            "0s",
            "--notify-spacing",
            "0s"
        ]))
        .is_ok());
        let err = check_durations(&serve_args(&[
            "--db-deadline",
            "0s",
            "--body-timeout",
            "0s",
            "--db-connect-timeout",
            "0s",
        ]))
        .expect_err("zero durations");
        let message = err.to_string();
        for flag in [
            "--db-deadline 0s",
            "--body-timeout 0s",
            "--db-connect-timeout 0s",
        ] {
            assert!(message.contains(flag), "{message}");
        }
    }

    #[test]
    fn the_budget_suggested_holds_the_body_limit() {
        for max in [
            1000,
            64 * 1024,
            64 * 1024 + 1,
            100_000,
            1024 * 1024,
            3_000_001,
        ] {
            let total = in_flight_for(max);
            assert!(BodyBudget::largest_body(total) >= max, "{max} in {total}");
            assert!(
                BodyBudget::largest_body(total - 1) < max,
                "{max} in {}",
                total - 1
            );
        }
    }
}

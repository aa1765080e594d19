//! `worker`: processes the inbox's events exactly once, and the operator's commands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::Context;
use clap::{Parser, Subcommand};
use inbox_core::db::DatabaseArgs;
use inbox_core::telemetry::LogArgs;
use inbox_core::BackoffPolicy;
use tokio::sync::watch;
use worker::demo::DemoLedger;
use worker::limits::DatabaseLimits;
use worker::metrics::Metrics;
use worker::runner::Retention;
use worker::{Router, Worker, WorkerSettings};

mod escape;
mod operator;

/// Default dedup window: the longest provider redelivery window (Stripe, GitHub: 3 days).
const DEFAULT_DEDUP_WINDOW: &str = "3days";

/// Processes webhook events from the PostgreSQL inbox.
///
/// `worker run` claims due events under a lease, runs their handlers in the transaction that
/// completes them (one business effect per event), retries failures with exponential backoff
/// and full jitter, dead-letters events after their last attempt, and returns the events of
/// crashed workers to the queue when their lease expires. Run as many replicas as the
/// backlog needs; they coordinate only through the database.
///
/// The other subcommands are for operators: see the backlog, look at events, replay dead
/// letters, purge old done events.
#[derive(Debug, Parser)]
#[command(version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: LogArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Process events until SIGTERM or SIGINT.
    Run(Box<RunArgs>),
    /// Apply pending database migrations, then exit.
    Migrate(inbox_core::db::MigrateArgs),
    /// Operator commands (stats, list, show, replay, rejections, purge).
    #[command(flatten)]
    Operator(operator::OperatorCommand),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Routes file (TOML): which handler runs for which provider and event type, e.g. an HTTP
    /// forward to an internal service. Events no route matches are completed as ignored.
    #[arg(long, env = "WORKER_ROUTES")]
    routes: Option<PathBuf>,
    /// Route every event to the demo handler (demo_ledger and demo_payments), after the routes
    /// of --routes if both are given.
    #[arg(long, env = "WORKER_DEMO_HANDLER")]
    demo_handler: bool,
    /// Address of the Prometheus endpoint (GET /metrics).
    #[arg(long, env = "WORKER_METRICS_LISTEN", default_value = "0.0.0.0:9092")]
    metrics_listen: SocketAddr,
    /// Attempts in flight at once, each one transaction and database connection: events of
    /// handlers that wait on the network (forward), or, when every route is database-only
    /// (demo, no routes), transactions of up to --transaction-size events each.
    #[arg(long, env = "WORKER_CONCURRENCY", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// Most events claimed by one statement.
    #[arg(long, env = "WORKER_BATCH_SIZE", default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..))]
    batch_size: u16,
    /// Claim loops sharing the concurrency: while one waits for its claim, the others' events
    /// keep running.
    #[arg(long, env = "WORKER_CLAIMERS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    claimers: u16,
    /// Most events sharing one transaction, for handlers that work in the database alone
    /// (the demo handler, unrouted events); others get a transaction per event. When one of
    /// its events fails, the transaction runs again with a savepoint per event, so the failure
    /// undoes only its own writes. At most 64: PostgreSQL tracks up to 64 subtransactions per
    /// transaction cheaply, and each savepoint that writes is one.
    #[arg(long, env = "WORKER_TRANSACTION_SIZE", default_value_t = 25, value_parser = clap::value_parser!(u16).range(1..=64))]
    transaction_size: u16,
    /// How long a claim stays valid without a heartbeat; a crashed worker's events return to
    /// the queue after this. The lease keeper extends it every third of its length.
    #[arg(long, env = "WORKER_LEASE", value_parser = humantime::parse_duration, default_value = "30s")]
    lease: Duration,
    /// Fallback wait between claims when nothing is due and no notification arrives (new
    /// events wake the worker at once through LISTEN/NOTIFY).
    #[arg(long, env = "WORKER_POLL_INTERVAL", value_parser = humantime::parse_duration, default_value = "5s")]
    poll_interval: Duration,
    /// Shortest time from a claim that took every due event to the next claim: under a
    /// steady flow, the events arriving meanwhile share one claim, which costs the database
    /// little more than a claim of one. A backlog is claimed in full batches without waiting;
    /// at a trickle the spacing has passed before the next event arrives. 0s claims at every
    /// arrival.
    #[arg(long, env = "WORKER_CLAIM_SPACING", value_parser = humantime::parse_duration, default_value = "2ms")]
    claim_spacing: Duration,
    /// How often expired leases are looked for.
    #[arg(long, env = "WORKER_RESCUE_INTERVAL", value_parser = humantime::parse_duration, default_value = "5s")]
    rescue_interval: Duration,
    /// How often the backlog gauges are read from the database.
    #[arg(long, env = "WORKER_STATS_INTERVAL", value_parser = humantime::parse_duration, default_value = "5s")]
    stats_interval: Duration,
    /// Longest a handler may run; a slower attempt counts as failed and is retried.
    #[arg(long, env = "WORKER_HANDLER_TIMEOUT", value_parser = humantime::parse_duration, default_value = "60s")]
    handler_timeout: Duration,
    /// Longest one statement of an attempt's transaction may run (statement_timeout, set per
    /// transaction; a route may set its own). Default: half the lease.
    #[arg(long, env = "WORKER_STATEMENT_TIMEOUT", value_parser = humantime::parse_duration)]
    statement_timeout: Option<Duration>,
    /// Longest one statement of an attempt may wait for a lock (lock_timeout, set per
    /// transaction; a route may set its own): a handler blocked on a row lock fails and its
    /// event is retried. Default: a sixth of the lease.
    #[arg(long, env = "WORKER_LOCK_TIMEOUT", value_parser = humantime::parse_duration)]
    lock_timeout: Option<Duration>,
    /// On SIGTERM: how long handlers in flight may take to finish. Set the orchestrator's
    /// termination grace period above this.
    #[arg(long, env = "WORKER_SHUTDOWN_GRACE", value_parser = humantime::parse_duration, default_value = "30s")]
    shutdown_grace: Duration,
    /// Delete done events older than this, and forget ordering keys idle this long,
    /// periodically (off when unset). Must be at least the dedup window.
    #[arg(long, env = "WORKER_RETENTION", value_parser = humantime::parse_duration)]
    retention: Option<Duration>,
    /// The providers' longest redelivery window: dedup keys are never purged younger than this.
    #[arg(long, env = "INBOX_DEDUP_WINDOW", value_parser = humantime::parse_duration, default_value = DEFAULT_DEDUP_WINDOW)]
    dedup_window: Duration,
    /// Name recorded on claimed rows (default: host name and process id).
    #[arg(long, env = "WORKER_NAME")]
    name: Option<String>,
    #[command(flatten)]
    backoff: BackoffPolicy,
    #[command(flatten)]
    db: DatabaseArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    cli.log.init();
    match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Migrate(args) => args.run().await.context("migrating the database"),
        Command::Operator(command) => command.run().await,
    }
}

fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "worker".to_owned());
    format!("{host}:{}", std::process::id())
}

/// Refuses duration flags that would quietly break the worker (see [`inbox_core::durations`]).
fn check_durations(args: &RunArgs) -> anyhow::Result<()> {
    use inbox_core::durations::{self, DurationFlag};
    let mut flags = vec![
        DurationFlag::lease("--lease", args.lease),
        DurationFlag::interval("--poll-interval", args.poll_interval),
        DurationFlag::short_wait("--claim-spacing", args.claim_spacing),
        DurationFlag::interval("--rescue-interval", args.rescue_interval),
        DurationFlag::interval("--stats-interval", args.stats_interval),
        DurationFlag::interval("--handler-timeout", args.handler_timeout),
        DurationFlag::wait("--shutdown-grace", args.shutdown_grace),
        DurationFlag::retry_delay("--retry-base", args.backoff.base),
        DurationFlag::retry_delay("--retry-cap", args.backoff.cap),
        DurationFlag::period("--dedup-window", args.dedup_window),
    ];
    flags.extend(args.db.duration_flags());
    if let Some(retention) = args.retention {
        flags.push(DurationFlag::period("--retention", retention));
    }
    if let Some(timeout) = args.statement_timeout {
        flags.push(DurationFlag::interval("--statement-timeout", timeout));
    }
    if let Some(timeout) = args.lock_timeout {
        flags.push(DurationFlag::interval("--lock-timeout", timeout));
    }
    durations::check_all(&flags).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        args.backoff.cap >= args.backoff.base,
        "--retry-cap {} is below --retry-base {}",
        humantime::format_duration(args.backoff.cap),
        humantime::format_duration(args.backoff.base)
    );
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    check_durations(&args)?;
    if let Some(retention) = args.retention {
        anyhow::ensure!(
            retention >= args.dedup_window,
            "--retention {} is shorter than the dedup window {}: redeliveries of purged events would be processed again",
            humantime::format_duration(retention),
            humantime::format_duration(args.dedup_window)
        );
    }
    let mut router = match &args.routes {
        Some(path) => worker::routes::load_routes(path)?,
        None => Router::new(),
    };
    if args.demo_handler {
        router = router.route(None, None, Arc::new(DemoLedger));
    }
    if args.routes.is_none() && !args.demo_handler {
        tracing::warn!("no routes configured (--routes or --demo-handler): every event will be completed as ignored");
    }
    let metrics = Metrics::new();
    let settings = WorkerSettings {
        name: args.name.unwrap_or_else(default_name),
        lease: args.lease,
        concurrency: usize::from(args.concurrency),
        batch_size: usize::from(args.batch_size),
        transaction_size: usize::from(args.transaction_size),
        claimers: usize::from(args.claimers),
        poll_interval: args.poll_interval,
        claim_spacing: args.claim_spacing,
        rescue_interval: args.rescue_interval,
        handler_timeout: args.handler_timeout,
        database_limits: DatabaseLimits {
            statement_timeout: args.statement_timeout,
            lock_timeout: args.lock_timeout,
        },
        backoff: args.backoff,
        shutdown_grace: args.shutdown_grace,
        heartbeat: true,
        stats_interval: args.stats_interval,
        retention: args.retention.map(|keep_done_for| Retention {
            keep_done_for,
            dedup_window: args.dedup_window,
            every: Duration::from_secs(15 * 60),
        }),
    };
    // Every attempt in flight may hold a connection (a transaction each for database
    // handlers, a completion for forwards), plus housekeeping and the journal's days; the
    // lease keeper and each claim loop have a connection of their own.
    let mut db = args.db.clone();
    let needed = u32::from(args.concurrency) + 2;
    if db.db_pool_size < needed {
        tracing::info!(
            configured = db.db_pool_size,
            using = needed,
            "database pool sized to the concurrency"
        );
        db.db_pool_size = needed;
    }
    let worker = Worker::new(&db, router, settings, metrics.clone())
        .context("reading the database settings")?;

    let metrics_data = web::Data::new(metrics);
    let metrics_server = HttpServer::new(move || {
        App::new().app_data(metrics_data.clone()).route(
            "/metrics",
            web::get().to(|metrics: web::Data<Metrics>| async move {
                HttpResponse::Ok()
                    .content_type(inbox_core::metrics::CONTENT_TYPE)
                    .body(metrics.render())
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .bind(args.metrics_listen)
    .with_context(|| format!("cannot listen on {}", args.metrics_listen))?
    .run();
    let metrics_handle = metrics_server.handle();
    let metrics_task = tokio::spawn(metrics_server);

    let (stop, stopped) = watch::channel(false);
    let listener = tokio::spawn(worker::listener::listen_for_new_events(
        args.db
            .connection_settings()
            .context("reading the database settings")?,
        worker.waker(),
        stopped.clone(),
    ));
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested: no new claims; finishing events in flight");
        let _ = stop.send(true);
    });
    tracing::info!(metrics = %args.metrics_listen, "worker ready");
    worker.run(stopped).await;
    listener.abort();
    metrics_handle.stop(true).await;
    let _ = metrics_task.await;
    tracing::info!("worker stopped");
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

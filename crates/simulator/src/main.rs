//! `inbox-simulator`: a provider simulator for webhook-inbox.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::builder::TypedValueParser as _;
use clap::{Parser, Subcommand};
use inbox_core::BackoffPolicy;
use inbox_simulator::{Config, Mix, Progress, RetryPolicy, SendSettings, ROUTES};
use receiver::providers::{Providers, PROVIDER_FILE_HELP};

/// Sends signed webhooks to webhook-inbox receivers the way providers do, and records what
/// was acknowledged.
///
/// `send` reads the receiver's provider file (the same secrets, from the same environment
/// variables or files) and sends events for every configured provider with a seeded mix of
/// trouble: each event 2-5 times, some copies concurrently, all deliveries shuffled, some
/// copies held back until the end, forged copies (bad signature, stale timestamp), events of
/// types no route handles, and `demo.poison` events that the demo handler fails on purpose.
/// Every genuine delivery without a 2xx answer is retried with exponential backoff and full
/// jitter, within an attempt and a time budget, like a provider does.
///
/// The report (--report FILE, JSON) lists every event with its id, type, expected fate
/// (effect, ignored, dead, rejected) and whether it was acknowledged; the expected fates hold
/// for a worker running the routes that `inbox-simulator routes` prints.
///
/// Exit status: 0 when every genuine event was acknowledged and no forgery was, 1 otherwise.
#[derive(Debug, Parser)]
#[command(version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send a run of events to one or more receivers.
    #[command(after_help = PROVIDER_FILE_HELP)]
    Send(Box<SendArgs>),
    /// Print the worker routes file under which the report's expected fates hold.
    Routes,
}

#[derive(Debug, clap::Args)]
struct SendArgs {
    /// Receiver base URL (repeat for several receivers; deliveries go to each in turn).
    #[arg(
        long = "url",
        env = "SIMULATOR_URL",
        value_delimiter = ',',
        required = true
    )]
    urls: Vec<reqwest::Url>,
    /// The receiver's provider file; secrets are read from the environment or files it names.
    #[arg(long, env = "INBOX_CONFIG")]
    config: PathBuf,
    /// Send only for this provider (repeatable; default: every provider in the file).
    #[arg(long = "provider")]
    providers: Vec<String>,
    /// Number of events (each delivered several times).
    #[arg(long, env = "SIMULATOR_EVENTS", default_value_t = 1_000)]
    events: usize,
    /// Seed of the mix: the same seed draws the same events, types and order.
    #[arg(long, env = "SIMULATOR_SEED", default_value_t = 1)]
    seed: u64,
    /// Part of every event id, so that ids are unique per run (default: random).
    #[arg(long)]
    run_id: Option<String>,
    /// Most requests in flight.
    #[arg(long, env = "SIMULATOR_CONCURRENCY", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    concurrency: usize,
    /// Most new deliveries per second (retries not counted; default: as fast as answered).
    #[arg(long, env = "SIMULATOR_RATE")]
    rate: Option<f64>,
    /// Pause before the late copies are sent.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    late_delay: Duration,
    /// First retry delay ceiling; doubles after every failed attempt (full jitter).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "100ms")]
    retry_base: Duration,
    /// Largest retry delay.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    retry_cap: Duration,
    /// Attempts per delivery before giving up.
    #[arg(long, default_value_t = RetryPolicy::DEFAULT.backoff.max_attempts, value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: u32,
    /// No retry later than this after a delivery's first attempt.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    give_up_after: Duration,
    /// Longest wait for one answer.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    request_timeout: Duration,
    /// Write the report (JSON) here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Print a progress line this often on standard error (0: never).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    progress_every: Duration,
    #[command(flatten)]
    mix: Mix,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Routes => {
            print!("{ROUTES}");
            Ok(())
        }
        Command::Send(args) => send(*args).await,
    }
}

async fn send(args: SendArgs) -> anyhow::Result<()> {
    let providers = Providers::load(&args.config)?;
    let config = Config {
        events: args.events,
        seed: args.seed,
        run_id: args.run_id,
        only_providers: args.providers,
        mix: args.mix,
        send: SendSettings {
            targets: args.urls,
            concurrency: args.concurrency,
            rate: args.rate,
            late_delay: args.late_delay,
            retry: RetryPolicy {
                backoff: BackoffPolicy {
                    base: args.retry_base,
                    cap: args.retry_cap,
                    max_attempts: args.max_attempts,
                },
                give_up_after: args.give_up_after,
            },
            request_timeout: args.request_timeout,
        },
    };
    let progress = Arc::new(Progress::default());
    let reporter = (!args.progress_every.is_zero()).then(|| {
        let progress = Arc::clone(&progress);
        let every = args.progress_every;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                eprintln!(
                    "inbox-simulator: {} deliveries started, {} requests, {} events acked, {} retries waiting",
                    progress.started.load(Ordering::Relaxed),
                    progress.requests.load(Ordering::Relaxed),
                    progress.acked_events.load(Ordering::Relaxed),
                    progress.retrying.load(Ordering::Relaxed),
                );
            }
        })
    });
    let report = inbox_simulator::run_with_progress(Arc::new(providers), &config, progress).await?;
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&report).context("serializing the report")?;
        std::fs::write(path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    println!("{}", report.summary());
    let totals = &report.totals;
    anyhow::ensure!(
        totals.unacked_events == 0 && totals.forged_accepted == 0,
        "{} genuine event(s) never acknowledged, {} forged delivery(ies) accepted",
        totals.unacked_events,
        totals.forged_accepted
    );
    Ok(())
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

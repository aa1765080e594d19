//! `receiver`: verifies, deduplicates and durably stores provider webhooks.

use anyhow::Context;
use clap::{Parser, Subcommand};
use inbox_core::telemetry::LogArgs;
use receiver::providers::{Providers, PROVIDER_FILE_HELP};
use receiver::server::{self, ServeArgs};

/// jemalloc, with its background threads on: they return the pages a burst of large bodies
/// leaves free to the system even while the receiver idles after it, which the system
/// allocator did not (130 of a 137 MiB peak still resident 5 s after a burst, see
/// bench/history.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Receives provider webhooks into the PostgreSQL inbox.
///
/// Each request to POST /webhooks/{provider} is verified against the provider's signature
/// scheme and stored once per (provider, event id); the answer is 200 only after the row is
/// committed ({"status":"accepted"} or {"status":"duplicate"}), 503 with Retry-After when the
/// database cannot confirm the write in time. The worker processes what is stored.
///
/// Every flag can also be set through the environment variable shown next to it.
#[derive(Debug, Parser)]
#[command(
    version,
    propagate_version = true,
    after_help = "See `receiver serve --help` for the provider file format."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: LogArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the webhook endpoints (and /metrics on its own address).
    #[command(after_help = PROVIDER_FILE_HELP)]
    Serve(Box<ServeArgs>),
    /// Apply pending database migrations, then exit.
    Migrate(inbox_core::db::MigrateArgs),
    /// Print the headers a provider would send for a body, signed with its first secret
    /// (one `Name: value` line each), to test a deployment by hand. Schemes that sign inside
    /// the body (adyen, mailgun, linear) print the body to send after a blank line.
    Sign {
        /// Provider file.
        #[arg(long, env = "INBOX_CONFIG")]
        config: std::path::PathBuf,
        /// Provider name in the file.
        #[arg(long)]
        provider: String,
        /// The exact body to sign.
        #[arg(long)]
        body: String,
        /// Message id, for schemes that sign one (standard-webhooks, twitch).
        #[arg(long, default_value = "msg_manual")]
        id: String,
        /// The URL the request goes to, for schemes that sign it (twilio, square, hubspot);
        /// defaults to the provider's public_url.
        #[arg(long)]
        url: Option<String>,
        /// Unix time to sign with (default: now).
        #[arg(long)]
        timestamp: Option<i64>,
    },
    /// Check the provider file (and that every secret it names can be read), then exit.
    #[command(after_help = PROVIDER_FILE_HELP)]
    CheckConfig {
        /// Provider file to check.
        #[arg(long, env = "INBOX_CONFIG")]
        config: std::path::PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    cli.log.init();
    match cli.command {
        Command::Serve(args) => serve(*args).await,
        Command::Migrate(args) => args.run().await.context("migrating the database"),
        Command::Sign {
            config,
            provider,
            body,
            id,
            url,
            timestamp,
        } => sign(&config, &provider, &body, &id, url, timestamp),
        Command::CheckConfig { config } => {
            let providers = Providers::load(&config)?;
            for provider in providers.iter() {
                println!(
                    "{}: {} secret(s){}{}",
                    provider.name,
                    provider.keys.len(),
                    if provider.unsigned { ", UNSIGNED" } else { "" },
                    if provider.suppress_replays {
                        ", replays suppressed"
                    } else {
                        ""
                    }
                );
            }
            for (name, tolerance) in providers.wide_tolerances() {
                println!(
                    "warning: provider {name} accepts timestamps {} away: a captured delivery \
                     verifies that long; keep `tolerance` within a day",
                    humantime::format_duration(tolerance)
                );
            }
            for name in providers.signing_urls_without_public_url() {
                println!(
                    "warning: provider {name} signs the URL it calls, and has no public_url: the \
                     URL is rebuilt from the request's Host, which the sender chooses, so a \
                     delivery captured on another host of the same account verifies here too; \
                     set public_url"
                );
            }
            for (first, second) in providers.sharing_a_key() {
                println!(
                    "warning: providers {first} and {second} share a secret: deliveries to one \
                     verify on the other's path too; give each provider its own"
                );
            }
            Ok(())
        }
    }
}

fn sign(
    config: &std::path::Path,
    provider: &str,
    body: &str,
    id: &str,
    url: Option<String>,
    timestamp: Option<i64>,
) -> anyhow::Result<()> {
    let providers = Providers::load(config)?;
    let provider = providers
        .get(provider)
        .with_context(|| format!("no provider {provider:?} in {}", config.display()))?;
    let key = provider
        .keys
        .first()
        .with_context(|| format!("provider {:?} has no secret to sign with", provider.name))?;
    let timestamp = match timestamp {
        Some(timestamp) => timestamp,
        None => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .context("clock before 1970")?;
            i64::try_from(now.as_secs()).context("clock out of range")?
        }
    };
    let url = url
        .or_else(|| provider.public_url.clone())
        .unwrap_or_default();
    let message = inbox_signature::Outgoing {
        method: "POST",
        url: &url,
        body: body.as_bytes(),
        id,
        timestamp,
    };
    let signed = provider
        .scheme
        .sign(key, &message)
        .with_context(|| format!("signing for provider {:?}", provider.name))?;
    for (name, value) in &signed.headers {
        println!("{name}: {value}");
    }
    if signed.body != body.as_bytes() {
        println!();
        println!("{}", String::from_utf8_lossy(&signed.body));
    }
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let providers = Providers::load(&args.config)?;
    if providers.is_empty() {
        tracing::warn!(config = %args.config.display(), "no providers configured: every webhook will be answered 404");
    }
    for (first, second) in providers.sharing_a_key() {
        tracing::warn!(
            first,
            second,
            "two providers share a secret: deliveries to one verify on the other's path too"
        );
    }
    for (name, tolerance) in providers.wide_tolerances() {
        tracing::warn!(
            provider = name,
            tolerance = %humantime::format_duration(tolerance),
            "provider accepts timestamps over a day away: a captured delivery verifies that long"
        );
    }
    for provider in providers.signing_urls_without_public_url() {
        tracing::warn!(
            provider,
            "provider signs the URL it calls and has no public_url: the URL is rebuilt from the request's Host, which the sender chooses; set public_url"
        );
    }
    for provider in providers.iter().filter(|p| p.unsigned) {
        tracing::warn!(provider = %provider.name, "provider is UNSIGNED: requests are not verified (local development only)");
    }
    let running = server::start(&args, providers).await?;
    tracing::info!(
        listen = %running.addr,
        metrics = %running.metrics_addr,
        mode = ?args.ingest_mode,
        "receiver ready"
    );
    running.wait().await?;
    tracing::info!("receiver stopped");
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

//! `console`: the operator console of webhook-inbox.

use std::io::BufRead;

use anyhow::Context;
use clap::{Parser, Subcommand};
use console::server::{self, ServeArgs};
use inbox_core::telemetry::LogArgs;

/// The operator console: see, search and repair the inbox from a browser.
///
/// Viewers see the overview, the events (filtered by provider, type, state, time, id or body
/// content), the routes (paused routes, ordering keys blocked by a dead event), the refusals
/// (deliveries the receiver refused, replays it suppressed) and the audit. Operators also
/// replay dead events (one, or every one a filter selects, in the background, and abort such
/// a replay), pause or resume routes, skip a blocked key's dead head and release a suppressed
/// replay; every repair is audited. Every flag can also be set through the environment
/// variable shown next to it.
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
    /// Serve the console (and /metrics on its own address).
    Serve(Box<ServeArgs>),
    /// Read a password from standard input (one line) and print its argon2id hash, for the
    /// users list (`name:role:HASH`).
    HashPassword,
    /// Apply pending database migrations, then exit.
    Migrate(inbox_core::db::MigrateArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    cli.log.init();
    match cli.command {
        Command::Serve(args) => {
            let running = server::start(&args).await?;
            tracing::info!(addr = %running.addr, metrics = %running.metrics_addr, read_only = args.read_only, "console listening");
            running.wait().await
        }
        Command::HashPassword => {
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .context("reading the password from standard input")?;
            let password = line.trim_end_matches(['\r', '\n']);
            anyhow::ensure!(!password.is_empty(), "empty password");
            let hash = console::users::hash_password(password)
                .map_err(|err| anyhow::anyhow!("hashing failed: {err}"))?;
            println!("{hash}");
            Ok(())
        }
        Command::Migrate(args) => args.run().await.context("migrating the database"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

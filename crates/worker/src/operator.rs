//! The operator's subcommands: see the backlog, look at events, replay dead letters, purge.

use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use inbox_core::operations::{self, EventFilter};
use inbox_core::InboxStatus;

#[derive(Debug, clap::Args)]
pub struct Database {
    /// PostgreSQL connection URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
}

impl Database {
    async fn connect(&self) -> anyhow::Result<AsyncPgConnection> {
        AsyncPgConnection::establish(&self.database_url)
            .await
            .context("connecting to the database")
    }
}

/// Row selection shared by `list` and `replay`.
#[derive(Debug, clap::Args)]
pub struct Selection {
    /// Only this provider.
    #[arg(long)]
    provider: Option<String>,
    /// Only events received at or after this time (RFC 3339, e.g. 2026-12-01T00:00:00Z).
    #[arg(long)]
    since: Option<DateTime<Utc>>,
    /// Only events received before this time (RFC 3339).
    #[arg(long)]
    until: Option<DateTime<Utc>>,
}

#[derive(Debug, clap::Subcommand)]
pub enum OperatorCommand {
    /// The backlog: events per state, due now, oldest unprocessed age, most frequent errors.
    Stats {
        #[command(flatten)]
        db: Database,
    },
    /// List events, newest first.
    List {
        /// Only events in this state: ready, processing, done or dead.
        #[arg(long)]
        status: Option<InboxStatus>,
        #[command(flatten)]
        selection: Selection,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[command(flatten)]
        db: Database,
    },
    /// Show one event: its state, headers and body.
    Show {
        /// Provider name.
        provider: String,
        /// The provider's event id.
        event_id: String,
        #[command(flatten)]
        db: Database,
    },
    /// Put dead events back to ready with their attempts reset, by row id or by selection.
    Replay {
        /// Row ids to replay (see `list --status dead`).
        #[arg(long = "id", value_delimiter = ',')]
        ids: Vec<i64>,
        #[command(flatten)]
        selection: Selection,
        /// Replay every dead event the selection matches (required when no --id is given, so
        /// that an empty selection never replays everything by accident).
        #[arg(long)]
        all_matching: bool,
        /// Show what would be replayed without changing anything.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        db: Database,
    },
    /// Delete done events that finished more than --older-than ago (dead events are kept).
    Purge {
        /// Retention of done events, e.g. 7days. Must be at least the dedup window.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// The providers' longest redelivery window: nothing younger is ever purged.
        #[arg(long, env = "INBOX_DEDUP_WINDOW", value_parser = humantime::parse_duration, default_value = "3days")]
        dedup_window: Duration,
        /// Rows deleted per statement.
        #[arg(long, default_value_t = 1_000)]
        batch: i64,
        #[command(flatten)]
        db: Database,
    },
}

fn filter_of(selection: &Selection, status: Option<InboxStatus>, ids: Vec<i64>) -> EventFilter {
    EventFilter {
        ids,
        provider: selection.provider.clone(),
        status,
        received_since: selection.since,
        received_until: selection.until,
    }
}

impl OperatorCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            Self::Stats { db } => stats(&mut db.connect().await?).await,
            Self::List {
                status,
                selection,
                limit,
                db,
            } => {
                let mut conn = db.connect().await?;
                let rows =
                    operations::list(&mut conn, &filter_of(&selection, status, Vec::new()), limit)
                        .await?;
                println!(
                    "{:>10}  {:<10}  {:<12}  {:>7}  {:<25}  {:<30}  last_error",
                    "id", "status", "provider", "attempt", "received_at", "event_id"
                );
                for row in rows {
                    println!(
                        "{:>10}  {:<10}  {:<12}  {:>7}  {:<25}  {:<30}  {}",
                        row.id,
                        row.status,
                        row.provider,
                        row.attempt,
                        row.received_at
                            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        row.event_id,
                        row.last_error.as_deref().unwrap_or("")
                    );
                }
                Ok(())
            }
            Self::Show {
                provider,
                event_id,
                db,
            } => {
                let mut conn = db.connect().await?;
                let event = operations::show(&mut conn, &provider, &event_id)
                    .await?
                    .with_context(|| format!("no event {event_id:?} from provider {provider:?}"))?;
                let s = &event.summary;
                println!("id:              {}", s.id);
                println!("provider:        {}", s.provider);
                println!("event_id:        {}", s.event_id);
                println!(
                    "event_type:      {}",
                    s.event_type.as_deref().unwrap_or("-")
                );
                println!("status:          {}", s.status);
                println!("attempt:         {}", s.attempt);
                println!("received_at:     {}", s.received_at.to_rfc3339());
                println!("next_attempt_at: {}", s.next_attempt_at.to_rfc3339());
                println!(
                    "processed_at:    {}",
                    s.processed_at.map_or("-".into(), |t| t.to_rfc3339())
                );
                println!("locked_by:       {}", s.locked_by.as_deref().unwrap_or("-"));
                println!(
                    "locked_until:    {}",
                    event.locked_until.map_or("-".into(), |t| t.to_rfc3339())
                );
                println!(
                    "last_error:      {}",
                    s.last_error.as_deref().unwrap_or("-")
                );
                println!("headers:         {}", event.headers);
                println!("body ({} bytes):", event.body.len());
                println!("{}", String::from_utf8_lossy(&event.body));
                Ok(())
            }
            Self::Replay {
                ids,
                selection,
                all_matching,
                dry_run,
                db,
            } => {
                anyhow::ensure!(
                    !ids.is_empty() || all_matching,
                    "name the events to replay with --id, or pass --all-matching to replay every dead event the selection (--provider, --since, --until) matches"
                );
                let mut conn = db.connect().await?;
                let filter = filter_of(&selection, Some(InboxStatus::Dead), ids);
                let candidates = operations::replay_candidates(&mut conn, &filter).await?;
                if dry_run {
                    println!(
                        "would replay {} dead event(s): {:?}",
                        candidates.len(),
                        candidates
                    );
                    return Ok(());
                }
                let replayed = operations::replay(&mut conn, &candidates).await?;
                println!("replayed {replayed} dead event(s)");
                Ok(())
            }
            Self::Purge {
                older_than,
                dedup_window,
                batch,
                db,
            } => {
                let mut conn = db.connect().await?;
                let purged =
                    operations::purge_done(&mut conn, older_than, dedup_window, batch.max(1))
                        .await?;
                println!(
                    "purged {} done event(s) and {} processed-event record(s)",
                    purged.events, purged.processed_records
                );
                Ok(())
            }
        }
    }
}

async fn stats(conn: &mut AsyncPgConnection) -> anyhow::Result<()> {
    let backlog = operations::backlog(conn).await?;
    let counts = operations::count_by_status(conn).await?;
    let count_of = |status| {
        counts
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
    };
    println!("ready:       {} ({} due now)", backlog.ready, backlog.due);
    println!("processing:  {}", backlog.processing);
    println!("done:        {}", count_of(InboxStatus::Done));
    println!("dead:        {}", backlog.dead);
    println!(
        "oldest unprocessed: {}",
        humantime::format_duration(Duration::from_secs(
            backlog.oldest_unprocessed_age_seconds.max(0.0) as u64
        ))
    );
    let errors = operations::top_errors(conn, 5).await?;
    if !errors.is_empty() {
        println!("top errors (ready and dead events):");
        for error in errors {
            println!("  {:>8}  {}", error.rows, error.error);
        }
    }
    Ok(())
}

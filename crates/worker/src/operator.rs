//! The operator's subcommands: see the backlog, look at events, replay dead letters, purge.

use std::io::{BufWriter, Write};
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use inbox_core::operations::{self, EventFilter};
use inbox_core::InboxStatus;

use crate::escape;

/// Dead events `worker replay` replays per statement (as the console's default).
const REPLAY_BATCH: usize = 500;

#[derive(Debug, clap::Args)]
pub struct Database {
    /// PostgreSQL connection URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
}

impl Database {
    /// No statement timeout (a replay or purge of many rows may take long), but an idle
    /// transaction of an interrupted command is ended by the server.
    async fn connect(&self) -> anyhow::Result<AsyncPgConnection> {
        let limits = inbox_core::db::SessionLimits {
            statement_timeout: None,
            idle_in_transaction_timeout: Some(Duration::from_secs(60)),
        };
        inbox_core::db::establish(
            &self.database_url,
            &inbox_core::db::default_application_name(),
            limits,
        )
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
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
        #[command(flatten)]
        db: Database,
    },
    /// Show one event: its state, headers and body. Control characters (which a webhook's
    /// sender chose) are shown as \u{..} escapes unless --raw is given.
    Show {
        /// Provider name.
        provider: String,
        /// The provider's event id.
        event_id: String,
        /// Print the fields and the body exactly as stored, control characters included (for
        /// piping the body into another program).
        #[arg(long)]
        raw: bool,
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
    /// Ordering keys blocked by their dead head (providers with on_dead = block), longest
    /// blocked first: the dead event, its error and the events waiting behind it.
    Keys {
        /// Only keys blocked by a dead head (the only listing there is; required, so that the
        /// command says what it shows).
        #[arg(long, required = true)]
        blocked: bool,
        /// At most this many.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
        #[command(flatten)]
        db: Database,
    },
    /// Release the key a dead head blocks: the event stays dead, the key's next event runs,
    /// and the reason is kept in inbox_key_skips. A replay may still run the event later, as a
    /// late arrival once a later event of its key is done (marked stale, or completed without
    /// its handler where the provider skips late arrivals).
    Skip {
        /// Row id of the dead head (see `keys --blocked`).
        id: i64,
        /// Why it is skipped (kept with the skip).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        db: Database,
    },
    /// Why deliveries were refused: the 4xx answers the receiver recorded in
    /// inbox_rejections, grouped by provider and cause (invalid_signature, stale_timestamp,
    /// invalid_body, body_too_large, missing_event_id, ...), most frequent first, with how
    /// many, the first and last seen, and the request id of the last one (the X-Request-Id
    /// the sender was answered, which the receiver's log lines carry too).
    ///
    /// The receiver records at most --rejections-per-second refusals per provider per second
    /// (the rest are counted in inbox_receiver_rejections_unrecorded_total, so counts here
    /// are a lower bound under a flood) and keeps them --rejections-max-age.
    Rejections {
        /// Only this provider.
        #[arg(long)]
        provider: Option<String>,
        /// Only refusals at or after this time (RFC 3339, e.g. 2026-12-01T00:00:00Z).
        #[arg(long)]
        since: Option<DateTime<Utc>>,
        #[command(flatten)]
        db: Database,
    },
    /// Replays suppressed at ingest, newest first: deliveries of a provider whose signature
    /// does not cover the event id (GitHub, Shopify, Linear, ...) that carried a body (Mailgun:
    /// a signed token) already stored under another id. Each was answered 200 and never
    /// handed to a handler; `release` runs one after all.
    Replays {
        /// Only this provider.
        #[arg(long)]
        provider: Option<String>,
        /// Only replays received at or after this time (RFC 3339, e.g. 2026-12-01T00:00:00Z).
        #[arg(long)]
        since: Option<DateTime<Utc>>,
        /// At most this many.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
        #[command(flatten)]
        db: Database,
    },
    /// Release suppressed replays (see `replays`): each is queued as if it had just arrived
    /// and runs like any event. For a provider that legitimately sends the same body under
    /// two ids; set `suppress_replays = false` for it in the provider file if it does so often.
    Release {
        /// Ids of the suppressed replays (the first column of `replays`).
        #[arg(long = "id", value_delimiter = ',', required = true)]
        ids: Vec<i64>,
        #[command(flatten)]
        db: Database,
    },
    /// Delete done events that finished more than --older-than ago (dead events are kept), and
    /// forget ordering keys idle that long (unblocked, nothing queued).
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

/// Whether an error is standard output closed by its reader (`worker list | head`): the
/// command's job is done then, not failed.
fn is_closed_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

impl OperatorCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        let mut out = BufWriter::new(std::io::stdout());
        let result = match self.run_to(&mut out).await {
            Ok(()) => out.flush().map_err(anyhow::Error::from),
            Err(err) => Err(err),
        };
        match result {
            Err(err) if is_closed_pipe(&err) => Ok(()),
            other => other,
        }
    }

    async fn run_to(self, out: &mut impl Write) -> anyhow::Result<()> {
        match self {
            Self::Stats { db } => stats(out, &mut db.connect().await?).await,
            Self::List {
                status,
                selection,
                limit,
                db,
            } => {
                let filter = filter_of(&selection, status, Vec::new());
                let rows = operations::list(&mut db.connect().await?, &filter, limit).await?;
                list(out, &rows)
            }
            Self::Show {
                provider,
                event_id,
                raw,
                db,
            } => {
                let mut conn = db.connect().await?;
                let event = operations::show(&mut conn, &provider, &event_id)
                    .await?
                    .with_context(|| {
                        format!(
                            "no event {:?} from provider {:?}",
                            escape::line(&event_id),
                            escape::line(&provider)
                        )
                    })?;
                show(out, &event, raw)?;
                let position = inbox_core::ordering::position(&mut conn, event.summary.id).await?;
                show_position(out, position.as_ref())
            }
            Self::Keys {
                blocked: _,
                limit,
                db,
            } => {
                let keys =
                    inbox_core::ordering::blocked_keys(&mut db.connect().await?, limit).await?;
                blocked_keys(out, &keys)
            }
            Self::Skip { id, reason, db } => {
                let key =
                    inbox_core::ordering::skip_dead_head(&mut db.connect().await?, id, &reason)
                        .await?;
                writeln!(
                    out,
                    "released key {} (event {id} stays dead)",
                    escape::line(&key)
                )?;
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
                    writeln!(
                        out,
                        "would replay {} dead event(s): {:?}",
                        candidates.len(),
                        candidates
                    )?;
                    return Ok(());
                }
                // A statement per batch, as the console's replay by filter: one statement for
                // a mass of dead events would hold their keys and the queue's vacuum for as
                // long as it takes.
                let mut replayed = 0;
                for batch in candidates.chunks(REPLAY_BATCH) {
                    replayed += operations::replay(&mut conn, batch).await?;
                }
                writeln!(out, "replayed {replayed} dead event(s)")?;
                let not_dead: Vec<i64> = filter
                    .ids
                    .iter()
                    .copied()
                    .filter(|id| !candidates.contains(id))
                    .collect();
                if !not_dead.is_empty() {
                    writeln!(
                        out,
                        "not dead (ready, processing, done, or no such event), left as they are: {not_dead:?}"
                    )?;
                }
                Ok(())
            }
            Self::Rejections {
                provider,
                since,
                db,
            } => {
                let groups = inbox_core::rejections::grouped(
                    &mut db.connect().await?,
                    provider.as_deref(),
                    since,
                )
                .await?;
                rejections(out, &groups)
            }
            Self::Replays {
                provider,
                since,
                limit,
                db,
            } => {
                let rows = inbox_core::replays::list(
                    &mut db.connect().await?,
                    provider.as_deref(),
                    since,
                    limit,
                )
                .await?;
                replays(out, &rows)
            }
            Self::Release { ids, db } => {
                let mut conn = db.connect().await?;
                let released = inbox_core::replays::release(&mut conn, &ids).await?;
                if !released.is_empty() {
                    inbox_core::inbox::notify_new_events(&mut conn).await?;
                }
                let missing: Vec<i64> = ids
                    .iter()
                    .copied()
                    .filter(|id| released.binary_search(id).is_err())
                    .collect();
                writeln!(out, "released {} suppressed replay(s)", released.len())?;
                if !missing.is_empty() {
                    writeln!(
                        out,
                        "not suppressed replays (released already, purged, or never one): {missing:?}"
                    )?;
                }
                Ok(())
            }
            Self::Purge {
                older_than,
                dedup_window,
                batch,
                db,
            } => {
                // Held to the bounds `worker run` holds them to.
                inbox_core::durations::check_all(&[
                    inbox_core::durations::DurationFlag::period("--older-than", older_than),
                    inbox_core::durations::DurationFlag::period("--dedup-window", dedup_window),
                ])
                .map_err(anyhow::Error::msg)?;
                let mut conn = db.connect().await?;
                let purged =
                    operations::purge_done(&mut conn, older_than, dedup_window, batch.max(1))
                        .await?;
                writeln!(
                    out,
                    "purged {} done event(s) ({} journal day(s) dropped), {} processed-event record(s) and {} suppressed replay(s); forgot {} idle ordering key(s)",
                    purged.events,
                    purged.days,
                    purged.processed_records,
                    purged.suppressed_replays,
                    purged.idle_keys
                )?;
                Ok(())
            }
        }
    }
}

fn list(out: &mut impl Write, rows: &[operations::EventSummary]) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:>10}  {:<10}  {:<12}  {:>7}  {:<25}  {:<30}  last_error",
        "id", "status", "provider", "attempt", "received_at", "event_id"
    )?;
    for row in rows {
        writeln!(
            out,
            "{:>10}  {:<10}  {:<12}  {:>7}  {:<25}  {:<30}  {}",
            row.id,
            row.status,
            escape::line(&row.provider),
            row.attempt,
            row.received_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            escape::line(&row.event_id),
            escape::line(row.last_error.as_deref().unwrap_or(""))
        )?;
    }
    Ok(())
}

fn rejections(
    out: &mut impl Write,
    groups: &[inbox_core::rejections::RejectionGroup],
) -> anyhow::Result<()> {
    if groups.is_empty() {
        writeln!(out, "no refusals recorded")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<16}  {:<20}  {:>6}  {:>8}  {:<20}  {:<20}  sample_request_id",
        "provider", "cause", "status", "count", "first_seen", "last_seen"
    )?;
    let time = |t: &DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    for group in groups {
        writeln!(
            out,
            "{:<16}  {:<20}  {:>6}  {:>8}  {:<20}  {:<20}  {}",
            escape::line(&group.provider),
            escape::line(&group.cause),
            group.status,
            group.count,
            time(&group.first_at),
            time(&group.last_at),
            escape::line(&group.sample_request_id)
        )?;
    }
    Ok(())
}

fn replays(
    out: &mut impl Write,
    rows: &[inbox_core::replays::SuppressedReplay],
) -> anyhow::Result<()> {
    if rows.is_empty() {
        writeln!(out, "no suppressed replays")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:>10}  {:<20}  {:<16}  {:<36}  {:<24}  {:>8}  original",
        "id", "received_at", "provider", "event_id", "event_type", "bytes"
    )?;
    for row in rows {
        let original = match &row.original_event_id {
            Some(event_id) => format!("{} ({})", row.original_id, escape::line(event_id)),
            None => format!("{} (purged)", row.original_id),
        };
        writeln!(
            out,
            "{:>10}  {:<20}  {:<16}  {:<36}  {:<24}  {:>8}  {original}",
            row.id,
            row.received_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            escape::line(&row.provider),
            escape::line(&row.event_id),
            escape::line(row.event_type.as_deref().unwrap_or("-")),
            row.body_bytes,
        )?;
    }
    Ok(())
}

fn show(out: &mut impl Write, event: &operations::EventDetail, raw: bool) -> anyhow::Result<()> {
    let text = |value: &str| -> String {
        if raw {
            value.to_owned()
        } else {
            escape::line(value).into_owned()
        }
    };
    let s = &event.summary;
    writeln!(out, "id:              {}", s.id)?;
    writeln!(out, "provider:        {}", text(&s.provider))?;
    writeln!(out, "event_id:        {}", text(&s.event_id))?;
    writeln!(
        out,
        "event_type:      {}",
        text(s.event_type.as_deref().unwrap_or("-"))
    )?;
    writeln!(out, "status:          {}", s.status)?;
    writeln!(out, "attempt:         {}", s.attempt)?;
    writeln!(out, "received_at:     {}", s.received_at.to_rfc3339())?;
    writeln!(out, "next_attempt_at: {}", s.next_attempt_at.to_rfc3339())?;
    let processed_at = s.processed_at.map_or("-".into(), |t| t.to_rfc3339());
    writeln!(out, "processed_at:    {processed_at}")?;
    writeln!(
        out,
        "locked_by:       {}",
        text(s.locked_by.as_deref().unwrap_or("-"))
    )?;
    let locked_until = event.locked_until.map_or("-".into(), |t| t.to_rfc3339());
    writeln!(out, "locked_until:    {locked_until}")?;
    writeln!(
        out,
        "last_error:      {}",
        text(s.last_error.as_deref().unwrap_or("-"))
    )?;
    writeln!(out, "headers:         {}", text(&event.headers.to_string()))?;
    writeln!(out, "body ({} bytes):", event.body.len())?;
    if raw {
        out.write_all(&event.body)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "{}",
            escape::block(&String::from_utf8_lossy(&event.body))
        )?;
    }
    Ok(())
}

/// The key lines of `show`, for events of ordered providers still queued or dead.
fn show_position(
    out: &mut impl Write,
    position: Option<&inbox_core::ordering::KeyPosition>,
) -> anyhow::Result<()> {
    let Some(position) = position else {
        return Ok(());
    };
    let state = match (position.holder, position.blocked_by) {
        (_, Some(dead)) => format!("blocked by dead event {dead}"),
        (Some(holder), None) => format!("event {holder} in processing"),
        (None, None) => "free".to_owned(),
    };
    let place = match position.ahead {
        Some(0) => "head of its key".to_owned(),
        Some(ahead) => format!("{ahead} event(s) of its key ahead"),
        None => "out of the queue (dead)".to_owned(),
    };
    writeln!(
        out,
        "ordering_key:    {}",
        escape::line(&position.ordering_key)
    )?;
    writeln!(out, "sequence:        {}", position.sequence)?;
    writeln!(out, "position:        {place}; {} queued", position.queued)?;
    writeln!(out, "key:             {state}")?;
    let processed = position
        .processed_sequence
        .map_or("-".to_owned(), |s| s.to_string());
    writeln!(out, "key processed up to sequence: {processed}")?;
    Ok(())
}

fn blocked_keys(
    out: &mut impl Write,
    keys: &[inbox_core::ordering::BlockedKey],
) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<40}  {:>10}  {:<30}  {:<25}  {:>7}  last_error",
        "key", "dead_id", "event_id", "blocked_since", "waiting"
    )?;
    for key in keys {
        writeln!(
            out,
            "{:<40}  {:>10}  {:<30}  {:<25}  {:>7}  {}",
            escape::line(&key.ordering_key),
            key.event_row_id,
            escape::line(key.event_id.as_deref().unwrap_or("-")),
            key.blocked_since
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            key.waiting,
            escape::line(key.last_error.as_deref().unwrap_or(""))
        )?;
    }
    Ok(())
}

async fn stats(out: &mut impl Write, conn: &mut AsyncPgConnection) -> anyhow::Result<()> {
    let backlog = operations::backlog(conn).await?;
    let counts = operations::count_by_status(conn).await?;
    let count_of = |status| {
        counts
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
    };
    writeln!(
        out,
        "ready:       {} ({} due now)",
        backlog.ready, backlog.due
    )?;
    writeln!(out, "processing:  {}", backlog.processing)?;
    writeln!(out, "done:        {}", count_of(InboxStatus::Done))?;
    writeln!(out, "dead:        {}", backlog.dead)?;
    writeln!(
        out,
        "oldest unprocessed: {}",
        humantime::format_duration(Duration::from_secs(
            backlog.oldest_unprocessed_age_seconds.max(0.0) as u64
        ))
    )?;
    let blocked = inbox_core::ordering::blocked_summary(conn).await?;
    if blocked.blocked_keys > 0 {
        writeln!(
            out,
            "blocked keys: {} (oldest blocked {}; see `worker keys --blocked`)",
            blocked.blocked_keys,
            humantime::format_duration(Duration::from_secs(
                blocked.oldest_blocked_age_seconds.max(0.0) as u64
            ))
        )?;
    }
    let errors = operations::top_errors(conn, 5).await?;
    if !errors.is_empty() {
        writeln!(out, "top errors (ready and dead events):")?;
        for error in errors {
            writeln!(out, "  {:>8}  {}", error.rows, escape::line(&error.error))?;
        }
    }
    Ok(())
}

//! The overview: counts per state and provider, the due backlog and its oldest age, arrivals
//! and completions per minute over the last hour, and dead letters of the last day.

use std::collections::BTreeMap;

use actix_web::{web, HttpResponse};
use inbox_core::operations::{self, overview};
use inbox_core::InboxStatus;
use maud::html;

use super::{charts, layout};
use crate::error::ConsoleError;
use crate::http::CurrentUser;
use crate::server::AppState;

/// GET /.
pub async fn page(
    user: CurrentUser,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ConsoleError> {
    let mut conn = state.connection().await?;
    let backlog = operations::backlog(&mut conn).await?;
    let totals = operations::count_by_status(&mut conn).await?;
    let per_provider = overview::provider_states(&mut conn).await?;
    let minutes = overview::last_hour(&mut conn).await?;
    let dead_last_day = overview::dead_last_day(&mut conn).await?;
    let top_errors = operations::top_errors(&mut conn, 5).await?;
    let day_ago = chrono::Utc::now() - chrono::Duration::hours(24);
    let refused_last_day = inbox_core::rejections::count_since(&mut conn, day_ago).await?;
    let suppressed = inbox_core::replays::count(&mut conn).await?;
    drop(conn);

    let total = |status: InboxStatus| {
        totals
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, rows)| *rows)
    };
    let mut providers: BTreeMap<&str, [i64; 3]> = BTreeMap::new();
    for row in &per_provider {
        let slot = match row.status {
            InboxStatus::Ready => 0,
            InboxStatus::Processing => 1,
            _ => 2,
        };
        providers.entry(row.provider.as_str()).or_default()[slot] += row.rows;
    }
    let accepted: Vec<i64> = minutes.iter().map(|m| m.accepted).collect();
    let processed: Vec<i64> = minutes.iter().map(|m| m.processed).collect();
    let content = html! {
        div.cards {
            div.card { div { "Due now" } div.figure id="due" { (backlog.due) } }
            div.card { div { "Oldest unprocessed" } div.figure { (format_age(backlog.oldest_unprocessed_age_seconds)) } }
            div.card { div { "Dead, last 24 h" } div.figure id="dead-24h" { (dead_last_day) } }
            div.card { div { a href="/refusals" { "Refused, last 24 h" } } div.figure id="refused-24h" { (refused_last_day) } }
            div.card { div { a href="/refusals" { "Suppressed replays" } } div.figure id="suppressed-replays" { (suppressed) } }
            @for status in InboxStatus::ALL {
                div.card { div { (status.as_str()) } div.figure.{ "state-" (status.as_str()) } { (total(status)) } }
            }
        }
        h2 { "Per provider" }
        table id="providers" {
            tr { th { "provider" } th { "ready" } th { "processing" } th { "dead" } }
            @for (provider, [ready, processing, dead]) in &providers {
                tr {
                    td { a href={ "/events?provider=" (encode(provider)) } { (provider) } }
                    td.num { (ready) } td.num { (processing) }
                    td.num { a href={ "/events?state=dead&provider=" (encode(provider)) } { (dead) } }
                }
            }
        }
        h2 { "Last hour, per minute" }
        (charts::bars("accepted", &accepted, "#0b5cad"))
        (charts::bars("processed", &processed, "#1c7c3a"))
        h2 { "Most frequent errors (ready and dead)" }
        table {
            tr { th { "events" } th { "error" } }
            @for error in &top_errors { tr { td.num { (error.rows) } td { (error.error) } } }
        }
    };
    Ok(layout::page("Overview", &user, &state, content))
}

fn encode(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// `3h 05m`, `4m 10s` or `12s`.
pub fn format_age(seconds: f64) -> String {
    let seconds = seconds.max(0.0) as u64;
    match seconds {
        0..=59 => format!("{seconds}s"),
        60..=3599 => format!("{}m {:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h {:02}m", seconds / 3600, seconds % 3600 / 60),
    }
}

//! What the receiver kept from the handlers: the deliveries it refused (`inbox_rejections`,
//! grouped by provider and cause) and the replays it suppressed, which an operator may
//! release.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use chrono::{Duration, Utc};
use diesel_async::AsyncConnection;
use inbox_core::operations::audit::{self, NewAction};
use inbox_core::{rejections, replays};
use maud::html;
use serde::Deserialize;

use super::layout;
use crate::error::ConsoleError;
use crate::http::CurrentUser;
use crate::server::AppState;

/// Suppressed replays listed.
const REPLAYS_SHOWN: i64 = 100;

/// The periods the refusals can be grouped over, in hours.
const PERIODS: [(i64, &str); 3] = [(1, "last hour"), (24, "last 24 h"), (168, "last 7 days")];

/// The page's query.
#[derive(Debug, Deserialize)]
pub struct RefusalsQuery {
    /// Refusals of the last this many hours (one of [`PERIODS`]; 24 otherwise).
    hours: Option<i64>,
}

/// GET /refusals.
pub async fn page(
    user: CurrentUser,
    state: web::Data<AppState>,
    query: web::Query<RefusalsQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let hours = query
        .hours
        .filter(|hours| PERIODS.iter().any(|(period, _)| period == hours))
        .unwrap_or(24);
    let since = Utc::now() - Duration::hours(hours);
    let mut conn = state.connection().await?;
    let groups = rejections::grouped(&mut conn, None, Some(since)).await?;
    let suppressed = replays::list(&mut conn, None, None, REPLAYS_SHOWN).await?;
    drop(conn);
    let can_repair = user.can_repair(&state);
    let content = html! {
        p {
            "Every 4xx the receiver answered on a configured provider's path, grouped by cause. "
            "The receiver records a few per provider per second, so under a flood these counts are a lower bound; "
            "find a request in the receiver's logs by its id."
        }
        nav.periods {
            @for (period, label) in PERIODS {
                @if period == hours { strong { (label) } } @else { a href={ "/refusals?hours=" (period) } { (label) } }
            }
        }
        table id="refusals" {
            tr { th { "provider" } th { "cause" } th { "status" } th { "refused" } th { "first (UTC)" } th { "last (UTC)" } th { "last request id" } }
            @for group in &groups {
                tr {
                    td { (group.provider) } td { code { (group.cause) } } td.num { (group.status) }
                    td.num { (group.count) }
                    td { (group.first_at.format("%Y-%m-%d %H:%M:%S")) }
                    td { (group.last_at.format("%Y-%m-%d %H:%M:%S")) }
                    td { code { (group.sample_request_id) } }
                }
            }
        }
        @if groups.is_empty() { p { "Nothing refused in this period." } }
        h2 { "Suppressed replays" }
        p {
            "Deliveries whose body, provider and type were stored already under another id: a body-only signature "
            "sent again under a fresh id. They were answered 200 and never handed to a handler. "
            "Release one only if its provider really sent it."
        }
        table id="suppressed-replays" {
            tr { th { "received (UTC)" } th { "provider" } th { "event id" } th { "type" } th { "bytes" } th { "copy of" } @if can_repair { th {} } }
            @for replay in &suppressed {
                tr {
                    td { (replay.received_at.format("%Y-%m-%d %H:%M:%S")) }
                    td { (replay.provider) } td { code { (replay.event_id) } }
                    td { (replay.event_type.as_deref().unwrap_or("")) } td.num { (replay.body_bytes) }
                    td {
                        @match &replay.original_event_id {
                            Some(original) => a href={ "/events/" (replay.original_id) } { (original) },
                            None => { (replay.original_id) " (purged)" },
                        }
                    }
                    @if can_repair {
                        td {
                            form method="post" action="/replays/release" {
                                (layout::csrf_field(&user))
                                input type="hidden" name="id" value=(replay.id);
                                button type="submit" class="release" { "Release" }
                            }
                        }
                    }
                }
            }
        }
        @if suppressed.is_empty() { p { "No replay is suppressed." } }
    };
    Ok(layout::page("Refusals", &user, &state, content))
}

/// The release form of a suppressed replay.
#[derive(Debug, Deserialize)]
pub struct ReleaseForm {
    #[serde(default)]
    csrf_token: String,
    id: i64,
}

/// POST /replays/release: queues a suppressed replay as if it had just arrived, audited in
/// the same transaction.
pub async fn release(
    user: CurrentUser,
    state: web::Data<AppState>,
    form: web::Form<ReleaseForm>,
) -> Result<HttpResponse, ConsoleError> {
    user.authorize_repair(&state, &form.csrf_token)?;
    let mut conn = state.connection().await?;
    conn.transaction::<_, ConsoleError, _>(async |tx| {
        let released = replays::release(tx, &[form.id]).await?;
        if released.is_empty() {
            return Err(ConsoleError::Conflict(format!(
                "{} is not a suppressed replay (released already, or purged): nothing was released.",
                form.id
            )));
        }
        audit::record(
            tx,
            NewAction::done(
                &user.session.user,
                "release_replay",
                serde_json::json!({ "id": form.id }),
                1,
            ),
        )
        .await?;
        // Sent at commit, and only if the release commits.
        inbox_core::inbox::notify_new_events(tx).await?;
        Ok(())
    })
    .await?;
    state
        .metrics
        .repairs
        .with_label_values(&["release_replay"])
        .inc();
    tracing::info!(user = %user.session.user, id = form.id, "suppressed replay released");
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, format!("/events/{}", form.id)))
        .finish())
}

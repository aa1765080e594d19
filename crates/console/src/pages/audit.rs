//! The audit page: every repair action, newest first, paged by keyset on the row id.

use actix_web::{web, HttpResponse};
use inbox_core::operations::audit;
use maud::html;
use serde::Deserialize;

use super::layout;
use crate::error::ConsoleError;
use crate::http::CurrentUser;
use crate::server::AppState;

/// Actions per page.
pub const PAGE_SIZE: i64 = 200;

/// The page cursor.
#[derive(Debug, Deserialize)]
pub struct AuditParams {
    /// The last id of the previous page.
    before: Option<i64>,
}

/// GET /audit.
pub async fn page(
    user: CurrentUser,
    state: web::Data<AppState>,
    params: web::Query<AuditParams>,
) -> Result<HttpResponse, ConsoleError> {
    let mut conn = state.connection().await?;
    // One row past the page tells whether an older page exists.
    let mut entries = audit::page_before(&mut conn, params.before, PAGE_SIZE + 1).await?;
    drop(conn);
    let page_size = usize::try_from(PAGE_SIZE).unwrap_or(usize::MAX);
    let more = entries.len() > page_size;
    entries.truncate(page_size);
    let content = html! {
        table id="audit" {
            tr { th { "when (UTC)" } th { "who" } th { "action" } th { "on" } th { "estimated" } th { "events changed" } th { "outcome" } }
            @for entry in &entries {
                tr {
                    td { (entry.at.format("%Y-%m-%d %H:%M:%S")) }
                    td { (entry.actor) }
                    td { (entry.action) }
                    td { code { (entry.target) } }
                    td.num { (entry.estimated.map(|n| n.to_string()).unwrap_or_default()) }
                    td.num { (entry.affected) }
                    td { (entry.outcome) }
                }
            }
        }
        @if entries.is_empty() {
            @if params.before.is_some() { p { "No older action." } } @else { p { "No repair action yet." } }
        }
        @if more {
            @if let Some(last) = entries.last() {
                p { a id="next-page" href={ "/audit?before=" (last.id) } { "Older actions →" } }
            }
        }
    };
    Ok(layout::page("Audit", &user, &state, content))
}

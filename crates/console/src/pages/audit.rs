//! The audit page: every repair action, newest first.

use actix_web::{web, HttpResponse};
use inbox_core::operations::audit;
use maud::html;

use super::layout;
use crate::error::ConsoleError;
use crate::http::CurrentUser;
use crate::server::AppState;

/// Actions shown.
const SHOWN: i64 = 200;

/// GET /audit.
pub async fn page(
    user: CurrentUser,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ConsoleError> {
    let mut conn = state.connection().await?;
    let entries = audit::recent(&mut conn, SHOWN).await?;
    drop(conn);
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
        @if entries.is_empty() { p { "No repair action yet." } }
    };
    Ok(layout::page("Audit", &user, &state, content))
}

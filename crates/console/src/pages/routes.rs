//! Paused routes: pause a provider (or one of its event types) so its events wait, ready and
//! unclaimed, while ingest goes on; resume it. Beside them, the ordering keys blocked by a
//! dead head. Each change is audited in the transaction that makes it.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use diesel_async::AsyncConnection;
use inbox_core::inbox::pause::{self, EVERY_EVENT_TYPE};
use inbox_core::operations::audit::{self, NewAction};
use inbox_core::operations::browse;
use inbox_core::ordering;
use maud::html;
use serde::Deserialize;

use super::layout;
use crate::error::ConsoleError;
use crate::http::CurrentUser;
use crate::server::AppState;

/// Blocked keys listed.
const BLOCKED_KEYS_SHOWN: i64 = 100;

/// GET /routes.
pub async fn page(
    user: CurrentUser,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ConsoleError> {
    let mut conn = state.connection().await?;
    let paused = pause::paused_routes(&mut conn).await?;
    let blocked = browse::blocked_keys(&mut conn, BLOCKED_KEYS_SHOWN).await?;
    drop(conn);
    let can_repair = user.can_repair(&state);
    let content = html! {
        p { "A paused route's events stay ready and no worker claims them; the receiver keeps accepting them. Resuming lets the workers claim them at their next claim." }
        table id="paused" {
            tr { th { "provider" } th { "event type" } th { "paused by" } th { "since" } @if can_repair { th {} } }
            @for route in &paused {
                tr {
                    td { (route.provider) } td { (route.event_type) } td { (route.paused_by) }
                    td { (route.paused_at.format("%Y-%m-%d %H:%M:%S UTC")) }
                    @if can_repair {
                        td {
                            form method="post" action="/routes/resume" {
                                (layout::csrf_field(&user))
                                input type="hidden" name="provider" value=(route.provider);
                                input type="hidden" name="event_type" value=(route.event_type);
                                button type="submit" class="resume" { "Resume" }
                            }
                        }
                    }
                }
            }
        }
        @if paused.is_empty() { p { "No route is paused." } }
        h2 { "Blocked ordering keys" }
        p { "An ordered key whose head went dead: the events behind it wait until the head is replayed (from its page) or skipped." }
        table id="blocked-keys" {
            tr { th { "key" } th { "dead head" } th { "blocked since" } th { "events waiting" } @if can_repair { th {} } }
            @for key in &blocked {
                tr {
                    td { (key.ordering_key) }
                    td { a href={ "/events/" (key.head_id) } { (key.provider) " " (key.event_id) } }
                    td { (key.blocked_since.format("%Y-%m-%d %H:%M:%S UTC")) }
                    td.num { (key.waiting) }
                    @if can_repair {
                        td {
                            form method="post" action="/keys/skip" {
                                (layout::csrf_field(&user))
                                input type="hidden" name="head_id" value=(key.head_id);
                                input type="text" name="reason" placeholder="why (kept)" required;
                                button type="submit" class="skip" { "Skip the head" }
                            }
                        }
                    }
                }
            }
        }
        @if blocked.is_empty() { p { "No key is blocked." } }
        @if can_repair {
            h2 { "Pause a route" }
            form.filters method="post" action="/routes/pause" {
                (layout::csrf_field(&user))
                label { "provider" input type="text" name="provider" required; }
                label { "event type (* for all)" input type="text" name="event_type" value=(EVERY_EVENT_TYPE); }
                button type="submit" id="pause" { "Pause" }
            }
        }
    };
    Ok(layout::page("Routes", &user, &state, content))
}

/// The pause and resume forms.
#[derive(Debug, Deserialize)]
pub struct RouteForm {
    #[serde(default)]
    csrf_token: String,
    provider: String,
    #[serde(default)]
    event_type: String,
}

impl RouteForm {
    fn route(&self) -> Result<(&str, &str), ConsoleError> {
        let provider = self.provider.trim();
        if provider.is_empty() || provider.chars().count() > 64 {
            return Err(ConsoleError::BadRequest(
                "provider: 1 to 64 characters".to_owned(),
            ));
        }
        let event_type = match self.event_type.trim() {
            "" => EVERY_EVENT_TYPE,
            other => other,
        };
        Ok((provider, event_type))
    }
}

async fn change(
    user: CurrentUser,
    state: web::Data<AppState>,
    form: web::Form<RouteForm>,
    action: &'static str,
) -> Result<HttpResponse, ConsoleError> {
    user.authorize_repair(&state, &form.csrf_token)?;
    let (provider, event_type) = form.route()?;
    let mut conn = state.connection().await?;
    conn.transaction::<_, ConsoleError, _>(async |tx| {
        let changed = if action == "pause" {
            pause::pause_route(tx, provider, event_type, &user.session.user).await?
        } else {
            let resumed = pause::resume_route(tx, provider, event_type).await?;
            if resumed {
                // Idle workers claim the waiting events now instead of at their next
                // poll (PostgreSQL sends it at commit, and only if the resume commits).
                inbox_core::inbox::notify_new_events(tx).await?;
            }
            resumed
        };
        if !changed {
            // Nothing to record: the audit lists what operators changed.
            let state_now = if action == "pause" {
                "already paused"
            } else {
                "not paused"
            };
            return Err(ConsoleError::Conflict(format!(
                "{provider} / {event_type} is {state_now}: nothing changed."
            )));
        }
        audit::record(
            tx,
            NewAction::done(
                &user.session.user,
                action,
                serde_json::json!({ "provider": provider, "event_type": event_type }),
                0,
            ),
        )
        .await?;
        Ok(())
    })
    .await?;
    state.metrics.repairs.with_label_values(&[action]).inc();
    tracing::info!(user = %user.session.user, provider, event_type, action, "route changed");
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/routes"))
        .finish())
}

/// The skip form of a blocked key.
#[derive(Debug, Deserialize)]
pub struct SkipForm {
    #[serde(default)]
    csrf_token: String,
    head_id: i64,
    #[serde(default)]
    reason: String,
}

/// POST /keys/skip: releases the key a dead head blocks (the head stays dead, the key's next
/// event runs), the reason kept with the key and in the audit.
pub async fn skip(
    user: CurrentUser,
    state: web::Data<AppState>,
    form: web::Form<SkipForm>,
) -> Result<HttpResponse, ConsoleError> {
    user.authorize_repair(&state, &form.csrf_token)?;
    let mut conn = state.connection().await?;
    conn.transaction::<_, ConsoleError, _>(async |tx| {
        let key = match ordering::skip_dead_head(tx, form.head_id, &form.reason).await {
            Ok(key) => key,
            Err(ordering::SkipError::Database(err)) => return Err(err.into()),
            // Skipped or replayed already (a second click, another operator): a conflict
            // with what the page showed, not a bad form.
            Err(refused @ ordering::SkipError::NotBlocking(_)) => {
                return Err(ConsoleError::Conflict(refused.to_string()))
            }
            Err(refused) => return Err(ConsoleError::BadRequest(refused.to_string())),
        };
        audit::record(
            tx,
            NewAction::done(
                &user.session.user,
                "skip",
                serde_json::json!({
                    "id": form.head_id,
                    "ordering_key": key,
                    "reason": form.reason.trim(),
                }),
                1,
            ),
        )
        .await?;
        // The key's next event is claimable now (sent at commit, and only if the skip commits).
        inbox_core::inbox::notify_new_events(tx).await?;
        Ok(())
    })
    .await?;
    state.metrics.repairs.with_label_values(&["skip"]).inc();
    tracing::info!(user = %user.session.user, head = form.head_id, "blocked key's head skipped");
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/routes"))
        .finish())
}

/// POST /routes/pause; refused (409) when the route is paused already.
pub async fn pause(
    user: CurrentUser,
    state: web::Data<AppState>,
    form: web::Form<RouteForm>,
) -> Result<HttpResponse, ConsoleError> {
    change(user, state, form, "pause").await
}

/// POST /routes/resume; refused (409) when the route is not paused.
pub async fn resume(
    user: CurrentUser,
    state: web::Data<AppState>,
    form: web::Form<RouteForm>,
) -> Result<HttpResponse, ConsoleError> {
    change(user, state, form, "resume").await
}

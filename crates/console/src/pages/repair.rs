//! Replays: one dead event, or every dead event a filter selects, counted first and then run
//! in the background with its progress shown and an abort button. A replay of one event is
//! audited in the transaction that replays it; a replay by filter and an abort are written to
//! the audit before they run; none happens without its audit row.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use diesel_async::AsyncConnection;
use inbox_core::inbox;
use inbox_core::operations::audit::{self, NewAction, Outcome};
use inbox_core::operations::{self, browse};
use maud::html;
use serde::Deserialize;

use super::filter::FilterParams;
use super::layout;
use crate::error::ConsoleError;
use crate::http::CurrentUser;
use crate::server::AppState;

fn see_other(location: String) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .finish()
}

/// A form that carries nothing but its CSRF token.
#[derive(Debug, Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    csrf_token: String,
}

/// POST /events/{id}/replay: `dead -> ready` for one event.
pub async fn replay_one(
    user: CurrentUser,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    user.authorize_repair(&state, &form.csrf_token)?;
    let mut conn = state.connection().await?;
    let replayed = conn
        .transaction::<_, ConsoleError, _>(async |tx| {
            let replayed = operations::replay(tx, &[*id]).await?;
            if replayed == 0 {
                // Replayed already (a second click, another operator) or never dead: nothing
                // changes, so nothing is recorded.
                return Err(ConsoleError::Conflict(format!(
                    "Event {} is not dead (any more): nothing was replayed.",
                    *id
                )));
            }
            audit::record(
                tx,
                NewAction::done(
                    &user.session.user,
                    "replay",
                    serde_json::json!({ "id": *id }),
                    i64::try_from(replayed).unwrap_or(i64::MAX),
                ),
            )
            .await?;
            // Idle workers claim it now instead of at their next poll; PostgreSQL sends the
            // notification at commit, and only if the replay commits.
            inbox::notify_new_events(tx).await?;
            Ok(replayed)
        })
        .await?;
    state.metrics.repairs.with_label_values(&["replay"]).inc();
    tracing::info!(user = %user.session.user, id = *id, replayed, "replayed one event");
    Ok(see_other(format!("/events/{}", *id)))
}

/// GET /replay?filter: how many dead events the filter selects, and the form that replays
/// them.
pub async fn estimate(
    user: CurrentUser,
    state: web::Data<AppState>,
    filter: web::Query<FilterParams>,
) -> Result<HttpResponse, ConsoleError> {
    let query = filter.to_query()?;
    let estimated = state
        .query_events(&query, async |conn| browse::count_dead(conn, &query).await)
        .await?;
    let content = html! {
        p { "Filter: " code { (filter.to_audit_json()) } }
        p id="estimate" { "This filter selects " strong id="estimated" { (estimated) } " dead event(s) (whatever its state field says, only dead events are replayed)." }
        @if estimated > 0 && user.can_repair(&state) {
            form method="post" action="/replay" {
                (layout::csrf_field(&user))
                (filter.hidden_fields())
                input type="hidden" name="estimated" value=(estimated);
                button type="submit" id="confirm-replay" { "Replay " (estimated) " event(s) in batches of " (state.replay_batch) }
            }
        }
        p { a href={ "/events?" (filter.query_string()) } { "Back to the events" } }
    };
    Ok(layout::page("Replay by filter", &user, &state, content))
}

/// The confirmation form of a replay by filter.
#[derive(Debug, Deserialize)]
pub struct StartForm {
    #[serde(default)]
    csrf_token: String,
    #[serde(flatten)]
    filter: FilterParams,
    /// The count that was shown and confirmed.
    estimated: i64,
}

/// POST /replay: counts the filter's dead events again, refuses when there are more than the
/// operator confirmed, then records the action (with this count) and starts it in the
/// background, bounded to the events just counted.
pub async fn start(
    user: CurrentUser,
    state: web::Data<AppState>,
    form: web::Form<StartForm>,
) -> Result<HttpResponse, ConsoleError> {
    user.authorize_repair(&state, &form.csrf_token)?;
    let query = form.filter.to_query()?;
    // The confirmed figure comes from the browser: only the server's own count may bound
    // what the job changes.
    let extent = state
        .query_events(&query, async |conn| browse::dead_extent(conn, &query).await)
        .await?;
    if extent.rows > form.estimated {
        return Err(ConsoleError::Conflict(format!(
            "This filter now selects {} dead event(s), more than the {} you confirmed: \
             nothing was replayed. Count them again and confirm the new figure.",
            extent.rows, form.estimated
        )));
    }
    if extent.rows == 0 {
        return Err(ConsoleError::Conflict(
            "This filter selects no dead event any more: nothing to replay.".to_owned(),
        ));
    }
    let mut target = form.filter.to_audit_json();
    if let (Some(fields), Some(last_id)) = (target.as_object_mut(), extent.last_id) {
        fields.insert("up_to_id".to_owned(), serde_json::Value::from(last_id));
    }
    let mut conn = state.connection().await?;
    let audit_id = audit::record(
        &mut conn,
        NewAction {
            actor: &user.session.user,
            action: "replay_filter",
            target,
            estimated: Some(extent.rows),
            affected: 0,
            outcome: Outcome::Running,
        },
    )
    .await?;
    drop(conn);
    state
        .metrics
        .repairs
        .with_label_values(&["replay_filter"])
        .inc();
    tracing::info!(user = %user.session.user, job = audit_id, counted = extent.rows, confirmed = form.estimated, "replay by filter started");
    state.jobs.start(
        state.pool.clone(),
        query,
        extent,
        audit_id,
        &user.session.user,
        state.replay_batch,
    );
    Ok(see_other(format!("/jobs/{audit_id}")))
}

/// GET /jobs/{id}: a replay's progress; the page refreshes itself while it runs (no script).
pub async fn progress(
    user: CurrentUser,
    state: web::Data<AppState>,
    id: web::Path<i64>,
) -> Result<HttpResponse, ConsoleError> {
    let job = state.jobs.get(*id).ok_or(ConsoleError::NotFound)?;
    let outcome = job.outcome();
    let running = outcome == Outcome::Running;
    let content = html! {
        @if running { meta http-equiv="refresh" content="1"; }
        table id="job" {
            tr { th { "started by" } td { (job.actor) } }
            tr { th { "counted at start" } td id="job-counted" { (job.counted) } }
            tr { th { "replayed" } td id="job-replayed" { (job.replayed()) } }
            tr { th { "state" } td id="job-state" { (outcome.as_str()) } }
        }
        @if running && user.can_repair(&state) {
            form method="post" action={ "/jobs/" (job.id) "/abort" } {
                (layout::csrf_field(&user))
                button type="submit" id="abort" { "Abort after the current batch" }
            }
        }
        p { a href="/audit" { "Audit" } }
    };
    Ok(layout::page(
        &format!("Replay {}", job.id),
        &user,
        &state,
        content,
    ))
}

/// POST /jobs/{id}/abort: refused (409) when the job has ended already; otherwise recorded,
/// then the job is asked to stop.
pub async fn abort(
    user: CurrentUser,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    user.authorize_repair(&state, &form.csrf_token)?;
    let job = state.jobs.get(*id).ok_or(ConsoleError::NotFound)?;
    let mut conn = state.connection().await?;
    // The abort is asked for inside the audit's transaction, once its row is written: a job
    // that has ended (or has decided its outcome) is not recorded as aborted, and an abort
    // the audit could not hold is taken back.
    let mut asked = false;
    let recorded = conn
        .transaction::<_, ConsoleError, _>(async |tx| {
            audit::record(
                tx,
                NewAction::done(
                    &user.session.user,
                    "abort",
                    serde_json::json!({ "job": job.id }),
                    0,
                ),
            )
            .await?;
            if !job.abort() {
                return Err(ConsoleError::Conflict(format!(
                    "Replay {} has ended already ({}): nothing to abort.",
                    job.id,
                    job.outcome().as_str()
                )));
            }
            asked = true;
            Ok(())
        })
        .await;
    if recorded.is_err() && asked {
        job.withdraw_abort();
    }
    recorded?;
    state.metrics.repairs.with_label_values(&["abort"]).inc();
    Ok(see_other(format!("/jobs/{}", job.id)))
}

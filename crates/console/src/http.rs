//! What every console request goes through: who is asking (the session cookie), whether a
//! state change is allowed (role, CSRF token, read-only mode), the security headers every
//! answer carries, and its metrics.

use std::future::{ready, Ready};
use std::time::Instant;

use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};

use crate::error::ConsoleError;
use crate::server::AppState;
use crate::sessions::Session;
use crate::users::Role;

/// No script runs in a console page, whatever an event holds: the pages carry none, and this
/// policy forbids every script, inline or not, plus plugins, frames and foreign form targets.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Adds the security headers to every answer and records its metrics under its route
/// pattern (bounded: never the path itself).
pub fn record_and_protect<S>(
    request: ServiceRequest,
    service: &S,
) -> impl std::future::Future<Output = Result<ServiceResponse, actix_web::Error>>
where
    S: Service<ServiceRequest, Response = ServiceResponse, Error = actix_web::Error>,
{
    let started = Instant::now();
    let route = request
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_owned());
    let state = request.app_data::<web::Data<AppState>>().cloned();
    let response = service.call(request);
    async move {
        let mut response = response.await?;
        let headers = response.headers_mut();
        for (name, value) in [
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-store"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        if let Some(state) = state {
            let status = response.status().as_u16().to_string();
            state
                .metrics
                .requests
                .with_label_values(&[route.as_str(), status.as_str()])
                .inc();
            state
                .metrics
                .request_duration
                .with_label_values(&[route.as_str()])
                .observe(started.elapsed().as_secs_f64());
        }
        Ok(response)
    }
}

/// GET /metrics on the metrics address.
pub async fn metrics(metrics: web::Data<crate::metrics::Metrics>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(inbox_core::metrics::CONTENT_TYPE)
        .body(metrics.render())
}

/// The logged-in user of a request; handlers that take it refuse anonymous requests (they are
/// sent to the login page).
#[derive(Debug, Clone)]
pub struct CurrentUser {
    /// The session.
    pub session: Session,
    /// The session's id (the cookie's value).
    pub session_id: String,
}

impl FromRequest for CurrentUser {
    type Error = ConsoleError;
    type Future = Ready<Result<Self, ConsoleError>>;

    fn from_request(request: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        ready(current_user(request).ok_or(ConsoleError::NotLoggedIn))
    }
}

fn current_user(request: &HttpRequest) -> Option<CurrentUser> {
    let state = request.app_data::<web::Data<AppState>>()?;
    let cookie = request.cookie(state.cookie_names().session)?;
    let session = state.sessions.get(cookie.value())?;
    Some(CurrentUser {
        session,
        session_id: cookie.value().to_owned(),
    })
}

impl CurrentUser {
    /// Allows a repair only for an operator whose form carries the session's CSRF token, on a
    /// console not in read-only mode; counts each refusal by reason.
    pub fn authorize_repair(&self, state: &AppState, csrf_token: &str) -> Result<(), ConsoleError> {
        let refusal = if !self.session.csrf_matches(csrf_token) {
            Some((
                "csrf",
                "The form's CSRF token is missing or wrong: reload the page and try again.",
            ))
        } else if state.read_only {
            Some((
                "read_only",
                "This console runs in read-only mode: repairs are disabled.",
            ))
        } else if self.session.role != Role::Operator {
            Some(("role", "Viewers cannot repair: log in as an operator."))
        } else {
            None
        };
        match refusal {
            Some((reason, message)) => {
                state.metrics.refusals.with_label_values(&[reason]).inc();
                tracing::warn!(user = %self.session.user, reason, "repair refused");
                Err(ConsoleError::Forbidden(message))
            }
            None => Ok(()),
        }
    }

    /// True when this user may see the repair forms at all.
    pub fn can_repair(&self, state: &AppState) -> bool {
        self.session.role == Role::Operator && !state.read_only
    }
}

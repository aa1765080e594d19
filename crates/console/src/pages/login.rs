//! Logging in and out. The login form is protected against cross-site submission by a
//! double-submit token (a cookie and a hidden field that must match), since there is no
//! session yet to hold one. Failed logins are limited per client and per name
//! ([`crate::login_throttle`]), and the password check runs on the blocking pool, one at a
//! time, never on the two workers that serve the pages.

use std::time::Instant;

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use maud::html;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::layout;
use crate::error::ConsoleError;
use crate::http::CurrentUser;
use crate::server::AppState;
use crate::sessions::random_token;
use crate::users::Role;

fn cookie<'a>(name: &'a str, value: String, state: &AppState) -> Cookie<'a> {
    Cookie::build(name, value)
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(state.cookie_secure)
        .finish()
}

fn login_page(state: &AppState, status: StatusCode, refusal: Option<&str>) -> HttpResponse {
    let token = random_token();
    let body = html! {
        main.login {
            h1 { "webhook-inbox console" }
            @if let Some(refusal) = refusal { p.refusal { (refusal) } }
            form method="post" action="/login" {
                input type="hidden" name="login_token" value=(token);
                label { "User" input type="text" name="username" autocomplete="username" required; }
                label { "Password" input type="password" name="password" autocomplete="current-password" required; }
                button type="submit" id="login" { "Log in" }
            }
        }
    };
    let mut response = layout::html_response(status, "Log in", body);
    let _ = response.add_cookie(&cookie(state.cookie_names().login, token, state));
    response
}

/// GET /login.
pub async fn form(state: web::Data<AppState>) -> HttpResponse {
    login_page(&state, StatusCode::OK, None)
}

/// The login form's fields.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    username: String,
    password: String,
    #[serde(default)]
    login_token: String,
}

/// POST /login: opens a session and sends the browser to the overview, or shows the form
/// again with a refusal that does not say whether the name exists. A client or name with too
/// many recent failures is answered 429 with `Retry-After`, its password not checked.
pub async fn submit(
    request: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<LoginForm>,
) -> Result<HttpResponse, ConsoleError> {
    let names = state.cookie_names();
    let expected = request
        .cookie(names.login)
        .map(|cookie| cookie.value().to_owned())
        .unwrap_or_default();
    let token_ok =
        !expected.is_empty() && bool::from(expected.as_bytes().ct_eq(form.login_token.as_bytes()));
    if !token_ok {
        state.metrics.refusals.with_label_values(&["csrf"]).inc();
        return Ok(login_page(
            &state,
            StatusCode::FORBIDDEN,
            Some("The login form expired: try again."),
        ));
    }
    let LoginForm {
        username, password, ..
    } = form.into_inner();
    let client = state.trusted_proxies.client(
        request.peer_addr().map(|addr| addr.ip()),
        request
            .headers()
            .get_all("x-forwarded-for")
            .filter_map(|value| value.to_str().ok()),
    );
    let attempt = match state
        .login_throttle
        .begin(client, &username, Instant::now())
    {
        Ok(attempt) => attempt,
        Err(throttled) => {
            state.metrics.logins.with_label_values(&["throttled"]).inc();
            tracing::warn!(client = ?client, "console login throttled");
            let seconds = throttled.retry_after.as_secs();
            let mut response = login_page(
                &state,
                StatusCode::TOO_MANY_REQUESTS,
                Some(&format!(
                    "Too many failed logins: try again in {seconds} seconds."
                )),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            return Ok(response);
        }
    };
    let (username, checked) = check_password(&state, username, password).await?;
    let Some(role) = checked else {
        state.metrics.logins.with_label_values(&["refused"]).inc();
        tracing::warn!("console login refused");
        return Ok(login_page(
            &state,
            StatusCode::UNAUTHORIZED,
            Some("Wrong user name or password."),
        ));
    };
    state.login_throttle.forgive(attempt);
    state.metrics.logins.with_label_values(&["ok"]).inc();
    tracing::info!(user = %username, role = role.as_str(), "console login");
    // A session this browser held before ends: a login never leaves two live behind it.
    if let Some(previous) = request.cookie(names.session) {
        state.sessions.close(previous.value());
    }
    let session_id = state.sessions.open(&username, role);
    let mut response = HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/"))
        .finish();
    let _ = response.add_cookie(&cookie(names.session, session_id, &state));
    let mut spent = cookie(names.login, String::new(), &state);
    spent.make_removal();
    let _ = response.add_cookie(&spent);
    Ok(response)
}

/// The role of `username` when `password` is theirs, checked on the blocking pool with one of
/// the [`AppState::password_checks`] permits: an argon2 check holds a core for ~20 ms, which
/// on an async worker would stall every page that worker serves. Hands the name back.
async fn check_password(
    state: &web::Data<AppState>,
    username: String,
    password: String,
) -> Result<(String, Option<Role>), ConsoleError> {
    let _permit = state
        .password_checks
        .acquire()
        .await
        .map_err(|_| ConsoleError::PasswordCheck)?;
    let users = state.clone();
    web::block(move || {
        let role = users.users.authenticate(&username, &password);
        (username, role)
    })
    .await
    .map_err(|_| ConsoleError::PasswordCheck)
}

/// The CSRF token of a form that changes nothing but the session.
#[derive(Debug, Deserialize)]
pub struct CsrfOnly {
    #[serde(default)]
    csrf_token: String,
}

/// POST /logout.
pub async fn logout(
    user: CurrentUser,
    state: web::Data<AppState>,
    form: web::Form<CsrfOnly>,
) -> Result<HttpResponse, ConsoleError> {
    if !user.session.csrf_matches(&form.csrf_token) {
        // Counted like every other refused state change.
        state.metrics.refusals.with_label_values(&["csrf"]).inc();
        tracing::warn!(user = %user.session.user, reason = "csrf", "logout refused");
        return Err(ConsoleError::Forbidden(
            "The form's CSRF token is missing or wrong.",
        ));
    }
    state.sessions.close(&user.session_id);
    let mut response = HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/login"))
        .finish();
    let mut removal = cookie(state.cookie_names().session, String::new(), &state);
    removal.make_removal();
    let _ = response.add_cookie(&removal);
    Ok(response)
}

//! The frame every page shares (navigation, the user, logout) and the stylesheet. Pages are
//! maud templates: every value written into them is HTML-escaped unless marked otherwise,
//! and nothing here ever marks one.

use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use maud::{html, Markup, DOCTYPE};

use crate::http::CurrentUser;
use crate::server::AppState;

const STYLESHEET: &str = include_str!("console.css");

/// GET /console.css.
pub async fn stylesheet() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .body(STYLESHEET)
}

/// A whole page for a logged-in user.
pub fn page(title: &str, user: &CurrentUser, state: &AppState, content: Markup) -> HttpResponse {
    let body = html! {
        header {
            nav {
                strong { "webhook-inbox" }
                a href="/" { "Overview" }
                a href="/events" { "Events" }
                a href="/routes" { "Routes" }
                a href="/refusals" { "Refusals" }
                a href="/audit" { "Audit" }
            }
            div.who {
                span { (user.session.user) " (" (user.session.role.as_str()) ")" }
                @if state.read_only { span.badge { "read-only" } }
                form method="post" action="/logout" {
                    (csrf_field(user))
                    button type="submit" { "Log out" }
                }
            }
        }
        main { h1 { (title) } (content) }
    };
    html_response(StatusCode::OK, title, body)
}

/// The hidden field carrying the session's CSRF token, for every state-changing form.
pub fn csrf_field(user: &CurrentUser) -> Markup {
    html! { input type="hidden" name="csrf_token" value=(user.session.csrf_token); }
}

/// A page outside a session (login, errors).
pub fn html_response(status: StatusCode, title: &str, body: Markup) -> HttpResponse {
    let document = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · webhook-inbox console" }
                link rel="stylesheet" href="/console.css";
            }
            body { (body) }
        }
    };
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(document.into_string())
}

/// An error page: the status and a sentence for the operator.
pub fn error_page(status: StatusCode, message: &str) -> HttpResponse {
    let title = status.canonical_reason().unwrap_or("Error");
    html_response(
        status,
        title,
        html! {
            main.error {
                h1 { (status.as_u16()) " " (title) }
                p.refusal { (message) }
                p { a href="/" { "Back to the overview" } }
            }
        },
    )
}

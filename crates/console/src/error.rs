//! The console's refusals and failures, each one HTTP answer.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};

use crate::pages::layout;

/// Why a request was not served.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// No valid session: the browser is sent to the login page.
    #[error("not logged in")]
    NotLoggedIn,
    /// Logged in, but not allowed (a viewer's repair, a missing CSRF token, read-only mode).
    #[error("{0}")]
    Forbidden(&'static str),
    /// The request's input is unusable; the text says which field and why.
    #[error("{0}")]
    BadRequest(String),
    /// No such event or job.
    #[error("not found")]
    NotFound,
    /// The action no longer fits what the operator saw; the text says what changed.
    #[error("{0}")]
    Conflict(String),
    /// The database failed (details go to the log, not to the page).
    #[error("database error")]
    Database(#[from] diesel::result::Error),
    /// No pooled connection.
    #[error("database unavailable")]
    Pool(#[from] diesel_async::pooled_connection::bb8::RunError),
    /// The password check could not run (its thread pool is shutting down).
    #[error("the password check is unavailable; retry shortly")]
    PasswordCheck,
    /// Too many requests of this kind at once; the text says which.
    #[error("{0}")]
    Busy(&'static str),
    /// A search of the bodies failed, most often by outlasting its timeout.
    #[error(
        "The search of the bodies did not finish within {}: narrow it by provider, type or time.",
        humantime::format_duration(*timeout)
    )]
    SearchFailed {
        /// `--body-search-timeout`.
        timeout: std::time::Duration,
        /// What the database said (logged, not shown).
        err: diesel::result::Error,
    },
}

impl ResponseError for ConsoleError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::NotLoggedIn => StatusCode::SEE_OTHER,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Pool(_) | Self::PasswordCheck | Self::SearchFailed { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            Self::NotLoggedIn => HttpResponse::SeeOther()
                .insert_header((header::LOCATION, "/login"))
                .finish(),
            Self::Database(err) => {
                tracing::error!(error = %err, "console query failed");
                layout::error_page(
                    self.status_code(),
                    "The database query failed; see the console's log.",
                )
            }
            Self::SearchFailed { err, .. } => {
                tracing::warn!(error = %err, "a search of the bodies failed");
                layout::error_page(self.status_code(), &self.to_string())
            }
            Self::Pool(err) => {
                tracing::warn!(error = %err, "no database connection");
                layout::error_page(
                    self.status_code(),
                    "No database connection available; retry shortly.",
                )
            }
            other => layout::error_page(self.status_code(), &other.to_string()),
        }
    }
}

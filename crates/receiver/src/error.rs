//! Every way a webhook request can fail, mapped to its HTTP answer with a fixed
//! `{"code": ..., "detail": ...}` body. Details never contain secrets or request bodies.

use std::sync::Arc;

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use inbox_signature::VerifyError;

use crate::identify::IdentifyError;
use crate::ingest::StoreError;

/// A failed webhook request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No provider of that name is configured.
    #[error("unknown provider")]
    UnknownProvider,
    /// The signature is missing, malformed, stale or wrong.
    #[error("signature rejected: {0}")]
    Signature(#[from] VerifyError),
    /// A header that decides authenticity or identity was sent more than once.
    #[error("header {0} must appear once")]
    RepeatedHeader(String),
    /// A header the event id is read from is present but not visible ASCII text: falling back
    /// to another header would key the event on something else than the provider meant.
    #[error("header {0} is not ASCII text")]
    UnreadableHeader(String),
    /// The event could not be identified.
    #[error(transparent)]
    Identify(#[from] IdentifyError),
    /// The event's ordering key holds a character PostgreSQL's text cannot (NUL): refused here
    /// rather than by the database, which would refuse its row.
    #[error("ordering key contains a NUL character")]
    InvalidOrderingKey,
    /// The body is larger than the limit.
    #[error("body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body did not arrive in time.
    #[error("body not received within {0:?}")]
    BodyTimeout(std::time::Duration),
    /// The body stream broke.
    #[error("body could not be read")]
    BodyUnreadable,
    /// The database refused the event's row (a constraint, a data exception): retrying
    /// cannot store it.
    #[error("the event cannot be stored")]
    Unstorable(#[source] Arc<StoreError>),
    /// The budget of body bytes in flight cannot take this body now; it was not read.
    #[error("too many request bodies in flight; retry later")]
    Busy {
        /// Seconds for the Retry-After header.
        retry_after_secs: u64,
    },
    /// The request head could not be parsed: its request line, a header, a missing `Host`.
    #[error("malformed request head: {0}")]
    MalformedHead(String),
    /// The request head is larger than the limit.
    #[error("request head exceeds {limit} bytes")]
    HeadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The request head is more than the HTTP layer parses: see [`crate::head_guard`].
    #[error(
        "request head exceeds {} bytes or {} headers",
        crate::head_guard::HTTP_LAYER_MAX_HEAD_BYTES,
        crate::head_guard::HTTP_LAYER_MAX_HEADERS
    )]
    HeadTooLargeToParse,
    /// The connection's first request head did not arrive in time.
    #[error("request head not received within {0:?}")]
    HeadTimeout(std::time::Duration),
    /// The event could not be stored: nothing was acked, the provider should retry.
    #[error("temporarily unable to store the event")]
    Unavailable {
        /// Why.
        #[source]
        cause: Arc<StoreError>,
        /// Seconds for the Retry-After header.
        retry_after_secs: u64,
    },
}

impl ApiError {
    /// The answer to an event that could not be stored: refused for good when the database
    /// refused its row, else 503 so the provider retries.
    pub fn not_stored(cause: Arc<StoreError>, retry_after_secs: u64) -> Self {
        if matches!(*cause, StoreError::InvalidRow(_)) {
            Self::Unstorable(cause)
        } else {
            Self::Unavailable {
                cause,
                retry_after_secs,
            }
        }
    }

    /// Whether the answer tells the provider not to send the request again: a row the database
    /// refused for good, as opposed to one it could not store for now.
    pub fn is_refusal_for_good(&self) -> bool {
        matches!(self, Self::Unstorable(_))
    }

    /// The error and its causes, `": "`-separated, for the one log line at the boundary. The
    /// HTTP answer shows only the first part: causes may name database internals.
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(error) = cause {
            let message = error.to_string();
            // Some messages already end with their cause's (`signature rejected: {0}`).
            if !text.ends_with(&message) {
                text.push_str(": ");
                text.push_str(&message);
            }
            cause = error.source();
        }
        text
    }

    /// Stable machine-readable code of the answer.
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnknownProvider => "unknown_provider",
            Self::Signature(VerifyError::StaleTimestamp | VerifyError::FutureTimestamp) => {
                "stale_timestamp"
            }
            Self::Signature(_) => "invalid_signature",
            Self::RepeatedHeader(_) => "repeated_header",
            Self::Identify(
                IdentifyError::InvalidJson
                | IdentifyError::InvalidForm
                | IdentifyError::InvalidBatch(_),
            ) => "invalid_body",
            Self::Identify(IdentifyError::MissingEventId(_)) => "missing_event_id",
            Self::Identify(IdentifyError::InvalidEventId(_)) => "invalid_event_id",
            Self::Identify(IdentifyError::Ambiguous(_)) => "ambiguous_body",
            Self::UnreadableHeader(_) => "unreadable_header",
            Self::InvalidOrderingKey => "invalid_ordering_key",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::BodyTimeout(_) => "body_timeout",
            Self::BodyUnreadable => "body_unreadable",
            Self::Unstorable(_) => "unstorable_event",
            Self::Busy { .. } => "busy",
            Self::Unavailable { .. } => "unavailable",
            Self::MalformedHead(_) => "malformed_request",
            Self::HeadTooLarge { .. } | Self::HeadTooLargeToParse => "headers_too_large",
            Self::HeadTimeout(_) => "head_timeout",
        }
    }

    /// The metrics outcome label.
    pub fn outcome(&self) -> &'static str {
        match self.status_code() {
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::PAYLOAD_TOO_LARGE => "too_large",
            StatusCode::REQUEST_TIMEOUT => "timeout",
            StatusCode::UNPROCESSABLE_ENTITY => "unstorable",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            _ => "bad_request",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::UnknownProvider => StatusCode::NOT_FOUND,
            Self::Signature(_) => StatusCode::UNAUTHORIZED,
            Self::RepeatedHeader(_)
            | Self::UnreadableHeader(_)
            | Self::Identify(_)
            | Self::InvalidOrderingKey
            | Self::BodyUnreadable
            | Self::MalformedHead(_) => StatusCode::BAD_REQUEST,
            Self::HeadTooLarge { .. } | Self::HeadTooLargeToParse => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            Self::HeadTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Unstorable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Busy { .. } | Self::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        match self {
            Self::Unavailable {
                retry_after_secs, ..
            } => {
                response.insert_header((header::RETRY_AFTER, retry_after_secs.to_string()));
            }
            Self::Busy { retry_after_secs } => {
                response.insert_header((header::RETRY_AFTER, retry_after_secs.to_string()));
                // The body was never read.
                response.insert_header((header::CONNECTION, "close"));
            }
            Self::BodyTooLarge { .. }
            | Self::BodyTimeout(_)
            | Self::BodyUnreadable
            | Self::MalformedHead(_)
            | Self::HeadTooLarge { .. }
            | Self::HeadTooLargeToParse
            | Self::HeadTimeout(_) => {
                // The unread rest of the body (or of the head) makes the connection unusable.
                response.insert_header((header::CONNECTION, "close"));
            }
            _ => {}
        }
        response.json(serde_json::json!({
            "code": self.code(),
            "detail": self.to_string(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_chain_names_each_cause_once_and_the_answer_only_the_first() {
        let unavailable = ApiError::Unavailable {
            cause: Arc::new(StoreError::NoConnection),
            retry_after_secs: 5,
        };
        assert_eq!(
            unavailable.chain(),
            "temporarily unable to store the event: no database connection available"
        );
        assert_eq!(
            unavailable.to_string(),
            "temporarily unable to store the event"
        );
        let forged = ApiError::Signature(VerifyError::NoMatch);
        assert_eq!(forged.chain(), "signature rejected: no signature matched");
    }
}

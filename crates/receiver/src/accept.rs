//! Storing a verified request's events and answering it: one row per event (a batch gives
//! several), every row committed before the one answer, in the form the provider expects.

use actix_web::http::header::{self, HeaderMap};
use actix_web::HttpResponse;
use inbox_core::inbox::{InsertOutcome, NewEvent};
use inbox_core::limits::is_storable_text;
use inbox_signature::{Ack, HandshakeReply};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::http::{AppState, RequestHeaders};
use crate::identify::Identified;
use crate::providers::Provider;

/// Headers never stored: they carry the caller's credentials, not the event.
const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "x-auth-token",
    "x-csrf-token",
    "x-gitlab-token",
];

/// Most bytes of headers (names and values) kept with an event; the largest beyond it are
/// left out, and the row says so (`x-inbox-headers-truncated`).
pub const MAX_STORED_HEADER_BYTES: usize = 8 * 1024;

/// Key added to the stored headers when some were left out for [`MAX_STORED_HEADER_BYTES`].
pub const TRUNCATED_MARKER: &str = "x-inbox-headers-truncated";

/// How many of a request's events were new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// Rows committed by this request.
    pub accepted: usize,
    /// Events whose `(provider, event_id)` was already stored.
    pub duplicates: usize,
    /// Events stored as suppressed replays: their body was stored already under another id.
    pub suppressed_replays: usize,
}

impl Stored {
    /// The answer's and the metrics' outcome: `accepted` when anything new was stored,
    /// `duplicate` when everything was stored already. A replay is answered like a new event:
    /// what was sent is stored, and telling the sender apart would only teach it what to vary.
    pub fn outcome(self) -> &'static str {
        if self.accepted > 0 || self.suppressed_replays > 0 {
            "accepted"
        } else {
            "duplicate"
        }
    }
}

/// Stores every event of a request and returns once all are committed (or known to exist),
/// or at the request's `deadline` (see [`crate::http::Arrival`]), which every one of its
/// events shares. They are handed to the ingest path together, so group commit usually writes
/// them in one statement; if any fails, the request is answered 503 (422 when the database
/// refused its row) and the provider's retry stores the rest (those already committed come
/// back as duplicates).
pub async fn store_all(
    state: &AppState,
    provider: &Provider,
    headers: &HeaderMap,
    body: &[u8],
    events: Vec<Identified>,
    deadline: tokio::time::Instant,
) -> Result<Stored, ApiError> {
    let kept = stored_headers(headers, provider);
    let replays = provider.replay_check(body);
    let rows = events
        .into_iter()
        .map(|event| {
            let body = event.body.unwrap_or_else(|| body.to_vec());
            let ordering = match &provider.ordering {
                Some(ordering) => ordering
                    .of_event(&provider.name, &RequestHeaders(headers), &body)
                    .map_err(|repeated| ApiError::Identify(repeated.into()))?,
                None => None,
            };
            // Event ids and types are checked when identified; a key may come from any string
            // of the body.
            if ordering
                .as_ref()
                .is_some_and(|ordering| !is_storable_text(&ordering.key))
            {
                return Err(ApiError::InvalidOrderingKey);
            }
            Ok(NewEvent {
                provider: provider.name.clone(),
                event_id: event.event_id,
                event_type: event.event_type,
                headers: kept.clone(),
                body_sha256: Sha256::digest(&body).into(),
                ordering,
                replays: replays.clone(),
                body,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let event_ids: Vec<String> = rows.iter().map(|row| row.event_id.clone()).collect();
    let results = event_ids
        .into_iter()
        .zip(state.ingestor.store_all(rows, deadline).await);
    let mut stored = Stored {
        accepted: 0,
        duplicates: 0,
        suppressed_replays: 0,
    };
    let mut failure: Option<ApiError> = None;
    for (event_id, result) in results {
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(cause) => {
                let error = ApiError::not_stored(cause, state.limits.retry_after_secs);
                failure = Some(the_batch_answer(failure, error));
                continue;
            }
        };
        match outcome {
            InsertOutcome::Accepted => {
                tracing::debug!(provider = %provider.name, %event_id, "event accepted");
                stored.accepted += 1;
            }
            InsertOutcome::Duplicate { same_body } => {
                if same_body == Some(false) {
                    state
                        .metrics
                        .body_mismatches
                        .with_label_values(&[provider.name.as_str()])
                        .inc();
                    tracing::warn!(
                        provider = %provider.name,
                        %event_id,
                        "duplicate event id with a different body: a provider bug or a tampering attempt; the stored body is kept"
                    );
                }
                stored.duplicates += 1;
            }
            InsertOutcome::SuppressedReplay { original_id } => {
                state
                    .metrics
                    .replays_suppressed
                    .with_label_values(&[provider.name.as_str()])
                    .inc();
                tracing::warn!(
                    provider = %provider.name,
                    %event_id,
                    original_id,
                    "a body already stored under another id: kept as a suppressed replay, not processed (worker replays, worker release)"
                );
                stored.suppressed_replays += 1;
            }
        }
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(stored),
    }
}

/// Which of two items' failures a batch is answered with: a failure for now outranks a refusal
/// for good, whatever their order in the batch. Answered 422, the provider would never send
/// again the items that were not stored only for now (those it sends again that were stored
/// are duplicates).
fn the_batch_answer(first: Option<ApiError>, next: ApiError) -> ApiError {
    match first {
        Some(first) if first.is_refusal_for_good() && !next.is_refusal_for_good() => next,
        Some(first) => first,
        None => next,
    }
}

/// The answer to stored events: the provider's expected text, or the JSON status (with the
/// counts, for a batch).
pub fn acknowledgement(provider: &Provider, stored: Stored, batch: bool) -> HttpResponse {
    match &provider.ack {
        Ack::Text(text) => HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .body(text.clone()),
        Ack::Json(json) => HttpResponse::Ok()
            .content_type("application/json")
            .body(json.clone()),
        Ack::NoContent => HttpResponse::NoContent().finish(),
        Ack::Status if batch => HttpResponse::Ok().json(serde_json::json!({
            "status": stored.outcome(),
            "accepted": stored.accepted + stored.suppressed_replays,
            "duplicates": stored.duplicates,
        })),
        Ack::Status => HttpResponse::Ok().json(serde_json::json!({ "status": stored.outcome() })),
    }
}

/// The answer to a handshake. Echoed challenges are attacker-chosen text: never sniffed as
/// HTML, never cached.
pub fn handshake_answer(reply: HandshakeReply) -> HttpResponse {
    if reply.status == 204 {
        return HttpResponse::NoContent()
            .insert_header(("x-content-type-options", "nosniff"))
            .insert_header((header::CACHE_CONTROL, "no-store"))
            .finish();
    }
    HttpResponse::Ok()
        .content_type(reply.content_type)
        .insert_header(("x-content-type-options", "nosniff"))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(reply.body)
}

/// The headers kept with the event: everything but credentials (or only `keep_headers`), as
/// `{name: value}` with repeated headers joined by ", " (their meaning under HTTP semantics),
/// within [`MAX_STORED_HEADER_BYTES`]: smallest first, so a few huge headers cannot push out
/// the ones that identify the delivery, and by name among equals, so what is kept does not
/// depend on the map's order.
pub(crate) fn stored_headers(headers: &HeaderMap, provider: &Provider) -> serde_json::Value {
    let mut names: Vec<(usize, &str)> = headers
        .keys()
        .map(|name| name.as_str())
        .filter(|name| {
            let listed = provider
                .keep_headers
                .as_ref()
                .is_none_or(|keep| keep.iter().any(|k| k == name));
            listed
                && !CREDENTIAL_HEADERS.contains(name)
                && !provider.drop_headers.iter().any(|d| d == name)
        })
        .map(|name| {
            let values: usize = headers.get_all(name).map(|value| value.len() + 2).sum();
            (name.len() + values, name)
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut kept = serde_json::Map::new();
    let mut budget = MAX_STORED_HEADER_BYTES;
    let mut truncated = false;
    for (cost, name) in names {
        if cost > budget {
            truncated = true;
            continue;
        }
        budget -= cost;
        let values: Vec<_> = headers
            .get_all(name)
            .map(|value| String::from_utf8_lossy(value.as_bytes()))
            .collect();
        kept.insert(
            name.to_owned(),
            serde_json::Value::String(values.join(", ")),
        );
    }
    if truncated {
        kept.insert(
            TRUNCATED_MARKER.to_owned(),
            serde_json::Value::String("true".to_owned()),
        );
    }
    serde_json::Value::Object(kept)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ingest::StoreError;

    fn refused() -> ApiError {
        ApiError::not_stored(
            Arc::new(StoreError::InvalidRow(diesel::result::Error::NotFound)),
            1,
        )
    }

    fn for_now() -> ApiError {
        ApiError::not_stored(Arc::new(StoreError::Deadline), 1)
    }

    #[test]
    fn a_batch_with_an_item_not_stored_for_now_is_answered_so_whatever_its_place() {
        assert_eq!(the_batch_answer(None, refused()).code(), refused().code());
        assert_eq!(
            the_batch_answer(Some(refused()), for_now()).code(),
            for_now().code()
        );
        assert_eq!(
            the_batch_answer(Some(for_now()), refused()).code(),
            for_now().code()
        );
        assert_ne!(refused().code(), for_now().code());
    }
}

//! The HTTP forward handler: POSTs the exact body and the original headers to an internal
//! service, with `Idempotency-Key: {provider}:{event_id}` so the service can apply the
//! event once even when a retry repeats the request.
//!
//! 2xx is success; 408, 429, 5xx, timeouts and connection failures are retried; any other
//! status is permanent (the event goes to dead letters for an operator).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use diesel_async::AsyncPgConnection;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::Semaphore;

use crate::handler::{Event, Handled, Handler, HandlerError};

/// Headers that describe the original connection, not the event: never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "expect",
];

/// Settings of one forward target.
#[derive(Debug, Clone)]
pub struct ForwardSettings {
    /// Where to POST.
    pub url: reqwest::Url,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Connection timeout.
    pub connect_timeout: Duration,
    /// Requests in flight at once to this target.
    pub max_in_flight: usize,
}

/// Forwards events to an HTTP endpoint.
#[derive(Debug, Clone)]
pub struct Forward {
    client: reqwest::Client,
    settings: ForwardSettings,
    slots: Arc<Semaphore>,
}

impl Forward {
    /// A forwarder with its own connection pool.
    pub fn new(settings: ForwardSettings) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.connect_timeout)
            .pool_max_idle_per_host(settings.max_in_flight)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        let slots = Arc::new(Semaphore::new(settings.max_in_flight.max(1)));
        Ok(Self {
            client,
            settings,
            slots,
        })
    }

    fn headers(event: &Event) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(stored) = event.headers.as_object() {
            for (name, value) in stored {
                let Some(value) = value.as_str() else {
                    continue;
                };
                if HOP_BY_HOP.contains(&name.as_str()) {
                    continue;
                }
                if let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(name.as_bytes()),
                    HeaderValue::from_str(value),
                ) {
                    headers.append(name, value);
                }
            }
        }
        let key = format!("{}:{}", event.provider, event.event_id);
        if let Ok(key) = HeaderValue::from_str(&key) {
            headers.insert("idempotency-key", key);
        }
        headers
    }
}

/// Whether an HTTP status means "try again later".
pub fn is_retryable_status(status: reqwest::StatusCode) -> bool {
    status == reqwest::StatusCode::REQUEST_TIMEOUT
        || status == reqwest::StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

#[async_trait]
impl Handler for Forward {
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| HandlerError::Retryable("forwarder closed".into()))?;
        let response = self
            .client
            .post(self.settings.url.clone())
            .headers(Self::headers(event))
            .body(event.body.clone())
            .send()
            .await
            .map_err(|err| {
                // The URL is configuration, not a secret, but keep the message short.
                let kind = if err.is_timeout() {
                    "timed out"
                } else if err.is_connect() {
                    "connection failed"
                } else {
                    "request failed"
                };
                HandlerError::Retryable(format!("forward to {}: {kind}", self.settings.url))
            })?;
        let status = response.status();
        if status.is_success() {
            Ok(Handled::Applied)
        } else if is_retryable_status(status) {
            Err(HandlerError::Retryable(format!(
                "forward to {} answered {status}",
                self.settings.url
            )))
        } else {
            Err(HandlerError::Permanent(format!(
                "forward to {} answered {status}",
                self.settings.url
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;

    #[test]
    fn retryable_statuses_are_408_429_and_5xx() {
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(
                is_retryable_status(StatusCode::from_u16(code).unwrap_or_default()),
                "{code}"
            );
        }
        for code in [400, 401, 403, 404, 409, 410, 422] {
            assert!(
                !is_retryable_status(StatusCode::from_u16(code).unwrap_or_default()),
                "{code}"
            );
        }
    }

    #[test]
    fn forwarded_headers_drop_hop_by_hop_and_add_the_idempotency_key() {
        let event = Event {
            id: 1,
            provider: "stripe".into(),
            event_id: "evt_1".into(),
            event_type: None,
            headers: serde_json::json!({
                "host": "inbox.example",
                "content-length": "12",
                "stripe-signature": "t=1,v1=ab",
                "content-type": "application/json",
            }),
            body: b"{}".to_vec(),
            attempt: 1,
            received_at: chrono::Utc::now(),
        };
        let headers = Forward::headers(&event);
        assert_eq!(
            headers.get("idempotency-key").map(|v| v.as_bytes()),
            Some(&b"stripe:evt_1"[..])
        );
        assert_eq!(
            headers.get("stripe-signature").map(|v| v.as_bytes()),
            Some(&b"t=1,v1=ab"[..])
        );
        assert!(headers.get("host").is_none());
        assert!(headers.get("content-length").is_none());
    }
}

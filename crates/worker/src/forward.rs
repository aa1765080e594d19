//! The HTTP forward handler: POSTs the exact body and the original headers to an internal
//! service, with `Idempotency-Key: {provider}:{event_id}` so the service can apply the
//! event once even when a retry repeats the request.
//!
//! 2xx is success; 408, 429, 5xx, timeouts and connection failures are retried; any other
//! status is permanent (the event goes to dead letters for an operator). A 429 or 503 with
//! `Retry-After` is retried no earlier than it asks (within the retry cap).
//!
//! `https://` targets use rustls with the system's root certificates or the route's CA file,
//! and a client certificate when the route names one.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use diesel_async::AsyncPgConnection;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::Semaphore;

use crate::handler::{Event, Handled, Handler, HandlerError, OutsideWork};
use crate::tls::{self, client_config, TlsError, TlsSettings};

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
    /// Trust anchors and client identity for `https://` targets.
    pub tls: TlsSettings,
}

/// Why a forwarder could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The TLS configuration (CA file, client certificate) is unusable.
    #[error("tls: {0}")]
    Tls(#[from] TlsError),
    /// The HTTP client refused its settings.
    #[error("http client: {0}")]
    Client(#[from] reqwest::Error),
}

/// Forwards events to an HTTP endpoint.
#[derive(Debug, Clone)]
pub struct Forward {
    client: reqwest::Client,
    settings: ForwardSettings,
    /// The URL as error messages show it: no credentials, no query string.
    target: String,
    slots: Arc<Semaphore>,
}

impl Forward {
    /// A forwarder with its own connection pool (and, for `https://`, its own TLS
    /// configuration).
    pub fn new(settings: ForwardSettings) -> Result<Self, ForwardError> {
        let mut builder = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.connect_timeout)
            .pool_max_idle_per_host(settings.max_in_flight)
            .redirect(reqwest::redirect::Policy::none());
        if settings.url.scheme() == "https" {
            builder = builder
                .use_preconfigured_tls(client_config(&settings.tls)?)
                .https_only(true);
        }
        let client = builder.build()?;
        let slots = Arc::new(Semaphore::new(settings.max_in_flight.max(1)));
        Ok(Self {
            client,
            target: target_of(&settings.url),
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

    /// A request that got no answer, as a retryable error naming the target; TLS failures
    /// say what was wrong with the certificate.
    fn unanswered(&self, err: &reqwest::Error) -> HandlerError {
        let host = self.settings.url.host_str().unwrap_or("?");
        let kind = if let Some(tls) = tls::describe_failure(err, host) {
            tls
        } else if err.is_timeout() {
            "timed out".to_owned()
        } else if err.is_connect() {
            "connection failed".to_owned()
        } else {
            "request failed".to_owned()
        };
        HandlerError::Retryable(format!("forward to {}: {kind}", self.target))
    }

    /// The handler's verdict on an answer.
    fn verdict(&self, response: &reqwest::Response) -> Result<Handled, HandlerError> {
        let status = response.status();
        let answered = format!("forward to {} answered {status}", self.target);
        if status.is_success() {
            Ok(Handled::Applied)
        } else if let Some(after) = honoured_retry_after(response, SystemTime::now()) {
            Err(HandlerError::RetryAfter {
                reason: format!(
                    "{answered} (Retry-After {})",
                    humantime::format_duration(after)
                ),
                after,
            })
        } else if is_retryable_status(status) {
            Err(HandlerError::Retryable(answered))
        } else {
            Err(HandlerError::Permanent(answered))
        }
    }
}

/// `scheme://host[:port]/path` of a URL: what error messages and logs may show of it (user
/// info and query strings can carry credentials).
fn target_of(url: &reqwest::Url) -> String {
    let mut shown = format!("{}://{}", url.scheme(), url.host_str().unwrap_or(""));
    if let Some(port) = url.port() {
        shown.push_str(&format!(":{port}"));
    }
    shown.push_str(url.path());
    shown
}

/// Whether an HTTP status means "try again later". A redirect is one: it is not followed (the
/// body and headers would go to a place the routes file does not name), and it says the
/// route's url is out of date, which an operator fixes while the events wait their backoff.
pub fn is_retryable_status(status: reqwest::StatusCode) -> bool {
    status.is_redirection()
        || status == reqwest::StatusCode::REQUEST_TIMEOUT
        || status == reqwest::StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

/// The wait a 429 or 503 answer asks for in its `Retry-After` header, from `now`: either
/// delay-seconds or an HTTP date. `None` for other statuses and for headers that are
/// missing or unreadable (the backoff policy alone decides then).
fn honoured_retry_after(response: &reqwest::Response, now: SystemTime) -> Option<Duration> {
    let status = response.status();
    if status != reqwest::StatusCode::TOO_MANY_REQUESTS
        && status != reqwest::StatusCode::SERVICE_UNAVAILABLE
    {
        return None;
    }
    parse_retry_after(
        response
            .headers()
            .get(reqwest::header::RETRY_AFTER)?
            .to_str()
            .ok()?,
        now,
    )
}

/// Parses a `Retry-After` value (RFC 9110 10.2.3): delay-seconds or an HTTP date; a date in
/// the past means "now".
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than u64 holds is "a very long time": the retry cap bounds it anyway.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[async_trait]
impl Handler for Forward {
    /// The forward alone: it writes nothing in the transaction.
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        self.run(event).await
    }

    fn slots(&self) -> Option<Arc<Semaphore>> {
        Some(Arc::clone(&self.slots))
    }

    fn outside_work(&self) -> Option<&dyn OutsideWork> {
        Some(self)
    }
}

#[async_trait]
impl OutsideWork for Forward {
    async fn run(&self, event: &Event) -> Result<Handled, HandlerError> {
        // The worker holds one of `slots` while this runs, and no database connection.
        let response = self
            .client
            .post(self.settings.url.clone())
            .headers(Self::headers(event))
            .body(event.body.clone())
            .send()
            .await
            .map_err(|err| self.unanswered(&err))?;
        self.verdict(&response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;

    #[test]
    fn retryable_statuses_are_3xx_408_429_and_5xx() {
        for code in [301, 302, 307, 308, 408, 429, 500, 502, 503, 504] {
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
    fn retry_after_reads_seconds_and_http_dates_and_ignores_garbage() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:30:00 GMT", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past"
        );
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
        for garbage in ["", "-5", "1.5", "soon"] {
            assert_eq!(parse_retry_after(garbage, now), None, "{garbage:?}");
        }
    }

    #[test]
    fn error_messages_show_the_target_without_credentials_or_query() {
        let url = reqwest::Url::parse("https://user:pw@hooks.internal:8443/in?token=s3cret")
            .expect("a valid url");
        assert_eq!(target_of(&url), "https://hooks.internal:8443/in");
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
            ordering_key: None,
            sequence: None,
            stale: false,
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

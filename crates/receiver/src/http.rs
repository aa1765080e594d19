//! The HTTP routes: `POST /webhooks/{provider}` (and `GET` for the providers whose handshake
//! is a GET), `GET /healthz`, `GET /readyz`, and the separate `/metrics` app.
//!
//! A webhook is checked completely — size, arrival time, signature, identity — before any
//! database connection is taken, so hostile or slow clients cannot tie up the pool. Every
//! answer carries `X-Request-Id`, the id every log line of its request carries too (heads the
//! HTTP layer would refuse on its own are answered here as well: see [`crate::head_guard`]).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderMap};
use actix_web::{web, HttpMessage as _, HttpRequest, HttpResponse};
use bytes::Bytes;
use futures_util::StreamExt;
use inbox_core::db::PgPool;
use inbox_core::rejections::NewRejection;
use inbox_signature::{HandshakeKind, HeaderSource, Request, SigningKey};
use sha2::{Digest as _, Sha256};
use tracing_actix_web::RequestId;

use crate::accept::{acknowledgement, handshake_answer, store_all, stored_headers};
use crate::budget::{BodyBudget, Reservation};
use crate::error::ApiError;
use crate::identify::identify;
use crate::ingest::Ingestor;
use crate::metrics::{Metrics, UNKNOWN_PROVIDER};
use crate::providers::{FieldSource, Identity, Provider, Providers};
use crate::rejections::RejectionLog;

/// Request limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest body accepted.
    pub max_body_bytes: usize,
    /// Largest request head accepted: the request line and every header's name and value.
    pub max_head_bytes: usize,
    /// Time allowed for the whole body to arrive.
    pub body_timeout: Duration,
    /// Seconds a provider is asked to wait after a 503.
    pub retry_after_secs: u64,
}

/// Shared state of the webhook app.
#[derive(Debug)]
pub struct AppState {
    /// Configured providers.
    pub providers: Providers,
    /// The write path.
    pub ingestor: Ingestor,
    /// Metrics.
    pub metrics: Metrics,
    /// Limits.
    pub limits: Limits,
    /// Pool, for the readiness check.
    pub pool: PgPool,
    /// Body bytes in flight, shared by every request.
    pub budget: BodyBudget,
    /// Deadline of the readiness check.
    pub readiness_timeout: Duration,
    /// The last readiness check, reused for [`READINESS_CACHE`].
    pub readiness: tokio::sync::Mutex<Option<(Instant, bool)>>,
    /// The record of refusals.
    pub rejections: RejectionLog,
}

/// How long a readiness result is reused: probes, however many, cost the database at most
/// one connection check a second.
pub const READINESS_CACHE: Duration = Duration::from_secs(1);

/// Registers the webhook routes.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/webhooks/{provider}")
            .route(web::post().to(receive))
            .route(web::get().to(handshake_get))
            .default_service(web::to(method_not_allowed)),
    )
    .route("/healthz", web::get().to(healthz))
    .route("/readyz", web::get().to(readyz))
    .default_service(web::to(not_found));
}

/// Registers the metrics route (served on its own listener).
pub fn configure_metrics(cfg: &mut web::ServiceConfig) {
    cfg.route("/metrics", web::get().to(metrics));
}

/// A request's headers, as the signature schemes and the ordering read them.
pub(crate) struct RequestHeaders<'a>(pub(crate) &'a HeaderMap);

impl HeaderSource for RequestHeaders<'_> {
    fn header(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(|value| value.to_str().ok())
    }
}

async fn receive(
    request: HttpRequest,
    provider: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let arrival = Arrival::of(&request);
    let provider = state.providers.get(&provider);
    let label = provider.map_or(UNKNOWN_PROVIDER, |p| p.name.as_str());
    // The body once read, for the record of a refusal (its size and hash).
    let mut body = None;
    let result = match provider {
        Some(provider) => {
            receive_for(&request, provider, payload, &state, arrival, &mut body).await
        }
        None => Err(ApiError::UnknownProvider),
    };
    let outcome = match &result {
        Ok((_, outcome)) => outcome,
        Err(err) => {
            tracing::warn!(provider = label, code = err.code(), error = %err.chain(), "webhook rejected");
            if let Some(provider) = provider {
                record_refusal(&state, &request, provider, err, body.as_ref());
            }
            err.outcome()
        }
    };
    state
        .metrics
        .requests
        .with_label_values(&[label, outcome])
        .inc();
    result.map(|(response, _)| response)
}

async fn receive_for(
    request: &HttpRequest,
    provider: &Provider,
    payload: web::Payload,
    state: &AppState,
    arrival: Arrival,
    read: &mut Option<Bytes>,
) -> Result<(HttpResponse, &'static str), ApiError> {
    let headers = RequestHeaders(request.headers());
    check_identity_headers(request.headers(), provider)?;
    // Held until the answer: the body and its copies stay within the budget.
    let (body, _reservation) = read_body(request.headers(), payload, state).await?;
    *read = Some(body.clone());
    let url = request_url(request, provider);
    let signed = Request {
        method: "POST",
        url: &url,
        headers: &headers,
        body: &body,
    };
    let key = verify(provider, &signed, state)?;
    if let Some(reply) = provider.scheme.handshake(&signed, key) {
        return Ok((handshake_answer(reply?), "challenge"));
    }
    let events = identify(&provider.identity, &headers, &body)?;
    let deadline = state.ingestor.deadline_for(arrival.0);
    let stored = store_all(state, provider, request.headers(), &body, events, deadline).await?;
    state
        .metrics
        .ingest_duration
        .with_label_values(&[provider.name.as_str()])
        .observe(arrival.0.elapsed().as_secs_f64());
    let batch = matches!(provider.identity, Identity::Batch(_));
    Ok((acknowledgement(provider, stored, batch), stored.outcome()))
}

/// Hands a 4xx answered on `provider`'s path to the record of refusals, within its rate:
/// the kept headers, the body's size and hash (the declared size when it was not read), never
/// the body itself.
fn record_refusal(
    state: &AppState,
    request: &HttpRequest,
    provider: &Provider,
    error: &ApiError,
    body: Option<&Bytes>,
) {
    use actix_web::ResponseError as _;
    let status = error.status_code();
    if !status.is_client_error() || !state.rejections.admit(&provider.name) {
        return;
    }
    let declared = || {
        request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let request_id = request
        .extensions()
        .get::<RequestId>()
        .map_or_else(String::new, ToString::to_string);
    state.rejections.record(NewRejection {
        at: chrono::Utc::now(),
        provider: provider.name.clone(),
        cause: error.code().to_owned(),
        status: i16::try_from(status.as_u16()).unwrap_or(i16::MAX),
        request_id,
        headers: stored_headers(request.headers(), provider),
        body_bytes: body.map_or_else(declared, |b| i64::try_from(b.len()).unwrap_or(i64::MAX)),
        body_sha256: body.map(|b| Sha256::digest(b).into()),
    });
}

/// Verifies the request against the provider's keys (unless it is unsigned) and counts which
/// secret matched; returns that key.
fn verify<'p>(
    provider: &'p Provider,
    request: &Request<'_>,
    state: &AppState,
) -> Result<Option<&'p SigningKey>, ApiError> {
    if provider.unsigned {
        return Ok(None);
    }
    let verified = provider
        .scheme
        .verify(request, &provider.keys, unix_now())?;
    let secret = provider
        .key_names
        .get(verified.key_index)
        .map_or("?", String::as_str);
    state
        .metrics
        .verified_by_secret
        .with_label_values(&[provider.name.as_str(), secret])
        .inc();
    Ok(provider.keys.get(verified.key_index))
}

/// The URL the provider called: the configured `public_url` (with the request's query when it
/// has none of its own), else rebuilt from the request's scheme, `Host`, path and query.
fn request_url(request: &HttpRequest, provider: &Provider) -> String {
    let query = request.query_string();
    match &provider.public_url {
        Some(url) if url.contains('?') || query.is_empty() => url.clone(),
        Some(url) => format!("{url}?{query}"),
        None => {
            let info = request.connection_info();
            format!("{}://{}{}", info.scheme(), info.host(), request.uri())
        }
    }
}

/// `GET /webhooks/{provider}`: the GET handshakes (Meta's `hub.challenge`, Dropbox's
/// `challenge`), answered at once and never stored.
async fn handshake_get(
    request: HttpRequest,
    provider: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let Some(provider) = state.providers.get(&provider) else {
        return Err(ApiError::UnknownProvider);
    };
    if provider.profile.handshake != Some(HandshakeKind::Get) {
        return Ok(method_not_allowed().await);
    }
    let url = request_url(&request, provider);
    let headers = RequestHeaders(request.headers());
    let get = Request {
        method: "GET",
        url: &url,
        headers: &headers,
        body: b"",
    };
    let result = match provider.scheme.handshake(&get, None) {
        Some(reply) => reply.map(handshake_answer).map_err(ApiError::from),
        None => Ok(method_not_allowed().await),
    };
    let outcome = match &result {
        Ok(_) => "challenge",
        Err(err) => {
            tracing::warn!(provider = %provider.name, code = err.code(), error = %err.chain(), "handshake rejected");
            err.outcome()
        }
    };
    state
        .metrics
        .requests
        .with_label_values(&[provider.name.as_str(), outcome])
        .inc();
    result
}

/// Reads the whole body within the size and time limits and the budget of bytes in flight. A
/// declared length over the limit is refused before a byte is read; the budget is drawn on as
/// the body arrives, so a connection that declares a length and idles holds nothing of it.
async fn read_body(
    headers: &HeaderMap,
    mut payload: web::Payload,
    state: &AppState,
) -> Result<(Bytes, Reservation), ApiError> {
    let limits = &state.limits;
    let limit = limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    // Within the limit, so it fits a usize.
    let declared = declared.and_then(|length| usize::try_from(length).ok());
    let mut reservation = state.budget.empty(declared);
    // The buffer grows no further than the body can: its declared length, else the limit.
    let most = declared.map_or(limit, |length| length.min(limit));
    let mut body: Vec<u8> = Vec::new();
    let deadline = tokio::time::Instant::now() + limits.body_timeout;
    loop {
        match tokio::time::timeout_at(deadline, payload.next()).await {
            Err(_elapsed) => return Err(ApiError::BodyTimeout(limits.body_timeout)),
            Ok(None) => return Ok((Bytes::from(body), reservation)),
            Ok(Some(Err(_))) => return Err(ApiError::BodyUnreadable),
            Ok(Some(Ok(chunk))) => {
                let needed = body.len() + chunk.len();
                if needed > limit {
                    return Err(ApiError::BodyTooLarge { limit });
                }
                if needed > body.capacity() {
                    // The reservation covers the buffer, which doubles (few copies) but never
                    // past `most`.
                    let capacity = needed.max(body.capacity().saturating_mul(2).min(most));
                    let more = capacity.saturating_sub(reservation.bytes());
                    if !state.budget.grow(&mut reservation, more) {
                        state.metrics.budget_refusals.inc();
                        return Err(ApiError::Busy {
                            retry_after_secs: limits.retry_after_secs,
                        });
                    }
                    body.reserve_exact(capacity - body.len());
                }
                body.extend_from_slice(&chunk);
            }
        }
    }
}

/// A header that decides authenticity or identity must be unambiguous, and one the event id
/// is read from must be readable when present (else the next source would key the event).
fn check_identity_headers(headers: &HeaderMap, provider: &Provider) -> Result<(), ApiError> {
    let mut names: Vec<&str> = provider.scheme.signature_headers();
    let mut id_headers: Vec<&str> = Vec::new();
    if let Identity::Fields {
        event_id,
        event_type,
    } = &provider.identity
    {
        for (index, source) in event_id.iter().chain(event_type).enumerate() {
            if let FieldSource::Header(name) = source {
                names.push(name);
                if index < event_id.len() {
                    id_headers.push(name);
                }
            }
        }
    }
    for name in names {
        if headers.get_all(name).nth(1).is_some() {
            return Err(ApiError::RepeatedHeader(name.to_owned()));
        }
    }
    for name in id_headers {
        if headers
            .get(name)
            .is_some_and(|value| value.to_str().is_err())
        {
            return Err(ApiError::UnreadableHeader(name.to_owned()));
        }
    }
    Ok(())
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
        })
}

/// When a request reached the app: the start of its one `--db-deadline` budget, out of which
/// come receiving its body, verifying it, and waiting for a writer, a connection and the
/// statement. Noted by [`note_arrival`], the outermost middleware, as soon as actix hands the
/// request over: once its head (request line and headers) has been received and parsed, before
/// any byte of its body is read. Not counted, since actix shows no earlier instant: the time
/// its connection waited to be accepted (`--max-connections`), the time its head took to
/// arrive (bounded by actix's own 5 s), and, on a kept-alive connection, the time it waited
/// behind the connection's previous request.
#[derive(Debug, Clone, Copy)]
pub struct Arrival(pub tokio::time::Instant);

impl Arrival {
    /// The arrival [`note_arrival`] noted, or now for a request served without it.
    fn of(request: &HttpRequest) -> Self {
        request
            .extensions()
            .get::<Self>()
            .copied()
            .unwrap_or_else(|| Self(tokio::time::Instant::now()))
    }
}

/// Middleware, to be the outermost: notes the request's [`Arrival`].
pub fn note_arrival<S, B>(request: ServiceRequest, service: &S) -> S::Future
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    request
        .extensions_mut()
        .insert(Arrival(tokio::time::Instant::now()));
    service.call(request)
}

/// Response header carrying the request id that every log line of the request also carries,
/// so a provider's delivery report can be matched with the receiver's logs.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Middleware: copies the request id of the tracing span (set by `TracingLogger`, which must
/// wrap this one) into the `X-Request-Id` response header.
pub fn echo_request_id<S>(
    request: ServiceRequest,
    service: &S,
) -> impl std::future::Future<Output = Result<ServiceResponse, actix_web::Error>>
where
    S: Service<ServiceRequest, Response = ServiceResponse, Error = actix_web::Error>,
{
    let request_id = request.extensions().get::<RequestId>().copied();
    let response = service.call(request);
    async move {
        let mut response = response.await?;
        if let Some(value) =
            request_id.and_then(|id| header::HeaderValue::from_str(&id.to_string()).ok())
        {
            response
                .headers_mut()
                .insert(header::HeaderName::from_static(REQUEST_ID_HEADER), value);
        }
        Ok(response)
    }
}

/// Middleware: a request whose head (request line and headers) exceeds `max_head_bytes` is
/// answered 431 before any handler runs; the HTTP layer's own limit (128 KiB, see
/// [`crate::head_guard`]) is far above what any provider sends.
pub fn limit_head<S>(
    request: ServiceRequest,
    service: &S,
) -> futures_util::future::Either<
    S::Future,
    std::future::Ready<Result<ServiceResponse, actix_web::Error>>,
>
where
    S: Service<ServiceRequest, Response = ServiceResponse, Error = actix_web::Error>,
{
    let limit = request
        .app_data::<web::Data<AppState>>()
        .map(|state| state.limits.max_head_bytes);
    let size = head_bytes(request.request());
    match limit {
        Some(limit) if size > limit => {
            tracing::warn!(size, limit, "request head too large");
            let answer =
                actix_web::ResponseError::error_response(&ApiError::HeadTooLarge { limit });
            futures_util::future::Either::Right(std::future::ready(Ok(
                request.into_response(answer)
            )))
        }
        _ => futures_util::future::Either::Left(service.call(request)),
    }
}

/// The bytes of a request head as sent: request line, and `name: value\r\n` per header.
fn head_bytes(request: &HttpRequest) -> usize {
    let line = request.method().as_str().len() + request.uri().to_string().len() + 12;
    request.headers().iter().fold(line, |total, (name, value)| {
        total + name.as_str().len() + value.len() + 4
    })
}

async fn method_not_allowed() -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .insert_header((header::ALLOW, "POST"))
        .json(serde_json::json!({
            "code": "method_not_allowed",
            "detail": "webhooks are delivered with POST",
        }))
}

async fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(serde_json::json!({
        "code": "not_found",
        "detail": "no such route; webhooks go to POST /webhooks/{provider}",
    }))
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "alive" }))
}

async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    if database_ready(&state).await {
        HttpResponse::Ok().json(serde_json::json!({ "status": "ready" }))
    } else {
        HttpResponse::ServiceUnavailable()
            .insert_header((
                header::RETRY_AFTER,
                state.limits.retry_after_secs.to_string(),
            ))
            .json(serde_json::json!({ "status": "database unreachable" }))
    }
}

/// Whether the database answers, checked at most once per [`READINESS_CACHE`]: concurrent
/// probes wait for the one check in flight and share its result.
async fn database_ready(state: &AppState) -> bool {
    let mut last = state.readiness.lock().await;
    if let Some((checked, ready)) = *last {
        if checked.elapsed() < READINESS_CACHE {
            return ready;
        }
    }
    state.metrics.readiness_checks.inc();
    let check = async {
        let mut conn = state.pool.get().await.ok()?;
        diesel_async::RunQueryDsl::execute(diesel::sql_query("SELECT 1"), &mut *conn)
            .await
            .ok()
    };
    let ready = matches!(
        tokio::time::timeout(state.readiness_timeout, check).await,
        Ok(Some(_))
    );
    *last = Some((Instant::now(), ready));
    ready
}

async fn metrics(metrics: web::Data<Metrics>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(inbox_core::metrics::CONTENT_TYPE)
        .body(metrics.render())
}

//! The span every request's log lines are written in: `tracing-actix-web`'s fields, except
//! that the target keeps its query's parameter names but never their values.
//!
//! A query can carry a configured secret or a sender's data: Meta's handshake sends the
//! receiver its `verify_token` as `GET /webhooks/meta?hub.verify_token=...`, and the console's
//! event filter carries what an operator searches the bodies for (an e-mail address, an
//! account number). The default span records the whole target, and every line logged inside
//! the request would print it. Names are kept so that a log still says what was sent.
//!
//! Built with the `http` feature, by the binaries that serve requests with actix-web.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Version;
use actix_web::HttpMessage as _;
use tracing::Span;
use tracing_actix_web::{DefaultRootSpanBuilder, RequestId, RootSpanBuilder};

/// What a query parameter's value is replaced with in the recorded target.
pub const REDACTED: &str = "[redacted]";

/// The [`RootSpanBuilder`] of the receiver's and the console's apps:
/// [`DefaultRootSpanBuilder`]'s fields, with the target's query values redacted
/// ([`redacted_target`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestSpan;

impl RootSpanBuilder for RequestSpan {
    fn on_request_start(request: &ServiceRequest) -> Span {
        let method = request.method().as_str().to_owned();
        let route = request.match_pattern().unwrap_or_else(|| "default".into());
        let user_agent = request
            .headers()
            .get(actix_web::http::header::USER_AGENT)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        let request_id = request
            .extensions()
            .get::<RequestId>()
            .map(ToString::to_string)
            .unwrap_or_default();
        let connection = request.connection_info();
        tracing::info_span!(
            "HTTP request",
            http.method = %method,
            http.route = %route,
            http.flavor = flavor(request.version()),
            http.scheme = %connection.scheme(),
            http.host = %connection.host(),
            http.client_ip = %connection.realip_remote_addr().unwrap_or_default(),
            http.user_agent = %user_agent,
            http.target = %redacted_target(request.path(), request.query_string()),
            http.status_code = tracing::field::Empty,
            otel.name = %format!("{method} {route}"),
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            request_id = %request_id,
            exception.message = tracing::field::Empty,
            exception.details = tracing::field::Empty,
        )
    }

    fn on_request_end<B: MessageBody>(
        span: Span,
        outcome: &Result<ServiceResponse<B>, actix_web::Error>,
    ) {
        DefaultRootSpanBuilder::on_request_end(span, outcome);
    }
}

/// `path`, then the query's parameter names in order, each value replaced by [`REDACTED`]:
/// `/webhooks/meta?hub.mode=[redacted]&hub.verify_token=[redacted]`.
#[must_use]
pub fn redacted_target(path: &str, query: &str) -> String {
    if query.is_empty() {
        return path.to_owned();
    }
    let mut target = String::with_capacity(path.len() + query.len());
    target.push_str(path);
    for (index, parameter) in query.split('&').enumerate() {
        target.push(if index == 0 { '?' } else { '&' });
        match parameter.split_once('=') {
            Some((name, _value)) => {
                target.push_str(name);
                target.push('=');
                target.push_str(REDACTED);
            }
            // A bare name (`?flag`) has no value to hide.
            None => target.push_str(parameter),
        }
    }
    target
}

fn flavor(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_11 => "1.1",
        Version::HTTP_2 => "2.0",
        Version::HTTP_3 => "3.0",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Log output, shared with the subscriber that writes it.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }

    /// Logs "handshake rejected" inside its request, as the GET handshake does.
    async fn refuse() -> actix_web::HttpResponse {
        tracing::warn!("handshake rejected");
        actix_web::HttpResponse::Forbidden().finish()
    }

    #[actix_web::test]
    async fn a_warning_inside_a_request_never_prints_its_query_values() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        // The test runtime is single-threaded: the request runs on this thread.
        let _default = tracing::subscriber::set_default(subscriber);
        let app = actix_web::test::init_service(
            actix_web::App::new()
                .route("/webhooks/{provider}", actix_web::web::get().to(refuse))
                .wrap(tracing_actix_web::TracingLogger::<RequestSpan>::new()),
        )
        .await;
        let request = actix_web::test::TestRequest::get()
            .uri("/webhooks/meta?hub.mode=subscribe&hub.verify_token=TOKEN-7f3a&hub.challenge=42")
            .to_request();
        let answer = actix_web::test::call_service(&app, request).await;
        assert_eq!(answer.status(), 403);
        let logged = captured.text();
        assert!(logged.contains("handshake rejected"), "{logged}");
        assert!(
            logged.contains(
                "/webhooks/meta?hub.mode=[redacted]&hub.verify_token=[redacted]&hub.challenge=[redacted]"
            ),
            "{logged}"
        );
        assert!(!logged.contains("TOKEN-7f3a"), "secret logged: {logged}");
        assert!(!logged.contains("subscribe"), "value logged: {logged}");
    }

    #[test]
    fn targets_keep_their_path_and_parameter_names() {
        assert_eq!(redacted_target("/webhooks/x", ""), "/webhooks/x");
        assert_eq!(
            redacted_target("/webhooks/x", "a=1&flag&b=&c=x=y"),
            "/webhooks/x?a=[redacted]&flag&b=[redacted]&c=[redacted]"
        );
    }
}

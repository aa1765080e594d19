//! The routes file: which handler runs for which provider and event type, configured without
//! writing Rust.
//!
//! ```toml
//! [[routes]]                               # first match wins
//! provider = "stripe"                      # optional: "*" (default), exact, or "prefix*"
//! event_type = "payment_intent.*"          # optional, same patterns
//! handler = "forward"
//! url = "http://payments.internal/webhooks/stripe"
//! timeout = "10s"                          # optional (default 10s)
//! connect_timeout = "2s"                   # optional (default 2s)
//! max_in_flight = 32                       # optional (default 32)
//! ca_file = "internal-ca.pem"              # optional: trust this CA instead of the system roots
//! client_cert = "worker.pem"               # optional, with client_key: mutual TLS
//! client_key = "worker-key.pem"
//!
//! [[routes]]
//! handler = "demo"                         # the demo ledger and payments handler
//! statement_timeout = "5s"                 # optional, any handler: bounds on the database
//! lock_timeout = "1s"                      # time of each attempt (default: the worker's)
//! ```
//!
//! Events no route matches are completed as ignored (and counted), never retried. Relative
//! file names are relative to the routes file's directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::demo::DemoLedger;
use crate::forward::{Forward, ForwardSettings};
use crate::handler::Router;
use crate::limits::DatabaseLimits;
use crate::tls::{ClientIdentity, TlsSettings};

/// Default forward timeout.
pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// Default forward connection timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default concurrent requests per forward target.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

/// Why the routes file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum RoutesError {
    /// Unreadable file.
    #[error("cannot read routes file {path}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Invalid content.
    #[error("routes file {path} is invalid: {message}")]
    Invalid {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutesFile {
    #[serde(default)]
    routes: Vec<RouteSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteSpec {
    provider: Option<String>,
    event_type: Option<String>,
    handler: HandlerKind,
    url: Option<String>,
    timeout: Option<String>,
    connect_timeout: Option<String>,
    max_in_flight: Option<usize>,
    ca_file: Option<PathBuf>,
    client_cert: Option<PathBuf>,
    client_key: Option<PathBuf>,
    statement_timeout: Option<String>,
    lock_timeout: Option<String>,
}

impl RouteSpec {
    fn has_forward_settings(&self) -> bool {
        self.url.is_some()
            || self.timeout.is_some()
            || self.connect_timeout.is_some()
            || self.max_in_flight.is_some()
            || self.ca_file.is_some()
            || self.client_cert.is_some()
            || self.client_key.is_some()
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum HandlerKind {
    Demo,
    Forward,
}

/// The longest duration a route may set: PostgreSQL refuses timeouts over about 24 days, and
/// an attempt longer than a day holds its event, its slot and its lease that long.
const LONGEST_ROUTE_DURATION: Duration = Duration::from_secs(24 * 3600);

/// A route's duration setting `name`, if given: above zero (a zero timeout fails every attempt)
/// and at most [`LONGEST_ROUTE_DURATION`].
fn route_duration(text: Option<&str>, name: &str) -> Result<Option<Duration>, String> {
    text.map(|t| match humantime::parse_duration(t) {
        Ok(duration) if duration.is_zero() => Err(format!("{name} must be above zero")),
        Ok(duration) if duration > LONGEST_ROUTE_DURATION => Err(format!(
            "{name} {t:?} is longer than {}",
            humantime::format_duration(LONGEST_ROUTE_DURATION)
        )),
        Ok(duration) => Ok(duration),
        Err(e) => Err(format!("{name} {t:?}: {e}")),
    })
    .transpose()
}

/// The forward settings of one route; `base` is the routes file's directory.
fn forward_settings(route: RouteSpec, base: &Path) -> Result<ForwardSettings, String> {
    let url = route
        .url
        .ok_or_else(|| "handler \"forward\" needs a url".to_owned())?;
    // The url may carry credentials: the error names only what is wrong with it.
    let url = reqwest::Url::parse(&url).map_err(|err| format!("url: {err}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("url must be http or https".into());
    }
    let tls_settings = url.scheme() == "https";
    if !tls_settings && (route.ca_file.is_some() || route.client_cert.is_some()) {
        return Err("ca_file and client_cert apply to https urls only".into());
    }
    let client_identity = match (route.client_cert, route.client_key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some(ClientIdentity {
            cert_file: base.join(cert),
            key_file: base.join(key),
        }),
        _ => return Err("client_cert and client_key go together".into()),
    };
    Ok(ForwardSettings {
        url,
        timeout: route_duration(route.timeout.as_deref(), "timeout")?
            .unwrap_or(DEFAULT_FORWARD_TIMEOUT),
        connect_timeout: route_duration(route.connect_timeout.as_deref(), "connect_timeout")?
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        max_in_flight: route.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT).max(1),
        tls: TlsSettings {
            ca_file: route.ca_file.map(|file| base.join(file)),
            client_identity,
        },
    })
}

/// The route's own database timeouts.
fn limits_of(route: &RouteSpec) -> Result<DatabaseLimits, String> {
    Ok(DatabaseLimits {
        statement_timeout: route_duration(route.statement_timeout.as_deref(), "statement_timeout")?,
        lock_timeout: route_duration(route.lock_timeout.as_deref(), "lock_timeout")?,
    })
}

/// The handler one route names.
fn handler_of(route: RouteSpec, base: &Path) -> Result<Arc<dyn crate::Handler>, String> {
    match route.handler {
        HandlerKind::Demo if route.has_forward_settings() => {
            Err("the demo handler takes no url or forward settings".into())
        }
        HandlerKind::Demo => Ok(Arc::new(DemoLedger)),
        HandlerKind::Forward => {
            let forward =
                Forward::new(forward_settings(route, base)?).map_err(|e| e.to_string())?;
            Ok(Arc::new(forward))
        }
    }
}

/// Builds a router from routes file text; `path` names the file in errors and anchors its
/// relative file names.
pub fn parse_routes(text: &str, path: &Path) -> Result<Router, RoutesError> {
    let invalid = |message: String| RoutesError::Invalid {
        path: path.to_owned(),
        message,
    };
    let file: RoutesFile = toml::from_str(text).map_err(|err| invalid(err.message().to_owned()))?;
    let base = path.parent().unwrap_or(Path::new(""));
    let mut router = Router::new();
    for (index, route) in file.routes.into_iter().enumerate() {
        let provider = route.provider.clone();
        let event_type = route.event_type.clone();
        let number = index + 1;
        let limits =
            limits_of(&route).map_err(|message| invalid(format!("route #{number}: {message}")))?;
        let handler = handler_of(route, base)
            .map_err(|message| invalid(format!("route #{number}: {message}")))?;
        router =
            router.route_with_limits(provider.as_deref(), event_type.as_deref(), handler, limits);
    }
    Ok(router)
}

/// Reads and builds the routes file.
pub fn load_routes(path: &Path) -> Result<Router, RoutesError> {
    let text = std::fs::read_to_string(path).map_err(|source| RoutesError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_routes(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_and_demo_routes_parse_and_route_in_order() {
        let router = parse_routes(
            r#"
            [[routes]]
            provider = "stripe"
            event_type = "payment_intent.*"
            handler = "forward"
            url = "http://127.0.0.1:9/hooks"
            timeout = "3s"
            [[routes]]
            handler = "demo"
            "#,
            Path::new("routes.toml"),
        )
        .expect("valid routes");
        assert!(router
            .handler_for("stripe", Some("payment_intent.created"))
            .is_some());
        assert!(router.handler_for("github", Some("push")).is_some());
    }

    #[test]
    fn zero_or_overlong_route_durations_are_refused_by_name() {
        let path = Path::new("routes.toml");
        let forward = "[[routes]]\nhandler = \"forward\"\nurl = \"http://127.0.0.1:9/\"\n";
        for (setting, expected) in [
            ("timeout = \"0s\"", "timeout must be above zero"),
            (
                "connect_timeout = \"0s\"",
                "connect_timeout must be above zero",
            ),
            (
                "timeout = \"2days\"",
                "timeout \"2days\" is longer than 1day",
            ),
            (
                "statement_timeout = \"30days\"",
                "statement_timeout \"30days\" is longer",
            ),
            ("lock_timeout = \"0ms\"", "lock_timeout must be above zero"),
        ] {
            let err = parse_routes(&format!("{forward}{setting}\n"), path).expect_err(setting);
            assert!(err.to_string().contains(expected), "{setting}: {err}");
        }
        assert!(parse_routes(&format!("{forward}timeout = \"1day\"\n"), path).is_ok());
    }

    #[test]
    fn a_bad_url_is_refused_without_echoing_its_credentials() {
        let err = parse_routes(
            "[[routes]]\nhandler = \"forward\"\nurl = \"https://svc:hunter2@payments.internal:99999/in?token=abc\"\n",
            Path::new("routes.toml"),
        )
        .expect_err("a port out of range");
        let message = err.to_string();
        assert!(message.contains("invalid port"), "{message}");
        assert!(
            !message.contains("hunter2") && !message.contains("token=abc"),
            "{message}"
        );
    }

    #[test]
    fn bad_urls_unknown_handlers_and_unknown_fields_are_rejected() {
        let path = Path::new("routes.toml");
        let err = parse_routes(
            "[[routes]]\nhandler = \"forward\"\nurl = \"ftp://x\"\n",
            path,
        )
        .expect_err("ftp url");
        assert!(err.to_string().contains("http or https"), "{err}");
        let err =
            parse_routes("[[routes]]\nhandler = \"email\"\n", path).expect_err("unknown handler");
        assert!(err.to_string().contains("email"), "{err}");
        let err = parse_routes("[[routes]]\nhandler = \"forward\"\n", path).expect_err("no url");
        assert!(err.to_string().contains("url"), "{err}");
        let err = parse_routes(
            "[[routes]]\nhandler = \"forward\"\nurl = \"https://x\"\nclient_cert = \"c.pem\"\n",
            path,
        )
        .expect_err("a certificate without its key");
        assert!(err.to_string().contains("client_key"), "{err}");
        let err = parse_routes(
            "[[routes]]\nhandler = \"forward\"\nurl = \"https://x\"\nca_file = \"missing-ca.pem\"\n",
            Path::new("/etc/worker/routes.toml"),
        )
        .expect_err("a CA file that is not there");
        assert!(
            err.to_string().contains("/etc/worker/missing-ca.pem"),
            "relative to the routes file: {err}"
        );
    }
}

//! What both binaries' metrics have in common: a private registry with the `inbox_` prefix,
//! process metrics (CPU, resident memory), and the text exposition Prometheus scrapes.

use prometheus::{Encoder, IntCounterVec, Opts, Registry, TextEncoder};

/// Prefix of every metric the project exports.
pub const PREFIX: &str = "inbox";

/// A registry with the common prefix and the process collector registered.
pub fn new_registry() -> Registry {
    let registry =
        Registry::new_custom(Some(PREFIX.to_owned()), None).unwrap_or_else(|_| Registry::new());
    #[cfg(target_os = "linux")]
    {
        // Registered unprefixed, under the conventional `process_` names.
        let collector = prometheus::process_collector::ProcessCollector::for_self();
        let _duplicate = prometheus::default_registry().register(Box::new(collector));
    }
    registry
}

/// A counter with `labels`, registered in `registry`. Metric definitions are constants of the
/// code: a malformed or twice-registered one is a bug found by the first test that builds it.
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|err| panic!("metric {name} is malformed: {err}"));
    registry
        .register(Box::new(metric.clone()))
        .unwrap_or_else(|err| panic!("metric {name} registered twice: {err}"));
    metric
}

/// The text exposition of `registry` plus the process metrics.
pub fn render(registry: &Registry) -> Vec<u8> {
    let mut families = registry.gather();
    families.extend(prometheus::default_registry().gather());
    let mut buffer = Vec::with_capacity(16 * 1024);
    // Encoding into a Vec cannot fail for well-formed families; an empty page is the fallback.
    let _ = TextEncoder::new().encode(&families, &mut buffer);
    buffer
}

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

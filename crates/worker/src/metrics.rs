//! The worker's Prometheus metrics.

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry};

/// Every metric of the worker; cheap to clone.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    /// `inbox_worker_events_total{provider,event_type,outcome}`: attempts finished, by outcome
    /// (done, ignored, retry, dead, lease_lost).
    pub events: IntCounterVec,
    /// `inbox_worker_handler_duration_seconds{provider}`: handler plus completion time.
    pub handler_duration: HistogramVec,
    /// `inbox_worker_lease_lost_total`: completions refused because the lease had been lost.
    pub lease_lost: IntCounter,
    /// `inbox_worker_rescued_total{to}`: expired leases returned to ready or dead-lettered.
    pub rescued: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn register<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .unwrap_or_else(|err| panic!("worker metric registered twice: {err}"));
    metric
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = inbox_core::metrics::new_registry();
        let events = IntCounterVec::new(
            Opts::new(
                "worker_events_total",
                "Event attempts finished, by provider, event type and outcome.",
            ),
            &["provider", "event_type", "outcome"],
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let handler_duration = HistogramVec::new(
            HistogramOpts::new(
                "worker_handler_duration_seconds",
                "Time spent handling and completing one event.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ]),
            &["provider"],
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let lease_lost = IntCounter::new(
            "worker_lease_lost_total",
            "Completions refused because the lease had expired and been taken over.",
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let rescued = IntCounterVec::new(
            Opts::new(
                "worker_rescued_total",
                "Expired leases (crashed or stalled workers) returned to ready or dead-lettered.",
            ),
            &["to"],
        )
        .unwrap_or_else(|err| panic!("{err}"));
        Self {
            events: register(&registry, events),
            handler_duration: register(&registry, handler_duration),
            lease_lost: register(&registry, lease_lost),
            rescued: register(&registry, rescued),
            registry,
        }
    }

    /// Counts one finished attempt.
    pub fn count(&self, provider: &str, event_type: Option<&str>, outcome: &str) {
        self.events
            .with_label_values(&[provider, event_type.unwrap_or(""), outcome])
            .inc();
    }

    /// The registry, for gauges registered elsewhere.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The text exposition for Prometheus.
    pub fn render(&self) -> Vec<u8> {
        inbox_core::metrics::render(&self.registry)
    }
}

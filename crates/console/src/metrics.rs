//! The console's Prometheus metrics. Labels are bounded: the route is the matched pattern
//! (never a path with an id in it), outcomes and actions are fixed words.

use inbox_core::metrics::counter_vec as counter;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Registry};

/// Every metric of the console; cheap to clone.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    /// `inbox_console_requests_total{route,status}`: pages and actions answered.
    pub requests: IntCounterVec,
    /// `inbox_console_request_duration_seconds{route}`: time to answer.
    pub request_duration: HistogramVec,
    /// `inbox_console_logins_total{outcome}`: login attempts (ok, refused, throttled).
    pub logins: IntCounterVec,
    /// `inbox_console_repairs_total{action}`: repair actions taken (replay, replay_filter,
    /// pause, resume, abort, skip, release_replay).
    pub repairs: IntCounterVec,
    /// `inbox_console_refusals_total{reason}`: state changes refused (csrf, role, read_only).
    pub refusals: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = inbox_core::metrics::new_registry();
        let requests = counter(
            &registry,
            "console_requests_total",
            "Console requests answered, by route pattern and status code.",
            &["route", "status"],
        );
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "console_request_duration_seconds",
                "Time to answer a console request, by route pattern.",
            )
            .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0]),
            &["route"],
        )
        .unwrap_or_else(|err| panic!("request duration metric is malformed: {err}"));
        registry
            .register(Box::new(request_duration.clone()))
            .unwrap_or_else(|err| panic!("request duration registered twice: {err}"));
        let logins = counter(
            &registry,
            "console_logins_total",
            "Login attempts, by outcome (ok, refused, throttled: too many failures, password not checked).",
            &["outcome"],
        );
        let repairs = counter(
            &registry,
            "console_repairs_total",
            "Repair actions taken, by action.",
            &["action"],
        );
        let refusals = counter(
            &registry,
            "console_refusals_total",
            "State changes refused, by reason (csrf, role, read_only).",
            &["reason"],
        );
        Self {
            registry,
            requests,
            request_duration,
            logins,
            repairs,
            refusals,
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        inbox_core::metrics::render(&self.registry)
    }
}

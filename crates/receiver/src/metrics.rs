//! The receiver's Prometheus metrics. Labels are bounded: provider is a configured name (or
//! `unknown`), outcome a fixed word, secret a configured label; never a value from a request.

use inbox_core::metrics::counter_vec as counter;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry,
};

use crate::ingest::StoreError;

/// Provider label for requests to a provider that is not configured.
pub const UNKNOWN_PROVIDER: &str = "unknown";

/// Every metric of the receiver; cheap to clone.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    /// `inbox_receiver_requests_total{provider,outcome}`: webhook requests answered, by outcome
    /// (accepted, duplicate, challenge, unauthorized, bad_request, too_large, timeout,
    /// unavailable, unstorable, not_found).
    pub requests: IntCounterVec,
    /// `inbox_receiver_ingest_duration_seconds{provider}`: from the request's arrival to its
    /// answer, for requests that reached the database.
    pub ingest_duration: HistogramVec,
    /// `inbox_receiver_batch_size`: events per insert statement.
    pub batch_size: Histogram,
    /// `inbox_receiver_ingest_queue_events`: events handed to group commit and not yet taken
    /// by a writer (a backlog here means the database is slower than the traffic).
    pub ingest_queue: IntGauge,
    /// `inbox_receiver_db_errors_total{kind}`: failed writes (no_connection, deadline, query,
    /// overloaded, shutting_down: answered 503; invalid_row: one event refused with 422).
    pub db_errors: IntCounterVec,
    /// `inbox_receiver_statements_cancelled_total`: insert statements abandoned because every
    /// request of their batch gave up (or the deadline passed), and cancelled on the server.
    pub statements_cancelled: IntCounter,
    /// `inbox_receiver_readiness_checks_total`: database checks made for `/readyz` (at most
    /// about one a second, whatever the probe rate).
    pub readiness_checks: IntCounter,
    /// `inbox_receiver_body_bytes_in_flight`: body bytes reserved by requests being received
    /// or stored (at most `--max-body-bytes-in-flight`).
    pub body_bytes_in_flight: IntGauge,
    /// `inbox_receiver_body_budget_refusals_total`: requests answered 503 before their body
    /// was read, because the budget of body bytes in flight could not take it.
    pub budget_refusals: IntCounter,
    /// `inbox_receiver_duplicate_body_mismatch_total{provider}`: redeliveries of a known event
    /// id whose body differs from the stored one (a provider bug or tampering).
    pub body_mismatches: IntCounterVec,
    /// `inbox_receiver_signature_verified_total{provider,secret}`: which secret verified each
    /// request, so an old secret can be retired once it sees no traffic.
    pub verified_by_secret: IntCounterVec,
    /// `inbox_receiver_rejections_recorded_total{provider}`: refusals written to
    /// `inbox_rejections`.
    pub rejections_recorded: IntCounterVec,
    /// `inbox_receiver_rejections_unrecorded_total{provider,reason}`: refusals left out of
    /// `inbox_rejections`: over the per-provider rate (rate_limited), the writer's queue full
    /// (queue_full), or the write failed (write_failed).
    pub rejections_unrecorded: IntCounterVec,
    /// `inbox_receiver_replays_suppressed_total{provider}`: events whose body was already
    /// stored under another id of the same type within the dedup window, stored as
    /// suppressed replays and not handed to a handler.
    pub replays_suppressed: IntCounterVec,
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
            "receiver_requests_total",
            "Webhook requests answered, by provider and outcome.",
            &["provider", "outcome"],
        );
        let ingest_duration = HistogramVec::new(
            HistogramOpts::new(
                "receiver_ingest_duration_seconds",
                "Time from a webhook's arrival to its answer, for requests that reached the database.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["provider"],
        )
        .unwrap_or_else(|err| panic!("ingest histogram is malformed: {err}"));
        registry
            .register(Box::new(ingest_duration.clone()))
            .unwrap_or_else(|err| panic!("ingest histogram registered twice: {err}"));
        let batch_size = Histogram::with_opts(
            HistogramOpts::new(
                "receiver_batch_size",
                "Events written per insert statement.",
            )
            .buckets(vec![
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0,
            ]),
        )
        .unwrap_or_else(|err| panic!("batch histogram is malformed: {err}"));
        registry
            .register(Box::new(batch_size.clone()))
            .unwrap_or_else(|err| panic!("batch histogram registered twice: {err}"));
        let ingest_queue = IntGauge::new(
            "receiver_ingest_queue_events",
            "Events waiting for a group-commit writer.",
        )
        .unwrap_or_else(|err| panic!("queue gauge is malformed: {err}"));
        registry
            .register(Box::new(ingest_queue.clone()))
            .unwrap_or_else(|err| panic!("queue gauge registered twice: {err}"));
        let db_errors = counter(
            &registry,
            "receiver_db_errors_total",
            "Event writes that failed, by kind (invalid_row answered 422, the others 503).",
            &["kind"],
        );
        let statements_cancelled = IntCounter::new(
            "receiver_statements_cancelled_total",
            "Insert statements abandoned once every request of their batch had given up, and cancelled on the server.",
        )
        .unwrap_or_else(|err| panic!("cancel counter is malformed: {err}"));
        registry
            .register(Box::new(statements_cancelled.clone()))
            .unwrap_or_else(|err| panic!("cancel counter registered twice: {err}"));
        let readiness_checks = IntCounter::new(
            "receiver_readiness_checks_total",
            "Database checks made for /readyz; probes within a second share one.",
        )
        .unwrap_or_else(|err| panic!("readiness counter is malformed: {err}"));
        registry
            .register(Box::new(readiness_checks.clone()))
            .unwrap_or_else(|err| panic!("readiness counter registered twice: {err}"));
        let body_bytes_in_flight = IntGauge::new(
            "receiver_body_bytes_in_flight",
            "Request body bytes reserved by requests being received or stored.",
        )
        .unwrap_or_else(|err| panic!("body gauge is malformed: {err}"));
        registry
            .register(Box::new(body_bytes_in_flight.clone()))
            .unwrap_or_else(|err| panic!("body gauge registered twice: {err}"));
        let budget_refusals = IntCounter::new(
            "receiver_body_budget_refusals_total",
            "Requests answered 503 before their body was read: the body budget was spent.",
        )
        .unwrap_or_else(|err| panic!("budget counter is malformed: {err}"));
        registry
            .register(Box::new(budget_refusals.clone()))
            .unwrap_or_else(|err| panic!("budget counter registered twice: {err}"));
        let body_mismatches = counter(
            &registry,
            "receiver_duplicate_body_mismatch_total",
            "Redeliveries of a known event id whose body differs from the stored one.",
            &["provider"],
        );
        let verified_by_secret = counter(
            &registry,
            "receiver_signature_verified_total",
            "Requests verified, by provider and the configured secret that matched.",
            &["provider", "secret"],
        );
        let rejections_recorded = counter(
            &registry,
            "receiver_rejections_recorded_total",
            "Refusals (4xx on a configured provider's path) written to inbox_rejections.",
            &["provider"],
        );
        let rejections_unrecorded = counter(
            &registry,
            "receiver_rejections_unrecorded_total",
            "Refusals left out of inbox_rejections, by reason (rate_limited, queue_full, write_failed).",
            &["provider", "reason"],
        );
        let replays_suppressed = counter(
            &registry,
            "receiver_replays_suppressed_total",
            "Events stored as suppressed replays: a body already stored under another id within the dedup window.",
            &["provider"],
        );
        Self {
            registry,
            requests,
            ingest_duration,
            batch_size,
            ingest_queue,
            db_errors,
            statements_cancelled,
            readiness_checks,
            body_bytes_in_flight,
            budget_refusals,
            body_mismatches,
            verified_by_secret,
            rejections_recorded,
            rejections_unrecorded,
            replays_suppressed,
        }
    }

    /// Counts one failed write: a group of events that failed together, or one refused row.
    pub fn observe_failure(&self, error: &StoreError) {
        self.db_errors.with_label_values(&[error.kind()]).inc();
    }

    /// The text exposition for Prometheus.
    pub fn render(&self) -> Vec<u8> {
        inbox_core::metrics::render(&self.registry)
    }
}

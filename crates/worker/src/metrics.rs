//! The worker's Prometheus metrics.

use inbox_core::operations::Backlog;
use prometheus::{
    Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// Every metric of the worker; cheap to clone.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    /// `inbox_worker_events_total{provider,event_type,outcome}`: attempts finished, by outcome
    /// (done, ignored, retry, dead, lease_lost); `event_type` is the route's event type
    /// pattern (`*` for any), `other` for events no route takes.
    pub events: IntCounterVec,
    /// `inbox_worker_handler_duration_seconds{provider}`: handler plus completion time.
    pub handler_duration: HistogramVec,
    /// `inbox_worker_lease_lost_total`: completions refused because the lease had been lost.
    pub lease_lost: IntCounter,
    /// `inbox_worker_savepoint_reruns_total`: shared transactions rolled back by a failing
    /// handler and run again with a savepoint per event.
    pub savepoint_reruns: IntCounter,
    /// `inbox_worker_handed_on_total`: events of ordered keys claimed by the transaction that
    /// completed their key's previous event, and run in the same slot without a claim.
    pub handed_on: IntCounter,
    /// `inbox_worker_claims_total{found}`: claims of due events, by what they found: `none`,
    /// `some` (fewer than they asked for: every due event) or `full`. Claims that find none
    /// cost the database a round trip each.
    pub claims: IntCounterVec,
    /// `inbox_worker_rescued_total{to}`: expired leases returned to ready or dead-lettered.
    pub rescued: IntCounterVec,
    /// `inbox_worker_stale_events_total{provider,handling}`: late arrivals of ordered providers
    /// (an event of their key with a higher sequence was already done), handed to their
    /// handler marked stale (`marked`) or completed without it (`skipped`).
    pub stale: IntCounterVec,
    /// `inbox_worker_route_slot_waits`: events waiting for a slot of their route's
    /// `max_in_flight`, holding no database connection meanwhile.
    pub route_slot_waits: IntGauge,
    /// `inbox_backlog_ready`: events waiting, due now or later.
    pub backlog_ready: IntGauge,
    /// `inbox_backlog_due`: events due now; what worker replicas scale on.
    pub backlog_due: IntGauge,
    /// `inbox_backlog_processing`: events held under a lease.
    pub backlog_processing: IntGauge,
    /// `inbox_backlog_dead`: dead letters waiting for an operator.
    pub backlog_dead: IntGauge,
    /// `inbox_backlog_oldest_ready_age_seconds`: age of the oldest event not yet processed.
    pub oldest_unprocessed_age: Gauge,
    /// `inbox_ordering_blocked_keys`: ordering keys held by their dead head.
    pub blocked_keys: IntGauge,
    /// `inbox_ordering_oldest_blocked_age_seconds`: how long the longest-blocked key has been
    /// blocked (0 when none).
    pub oldest_blocked_age: Gauge,
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
                "Event attempts finished, by provider, route event type pattern (other: no route) and outcome.",
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
        let savepoint_reruns = IntCounter::new(
            "worker_savepoint_reruns_total",
            "Shared transactions rolled back by a failing handler and run again with a savepoint per event.",
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let handed_on = IntCounter::new(
            "worker_handed_on_total",
            "Events of ordered keys claimed by the transaction that completed their key's previous event.",
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let claims = IntCounterVec::new(
            Opts::new(
                "worker_claims_total",
                "Claims of due events, by what they found: none, some (every due event) or full.",
            ),
            &["found"],
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
        let stale = IntCounterVec::new(
            Opts::new(
                "worker_stale_events_total",
                "Late arrivals of ordered providers (a later event of their key was already done), marked or skipped.",
            ),
            &["provider", "handling"],
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let gauge = |name: &str, help: &str| {
            register(
                &registry,
                IntGauge::new(name, help).unwrap_or_else(|err| panic!("{err}")),
            )
        };
        let route_slot_waits = gauge(
            "worker_route_slot_waits",
            "Events waiting for a slot of their route's max_in_flight (holding no database connection).",
        );
        let backlog_ready = gauge(
            "backlog_ready",
            "Events waiting to be processed, due now or later (read from the database).",
        );
        let backlog_due = gauge(
            "backlog_due",
            "Events due for processing now: the signal to scale workers on.",
        );
        let backlog_processing = gauge("backlog_processing", "Events held under a worker's lease.");
        let backlog_dead = gauge(
            "backlog_dead",
            "Dead-lettered events waiting for an operator.",
        );
        let oldest_unprocessed_age = register(
            &registry,
            Gauge::new(
                "backlog_oldest_ready_age_seconds",
                "Age of the oldest event not yet processed (ready or processing), 0 when none.",
            )
            .unwrap_or_else(|err| panic!("{err}")),
        );
        let blocked_keys = gauge(
            "ordering_blocked_keys",
            "Ordering keys held by their dead head until an operator replays or skips it.",
        );
        let oldest_blocked_age = register(
            &registry,
            Gauge::new(
                "ordering_oldest_blocked_age_seconds",
                "How long the longest-blocked ordering key has been blocked, 0 when none.",
            )
            .unwrap_or_else(|err| panic!("{err}")),
        );
        Self {
            blocked_keys,
            oldest_blocked_age,
            route_slot_waits,
            backlog_ready,
            backlog_due,
            backlog_processing,
            backlog_dead,
            oldest_unprocessed_age,
            events: register(&registry, events),
            handler_duration: register(&registry, handler_duration),
            lease_lost: register(&registry, lease_lost),
            savepoint_reruns: register(&registry, savepoint_reruns),
            handed_on: register(&registry, handed_on),
            claims: register(&registry, claims),
            rescued: register(&registry, rescued),
            stale: register(&registry, stale),
            registry,
        }
    }

    /// Counts one finished attempt. `event_type_label` is the event type pattern of the route
    /// that took the event, or `other`: never the event's own type, which its sender chose.
    pub fn count(&self, provider: &str, event_type_label: &str, outcome: &str) {
        self.events
            .with_label_values(&[provider, event_type_label, outcome])
            .inc();
    }

    /// Publishes a backlog reading.
    pub fn set_backlog(&self, backlog: &Backlog) {
        self.backlog_ready.set(backlog.ready);
        self.backlog_due.set(backlog.due);
        self.backlog_processing.set(backlog.processing);
        self.backlog_dead.set(backlog.dead);
        self.oldest_unprocessed_age
            .set(backlog.oldest_unprocessed_age_seconds);
    }

    /// Sets the blocked-key gauges from a database reading.
    pub fn set_blocked(&self, blocked: &inbox_core::ordering::BlockedSummary) {
        self.blocked_keys.set(blocked.blocked_keys);
        self.oldest_blocked_age
            .set(blocked.oldest_blocked_age_seconds.max(0.0));
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

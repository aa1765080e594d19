//! The handler API: what a handler receives, what it returns, and how events are routed to it.
//!
//! A handler gets the event and a connection inside the transaction that will also mark the
//! event done. Whatever it writes there commits together with the completion — or, if the
//! lease was lost meanwhile, rolls back with it: one business effect per event.
//!
//! A handler whose work is wholly outside the database (a forward to another service) offers
//! it as [`OutsideWork`]: it then runs holding no database connection, and its event is
//! completed by one statement after it succeeded.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use inbox_core::inbox::ClaimedEvent;

use crate::limits::DatabaseLimits;

/// An event as a handler sees it.
#[derive(Debug, Clone)]
pub struct Event {
    /// Inbox row id.
    pub id: i64,
    /// Provider name.
    pub provider: String,
    /// The provider's event id.
    pub event_id: String,
    /// The provider's event type, when known.
    pub event_type: Option<String>,
    /// Stored request headers: a JSON object of name to value.
    pub headers: serde_json::Value,
    /// The exact body bytes as received.
    pub body: Vec<u8>,
    /// This attempt's number, from 1.
    pub attempt: i32,
    /// When the receiver committed the event.
    pub received_at: DateTime<Utc>,
    /// Its ordering key (`provider:value`), when its provider orders events: no other event
    /// of the key runs while this one does, and the key's events come in sequence order.
    pub ordering_key: Option<String>,
    /// Its provider's sequence within the key (0 when the provider has none).
    pub sequence: Option<i64>,
    /// A late arrival: an event of the same key with a higher sequence is already done, so
    /// this one may describe an older state than the one applied. Only ordered providers
    /// mark events stale (those that skip late arrivals never hand them over).
    pub stale: bool,
}

impl From<ClaimedEvent> for Event {
    fn from(row: ClaimedEvent) -> Self {
        Self {
            id: row.id,
            provider: row.provider,
            event_id: row.event_id,
            event_type: row.event_type,
            headers: row.headers,
            body: row.body,
            attempt: row.attempt,
            received_at: row.received_at,
            ordering_key: row.ordering_key,
            sequence: row.ordering_sequence,
            stale: row.stale,
        }
    }
}

/// A failed attempt, carrying the retry decision.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Worth trying again later (a dependency was down, a timeout, a conflict).
    #[error("retryable: {0}")]
    Retryable(String),
    /// Worth trying again, but not before `after` (a target's `Retry-After`); the retry cap
    /// still bounds the wait.
    #[error("retryable: {reason}")]
    RetryAfter {
        /// What failed.
        reason: String,
        /// The earliest the next attempt should start.
        after: std::time::Duration,
    },
    /// Will never succeed (malformed event, rejected by the business rules): dead-letter it now.
    #[error("permanent: {0}")]
    Permanent(String),
}

impl From<diesel::result::Error> for HandlerError {
    fn from(err: diesel::result::Error) -> Self {
        // Database errors inside the handler's transaction (serialization failures, lost
        // connections) are transient as far as the event is concerned.
        Self::Retryable(format!("database: {err}"))
    }
}

/// What a handler did with an event it returned `Ok` for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// The business effect was applied.
    Applied,
    /// Nothing to do for this event (counted as ignored).
    Ignored,
}

/// Business logic for one kind of event.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles `event`. `tx` is inside the transaction that completes the event: write the
    /// business effect through it and do not commit or roll back yourself.
    async fn handle(
        &self,
        event: &Event,
        tx: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError>;

    /// Handles several events of one shared transaction in one call, in order: one result
    /// per event. A handler whose effect can be written for many events by one statement
    /// overrides it; the default handles each in turn with [`Handler::handle`].
    ///
    /// An error fails the whole call: the transaction rolls back and its events run again,
    /// each alone in a savepoint through [`Handler::handle`], which then decides each
    /// event's outcome. Only batchable handlers are called this way.
    async fn handle_batch(
        &self,
        events: &[&Event],
        tx: &mut AsyncPgConnection,
    ) -> Result<Vec<Handled>, HandlerError> {
        let mut handled = Vec::with_capacity(events.len());
        for event in events {
            handled.push(self.handle(event, tx).await?);
        }
        Ok(handled)
    }

    /// Whether several events may share one transaction. True only for handlers that work
    /// in the database alone and return quickly: a transaction runs its events one after
    /// another, so a handler that waits on the network must return false (the default) and
    /// gets a transaction per event.
    ///
    /// A shared transaction first runs its events without savepoints; when one fails, it
    /// rolls back and runs them all again, each in its own savepoint. A batchable handler
    /// may therefore run twice in one attempt, the first run rolled back: another reason it
    /// must have no effect outside the transaction.
    fn batchable(&self) -> bool {
        false
    }

    /// The slots of this handler's target, when it takes only so many events at once (a
    /// forward's `max_in_flight`). The worker takes a slot before it takes the attempt's
    /// database connection, so events waiting for a slot hold no connection; `handle` runs
    /// only while its slot is held.
    fn slots(&self) -> Option<Arc<tokio::sync::Semaphore>> {
        None
    }

    /// The handler's work, when all of it is outside the database (a forward to another
    /// service): the worker then runs it with no database connection held, for as long as
    /// its target takes, and completes its event by one statement once it succeeded;
    /// `handle` is not called. `None` (the default): the work is `handle`'s, in the event's
    /// transaction.
    fn outside_work(&self) -> Option<&dyn OutsideWork> {
        None
    }
}

/// Work done outside the database for one event (see [`Handler::outside_work`]). It may run
/// more than once for an event (a lost lease, a crash before the completion commits), so
/// its target must apply it once, as a forward's `Idempotency-Key` lets it.
#[async_trait]
pub trait OutsideWork: Send + Sync {
    /// Does the work for `event`; the outcome decides its completion, retry or dead letter
    /// as [`Handler::handle`]'s does.
    async fn run(&self, event: &Event) -> Result<Handled, HandlerError>;
}

/// The `event_type` label of events no route takes. Event types are chosen by the webhook's
/// sender (up to 255 characters of anything), so metrics never use them as labels: an event
/// is labelled with the event type pattern of the route that took it (bounded by the routes
/// file), or this.
pub const UNROUTED_EVENT_TYPE_LABEL: &str = "other";

/// The route an event matched.
#[derive(Clone, Copy)]
pub struct RouteMatch<'a> {
    /// Its handler.
    pub handler: &'a Arc<dyn Handler>,
    /// The route's event type pattern (`"*"` when it has none): the event's `event_type`
    /// label in metrics.
    pub event_type_label: &'a Arc<str>,
    /// The route's own database timeouts (unset: the worker's).
    pub limits: DatabaseLimits,
}

impl std::fmt::Debug for RouteMatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteMatch")
            .field("event_type_label", &self.event_type_label)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct Route {
    provider: Option<String>,
    event_type: Option<String>,
    handler: Arc<dyn Handler>,
    /// `event_type`, or `"*"` when the route takes any: the metrics label of its events.
    label: Arc<str>,
    limits: DatabaseLimits,
}

/// Chooses a handler by provider and event type; the first matching route wins. An event no
/// route matches is completed as ignored, never retried.
#[derive(Clone, Default)]
pub struct Router {
    routes: Vec<Route>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.routes.iter().map(|r| (&r.provider, &r.event_type)))
            .finish()
    }
}

/// `None` and `"*"` match anything; `"prefix*"` matches by prefix; anything else exactly.
fn pattern_matches(pattern: Option<&str>, value: Option<&str>) -> bool {
    match pattern {
        None | Some("*") => true,
        Some(pattern) => {
            let Some(value) = value else { return false };
            match pattern.strip_suffix('*') {
                Some(prefix) => value.starts_with(prefix),
                None => value == pattern,
            }
        }
    }
}

impl Router {
    /// An empty router: every event is ignored.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a route. `provider` and `event_type` are patterns: `None` or `"*"` for any,
    /// `"payment.*"` for a prefix, otherwise an exact name.
    pub fn route(
        self,
        provider: Option<&str>,
        event_type: Option<&str>,
        handler: Arc<dyn Handler>,
    ) -> Self {
        self.route_with_limits(provider, event_type, handler, DatabaseLimits::default())
    }

    /// Adds a route whose attempts run with their own statement and lock timeouts.
    pub fn route_with_limits(
        mut self,
        provider: Option<&str>,
        event_type: Option<&str>,
        handler: Arc<dyn Handler>,
        limits: DatabaseLimits,
    ) -> Self {
        self.routes.push(Route {
            provider: provider.map(str::to_owned),
            event_type: event_type.map(str::to_owned),
            handler,
            label: Arc::from(event_type.unwrap_or("*")),
            limits,
        });
        self
    }

    /// Whether every route's handler is batchable (true for no routes at all): then no event
    /// this router takes waits on the network, and the worker may claim a transaction's worth
    /// of events per slot.
    pub fn batchable_only(&self) -> bool {
        self.routes.iter().all(|route| route.handler.batchable())
    }

    /// The handler for an event, if any route matches.
    pub fn handler_for(
        &self,
        provider: &str,
        event_type: Option<&str>,
    ) -> Option<&Arc<dyn Handler>> {
        self.route_for(provider, event_type)
            .map(|matched| matched.handler)
    }

    /// The first route matching an event: its handler, and the event type as metrics may
    /// label it.
    pub fn route_for(&self, provider: &str, event_type: Option<&str>) -> Option<RouteMatch<'_>> {
        self.routes
            .iter()
            .find(|route| {
                pattern_matches(route.provider.as_deref(), Some(provider))
                    && pattern_matches(route.event_type.as_deref(), event_type)
            })
            .map(|route| RouteMatch {
                handler: &route.handler,
                event_type_label: &route.label,
                limits: route.limits,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named;

    #[async_trait]
    impl Handler for Named {
        async fn handle(
            &self,
            _: &Event,
            _: &mut AsyncPgConnection,
        ) -> Result<Handled, HandlerError> {
            Ok(Handled::Applied)
        }
    }

    #[test]
    fn routes_match_exactly_by_prefix_or_anything_and_first_wins() {
        let a: Arc<dyn Handler> = Arc::new(Named);
        let b: Arc<dyn Handler> = Arc::new(Named);
        let router = Router::new()
            .route(Some("stripe"), Some("payment_intent.*"), Arc::clone(&a))
            .route(Some("github"), None, Arc::clone(&b));
        let found = |p, t| router.handler_for(p, t).map(Arc::as_ptr);
        assert_eq!(
            found("stripe", Some("payment_intent.succeeded")),
            Some(Arc::as_ptr(&a))
        );
        assert_eq!(found("stripe", Some("charge.refunded")), None);
        assert_eq!(found("stripe", None), None);
        assert_eq!(found("github", Some("push")), Some(Arc::as_ptr(&b)));
        assert_eq!(found("github", None), Some(Arc::as_ptr(&b)));
        assert_eq!(found("shopify", Some("orders/create")), None);
    }

    #[test]
    fn metrics_label_an_event_by_its_route_pattern_never_by_its_own_type() {
        let router = Router::new()
            .route(Some("stripe"), Some("payment_intent.*"), Arc::new(Named))
            .route(Some("github"), None, Arc::new(Named));
        let label = |p, t| {
            router
                .route_for(p, t)
                .map(|m| m.event_type_label.to_string())
        };
        assert_eq!(
            label("stripe", Some("payment_intent.\u{1b}[31mwhatever")),
            Some("payment_intent.*".to_owned())
        );
        assert_eq!(label("github", Some("push")), Some("*".to_owned()));
        assert_eq!(label("stripe", Some("charge.refunded")), None);
    }
}

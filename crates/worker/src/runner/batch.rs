//! Claimed events grouped into batches, one transaction each, every event's route looked up
//! once, here.

use std::sync::Arc;

use inbox_core::inbox::ClaimedEvent;

use crate::handler::{Event, Handler, Router, UNROUTED_EVENT_TYPE_LABEL};
use crate::limits::DatabaseLimits;

/// An event with the handler its route chose.
pub(super) struct Routed {
    pub(super) event: Event,
    pub(super) handler: Arc<dyn Handler>,
    /// The route's event type pattern: the event's `event_type` label in metrics.
    pub(super) label: Arc<str>,
    /// The route's own database timeouts.
    pub(super) limits: DatabaseLimits,
}

/// Events completed together by one transaction.
pub(super) enum Batch {
    /// Events no route matches: completed as ignored by one statement, no handler run.
    Unrouted(Vec<Event>),
    /// Events run by their handlers in one transaction that also completes them.
    Routed(Vec<Routed>),
}

impl Batch {
    /// The batch's events, in claim order.
    pub(super) fn events(&self) -> Vec<&Event> {
        match self {
            Self::Unrouted(events) => events.iter().collect(),
            Self::Routed(routed) => routed.iter().map(|routed| &routed.event).collect(),
        }
    }

    /// The batch's events, each with its `event_type` label for metrics (its route's
    /// pattern, or [`UNROUTED_EVENT_TYPE_LABEL`]).
    pub(super) fn labelled_events(&self) -> Vec<(&Event, &str)> {
        match self {
            Self::Unrouted(events) => events
                .iter()
                .map(|event| (event, UNROUTED_EVENT_TYPE_LABEL))
                .collect(),
            Self::Routed(routed) => routed
                .iter()
                .map(|routed| (&routed.event, &*routed.label))
                .collect(),
        }
    }

    /// The batch without the events of `ids`, unless none is left.
    pub(super) fn without(self, ids: &[i64]) -> Option<Self> {
        let rest = match self {
            Self::Unrouted(mut events) => {
                events.retain(|event| !ids.contains(&event.id));
                Self::Unrouted(events)
            }
            Self::Routed(mut routed) => {
                routed.retain(|routed| !ids.contains(&routed.event.id));
                Self::Routed(routed)
            }
        };
        (rest.len() > 0).then_some(rest)
    }

    /// The batch's row ids.
    pub(super) fn ids(&self) -> Vec<i64> {
        self.events().iter().map(|event| event.id).collect()
    }

    /// How many events it holds.
    pub(super) fn len(&self) -> usize {
        match self {
            Self::Unrouted(events) => events.len(),
            Self::Routed(routed) => routed.len(),
        }
    }
}

/// Splits claimed rows into batches: events no route matches form one batch (they need no
/// more than their completion), with the late arrivals of providers that skip them; events
/// of batchable handlers share batches of up to `transaction_size`; every other event is
/// alone. `on_stale` sees each late arrival, and whether it is skipped.
pub(super) fn batches(
    router: &Router,
    rows: Vec<ClaimedEvent>,
    transaction_size: usize,
    mut on_stale: impl FnMut(&str, bool),
) -> Vec<Batch> {
    let size = transaction_size.max(1);
    let mut batches = Vec::new();
    let mut unrouted: Vec<Event> = Vec::new();
    let mut shared: Vec<Routed> = Vec::with_capacity(size);
    for row in rows {
        let skipped = row.stale && row.skip_stale;
        if row.stale {
            on_stale(&row.provider, skipped);
        }
        let event = Event::from(row);
        if skipped {
            unrouted.push(event);
            continue;
        }
        let Some(route) = router.route_for(&event.provider, event.event_type.as_deref()) else {
            unrouted.push(event);
            continue;
        };
        let routed = Routed {
            handler: Arc::clone(route.handler),
            label: Arc::clone(route.event_type_label),
            limits: route.limits,
            event,
        };
        if routed.handler.batchable() {
            shared.push(routed);
            if shared.len() == size {
                let full = std::mem::replace(&mut shared, Vec::with_capacity(size));
                batches.push(Batch::Routed(full));
            }
        } else {
            batches.push(Batch::Routed(vec![routed]));
        }
    }
    if !shared.is_empty() {
        batches.push(Batch::Routed(shared));
    }
    if !unrouted.is_empty() {
        batches.push(Batch::Unrouted(unrouted));
    }
    batches
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use diesel_async::AsyncPgConnection;

    use super::*;
    use crate::handler::{Handled, HandlerError};

    struct Kind {
        batchable: bool,
    }

    #[async_trait]
    impl Handler for Kind {
        async fn handle(
            &self,
            _: &Event,
            _: &mut AsyncPgConnection,
        ) -> Result<Handled, HandlerError> {
            Ok(Handled::Applied)
        }

        fn batchable(&self) -> bool {
            self.batchable
        }
    }

    fn row(id: i64, provider: &str) -> ClaimedEvent {
        ClaimedEvent {
            id,
            provider: provider.into(),
            event_id: format!("evt_{id}"),
            event_type: None,
            received_at: chrono::Utc::now(),
            headers: serde_json::json!({}),
            body: Vec::new(),
            attempt: 1,
            ordering_key: None,
            ordering_sequence: None,
            stale: false,
            skip_stale: false,
        }
    }

    #[test]
    fn batchable_events_share_batches_others_are_alone_and_unrouted_ones_go_together() {
        let router = Router::new()
            .route(Some("db"), None, Arc::new(Kind { batchable: true }))
            .route(Some("net"), None, Arc::new(Kind { batchable: false }));
        let rows = vec![
            row(1, "db"),
            row(2, "net"),
            row(3, "none"),
            row(4, "db"),
            row(5, "db"),
            row(6, "net"),
            row(7, "none"),
        ];
        let shapes: Vec<(bool, Vec<i64>)> = batches(&router, rows, 2, |_, _| {})
            .iter()
            .map(|batch| (matches!(batch, Batch::Routed(_)), batch.ids()))
            .collect();
        assert_eq!(
            shapes,
            [
                (true, vec![2]),
                (true, vec![1, 4]),
                (true, vec![6]),
                (true, vec![5]),
                (false, vec![3, 7]),
            ]
        );
    }
}

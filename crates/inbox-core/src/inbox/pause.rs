//! Paused routes: an operator stops the processing of a provider's events (or of one event
//! type) while a downstream system is broken, without stopping ingest. Paused events stay
//! ready; [`super::claim_due`] skips them and [`crate::operations::next_due`] does not wait for
//! them, and they are claimed again, oldest first, once the route is resumed.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::schema::inbox_paused_routes;

/// The `event_type` of a route that pauses every type of its provider.
pub const EVERY_EVENT_TYPE: &str = "*";

/// The claim's condition on a candidate queue row (aliased `inbox_queue`): true unless its
/// event matches a paused route. When no route is paused, the first test (computed once per
/// statement) settles it and no event row is read.
pub const NOT_PAUSED_SQL: &str = "(NOT EXISTS (SELECT 1 FROM inbox_paused_routes) OR NOT EXISTS ( \
     SELECT 1 FROM inbox_events AS paused_event JOIN inbox_paused_routes AS paused \
     ON paused.provider = paused_event.provider \
     AND (paused.event_type = '*' OR paused.event_type = paused_event.event_type) \
     WHERE paused_event.id = inbox_queue.id))";

/// A paused route.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = inbox_paused_routes)]
pub struct PausedRoute {
    /// The provider.
    pub provider: String,
    /// The event type, or [`EVERY_EVENT_TYPE`].
    pub event_type: String,
    /// Who paused it.
    pub paused_by: String,
    /// Since when.
    pub paused_at: DateTime<Utc>,
}

/// Pauses `(provider, event_type)` (`event_type` [`EVERY_EVENT_TYPE`] for all of them). Events
/// already claimed finish their attempt; no further one is claimed. Returns false when the
/// route was already paused (nothing changed).
pub async fn pause_route(
    conn: &mut AsyncPgConnection,
    provider: &str,
    event_type: &str,
    paused_by: &str,
) -> QueryResult<bool> {
    let inserted = diesel::insert_into(inbox_paused_routes::table)
        .values((
            inbox_paused_routes::provider.eq(provider),
            inbox_paused_routes::event_type.eq(event_type),
            inbox_paused_routes::paused_by.eq(paused_by),
        ))
        .on_conflict_do_nothing()
        .execute(conn)
        .await?;
    Ok(inserted == 1)
}

/// Resumes `(provider, event_type)`: its ready events are claimable again at once (the workers
/// find them at their next claim or poll). Returns false when it was not paused.
pub async fn resume_route(
    conn: &mut AsyncPgConnection,
    provider: &str,
    event_type: &str,
) -> QueryResult<bool> {
    let deleted = diesel::delete(
        inbox_paused_routes::table
            .filter(inbox_paused_routes::provider.eq(provider))
            .filter(inbox_paused_routes::event_type.eq(event_type)),
    )
    .execute(conn)
    .await?;
    Ok(deleted == 1)
}

/// Every paused route, by provider and type.
pub async fn paused_routes(conn: &mut AsyncPgConnection) -> QueryResult<Vec<PausedRoute>> {
    inbox_paused_routes::table
        .order_by((
            inbox_paused_routes::provider,
            inbox_paused_routes::event_type,
        ))
        .select(PausedRoute::as_select())
        .load(conn)
        .await
}

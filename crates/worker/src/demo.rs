//! The demo handler: writes one `demo_ledger` line per event, guarded by `processed_events`,
//! in the transaction that completes the event. Its ledger has no unique constraint of its
//! own, so a second effect for one event would show as a second line.

use async_trait::async_trait;
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::schema::{demo_ledger, processed_events};

use crate::handler::{Event, Handled, Handler, HandlerError};

/// Records every event it gets in `demo_ledger`, once.
#[derive(Debug, Clone, Copy, Default)]
pub struct DemoLedger;

/// Marks `(provider, event_id)` as processed in `tx`. Returns false when it already was: the
/// effect happened before and must not be applied again.
pub async fn mark_processed(tx: &mut AsyncPgConnection, event: &Event) -> QueryResult<bool> {
    let inserted = diesel::insert_into(processed_events::table)
        .values((
            processed_events::provider.eq(&event.provider),
            processed_events::event_id.eq(&event.event_id),
        ))
        .on_conflict_do_nothing()
        .execute(tx)
        .await?;
    Ok(inserted == 1)
}

#[async_trait]
impl Handler for DemoLedger {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        if !mark_processed(tx, event).await? {
            return Ok(Handled::Ignored);
        }
        diesel::insert_into(demo_ledger::table)
            .values((
                demo_ledger::provider.eq(&event.provider),
                demo_ledger::event_id.eq(&event.event_id),
                demo_ledger::event_type.eq(&event.event_type),
            ))
            .execute(tx)
            .await?;
        Ok(Handled::Applied)
    }
}

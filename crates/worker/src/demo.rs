//! The demo handler of `make run` and the tests.
//!
//! For every event it writes one `demo_ledger` line, guarded by `processed_events`, in the
//! transaction that completes the event. The ledger has no unique constraint of its own, so a
//! second effect for one event would show as a second line.
//!
//! The line of an ordered event also keeps its ordering key, its sequence, whether it came
//! stale, `clock_timestamp()` as it was written (`written_at`; the line's `recorded_at` is its
//! transaction's start), the transaction that wrote it and when the writing statement started
//! (a busy key's events handed on run one after the other in one transaction): a trace of
//! committed handlings from which the chaos tests check, per key, that handlings never
//! overlapped and followed the sequence.
//!
//! Payment events also update `demo_payments`, and show out-of-order safety: each event
//! applies an operation that commutes with the others, so `payment.succeeded` and
//! `payment.refunded` reach the same final state in either arrival order, and every refund
//! event (its own event id) is applied once, even two refunds of one payment.
//!
//! An event of type `demo.poison` fails permanently, to show dead letters.

use async_trait::async_trait;
use diesel::prelude::*;
use std::collections::HashSet;

use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text};
use diesel::upsert::excluded;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::prepared::{bind, cached_sql};
use inbox_core::schema::{demo_payments, processed_events};
use serde::Deserialize;

use crate::handler::{Event, Handled, Handler, HandlerError};

/// Event type that the demo handler always rejects as permanent.
pub const POISON_EVENT_TYPE: &str = "demo.poison";

/// The demo handler: ledger line for every event, payment state for payment events.
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

/// The part of a payment event's body the demo reads (top level or under `data`).
#[derive(Debug, Deserialize)]
struct PaymentBody {
    payment_id: String,
    amount: i64,
}

#[derive(Debug, Deserialize)]
struct Envelope {
    data: Option<PaymentBody>,
    #[serde(flatten)]
    top: Option<PaymentBody>,
}

/// The payment an event's body describes, if it describes one.
fn payment_of(event: &Event) -> Result<Option<PaymentBody>, HandlerError> {
    let Ok(envelope) = serde_json::from_slice::<Envelope>(&event.body) else {
        return Ok(None);
    };
    match envelope.data.or(envelope.top) {
        Some(payment) if payment.amount < 0 => {
            Err(HandlerError::Permanent("negative payment amount".into()))
        }
        payment => Ok(payment),
    }
}

async fn apply_payment(
    tx: &mut AsyncPgConnection,
    event_type: &str,
    event: &Event,
) -> Result<(), HandlerError> {
    // Payment events without payment data still get their ledger line; nothing else to do.
    let Some(payment) = payment_of(event)? else {
        return Ok(());
    };
    match event_type {
        "payment.succeeded" => {
            diesel::insert_into(demo_payments::table)
                .values((
                    demo_payments::payment_id.eq(&payment.payment_id),
                    demo_payments::amount.eq(payment.amount),
                    demo_payments::succeeded_at.eq(event.received_at),
                ))
                .on_conflict(demo_payments::payment_id)
                .do_update()
                .set((
                    demo_payments::amount.eq(excluded(demo_payments::amount)),
                    demo_payments::succeeded_at.eq(excluded(demo_payments::succeeded_at)),
                    demo_payments::updated_at.eq(diesel::dsl::now),
                ))
                .execute(tx)
                .await?;
        }
        "payment.refunded" => {
            // A refund may arrive before the success it refunds: the row then starts pending.
            diesel::insert_into(demo_payments::table)
                .values((
                    demo_payments::payment_id.eq(&payment.payment_id),
                    demo_payments::refunded_amount.eq(payment.amount),
                    demo_payments::refund_count.eq(1),
                ))
                .on_conflict(demo_payments::payment_id)
                .do_update()
                .set((
                    demo_payments::refunded_amount
                        .eq(demo_payments::refunded_amount
                            + excluded(demo_payments::refunded_amount)),
                    demo_payments::refund_count.eq(demo_payments::refund_count + 1),
                    demo_payments::updated_at.eq(diesel::dsl::now),
                ))
                .execute(tx)
                .await?;
        }
        _ => {}
    }
    Ok(())
}

/// A lateral subquery `trace` with the trace of a line written now (`written_at`,
/// `transaction_id`, `statement_started_at`, in that order), one row when the SQL
/// expression `$key` (the line's ordering key) is not null and none otherwise, so that an
/// unordered line's trace columns stay empty.
macro_rules! traced_for {
    ($key:literal) => {
        concat!(
            "LEFT JOIN LATERAL ( \
                 SELECT clock_timestamp() AS written_at, \
                        pg_current_xact_id()::text::int8 AS transaction_id, \
                        statement_timestamp() AS statement_started_at \
                 WHERE ",
            $key,
            " IS NOT NULL \
             ) AS trace ON true"
        )
    };
}

/// The sequence an ordered event's line keeps (none for an unordered event: the trace is
/// whole or absent, `demo_ledger_ordering_trace`).
fn trace_sequence(event: &Event) -> Option<i64> {
    event.ordering_key.as_ref().and(event.sequence)
}

/// Whether an ordered event's line records it as stale (none for an unordered event).
fn trace_stale(event: &Event) -> Option<bool> {
    event.ordering_key.as_ref().map(|_| event.stale)
}

#[async_trait]
impl Handler for DemoLedger {
    async fn handle(
        &self,
        event: &Event,
        tx: &mut AsyncPgConnection,
    ) -> Result<Handled, HandlerError> {
        let event_type = event.event_type.as_deref().unwrap_or("");
        if event_type == POISON_EVENT_TYPE {
            return Err(HandlerError::Permanent("poison event (demo)".into()));
        }
        // One statement: mark the event processed and, only if it was not yet, write its line.
        let recorded = cached_sql(
            concat!(
                "WITH marked AS ( \
                 INSERT INTO processed_events (provider, event_id) VALUES ($1, $2) \
                 ON CONFLICT DO NOTHING RETURNING provider, event_id \
             ) \
             INSERT INTO demo_ledger \
                 (provider, event_id, event_type, ordering_key, ordering_sequence, stale, \
                  written_at, transaction_id, statement_started_at) \
             SELECT provider, event_id, $3, $4, $5, $6, trace.* \
             FROM marked ",
                traced_for!("$4::text")
            ),
            (
                bind::<Text, _>(&event.provider),
                bind::<Text, _>(&event.event_id),
                bind::<Nullable<Text>, _>(&event.event_type),
                bind::<Nullable<Text>, _>(&event.ordering_key),
                bind::<Nullable<BigInt>, _>(trace_sequence(event)),
                bind::<Nullable<Bool>, _>(trace_stale(event)),
            ),
        )
        .execute(tx)
        .await?;
        if recorded == 0 {
            return Ok(Handled::Ignored);
        }
        if event_type.starts_with("payment.") {
            apply_payment(tx, event_type, event).await?;
        }
        Ok(Handled::Applied)
    }

    /// The ledger lines of all `events` in one statement (each guarded by `processed_events`
    /// as in [`DemoLedger::handle`]), then the payment updates of those recorded. A poison
    /// event fails the call, so that each event is then handled alone.
    async fn handle_batch(
        &self,
        events: &[&Event],
        tx: &mut AsyncPgConnection,
    ) -> Result<Vec<Handled>, HandlerError> {
        if events
            .iter()
            .any(|event| event.event_type.as_deref() == Some(POISON_EVENT_TYPE))
        {
            return Err(HandlerError::Permanent("poison event (demo)".into()));
        }
        let providers: Vec<&str> = events.iter().map(|e| e.provider.as_str()).collect();
        let event_ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
        let event_types: Vec<Option<&str>> =
            events.iter().map(|e| e.event_type.as_deref()).collect();
        let keys: Vec<Option<&str>> = events.iter().map(|e| e.ordering_key.as_deref()).collect();
        let sequences: Vec<Option<i64>> = events.iter().map(|e| trace_sequence(e)).collect();
        let stale: Vec<Option<bool>> = events.iter().map(|e| trace_stale(e)).collect();
        let recorded: Vec<RecordedKey> = cached_sql(
            concat!(
                "WITH input AS ( \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], \
                                      $5::int8[], $6::bool[]) \
                     AS input(provider, event_id, event_type, ordering_key, \
                              ordering_sequence, stale) \
             ), marked AS ( \
                 INSERT INTO processed_events (provider, event_id) \
                 SELECT provider, event_id FROM input \
                 ON CONFLICT DO NOTHING RETURNING provider, event_id \
             ) \
             INSERT INTO demo_ledger \
                 (provider, event_id, event_type, ordering_key, ordering_sequence, stale, \
                  written_at, transaction_id, statement_started_at) \
             SELECT marked.provider, marked.event_id, input.event_type, input.ordering_key, \
                 input.ordering_sequence, input.stale, trace.* \
             FROM marked JOIN input USING (provider, event_id) ",
                traced_for!("input.ordering_key"),
                " RETURNING provider, event_id"
            ),
            (
                bind::<Array<Text>, _>(&providers),
                bind::<Array<Text>, _>(&event_ids),
                bind::<Array<Nullable<Text>>, _>(&event_types),
                bind::<Array<Nullable<Text>>, _>(&keys),
                bind::<Array<Nullable<BigInt>>, _>(&sequences),
                bind::<Array<Nullable<Bool>>, _>(&stale),
            ),
        )
        .load(tx)
        .await?;
        let recorded: HashSet<(&str, &str)> = recorded
            .iter()
            .map(|key| (key.provider.as_str(), key.event_id.as_str()))
            .collect();
        let mut handled = Vec::with_capacity(events.len());
        for event in events {
            if !recorded.contains(&(event.provider.as_str(), event.event_id.as_str())) {
                handled.push(Handled::Ignored);
                continue;
            }
            let event_type = event.event_type.as_deref().unwrap_or("");
            if event_type.starts_with("payment.") {
                apply_payment(tx, event_type, event).await?;
            }
            handled.push(Handled::Applied);
        }
        Ok(handled)
    }

    fn batchable(&self) -> bool {
        true
    }
}

#[derive(QueryableByName)]
struct RecordedKey {
    #[diesel(sql_type = Text)]
    provider: String,
    #[diesel(sql_type = Text)]
    event_id: String,
}

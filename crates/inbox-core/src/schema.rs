//! The diesel schema: the only `table!` declarations of the workspace.
//!
//! Written to match `migrations/`; the migrations are the source of truth, and a test
//! compares the two column by column.

diesel::table! {
    webhook_inbox (id) {
        id -> Int8,
        provider -> Text,
        event_id -> Text,
        event_type -> Nullable<Text>,
        received_at -> Timestamptz,
        headers -> Jsonb,
        body -> Bytea,
        body_sha256 -> Bytea,
        status -> Int2,
        attempt -> Int4,
        next_attempt_at -> Timestamptz,
        lease_token -> Nullable<Uuid>,
        locked_by -> Nullable<Text>,
        locked_until -> Nullable<Timestamptz>,
        last_error -> Nullable<Text>,
        processed_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    processed_events (provider, event_id) {
        provider -> Text,
        event_id -> Text,
        processed_at -> Timestamptz,
    }
}

diesel::table! {
    demo_ledger (id) {
        id -> Int8,
        provider -> Text,
        event_id -> Text,
        event_type -> Nullable<Text>,
        recorded_at -> Timestamptz,
    }
}

diesel::table! {
    demo_payments (payment_id) {
        payment_id -> Text,
        amount -> Nullable<Int8>,
        succeeded_at -> Nullable<Timestamptz>,
        refunded_amount -> Int8,
        refund_count -> Int4,
        updated_at -> Timestamptz,
        status -> Text,
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    webhook_inbox,
    processed_events,
    demo_ledger,
    demo_payments
);

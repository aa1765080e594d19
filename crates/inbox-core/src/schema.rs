//! The diesel schema: the only `table!` declarations of the workspace.
//!
//! Written to match `migrations/`; the migrations are the source of truth, and a test
//! compares the two column by column.

diesel::table! {
    /// The dedup key of every event, unique across the journal's days; hands out the ids.
    inbox_dedup (provider, event_id) {
        provider -> Text,
        event_id -> Text,
        id -> Int8,
        body_sha256 -> Bytea,
        /// Set for providers that guard against replays: see [`crate::inbox::replay_key`].
        replay_key -> Nullable<Bytea>,
    }
}

diesel::table! {
    /// The journal: every accepted event as received. Written once by the receiver;
    /// partitioned by `journal_day` (see [`crate::journal`]).
    inbox_events (id, journal_day) {
        id -> Int8,
        provider -> Text,
        event_id -> Text,
        event_type -> Nullable<Text>,
        received_at -> Timestamptz,
        headers -> Jsonb,
        body -> Bytea,
        body_sha256 -> Bytea,
        journal_day -> Date,
    }
}

diesel::table! {
    /// The state of each event still to process (ready or processing): the claim path.
    inbox_queue (id) {
        id -> Int8,
        status -> Int2,
        attempt -> Int4,
        next_attempt_at -> Timestamptz,
        lease_token -> Nullable<Uuid>,
        locked_by -> Nullable<Text>,
        locked_until -> Nullable<Timestamptz>,
        last_error -> Nullable<Text>,
        rescues -> Int4,
        ordering_key -> Nullable<Text>,
        ordering_sequence -> Nullable<Int8>,
        head -> Bool,
        key_processed_sequence -> Nullable<Int8>,
    }
}

diesel::table! {
    /// The outcome of each finished event (done or dead).
    inbox_finished (id) {
        id -> Int8,
        status -> Int2,
        attempt -> Int4,
        locked_by -> Nullable<Text>,
        last_error -> Nullable<Text>,
        processed_at -> Timestamptz,
    }
}

diesel::table! {
    /// One row per ordering key seen and not forgotten (retention forgets keys idle longer
    /// than it): its dead head, its high-water mark, since when it is idle; every writer's lock
    /// on the key.
    inbox_keys (ordering_key) {
        ordering_key -> Text,
        blocked_by -> Nullable<Int8>,
        blocked_since -> Nullable<Timestamptz>,
        processed_sequence -> Nullable<Int8>,
        idle_since -> Timestamptz,
    }
}

diesel::table! {
    /// Per ordered provider: what a dead head and a late arrival do.
    inbox_ordering_providers (provider) {
        provider -> Text,
        release_dead -> Bool,
        skip_stale -> Bool,
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    /// The ordering of dead ordered events, for replays and `worker show`.
    inbox_dead_ordering (id) {
        id -> Int8,
        ordering_key -> Text,
        ordering_sequence -> Int8,
    }
}

diesel::table! {
    /// Every skip of a blocked key's dead head, with its reason.
    inbox_key_skips (id) {
        id -> Int8,
        ordering_key -> Text,
        event_row_id -> Int8,
        reason -> Text,
        skipped_at -> Timestamptz,
    }
}

diesel::table! {
    /// A view: one row per event, its journal columns beside its state from the queue or its
    /// outcome. Read-only; for operators' queries.
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
        ordering_key -> Nullable<Text>,
        ordering_sequence -> Nullable<Int8>,
        stale -> Nullable<Bool>,
        written_at -> Nullable<Timestamptz>,
        transaction_id -> Nullable<Int8>,
        statement_started_at -> Nullable<Timestamptz>,
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

diesel::table! {
    /// Every repair action taken in the console: who, what, on which events, how many.
    console_audit (id) {
        id -> Int8,
        at -> Timestamptz,
        actor -> Text,
        action -> Text,
        target -> Jsonb,
        estimated -> Nullable<Int8>,
        affected -> Int8,
        outcome -> Text,
    }
}

diesel::table! {
    /// Routes whose ready events no worker claims until they are resumed.
    inbox_paused_routes (provider, event_type) {
        provider -> Text,
        event_type -> Text,
        paused_by -> Text,
        paused_at -> Timestamptz,
    }
}

diesel::table! {
    /// Refusals the receiver answered (4xx on a configured provider's path); see
    /// [`crate::rejections`].
    inbox_rejections (id) {
        id -> Int8,
        at -> Timestamptz,
        provider -> Text,
        cause -> Text,
        status -> Int2,
        request_id -> Text,
        headers -> Jsonb,
        body_bytes -> Int8,
        body_sha256 -> Nullable<Bytea>,
    }
}

diesel::table! {
    /// Replays suppressed at ingest, until released; see [`crate::replays`].
    inbox_suppressed_replays (id) {
        id -> Int8,
        provider -> Text,
        event_id -> Text,
        event_type -> Nullable<Text>,
        received_at -> Timestamptz,
        headers -> Jsonb,
        body -> Bytea,
        body_sha256 -> Bytea,
        ordering_key -> Nullable<Text>,
        ordering_sequence -> Nullable<Int8>,
        original_id -> Int8,
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    inbox_dedup,
    inbox_events,
    inbox_queue,
    inbox_finished,
    inbox_keys,
    inbox_ordering_providers,
    inbox_dead_ordering,
    inbox_key_skips,
    webhook_inbox,
    processed_events,
    demo_ledger,
    demo_payments,
    console_audit,
    inbox_paused_routes,
    inbox_rejections,
    inbox_suppressed_replays
);

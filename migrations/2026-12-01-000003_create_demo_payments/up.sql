-- The demo payments handler's state: one row per payment, built from events that may arrive
-- in any order. Each event applies an operation that commutes with the others (record the
-- success, add a refund), so every arrival order ends in the same state; `status` is derived.
CREATE TABLE demo_payments (
    payment_id      text        PRIMARY KEY,
    amount          bigint      CHECK (amount >= 0),
    succeeded_at    timestamptz,
    refunded_amount bigint      NOT NULL DEFAULT 0 CHECK (refunded_amount >= 0),
    refund_count    integer     NOT NULL DEFAULT 0 CHECK (refund_count >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    status          text        GENERATED ALWAYS AS (
        CASE
            WHEN succeeded_at IS NULL THEN 'pending'
            WHEN refunded_amount >= amount THEN 'refunded'
            WHEN refunded_amount > 0 THEN 'partially_refunded'
            ELSE 'succeeded'
        END
    ) STORED
);

-- The demo handler's business effect: one ledger line per processed event.
-- Deliberately no unique constraint: tests count lines per event to prove exactly-once.
CREATE TABLE demo_ledger (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider    text        NOT NULL,
    event_id    text        NOT NULL,
    event_type  text,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX demo_ledger_event ON demo_ledger (provider, event_id);

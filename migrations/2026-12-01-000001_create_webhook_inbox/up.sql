-- The inbox: the durable journal of every accepted webhook and the work queue of the workers.
-- Row states (inbox_core::InboxStatus): 0 ready, 1 processing, 2 done, 3 dead.
CREATE TABLE webhook_inbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider        text        NOT NULL,
    event_id        text        NOT NULL,
    event_type      text,
    received_at     timestamptz NOT NULL DEFAULT now(),
    -- request headers as received, minus credentials (Authorization, Cookie, ...)
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- the exact body bytes as received: signatures and handlers need them unaltered
    body            bytea       NOT NULL,
    -- lets a redelivery with a different body be detected and reported
    body_sha256     bytea       NOT NULL,
    status          smallint    NOT NULL DEFAULT 0,
    -- attempts begun so far; a claim increments it, so a crash counts as an attempt
    attempt         integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- fencing token of the current lease: every transition out of processing must present it
    lease_token     uuid,
    -- the worker that claimed the row last (kept after the lease ends, for diagnosis)
    locked_by       text,
    locked_until    timestamptz,
    last_error      text,
    -- when the row left the queue for good (done or dead)
    processed_at    timestamptz,

    CONSTRAINT webhook_inbox_dedup_key UNIQUE (provider, event_id),
    CONSTRAINT webhook_inbox_status_known CHECK (status BETWEEN 0 AND 3),
    CONSTRAINT webhook_inbox_provider_length CHECK (char_length(provider) BETWEEN 1 AND 64),
    CONSTRAINT webhook_inbox_event_id_length CHECK (char_length(event_id) BETWEEN 1 AND 255),
    CONSTRAINT webhook_inbox_body_sha256_length CHECK (octet_length(body_sha256) = 32),
    CONSTRAINT webhook_inbox_attempt_not_negative CHECK (attempt >= 0),
    -- a lease exists exactly while the row is processing
    CONSTRAINT webhook_inbox_lease_iff_processing
        CHECK ((status = 1) = (lease_token IS NOT NULL AND locked_until IS NOT NULL)),
    -- a row is finished (done or dead) exactly when it carries its finishing time
    CONSTRAINT webhook_inbox_processed_iff_finished
        CHECK ((status IN (2, 3)) = (processed_at IS NOT NULL))
);

-- The claim path: due ready rows, oldest first. Partial, so done rows cost it nothing.
CREATE INDEX webhook_inbox_ready ON webhook_inbox (next_attempt_at) WHERE status = 0;
-- The rescue path: leases by expiry.
CREATE INDEX webhook_inbox_leases ON webhook_inbox (locked_until) WHERE status = 1;
-- Operators list and replay dead letters.
CREATE INDEX webhook_inbox_dead ON webhook_inbox (processed_at) WHERE status = 3;

-- Business-effect idempotency: a handler inserts its event here in the same transaction as
-- its effect, so an effect can never be applied twice even if a lease were misused.
CREATE TABLE processed_events (
    provider     text        NOT NULL,
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_id)
);

-- What the receiver refused, and the replays it kept from the handlers.

-- Every 4xx answered on a configured provider's path: what an operator needs to tell why a
-- provider's deliveries failed, and nothing an attacker chose beyond the kept headers: never
-- the secret, never the unverified body (only its size and hash). The receiver writes at most
-- a few rows per provider per second and trims the table by age and by row count.
CREATE TABLE inbox_rejections (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    provider    text        NOT NULL,
    -- the answer's code: invalid_signature, stale_timestamp, invalid_body, body_too_large, ...
    cause       text        NOT NULL,
    -- the HTTP status answered
    status      smallint    NOT NULL,
    -- the X-Request-Id of the answer, to find the request's log lines
    request_id  text        NOT NULL,
    -- the headers the provider's stored-header policy keeps (credentials never)
    headers     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- bytes received, or declared by Content-Length when the body was not read
    body_bytes  bigint      NOT NULL,
    -- SHA-256 of the whole body, NULL when it was not read whole
    body_sha256 bytea,

    CONSTRAINT inbox_rejections_status_4xx CHECK (status BETWEEN 400 AND 499),
    CONSTRAINT inbox_rejections_body_bytes_not_negative CHECK (body_bytes >= 0),
    CONSTRAINT inbox_rejections_body_sha256_length CHECK (octet_length(body_sha256) = 32)
);
CREATE INDEX inbox_rejections_provider_at ON inbox_rejections (provider, at);
CREATE INDEX inbox_rejections_at ON inbox_rejections (at);

-- The bodies seen per (provider, event type) within the dedup window, for providers whose
-- signature covers the body only (GitHub, Shopify, generic HMAC): a delivery id and type come
-- from unsigned headers there, so the same signed body under a fresh id is a replay. `id` is
-- the first event seen with the body; a row older than the window is replaced by the next
-- event with that body.
CREATE TABLE inbox_replay_bodies (
    provider    text        NOT NULL,
    -- '' when the event has no type
    event_type  text        NOT NULL,
    body_sha256 bytea       NOT NULL,
    id          bigint      NOT NULL,
    seen_at     timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT inbox_replay_bodies_pkey PRIMARY KEY (provider, event_type, body_sha256)
);
CREATE INDEX inbox_replay_bodies_seen_at ON inbox_replay_bodies (seen_at);

-- Replays suppressed at ingest: stored (their dedup key is taken, so a redelivery of the
-- same id is a duplicate), answered 200, never queued for a handler. Releasing one moves it
-- into the journal and the queue as if it had just arrived.
CREATE TABLE inbox_suppressed_replays (
    -- from inbox_dedup, like an event's id
    id                bigint      PRIMARY KEY,
    provider          text        NOT NULL,
    event_id          text        NOT NULL,
    event_type        text,
    received_at       timestamptz NOT NULL DEFAULT now(),
    headers           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    body              bytea       NOT NULL,
    body_sha256       bytea       NOT NULL,
    ordering_key      text,
    ordering_sequence bigint,
    -- the event first stored with the same body
    original_id       bigint      NOT NULL
);
CREATE INDEX inbox_suppressed_replays_provider_received_at
    ON inbox_suppressed_replays (provider, received_at);

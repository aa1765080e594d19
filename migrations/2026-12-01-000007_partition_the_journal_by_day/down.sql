-- Back to one journal table holding its own dedup key and ids.
DROP VIEW webhook_inbox;
DROP FUNCTION inbox_create_journal_day(date);

ALTER TABLE inbox_events RENAME TO inbox_events_partitioned;
ALTER INDEX inbox_events_pkey RENAME TO inbox_events_partitioned_pkey;
CREATE TABLE inbox_events (
    id          bigint      GENERATED ALWAYS AS IDENTITY,
    provider    text        NOT NULL,
    event_id    text        NOT NULL,
    event_type  text,
    received_at timestamptz NOT NULL DEFAULT now(),
    headers     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    body        bytea       NOT NULL,
    body_sha256 bytea       NOT NULL,

    CONSTRAINT inbox_events_pkey PRIMARY KEY (id),
    CONSTRAINT inbox_events_dedup_key UNIQUE (provider, event_id),
    CONSTRAINT inbox_events_provider_length CHECK (char_length(provider) BETWEEN 1 AND 64),
    CONSTRAINT inbox_events_event_id_length CHECK (char_length(event_id) BETWEEN 1 AND 255),
    CONSTRAINT inbox_events_body_sha256_length CHECK (octet_length(body_sha256) = 32)
);
INSERT INTO inbox_events (id, provider, event_id, event_type, received_at, headers, body, body_sha256)
OVERRIDING SYSTEM VALUE
SELECT id, provider, event_id, event_type, received_at, headers, body, body_sha256
FROM inbox_events_partitioned;
SELECT setval(pg_get_serial_sequence('inbox_events', 'id'),
              greatest((SELECT last_value FROM inbox_event_ids), 1));
DROP TABLE inbox_events_partitioned;
DROP TABLE inbox_dedup;

CREATE VIEW webhook_inbox AS
SELECT event.id, event.provider, event.event_id, event.event_type, event.received_at,
       event.headers, event.body, event.body_sha256,
       coalesce(queue.status, finished.status) AS status,
       coalesce(queue.attempt, finished.attempt) AS attempt,
       coalesce(queue.next_attempt_at, finished.processed_at) AS next_attempt_at,
       queue.lease_token,
       coalesce(queue.locked_by, finished.locked_by) AS locked_by,
       queue.locked_until,
       coalesce(queue.last_error, finished.last_error) AS last_error,
       finished.processed_at
FROM inbox_events AS event
LEFT JOIN inbox_queue AS queue USING (id)
LEFT JOIN inbox_finished AS finished USING (id);

-- Back to one table: the journal row takes its state columns back from the queue or the
-- finished row.
DROP VIEW webhook_inbox;

ALTER TABLE inbox_events RENAME TO webhook_inbox;
ALTER INDEX inbox_events_pkey RENAME TO webhook_inbox_pkey;
ALTER TABLE webhook_inbox RENAME CONSTRAINT inbox_events_dedup_key TO webhook_inbox_dedup_key;
ALTER TABLE webhook_inbox RENAME CONSTRAINT inbox_events_provider_length TO webhook_inbox_provider_length;
ALTER TABLE webhook_inbox RENAME CONSTRAINT inbox_events_event_id_length TO webhook_inbox_event_id_length;
ALTER TABLE webhook_inbox RENAME CONSTRAINT inbox_events_body_sha256_length TO webhook_inbox_body_sha256_length;

ALTER TABLE webhook_inbox
    ADD COLUMN status          smallint    NOT NULL DEFAULT 0,
    ADD COLUMN attempt         integer     NOT NULL DEFAULT 0,
    ADD COLUMN next_attempt_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN lease_token     uuid,
    ADD COLUMN locked_by       text,
    ADD COLUMN locked_until    timestamptz,
    ADD COLUMN last_error      text,
    ADD COLUMN processed_at    timestamptz;

UPDATE webhook_inbox AS inbox
SET status = queue.status, attempt = queue.attempt, next_attempt_at = queue.next_attempt_at,
    lease_token = queue.lease_token, locked_by = queue.locked_by,
    locked_until = queue.locked_until, last_error = queue.last_error
FROM inbox_queue AS queue WHERE queue.id = inbox.id;

UPDATE webhook_inbox AS inbox
SET status = finished.status, attempt = finished.attempt, next_attempt_at = finished.processed_at,
    locked_by = finished.locked_by, last_error = finished.last_error,
    processed_at = finished.processed_at
FROM inbox_finished AS finished WHERE finished.id = inbox.id;

DROP TABLE inbox_queue;
DROP TABLE inbox_finished;

ALTER TABLE webhook_inbox
    ADD CONSTRAINT webhook_inbox_status_known CHECK (status BETWEEN 0 AND 3),
    ADD CONSTRAINT webhook_inbox_attempt_not_negative CHECK (attempt >= 0),
    ADD CONSTRAINT webhook_inbox_lease_iff_processing
        CHECK ((status = 1) = (lease_token IS NOT NULL AND locked_until IS NOT NULL)),
    ADD CONSTRAINT webhook_inbox_processed_iff_finished
        CHECK ((status IN (2, 3)) = (processed_at IS NOT NULL));

CREATE INDEX webhook_inbox_ready ON webhook_inbox (next_attempt_at) WHERE status = 0;
CREATE INDEX webhook_inbox_leases ON webhook_inbox (locked_until) WHERE status = 1;
CREATE INDEX webhook_inbox_dead ON webhook_inbox (processed_at) WHERE status = 3;

ALTER TABLE webhook_inbox SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

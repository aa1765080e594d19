-- The hot path touches a small row. Until now a claim and a completion each rewrote the whole
-- inbox row, 1 KiB body included, and done rows stayed in the table the claim path lives in.
-- The inbox is now three tables, one per kind of write:
--   inbox_events   the journal: what was received (dedup key, headers, exact body); written once
--                  by the receiver, deleted only by the retention purge;
--   inbox_queue    one small row per event still to process (ready or processing): what claims,
--                  heartbeats, retries and rescues update; deleted when the event finishes;
--   inbox_finished one small row per finished event (done or dead), written once when it
--                  finishes (replay moves a dead one back to the queue).
-- Every event has its row in exactly one of inbox_queue and inbox_finished: each transition
-- moves it in one statement. The view webhook_inbox shows the inbox as one row per event, with
-- the columns it always had, for operators' queries.
-- Row states (inbox_core::InboxStatus): 0 ready, 1 processing, 2 done, 3 dead.

ALTER TABLE webhook_inbox RENAME TO inbox_events;
ALTER INDEX webhook_inbox_pkey RENAME TO inbox_events_pkey;
ALTER TABLE inbox_events RENAME CONSTRAINT webhook_inbox_dedup_key TO inbox_events_dedup_key;
ALTER TABLE inbox_events RENAME CONSTRAINT webhook_inbox_provider_length TO inbox_events_provider_length;
ALTER TABLE inbox_events RENAME CONSTRAINT webhook_inbox_event_id_length TO inbox_events_event_id_length;
ALTER TABLE inbox_events RENAME CONSTRAINT webhook_inbox_body_sha256_length TO inbox_events_body_sha256_length;

CREATE TABLE inbox_queue (
    -- the event's id in inbox_events (no foreign key: its check would cost every ingest a
    -- lookup; the transitions keep the two in step)
    id              bigint      PRIMARY KEY,
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

    CONSTRAINT inbox_queue_status_pending CHECK (status IN (0, 1)),
    CONSTRAINT inbox_queue_attempt_not_negative CHECK (attempt >= 0),
    -- a lease exists exactly while the row is processing
    CONSTRAINT inbox_queue_lease_iff_processing
        CHECK ((status = 1) = (lease_token IS NOT NULL AND locked_until IS NOT NULL))
);

CREATE TABLE inbox_finished (
    -- the event's id in inbox_events
    id           bigint      PRIMARY KEY,
    status       smallint    NOT NULL,
    -- attempts it took
    attempt      integer     NOT NULL,
    -- the worker that finished it
    locked_by    text,
    -- why it is dead (NULL for done events)
    last_error   text,
    processed_at timestamptz NOT NULL,

    CONSTRAINT inbox_finished_status_finished CHECK (status IN (2, 3)),
    CONSTRAINT inbox_finished_attempt_not_negative CHECK (attempt >= 0)
);

INSERT INTO inbox_queue (id, status, attempt, next_attempt_at, lease_token, locked_by, locked_until, last_error)
SELECT id, status, attempt, next_attempt_at, lease_token, locked_by, locked_until, last_error
FROM inbox_events WHERE status IN (0, 1);

INSERT INTO inbox_finished (id, status, attempt, locked_by, last_error, processed_at)
SELECT id, status, attempt, locked_by, last_error, processed_at
FROM inbox_events WHERE status IN (2, 3);

DROP INDEX webhook_inbox_ready;
DROP INDEX webhook_inbox_leases;
DROP INDEX webhook_inbox_dead;
ALTER TABLE inbox_events
    DROP CONSTRAINT webhook_inbox_status_known,
    DROP CONSTRAINT webhook_inbox_attempt_not_negative,
    DROP CONSTRAINT webhook_inbox_lease_iff_processing,
    DROP CONSTRAINT webhook_inbox_processed_iff_finished,
    DROP COLUMN status,
    DROP COLUMN attempt,
    DROP COLUMN next_attempt_at,
    DROP COLUMN lease_token,
    DROP COLUMN locked_by,
    DROP COLUMN locked_until,
    DROP COLUMN last_error,
    DROP COLUMN processed_at;
-- The journal is insert-only: the settings of migration 4 (for two dead versions per event)
-- belong to the queue now.
ALTER TABLE inbox_events RESET (
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold,
    autovacuum_vacuum_cost_delay
);

-- The claim path: due ready rows, oldest first.
CREATE INDEX inbox_queue_ready ON inbox_queue (next_attempt_at) WHERE status = 0;
-- The rescue path: leases by expiry.
CREATE INDEX inbox_queue_leases ON inbox_queue (locked_until) WHERE status = 1;
-- Operators list and replay dead letters.
CREATE INDEX inbox_finished_dead ON inbox_finished (processed_at) WHERE status = 3;

-- Every queue row is updated at its claim and deleted when it finishes: vacuum after 1 % of
-- dead rows (plus 1,000), unthrottled, and keep the claim's statistics fresh.
ALTER TABLE inbox_queue SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

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

ANALYZE inbox_events;
ANALYZE inbox_queue;
ANALYZE inbox_finished;

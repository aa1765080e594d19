-- The journal is partitioned by day, so retention drops whole days instead of deleting rows.
-- Deleting old events row by row wrote some 600 bytes of WAL per event (the rows of the
-- journal and their pages' full images), fourteen times the WAL of the ingest it ran beside,
-- and left every deleted row to vacuum. Dropping a day's partition writes a few kilobytes.
--
--   inbox_dedup     the dedup key of every event, unique across days: a small unpartitioned
--                  row the ingest inserts first, ON CONFLICT DO NOTHING as before. It hands
--                  out the event ids.
--   inbox_events   the journal, partitioned by journal_day (the UTC day it was received):
--                  one partition per day, named inbox_events_YYYYMMDD, created ahead by the
--                  binaries (inbox_create_journal_day), plus inbox_events_kept for the events
--                  of a dropped day still wanted (queued or dead), moved there before the drop.
--
-- The journal as it was becomes today's partition, without copying a body (only the keys are
-- written anew): its events count as received today, so they are kept a retention from now.

-- Keys first, from the journal as it is.
CREATE SEQUENCE inbox_event_ids AS bigint;
DO $migration$
DECLARE
    last_id bigint;
BEGIN
    -- Ids go on from where the journal's own sequence was, purged ids included.
    EXECUTE format('SELECT last_value FROM %s', pg_get_serial_sequence('inbox_events', 'id'))
        INTO last_id;
    PERFORM setval('inbox_event_ids',
                   greatest(last_id, (SELECT max(id) FROM inbox_events), 1));
END
$migration$;

CREATE TABLE inbox_dedup (
    provider    text   NOT NULL,
    event_id    text   NOT NULL,
    -- the event's id in inbox_events
    id          bigint NOT NULL DEFAULT nextval('inbox_event_ids'),
    -- tells a faithful redelivery from one whose body differs, without reading the journal
    body_sha256 bytea  NOT NULL,

    CONSTRAINT inbox_dedup_pkey PRIMARY KEY (provider, event_id),
    CONSTRAINT inbox_dedup_provider_length CHECK (char_length(provider) BETWEEN 1 AND 64),
    CONSTRAINT inbox_dedup_event_id_length CHECK (char_length(event_id) BETWEEN 1 AND 255),
    CONSTRAINT inbox_dedup_body_sha256_length CHECK (octet_length(body_sha256) = 32)
);
ALTER SEQUENCE inbox_event_ids OWNED BY inbox_dedup.id;

INSERT INTO inbox_dedup (provider, event_id, id, body_sha256)
SELECT provider, event_id, id, body_sha256 FROM inbox_events;

-- The journal as it was: every row gets today's journal_day (a default evaluated once, no
-- rewrite), and the constraint that lets it be attached as today's partition without a
-- second scan.
DROP VIEW webhook_inbox;
ALTER TABLE inbox_events ALTER COLUMN id DROP IDENTITY;
ALTER TABLE inbox_events
    DROP CONSTRAINT inbox_events_dedup_key,
    DROP CONSTRAINT inbox_events_provider_length,
    DROP CONSTRAINT inbox_events_event_id_length,
    DROP CONSTRAINT inbox_events_body_sha256_length,
    ADD COLUMN journal_day date NOT NULL DEFAULT (now() AT TIME ZONE 'UTC')::date;
ALTER TABLE inbox_events ALTER COLUMN journal_day DROP DEFAULT;
ALTER TABLE inbox_events DROP CONSTRAINT inbox_events_pkey;
ALTER TABLE inbox_events ADD CONSTRAINT inbox_events_pkey PRIMARY KEY (id, journal_day);

DO $migration$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
BEGIN
    EXECUTE format('ALTER TABLE inbox_events RENAME TO %I', 'inbox_events_' || to_char(today, 'YYYYMMDD'));
    EXECUTE format('ALTER INDEX inbox_events_pkey RENAME TO %I', 'inbox_events_' || to_char(today, 'YYYYMMDD') || '_pkey');
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT journal_day_bound CHECK (journal_day >= %L AND journal_day < %L)',
                   'inbox_events_' || to_char(today, 'YYYYMMDD'), today, today + 1);
END
$migration$;

CREATE TABLE inbox_events (
    -- from inbox_dedup: the event's id everywhere (queue, finished, handlers)
    id          bigint      NOT NULL,
    provider    text        NOT NULL,
    event_id    text        NOT NULL,
    event_type  text,
    received_at timestamptz NOT NULL DEFAULT now(),
    -- request headers as received, minus credentials (Authorization, Cookie, ...)
    headers     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- the exact body bytes as received: signatures and handlers need them unaltered
    body        bytea       NOT NULL,
    body_sha256 bytea       NOT NULL,
    -- the partition: the UTC day of receipt; 'infinity' once moved to inbox_events_kept
    journal_day date        NOT NULL DEFAULT (now() AT TIME ZONE 'UTC')::date,

    CONSTRAINT inbox_events_pkey PRIMARY KEY (id, journal_day)
) PARTITION BY RANGE (journal_day);

DO $migration$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    legacy text := 'inbox_events_' || to_char(today, 'YYYYMMDD');
BEGIN
    EXECUTE format('ALTER TABLE inbox_events ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   legacy, today, today + 1);
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT journal_day_bound', legacy);
END
$migration$;

CREATE TABLE inbox_events_kept PARTITION OF inbox_events FOR VALUES FROM ('infinity') TO (MAXVALUE);

-- Creates the journal's partition for `day` unless it exists; true when it created it.
-- Built apart then attached, so ingest is not blocked: attaching takes a SHARE UPDATE
-- EXCLUSIVE lock on the journal, which inserts and reads do not wait for, where creating a
-- partition in place would take an ACCESS EXCLUSIVE one.
CREATE FUNCTION inbox_create_journal_day(day date) RETURNS boolean
LANGUAGE plpgsql AS $function$
DECLARE
    partition text := 'inbox_events_' || to_char(day, 'YYYYMMDD');
BEGIN
    -- Gives up behind a long-held lock rather than queue ingest behind it; callers retry.
    PERFORM set_config('lock_timeout', '5s', true);
    -- Binaries starting together create the same days.
    PERFORM pg_advisory_xact_lock(hashtext('inbox_create_journal_day'));
    IF EXISTS (SELECT FROM pg_inherits WHERE inhparent = 'inbox_events'::regclass
               AND inhrelid = to_regclass(format('%I', partition))) THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I (LIKE inbox_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', partition);
    -- Proves the bound, so attaching does not scan.
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT journal_day_bound CHECK (journal_day >= %L AND journal_day < %L)',
                   partition, day, day + 1);
    EXECUTE format('ALTER TABLE inbox_events ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   partition, day, day + 1);
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT journal_day_bound', partition);
    RETURN true;
END
$function$;

SELECT inbox_create_journal_day((now() AT TIME ZONE 'UTC')::date + ahead)
FROM generate_series(1, 2) AS ahead;

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

ANALYZE inbox_dedup;

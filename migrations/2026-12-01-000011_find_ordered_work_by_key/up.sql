-- The claim finds ordered work by key instead of scanning every ready ordered row and testing
-- each for being its key's head: a hot key's thousands of waiting events cost a claim nothing.
-- `inbox_keys.due_at` is a lower bound of when the key's head falls due while the key is free
-- (NULL: the key has no event in the queue), so a claim reads only free keys due now, then
-- each key's head by `inbox_queue_key_order`.
--
-- Who keeps the bound: an event arriving in the queue (an ingest, a replay, any update making
-- an ordered row ready) lowers it to its own due time; a key freed by its event leaving
-- processing sets it to its next head's due time, read after taking the key row's lock so no
-- arrival committed before is missed (one not committed yet lowers it after); a skip sets it
-- to now; a claim that finds the head not due yet raises it to the head's due time, but only
-- when no arrival touched the key since the claim's snapshot (`arrivals` unchanged).
ALTER TABLE inbox_keys
    ADD COLUMN due_at timestamptz,
    ADD COLUMN arrivals bigint NOT NULL DEFAULT 0;

UPDATE inbox_keys SET due_at = due.at
FROM (SELECT ordering_key, min(next_attempt_at) AS at FROM inbox_queue
      WHERE status = 0 AND ordering_key IS NOT NULL GROUP BY ordering_key) AS due
WHERE inbox_keys.ordering_key = due.ordering_key;
INSERT INTO inbox_keys (ordering_key, due_at)
SELECT ordering_key, min(next_attempt_at) FROM inbox_queue
WHERE status = 0 AND ordering_key IS NOT NULL GROUP BY ordering_key
ON CONFLICT (ordering_key) DO NOTHING;

-- Free keys whose head may be due: what a claim reads, oldest due first.
CREATE INDEX inbox_keys_due ON inbox_keys (due_at)
    WHERE holder IS NULL AND blocked_by IS NULL AND due_at IS NOT NULL;
-- Nothing scans the ready ordered rows any more.
DROP INDEX inbox_queue_ready_ordered;

-- Arrivals of a statement, one upsert per key in key order (so two ingests of the same keys
-- lock them in the same order and never deadlock).
CREATE FUNCTION inbox_keys_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO inbox_keys AS key (ordering_key, due_at, arrivals)
    SELECT ordering_key, min(next_attempt_at), count(*) FROM arrived
    WHERE ordering_key IS NOT NULL AND status = 0
    GROUP BY ordering_key ORDER BY ordering_key
    ON CONFLICT (ordering_key) DO UPDATE
        SET due_at = least(key.due_at, excluded.due_at),
            arrivals = key.arrivals + excluded.arrivals;
    RETURN NULL;
END
$$;

CREATE TRIGGER inbox_queue_key_arrived_by_insert
    AFTER INSERT ON inbox_queue
    REFERENCING NEW TABLE AS arrived
    FOR EACH STATEMENT
    EXECUTE FUNCTION inbox_keys_arrived();

-- An ordered row made ready, moved to another key or due time by an update (a retry, a
-- rescue, an operator's change): the same lowering, row by row.
CREATE FUNCTION inbox_key_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO inbox_keys AS key (ordering_key, due_at, arrivals)
    VALUES (NEW.ordering_key, NEW.next_attempt_at, 1)
    ON CONFLICT (ordering_key) DO UPDATE
        SET due_at = least(key.due_at, excluded.due_at), arrivals = key.arrivals + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER inbox_queue_key_arrived_by_update
    AFTER UPDATE OF status, ordering_key, ordering_sequence, next_attempt_at ON inbox_queue
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL AND NEW.status = 0
          AND (OLD.status <> 0 OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
               OR OLD.ordering_sequence IS DISTINCT FROM NEW.ordering_sequence
               OR OLD.next_attempt_at IS DISTINCT FROM NEW.next_attempt_at))
    EXECUTE FUNCTION inbox_key_arrived();

-- Migration 8's release, plus the key's next due time once it is free. The key row is locked
-- first: a statement run after that sees every arrival committed before the lock was granted.
CREATE OR REPLACE FUNCTION inbox_release_key() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    finished_status smallint;
    releases boolean;
BEGIN
    PERFORM 1 FROM inbox_keys
    WHERE ordering_key = OLD.ordering_key AND holder = OLD.id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        UPDATE inbox_keys SET holder = NULL, due_at = inbox_key_head_due(OLD.ordering_key)
        WHERE ordering_key = OLD.ordering_key;
        RETURN NULL;
    END IF;
    SELECT status INTO finished_status FROM inbox_finished WHERE id = OLD.id;
    IF finished_status = 3 THEN
        SELECT release_dead INTO releases FROM inbox_ordering_providers
        WHERE provider = split_part(OLD.ordering_key, ':', 1);
        INSERT INTO inbox_dead_ordering (id, ordering_key, ordering_sequence)
        VALUES (OLD.id, OLD.ordering_key, OLD.ordering_sequence)
        ON CONFLICT (id) DO UPDATE
            SET ordering_key = excluded.ordering_key, ordering_sequence = excluded.ordering_sequence;
        UPDATE inbox_keys SET holder = NULL, due_at = inbox_key_head_due(OLD.ordering_key),
            blocked_by = CASE WHEN coalesce(releases, false) THEN blocked_by ELSE OLD.id END,
            blocked_since = CASE WHEN coalesce(releases, false) THEN blocked_since ELSE now() END
        WHERE ordering_key = OLD.ordering_key;
    ELSE
        UPDATE inbox_keys SET holder = NULL, due_at = inbox_key_head_due(OLD.ordering_key),
            processed_sequence = CASE WHEN finished_status = 2
                THEN greatest(processed_sequence, OLD.ordering_sequence)
                ELSE processed_sequence END
        WHERE ordering_key = OLD.ordering_key;
    END IF;
    RETURN NULL;
END
$$;

-- When the key's head (lowest sequence, then id, in the queue) falls due; NULL when the key
-- has no event queued. A head in processing (no key holds it: a state the unique index and the
-- claim rule out) counts as due, so a claim looks at it rather than the key being forgotten.
CREATE FUNCTION inbox_key_head_due(key text) RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN status = 0 THEN next_attempt_at ELSE now() END
    FROM inbox_queue WHERE ordering_key = key
    ORDER BY ordering_sequence, id LIMIT 1
$$;

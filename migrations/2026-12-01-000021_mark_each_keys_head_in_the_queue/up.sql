-- A key's head is marked in the queue itself. Each ordered event is either its key's head
-- (`head`: the one event of the key a claim may take, or the one in processing) or waits behind
-- it. The claim then takes ordered heads exactly as it takes unordered events, from one index of
-- claimable rows, and never reads or writes a key's row: before, each claim of a key locked its
-- `inbox_keys` row and wrote it twice (taken, then freed with its next due time), which made an
-- ordered event cost the database about twice an unordered one.
--
-- The rules, kept by whoever changes a key's events while holding the key's row lock:
-- - A key has at most one head (`inbox_queue_one_head_per_key`), and an ordered event in
--   processing is its key's head (`inbox_queue_processing_is_head`): one event of a key at a time.
-- - A key that is not blocked and has events queued has a head: its lowest `(ordering_sequence,
--   id)`, unless an event arrived lower while the head was in processing (it runs next).
-- - A ready head with a lower event waiting steps back for it (a late event slotting in within
--   the reorder window), unless a claim is taking it at that moment.
--
-- Who keeps them: an arrival (any insert into the queue, a change of a row's key) locks its keys
-- and settles them (`inbox_settle_heads`); the keyed completion (`inbox::complete_all_keyed`)
-- locks its keys, then hands each on to its next event or makes that event the head; any other
-- departure of a head (dead letter, rescue, an operator's action) and a head's return to ready
-- (retry, rescue, release) lock the key and settle it in the triggers below. A claim changes no
-- head: it only moves a head from ready to processing.
--
-- A head carries its key's highest sequence processed before it (`key_processed_sequence`,
-- set as it becomes the head), so that a claim knows a late arrival without reading the key, and
-- a busy key passed from event to event is not written at each: `inbox_keys.processed_sequence`
-- is brought up to date when the key is left without a head (or a head steps back). The key's
-- row keeps that and the dead head that blocks it; it is every writer's lock on the key.

ALTER TABLE inbox_queue
    ADD COLUMN head boolean NOT NULL DEFAULT false,
    ADD COLUMN key_processed_sequence bigint;

-- The heads of a queue migrated with events in it: a key's event in processing, otherwise its
-- lowest queued event unless a dead head blocks the key.
UPDATE inbox_queue SET head = true WHERE ordering_key IS NOT NULL AND status = 1;
UPDATE inbox_queue SET head = true WHERE id IN (
    SELECT DISTINCT ON (queued.ordering_key) queued.id FROM inbox_queue AS queued
    WHERE queued.ordering_key IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM inbox_queue AS busy
                      WHERE busy.ordering_key = queued.ordering_key AND busy.status = 1)
      AND NOT EXISTS (SELECT 1 FROM inbox_keys AS key
                      WHERE key.ordering_key = queued.ordering_key AND key.blocked_by IS NOT NULL)
    ORDER BY queued.ordering_key, queued.ordering_sequence, queued.id);
INSERT INTO inbox_keys (ordering_key)
SELECT DISTINCT ordering_key FROM inbox_queue WHERE ordering_key IS NOT NULL
ON CONFLICT (ordering_key) DO NOTHING;
UPDATE inbox_queue SET key_processed_sequence = key.processed_sequence
FROM inbox_keys AS key WHERE key.ordering_key = inbox_queue.ordering_key AND inbox_queue.head;

ALTER TABLE inbox_queue
    ADD CONSTRAINT inbox_queue_head_is_ordered CHECK (NOT head OR ordering_key IS NOT NULL),
    ADD CONSTRAINT inbox_queue_processing_is_head
        CHECK (ordering_key IS NULL OR status <> 1 OR head);

-- What a claim takes: due ready rows, unordered or heads, oldest first.
DROP INDEX inbox_queue_ready;
CREATE INDEX inbox_queue_ready ON inbox_queue (next_attempt_at)
    WHERE status = 0 AND (ordering_key IS NULL OR head);
-- The events waiting behind their key's head, in the order they will run.
DROP INDEX inbox_queue_key_order;
CREATE INDEX inbox_queue_key_order ON inbox_queue (ordering_key, ordering_sequence, id)
    WHERE ordering_key IS NOT NULL AND NOT head;
-- The guarantee itself, whatever a statement does: one head per key.
DROP INDEX inbox_queue_one_processing_per_key;
CREATE UNIQUE INDEX inbox_queue_one_head_per_key ON inbox_queue (ordering_key) WHERE head;

DROP TRIGGER inbox_queue_key_arrived_by_insert ON inbox_queue;
DROP TRIGGER inbox_queue_key_arrived_by_update ON inbox_queue;
DROP TRIGGER inbox_queue_key_released_by_delete ON inbox_queue;
DROP TRIGGER inbox_queue_key_released_by_update ON inbox_queue;
DROP FUNCTION inbox_keys_arrived();
DROP FUNCTION inbox_key_arrived();
DROP FUNCTION inbox_release_key();
DROP FUNCTION inbox_key_head_due(text);
DROP FUNCTION inbox_key_next_look(text, bigint, timestamptz);

DROP INDEX inbox_keys_due;
ALTER TABLE inbox_keys DROP COLUMN holder, DROP COLUMN due_at, DROP COLUMN arrivals;
-- A key's row is written when the key falls idle, once for each run of its events: room on each
-- page for the new versions of all its rows keeps those updates on the page (heap-only), where a
-- full page would move each to another and add an index entry (a fifth of the database's time
-- in a drain over 10,000 keys, two events each, at migration 18's 80 %).
ALTER TABLE inbox_keys SET (fillfactor = 50);

-- Settles the heads of `keys`, whose `inbox_keys` rows the caller holds locked (so no other
-- writer changes their events meanwhile; a claim may still take a ready head). First a ready
-- head with a lower event waiting steps back, unless it is locked (a claim taking it: it runs
-- first, and the lower event after it, as a late arrival), leaving what it carried in the key's
-- row; then each key that is not blocked and has no head gets its lowest waiting event as head,
-- carrying the key's processed sequence. VOLATILE, so each statement reads a
-- snapshot taken after the caller's locks were granted: every event committed before is seen.
--
-- Every lookup is a `LATERAL` subquery with a `LIMIT`, which the planner cannot turn into a
-- join: its plans are made once per session, and the generic plans of plain joins, costed on
-- statistics of a small queue, read every head of the queue for each key settled. The rows are
-- then updated by primary key alone (a head is re-checked under its lock; the waiting events
-- of a locked key change only under that lock).
CREATE FUNCTION inbox_settle_heads(keys text[]) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    WITH stepped_back AS (
        UPDATE inbox_queue AS queue SET head = false
        WHERE queue.id = ANY(ARRAY(
            SELECT held.id FROM unnest(keys) AS key(ordering_key)
            CROSS JOIN LATERAL (
                SELECT waiting.ordering_sequence, waiting.id FROM inbox_queue AS waiting
                WHERE waiting.ordering_key = key.ordering_key AND NOT waiting.head
                ORDER BY waiting.ordering_sequence, waiting.id LIMIT 1
            ) AS lowest
            CROSS JOIN LATERAL (
                SELECT ready.id FROM inbox_queue AS ready
                WHERE ready.ordering_key = key.ordering_key AND ready.head AND ready.status = 0
                  AND (ready.ordering_sequence, ready.id) > (lowest.ordering_sequence, lowest.id)
                LIMIT 1
                FOR UPDATE SKIP LOCKED
            ) AS held))
        RETURNING queue.ordering_key, queue.key_processed_sequence
    )
    UPDATE inbox_keys AS key
    SET processed_sequence = greatest(key.processed_sequence, stepped_back.key_processed_sequence)
    FROM stepped_back WHERE key.ordering_key = stepped_back.ordering_key;

    UPDATE inbox_queue AS queue
    SET head = true, key_processed_sequence = promoted.processed_sequence
    FROM (
        SELECT lowest.id, state.processed_sequence FROM unnest(keys) AS key(ordering_key)
        CROSS JOIN LATERAL (
            SELECT waiting.id FROM inbox_queue AS waiting
            WHERE waiting.ordering_key = key.ordering_key AND NOT waiting.head
            ORDER BY waiting.ordering_sequence, waiting.id LIMIT 1
        ) AS lowest
        LEFT JOIN LATERAL (
            SELECT held.id FROM inbox_queue AS held
            WHERE held.ordering_key = key.ordering_key AND held.head LIMIT 1
        ) AS held ON true
        LEFT JOIN LATERAL (
            SELECT state.blocked_by, state.processed_sequence FROM inbox_keys AS state
            WHERE state.ordering_key = key.ordering_key LIMIT 1
        ) AS state ON true
        WHERE held.id IS NULL AND state.blocked_by IS NULL
    ) AS promoted
    WHERE queue.id = promoted.id;
END
$$;
-- Planned while the queue is small, its lookups would be sequential scans kept for the session
-- (migration 16).
ALTER FUNCTION inbox_settle_heads(text[]) SET enable_seqscan = off;

-- Locks the rows of `keys` (in key order, as every writer of keys locks them, so that two never
-- deadlock), creating those missing (`DO UPDATE` locks a row even when its `WHERE` leaves it
-- unwritten).
CREATE FUNCTION inbox_lock_keys(keys text[]) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO inbox_keys AS key (ordering_key)
    SELECT DISTINCT ordering_key FROM unnest(keys) AS key(ordering_key) ORDER BY ordering_key
    ON CONFLICT (ordering_key) DO UPDATE SET ordering_key = excluded.ordering_key WHERE false;
END
$$;

-- Arrivals of a statement (an ingest, a replay, a release): their keys are locked, then those
-- whose head an arrival may change are settled: a key without a head, and one whose ready head
-- an arrival precedes. A key's ready head precedes every event waiting behind it (whoever
-- settles a key leaves it so), so a key whose head is in processing, or precedes every
-- arrival, is left as it is: the arrivals wait behind it. That is the case of every event but
-- the first of a key's backlog, which then costs its ingest a lock and a look at the head.
CREATE FUNCTION inbox_keys_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    keys text[];
    unsettled text[];
BEGIN
    SELECT array_agg(DISTINCT ordering_key) INTO keys FROM arrived WHERE ordering_key IS NOT NULL;
    IF keys IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM inbox_lock_keys(keys);
    SELECT array_agg(first.ordering_key) INTO unsettled
    FROM (
        SELECT DISTINCT ON (ordering_key) ordering_key, ordering_sequence, id FROM arrived
        WHERE ordering_key IS NOT NULL
        ORDER BY ordering_key, ordering_sequence, id
    ) AS first
    LEFT JOIN LATERAL (
        SELECT held.id, held.status, held.ordering_sequence FROM inbox_queue AS held
        WHERE held.ordering_key = first.ordering_key AND held.head LIMIT 1
    ) AS held ON true
    WHERE held.id IS NULL
       OR (held.status = 0
           AND (first.ordering_sequence, first.id) < (held.ordering_sequence, held.id));
    IF unsettled IS NOT NULL THEN
        PERFORM inbox_settle_heads(unsettled);
    END IF;
    RETURN NULL;
END
$$;
ALTER FUNCTION inbox_keys_arrived() SET enable_seqscan = off;

CREATE TRIGGER inbox_queue_key_arrived_by_insert
    AFTER INSERT ON inbox_queue
    REFERENCING NEW TABLE AS arrived
    FOR EACH STATEMENT
    EXECUTE FUNCTION inbox_keys_arrived();

-- A row moved to another key or place in its key (an operator's or a test's update: nothing in
-- the product does it) joins its new key as an arrival, waiting; a head it was leaves its old key,
-- and what it carried stays in that key's row.
CREATE FUNCTION inbox_key_moving() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.head := false;
    RETURN NEW;
END
$$;

CREATE TRIGGER inbox_queue_key_moving
    BEFORE UPDATE OF ordering_key, ordering_sequence ON inbox_queue
    FOR EACH ROW
    WHEN (OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
          OR OLD.ordering_sequence IS DISTINCT FROM NEW.ordering_sequence)
    EXECUTE FUNCTION inbox_key_moving();

CREATE FUNCTION inbox_key_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    keys text[] := array_remove(ARRAY[OLD.ordering_key, NEW.ordering_key], NULL);
BEGIN
    PERFORM inbox_lock_keys(keys);
    IF OLD.head THEN
        UPDATE inbox_keys
        SET processed_sequence = greatest(processed_sequence, OLD.key_processed_sequence)
        WHERE ordering_key = OLD.ordering_key;
    END IF;
    PERFORM inbox_settle_heads(keys);
    RETURN NULL;
END
$$;

CREATE TRIGGER inbox_queue_key_moved
    AFTER UPDATE OF ordering_key, ordering_sequence ON inbox_queue
    FOR EACH ROW
    WHEN (OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
          OR OLD.ordering_sequence IS DISTINCT FROM NEW.ordering_sequence)
    EXECUTE FUNCTION inbox_key_moved();

-- A head leaving the queue other than by the keyed completion (which settles its keys itself and
-- names itself in `inbox.keys_released_by`, migration 19) leaves what it carried in the key's
-- row, and its own sequence too when done; dead, its ordering is kept for a replay and it blocks
-- the key unless its provider releases dead heads; then the key is settled. A head returning to ready (a retry,
-- a rescue, a release) is settled with its key, so a lower event that arrived meanwhile goes
-- first. The key row is locked first: the settling reads what was committed before.
CREATE FUNCTION inbox_head_left() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    finished_status smallint;
    releases boolean;
BEGIN
    PERFORM 1 FROM inbox_keys WHERE ordering_key = OLD.ordering_key FOR NO KEY UPDATE;
    IF TG_OP = 'DELETE' THEN
        SELECT status INTO finished_status FROM inbox_finished WHERE id = OLD.id;
        UPDATE inbox_keys
        SET processed_sequence = greatest(processed_sequence, OLD.key_processed_sequence,
            CASE WHEN finished_status = 2 THEN OLD.ordering_sequence END)
        WHERE ordering_key = OLD.ordering_key;
        IF finished_status = 3 THEN
            SELECT release_dead INTO releases FROM inbox_ordering_providers
            WHERE provider = split_part(OLD.ordering_key, ':', 1);
            INSERT INTO inbox_dead_ordering (id, ordering_key, ordering_sequence)
            VALUES (OLD.id, OLD.ordering_key, OLD.ordering_sequence)
            ON CONFLICT (id) DO UPDATE
                SET ordering_key = excluded.ordering_key,
                    ordering_sequence = excluded.ordering_sequence;
            IF NOT coalesce(releases, false) THEN
                UPDATE inbox_keys SET blocked_by = OLD.id, blocked_since = now()
                WHERE ordering_key = OLD.ordering_key;
            END IF;
        END IF;
    END IF;
    PERFORM inbox_settle_heads(ARRAY[OLD.ordering_key]);
    RETURN NULL;
END
$$;
ALTER FUNCTION inbox_head_left() SET enable_seqscan = off;

CREATE TRIGGER inbox_queue_head_left_by_delete
    AFTER DELETE ON inbox_queue
    FOR EACH ROW
    WHEN (OLD.head
          AND current_setting('inbox.keys_released_by', true) IS DISTINCT FROM
              OLD.lease_token::text || ' ' || statement_timestamp()::text)
    EXECUTE FUNCTION inbox_head_left();

CREATE TRIGGER inbox_queue_head_back_to_ready
    AFTER UPDATE OF status ON inbox_queue
    FOR EACH ROW
    WHEN (OLD.head AND NEW.head AND OLD.status = 1 AND NEW.status = 0)
    EXECUTE FUNCTION inbox_head_left();

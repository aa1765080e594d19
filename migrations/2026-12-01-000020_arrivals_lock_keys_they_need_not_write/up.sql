-- An arrival writes its key's row only when it changes what a claim reads: when the key is held
-- (the holder's completion compares `arrivals` to learn of events it may not have seen), has no
-- due time, or falls due later than the arrival. A key already due no later than the arrival,
-- the case of every event but the first of a key's backlog, is locked and left as it is: the
-- upsert of each such event wrote a new version of its key's row, 6 us of the database's time
-- per event, a sixth of what storing an ordered event costs. The lock stays (`ON CONFLICT DO
-- UPDATE` locks the row whether or not its `WHERE` holds), so whoever frees or takes the key
-- still waits for the arrival's commit, and a claim still passes a key an arrival holds.
--
-- A claim that finds a key's head not due yet compared `arrivals` to learn whether an event
-- arrived since its snapshot before putting the key off; an arrival that only locked the key
-- no longer moves it. The claim now asks `inbox_key_next_look` instead, which reads the key's
-- head in a snapshot of its own, taken after the claim locked the key: every arrival committed
-- by then is seen, and any later one waits for the claim's commit and then lowers the due time
-- it finds, as any arrival does.

CREATE OR REPLACE FUNCTION inbox_keys_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO inbox_keys AS key (ordering_key, due_at, arrivals)
    SELECT ordering_key, min(next_attempt_at), count(*) FROM arrived
    WHERE ordering_key IS NOT NULL AND status = 0
    GROUP BY ordering_key ORDER BY ordering_key
    ON CONFLICT (ordering_key) DO UPDATE
        SET due_at = CASE WHEN key.holder IS NULL THEN least(key.due_at, excluded.due_at) END,
            arrivals = key.arrivals + excluded.arrivals
        WHERE key.holder IS NOT NULL OR key.due_at IS NULL OR key.due_at > excluded.due_at;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION inbox_key_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO inbox_keys AS key (ordering_key, due_at, arrivals)
    VALUES (NEW.ordering_key, NEW.next_attempt_at, 1)
    ON CONFLICT (ordering_key) DO UPDATE
        SET due_at = CASE WHEN key.holder IS NULL THEN least(key.due_at, excluded.due_at) END,
            arrivals = key.arrivals + 1
        WHERE key.holder IS NOT NULL OR key.due_at IS NULL OR key.due_at > excluded.due_at;
    RETURN NULL;
END
$$;

-- When a claim that locked a free key and did not claim its head (`seen_head`, NULL when it saw
-- none) should look at the key again: `seen_next_look` if the head is still the one it saw;
-- otherwise when the head now there falls due (now, if it is not ready: a head in processing
-- that no key holds, which the unique index and the claim rule out, is looked at rather than
-- forgotten); NULL when the key has no event queued. VOLATILE, so its query takes a snapshot of
-- its own, after the claim's locks: an event that arrived since the claim's snapshot is seen.
CREATE FUNCTION inbox_key_next_look(key text, seen_head bigint, seen_next_look timestamptz)
RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    head record;
BEGIN
    SELECT id, status, next_attempt_at INTO head FROM inbox_queue
    WHERE ordering_key = key
    ORDER BY ordering_sequence, id LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF head.id = seen_head THEN
        RETURN seen_next_look;
    END IF;
    RETURN CASE WHEN head.status = 0 THEN head.next_attempt_at ELSE now() END;
END
$$;
-- Planned while the queue is small, its lookup would be a sequential scan kept for the session
-- (migration 16).
ALTER FUNCTION inbox_key_next_look(text, bigint, timestamptz) SET enable_seqscan = off;

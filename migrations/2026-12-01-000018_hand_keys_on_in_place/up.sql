-- A busy key passes from one event to the next (the hand-on, at every completion) in a heap-only
-- update: no index of `inbox_keys` names `holder` any more. The index of free keys due now
-- tested `holder IS NULL`, so each change of holder wrote a new entry in every index of the
-- table, and a busy key's primary-key entries piled up between vacuums for each lookup and
-- unique check to step over. A held key now has no due time instead (`due_at` NULL: a claim
-- clears it as it takes the key, arrivals leave it alone while the key is held), so the
-- index keeps only free keys without testing the holder; whoever frees a key sets its due
-- time, under the key's lock, from what is queued then (migration 11).
UPDATE inbox_keys SET due_at = NULL WHERE holder IS NOT NULL AND due_at IS NOT NULL;

DROP INDEX inbox_keys_due;
CREATE INDEX inbox_keys_due ON inbox_keys (due_at) WHERE blocked_by IS NULL AND due_at IS NOT NULL;

-- Room on each page for a row's next version, so its updates stay on its page.
ALTER TABLE inbox_keys SET (fillfactor = 80);

CREATE OR REPLACE FUNCTION inbox_keys_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO inbox_keys AS key (ordering_key, due_at, arrivals)
    SELECT ordering_key, min(next_attempt_at), count(*) FROM arrived
    WHERE ordering_key IS NOT NULL AND status = 0
    GROUP BY ordering_key ORDER BY ordering_key
    ON CONFLICT (ordering_key) DO UPDATE
        SET due_at = CASE WHEN key.holder IS NULL THEN least(key.due_at, excluded.due_at) END,
            arrivals = key.arrivals + excluded.arrivals;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION inbox_key_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO inbox_keys AS key (ordering_key, due_at, arrivals)
    VALUES (NEW.ordering_key, NEW.next_attempt_at, 1)
    ON CONFLICT (ordering_key) DO UPDATE
        SET due_at = CASE WHEN key.holder IS NULL THEN least(key.due_at, excluded.due_at) END,
            arrivals = key.arrivals + 1;
    RETURN NULL;
END
$$;

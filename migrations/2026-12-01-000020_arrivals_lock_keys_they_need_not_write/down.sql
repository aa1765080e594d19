DROP FUNCTION inbox_key_next_look(text, bigint, timestamptz);

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

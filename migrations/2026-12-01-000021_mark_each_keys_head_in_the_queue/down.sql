-- Back to keys taken and freed through their `inbox_keys` rows (migrations 8 to 20).
DROP TRIGGER inbox_queue_head_back_to_ready ON inbox_queue;
DROP TRIGGER inbox_queue_head_left_by_delete ON inbox_queue;
DROP FUNCTION inbox_head_left();
DROP TRIGGER inbox_queue_key_moved ON inbox_queue;
DROP FUNCTION inbox_key_moved();
DROP TRIGGER inbox_queue_key_moving ON inbox_queue;
DROP FUNCTION inbox_key_moving();
DROP TRIGGER inbox_queue_key_arrived_by_insert ON inbox_queue;
DROP FUNCTION inbox_keys_arrived();
DROP FUNCTION inbox_lock_keys(text[]);
DROP FUNCTION inbox_settle_heads(text[]);

UPDATE inbox_keys SET processed_sequence = greatest(inbox_keys.processed_sequence,
                                                    held.key_processed_sequence)
FROM inbox_queue AS held
WHERE held.ordering_key = inbox_keys.ordering_key AND held.head;
ALTER TABLE inbox_keys
    ADD COLUMN holder bigint,
    ADD COLUMN due_at timestamptz,
    ADD COLUMN arrivals bigint NOT NULL DEFAULT 0;
UPDATE inbox_keys SET holder = busy.id
FROM inbox_queue AS busy
WHERE busy.ordering_key = inbox_keys.ordering_key AND busy.status = 1;
UPDATE inbox_keys SET due_at = (
    SELECT CASE WHEN queued.status = 0 THEN queued.next_attempt_at ELSE now() END
    FROM inbox_queue AS queued WHERE queued.ordering_key = inbox_keys.ordering_key
    ORDER BY queued.ordering_sequence, queued.id LIMIT 1)
WHERE holder IS NULL;
ALTER TABLE inbox_keys SET (fillfactor = 80);
CREATE INDEX inbox_keys_due ON inbox_keys (due_at) WHERE blocked_by IS NULL AND due_at IS NOT NULL;

DROP INDEX inbox_queue_one_head_per_key;
CREATE UNIQUE INDEX inbox_queue_one_processing_per_key ON inbox_queue (ordering_key)
    WHERE status = 1 AND ordering_key IS NOT NULL;
DROP INDEX inbox_queue_key_order;
CREATE INDEX inbox_queue_key_order ON inbox_queue (ordering_key, ordering_sequence, id)
    WHERE ordering_key IS NOT NULL;
DROP INDEX inbox_queue_ready;
CREATE INDEX inbox_queue_ready ON inbox_queue (next_attempt_at)
    WHERE status = 0 AND ordering_key IS NULL;
ALTER TABLE inbox_queue
    DROP CONSTRAINT inbox_queue_processing_is_head,
    DROP CONSTRAINT inbox_queue_head_is_ordered,
    DROP COLUMN key_processed_sequence,
    DROP COLUMN head;

CREATE FUNCTION inbox_key_head_due(key text) RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT CASE WHEN status = 0 THEN next_attempt_at ELSE now() END
            FROM inbox_queue WHERE ordering_key = key
            ORDER BY ordering_sequence, id LIMIT 1);
END
$$;

CREATE FUNCTION inbox_release_key() RETURNS trigger LANGUAGE plpgsql AS $$
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
ALTER FUNCTION inbox_release_key() SET enable_seqscan = off;

CREATE FUNCTION inbox_keys_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE FUNCTION inbox_key_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
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
ALTER FUNCTION inbox_key_next_look(text, bigint, timestamptz) SET enable_seqscan = off;

CREATE TRIGGER inbox_queue_key_arrived_by_insert
    AFTER INSERT ON inbox_queue
    REFERENCING NEW TABLE AS arrived
    FOR EACH STATEMENT
    EXECUTE FUNCTION inbox_keys_arrived();
CREATE TRIGGER inbox_queue_key_arrived_by_update
    AFTER UPDATE OF status, ordering_key, ordering_sequence, next_attempt_at ON inbox_queue
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL AND NEW.status = 0
          AND (OLD.status <> 0 OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key
               OR OLD.ordering_sequence IS DISTINCT FROM NEW.ordering_sequence
               OR OLD.next_attempt_at IS DISTINCT FROM NEW.next_attempt_at))
    EXECUTE FUNCTION inbox_key_arrived();
CREATE TRIGGER inbox_queue_key_released_by_update
    AFTER UPDATE OF status ON inbox_queue
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND OLD.status = 1 AND NEW.status <> 1)
    EXECUTE FUNCTION inbox_release_key();
CREATE TRIGGER inbox_queue_key_released_by_delete
    AFTER DELETE ON inbox_queue
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND OLD.status = 1
          AND current_setting('inbox.keys_released_by', true) IS DISTINCT FROM
              OLD.lease_token::text || ' ' || statement_timestamp()::text)
    EXECUTE FUNCTION inbox_release_key();


DROP TRIGGER inbox_queue_key_arrived_by_update ON inbox_queue;
DROP FUNCTION inbox_key_arrived();
DROP TRIGGER inbox_queue_key_arrived_by_insert ON inbox_queue;
DROP FUNCTION inbox_keys_arrived();
CREATE OR REPLACE FUNCTION inbox_release_key() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    finished_status smallint;
    releases boolean;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        UPDATE inbox_keys SET holder = NULL
        WHERE ordering_key = OLD.ordering_key AND holder = OLD.id;
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
        UPDATE inbox_keys SET holder = NULL,
            blocked_by = CASE WHEN coalesce(releases, false) THEN blocked_by ELSE OLD.id END,
            blocked_since = CASE WHEN coalesce(releases, false) THEN blocked_since ELSE now() END
        WHERE ordering_key = OLD.ordering_key AND holder = OLD.id;
    ELSE
        UPDATE inbox_keys SET holder = NULL,
            processed_sequence = CASE WHEN finished_status = 2
                THEN greatest(processed_sequence, OLD.ordering_sequence)
                ELSE processed_sequence END
        WHERE ordering_key = OLD.ordering_key AND holder = OLD.id;
    END IF;
    RETURN NULL;
END
$$;
DROP FUNCTION inbox_key_head_due(text);
CREATE INDEX inbox_queue_ready_ordered ON inbox_queue (next_attempt_at)
    WHERE status = 0 AND ordering_key IS NOT NULL;
DROP INDEX inbox_keys_due;
ALTER TABLE inbox_keys DROP COLUMN arrivals, DROP COLUMN due_at;

-- Without their ordering, queued events of a key would run at once and out of order, and a
-- dead head's block would be lifted unannounced: refused while any is left.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM inbox_queue WHERE ordering_key IS NOT NULL)
       OR EXISTS (SELECT 1 FROM inbox_dead_ordering) THEN
        RAISE EXCEPTION 'ordered events are queued or dead: let them finish and replay, skip or delete the dead ones before reverting this migration';
    END IF;
END
$$;
DROP TRIGGER inbox_queue_key_released_by_delete ON inbox_queue;
DROP TRIGGER inbox_queue_key_released_by_update ON inbox_queue;
DROP FUNCTION inbox_release_key();
DROP TABLE inbox_key_skips;
DROP TABLE inbox_dead_ordering;
DROP TABLE inbox_ordering_providers;
DROP TABLE inbox_keys;
DROP INDEX inbox_queue_one_processing_per_key;
DROP INDEX inbox_queue_key_order;
DROP INDEX inbox_queue_ready_ordered;
DROP INDEX inbox_queue_ready;
CREATE INDEX inbox_queue_ready ON inbox_queue (next_attempt_at) WHERE status = 0;
ALTER TABLE inbox_queue
    DROP CONSTRAINT inbox_queue_ordering_key_length,
    DROP CONSTRAINT inbox_queue_ordering_sequence_iff_key,
    DROP COLUMN ordering_sequence,
    DROP COLUMN ordering_key;

-- The keyed completion (`inbox::complete_all_keyed`) hands each key of its events on, or frees
-- it, in the statement itself. The row trigger of migration 8 then only found each key passed
-- on already, at a PL/pgSQL call, a locking key lookup and a save and restore of its
-- `enable_seqscan` (migration 16) per event: a sixth of the database's time in a drain over
-- 10,000 keys. The statement names itself in `inbox.keys_released_by`, as its lease token and
-- its start, and the trigger no longer fires for the rows that statement deletes. Every other
-- deletion of an event in processing (a dead letter, a rescue, an operator's action, a
-- completion by any other statement) fires it as before; so does any later statement of the
-- same transaction, which starts at another time.
DROP TRIGGER inbox_queue_key_released_by_delete ON inbox_queue;
CREATE TRIGGER inbox_queue_key_released_by_delete
    AFTER DELETE ON inbox_queue
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND OLD.status = 1
          AND current_setting('inbox.keys_released_by', true) IS DISTINCT FROM
              OLD.lease_token::text || ' ' || statement_timestamp()::text)
    EXECUTE FUNCTION inbox_release_key();

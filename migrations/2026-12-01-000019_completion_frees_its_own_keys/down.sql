DROP TRIGGER inbox_queue_key_released_by_delete ON inbox_queue;
CREATE TRIGGER inbox_queue_key_released_by_delete
    AFTER DELETE ON inbox_queue
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND OLD.status = 1)
    EXECUTE FUNCTION inbox_release_key();

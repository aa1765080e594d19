-- The purge deletes a day's outcomes (`inbox_finished`) before it detaches the day's
-- partition of the journal; until the detach, those events have a journal row and no state,
-- and the view gave them a NULL status, which every reader (the console's pages, `worker
-- list`, `worker show`) failed to load. The view leaves them out: an event being dropped is
-- already gone.

CREATE OR REPLACE VIEW webhook_inbox AS
SELECT event.id, event.provider, event.event_id, event.event_type, event.received_at,
       event.headers, event.body, event.body_sha256,
       coalesce(queue.status, finished.status) AS status,
       coalesce(queue.attempt, finished.attempt) AS attempt,
       coalesce(queue.next_attempt_at, finished.processed_at) AS next_attempt_at,
       queue.lease_token,
       coalesce(queue.locked_by, finished.locked_by) AS locked_by,
       queue.locked_until,
       coalesce(queue.last_error, finished.last_error) AS last_error,
       finished.processed_at
FROM inbox_events AS event
LEFT JOIN inbox_queue AS queue USING (id)
LEFT JOIN inbox_finished AS finished USING (id)
WHERE queue.id IS NOT NULL OR finished.id IS NOT NULL;

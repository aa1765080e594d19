-- The worker's loop at its cheapest: claim 100 due queue rows under a lease, reading each
-- event's journal columns and body (one statement, its own commit), then complete them by id,
-- fenced by the lease token, as the worker does: queue rows deleted, finished rows written (a
-- second statement and commit). pgbench keeps one row of a result, so the claim hands the
-- completion its ids as one array (a parameter: run it with `-M prepared` or `-M extended`).
\set tag random(1, 2000000000)
WITH claimed AS (
    UPDATE inbox_queue AS queue
    SET status = 1, attempt = queue.attempt + 1, lease_token = md5(:client_id || '-' || :tag)::uuid,
        locked_by = 'pgbench', locked_until = now() + interval '30 seconds'
    WHERE queue.id = ANY(ARRAY(SELECT id FROM inbox_queue
                               WHERE status = 0 AND ordering_key IS NULL AND next_attempt_at <= now()
                               ORDER BY next_attempt_at LIMIT 100 FOR UPDATE SKIP LOCKED))
    RETURNING queue.id, queue.attempt, queue.next_attempt_at
), read AS (
    SELECT event.id, event.provider, event.event_id, event.event_type, event.received_at,
           event.headers, event.body, claimed.attempt
    FROM claimed JOIN inbox_events AS event ON event.id = claimed.id
    ORDER BY claimed.next_attempt_at, event.id
)
SELECT coalesce(array_agg(id), '{}') AS ids, sum(length(body) + length(headers::text)) AS bytes FROM read
\gset
WITH completed AS (
    DELETE FROM inbox_queue
    WHERE id = ANY(:ids::bigint[]) AND lease_token = md5(:client_id || '-' || :tag)::uuid
      AND status = 1
    RETURNING id, attempt, locked_by
)
INSERT INTO inbox_finished (id, status, attempt, locked_by, processed_at)
SELECT id, 2, attempt, locked_by, clock_timestamp() FROM completed;

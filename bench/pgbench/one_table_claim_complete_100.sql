-- The reference: the worker's loop at its cheapest on the one-table inbox of migrations 1-4 (before
-- the queue was split from the journal): claim 100 due rows under a lease (one statement, its
-- own commit), then complete them, fenced by the lease token (a second statement and commit).
\set tag random(1, 2000000000)
UPDATE webhook_inbox AS inbox
SET status = 1, attempt = inbox.attempt + 1, lease_token = md5(:client_id || '-' || :tag)::uuid,
    locked_by = 'pgbench', locked_until = now() + interval '30 seconds'
FROM (SELECT id FROM webhook_inbox WHERE status = 0 AND next_attempt_at <= now()
      ORDER BY next_attempt_at LIMIT 100 FOR UPDATE SKIP LOCKED) AS due
WHERE inbox.id = due.id;
UPDATE webhook_inbox
SET status = 2, processed_at = now(), lease_token = NULL, locked_until = NULL
WHERE lease_token = md5(:client_id || '-' || :tag)::uuid AND status = 1;

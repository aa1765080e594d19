-- The reference database's backlog: :events ready rows with 1 KiB bodies in the one-table inbox.
INSERT INTO webhook_inbox (provider, event_id, event_type, headers, body, body_sha256)
SELECT 'bench', 'prefill-' || g, 'bench.event', '{"content-type":"application/json"}'::jsonb,
       convert_to('{"id":"prefill-' || g || '","padding":"' || repeat('x', 990) || '"}', 'UTF8'),
       sha256(convert_to(g::text, 'UTF8'))
FROM generate_series(1, :events) AS g;
VACUUM ANALYZE webhook_inbox;
CHECKPOINT;

-- Multi-row ingest: 64 events per INSERT ... ON CONFLICT DO NOTHING and commit (journal rows and
-- their queue rows, as the receiver writes them).
WITH inserted AS (
    INSERT INTO inbox_events (provider, event_id, event_type, headers, body, body_sha256)
    SELECT 'pgbench', 'many-' || :client_id || '-' || gen_random_uuid(), 'bench.event',
           '{"content-type": "application/json", "x-signature": "sha256=0000000000000000000000000000000000000000000000000000000000000000"}',
           convert_to(repeat('x', 1024), 'UTF8'), sha256('x'::bytea)
    FROM generate_series(1, 64)
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING id
)
INSERT INTO inbox_queue (id) SELECT id FROM inserted;

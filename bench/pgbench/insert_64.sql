-- Multi-row ingest: 64 events per INSERT ... ON CONFLICT DO NOTHING and commit (dedup keys,
-- journal rows and queue rows, as the receiver writes them).
WITH input AS (
    SELECT 'pgbench' AS provider, 'many-' || :client_id || '-' || gen_random_uuid() AS event_id,
           sha256('x'::bytea) AS body_sha256
    FROM generate_series(1, 64)
), keyed AS (
    INSERT INTO inbox_dedup (provider, event_id, body_sha256)
    SELECT provider, event_id, body_sha256 FROM input
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING id, provider, event_id, body_sha256
), journaled AS (
    INSERT INTO inbox_events (id, provider, event_id, event_type, headers, body, body_sha256)
    SELECT id, provider, event_id, 'bench.event',
           '{"content-type": "application/json", "x-signature": "sha256=0000000000000000000000000000000000000000000000000000000000000000"}',
           convert_to(repeat('x', 1024), 'UTF8'), body_sha256
    FROM keyed
)
INSERT INTO inbox_queue (id) SELECT id FROM keyed;

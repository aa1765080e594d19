-- Ceiling of any one-commit-per-request receiver: one INSERT ... ON CONFLICT DO NOTHING per
-- transaction (the journal row and its queue row, as the receiver writes them), with a 1 KiB
-- body like the receiver benchmark's.
WITH inserted AS (
    INSERT INTO inbox_events (provider, event_id, event_type, headers, body, body_sha256)
    VALUES ('pgbench', 'one-' || :client_id || '-' || gen_random_uuid(), 'bench.event',
            '{"content-type": "application/json", "x-signature": "sha256=0000000000000000000000000000000000000000000000000000000000000000"}',
            convert_to(repeat('x', 1024), 'UTF8'), sha256('x'::bytea))
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING id
)
INSERT INTO inbox_queue (id) SELECT id FROM inserted;

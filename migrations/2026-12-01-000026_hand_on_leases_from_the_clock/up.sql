-- The keyed completion claims each key's next event under the completing attempt's lease
-- (the hand-on), `locked_until` a lease from `now()`: the start of the transaction, which
-- has run handlers by then, and a chain of them may take longer than a lease. The event
-- handed on then started with its lease already over, for the rescue to take (and run a
-- second time beside it) before the lease keeper's next pass. Its lease now counts from the
-- clock, as does the test of whether the next event is due.

CREATE OR REPLACE FUNCTION inbox_complete_keyed(ids bigint[], token uuid, worker text, lease_ms bigint,
                                     lock_keys boolean)
RETURNS TABLE (completed bigint, id bigint, provider text, event_id text, event_type text,
               received_at timestamptz, headers jsonb, body bytea, attempt integer,
               ordering_key text, ordering_sequence bigint, stale boolean, skip_stale boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    -- The keys' rows, in key order as every writer of a key locks them (so an arrival and a
    -- completion never deadlock). The statement below starts after these locks are granted,
    -- so its snapshot holds every event that arrived before; an arrival that comes later
    -- waits for this transaction, and then finds the key's new head (or none, and becomes it).
    IF lock_keys THEN
        PERFORM 1 FROM inbox_keys AS key
        WHERE key.ordering_key = ANY(ARRAY(
            SELECT queue.ordering_key FROM inbox_queue AS queue
            WHERE queue.id = ANY(ids) AND queue.lease_token = token AND queue.status + 0 = 1
              AND queue.ordering_key IS NOT NULL))
        ORDER BY key.ordering_key
        FOR NO KEY UPDATE;
    END IF;
    -- The statement settles the keys of the heads it deletes itself: the trigger that would
    -- settle them (migration 21) skips the rows it deletes (migration 19).
    PERFORM set_config('inbox.keys_released_by',
                       token::text || ' ' || statement_timestamp()::text, true);
    -- `status + 0`: see `inbox::lease`. Every lookup goes by key, and no two intermediate
    -- results are joined to each other (the planner cannot estimate their sizes). The pause
    -- test is the claim's (`inbox::pause::NOT_PAUSED_SQL`).
    RETURN QUERY
    WITH released_rows AS (
        DELETE FROM inbox_queue AS queue
        WHERE queue.id = ANY(ids) AND queue.lease_token = token AND queue.status + 0 = 1
        RETURNING queue.id, queue.attempt, queue.locked_by, queue.ordering_key,
                  queue.ordering_sequence, queue.key_processed_sequence
    ), released AS MATERIALIZED (
        SELECT released_rows.ordering_key,
               greatest(released_rows.key_processed_sequence, released_rows.ordering_sequence)
                   AS processed_sequence,
               next.id AS next_id,
               coalesce(next.next_attempt_at <= clock_timestamp() AND next.not_paused, false) AS hand_on
        FROM released_rows
        LEFT JOIN LATERAL (
            SELECT inbox_queue.id, inbox_queue.next_attempt_at,
                   (NOT EXISTS (SELECT 1 FROM inbox_paused_routes) OR NOT EXISTS (
                        SELECT 1 FROM inbox_events AS paused_event
                        JOIN inbox_paused_routes AS paused
                        ON paused.provider = paused_event.provider
                        AND (paused.event_type = '*'
                             OR paused.event_type = paused_event.event_type)
                        WHERE paused_event.id = inbox_queue.id)) AS not_paused
            FROM inbox_queue
            WHERE inbox_queue.ordering_key = released_rows.ordering_key AND NOT inbox_queue.head
            ORDER BY inbox_queue.ordering_sequence, inbox_queue.id
            LIMIT 1
        ) AS next ON true
        WHERE released_rows.ordering_key IS NOT NULL
    ), next_events AS MATERIALIZED (
        SELECT array_agg(released.next_id) FILTER (WHERE released.hand_on) AS handed_on,
               array_agg(released.next_id) FILTER (WHERE NOT released.hand_on) AS waiting,
               jsonb_object_agg(released.next_id, released.processed_sequence) AS sequences
        FROM released
        WHERE released.next_id IS NOT NULL
    ), handed_on AS (
        UPDATE inbox_queue AS queue
        SET head = true,
            key_processed_sequence =
                ((SELECT next_events.sequences FROM next_events) ->> queue.id::text)::bigint,
            status = 1, attempt = queue.attempt + 1, lease_token = token, locked_by = worker,
            locked_until = clock_timestamp() + lease_ms * interval '1 millisecond'
        WHERE queue.id = ANY((SELECT next_events.handed_on FROM next_events)::bigint[])
          AND NOT queue.head
        RETURNING queue.id, queue.status, queue.attempt, queue.next_attempt_at,
                  queue.ordering_key, queue.ordering_sequence,
                  queue.key_processed_sequence AS processed_sequence
    ), left_waiting AS (
        UPDATE inbox_queue AS queue
        SET head = true,
            key_processed_sequence =
                ((SELECT next_events.sequences FROM next_events) ->> queue.id::text)::bigint
        WHERE queue.id = ANY((SELECT next_events.waiting FROM next_events)::bigint[])
          AND NOT queue.head
        RETURNING queue.id, queue.status, queue.attempt, queue.next_attempt_at,
                  queue.ordering_key, queue.ordering_sequence,
                  queue.key_processed_sequence AS processed_sequence
    ), handed AS (
        SELECT * FROM handed_on UNION ALL SELECT * FROM left_waiting
    ), idle_keys AS MATERIALIZED (
        SELECT array_agg(released.ordering_key) AS keys,
               jsonb_object_agg(released.ordering_key, released.processed_sequence) AS sequences
        FROM released
        WHERE released.next_id IS NULL OR released.next_id NOT IN (SELECT handed.id FROM handed)
    ), idle AS (
        UPDATE inbox_keys AS key
        SET idle_since = now(),
            processed_sequence = greatest(key.processed_sequence,
            ((SELECT idle_keys.sequences FROM idle_keys) ->> key.ordering_key)::bigint)
        WHERE key.ordering_key = ANY((SELECT idle_keys.keys FROM idle_keys)::text[])
    ), finished AS (
        INSERT INTO inbox_finished AS done (id, status, attempt, locked_by, processed_at)
        SELECT released_rows.id, 2, released_rows.attempt, released_rows.locked_by,
               clock_timestamp()
        FROM released_rows
        RETURNING done.id
    )
    SELECT inbox_lease_held(total.count, cardinality(ids)), event.id, event.provider,
           event.event_id, event.event_type, event.received_at, event.headers, event.body,
           handed.attempt, handed.ordering_key, handed.ordering_sequence,
           coalesce(handed.ordering_sequence < handed.processed_sequence, false),
           coalesce(policy.skip_stale, false)
    FROM (SELECT count(*) AS count FROM finished) AS total
    LEFT JOIN (
        handed CROSS JOIN LATERAL (
            SELECT * FROM inbox_events
            WHERE inbox_events.id = handed.id AND handed.status = 1
            LIMIT 1
        ) AS event
        LEFT JOIN inbox_ordering_providers AS policy ON policy.provider = event.provider
    ) ON true
    ORDER BY handed.next_attempt_at, event.id;
END
$$;
ALTER FUNCTION inbox_complete_keyed(bigint[], uuid, text, bigint, boolean)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION inbox_complete_keyed(bigint[], uuid, text, bigint, boolean) SET jit = off;
ALTER FUNCTION inbox_complete_keyed(bigint[], uuid, text, bigint, boolean)
    SET enable_seqscan = off;
ALTER FUNCTION inbox_complete_keyed(bigint[], uuid, text, bigint, boolean)
    SET enable_bitmapscan = off;

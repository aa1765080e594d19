-- The keyed completion (`inbox::complete_all_keyed`) as one call: it locks its keys, then
-- completes its events and hands each key on, in two statements of one function. Sent by the
-- worker as two statements, with the settings that make them run their generic plans set
-- before and reset after, it cost three round trips (the settings, the statements, the reset);
-- and a completion of events that no handler takes ran in a transaction of its own (two more:
-- `BEGIN`, `COMMIT`) only to hold the keys' locks from the first statement to the second. A
-- call is one statement, which can run alone: the worker's connection is back in the pool
-- after one round trip.
--
-- Its statements run their generic plans (`plan_cache_mode`), made once per session: left to
-- the server, a completion of many events was planned anew at most calls, for 2.7 ms of its
-- CPU each. `enable_seqscan` and `enable_bitmapscan` off keep those plans reading by index,
-- whatever the statistics of the tables were when they were made (migration 16).
--
-- What it does is described with `inbox::complete_all_keyed`. In short: `ids`, claimed under
-- `token`, are completed (deleted from the queue, `done` in `inbox_finished`); each key of them
-- is handed on to its lowest event waiting, which becomes its head and, when it is due and its
-- route not paused, is claimed under `token` for `worker` for `lease_ms` and returned with its
-- journal columns; a key with nothing waiting keeps its processed sequence in its `inbox_keys`
-- row. Each row returned carries the count of events completed (`completed`); a call that hands
-- nothing on returns one row, its event columns null. With `lock_keys` false the caller's
-- transaction holds the keys' rows already (it handed them on to these events).
--
-- Unless every row of `ids` is still held under `token`, it raises `inbox_lease_held` (a check
-- violation) and changes nothing: the worker must not take a lease it lost for a completion,
-- nor be left holding events handed on by a completion that failed.
CREATE FUNCTION inbox_lease_held(completed bigint, expected integer) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF completed <> expected THEN
        RAISE EXCEPTION 'lease lost: % of % events still held', completed, expected
            USING ERRCODE = 'check_violation', CONSTRAINT = 'inbox_lease_held';
    END IF;
    RETURN completed;
END
$$;

CREATE FUNCTION inbox_complete_keyed(ids bigint[], token uuid, worker text, lease_ms bigint,
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
               coalesce(next.next_attempt_at <= now() AND next.not_paused, false) AS hand_on
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
    ), handed AS (
        UPDATE inbox_queue AS queue
        SET head = true, key_processed_sequence = released.processed_sequence,
            status = CASE WHEN released.hand_on THEN 1 ELSE 0 END,
            attempt = queue.attempt + CASE WHEN released.hand_on THEN 1 ELSE 0 END,
            lease_token = CASE WHEN released.hand_on THEN token END,
            locked_by = CASE WHEN released.hand_on THEN worker ELSE queue.locked_by END,
            locked_until = CASE WHEN released.hand_on
                THEN now() + lease_ms * interval '1 millisecond' END
        FROM released
        WHERE queue.id = released.next_id AND NOT queue.head
        RETURNING queue.id, queue.status, queue.attempt, queue.next_attempt_at,
                  queue.ordering_key, queue.ordering_sequence, released.processed_sequence
    ), idle AS (
        UPDATE inbox_keys AS key
        SET processed_sequence = greatest(key.processed_sequence, released.processed_sequence)
        FROM released
        WHERE key.ordering_key = released.ordering_key
          AND (released.next_id IS NULL
               OR released.next_id NOT IN (SELECT handed.id FROM handed))
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

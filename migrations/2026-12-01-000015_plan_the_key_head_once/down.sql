CREATE OR REPLACE FUNCTION inbox_key_head_due(key text) RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN status = 0 THEN next_attempt_at ELSE now() END
    FROM inbox_queue WHERE ordering_key = key
    ORDER BY ordering_sequence, id LIMIT 1
$$;

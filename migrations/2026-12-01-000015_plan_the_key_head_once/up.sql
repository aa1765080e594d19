-- The due time of a key's head, read by the trigger that frees a key at every completion of an
-- ordered event. As a LANGUAGE sql function whose body reads a table (so it is never inlined),
-- it was parsed and planned again at every call; PL/pgSQL keeps its plan for the session.
CREATE OR REPLACE FUNCTION inbox_key_head_due(key text) RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT CASE WHEN status = 0 THEN next_attempt_at ELSE now() END
            FROM inbox_queue WHERE ordering_key = key
            ORDER BY ordering_sequence, id LIMIT 1);
END
$$;

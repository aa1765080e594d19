-- Dropping a pause would resume its route unannounced, and the audit is the record of every
-- repair: both are refused rather than lost.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM inbox_paused_routes) THEN
        RAISE EXCEPTION 'routes are paused (inbox_paused_routes): resume them before reverting this migration';
    END IF;
    IF EXISTS (SELECT 1 FROM console_audit) THEN
        RAISE EXCEPTION 'console_audit holds the record of repairs: keep a copy and delete it deliberately before reverting this migration';
    END IF;
END
$$;
DROP FUNCTION inbox_body_jsonb(bytea);
DROP INDEX inbox_events_received_at;
DROP TABLE inbox_paused_routes;
DROP TABLE console_audit;

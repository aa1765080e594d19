DROP FUNCTION inbox_body_jsonb(bytea);
DROP INDEX inbox_events_received_at;
DROP TABLE inbox_paused_routes;
DROP TABLE console_audit;

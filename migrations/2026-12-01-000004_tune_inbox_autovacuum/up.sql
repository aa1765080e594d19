-- Every event is inserted once and updated twice (claim, completion), so the inbox gathers two
-- dead row versions per event, and the claim path walks the partial indexes they clutter.
-- PostgreSQL's defaults wait for 20 % of the table to be dead: with a dedup window of done rows
-- kept, that is millions of dead versions. Vacuum this table after 1 % instead, unthrottled,
-- and keep its statistics (the share of ready rows the claim is planned with) fresh.
ALTER TABLE webhook_inbox SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- Every day of the journal vacuums and analyzes as PostgreSQL's defaults say. The first day
-- partition is the table that was the journal before partitioning (migration 7), and it kept
-- what migration 4 gave that table when it was the queue as well: a vacuum after 5 % of rows
-- inserted and an analyze after 2 % of rows changed. On an insert-only day filling at a steady
-- rate that is a vacuum and an analyze of the whole day every minute (at 2,400 webhooks/s and
-- 4.4 GB, the analyze took 0.6 s of CPU and 1.75 s each time). The journal is read by key,
-- so the defaults keep its statistics fresh enough; the days created since have them already.
--
-- RESET takes a SHARE UPDATE EXCLUSIVE lock: inserts and reads go on meanwhile.
DO $migration$
DECLARE
    day regclass;
BEGIN
    FOR day IN SELECT inhrelid::regclass FROM pg_inherits
               WHERE inhparent = 'inbox_events'::regclass LOOP
        EXECUTE format('ALTER TABLE %s RESET (autovacuum_vacuum_insert_scale_factor, '
                       'autovacuum_analyze_scale_factor)', day);
    END LOOP;
END
$migration$;

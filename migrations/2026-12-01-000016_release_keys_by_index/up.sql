-- The trigger that frees a key at each completion of an ordered event reads `inbox_finished` and
-- `inbox_keys` by key. PL/pgSQL keeps its statements' plans for the session; planned while a
-- table is still small (a fresh deployment's first minutes, a worker started on an empty
-- database), a lookup was planned as a sequential scan and kept as one while the table grew
-- until an autoanalyze happened to replan it: in a 20,000-event ordered drain, reading the
-- finished row took a third of the database's time by the end. Its statements have an index
-- for every lookup they make, so the function plans them without sequential scans.
ALTER FUNCTION inbox_release_key() SET enable_seqscan = off;

-- Nothing to restore: the settings reset by this migration's up were a leftover on one day,
-- and no query depends on them.
SELECT 1;

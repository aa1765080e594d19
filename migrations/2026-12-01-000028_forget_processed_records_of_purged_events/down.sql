-- The records deleted were of events gone already: nothing to restore.
SELECT 1;

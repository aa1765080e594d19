ALTER TABLE demo_ledger DROP CONSTRAINT demo_ledger_ordering_trace;
ALTER TABLE demo_ledger
    DROP COLUMN written_at,
    DROP COLUMN stale,
    DROP COLUMN ordering_sequence,
    DROP COLUMN ordering_key;

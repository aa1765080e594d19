ALTER TABLE demo_ledger
    DROP COLUMN transaction_id,
    DROP COLUMN statement_started_at;

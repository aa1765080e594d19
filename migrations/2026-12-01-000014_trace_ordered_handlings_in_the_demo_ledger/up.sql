-- The demo handler's trace of ordered handlings, so that a run can be checked afterwards for
-- the promises of ordered processing: at most one event of a key at a time, in sequence order.
--
-- A ledger line is written in the transaction that completes its event, so only committed
-- handlings appear, one per event. For an event with an ordering key, the line also keeps the
-- key, the sequence, whether the event was handed over stale, and when the handler wrote it
-- (`written_at`, clock_timestamp()): with `recorded_at`, the start of that transaction, it
-- bounds the moment the handler ran. The next handling of the key may only start after this
-- one committed, so per key the intervals [recorded_at, written_at] never overlap, and the
-- lines in id order are the handlings in commit order.
--
-- Nullable, without defaults: adding them rewrites nothing, and unordered lines stay as they were.
ALTER TABLE demo_ledger
    ADD COLUMN ordering_key      text,
    ADD COLUMN ordering_sequence bigint,
    ADD COLUMN stale             boolean,
    ADD COLUMN written_at        timestamptz;

-- The trace of an ordered line is whole, and an unordered line has none.
ALTER TABLE demo_ledger
    ADD CONSTRAINT demo_ledger_ordering_trace CHECK (
        num_nulls(ordering_key, stale, written_at) IN (0, 3)
        AND (ordering_key IS NOT NULL OR ordering_sequence IS NULL)
    ) NOT VALID;
ALTER TABLE demo_ledger VALIDATE CONSTRAINT demo_ledger_ordering_trace;

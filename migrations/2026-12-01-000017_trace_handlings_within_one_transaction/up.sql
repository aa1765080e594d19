-- A busy key's events handed on within one transaction are handled one after the other in it,
-- each by a statement of its own (see the worker's hand-on). Their ledger lines share the
-- transaction's start (`recorded_at`), so that alone no longer bounds when each handling began.
-- An ordered line now also keeps the transaction that wrote it and when the writing statement
-- started: between lines of one transaction, a handling began with its statement; between
-- transactions, with its transaction, as before.
--
-- Nullable, without defaults: adding them rewrites nothing. Lines written before this migration
-- have neither; an ordered line written since has both.
ALTER TABLE demo_ledger
    ADD COLUMN transaction_id bigint,
    ADD COLUMN statement_started_at timestamptz;

-- Ordered processing per key, opt-in per provider. An ordered provider's events carry an
-- ordering key (`provider:value`, e.g. `stripe:pi_123`) and a sequence (the provider's own
-- timestamp or version; 0 for all when it has none, so arrival order decides). Within a key,
-- at most one event is in processing at any moment, and the next one claimed is the lowest
-- (sequence, id) still in the queue. Unordered events have a NULL key and the claim path of
-- before, on an index of their own.

ALTER TABLE inbox_queue
    ADD COLUMN ordering_key text,
    ADD COLUMN ordering_sequence bigint,
    ADD CONSTRAINT inbox_queue_ordering_sequence_iff_key
        CHECK ((ordering_key IS NULL) = (ordering_sequence IS NULL)),
    ADD CONSTRAINT inbox_queue_ordering_key_length CHECK (char_length(ordering_key) <= 330);

-- Unordered events: due ready rows, oldest first (the claim path of migration 5).
DROP INDEX inbox_queue_ready;
CREATE INDEX inbox_queue_ready ON inbox_queue (next_attempt_at)
    WHERE status = 0 AND ordering_key IS NULL;
-- Ordered events: due ready rows, oldest first, each checked to be its key's head.
CREATE INDEX inbox_queue_ready_ordered ON inbox_queue (next_attempt_at)
    WHERE status = 0 AND ordering_key IS NOT NULL;
-- A key's events in sequence order: its head is the first.
CREATE INDEX inbox_queue_key_order ON inbox_queue (ordering_key, ordering_sequence, id)
    WHERE ordering_key IS NOT NULL;
-- The guarantee itself, whatever a claim does: one event per key in processing.
CREATE UNIQUE INDEX inbox_queue_one_processing_per_key ON inbox_queue (ordering_key)
    WHERE status = 1 AND ordering_key IS NOT NULL;

-- One row per key ever claimed: who holds it, whether a dead head blocks it, and the highest
-- sequence processed (to recognise late arrivals). A claim takes a key by setting `holder`
-- under the row's lock, re-checked on the latest version, so two claims of one key
-- serialise on this row whatever their snapshots saw.
CREATE TABLE inbox_keys (
    ordering_key        text        PRIMARY KEY,
    -- the key's event in processing
    holder              bigint,
    -- the key's dead head, holding the key until an operator skips or replays it
    blocked_by          bigint,
    blocked_since       timestamptz,
    -- highest sequence of the key's events done so far
    processed_sequence  bigint,
    CONSTRAINT inbox_keys_blocked_since CHECK ((blocked_by IS NULL) = (blocked_since IS NULL))
);
CREATE INDEX inbox_keys_blocked ON inbox_keys (blocked_since) WHERE blocked_by IS NOT NULL;

-- Per ordered provider, what a dead head does to its key: block it (the default, also for
-- providers without a row) or release it. Written by the receiver from its provider file.
CREATE TABLE inbox_ordering_providers (
    provider      text    PRIMARY KEY,
    release_dead  boolean NOT NULL DEFAULT false,
    skip_stale    boolean NOT NULL DEFAULT false,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- The ordering of dead ordered events (their queue row is gone): a replay puts it back,
-- `worker show` reads it.
CREATE TABLE inbox_dead_ordering (
    id                 bigint PRIMARY KEY,
    ordering_key       text   NOT NULL,
    ordering_sequence  bigint NOT NULL
);

-- Every skip of a blocked key's dead head, with the operator's reason.
CREATE TABLE inbox_key_skips (
    id            bigserial   PRIMARY KEY,
    ordering_key  text        NOT NULL,
    event_row_id  bigint      NOT NULL,
    reason        text        NOT NULL,
    skipped_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT inbox_key_skips_reason_length CHECK (char_length(reason) BETWEEN 1 AND 2000)
);

-- An ordered event leaving processing frees its key, by whatever transition (completion,
-- retry, dead letter, rescue, release), so no transition of the lease state machine has to
-- know about keys. Leaving the queue dead, it blocks the key unless its provider releases
-- dead heads, and its ordering is kept for a replay. AFTER the statement's rows: the
-- inbox_finished row written by the same statement is visible.
CREATE FUNCTION inbox_release_key() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    finished_status smallint;
    releases boolean;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        UPDATE inbox_keys SET holder = NULL
        WHERE ordering_key = OLD.ordering_key AND holder = OLD.id;
        RETURN NULL;
    END IF;
    SELECT status INTO finished_status FROM inbox_finished WHERE id = OLD.id;
    IF finished_status = 3 THEN
        SELECT release_dead INTO releases FROM inbox_ordering_providers
        WHERE provider = split_part(OLD.ordering_key, ':', 1);
        INSERT INTO inbox_dead_ordering (id, ordering_key, ordering_sequence)
        VALUES (OLD.id, OLD.ordering_key, OLD.ordering_sequence)
        ON CONFLICT (id) DO UPDATE
            SET ordering_key = excluded.ordering_key, ordering_sequence = excluded.ordering_sequence;
        UPDATE inbox_keys SET holder = NULL,
            blocked_by = CASE WHEN coalesce(releases, false) THEN blocked_by ELSE OLD.id END,
            blocked_since = CASE WHEN coalesce(releases, false) THEN blocked_since ELSE now() END
        WHERE ordering_key = OLD.ordering_key AND holder = OLD.id;
    ELSE
        UPDATE inbox_keys SET holder = NULL,
            processed_sequence = CASE WHEN finished_status = 2
                THEN greatest(processed_sequence, OLD.ordering_sequence)
                ELSE processed_sequence END
        WHERE ordering_key = OLD.ordering_key AND holder = OLD.id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER inbox_queue_key_released_by_update
    AFTER UPDATE OF status ON inbox_queue
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND OLD.status = 1 AND NEW.status <> 1)
    EXECUTE FUNCTION inbox_release_key();
CREATE TRIGGER inbox_queue_key_released_by_delete
    AFTER DELETE ON inbox_queue
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL AND OLD.status = 1)
    EXECUTE FUNCTION inbox_release_key();

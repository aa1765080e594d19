-- Replays of body-only signatures, found by the dedup keys themselves.
--
-- GitHub, Shopify and other untimed schemes sign the body only; the delivery id and type come
-- from unsigned headers, so one seen delivery can be sent again under fresh ids. For the
-- providers that guard against it, the receiver writes a replay key with each dedup key:
-- SHA-256 of (provider, event type, body SHA-256), see inbox_core::inbox::replay_key. The
-- unique index below makes a second event with the same key conflict at insert, in the same
-- statement that deduplicates ids, so catching a replay costs a guarded event one index entry
-- and an unguarded one nothing (NULL keys are outside the partial index). A replay is then
-- stored in inbox_suppressed_replays under a key of its own (replay_key NULL): a redelivery
-- of its id is a duplicate, and releasing it needs no new key. The window is the dedup
-- window: the key goes when retention deletes the original's dedup row.
--
-- This replaces the side table of migration 9, which nothing wrote: one more row and two more
-- index entries per event where this is one entry.
DROP TABLE inbox_replay_bodies;

ALTER TABLE inbox_dedup ADD COLUMN replay_key bytea;
ALTER TABLE inbox_dedup
    ADD CONSTRAINT inbox_dedup_replay_key_length CHECK (octet_length(replay_key) = 32) NOT VALID;
ALTER TABLE inbox_dedup VALIDATE CONSTRAINT inbox_dedup_replay_key_length;
CREATE UNIQUE INDEX inbox_dedup_replay_key ON inbox_dedup (replay_key)
    WHERE replay_key IS NOT NULL;

-- Suppressed replays leave with the retention, like the events they copy.
CREATE INDEX inbox_suppressed_replays_received_at ON inbox_suppressed_replays (received_at);

DROP INDEX inbox_suppressed_replays_received_at;
DROP INDEX inbox_dedup_replay_key;
ALTER TABLE inbox_dedup DROP CONSTRAINT inbox_dedup_replay_key_length;
ALTER TABLE inbox_dedup DROP COLUMN replay_key;

CREATE TABLE inbox_replay_bodies (
    provider    text        NOT NULL,
    event_type  text        NOT NULL,
    body_sha256 bytea       NOT NULL,
    id          bigint      NOT NULL,
    seen_at     timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT inbox_replay_bodies_pkey PRIMARY KEY (provider, event_type, body_sha256)
);
CREATE INDEX inbox_replay_bodies_seen_at ON inbox_replay_bodies (seen_at);

-- The operator console's state: an audit of every repair action, and paused routes.

-- Every repair action (replay, pause, resume, abort), who did it, on what, and how many events
-- it touched. A background replay writes its row when it starts and updates `affected` and
-- `outcome` as its batches commit, so the row tells the truth even if the console dies.
CREATE TABLE console_audit (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    -- the console user who acted
    actor    text        NOT NULL,
    action   text        NOT NULL,
    -- what the action applied to: the event, the list filter or the route, as JSON
    target   jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- how many events the estimate counted before a replay by filter (NULL otherwise)
    estimated bigint,
    -- how many events it changed so far
    affected bigint      NOT NULL DEFAULT 0,
    -- running, done, aborted or failed
    outcome  text        NOT NULL,

    CONSTRAINT console_audit_outcome_known CHECK (outcome IN ('running', 'done', 'aborted', 'failed')),
    CONSTRAINT console_audit_affected_not_negative CHECK (affected >= 0)
);

-- A paused route: its events stay ready and no worker claims them until it is resumed;
-- ingest goes on. `event_type` '*' pauses every type of the provider.
CREATE TABLE inbox_paused_routes (
    provider   text        NOT NULL,
    event_type text        NOT NULL DEFAULT '*',
    paused_by  text        NOT NULL,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_type)
);

-- The console lists events by arrival time range and charts arrivals per minute; the journal
-- is insert-only and received_at grows with it, so this index only ever appends.
CREATE INDEX inbox_events_received_at ON inbox_events (received_at);

-- The body as JSON for containment searches (`@>`), NULL when it is not JSON (form bodies):
-- a search must not fail on the first non-JSON event.
CREATE FUNCTION inbox_body_jsonb(body bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(body, 'UTF8')::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;

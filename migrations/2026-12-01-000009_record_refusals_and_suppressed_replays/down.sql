-- Suppressed replays were answered 200 and their dedup keys stay: dropped, they would be lost
-- for good (a redelivery of one is a duplicate). Release or purge them first.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM inbox_suppressed_replays) THEN
        RAISE EXCEPTION 'inbox_suppressed_replays holds acknowledged events: release them (worker release) or delete them deliberately before reverting this migration';
    END IF;
END
$$;
DROP TABLE inbox_suppressed_replays;
DROP TABLE inbox_replay_bodies;
DROP TABLE inbox_rejections;

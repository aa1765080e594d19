DROP TABLE inbox_suppressed_replays;
DROP TABLE inbox_replay_bodies;
DROP TABLE inbox_rejections;

-- The purge deleted the handlers' `processed_events` records by their time, a scan of the
-- whole table (it has no index by time) at every run. It now deletes each record by its key,
-- with its event. Records whose events a purge already dropped (a record is written after its
-- event, so it could outlive the event's day) are deleted here, once: no event of theirs is
-- left to take them along.

DELETE FROM processed_events AS record
WHERE NOT EXISTS (
    SELECT 1 FROM inbox_dedup AS dedup
    WHERE dedup.provider = record.provider AND dedup.event_id = record.event_id
);

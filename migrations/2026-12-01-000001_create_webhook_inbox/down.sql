DROP TABLE processed_events;
DROP TABLE webhook_inbox;

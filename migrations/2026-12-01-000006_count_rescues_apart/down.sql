ALTER TABLE inbox_queue DROP COLUMN rescues;

-- A crash is counted apart from the event's own failures. When a worker dies abruptly, every
-- event it had in flight is rescued, most of them innocent of the crash: counting each rescue
-- as one of the event's attempts (as until now) brought those events to dead sooner than their
-- own failures would. The rescue now gives the attempt back and counts a rescue instead; an
-- event rescued as many times as it has attempts (one that kills its worker every time) still
-- ends dead instead of looping forever.
ALTER TABLE inbox_queue
    ADD COLUMN rescues integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT inbox_queue_rescues_not_negative CHECK (rescues >= 0);

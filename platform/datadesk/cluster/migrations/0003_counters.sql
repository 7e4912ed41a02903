-- rate counters shared by every host (cluster/counters.py): one row per (key, window length);
-- a window opens at its first hit and lasts window_s; a hit after `expires_at` opens a new one.
-- Rows of ended windows are swept now and then; a stale row is never read as live.
CREATE TABLE rate_counters (
    key text NOT NULL,
    window_s double precision NOT NULL CHECK (window_s > 0),
    count bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, window_s)
);
CREATE INDEX rate_counters_expires ON rate_counters (expires_at);

-- threads, their records and their per-thread documents (cluster/threads.py)
--
-- `threads.epoch` is the fencing epoch: a clear bumps it, and every write of the thread
-- checks it in its own transaction after taking the row `FOR UPDATE`. `last_seq` is the
-- newest record's seq: an append takes the row, writes seq = last_seq + 1 and moves it, so
-- seqs are contiguous and unique however many hosts append at once. Times are Unix seconds
-- (ThreadMeta's own floats), so `meta` and the columns never disagree on a time zone.
CREATE TABLE threads (
    id text PRIMARY KEY,
    workspace text NOT NULL,
    owner text NOT NULL,
    epoch bigint NOT NULL DEFAULT 0,
    last_seq bigint NOT NULL DEFAULT 0,
    meta jsonb NOT NULL,
    created double precision NOT NULL,
    updated double precision NOT NULL
);
-- the thread list, newest first; and the per-user count that `max_threads_per_user` caps
CREATE INDEX threads_by_owner ON threads (owner, workspace, updated DESC);

-- one row per record: `body` is the record's JSON line exactly as the embedded log holds it
-- (no re-encoding, so a migrated log verifies byte for byte)
CREATE TABLE records (
    thread_id text NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    seq bigint NOT NULL,
    body bytea NOT NULL,
    PRIMARY KEY (thread_id, seq)
);

-- JSON documents of a thread by name: summary, summary.status, task_state
CREATE TABLE thread_docs (
    thread_id text NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    name text NOT NULL,
    value jsonb NOT NULL,
    epoch bigint NOT NULL,
    updated double precision NOT NULL,
    PRIMARY KEY (thread_id, name)
);

-- append-only line sets of a thread by name, bounded: summary.revisions, context (manifests)
CREATE TABLE thread_lines (
    thread_id text NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    name text NOT NULL,
    n bigint NOT NULL,
    line bytea NOT NULL,
    PRIMARY KEY (thread_id, name, n)
);

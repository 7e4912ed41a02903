-- artifact metadata and what the quotas count (cluster/objects/artifacts.py); the data is in the object
-- store under `data_key` (written before the row says the artifact is available)
--
-- `meta` is the Artifact as the embedded `<aid>.json` holds it; the columns beside it are what
-- the quotas and the lists read without decoding it: `live` (a cache artifact whose data is
-- kept), `bytes` (stored bytes: data and a kept original), `deliverable` (bytes of a kept
-- deliverable). A tombstone (expired, deleted) is the same row with `live` false. Times are
-- Unix seconds (the Artifact's own floats). Totals per thread, per user and for the cluster are
-- sums over these rows (the indexes below make each an index-only scan).
CREATE TABLE artifacts (
    workspace text NOT NULL,
    user_id text NOT NULL,
    thread_id text NOT NULL,
    id text NOT NULL,
    meta jsonb NOT NULL,
    kind text NOT NULL,
    status text NOT NULL,
    live boolean NOT NULL,
    bytes bigint NOT NULL DEFAULT 0,
    deliverable bigint NOT NULL DEFAULT 0,
    data_key text,
    original_key text,
    created double precision NOT NULL,
    last_used double precision NOT NULL,
    PRIMARY KEY (thread_id, id)
);
-- a user's artifact by id (find), and the per-user totals and LRU order
CREATE INDEX artifacts_by_user ON artifacts (user_id, id);
CREATE INDEX artifacts_live_by_user ON artifacts (user_id, last_used, created) INCLUDE (bytes) WHERE live;
CREATE INDEX artifacts_live_by_age ON artifacts (last_used, created) INCLUDE (bytes) WHERE live;
CREATE INDEX artifacts_live_by_thread ON artifacts (thread_id, last_used, created) INCLUDE (bytes) WHERE live;
CREATE INDEX artifacts_deliverables ON artifacts (user_id) INCLUDE (deliverable) WHERE deliverable > 0;

-- when the cluster's artifact sweep last ran (one row)
CREATE TABLE artifact_sweeps (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    last_swept double precision NOT NULL
);

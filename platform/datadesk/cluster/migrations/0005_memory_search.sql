-- memory (cluster/memory.py): one document per user and workspace, updated under its row
-- lock, and the audit (ids, statuses, fixed reason codes: never a fact's text)
CREATE TABLE memory_docs (
    workspace text NOT NULL,
    user_id text NOT NULL,
    doc jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace, user_id)
);

CREATE TABLE memory_audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace text NOT NULL,
    user_id text NOT NULL,
    ts double precision NOT NULL,
    event text NOT NULL,
    fact text NOT NULL,
    status text,
    kind text,
    source text,
    reason text
);
CREATE INDEX memory_audit_user ON memory_audit (workspace, user_id, id);

-- search (cluster/search.py): the searchable text of each record (store/search.record_text),
-- a derived index of the `records` table; titles are searched in `threads.meta` directly.
-- Punctuation separates words before the 'simple' parser sees them, as FTS5's unicode61
-- does (the parser alone keeps `orders.amount` or `report.csv` one token).
-- No foreign key to `threads`: its KEY SHARE lock would make indexing wait for any host
-- holding a thread row FOR UPDATE; a search joins `threads` and sweeps what a lost delete left
CREATE TABLE search_entries (
    thread_id text NOT NULL,
    seq bigint NOT NULL,
    owner text NOT NULL,
    workspace text NOT NULL,
    role text NOT NULL,
    ts double precision NOT NULL DEFAULT 0,
    text text NOT NULL,
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', regexp_replace(text, '[[:punct:]]+', ' ', 'g'))) STORED,
    PRIMARY KEY (thread_id, seq)
);
CREATE INDEX search_entries_tsv ON search_entries USING gin (tsv);
CREATE INDEX search_entries_owner ON search_entries (owner, workspace);

-- per thread, how far the index is: the thread's epoch and the highest record seq indexed;
-- a search first indexes what lies above it (an append whose indexing was lost in a crash)
-- and rebuilds a thread whose epoch moved (a clear whose reset was lost)
CREATE TABLE search_marks (
    thread_id text PRIMARY KEY,
    owner text NOT NULL,
    workspace text NOT NULL,
    epoch bigint NOT NULL,
    seq bigint NOT NULL
);
CREATE INDEX search_marks_owner ON search_marks (owner, workspace);

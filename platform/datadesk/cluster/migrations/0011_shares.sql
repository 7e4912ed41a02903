-- shares of threads inside their workspace (cluster/shares.py, sharing/service.py): the id is
-- the link's random secret part; a revoked share is kept (revoked_at) so the owner's list and the
-- audit still name it. Read by id within the reader's workspaces, listed by owner newest first.
CREATE TABLE shares (
    id text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_-]{1,64}$'),
    workspace text NOT NULL CHECK (workspace ~ '^[A-Za-z0-9_-]{1,64}$'),
    owner text NOT NULL,
    thread text NOT NULL,
    kind text NOT NULL DEFAULT 'thread',
    title text NOT NULL DEFAULT '',
    created double precision NOT NULL,
    revoked double precision
);
CREATE INDEX shares_owner ON shares (owner, created DESC);

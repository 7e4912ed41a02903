-- the turn directory (cluster/turns.py) and the event journal of each thread's latest turn
-- (cluster/journal.py)

-- one row per thread that ever ran a turn: who runs (or last ran) its turn, under which fence
CREATE TABLE turns (
    thread_id text PRIMARY KEY,
    turn_id text NOT NULL,
    user_id text NOT NULL,
    owner text NOT NULL,               -- "<host>:<pid>" of the process running the turn
    backend_pid int NOT NULL,          -- its session holding the turn's advisory lock
    lock_key bigint NOT NULL,          -- that lock (advisory_key('turn:' || thread_id))
    fence bigint NOT NULL DEFAULT 1,   -- bumped by every claim: a write naming an older one is refused
    events boolean NOT NULL DEFAULT false,
    lease_until timestamptz NOT NULL,
    state text NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    cancel_turn text,                  -- a cancel request names the turn it is for
    started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- the per-user cap counts a user's running turns
CREATE INDEX turns_running_by_user ON turns (user_id) WHERE state = 'running';

-- the events of each thread's latest turn: n = 0 is its header, written when it starts
CREATE TABLE turn_events (
    thread_id text NOT NULL,
    turn_id text NOT NULL,
    n integer NOT NULL,
    type text NOT NULL,
    data jsonb NOT NULL,
    PRIMARY KEY (thread_id, turn_id, n)
);

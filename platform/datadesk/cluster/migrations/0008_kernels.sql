-- the kernel table and worker heartbeats of every host (cluster/kernels.py, state/kernels.py)

-- one row per app worker process; liveness is the age of last_seen on the database's clock
CREATE TABLE workers (
    id text PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    pid_start bigint,
    started timestamptz NOT NULL DEFAULT now(),
    last_seen timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workers_last_seen ON workers (last_seen);
CREATE INDEX workers_host ON workers (host);

-- the session of one (workspace, user, thread): its kernel, or why it has none (kernel_id NULL);
-- record is the whole sandbox.kerneltable.KernelRecord, the columns are what SQL counts and sorts by
CREATE TABLE kernels (
    key_hash text PRIMARY KEY,
    workspace text NOT NULL,
    user_id text NOT NULL,
    thread_id text NOT NULL,
    kernel_id text,
    owner_worker text,
    record jsonb NOT NULL,
    updated timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX kernels_user_with_kernel ON kernels (user_id) WHERE kernel_id IS NOT NULL;

-- pre-started kernels of a worker's pool (no thread yet); they count against the total cap
CREATE TABLE kernel_pool (
    kernel_id text PRIMARY KEY,
    owner_worker text,
    record jsonb NOT NULL,
    updated timestamptz NOT NULL DEFAULT now()
);

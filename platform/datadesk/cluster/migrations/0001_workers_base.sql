-- the first migration: the schema table itself is made by the runner; this records the
-- cluster's identity so a restored backup of another cluster is noticed
CREATE TABLE cluster_info (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    cluster_id text NOT NULL DEFAULT md5(random()::text || clock_timestamp()::text),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO cluster_info DEFAULT VALUES;

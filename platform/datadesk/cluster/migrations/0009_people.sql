-- people managed in the browser (cluster/users.py): a user's single sign-on binding, and
-- one-time invitations (their code stored only as a hex SHA-256 hash, as every secret).
ALTER TABLE users ADD COLUMN sso_issuer text, ADD COLUMN sso_subject text;

CREATE TABLE invitations (
    id text PRIMARY KEY,
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,  -- creation order, for listing newest first
    hash text NOT NULL UNIQUE,
    workspaces text[] NOT NULL CHECK (cardinality(workspaces) > 0),
    permissions text[] NOT NULL DEFAULT '{}',
    name text CHECK (name ~ '^[A-Za-z0-9_-]{1,64}$'),  -- the user name it is for, or NULL
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_by text,  -- not a reference: the record outlives a deleted user
    used_at timestamptz,
    revoked boolean NOT NULL DEFAULT false
);

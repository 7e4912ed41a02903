-- users, their API tokens, one-time login codes, login sessions and last logins
-- (cluster/users.py). Secrets are stored only as hex SHA-256 hashes, as in users.json.
CREATE TABLE users (
    id text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_-]{1,64}$'),
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,  -- creation order, for listing
    name text NOT NULL UNIQUE,
    workspaces text[] NOT NULL CHECK (cardinality(workspaces) > 0),
    permissions text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked boolean NOT NULL DEFAULT false
);

CREATE TABLE user_tokens (
    id text PRIMARY KEY,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    user_id text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    hash text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked boolean NOT NULL DEFAULT false
);
CREATE INDEX user_tokens_user ON user_tokens (user_id);

CREATE TABLE login_codes (
    hash text PRIMARY KEY,
    user_id text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    expires_at timestamptz NOT NULL
);
CREATE INDEX login_codes_user ON login_codes (user_id);
CREATE INDEX login_codes_expires ON login_codes (expires_at);

CREATE TABLE sessions (
    hash text PRIMARY KEY,
    user_id text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX sessions_user ON sessions (user_id);
CREATE INDEX sessions_expires ON sessions (expires_at);

CREATE TABLE user_logins (
    user_id text PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    last_at timestamptz NOT NULL
);

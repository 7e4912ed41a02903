-- the audit trail (cluster/audit.py, datadesk/audit/): one row per audited action of any host.
-- Read newest first by id (its order of arrival), each filter of the admin view on an index
-- that ends in id so a page is an index range; `ts` bounds a date filter and the retention sweep.
CREATE TABLE audit_events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ts timestamptz NOT NULL,
    action text NOT NULL,
    outcome text NOT NULL,
    user_name text,
    workspace text,
    thread text,
    source text,
    sql text,
    rows bigint,
    bytes bigint,
    duration_ms double precision,
    target text,
    detail text,
    client text,
    host text
);
CREATE INDEX audit_events_ts ON audit_events (ts, id);
CREATE INDEX audit_events_user ON audit_events (user_name, id);
CREATE INDEX audit_events_source ON audit_events (source, id);
CREATE INDEX audit_events_action ON audit_events (action, id);
CREATE INDEX audit_events_outcome ON audit_events (outcome, id);

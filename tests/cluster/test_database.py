"""The cluster database layer: migrations once under a lock, keepalives, advisory keys, errors."""

from __future__ import annotations

import threading

import pytest

from datadesk.cluster.database import Database, DatabaseError, advisory_key, migrations, redact_url

pytestmark = pytest.mark.cluster


def test_migrations_apply_once_even_from_two_hosts_at_once(cluster_db_url):
    a, b = Database(cluster_db_url), Database(cluster_db_url)
    results: list[list[str]] = []
    threads = [threading.Thread(target=lambda d=d: results.append(d.migrate())) for d in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [f"{v:04d}_{n}" for v, n, _ in migrations()]
    assert sorted(results, key=len) == [[], names]  # one host applied all, the other none
    with a.connection() as conn:
        rows = conn.execute("SELECT version FROM datadesk_schema ORDER BY version").fetchall()
    assert [r["version"] for r in rows] == [v for v, _, _ in migrations()]
    assert a.migrate() == []
    a.close()
    b.close()


def test_connections_carry_keepalives(cluster_db):
    with cluster_db.connection() as conn:
        row = conn.execute("SELECT current_setting('tcp_keepalives_idle') AS idle,"
                           " current_setting('tcp_user_timeout') AS uto").fetchone()
    assert row["idle"] == "5" and row["uto"] in ("10000", "10s")
    conn = cluster_db.dedicated()
    try:
        assert conn.execute("SELECT current_setting('tcp_keepalives_count') AS n").fetchone()["n"] == "3"
    finally:
        conn.close()


def test_a_newer_schema_is_refused(cluster_db):
    with cluster_db.connection() as conn:
        conn.execute("INSERT INTO datadesk_schema (version, name) VALUES (9999, 'future')")
    with pytest.raises(DatabaseError, match="newer release"):
        cluster_db.migrate()


def test_unreachable_database_names_it_without_the_password():
    with pytest.raises(DatabaseError) as info:
        Database("postgresql://u:s3cret@127.0.0.1:1/nope", connect_timeout_s=1)
    assert "127.0.0.1:1/nope" in str(info.value) and "s3cret" not in str(info.value)


def test_advisory_keys_are_stable_and_signed_64_bit():
    assert advisory_key("turn:abc") == advisory_key("turn:abc")
    assert advisory_key("turn:abc") != advisory_key("turn:abd")
    assert -2**63 <= advisory_key("x") < 2**63
    assert redact_url("postgresql://a:b@h/d") == "postgresql://a:***@h/d"


def test_seaweedfs_is_a_real_s3_with_conditional_put(s3, seaweed):
    client = seaweed.client()
    client.put_object(Bucket=s3.bucket, Key="k", Body=b"one")
    with pytest.raises(Exception, match="PreconditionFailed|412"):
        client.put_object(Bucket=s3.bucket, Key="k", Body=b"two", IfNoneMatch="*")
    assert client.get_object(Bucket=s3.bucket, Key="k")["Body"].read() == b"one"

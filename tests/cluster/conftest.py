"""Fixtures of the cluster set: one PostgreSQL and one SeaweedFS per test run, a fresh
migrated database and a fresh bucket per test (tests/clusterkit.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.clusterkit import cluster_problem, start_cluster_postgres, start_seaweedfs
from tests.conftest import close_clusters


@pytest.fixture(scope="session")
def cluster_pg(tmp_path_factory):
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)
    root = Path(tempfile.mkdtemp(prefix="datadesk-cluster-pg-"))  # under /tmp: the server's user can reach it
    srv = start_cluster_postgres(root)
    yield srv
    srv.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)
    srv = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def cluster_template(cluster_pg):
    """The URL of a database with every migration applied, migrated once per run (per worker)
    and never connected to after: what `cluster_db_url` copies for a test that migrates anyway."""
    from datadesk.cluster.database import Database

    url = cluster_pg.new_database()
    db = Database(url, max_size=1, name="template")
    try:
        db.migrate()
    finally:
        db.close()
    Database.close_all(url)
    cluster_pg.admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                     (url.rsplit("/", 1)[1],))  # a copy needs a template nobody is connected to
    return url


# a test that asks for one of these migrates its database at once (the harness's Runtime on
# start, `cluster_db` itself), so it gets a copy of `cluster_template` instead: the same schema
# in ~0.1 s instead of ~0.5 s of migrations, and their Runtime.migrate applies nothing. The
# migrations themselves run on the empty databases of the other tests (tests/cluster/
# test_database.py; the served hosts of test_two_hosts.py and test_takeover.py migrate on start).
_MIGRATE_AT_ONCE = {"state_set", "cluster_db"}


@pytest.fixture
def cluster_db_url(request, cluster_pg):
    """The URL of a fresh database on the test server: empty (not migrated), or with every
    migration applied already when the test asks for `state_set` or `cluster_db`, which would
    apply them at once anyway; dropped after the test, with whatever sessions the test left
    connected to it."""
    from datadesk.cluster.database import Database

    migrated = bool(_MIGRATE_AT_ONCE & set(request.fixturenames))
    url = cluster_pg.new_database(template=request.getfixturevalue("cluster_template") if migrated else None)
    yield url
    Database.close_all(url)  # pools a test left open would keep reconnecting to a dropped database
    cluster_pg.drop_database(url)


@pytest.fixture
def cluster_db(cluster_db_url):
    """A `Database` on a fresh database with every migration applied."""
    from datadesk.cluster.database import Database

    db = Database(cluster_db_url, max_size=12)
    db.migrate()
    yield db
    db.close()


@pytest.fixture
def s3(seaweed):
    """A fresh empty bucket on the test SeaweedFS server (`S3Target`)."""
    return seaweed.new_bucket()


SECRET_KEY = "cluster-test-secret-" + "k" * 32  # one secret for CSRF and sessions, as every host has


def cluster_settings(database_url: str, bucket) -> dict:
    """The settings sections that put a harness on the cluster set: `database_url` and the
    bucket `bucket` (an `S3Target`; its credentials go in the environment, never in settings)."""
    return {"cluster": {"database_url": database_url, "pool_size": 4},
            "storage": {"url": bucket.url, "endpoint": bucket.endpoint},
            "server": {"secret_key": SECRET_KEY}}


def _store_credentials(mp: pytest.MonkeyPatch, bucket) -> None:
    for name, value in bucket.env().items():
        if name.startswith("AWS_"):
            mp.setenv(name, value)


@pytest.fixture
def state_set(cluster_db_url, s3, monkeypatch):
    """The cluster set for the harness (tests/conftest.py `make_harness`): a fresh database, a
    fresh bucket, and the store's credentials in this process's environment for the test."""
    _store_credentials(monkeypatch, s3)
    yield cluster_settings(cluster_db_url, s3)
    close_clusters(cluster_db_url)


@pytest.fixture(scope="module")
def module_state_set(cluster_pg, cluster_template, seaweed):
    """`state_set` for a module-scoped harness: one fresh database (migrated: its harness would
    migrate it at once) and bucket for the module."""
    bucket, url = seaweed.new_bucket(), cluster_pg.new_database(template=cluster_template)
    with pytest.MonkeyPatch.context() as mp:
        _store_credentials(mp, bucket)
        yield cluster_settings(url, bucket)
        close_clusters(url)

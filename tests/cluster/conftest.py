"""Fixtures of the cluster set: one PostgreSQL and one SeaweedFS per test run, a fresh
migrated database and a fresh bucket per test (tests/clusterkit.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.clusterkit import cluster_problem, start_cluster_postgres, start_seaweedfs


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


@pytest.fixture
def cluster_db_url(cluster_pg) -> str:
    """The URL of a fresh, empty database on the test server (not migrated)."""
    return cluster_pg.new_database()


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

"""The artifacts API suite (list, get, download, per-user access, re-query, uploads of each
format) once more on the cluster set: artifact rows in PostgreSQL, their data in S3."""

from __future__ import annotations

import pytest

from tests.integration.test_artifacts_api import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

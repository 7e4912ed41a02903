"""The thread API suite (rename, records and the stream, images, /api/me) once more on the
cluster set: threads and records as PostgreSQL rows, artifacts in S3."""

from __future__ import annotations

import pytest

from tests.integration.test_web_api import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

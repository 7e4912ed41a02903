"""The offload end-to-end suite (big results become Parquet artifacts, budgets, the truncated
form, stop mid-offload) once more on the cluster set: artifact rows in PostgreSQL, data in S3."""

from __future__ import annotations

import pytest

from tests.integration.test_offload_e2e import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

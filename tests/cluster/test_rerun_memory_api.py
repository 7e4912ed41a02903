"""The memory API suite (grouping, access rules, conflicts, the user switch, hard delete with
redacted summaries) once more on the cluster set: memory documents in PostgreSQL."""

from __future__ import annotations

import pytest

from tests.integration.test_memory_api import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

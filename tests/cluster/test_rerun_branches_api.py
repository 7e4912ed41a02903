"""Edit a question, regenerate an answer, once more on the cluster set (PostgreSQL records)."""

from __future__ import annotations

import pytest

from tests.integration.test_branches_api import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

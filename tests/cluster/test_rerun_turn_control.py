"""The turn-control suite (cancel, disconnect, background turns, 409/429, step limit, delete
while running) once more on the cluster set: PostgreSQL turn directory and journal, S3 blobs."""

from __future__ import annotations

import pytest

from tests.integration.test_turn_control import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

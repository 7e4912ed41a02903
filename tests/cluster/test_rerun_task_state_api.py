"""The task-state API suite (pin, unpin, what the next request carries, a clear takes it away)
once more on the cluster set: the task state is a thread document row."""

from __future__ import annotations

import pytest

from tests.integration.test_task_state_api import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

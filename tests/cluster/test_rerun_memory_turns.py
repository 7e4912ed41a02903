"""The memory-in-turns suite (a remembered preference reaches a new thread, injections never
become facts, projects kept apart) once more on the cluster set."""

from __future__ import annotations

import pytest

from tests.integration.test_memory_turns import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

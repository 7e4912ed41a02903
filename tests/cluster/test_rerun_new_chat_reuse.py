"""New chat reuses an empty chat only, once more on the cluster set (PostgreSQL thread rows)."""

from __future__ import annotations

import pytest

from tests.integration.test_new_chat_reuse import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

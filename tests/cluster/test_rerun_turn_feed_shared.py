"""The shared turn feed suite once more on the cluster set: the second worker is a second
Runtime on the same database and bucket, following the turn through the journal table."""

from __future__ import annotations

import pytest

from tests.integration.test_turn_feed_shared import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

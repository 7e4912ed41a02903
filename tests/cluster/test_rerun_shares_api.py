"""The sharing suite once more on the cluster set: shares in PostgreSQL (migration
0011_shares.sql), the fork's artifact copies in the object store, the audit in its table."""

from __future__ import annotations

import pytest

from tests.integration.test_shares import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = [pytest.mark.cluster]

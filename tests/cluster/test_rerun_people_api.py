"""The people API and join suite once more on the cluster set: users, tokens, invitations and
the audit trail in PostgreSQL."""

from __future__ import annotations

import pytest

from tests.integration.test_people_api import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = [pytest.mark.cluster]

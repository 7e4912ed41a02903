"""The audit suite (queries of every outcome, downloads, exports, sign-ins, the admin view and
its CSV, retention) once more on the cluster set: the entries are rows of `audit_events`."""

from __future__ import annotations

import pytest

from tests.integration.test_audit import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

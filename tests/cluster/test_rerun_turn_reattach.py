"""The re-attach suite (a client leaving stops nothing, Last-Event-ID, two clients, another
worker following the turn) once more on the cluster set: the event journal is a table."""

from __future__ import annotations

import pytest

from tests.integration.test_turn_reattach import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

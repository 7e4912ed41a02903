"""The result grid suite (pages, sorts, filters, CSV of the view, uploads, query slots) once
more on the cluster set: the grid reads an artifact whose data lives in S3."""

from __future__ import annotations

import pytest

from tests.integration.test_grid_api import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

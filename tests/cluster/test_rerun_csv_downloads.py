"""The CSV download suite (formula cells, nested columns, failures mid-stream) once more on
the cluster set: the table is read from S3 through the host's cache."""

from __future__ import annotations

import pytest

from tests.integration.test_csv_downloads import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

"""The login suite (a link only shows a confirm page, forged confirms refused, codes expire,
failed logins counted per account) once more on the cluster set: codes, sessions and the login
budget in PostgreSQL."""

from __future__ import annotations

import pytest

from tests.integration.test_security_login import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = [pytest.mark.cluster, pytest.mark.security]

"""The API's auth suite (tokens, 401/404 per user, login codes, cookie sessions, logout,
revocation, CSRF) once more on the cluster set: users, tokens and sessions in PostgreSQL, one
server.secret_key for CSRF."""

from __future__ import annotations

import pytest

from tests.integration.test_api_auth import *  # noqa: F403 (collected again here, on the cluster set)

pytestmark = pytest.mark.cluster

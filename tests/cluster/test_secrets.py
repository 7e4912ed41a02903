"""The cluster set's credentials (the database URL's password, the AWS secret key) never reach
a log line, an API answer, `/api/health`, the settings snapshot of `serve --workers`, or a
kernel's environment."""

from __future__ import annotations

import io
import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from datadesk.api.guards.auth import RedactSecrets
from datadesk.domain.credentials import add_known_secrets, known_secrets, without_known_secrets
from datadesk.store.interfaces.blobs import BlobUnavailable
from tests.serving import serving

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]

PASSWORD = "pw-Zq8!vT3x"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzz4Ex4mpLe"


@pytest.fixture
def credentials(monkeypatch):
    monkeypatch.setenv("DATADESK_CLUSTER_DATABASE_URL", f"postgresql://dd:{PASSWORD}@db.internal:5432/dd")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)


def test_the_log_filter_removes_the_process_credentials(credentials) -> None:
    out = io.StringIO()
    logger = logging.getLogger("datadesk.test.secrets")
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    logger.propagate = False
    RedactSecrets.install(logger)
    add_known_secrets("from-a-settings-file-Qx9")
    try:
        logger.warning("cannot connect to %s", f"postgresql://dd:{PASSWORD}@db.internal:5432/dd")
        logger.warning("the password alone: %s; the key alone: %s", PASSWORD, AWS_SECRET)
        logger.warning("as an object: %s", BlobUnavailable(f"refused {AWS_SECRET}"))
        logger.warning("a settings file's secret: from-a-settings-file-Qx9")
        try:
            raise RuntimeError(f"boom with {AWS_SECRET} and {PASSWORD}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    for secret in (PASSWORD, AWS_SECRET, "from-a-settings-file-Qx9"):
        assert secret not in text, text
    assert text.count("[REDACTED]") >= 6 and "cannot connect to postgresql://dd:" in text
    assert "RuntimeError" in text  # the traceback stays, without the values


def test_api_answers_never_carry_the_credentials(credentials) -> None:
    assert PASSWORD in known_secrets() and AWS_SECRET in known_secrets()
    from datadesk.api.errors import _answer

    body = repr(_answer(503, f"the object store refused {AWS_SECRET} (password {PASSWORD})").content)
    assert AWS_SECRET not in body and PASSWORD not in body and "[REDACTED]" in body
    assert without_known_secrets("nothing secret here") == "nothing secret here"


def test_a_kernels_environment_has_none_of_the_apps_credentials(credentials, tmp_path) -> None:
    from datadesk.sandbox.backends.docker.container import ENV
    from datadesk.sandbox.backends.local.process import LocalKernel

    kernel = LocalKernel(SimpleNamespace(run_dir=tmp_path))  # type: ignore[arg-type]
    for env in (kernel._env(), dict(ENV)):
        text = repr(env)
        assert PASSWORD not in text and AWS_SECRET not in text and "DATADESK_CLUSTER" not in text
        assert not any(k.startswith("AWS_") for k in env)


def test_a_serving_cluster_host_shows_its_credentials_nowhere(tmp_path, cluster_db_url, s3) -> None:
    """`datadesk serve --workers 2` on the cluster set: its log, `/api/health`, answers (a 401,
    a 404, a refused login) and the workers' settings snapshot hold neither secret."""
    home = tmp_path / "home"
    home.mkdir()
    password = cluster_db_url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    env = {**os.environ, **s3.env(), "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
           "DATADESK_HOME": str(home), "DATADESK_CLUSTER_DATABASE_URL": cluster_db_url,
           "DATADESK_SECRET_KEY": "serve-secret-" + "s" * 32, "DATADESK_SANDBOX_BACKEND": "none"}
    log = tmp_path / "serve.log"
    with serving(home, env, log, workers=2) as (base, _):
        snapshots = list((home / "run").glob("serve-*.json"))
        assert snapshots, "the workers' settings snapshot"
        snapshot = "".join(p.read_text() for p in snapshots)
        with httpx.Client(base_url=base, timeout=30) as c:
            answers = [c.get("/api/health"), c.get("/api/me"), c.get("/api/threads/t_nope/artifacts"),
                       c.post("/api/login", json={"code": f"x.{password}"})]
        texts = [snapshot, *(r.text for r in answers), *(str(dict(r.headers)) for r in answers)]
    time.sleep(0.2)
    texts.append(log.read_text())
    for text in texts:
        assert password not in text and s3.secret_key not in text, text[:2000]
    assert answers[0].status_code == 200 and answers[1].status_code == 401

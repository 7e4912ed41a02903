"""The one `docker build` helper shared by the kernel image and the app image builds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from datadesk.sandbox.backends.docker.image import FALLBACK_BASE, BuildError, docker_build, run_build_cli

pytestmark = pytest.mark.docker


def test_docker_build_tags_latest_streams_output_and_names_failures(tmp_path: Path, capsys) -> None:
    import docker

    client = docker.from_env()
    if not any(FALLBACK_BASE in t for i in client.images.list() for t in i.tags):
        pytest.skip(f"base image {FALLBACK_BASE} is not built here")
    (tmp_path / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM $BASE_IMAGE\nRUN echo built-ok > /marker\n")
    tag = f"datadesk-buildtest:{int(time.time())}"
    lines: list[str] = []
    try:
        docker_build(client, tmp_path, tag, FALLBACK_BASE, "org.datadesk.test", False, lines.append, "[t]", 0.0)
        image = client.images.get(tag)
        assert client.images.get("datadesk-buildtest:latest").id == image.id
        assert image.labels["org.datadesk.test.base"] == FALLBACK_BASE
        assert any("Successfully built" in line for line in lines) and lines[-1].startswith(f"[t] built {tag}")
        (tmp_path / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM $BASE_IMAGE\nRUN exit 7\n")
        with pytest.raises(BuildError, match="docker build failed"):
            docker_build(client, tmp_path, tag + "x", FALLBACK_BASE, "org.datadesk.test", False, lines.append,
                         "[t]", 0.0)

        def fails() -> str:
            raise BuildError("no base image")

        assert run_build_cli(fails) == 1 and "error: no base image" in capsys.readouterr().err
        assert run_build_cli(lambda: tag) == 0 and capsys.readouterr().out.strip() == tag
    finally:
        for name in (tag, "datadesk-buildtest:latest"):
            try:
                client.images.remove(name, force=True)
            except docker.errors.ImageNotFound:
                pass

"""/outputs read through `docker exec` (the path an app inside a container takes), forced on the
real kernel image: the same artifacts and the same refusals as the /proc path."""

from __future__ import annotations

from pathlib import Path

import pytest

from datadesk.sandbox.backends.docker.container import DockerKernel
from tests.integration.test_sandbox import ctx, make_rt, py, run_with

pytestmark = pytest.mark.docker


@pytest.fixture
def exec_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a container: the kernel's mount namespace is not reachable from the app."""
    monkeypatch.setattr(DockerKernel, "outputs_root", lambda self: None)


def test_outputs_through_exec_take_only_regular_files_within_the_quota(home: Path, exec_only) -> None:
    rt = make_rt(home, "docker", outputs_mb=2)
    c = ctx(rt)

    async def body():
        files = await py(rt, c, "\n".join([
            "import os",
            "os.makedirs('/outputs/rep/a/b', exist_ok=True)",
            "open('/outputs/rep/summary.csv', 'w').write('a,b\\n1,2\\n')",
            "open('/outputs/rep/a/b/deep.txt', 'w').write('deep')",
            "open('/outputs/odd name\\nwith newline.txt', 'w').write('odd')",
            "os.link('/outputs/rep/summary.csv', '/outputs/hard.csv')",
            "os.symlink('/etc/passwd', '/outputs/leak')",
            "os.symlink('/outputs/rep', '/outputs/dirlink')",
            "os.mkfifo('/outputs/pipe')",
            "with open('/outputs/sparse.bin', 'wb') as f:",
            "    f.truncate(10 << 30)",  # 10 GB apparent size, no blocks used on the tmpfs
            "'ok'",
        ]))
        again = await py(rt, c, "1 + 1")
        dashes = await py(rt, c, "open('/outputs/--checkpoint-action=exec=sh', 'w').write('x')\n"
                                 "open('/outputs/-C', 'w').write('y')")
        changed = await py(rt, c, "open('/outputs/rep/summary.csv', 'w').write('a,b\\n3,4\\n')")
        return files, again, dashes, changed

    files, again, dashes, changed = run_with(rt, body)
    assert not files.is_error, files.content
    saved = {a.file: a for a in files.meta.artifacts}
    assert set(saved) == {"rep/summary.csv", "rep/a/b/deep.txt", "odd name\nwith newline.txt", "hard.csv"}
    art_dir = c.thread.artifacts_dir
    assert (art_dir / f"{saved['rep/summary.csv'].id}.csv").read_text() == "a,b\n1,2\n"
    assert (art_dir / f"{saved['hard.csv'].id}.csv").read_text() == "a,b\n1,2\n"  # a hard link is a file
    assert (art_dir / f"{saved['rep/a/b/deep.txt'].id}.txt").read_text() == "deep"
    for name in ("leak", "dirlink", "pipe"):
        assert f"/outputs/{name} is not a regular file" in files.content
    assert "/outputs/sparse.bin (10,737,418,240 bytes) exceeds the outputs quota" in files.content
    assert again.meta.artifacts is None  # unchanged files are not fetched again
    assert "sparse.bin" not in again.content  # reported once, as on the /proc path
    # names that look like tar options are only names
    assert sorted(a.file for a in dashes.meta.artifacts) == ["--checkpoint-action=exec=sh", "-C"]
    # a changed file is fetched again (its hard link too: the same inode)
    again_saved = {a.file: a for a in changed.meta.artifacts}
    assert set(again_saved) == {"rep/summary.csv", "hard.csv"}
    assert (art_dir / f"{again_saved['hard.csv'].id}.csv").read_text() == "a,b\n3,4\n"


def test_exec_path_and_proc_path_agree(home: Path) -> None:
    """The two ways of reading /outputs see the same files for the same kernel."""
    rt = make_rt(home, "docker")
    c = ctx(rt)

    async def body():
        await py(rt, c, "import os\nos.makedirs('/outputs/x', exist_ok=True)\n"
                        "open('/outputs/x/r.txt', 'w').write('r' * 1000)\nos.symlink('x', '/outputs/l')")
        kernel = rt.kernels.sessions[("demo", "alice", "t1")].kernel
        assert kernel.outputs_root() is not None  # the app runs on the engine's host here
        via_proc = await kernel.read_outputs({}, 1 << 20)
        via_exec = await __import__("asyncio").to_thread(kernel._read_outputs_exec, {}, 1 << 20)
        return via_proc, via_exec

    (proc_files, proc_problems), (exec_files, exec_problems) = run_with(rt, body)
    assert [(f.relpath, f.data) for f in proc_files] == [(f.relpath, f.data) for f in exec_files]
    assert [f.relpath for f in exec_files] == ["x/r.txt"]
    assert proc_problems == exec_problems == ["/outputs/l is not a regular file (link, pipe or device): ignored"]


def test_kernels_outside_the_shared_dir_are_refused(home: Path) -> None:
    """An app in a container shares only the data dir with the engine: a socket dir elsewhere
    (e.g. the /tmp fallback for long data dir paths) would be another directory on the host."""
    rt = make_rt(home, "docker", shared_dir=str(home))  # make_rt puts run_dir under /tmp
    c = ctx(rt)

    async def body():
        return await py(rt, c, "1 + 1")

    out = run_with(rt, body)
    assert out.is_error
    assert "is outside sandbox.shared_dir" in out.content and "socket directory" in out.content
    rt2 = make_rt(home, "docker", shared_dir=str(home), run_dir=str(home / "run"))
    ok = run_with(rt2, lambda: py(rt2, ctx(rt2, tid="t2"), "6 * 7"))
    assert not ok.is_error and "42" in ok.content

"""Docker kernels against their own host: the seccomp profile refuses what sandboxes refuse, the
socket directory takes no files, and only the app (root or not) reaches a kernel's key and
sockets: every kernel runs as a uid of its own that no host account has."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import platform
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from datadesk.sandbox.backends.docker import confinement
from datadesk.sandbox.backends.docker.confinement import (
    ConfinementError, EngineConfinement, KernelDirs, check_id_range, id_range_conflicts, read_acl,
)
from datadesk.sandbox.messaging import CONNECTION_FILE, socket_paths
from datadesk.settings import SandboxSettings
from tests.integration.test_sandbox import ctx, make_rt, py, run_with

PLATFORM = Path(__file__).resolve().parents[2] / "platform"
BASE, COUNT = SandboxSettings().docker_uid_base, SandboxSettings().docker_uid_count

# x86_64 numbers of the calls the profile refuses (arguments are harmless: zeros, or bad ones)
REFUSED = {
    "ptrace": (101, 16, 1), "personality": (135, 0xFFFFFFFF), "keyctl": (250, 0, -3), "add_key": (248,),
    "request_key": (249,), "bpf": (321,), "userfaultfd": (323,), "perf_event_open": (298,), "mount": (165,),
    "umount2": (166,), "pivot_root": (155,), "move_mount": (429,), "open_tree": (428,), "fsopen": (430,),
    "fsconfig": (431,), "fsmount": (432,), "fspick": (433,), "mount_setattr": (442,), "unshare": (272, 0x10000000),
    "setns": (308, -1), "chroot": (161,), "kexec_load": (246,), "kexec_file_load": (320,), "init_module": (175,),
    "finit_module": (313, -1), "delete_module": (176,), "iopl": (172, 3), "ioperm": (173, 0, 1, 1),
    "process_vm_readv": (310, 1), "process_vm_writev": (311, 1), "io_uring_setup": (425, 1), "modify_ldt": (154,),
    "kcmp": (312,), "pidfd_getfd": (438,), "syslog": (103,), "quotactl": (179,), "lookup_dcookie": (212,),
}
PROBE = textwrap.dedent("""
    import ctypes, errno, json, os, socket, subprocess, threading
    libc = ctypes.CDLL(None, use_errno=True)
    got = {}
    for name, (nr, *args) in %r.items():
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args + [0] * (6 - len(args))])
        got[name] = errno.errorcode.get(ctypes.get_errno(), "ok") if r == -1 else "ok"
        if name == "ptrace" and r == 0:
            libc.syscall(ctypes.c_long(101), ctypes.c_long(17), ctypes.c_long(1), 0, 0)  # PTRACE_DETACH
    t = threading.Thread(target=lambda: None); t.start(); t.join()
    for fam in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6):
        socket.socket(fam, socket.SOCK_STREAM).close()
    seccomp = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")]
    print(json.dumps({"refused": got, "seccomp": seccomp, "nnp": open("/proc/self/status").read().count("NoNewPrivs:\\t1"),
                      "child": subprocess.run(["true"]).returncode, "getpid": os.getpid() > 0}))
""")

I386 = textwrap.dedent("""
    import ctypes, mmap
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(bytes([0xB8, 0x14, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20; int 0x80; ret
    print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))())
""")

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def box(tmp_path_factory, demo_warehouse_dir):
    """One runtime with two threads' kernels (the cases leave them healthy)."""
    home = tmp_path_factory.mktemp("hard") / "var"
    home.mkdir(parents=True)
    rt = make_rt(home, "docker", exec_timeout_s=30)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(rt.start())
    mine, other = ctx(rt, tid="t1"), ctx(rt, tid="t2")
    for c in (mine, other):
        r = loop.run_until_complete(py(rt, c, "1"))
        assert not r.is_error, r.content
    run = lambda c, code: loop.run_until_complete(py(rt, c, code))  # noqa: E731
    yield rt, run, mine, other
    loop.run_until_complete(rt.stop())
    loop.close()


def kernel_of(rt, tid: str):
    return rt.kernels.sessions[("demo", "alice", tid)].kernel


def as_host_user(uid: int, gid: int, code: str, *args: str) -> dict:
    """Run python `code` as another host account (no capabilities, no extra groups); its JSON."""
    out = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", sys.executable, "-c",
                          code, *args], capture_output=True, text=True, timeout=120,
                         env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(PLATFORM), "HOME": "/tmp"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


INTRUDER = textwrap.dedent("""
    import json, os, socket, sys
    def probe(run):
        got = {}
        def attempt(what, fn):
            try:
                fn()
                got[what] = "ok"
            except OSError as exc:
                got[what] = type(exc).__name__
        attempt("list", lambda: os.listdir(run))
        attempt("key", lambda: open(os.path.join(run, "connection.json")).read())
        for n in range(1, 6):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            attempt(f"k-{n}", lambda: s.connect(os.path.join(run, f"k-{n}")))
            s.close()
        return got
    if __name__ == "__main__":
        print(json.dumps(probe(sys.argv[1])))
""")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="system call numbers of x86_64")
def test_refused_system_calls_fail_with_eperm(box) -> None:
    rt, run, mine, _ = box
    r = run(mine, PROBE % (REFUSED,))
    assert not r.is_error, r.content
    got = json.loads(r.content[r.content.index("{"):r.content.rindex("}") + 1])
    assert got["refused"] == {name: "EPERM" for name in REFUSED}  # ptrace(PTRACE_ATTACH, 1) included
    assert got["seccomp"] == ["2"] and got["nnp"] == 1  # a filter, and no-new-privileges
    assert got["child"] == 0 and got["getpid"]  # threads, processes and local sockets still work
    r = run(mine, "import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW)")
    assert r.is_error and "Operation not permitted" in r.content
    # a 32-bit system call (int 0x80: i386 getpid) is outside the filter: the process ends (SIGSYS)
    r = run(mine, f"import subprocess, sys\nprint('i386', subprocess.run([sys.executable, '-c', {I386!r}]).returncode)")
    assert "i386 -31" in r.content, r.content


def test_each_kernel_runs_as_a_uid_of_its_own_that_no_host_account_has(box) -> None:
    rt, run, mine, other = box
    ids = []
    for c in (mine, other):
        r = run(c, "import os\nprint('ids', os.getuid(), os.getgid(), os.getgroups())")
        assert not r.is_error, r.content
        uid, gid, groups = re.search(r"ids (\d+) (\d+) (\[.*\])", r.content).groups()
        ids.append(int(uid))
        assert uid == gid and groups == f"[{gid}]"
    assert ids[0] != ids[1] and all(BASE <= u < BASE + COUNT for u in ids)
    for u in ids:
        with pytest.raises(KeyError):
            pwd.getpwuid(u)
    for tid, uid in zip(("t1", "t2"), ids):
        k = kernel_of(rt, tid)
        assert k.uid == uid
        assert k._container.labels["datadesk.uid"] == str(uid)
        for sock in socket_paths(k.placement.run_dir):
            st = os.lstat(sock)
            assert stat.S_ISSOCK(st.st_mode) and st.st_uid == uid


def test_other_host_accounts_cannot_read_the_key_or_connect(box) -> None:
    rt, run, mine, other = box
    k, k2 = kernel_of(rt, "t1"), kernel_of(rt, "t2")
    run_dir = k.placement.run_dir
    key_gid = os.stat(run_dir / CONNECTION_FILE).st_gid
    # a login account, a member of the key file's group, and the kernel of another thread
    for uid, gid in ((1000, 1000), (1000, key_gid), (k2.uid, k2.uid)):
        got = as_host_user(uid, gid, INTRUDER, str(run_dir))
        assert got == {"list": "PermissionError", "key": "PermissionError",
                       **{f"k-{n}": "PermissionError" for n in range(1, 6)}}, (uid, gid)
    # the directory and the key name no one but the app and this kernel
    assert os.stat(run_dir).st_mode & 0o007 == 0
    for path in (run_dir, run_dir / CONNECTION_FILE):
        acl = read_acl(path)
        assert acl[("group_obj", None)] == 0 and acl[("other", None)] == 0
        assert {i for t, i in acl if t == "user"} == {k.uid}
    assert read_acl(run_dir)[("user", k.uid)] == 5  # sealed: r-x, no more entries
    assert not run(mine, "21 * 2").is_error  # the app still connects


def test_the_socket_directory_takes_no_files(box) -> None:
    rt, run, mine, _ = box
    run_dir = kernel_of(rt, "t1").placement.run_dir
    r = run(mine, "\n".join([
        "import os",
        "errs = []",
        "def attempt(fn):",
        "    try:",
        "        fn()",
        "        errs.append('ok')",
        "    except OSError as exc:",
        "        errs.append(type(exc).__name__)",
        "def big():",
        "    with open('/run/kernel/big.bin', 'wb') as f:",
        "        for _ in range(300):",
        "            f.write(b'0' * (1 << 20))",
        "attempt(big)",
        "attempt(lambda: os.mkdir('/run/kernel/d'))",
        "attempt(lambda: os.mkfifo('/run/kernel/p'))",
        "attempt(lambda: os.symlink('/etc', '/run/kernel/l'))",
        "attempt(lambda: os.rename('/run/kernel/k-1', '/run/kernel/x'))",
        "attempt(lambda: os.unlink('/run/kernel/k-5'))",
        "attempt(lambda: open('/run/kernel/connection.json', 'a').write('x'))",
        "attempt(lambda: os.chmod('/run/kernel', 0o777))",
        "print(errs)",
    ]))
    assert not r.is_error, r.content
    assert r.content.count("PermissionError") == 8, r.content
    assert sum(p.stat().st_size for p in run_dir.iterdir()) < 4096  # nothing reached the host disk
    assert sorted(p.name for p in run_dir.iterdir()) == sorted([CONNECTION_FILE, *(f"k-{n}" for n in range(1, 6))])
    assert not run(mine, "21 * 2").is_error


def test_a_replaced_kernel_is_confined_the_same_way(box) -> None:
    rt, run, mine, _ = box
    run(mine, "import os\nos.kill(1, 9)")  # the container's init: the next call starts a fresh kernel
    r = run(mine, "import os\nprint(os.getuid())")
    assert not r.is_error, r.content
    k = kernel_of(rt, "t1")
    assert str(k.uid) in r.content
    assert read_acl(k.placement.run_dir)[("user", k.uid)] == 5
    got = as_host_user(1000, 1000, INTRUDER, str(k.placement.run_dir))
    assert set(got.values()) == {"PermissionError"}


def test_a_non_root_app_reaches_its_kernel_and_nobody_else_does() -> None:
    """The app as a plain account (in the docker group only): the ACLs give the kernel its dir and
    the app its sockets, with no group shared with anyone."""
    docker_gid = os.stat("/var/run/docker.sock").st_gid
    app_uid = 4242
    root = Path(tempfile.mkdtemp(prefix="ddn-"))  # not under pytest's root-only tmp dir
    os.chmod(root, 0o755)
    (root / "app").mkdir()
    os.chown(root / "app", app_uid, docker_gid)
    # imports first (this python's packages may lie where only root can read), then the app drops
    # to a plain account for good: no capabilities, uid 4242, the docker group only
    script = textwrap.dedent(f"""
        import asyncio, json, os, subprocess, sys
        from pathlib import Path
        from datadesk.sandbox.base import KernelPlacement
        from datadesk.sandbox.backends.docker.container import DockerSandbox
        from datadesk.settings import SandboxSettings
        async def main(root, warm_up=False):
            sb = DockerSandbox(SandboxSettings(backend="docker"), root / "home")
            p = KernelPlacement(kernel_id="k" + os.urandom(5).hex(), data_dir=root / "slot" / "data",
                                outputs_dir=root / "slot" / "outputs", run_dir=root / "run")
            k = sb.kernel(p)
            await k.start()
            try:
                r = await k.execute("import os; print(6 * 7, os.getuid())", 30)
                if warm_up:
                    return None
                ns = {{}}
                exec({INTRUDER!r}, ns)
                return {{"status": r.status, "stdout": r.stdout, "uid": k.uid, "app_view": ns["probe"](str(p.run_dir)),
                         "owner": os.stat(p.run_dir).st_uid, "mode": os.stat(p.run_dir).st_mode & 0o777}}
            finally:
                await k.shutdown()
        asyncio.run(main(Path({str(root)!r}) / "root", warm_up=True))  # loads every module the app needs
        os.setgroups([]); os.setresgid({docker_gid}, {docker_gid}, {docker_gid})
        os.setresuid({app_uid}, {app_uid}, {app_uid})
        assert "CapEff:\\t0000000000000000" in open("/proc/self/status").read()
        print(json.dumps(asyncio.run(main(Path({str(root)!r}) / "app"))))
    """)
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["status"] == "ok" and got["stdout"].split() == ["42", str(got["uid"])]
        assert set(got["app_view"].values()) == {"ok"}  # the app lists, reads the key and connects
        assert got["owner"] == app_uid and got["mode"] & 0o077 == 0o050  # group class = the ACL mask
        out = as_host_user(1000, 1000, INTRUDER, str(root / "app" / "run"))
        assert set(out.values()) == {"PermissionError"}
        out = as_host_user(1000, docker_gid, INTRUDER, str(root / "app" / "run"))  # the app's group
        assert set(out.values()) == {"PermissionError"}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_without_acls_a_root_app_falls_back_to_a_group_of_the_kernel(home: Path, monkeypatch) -> None:
    def no_acls(*a, **kw):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(confinement, "_set_acl", no_acls)
    rt = make_rt(home, "docker")
    c = ctx(rt)

    async def body():
        r = await py(rt, c, "import os\nprint(6 * 7, os.getuid())")
        k = rt.kernels.sessions[("demo", "alice", "t1")].kernel
        st, key = os.stat(k.placement.run_dir), os.stat(k.placement.run_dir / CONNECTION_FILE)
        w = await py(rt, c, "open('/run/kernel/x', 'w')")
        return r, k.uid, st, key, w, k.placement.run_dir

    r, uid, st, key, w, run_dir = run_with(rt, body)
    assert not r.is_error and f"42 {uid}" in r.content, r.content
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, uid, 0o750)
    assert (key.st_uid, key.st_gid, key.st_mode & 0o777) == (0, uid, 0o640)
    assert w.is_error and "Permission denied" in w.content


def test_kernel_id_ranges_that_host_accounts_use_are_refused(home: Path) -> None:
    assert any(c.startswith("user root") for c in id_range_conflicts(0, 70_000))
    assert id_range_conflicts(BASE, COUNT) == []
    with pytest.raises(ConfinementError, match="65536"):
        check_id_range(1000, 100)
    rt = make_rt(home, "docker", docker_uid_base=1000)
    out = run_with(rt, lambda: py(rt, ctx(rt), "1 + 1"))
    assert out.is_error and "docker_uid_base" in out.content


def test_a_non_root_app_without_acls_is_refused_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(confinement, "_set_acl", lambda *a, **kw: (_ for _ in ()).throw(OSError(errno.ENOTSUP, "no")))
    dirs = KernelDirs(tmp_path / "run", tmp_path / "data", BASE + 7)
    dirs.app_uid = 4242
    with pytest.raises(ConfinementError, match="POSIX ACLs"):
        dirs.prepare_run_dir()


def test_uids_are_drawn_among_free_ones_and_the_younger_of_two_gives_way() -> None:
    """The engine's container list is the allocation table: a taken uid is never drawn, and of
    two containers holding one uid the younger (creation time, then id) yields."""
    import docker

    client = docker.from_env()
    settings = SandboxSettings(docker_uid_base=BASE + COUNT - 2, docker_uid_count=2)  # two uids only
    eng = EngineConfinement(lambda: client, settings)
    held = BASE + COUNT - 2
    made = []
    try:
        for _ in range(2):
            made.append(client.containers.create(settings.image, ["true"], labels={
                "datadesk.sandbox": "1", "datadesk.uid": str(held), "datadesk.home": "test-uid-draw"}))
        assert {eng.draw_uid() for _ in range(20)} == {held + 1}
        a, b = made
        ka = (int(client.api.containers(all=True, filters={"id": a.id})[0]["Created"]), a.id)
        kb = (int(client.api.containers(all=True, filters={"id": b.id})[0]["Created"]), b.id)
        younger, older = (a, b) if ka > kb else (b, a)
        assert eng.uid_clash(younger, held) and not eng.uid_clash(older, held)
        assert not eng.uid_clash(younger, held + 1)  # not labelled with that uid: nothing to yield to
    finally:
        for c in made:
            c.remove(force=True)

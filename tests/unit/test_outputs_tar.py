"""Reading /outputs from a listing and a tar stream made inside the kernel container: both are
untrusted (the kernel user can tamper with them), so hostile inputs are built here directly."""

from __future__ import annotations

import io
import tarfile

from datadesk.sandbox.files import PlannedOutput, plan_outputs, read_outputs_tar, valid_relpath

MB = 1 << 20


def listing(*entries: tuple[str, int, str, bytes | str]) -> bytes:
    out = b""
    for kind, size, mtime, name in entries:
        name = name.encode() if isinstance(name, str) else name
        out += f"{kind} {size} {mtime} ".encode() + name + b"\0"
    return out


def tar_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def reg(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def chunks(data: bytes, n: int = 1000):
    return (data[i:i + n] for i in range(0, len(data), n))


def test_relpaths_are_plain() -> None:
    assert valid_relpath("a/b c/d.txt") and valid_relpath("-C") and valid_relpath("x\ny")
    for bad in ("", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a/", "a\0b", "/".join("a" * 10)):
        assert not valid_relpath(bad), bad


def test_plan_skips_seen_reports_links_and_quota_in_walk_order() -> None:
    seen = {"same.txt": (3, 1_700_000_000_500_000_000)}
    text = listing(("f", 3, "1700000000.5000000000", "same.txt"), ("f", 5, "1700000001.25", "b/z.txt"),
                   ("d", 4096, "1700000001.0", "b"), ("l", 11, "1700000001.0", "leak"),
                   ("p", 0, "1700000001.0", "pipe"), ("f", 2 * MB, "1700000002.0", "big.bin"),
                   ("f", 7, "1700000003.0", "a.txt"), ("f", 1, "1700000003.0", "b/a.txt"))
    wanted, problems = plan_outputs(text, seen, max_bytes=MB)
    assert [w.relpath for w in wanted] == ["a.txt", "b/a.txt", "b/z.txt"]
    assert wanted[2] == PlannedOutput("b/z.txt", 5, 1_700_000_001_250_000_000)
    assert problems == ["/outputs/big.bin (2,097,152 bytes) exceeds the outputs quota: not saved",
                        "/outputs/leak is not a regular file (link, pipe or device): ignored",
                        "/outputs/pipe is not a regular file (link, pipe or device): ignored"]
    assert seen["big.bin"] == (2 * MB, 1_700_000_002_000_000_000)  # reported once


def test_plan_drops_malformed_entries_and_names_bad_encodings() -> None:
    text = listing(("f", 1, "1.0", "../../etc/passwd"), ("f", 1, "1.0", "/abs"), ("f", "x", "1.0", "n1"),
                   ("f", 1, "soon", "n2"), ("f", 1, "1.0", b"caf\xe9.txt"), ("f", 1, "1.0", "ok")) + b"garbage"
    wanted, problems = plan_outputs(text, {}, max_bytes=MB)
    assert [w.relpath for w in wanted] == ["ok"]
    assert problems == ["/outputs/caf\ufffd.txt has a name that is not UTF-8: ignored"]


def test_plan_shares_the_quota_and_caps_the_file_count() -> None:
    text = listing(*[("f", 400_000, "1.0", f"f{i:03d}") for i in range(5)])
    wanted, problems = plan_outputs(text, {}, max_bytes=MB)
    assert [w.relpath for w in wanted] == ["f000", "f001"]
    assert len(problems) == 3
    many = listing(*[("f", 1, "1.0", f"f{i:03d}") for i in range(300)])
    assert len(plan_outputs(many, {}, max_bytes=MB)[0]) == 200


def test_tar_takes_only_asked_regular_files() -> None:
    link = reg("./leak")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    hard = reg("./hard")
    hard.type, hard.linkname = tarfile.LNKTYPE, "a.txt"
    dev = reg("./dev")
    dev.type = tarfile.CHRTYPE
    stream = tar_of((reg("./a.txt"), b"hello"), (reg("./../x"), b"outside"), (reg("./extra"), b"not asked"),
                    (link, None), (hard, None), (dev, None), (reg("./a.txt"), b"second copy"))
    wanted = [PlannedOutput(n, 5, 7) for n in ("a.txt", "leak", "hard", "dev")]
    seen: dict = {}
    found, problems = read_outputs_tar(chunks(stream), wanted, seen, MB)
    assert [(f.relpath, f.data) for f in found] == [("a.txt", b"hello")]
    assert seen == {"a.txt": (5, 7)}
    assert problems == [f"/outputs/{n} is not a regular file (link, pipe or device): ignored"
                        for n in ("leak", "hard", "dev")]


def test_tar_members_larger_than_what_is_left_are_refused() -> None:
    stream = tar_of((reg("./a"), b"a" * 600_000), (reg("./b"), b"b" * 600_000))
    wanted = [PlannedOutput("a", 10, 1), PlannedOutput("b", 10, 1)]
    found, problems = read_outputs_tar(chunks(stream, 65536), wanted, {}, MB)
    assert [f.relpath for f in found] == []  # the stream is cut long before: 20 bytes were announced
    assert problems == ["files under /outputs grew past the outputs quota while being read: some were not saved"]
    wanted = [PlannedOutput("a", 600_000, 1), PlannedOutput("b", 600_000, 1)]
    found, problems = read_outputs_tar(chunks(stream, 65536), wanted, {}, MB)
    assert [f.relpath for f in found] == ["a"]
    assert problems == ["/outputs/b grew past the outputs quota while being read: not saved"]


def test_tar_bombs_and_garbage_end_with_a_problem_not_an_exception() -> None:
    sparse = reg("./s")
    sparse.type = tarfile.GNUTYPE_SPARSE
    found, problems = read_outputs_tar(chunks(tar_of((sparse, b"x" * 10))), [PlannedOutput("s", 10, 1)], {}, MB)
    assert found == [] and problems == []
    found, problems = read_outputs_tar(chunks(b"\x00garbage" * 100), [PlannedOutput("a", 10, 1)], {}, MB)
    assert found == [] and len(problems) == 1 and problems[0].startswith("files under /outputs could not be read")
    one = tar_of((reg("./not-asked"), b"n" * 60_000))[:512 + 60_416]  # header + data, no end blocks
    endless = (one for _ in range(10_000))  # 600 MB of members nobody asked for: cut at the cap
    found, problems = read_outputs_tar(endless, [PlannedOutput("a", 10, 1)], {}, MB)
    assert found == [] and "grew past the outputs quota" in problems[0]

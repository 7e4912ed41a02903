"""`BlobStore` conformance: the embedded files (`LocalBlobs`) and S3 (`S3Blobs` on a real
SeaweedFS), one suite; what only the object store has (a cache, URLs, being down) below it."""

from __future__ import annotations

import shutil
import socket
import threading
from pathlib import Path

import httpx
import pytest

from datadesk.cluster.objects.blobs import S3Blobs
from datadesk.offload.artifacts.localblobs import LocalBlobs
from datadesk.store.interfaces.blobs import (BlobExists, BlobNotFound, BlobStore, BlobUnavailable, PresignUnsupported,
                                  artifact_key, blob_key, copy_to, parse_key, thread_prefix)
from datadesk.store.layout import Layout

pytestmark = pytest.mark.cluster


def s3_blobs(s3, cache: Path, cache_bytes: int = 1 << 20, endpoint: str | None = None) -> S3Blobs:
    return S3Blobs(s3.url, endpoint or s3.endpoint, cache, cache_bytes, region=s3.region,
                   access_key=s3.access_key, secret_key=s3.secret_key)


@pytest.fixture(params=["embedded", "cluster"])
def blobs(request, tmp_path) -> BlobStore:
    if request.param == "embedded":
        return LocalBlobs(Layout(tmp_path / "home"))
    return s3_blobs(request.getfixturevalue("s3"), tmp_path / "cache")


def key(name: str, tid: str = "t1", user: str = "u1", ws: str = "w1") -> str:
    return artifact_key(ws, user, tid, name)


def test_put_then_read_every_way(blobs: BlobStore, tmp_path: Path) -> None:
    assert isinstance(blobs, BlobStore)
    data = bytes(range(256)) * 40
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    assert blobs.put(key("a1.parquet"), src) == len(data)
    assert blobs.put(key("a2.txt"), b"hello") == 5
    assert blobs.get(key("a1.parquet")) == data
    assert blobs.local_path(key("a1.parquet")).read_bytes() == data
    assert blobs.size(key("a1.parquet")) == len(data)
    assert blobs.open_range(key("a1.parquet"), 10, 5) == data[10:15]
    assert blobs.open_range(key("a2.txt"), 3, 100) == b"lo"  # fewer at the end
    assert blobs.exists(key("a2.txt")) and not blobs.exists(key("a3.txt"))
    out = tmp_path / "copy.bin"
    with open(out, "wb") as fh:
        copy_to(blobs, key("a1.parquet"), fh, chunk=1000)
    assert out.read_bytes() == data
    assert src.read_bytes() == data  # the source is not consumed


def test_write_once_refuses_an_existing_key(blobs: BlobStore) -> None:
    blobs.put(key("a1.txt"), b"first")
    with pytest.raises(BlobExists, match="a1.txt"):
        blobs.put(key("a1.txt"), b"second")
    assert blobs.get(key("a1.txt")) == b"first"


def test_missing_keys(blobs: BlobStore) -> None:
    for read in (blobs.get, blobs.local_path, blobs.size):
        with pytest.raises(BlobNotFound, match="nope.txt"):
            read(key("nope.txt"))
    blobs.delete(key("nope.txt"))  # no error


def test_list_delete_and_delete_prefix(blobs: BlobStore) -> None:
    for tid in ("t1", "t2"):
        for n in range(3):
            blobs.put(key(f"a{n}.txt", tid), f"{tid}-{n}".encode())
    blobs.put(blob_key("w1", "u1", "t1", "o", "charts/c.png"), b"png")
    assert sorted(blobs.list(thread_prefix("w1", "u1", "t1"))) == sorted(
        [key(f"a{n}.txt") for n in range(3)] + ["ws/w1/u/u1/t/t1/o/charts/c.png"])
    blobs.delete(key("a0.txt"))
    assert not blobs.exists(key("a0.txt"))
    assert blobs.delete_prefix(thread_prefix("w1", "u1", "t1")) == 3
    assert list(blobs.list(thread_prefix("w1", "u1", "t1"))) == []
    assert sorted(blobs.list("ws/w1/")) == [key(f"a{n}.txt", "t2") for n in range(3)]
    assert blobs.get(key("a2.txt", "t2")) == b"t2-2"


@pytest.mark.parametrize("bad", ["../x", "ws/w1/u/u1/t/t1/a/../../x", "ws/w 1/u/u1/t/t1/a/x", "ws/w1/u/u1/t/t1/z/x",
                                 "ws/w1/u/u1/t/t1/a/.hidden"])
def test_keys_are_validated(blobs: BlobStore, bad: str) -> None:
    with pytest.raises(ValueError):
        blobs.put(bad, b"x")
    with pytest.raises(ValueError):
        parse_key(bad)


def test_prefixes_are_validated(blobs: BlobStore) -> None:
    for bad in ("", "/", "ws", "ws//", "ws/../"):
        with pytest.raises(ValueError):
            list(blobs.list(bad))
        with pytest.raises(ValueError):
            blobs.delete_prefix(bad)


def test_embedded_blobs_are_the_thread_folders(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "home")
    blobs = LocalBlobs(layout)
    blobs.put(key("a1.parquet"), b"data")
    assert (layout.thread_dir("w1", "u1", "t1") / "artifacts" / "a1.parquet").read_bytes() == b"data"
    assert not list((layout.thread_dir("w1", "u1", "t1") / "artifacts").glob(".*"))  # no temp left
    with pytest.raises(PresignUnsupported):
        blobs.presign(key("a1.parquet"))


# -- the object store only -----------------------------------------------------------------
def test_read_through_another_host_and_after_the_cache_is_deleted(s3, tmp_path: Path) -> None:
    a = s3_blobs(s3, tmp_path / "cache-a")
    b = s3_blobs(s3, tmp_path / "cache-b")
    a.put(key("a1.parquet"), b"x" * 5000)
    path = b.local_path(key("a1.parquet"))
    assert path.read_bytes() == b"x" * 5000 and path.is_relative_to(tmp_path / "cache-b")
    shutil.rmtree(tmp_path / "cache-a")
    assert a.local_path(key("a1.parquet")).read_bytes() == b"x" * 5000
    assert a.get(key("a1.parquet")) == b"x" * 5000


def test_the_cache_stays_within_its_bound(s3, tmp_path: Path) -> None:
    writer = s3_blobs(s3, tmp_path / "cache-w", cache_bytes=0)  # caches nothing
    reader = s3_blobs(s3, tmp_path / "cache-r", cache_bytes=10_000)
    reader.cache.protect_s = 0
    for n in range(10):
        writer.put(key(f"a{n}.bin"), bytes([n]) * 3000)
    assert not (tmp_path / "cache-w").exists() or reader.cache.used_bytes() == 0
    for n in range(10):
        assert reader.local_path(key(f"a{n}.bin")).read_bytes() == bytes([n]) * 3000
        assert reader.cache.used_bytes() <= 10_000
    assert reader.cache.hit(key("a9.bin")) is not None  # the newest stays
    assert reader.cache.hit(key("a0.bin")) is None  # the oldest went
    assert reader.get(key("a0.bin")) == bytes([0]) * 3000  # read through again


def test_concurrent_fills_of_one_key(s3, tmp_path: Path) -> None:
    s3_blobs(s3, tmp_path / "w").put(key("big.bin"), b"z" * 300_000)
    readers = [s3_blobs(s3, tmp_path / "shared-cache") for _ in range(4)]  # one host, four processes
    got: list[bytes] = []
    errors: list[BaseException] = []

    def read(r: S3Blobs) -> None:
        try:
            got.append(r.local_path(key("big.bin")).read_bytes())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(r,)) for r in readers for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and got == [b"z" * 300_000] * 8
    assert [p.name for p in (tmp_path / "shared-cache" / "ws/w1/u/u1/t/t1/a").iterdir()] == ["big.bin"]


def test_presigned_get_and_put(s3, tmp_path: Path) -> None:
    blobs = s3_blobs(s3, tmp_path / "cache")
    blobs.put(key("a1.txt"), b"for the kernel")
    url = blobs.presign(key("a1.txt"), "GET", ttl_s=60)
    assert s3.secret_key not in url
    assert httpx.get(url).content == b"for the kernel"
    put = blobs.presign(key("out.png"), "PUT", ttl_s=60, content_length=4)
    assert s3.secret_key not in put
    wrong = httpx.put(put, content=b"12345", headers={"If-None-Match": "*"})
    assert wrong.status_code == 403  # another length than the one signed
    assert not blobs.exists(key("out.png"))
    ok = httpx.put(put, content=b"1234", headers={"If-None-Match": "*"})
    assert ok.status_code == 200, ok.text
    assert blobs.get(key("out.png")) == b"1234"
    again = httpx.put(put, content=b"abcd", headers={"If-None-Match": "*"})
    assert again.status_code == 412  # written once, even through a URL
    assert blobs.get(key("out.png")) == b"1234"
    with pytest.raises(ValueError, match="content length"):
        blobs.presign(key("x.png"), "PUT")


def test_a_store_that_is_down_is_named(s3, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    down = s3_blobs(s3, tmp_path / "cache", endpoint=f"http://127.0.0.1:{port}")
    for call in (lambda: down.get(key("a.txt")), lambda: down.put(key("a.txt"), b"x"),
                 lambda: down.local_path(key("a.txt")), lambda: list(down.list("ws/w1/"))):
        with pytest.raises(BlobUnavailable) as info:
            call()
        msg = str(info.value)
        assert s3.url in msg and str(port) in msg and "unreachable" in msg
        assert s3.secret_key not in msg and s3.access_key not in msg


def test_wrong_credentials_are_said_as_such(s3, tmp_path: Path) -> None:
    bad = S3Blobs(s3.url, s3.endpoint, tmp_path / "cache", 1 << 20, region=s3.region,
                  access_key=s3.access_key, secret_key="not-the-secret")
    with pytest.raises(BlobUnavailable) as info:
        bad.put(key("a.txt"), b"x")
    assert s3.url in str(info.value) and "not-the-secret" not in str(info.value)

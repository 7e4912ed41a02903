"""The cluster `BlobStore`: an S3-compatible object store through obstore, with a bounded
read-through cache directory per host and presigned URLs (SCALE.md sections 5.1 and 5.4).

- Writes are write-once: `put` sends `If-None-Match: *` (obstore `mode="create"`), so an existing
  key is refused by the store itself, whichever host wrote it first.
- Reads go through `BlobCache`: a folder of this host holding copies of objects by key. Keys are
  written once, so a cached copy is never stale and needs no revalidation; the folder is kept
  under `cache_bytes` (least recently used first; a file just handed out is spared for a few
  seconds, since its reader opens it next). Two processes filling one key at once each write
  a temp file and rename it into place: the same bytes either way.
- Presigned URLs: GET through obstore's signer; PUT signed here (AWS SigV4, query string) with
  `content-length` and `if-none-match: *` among the signed headers, so the store refuses a
  body of any other length and never overwrites an object (obstore cannot sign extra headers).
- Credentials come from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (`AWS_SESSION_TOKEN`) and
  `AWS_REGION`, never from settings files; no message or log line carries them.
- Every failure to reach the store is `BlobUnavailable`, naming the store (`where`), after a
  short bounded retry (a down store answers in seconds, not obstore's default 3 minutes).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import BinaryIO, Callable, Iterator
from urllib.parse import quote, urlsplit

import obstore
from obstore.exceptions import (AlreadyExistsError, PermissionDeniedError, PreconditionError,
                                UnauthenticatedError)
from obstore.store import S3Store

from datadesk.store.interfaces.blobs import BlobError, BlobExists, BlobNotFound, BlobUnavailable, Method, check_prefix, parse_key
from datadesk.store.tempnames import temp_prefix

log = logging.getLogger(__name__)

PROTECT_S = 10.0  # a cache file handed out this recently is not evicted (its reader opens it next)
TRIM_TO = 0.9  # an overflowing cache is trimmed to this share of its bound (not one file per fill)
MAX_TTL_S = 7 * 24 * 3600  # SigV4's own limit for a presigned URL


def parse_url(url: str) -> tuple[str, str]:
    """`s3://bucket/prefix` -> (bucket, prefix without slashes at either end)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"storage.url {url!r} is not s3://<bucket>/<prefix>")
    return parts.netloc, parts.path.strip("/")


class BlobCache:
    """Copies of objects by key in one folder of this host, kept under `max_bytes`."""

    def __init__(self, root: Path, max_bytes: int, protect_s: float = PROTECT_S) -> None:
        self.root = Path(root)
        self.max_bytes = max(0, int(max_bytes))
        self.protect_s = protect_s
        self._lock = threading.Lock()
        self._used: int | None = None  # bytes in the folder as this process last counted them

    def path(self, key: str) -> Path:
        return self.root / key  # a validated key is a safe relative path

    def hit(self, key: str) -> Path | None:
        """The cached file of `key`, marked as used now; None when not cached."""
        path = self.path(key)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return None
            os.utime(path)  # the LRU order is the modification time
        except FileNotFoundError:
            return None
        return path

    def fill(self, key: str, write: Callable[[BinaryIO], object]) -> Path:
        """Write `key`'s file with `write(out)` through a temp file; returns the final path."""
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=temp_prefix(final.name), suffix=".tmp", dir=final.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                write(out)
            return self._place(Path(name), final)
        finally:
            Path(name).unlink(missing_ok=True)

    def adopt(self, key: str, src: Path) -> None:
        """Cache the file just uploaded as `key` (a hard link when it can be: no copy)."""
        if self.max_bytes <= 0:
            return
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{temp_prefix(final.name)}{os.urandom(4).hex()}.tmp")
        try:
            try:
                os.link(src, tmp)
            except OSError:  # another file system: a copy
                shutil.copyfile(src, tmp)
            self._place(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)

    def _place(self, tmp: Path, final: Path) -> Path:
        os.chmod(tmp, 0o444)  # read-only: a cached object is never changed in place
        size = tmp.stat().st_size
        os.replace(tmp, final)
        self._added(size, final)
        return final

    def drop(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def drop_prefix(self, prefix: str) -> None:
        shutil.rmtree(self.root / prefix, ignore_errors=True)
        with self._lock:
            self._used = None

    def _added(self, size: int, keep: Path) -> None:
        with self._lock:
            if self._used is not None:
                self._used += size
            if self._used is None or self._used > self.max_bytes:
                self._used = self._trim(keep)

    def _trim(self, keep: Path) -> int:
        """Count the folder; when over the bound, remove the least recently used files (never
        `keep`, nor one used in the last `protect_s`) until within `TRIM_TO` of it."""
        files: list[tuple[float, int, str]] = []
        total = 0
        for dirpath, _dirs, names in os.walk(self.root):
            for name in names:
                p = os.path.join(dirpath, name)
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    continue
                total += st.st_size
                if not name.startswith("."):  # another process's fill in progress is not ours to take
                    files.append((st.st_mtime, st.st_size, p))
        if total <= self.max_bytes:
            return total
        target = int(self.max_bytes * TRIM_TO)
        recent = time.time() - self.protect_s
        for mtime, size, p in sorted(files):
            if total <= target:
                break
            if p == str(keep) or mtime > recent:
                continue
            try:
                os.unlink(p)
                total -= size
            except FileNotFoundError:
                continue
        return total

    def used_bytes(self) -> int:
        """The bytes in the folder now (counted)."""
        return sum(os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(self.root) for n in names)


class S3Blobs:
    """Objects in `s3://bucket/prefix` at `endpoint`, cached under `cache_dir` (at most `cache_bytes`)."""

    def __init__(self, url: str, endpoint: str | None, cache_dir: Path, cache_bytes: int, *,
                 region: str | None = None, access_key: str | None = None, secret_key: str | None = None,
                 timeout_s: float = 300.0, connect_timeout_s: float = 3.0, retries: int = 2) -> None:
        self.bucket, self.prefix = parse_url(url)
        self.endpoint = (endpoint or "").rstrip("/") or None
        self.where = f"s3://{self.bucket}/{self.prefix}" + (f" at {self.endpoint}" if self.endpoint else "")
        self.region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self._access = access_key if access_key is not None else os.environ.get("AWS_ACCESS_KEY_ID", "")
        self._secret = secret_key if secret_key is not None else os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        self._token = os.environ.get("AWS_SESSION_TOKEN") if access_key is None else None
        self.cache = BlobCache(cache_dir, cache_bytes)
        self.store = S3Store(self.bucket, prefix=self.prefix or None, **self._config(),
                             client_options={"allow_http": bool(self.endpoint and self.endpoint.startswith("http:")),
                                             "connect_timeout": dt.timedelta(seconds=connect_timeout_s),
                                             "timeout": dt.timedelta(seconds=timeout_s)},
                             retry_config={"max_retries": retries, "retry_timeout": dt.timedelta(seconds=10),
                                           "backoff": {"init_backoff": dt.timedelta(milliseconds=100),
                                                       "max_backoff": dt.timedelta(seconds=1), "base": 2}})

    def _config(self) -> dict:
        cfg: dict = {"region": self.region, "virtual_hosted_style_request": False}
        if self.endpoint:
            cfg["endpoint"] = self.endpoint
        if self._access:
            cfg.update(access_key_id=self._access, secret_access_key=self._secret)
            if self._token:
                cfg["token"] = self._token
        return cfg

    def __repr__(self) -> str:  # never the credentials
        return f"S3Blobs({self.where!r})"

    # -- errors ------------------------------------------------------------------------
    def _failed(self, exc: BaseException, key: str) -> Exception:
        """What an obstore error means, named for people (no credentials, one line)."""
        first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        if isinstance(exc, FileNotFoundError):
            return BlobNotFound(f"{key} not found in {self.where}")
        if isinstance(exc, (AlreadyExistsError, PreconditionError)):
            return BlobExists(f"{key} already exists in {self.where}: objects are written once")
        if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)):
            return BlobUnavailable(f"the object store {self.where} refused the credentials: {first}")
        return BlobUnavailable(f"the object store {self.where} is unreachable: {first}")

    def _call(self, key: str, fn: Callable[[], object]):
        try:
            return fn()
        except BlobError:
            raise
        except Exception as exc:  # obstore raises its own classes and OSError subclasses
            raise self._failed(exc, key) from None

    # -- the protocol ---------------------------------------------------------------------
    def put(self, key: str, src: Path | bytes, if_absent: bool = True) -> int:
        parse_key(key)
        data = bytes(src) if isinstance(src, (bytes, bytearray, memoryview)) else None
        size = len(data) if data is not None else Path(src).stat().st_size
        payload = data if data is not None else Path(src)
        self._call(key, lambda: obstore.put(self.store, key, payload, mode="create" if if_absent else "overwrite",
                                            use_multipart=False if if_absent else None))
        try:
            if data is not None:
                if size <= self.cache.max_bytes:
                    self.cache.fill(key, lambda out: out.write(data))
            elif size <= self.cache.max_bytes:
                self.cache.adopt(key, Path(src))
        except OSError as exc:  # the object is stored; only this host's copy is missing
            log.warning("could not cache %s on this host: %s", key, exc)
        return size

    def get(self, key: str) -> bytes:
        parse_key(key)
        cached = self.cache.hit(key)
        if cached is not None:
            return cached.read_bytes()
        return bytes(self._call(key, lambda: obstore.get(self.store, key).bytes()))

    def local_path(self, key: str) -> Path:
        parse_key(key)
        cached = self.cache.hit(key)
        if cached is not None:
            return cached
        return self._call(key, lambda: self.cache.fill(key, lambda out: self._download(key, out)))

    def _download(self, key: str, out: BinaryIO) -> None:
        result = obstore.get(self.store, key)
        want = result.meta["size"]
        got = 0
        for chunk in result.stream(min_chunk_size=1 << 20):
            out.write(chunk)
            got += len(chunk)
        if got != want:
            raise BlobUnavailable(f"the object store {self.where} sent {got} of the {want} bytes of {key}")

    def open_range(self, key: str, start: int, length: int) -> bytes:
        parse_key(key)
        cached = self.cache.hit(key)
        if cached is not None:
            with open(cached, "rb") as fh:
                fh.seek(start)
                return fh.read(max(0, length))
        if length <= 0:
            return b""
        size = self.size(key)
        end = min(size, start + length)
        if start >= end:
            return b""
        return bytes(self._call(key, lambda: obstore.get_range(self.store, key, start=start, end=end)))

    def size(self, key: str) -> int:
        parse_key(key)
        cached = self.cache.hit(key)
        if cached is not None:
            return cached.stat().st_size
        return int(self._call(key, lambda: obstore.head(self.store, key))["size"])

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
            return True
        except BlobNotFound:
            return False

    def delete(self, key: str) -> None:
        parse_key(key)
        self.cache.drop(key)
        try:
            self._call(key, lambda: obstore.delete(self.store, key))
        except BlobNotFound:
            pass

    def delete_prefix(self, prefix: str) -> int:
        keys = list(self.list(prefix))
        self.cache.drop_prefix(check_prefix(prefix))
        for i in range(0, len(keys), 500):  # one request per batch (DeleteObjects)
            batch = keys[i:i + 500]
            self._call(prefix, lambda: obstore.delete(self.store, batch))
        return len(keys)

    def list(self, prefix: str) -> Iterator[str]:
        check_prefix(prefix)

        def every() -> list[str]:
            return [m["path"] for batch in obstore.list(self.store, prefix=prefix) for m in batch]

        yield from self._call(prefix, every)

    def presign(self, key: str, method: Method = "GET", ttl_s: int = 300,
                content_length: int | None = None) -> str:
        """GET: a URL for this one object. PUT: needs `content_length`; the request must send
        `Content-Length: <content_length>` and `If-None-Match: *` (both signed: any other
        length is refused, and an existing object is never overwritten)."""
        parse_key(key)
        if not 1 <= ttl_s <= MAX_TTL_S:
            raise ValueError(f"ttl_s {ttl_s} is outside 1..{MAX_TTL_S} seconds")
        if method == "GET":
            return self._call(key, lambda: obstore.sign(self.store, "GET", key, dt.timedelta(seconds=ttl_s)))
        if method != "PUT":
            raise ValueError(f"presign: method {method!r} is not GET or PUT")
        if content_length is None or content_length < 0:
            raise ValueError("presign: a PUT URL needs the content length it allows")
        if not self._access or not self.endpoint:
            raise BlobUnavailable(f"the object store {self.where}: a PUT URL needs AWS_ACCESS_KEY_ID and an endpoint")
        path = "/".join(p for p in (self.bucket, self.prefix, key) if p)
        return presign_v4("PUT", self.endpoint, path, self.region, self._access, self._secret, ttl_s,
                          {"content-length": str(content_length), "if-none-match": "*"}, token=self._token)


def presign_v4(method: str, endpoint: str, path: str, region: str, access_key: str, secret_key: str,
               ttl_s: int, headers: dict[str, str], token: str | None = None,
               now: dt.datetime | None = None) -> str:
    """An AWS SigV4 query-string signed URL for `method` on `endpoint/path` (path style), with
    `headers` among the signed ones (the request must send them exactly)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    base = endpoint.rstrip("/")
    host = urlsplit(base).netloc
    uri = "/" + quote(path, safe="/-_.~")
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    scope = f"{day}/{region}/s3/aws4_request"
    signed = {"host": host, **{k.lower(): str(v).strip() for k, v in headers.items()}}
    names = ";".join(sorted(signed))
    params = {"X-Amz-Algorithm": "AWS4-HMAC-SHA256", "X-Amz-Credential": f"{access_key}/{scope}",
              "X-Amz-Date": amz_date, "X-Amz-Expires": str(ttl_s), "X-Amz-SignedHeaders": names}
    if token:
        params["X-Amz-Security-Token"] = token
    query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items()))
    canonical = "\n".join([method, uri, query, "".join(f"{k}:{signed[k]}\n" for k in sorted(signed)), names,
                           "UNSIGNED-PAYLOAD"])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = ("AWS4" + secret_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    return f"{base}{uri}?{query}&X-Amz-Signature={signature}"


def build_blobs(settings, layout) -> S3Blobs:
    """The cluster blob store from `settings.storage` (url, endpoint, cache_mb), its cache under
    the home (`<home>/cache/blobs`: per host, safe to delete at any time)."""
    storage = settings.storage
    cache_mb = getattr(storage, "cache_mb", 1024)
    return S3Blobs(storage.url, getattr(storage, "endpoint", None) or None, layout.home / "cache" / "blobs",
                   int(cache_mb) << 20)

"""Objects in storage read through fsspec: the URLs of the `wds:` and `hf:` sources.

`s3://BUCKET/KEY` (s3fs; an S3-compatible store by data.endpoint_url or botocore's AWS_ENDPOINT_URL),
`gs://BUCKET/KEY` (gcsfs), `http://` and `https://` (fsspec's HTTP filesystem, aiohttp). Credentials come from
where each library looks (AWS_* variables, ~/.aws/, GOOGLE_APPLICATION_CREDENTIALS...), never from the data.
No shell: webdataset's `pipe:` URLs, which run commands, are refused. Without the storage library a URL is
one line naming the package to install (`pip install 'resmlp[remote]'`: s3fs and aiohttp; gcsfs by hand).

Faults of the network: every request is bounded by data.remote_timeout (connect and each read) and tried up
to 1 + data.remote_retries times, waiting data.remote_backoff x 2^k seconds (at most 30) between tries, on
connection errors, timeouts, 408/429/5xx and a body cut short. A missing object, a refusal (other 4xx) and an
object changed since the run listed it are not retried. An object is known by its size and ETag when listed
(`ObjectStat`): shards are read in ranges of exactly that size; over HTTP every range carries `If-Match:
ETAG` (a changed object answers 412); on S3 and GCS the size and ETag are checked when a shard starts, and
for every store when it ends; a difference is a `ChangedError`, never trained on as if nothing happened.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from resmlp.errors import ConfigError, DataError

# the package each scheme needs (fsspec's registry names the class; the extra installs all but gcsfs)
SCHEMES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "http": "aiohttp", "https": "aiohttp"}
CHUNK = 8 << 20  # bytes a range request asks for: webdataset's and timm's streams read shards sequentially
MAX_BACKOFF = 30.0
T = TypeVar("T")


def is_url(text: str | None) -> bool:
    """Whether `text` is a URL this module reads (scheme://...)."""
    scheme, sep, _ = (text or "").partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


def refuse_pipe(text: str) -> None:
    """webdataset's `pipe:CMD` runs CMD in a shell: never from a data source."""
    if text.startswith("pipe:") or text.partition("://")[0].lower() == "pipe":
        raise ConfigError(f"{text[:80]!r}: pipe: URLs run a command, which resmlp never does; name the shards by "
                          "s3://, gs://, http(s):// or a local path")


@dataclass(frozen=True)
class RemoteOptions:
    """How URLs are read (data.* keys of the same names)."""

    endpoint_url: str | None = None  # an S3-compatible store (MinIO, Ceph, R2...); None: AWS or AWS_ENDPOINT_URL
    retries: int = 5  # tries after the first, per request
    timeout: float = 60.0  # seconds: connecting, and waiting for each read
    backoff: float = 1.0  # seconds before the second try, doubled each time
    on_error: str = "skip"  # a shard that keeps failing: skip (named, counted) | stop (the run ends, one line)
    cache_dir: str | None = None  # node-local copies of the shards (resmlp.data.sources.shard_cache)
    cache_bytes: int = 100 * 10**9


class RemoteError(DataError):
    """A request that failed for good (after its retries, or at once where retrying can't help)."""


class ChangedError(RemoteError):
    """The object differs from the one listed when the run started (another size or ETag)."""


@dataclass(frozen=True)
class ObjectStat:
    """An object as listed: its URL, size in bytes and ETag (None where the store gives none)."""

    url: str
    size: int
    etag: str | None


def fingerprint(stats: list[ObjectStat]) -> str:
    """A digest of objects' URLs, sizes and ETags as listed: the state's check that a resume reads the same."""
    digest = hashlib.sha256()
    for obj in stats:
        digest.update(f"{obj.url}\0{obj.size}\0{obj.etag}\0".encode())
    return digest.hexdigest()


_FILESYSTEMS: dict[tuple, Any] = {}


def filesystem(url: str, options: RemoteOptions) -> Any:
    """The fsspec filesystem of `url`'s scheme, one per process and options, with bounded timeouts and its own
    retries off (this module retries); ConfigError naming the package to install where it is missing."""
    protocol = url.partition("://")[0].lower()
    key = (os.getpid(), protocol, options.endpoint_url, options.timeout)
    if key in _FILESYSTEMS:
        return _FILESYSTEMS[key]
    import fsspec

    try:
        cls = fsspec.get_filesystem_class(protocol)
        kwargs = _fs_kwargs(protocol, options)
    except ImportError:
        extra = "pip install gcsfs" if SCHEMES[protocol] == "gcsfs" else "pip install 'resmlp[remote]'"
        raise ConfigError(f"{url[:80]}: reading {protocol}:// URLs needs the {SCHEMES[protocol]} package: "
                          f"{extra}") from None
    fs = cls(skip_instance_cache=True, **kwargs)
    if protocol == "s3":
        fs.retries = 1  # s3fs's own loop of 5 tries would multiply ours
    _FILESYSTEMS[key] = fs
    return fs


def _fs_kwargs(protocol: str, options: RemoteOptions) -> dict[str, Any]:
    if protocol == "s3":
        import s3fs  # noqa: F401 (ImportError: the one line above)

        config = {"connect_timeout": options.timeout, "read_timeout": options.timeout, "retries": {"max_attempts": 1}}
        # no listings cache: a shard checked again (check_unchanged, a resume's fingerprint) is asked of the store
        return {"config_kwargs": config, "use_listings_cache": False,
                **({"endpoint_url": options.endpoint_url} if options.endpoint_url else {})}
    if protocol in ("http", "https"):
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=options.timeout, sock_read=options.timeout)
        return {"client_kwargs": {"timeout": timeout}}
    import gcsfs  # noqa: F401

    return {"timeout": options.timeout, "use_listings_cache": False}


def _status(error: BaseException) -> int | None:
    """The HTTP status an error carries (aiohttp's ClientResponseError, botocore's ClientError via s3fs)."""
    status = getattr(error, "status", None)
    if isinstance(status, int):
        return status
    response = getattr(error, "response", None) or getattr(error.__cause__, "response", None)
    if isinstance(response, dict):
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code if isinstance(code, int) else None
    return None


def _kind(error: BaseException) -> str:
    """missing | refused | changed | transient."""
    if isinstance(error, FileNotFoundError) and isinstance(error.__cause__, Exception):
        return _kind(error.__cause__)  # fsspec's HTTP info says "not found" for any failure; the cause tells
    status = _status(error)
    text = f"{type(error).__name__} {error}"
    if status == 412 or status == 416 or "PreconditionFailed" in text or "FileExpired" in text \
            or isinstance(error, ChangedError):
        return "changed"
    if isinstance(error, FileNotFoundError) or status == 404:
        return "missing"
    if isinstance(error, (PermissionError, ConfigError)) or (status is not None and 400 <= status < 500
                                                             and status not in (408, 429)):
        return "refused"
    return "transient"


def _reason(error: BaseException) -> str:
    status = _status(error)
    if status:
        return f"HTTP {status} {getattr(error, 'message', '') or ''}".strip()
    return (str(error).splitlines() or [""])[0][:160] or type(error).__name__


def retried(call: Callable[[], T], what: str, options: RemoteOptions) -> T:
    """`call()`, tried again after transient faults (see the module doc); RemoteError (ChangedError,
    FileNotFoundError for a missing object) naming `what` when it fails for good."""
    for attempt in range(options.retries + 1):
        try:
            return call()
        except Exception as error:  # the storage libraries raise their own kinds; sorted by _kind
            kind = _kind(error)
            if kind == "transient" and attempt < options.retries:
                time.sleep(min(options.backoff * 2 ** attempt, MAX_BACKOFF))
                continue
            if kind == "missing":
                raise FileNotFoundError(f"{what} does not exist") from None
            if kind == "changed":
                raise ChangedError(f"{what} changed since the run listed it ({_reason(error)})") from None
            tries = f" after {attempt + 1} tries" if kind == "transient" else ""
            raise RemoteError(f"{what}: {_reason(error)}{tries}") from None
    raise AssertionError("unreachable")


def stat(url: str, options: RemoteOptions) -> ObjectStat:
    """`url`'s size and ETag (FileNotFoundError where it does not exist)."""
    fs = filesystem(url, options)
    info = retried(lambda: fs.info(url), url, options)
    return _as_stat(url, info)


def _as_stat(url: str, info: dict[str, Any]) -> ObjectStat:
    size = info.get("size")
    if not isinstance(size, int) or info.get("type") == "directory":
        raise RemoteError(f"{url}: the store gives no size for it (a folder, or a server that sends no "
                          "Content-Length)")
    etag = info.get("ETag") or info.get("etag") or info.get("generation") or info.get("Last-Modified")
    return ObjectStat(url, size, str(etag) if etag else None)


def stat_all(urls: list[str], options: RemoteOptions) -> list[ObjectStat | None]:
    """Each URL's ObjectStat, None where it does not exist: one listing per folder for object stores, one HEAD
    per URL (8 at a time) over HTTP."""
    if not urls:
        return []
    protocol = urls[0].partition("://")[0].lower()
    if protocol in ("http", "https"):
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda u: _stat_or_none(u, options), urls))
    fs = filesystem(urls[0], options)
    listed: dict[str, dict[str, Any]] = {}
    for parent in dict.fromkeys(u.rsplit("/", 1)[0] for u in urls):
        try:
            entries = retried(lambda p=parent: fs.ls(p, detail=True), parent, options)
        except FileNotFoundError:
            continue
        listed.update({f"{protocol}://{e['name'].lstrip('/')}": e for e in entries})
    return [_as_stat(u, listed[u]) if u in listed else None for u in urls]


def _stat_or_none(url: str, options: RemoteOptions) -> ObjectStat | None:
    try:
        return stat(url, options)
    except FileNotFoundError:
        return None


def read_small(url: str, limit: int, options: RemoteOptions) -> bytes | None:
    """The bytes of a small object (an index.json), None where it does not exist; RemoteError above `limit`."""
    try:
        found = stat(url, options)
    except FileNotFoundError:
        return None
    if found.size > limit:
        raise RemoteError(f"{url} holds {found.size} bytes, more than the {limit} of a shard index")
    return read_range(found, 0, found.size, options) if found.size else b""


def read_range(obj: ObjectStat, start: int, end: int, options: RemoteOptions) -> bytes:
    """Bytes [start, end) of the object as listed: exactly that many, or RemoteError/ChangedError."""
    fs = filesystem(obj.url, options)
    http = obj.url.partition("://")[0].lower() in ("http", "https")
    extra = {"headers": {"If-Match": obj.etag}} if http and obj.etag and not obj.etag.startswith("W/") else {}

    def call() -> bytes:
        data = fs.cat_file(obj.url, start=start, end=end, **extra)
        if len(data) != end - start:
            raise OSError(f"got {len(data)} of the {end - start} bytes asked for (a body cut short)")
        return data

    return retried(call, f"{obj.url} bytes {start}-{end}", options)


def check_unchanged(obj: ObjectStat, options: RemoteOptions) -> None:
    """ChangedError unless the object has the size and ETag it was listed with."""
    now = stat(obj.url, options)
    if (now.size, now.etag) != (obj.size, obj.etag):
        raise ChangedError(f"{obj.url} changed while the run read it (size {obj.size} -> {now.size}, ETag "
                           f"{obj.etag} -> {now.etag})")


class RangeReader(io.RawIOBase):
    """A seekable binary stream over an object as listed, read in CHUNK ranges through `read_range` (so each
    range is retried on its own and a resumed read starts where it stopped)."""

    def __init__(self, obj: ObjectStat, options: RemoteOptions) -> None:
        super().__init__()
        self.obj, self.options, self.position = obj, options, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.obj.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self.obj.size, self.position + len(view))
        if end <= self.position:
            return 0
        data = read_range(self.obj, self.position, end, self.options)
        view[: len(data)] = data
        self.position = end
        return len(data)


def open_object(obj: ObjectStat, options: RemoteOptions) -> io.BufferedReader:
    """A buffered stream over the object (CHUNK bytes a request)."""
    return io.BufferedReader(RangeReader(obj, options), buffer_size=CHUNK)


def join(base: str, name: str) -> str:
    """`name` in the folder URL `base`."""
    return base.rstrip("/") + "/" + name


def first_existing(urls: Iterable[str], options: RemoteOptions) -> str | None:
    """The first of `urls` that exists."""
    return next((u for u in urls if _stat_or_none(u, options) is not None), None)

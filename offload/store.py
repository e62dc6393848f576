"""Object stores for the tier: ``s3://bucket/prefix`` (boto3, any endpoint) and ``file:///dir``.

API (the object store interface, docs/protocol.md#object-store), synchronous (the broker runs it in
a thread pool; Spark workers call it directly)::

    store = open_object_store("s3://bucket/prefix", s3_endpoint_url=None)
    store = open_object_store("file:///var/tier")
    store.uri                                   # the base URI, normalised
    store.object_uri(key) -> str                # full URI of a key (what metadata records)
    store.put(key, data, *, metadata=None) -> ObjectInfo      # bytes-like; multipart if big
    w = store.open_writer(key)                  # an object written in pieces (ObjectWriter):
    w.write(data); w.commit() -> ObjectInfo     # visible under key only after commit;
    w.abort()                                   # abort: nothing under key, nothing left behind
    BackgroundObjectWriter(w, bytes_max=)       # the same, written by a thread of its own
    store.get(key) -> bytes
    store.get_range(key, start, length) -> bytes              # exactly length bytes
    store.head(key) -> ObjectInfo | None                      # None: no such object
                                                # ObjectInfo: key, size_bytes, metadata, modified_ms
    store.delete(key) -> None                                 # idempotent
    store.list(prefix="") -> Iterator[ObjectInfo]             # keys under prefix, sorted
    store.open_input_file(key, *, size=None) -> pa.NativeFile # random access for pyarrow

    store, key = open_object_uri("s3://bucket/prefix/x.parquet", s3_endpoint_url=None)
    open_input_file("s3://.../x.parquet", s3_endpoint_url=None) -> pa.NativeFile
    crc32c_hex(data) -> str; Crc32cHasher

Keys are relative to the store's prefix, ``/``-separated, with no ``..``/empty segments.

S3: path-style addressing; credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_SESSION_TOKEN when set, else boto3's usual chain (profile, instance role); region from
AWS_REGION / AWS_DEFAULT_REGION (else us-east-1); the endpoint from the argument, else
AWS_ENDPOINT_URL, else AWS. botocore retries 5xx, throttling and timeouts with bounded,
jittered exponential backoff (``S3Settings.attempts_max``); what is still failing after that
raises ObjectStoreError (retriable). A missing bucket or refused credentials raise
ObjectStoreError with ``retriable = False`` and a message naming the bucket and endpoint.

file://: ``put`` writes a temp file in the target directory, fsyncs it, renames it into
place and fsyncs the directory: a reader sees the whole object or none. ``open_writer`` does the
same with the temp file written piece by piece (abort: the temp file is removed).

S3: ``open_writer`` buffers one part (``S3Settings.multipart_chunk_bytes``); an object that
stays below one part is one PUT at commit, a bigger one a multipart upload
(create_multipart_upload at the first full part, upload_part as parts fill, the last part and
complete_multipart_upload at commit, abort_multipart_upload on abort): memory holds one part.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping
from urllib.parse import unquote, urlparse

import crc32c as _crc32c
import pyarrow as pa

from offload.errors import TierError

log = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"
FILE_SYNC_BYTES = 8 * 1024 * 1024
"""A file object written as a stream (``open_writer``) is fdatasync'ed each time this many more
bytes were written, in the writer's own thread while the encoder goes on, so the fsync at
commit finds at most this much still to flush (RocksDB's ``bytes_per_sync`` does the same).
Before, commit flushed the whole object at the end of an offload's write step: ~55 ms per
100 MB here, with nothing else to do meanwhile. Durability is the commit's fsync, as before."""


class ObjectStoreError(TierError):
    """An object store operation failed. ``retriable`` is True for transient failures
    (5xx/throttling/timeouts that outlasted botocore's retries, connection errors) and False
    for configuration problems (no such bucket, access denied, bad URI)."""

    retriable = True

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


class ObjectNotFoundError(ObjectStoreError):
    retriable = False

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size_bytes: int
    metadata: Mapping[str, str]     # user metadata (S3 x-amz-meta-*); {} for file://
    modified_ms: int | None = None  # last modified (head/list), for orphan sweeps


@dataclass(frozen=True)
class S3Settings:
    attempts_max: int = 6            # botocore "standard" mode: total attempts per request
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    pool_connections_max: int = 32
    multipart_threshold_bytes: int = 64 * 1024 * 1024
    multipart_chunk_bytes: int = 16 * 1024 * 1024
    multipart_concurrency: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.attempts_max <= 20:
            raise ValueError(f"attempts_max {self.attempts_max} outside [1, 20]")
        if self.multipart_chunk_bytes < 5 * 1024 * 1024:
            raise ValueError("multipart_chunk_bytes below S3's 5 MiB minimum part size")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("timeouts must be positive")


def crc32c_hex(data: bytes | memoryview) -> str:
    return f"{_crc32c.crc32c(data):08x}"


class Crc32cHasher:
    """Incremental CRC32C (for data written in pieces)."""

    def __init__(self) -> None:
        self.value = 0
        self.size_bytes = 0

    def update(self, data: bytes | memoryview) -> None:
        self.value = _crc32c.crc32c(data, self.value)
        self.size_bytes += len(data)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key or key.startswith("/") or key.endswith("/"):
        raise ObjectStoreError(f"bad object key {key!r}", retriable=False)
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts) or "\x00" in key:
        raise ObjectStoreError(f"bad object key {key!r}", retriable=False)
    if parts[-1].startswith(TMP_PREFIX):
        raise ObjectStoreError(f"object key {key!r} uses the reserved prefix {TMP_PREFIX}",
                               retriable=False)
    return key


class ObjectStore:
    """Base class: see the module docstring for the API."""

    uri: str

    def object_uri(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{_check_key(key)}"

    def put(self, key: str, data: bytes | memoryview, *,
            metadata: Mapping[str, str] | None = None) -> ObjectInfo:
        raise NotImplementedError

    def open_writer(self, key: str, *, metadata: Mapping[str, str] | None = None) -> "ObjectWriter":
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def get_range(self, key: str, start: int, length: int) -> bytes:
        raise NotImplementedError

    def head(self, key: str) -> ObjectInfo | None:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        raise NotImplementedError

    def open_input_file(self, key: str, *, size: int | None = None) -> pa.NativeFile:
        if size is None:
            info = self.head(key)
            if info is None:
                raise ObjectNotFoundError(f"no object {self.object_uri(key)}")
            size = info.size_bytes
        return pa.PythonFile(RangedReader(self, key, size), mode="r")


class RangedReader(io.RawIOBase):
    """A seekable read-only file over ranged GETs, for pyarrow. Each GET fetches at least
    ``block_bytes`` (small reads of the Parquet footer do not cost one request each)."""

    def __init__(self, store: ObjectStore, key: str, size: int, *,
                 block_bytes: int = 8 * 1024 * 1024) -> None:
        super().__init__()
        self._store = store
        self._key = key
        self._size = size
        self._pos = 0
        self._block_bytes = block_bytes
        self._cache_start = 0
        self._cache = b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"bad whence {whence}")
        if pos < 0:
            raise ValueError("negative seek position")
        self._pos = pos
        return pos

    def read(self, n: int = -1) -> bytes:
        if self._pos >= self._size:
            return b""
        if n is None or n < 0:
            n = self._size - self._pos
        n = min(n, self._size - self._pos)
        start = self._pos
        c0 = self._cache_start
        if c0 <= start and start + n <= c0 + len(self._cache):
            out = self._cache[start - c0:start - c0 + n]
        elif n >= self._block_bytes:
            out = self._store.get_range(self._key, start, n)
        else:
            length = min(max(n, self._block_bytes), self._size - start)
            self._cache = self._store.get_range(self._key, start, length)
            self._cache_start = start
            out = self._cache[:n]
        self._pos += len(out)
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


# ---------------------------------------------------------------------------------------------
# file://
# ---------------------------------------------------------------------------------------------

class ObjectWriter:
    """An object written in pieces (``ObjectStore.open_writer``): ``write`` bytes in order,
    then ``commit()`` (the object appears under its key, whole) or ``abort()`` (nothing appears,
    nothing is left behind; idempotent, also after a failed write or commit). ``size_bytes``:
    bytes written so far. Not thread-safe: one writer thread."""

    size_bytes: int

    def write(self, data: bytes | memoryview) -> None:
        raise NotImplementedError

    def commit(self) -> ObjectInfo:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "ObjectWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


class BackgroundObjectWriter(ObjectWriter):
    """Another object writer (``inner``) fed by a thread of its own, so that the caller (an
    encoder) goes on while the bytes are written or uploaded: ``write`` queues them, waiting
    while ``bytes_max`` are queued; ``commit`` waits for the queue to drain, then commits;
    ``abort`` drops the queue and aborts. An error of ``inner`` is raised by the next
    ``write`` / ``commit``."""

    def __init__(self, inner: ObjectWriter, *, bytes_max: int, name: str = "object-writer") -> None:
        if bytes_max <= 0:
            raise ValueError(f"bytes_max {bytes_max} <= 0")
        self.inner = inner
        self.bytes_max = bytes_max
        self.size_bytes = 0
        self.bytes_queued = 0
        self._queue: list[bytes] = []
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._closing = False                 # no more writes: the thread drains and exits
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                data = self._queue.pop(0)
            try:
                if self._error is None:
                    self.inner.write(data)
            except BaseException as e:        # noqa: BLE001 - raised to the caller
                self._error = e
            with self._cond:
                self.bytes_queued -= len(data)
                self._cond.notify_all()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, data: bytes | memoryview) -> None:
        data = bytes(data)
        with self._cond:
            while self.bytes_queued and self.bytes_queued + len(data) > self.bytes_max and self._error is None:
                self._cond.wait()
            self._raise()
            self._queue.append(data)
            self.bytes_queued += len(data)
            self.size_bytes += len(data)
            self._cond.notify_all()

    def _drain(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    def commit(self) -> ObjectInfo:
        self._drain()
        try:
            self._raise()
        except BaseException:
            self.inner.abort()
            raise
        return self.inner.commit()

    def abort(self) -> None:
        with self._cond:
            self._error = self._error or ObjectStoreError("aborted", retriable=False)
            self._queue.clear()
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self.inner.abort()


class _FileObjectWriter(ObjectWriter):
    """A temp file beside the final path (``TMP_PREFIX``: never listed), synced every
    ``FILE_SYNC_BYTES`` as it is written, fsynced and renamed into place at commit, the
    directory fsynced."""

    def __init__(self, store: "FileObjectStore", key: str) -> None:
        self.store, self.key = store, key
        self.path = store._path(key)
        self.size_bytes = 0
        self.synced_bytes = 0                 # flushed by the last fdatasync (FILE_SYNC_BYTES)
        self._done = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.tmp = self.path.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}-{self.path.name}")
            self._fd: int | None = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            raise ObjectStoreError(f"put {store.object_uri(key)}: {exc}") from None

    def write(self, data: bytes | memoryview) -> None:
        if self._done or self._fd is None:
            raise ObjectStoreError(f"put {self.store.object_uri(self.key)}: writer already finished",
                                   retriable=False)
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
                self.size_bytes += written
            if self.size_bytes - self.synced_bytes >= FILE_SYNC_BYTES:
                os.fdatasync(self._fd)
                self.synced_bytes = self.size_bytes
        except OSError as exc:
            raise ObjectStoreError(f"put {self.store.object_uri(self.key)}: {exc}") from None

    def commit(self) -> ObjectInfo:
        if self._done or self._fd is None:
            raise ObjectStoreError(f"put {self.store.object_uri(self.key)}: writer already finished",
                                   retriable=False)
        try:
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self.tmp, self.path)
            self._done = True
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            self.abort()
            raise ObjectStoreError(f"put {self.store.object_uri(self.key)}: {exc}") from None
        return ObjectInfo(self.key, self.size_bytes, {})

    def abort(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass
        if not self._done:
            self._done = True
            self.tmp.unlink(missing_ok=True)


class FileObjectStore(ObjectStore):
    """Objects as files under a directory; atomic puts (temp file, fsync, rename)."""

    def __init__(self, root: Path | str, *, create: bool = True) -> None:
        self.root = Path(root).resolve()
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ObjectStoreError(f"cannot create the tier directory {self.root}: {exc}",
                                       retriable=False) from None
        self.uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*_check_key(key).split("/"))

    def put(self, key: str, data: bytes | memoryview, *,
            metadata: Mapping[str, str] | None = None) -> ObjectInfo:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}-{path.name}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise ObjectStoreError(f"put {self.object_uri(key)}: {exc}") from None
        return ObjectInfo(key, len(data), {})

    def open_writer(self, key: str, *, metadata: Mapping[str, str] | None = None) -> ObjectWriter:
        """``metadata`` is not kept (file:// has no user metadata, as ``put``)."""
        return _FileObjectWriter(self, key)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise ObjectNotFoundError(f"no object {self.object_uri(key)}") from None
        except OSError as exc:
            raise ObjectStoreError(f"get {self.object_uri(key)}: {exc}") from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ObjectStoreError(f"bad range {start}+{length}", retriable=False)
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = os.pread(f.fileno(), length, start)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"no object {self.object_uri(key)}") from None
        except OSError as exc:
            raise ObjectStoreError(f"get {self.object_uri(key)}: {exc}") from None
        if len(data) != length:
            raise ObjectStoreError(f"range {start}+{length} beyond the end of "
                                   f"{self.object_uri(key)}", retriable=False)
        return data

    def head(self, key: str) -> ObjectInfo | None:
        try:
            st = self._path(key).stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ObjectStoreError(f"head {self.object_uri(key)}: {exc}") from None
        return ObjectInfo(key, st.st_size, {}, int(st.st_mtime * 1000))

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise ObjectStoreError(f"delete {self.object_uri(key)}: {exc}") from None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        found = []
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith(TMP_PREFIX):
                    continue
                full = Path(dirpath, name)
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    try:
                        st = full.stat()
                        found.append(ObjectInfo(key, st.st_size, {}, int(st.st_mtime * 1000)))
                    except FileNotFoundError:
                        continue
        return iter(sorted(found, key=lambda i: i.key))

    def list_temp_files(self) -> list[Path]:
        """Leftover temp files of interrupted puts (a crash between write and rename)."""
        return [Path(d, n) for d, _, files in os.walk(self.root) for n in files
                if n.startswith(TMP_PREFIX)]

    def open_input_file(self, key: str, *, size: int | None = None) -> pa.NativeFile:
        try:
            return pa.OSFile(str(self._path(key)), mode="r")
        except FileNotFoundError:
            raise ObjectNotFoundError(f"no object {self.object_uri(key)}") from None
        except OSError as exc:
            if "No such file" in str(exc) or "not found" in str(exc).lower():
                raise ObjectNotFoundError(f"no object {self.object_uri(key)}") from None
            raise ObjectStoreError(f"open {self.object_uri(key)}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# s3://
# ---------------------------------------------------------------------------------------------

_CONFIG_ERRORS = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId",
                  "SignatureDoesNotMatch", "AllAccessDisabled", "InvalidBucketName",
                  "AuthorizationHeaderMalformed", "PermanentRedirect"}
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}


class _S3ObjectWriter(ObjectWriter):
    """One part buffered; a multipart upload once the first part is full, else one PUT."""

    def __init__(self, store: "S3ObjectStore", key: str, metadata: Mapping[str, str] | None) -> None:
        self.store, self.key = store, key
        self.full = store._key(key)
        self.metadata = dict(metadata or {})
        self.part_bytes = store.settings.multipart_chunk_bytes
        self.size_bytes = 0
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._done = False

    def _client(self):
        return self.store._client

    def write(self, data: bytes | memoryview) -> None:
        if self._done:
            raise ObjectStoreError(f"put {self.store.object_uri(self.key)}: writer already finished",
                                   retriable=False)
        self._buffer += data
        self.size_bytes += len(data)
        while len(self._buffer) >= self.part_bytes:
            part = bytes(self._buffer[:self.part_bytes])
            del self._buffer[:self.part_bytes]
            self._upload(part)

    def _upload(self, part: bytes) -> None:
        try:
            if self._upload_id is None:
                created = self._client().create_multipart_upload(Bucket=self.store.bucket, Key=self.full,
                                                                  Metadata=self.metadata)
                self._upload_id = created["UploadId"]
            number = len(self._parts) + 1
            got = self._client().upload_part(Bucket=self.store.bucket, Key=self.full, UploadId=self._upload_id,
                                              PartNumber=number, Body=part)
            self._parts.append({"PartNumber": number, "ETag": got["ETag"]})
        except Exception as exc:
            self.abort()
            raise self.store._error("put", self.key, exc) from None

    def commit(self) -> ObjectInfo:
        if self._done:
            raise ObjectStoreError(f"put {self.store.object_uri(self.key)}: writer already finished",
                                   retriable=False)
        if self._upload_id is None:
            try:
                self._client().put_object(Bucket=self.store.bucket, Key=self.full, Body=bytes(self._buffer),
                                          Metadata=self.metadata)
            except Exception as exc:
                self.abort()
                raise self.store._error("put", self.key, exc) from None
        else:
            if self._buffer:
                self._upload(bytes(self._buffer))      # the last part may be short
            try:
                self._client().complete_multipart_upload(Bucket=self.store.bucket, Key=self.full,
                                                         UploadId=self._upload_id,
                                                         MultipartUpload={"Parts": self._parts})
            except Exception as exc:
                self.abort()
                raise self.store._error("put", self.key, exc) from None
        self._done = True
        self._buffer = bytearray()
        return ObjectInfo(self.key, self.size_bytes, self.metadata)

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        self._buffer = bytearray()
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            try:
                self._client().abort_multipart_upload(Bucket=self.store.bucket, Key=self.full, UploadId=upload_id)
            except Exception as exc:      # noqa: BLE001 - the bucket's lifecycle rule reaps it
                log.warning("abort of the multipart upload of %s failed (left to the bucket's lifecycle "
                            "rule): %s", self.store.object_uri(self.key), exc)


class S3ObjectStore(ObjectStore):
    def __init__(self, bucket: str, prefix: str, *, endpoint_url: str | None = None,
                 settings: S3Settings = S3Settings(), client: Any = None) -> None:
        if not bucket:
            raise ObjectStoreError("s3 URI without a bucket", retriable=False)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        self.settings = settings
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = client or _s3_client(self.endpoint_url, settings)

    def _key(self, key: str) -> str:
        key = _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self) -> str:
        return f"bucket {self.bucket!r} at {self.endpoint_url or 'AWS'}"

    def _error(self, op: str, key: str | None, exc: Exception) -> ObjectStoreError:
        from botocore.exceptions import BotoCoreError, ClientError
        what = f"{op} {self.object_uri(key) if key else self.uri}"
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _NOT_FOUND and key is not None:
                return ObjectNotFoundError(f"no object {self.object_uri(key)}")
            if code in _CONFIG_ERRORS or status in (401, 403) or (status == 404 and key is None):
                return ObjectStoreError(f"{what}: {code or status} ({self._where()}): "
                                        f"{err.get('Message', '')}", retriable=False)
            return ObjectStoreError(f"{what}: {code or status} after retries: "
                                    f"{err.get('Message', '')}",
                                    retriable=status is None or status >= 500 or status == 429)
        if isinstance(exc, BotoCoreError):
            from botocore.exceptions import NoCredentialsError
            if isinstance(exc, NoCredentialsError):
                return ObjectStoreError(f"{what}: no AWS credentials (set AWS_ACCESS_KEY_ID and "
                                        "AWS_SECRET_ACCESS_KEY)", retriable=False)
            return ObjectStoreError(f"{what}: {exc} ({self._where()})")
        return ObjectStoreError(f"{what}: {exc}")

    def _bucket_error_if_missing(self, op: str, key: str, exc: Exception) -> ObjectStoreError:
        """HEAD answers a bare 404 for both a missing key and a missing bucket: tell them
        apart (a missing bucket is a configuration error)."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except Exception as bucket_exc:
            return self._error(op, None, bucket_exc)
        return self._error(op, key, exc)

    def put(self, key: str, data: bytes | memoryview, *,
            metadata: Mapping[str, str] | None = None) -> ObjectInfo:
        full = self._key(key)
        size = len(data)
        try:
            if size >= self.settings.multipart_threshold_bytes:
                from boto3.s3.transfer import TransferConfig
                config = TransferConfig(
                    multipart_threshold=self.settings.multipart_threshold_bytes,
                    multipart_chunksize=self.settings.multipart_chunk_bytes,
                    max_concurrency=self.settings.multipart_concurrency, use_threads=True)
                self._client.upload_fileobj(
                    io.BytesIO(data), self.bucket, full, Config=config,
                    ExtraArgs={"Metadata": dict(metadata or {})})
            else:
                self._client.put_object(Bucket=self.bucket, Key=full, Body=bytes(data),
                                        Metadata=dict(metadata or {}))
        except Exception as exc:
            raise self._error("put", key, exc) from None
        return ObjectInfo(key, size, dict(metadata or {}))

    def open_writer(self, key: str, *, metadata: Mapping[str, str] | None = None) -> ObjectWriter:
        return _S3ObjectWriter(self, key, metadata)

    def get(self, key: str) -> bytes:
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            return response["Body"].read()
        except Exception as exc:
            raise self._error("get", key, exc) from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ObjectStoreError(f"bad range {start}+{length}", retriable=False)
        if length == 0:
            return b""
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key),
                                               Range=f"bytes={start}-{start + length - 1}")
            data = response["Body"].read()
        except Exception as exc:
            raise self._error("get", key, exc) from None
        if len(data) != length:
            raise ObjectStoreError(f"range {start}+{length} of {self.object_uri(key)} returned "
                                   f"{len(data)} bytes", retriable=False)
        return data

    def head(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError
        try:
            response = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404 or exc.response.get("Error", {}).get("Code") in _NOT_FOUND:
                error = self._bucket_error_if_missing("head", key, exc)
                if isinstance(error, ObjectNotFoundError):
                    return None
                raise error from None
            raise self._error("head", key, exc) from None
        except Exception as exc:
            raise self._error("head", key, exc) from None
        return ObjectInfo(key, int(response["ContentLength"]), dict(response.get("Metadata", {})),
                          _ms(response.get("LastModified")))

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            raise self._error("delete", key, exc) from None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base + prefix):
                for item in page.get("Contents", []):
                    yield ObjectInfo(item["Key"][len(base):], int(item["Size"]), {},
                                     _ms(item.get("LastModified")))
        except Exception as exc:
            raise self._error("list", None, exc) from None


def _ms(when: Any) -> int | None:
    return None if when is None else int(when.timestamp() * 1000)


_clients: dict[tuple, Any] = {}
_clients_lock = threading.Lock()


def _s3_client(endpoint_url: str | None, settings: S3Settings) -> Any:
    """A boto3 client (thread-safe; shared per endpoint, credentials and settings)."""
    import boto3
    from botocore.config import Config

    access_key = os.environ.get("AWS_ACCESS_KEY_ID")
    secret_key = os.environ.get("AWS_SECRET_ACCESS_KEY")
    token = os.environ.get("AWS_SESSION_TOKEN")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    cache_key = (endpoint_url, access_key, secret_key, token, region, settings)
    with _clients_lock:
        client = _clients.get(cache_key)
        if client is not None:
            return client
        config = Config(
            region_name=region, s3={"addressing_style": "path"},
            retries={"total_max_attempts": settings.attempts_max, "mode": "standard"},
            connect_timeout=settings.connect_timeout_s, read_timeout=settings.read_timeout_s,
            max_pool_connections=settings.pool_connections_max,
            # checksums only where S3 requires them (moto and MinIO differ on the newer ones)
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required")
        kwargs: dict[str, Any] = {"config": config, "endpoint_url": endpoint_url}
        if access_key and secret_key:
            kwargs.update(aws_access_key_id=access_key, aws_secret_access_key=secret_key,
                          aws_session_token=token)
        client = boto3.session.Session().client("s3", **kwargs)
        _clients[cache_key] = client
        return client


# ---------------------------------------------------------------------------------------------
# opening by URI
# ---------------------------------------------------------------------------------------------

def _parse(uri: str) -> tuple[str, str, str]:
    """(scheme, bucket or '', path)"""
    if not isinstance(uri, str) or not uri:
        raise ObjectStoreError(f"bad object store URI {uri!r}", retriable=False)
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return "s3", parsed.netloc, parsed.path.strip("/")
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ObjectStoreError(f"file URI with a host: {uri!r} (use file:///abs/path)",
                                   retriable=False)
        return "file", "", unquote(parsed.path)
    raise ObjectStoreError(f"unsupported object store URI {uri!r} (s3://bucket/prefix or "
                           "file:///dir)", retriable=False)


def open_object_store(uri: str, *, s3_endpoint_url: str | None = None,
                      settings: S3Settings | None = None) -> ObjectStore:
    """The store for a base URI: ``s3://bucket[/prefix]`` or ``file:///dir`` (created)."""
    scheme, bucket, path = _parse(uri)
    if scheme == "s3":
        return S3ObjectStore(bucket, path, endpoint_url=s3_endpoint_url or None,
                             settings=settings or S3Settings())
    if not path.startswith("/"):
        raise ObjectStoreError(f"file URI needs an absolute path: {uri!r}", retriable=False)
    return FileObjectStore(path)


def open_object_uri(uri: str, *, s3_endpoint_url: str | None = None,
                    settings: S3Settings | None = None) -> tuple[ObjectStore, str]:
    """(store, key) for a full object URI as recorded in ledger metadata. The store's base is
    the bucket (s3) or the object's directory (file)."""
    scheme, bucket, path = _parse(uri)
    if scheme == "s3":
        if not path:
            raise ObjectStoreError(f"object URI without a key: {uri!r}", retriable=False)
        return (S3ObjectStore(bucket, "", endpoint_url=s3_endpoint_url or None,
                              settings=settings or S3Settings()), path)
    p = Path(path)
    if not p.is_absolute() or not p.name:
        raise ObjectStoreError(f"bad file object URI {uri!r}", retriable=False)
    return FileObjectStore(p.parent, create=False), p.name


def open_input_file(uri: str, *, s3_endpoint_url: str | None = None,
                    size: int | None = None) -> pa.NativeFile:
    """A random-access pyarrow file for a full object URI (e.g. for pyarrow.parquet)."""
    store, key = open_object_uri(uri, s3_endpoint_url=s3_endpoint_url)
    return store.open_input_file(key, size=size)


__all__ = [
    "BackgroundObjectWriter", "Crc32cHasher", "FileObjectStore", "ObjectInfo", "ObjectNotFoundError", "ObjectStore", "ObjectWriter",
    "ObjectStoreError", "RangedReader", "S3ObjectStore", "S3Settings", "crc32c_hex",
    "open_input_file", "open_object_store", "open_object_uri",
]

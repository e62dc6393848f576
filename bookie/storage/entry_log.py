"""Entry log files, and the record codec shared by the journal and the entry logs.

Record (big-endian), the same bytes in a journal file and in an entry log::

    u32 body_len | u32 crc32c(body) | body
    body = u64 ledger_id | i64 entry_id | i64 lac | i64 length | payload | u8 kind | u32 checksum

``kind`` is ADD, FENCE or DELETE (FENCE/DELETE: entry_id = lac = -1, length 0, no payload,
checksum 0). For an ADD the body starts with exactly the bytes the entry checksum covers
(:func:`pulsarlite.checksum.entry_checksum`), so once the incoming checksum is verified, the
record CRC costs one CRC over the 5-byte trailer: ``crc32c(trailer, checksum)``. Reading a
record back computes one CRC pass over the body, which checks both the record CRC and the entry
checksum. ``body_len == 0`` marks the zero-filled (preallocated) end of a journal file.

An entry log file is a 16-byte header (``b"PLEL"``, u32 version, u64 log id) followed by ADD
records appended by checkpoints and compaction. Logs are never rewritten: a new one starts at
every open and whenever the current one passes ``entry_log_file_bytes_max``.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from typing import Iterable, NamedTuple, Sequence

from crc32c import crc32c

from pulsarlite.errors import ChecksumError, InvariantViolation

log = logging.getLogger("bookie.storage.entry_log")

ADD, FENCE, DELETE = 1, 2, 3
KIND_NAMES = {ADD: "ADD", FENCE: "FENCE", DELETE: "DELETE"}

HEAD = struct.Struct(">IIQqqq")      # body_len, crc, ledger_id, entry_id, lac, length
TRAILER = struct.Struct(">BI")       # kind, checksum
PREFIX = struct.Struct(">II")        # body_len, crc
FIXED_HEAD = struct.Struct(">Qqqq")  # the part of the body before the payload
HEAD_BYTES = HEAD.size               # 40
TRAILER_BYTES = TRAILER.size         # 5
BODY_FIXED_BYTES = HEAD_BYTES - PREFIX.size + TRAILER_BYTES   # 37
RECORD_OVERHEAD_BYTES = HEAD_BYTES + TRAILER_BYTES            # 45

U64_MAX = (1 << 64) - 1
I64_MAX = (1 << 63) - 1
U32_MAX = (1 << 32) - 1

LOG_HEADER = struct.Struct(">4sIQ")
LOG_MAGIC = b"PLEL"
LOG_VERSION = 1
LOG_HEADER_BYTES = LOG_HEADER.size   # 16
LOG_OFFSET_BITS = 40                 # index position = log_id << 40 | offset
LOG_OFFSET_MASK = (1 << LOG_OFFSET_BITS) - 1
_LOG_NAME = re.compile(r"^(\d{12})\.log$")
_WRITE_CHUNK_BYTES = 8 * 1024 * 1024


class StoredEntry(NamedTuple):
    """One ledger entry, byte for byte as the writer sent it. (Immutable; a NamedTuple rather
    than a frozen dataclass: one per entry on the add path, at a third of the cost.)"""

    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: bytes
    checksum: int


class Record(NamedTuple):
    kind: int
    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: bytes
    checksum: int


def encode_add(entry: StoredEntry) -> tuple[bytes, bytes]:
    """(head, trailer) of an ADD record; the record is head + payload + trailer. The caller
    must have verified the entry checksum (the record CRC relies on it)."""
    trailer = TRAILER.pack(ADD, entry.checksum)
    head = HEAD.pack(len(entry.payload) + BODY_FIXED_BYTES, crc32c(trailer, entry.checksum),
                     entry.ledger_id, entry.entry_id, entry.lac, entry.length)
    return head, trailer


def encode_control(kind: int, ledger_id: int) -> bytes:
    """A whole FENCE or DELETE record."""
    if kind not in (FENCE, DELETE):
        raise InvariantViolation(f"not a control record kind: {kind}")
    body = FIXED_HEAD.pack(ledger_id, -1, -1, 0) + TRAILER.pack(kind, 0)
    return PREFIX.pack(len(body), crc32c(body)) + body


def parse_record(buf: bytes | memoryview, pos: int, limit: int) -> tuple[Record, int] | str:
    """Parse the record at ``buf[pos:]`` (not beyond ``limit``): (record, end) or a reason
    string (``"end"`` for a zero length, else why it is invalid). Verifies the CRC."""
    if pos + PREFIX.size > limit:
        return "end"
    body_len, crc = PREFIX.unpack_from(buf, pos)
    if body_len == 0:
        return "end"
    if body_len < BODY_FIXED_BYTES:
        return f"bad length {body_len}"
    start = pos + PREFIX.size
    end = start + body_len
    if end > limit:
        return f"truncated record (length {body_len}, {limit - start} bytes left)"
    mv = memoryview(buf)
    inner = crc32c(mv[start:end - TRAILER_BYTES])
    if crc32c(mv[end - TRAILER_BYTES:end], inner) != crc:
        return "crc mismatch"
    kind, checksum = TRAILER.unpack_from(buf, end - TRAILER_BYTES)
    if kind not in KIND_NAMES:
        return f"unknown kind {kind}"
    if kind == ADD and inner != checksum:
        return "entry checksum mismatch"
    ledger_id, entry_id, lac, length = FIXED_HEAD.unpack_from(buf, start)
    payload = bytes(mv[start + FIXED_HEAD.size:end - TRAILER_BYTES])
    return Record(kind, ledger_id, entry_id, lac, length, payload, checksum), end


def record_to_entry(rec: Record) -> StoredEntry:
    return StoredEntry(rec.ledger_id, rec.entry_id, rec.lac, rec.length, rec.payload, rec.checksum)


def log_path(directory: str, log_id: int) -> str:
    return os.path.join(directory, f"{log_id:012d}.log")


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


PAGE_BYTES = 4096


def drop_clean_pages(fd: int, dropped: int, synced: int) -> int:
    """Drop a file's whole pages in [dropped, synced) from the page cache (they must be
    clean: synced); returns the new ``dropped`` (page-aligned: the kernel keeps a partial page,
    so it stays for the next call)."""
    upto = synced - synced % PAGE_BYTES
    if upto > dropped:
        os.posix_fadvise(fd, dropped, upto - dropped, os.POSIX_FADV_DONTNEED)
        return upto
    return dropped


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    mv = memoryview(data)
    while mv:
        n = os.pwrite(fd, mv, offset)
        if n <= 0:
            raise OSError(f"pwrite wrote {n} bytes")
        mv = mv[n:]
        offset += n


# most buffers one pwritev takes (Linux: 1024)
IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


def pwritev_all(fd: int, pieces: Sequence[bytes | memoryview], offset: int) -> int:
    """Write ``pieces`` back to back at ``offset`` with pwritev (no joined copy of them in
    this process), IOV_MAX pieces per call; a short write finishes with pwrite_all. Returns the
    bytes written (all of them)."""
    start = offset
    for first in range(0, len(pieces), IOV_MAX):
        chunk = pieces[first:first + IOV_MAX]
        wanted = sum(map(len, chunk))
        written = os.pwritev(fd, chunk, offset) if wanted else 0
        if written < 0 or (written == 0 and wanted):
            raise OSError(f"pwritev wrote {written} bytes")
        if written < wanted:              # short: skip what went out, pwrite the rest
            skip = written
            rest_offset = offset + written
            for piece in chunk:
                size = len(piece)
                if skip >= size:
                    skip -= size
                    continue
                pwrite_all(fd, memoryview(piece)[skip:], rest_offset)
                rest_offset += size - skip
                skip = 0
        offset += wanted
    return offset - start


class Location(NamedTuple):
    log_id: int
    offset: int
    size: int


class EntryLogger:
    """The entry log files of one ledger directory.

    Writes (``append``, ``sync``, ``remove``) come from one thread at a time (the store holds
    its I/O lock); ``read`` may run concurrently from another thread (separate read fds).
    """

    def __init__(self, directory: str, file_bytes_max: int, min_log_id: int = 0, *,
                 drop_page_cache: bool = False) -> None:
        """``drop_page_cache``: once a log's bytes are synced, drop them from the page cache
        (reads of them then come from the disk)."""
        if file_bytes_max <= LOG_HEADER_BYTES or file_bytes_max >= 1 << LOG_OFFSET_BITS:
            raise InvariantViolation(f"entry log size limit out of range: {file_bytes_max}")
        self.directory = directory
        self.file_bytes_max = file_bytes_max
        os.makedirs(directory, exist_ok=True)
        self._sizes: dict[int, int] = {}
        for name in os.listdir(directory):
            m = _LOG_NAME.match(name)
            if m:
                self._sizes[int(m.group(1))] = os.path.getsize(os.path.join(directory, name))
        self._read_fds: dict[int, int] = {}
        self._write_fd = -1
        self._dirty: set[int] = set()
        self.drop_page_cache = drop_page_cache
        self._dropped = 0                  # the current log's bytes below this were dropped
        self.current_id = max(max(self._sizes, default=0), min_log_id)   # ids never reused
        self._new_log()

    # --- writing -------------------------------------------------------------------------
    def _new_log(self) -> None:
        if self._write_fd >= 0:
            os.fsync(self._write_fd)
            self._dirty.discard(self.current_id)
            self._drop_synced()
            os.close(self._write_fd)
        self.current_id += 1
        if self.current_id >= 1 << (64 - LOG_OFFSET_BITS):
            raise InvariantViolation("entry log ids exhausted")
        path = log_path(self.directory, self.current_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        pwrite_all(fd, LOG_HEADER.pack(LOG_MAGIC, LOG_VERSION, self.current_id), 0)
        os.fsync(fd)
        fsync_dir(self.directory)
        self._write_fd = fd
        self._dropped = 0
        self._sizes[self.current_id] = LOG_HEADER_BYTES
        log.info("entry log created log_id=%d", self.current_id)

    def append(self, records: Iterable[Sequence[bytes | memoryview]]) -> list[Location]:
        """Append records (each given as its pieces) to the current log, rolling as needed.
        Not durable until :meth:`sync`."""
        locations: list[Location] = []
        parts: list[bytes | memoryview] = []
        offset = self._sizes[self.current_id]
        start = offset
        for pieces in records:
            size = sum(map(len, pieces))
            if offset + size > self.file_bytes_max and offset > LOG_HEADER_BYTES:
                self._write(parts, start)
                parts = []
                self._new_log()
                offset = start = LOG_HEADER_BYTES
            locations.append(Location(self.current_id, offset, size))
            parts.extend(pieces)
            offset += size
            if offset - start >= _WRITE_CHUNK_BYTES:
                self._write(parts, start)
                parts = []
                start = offset
        self._write(parts, start)
        return locations

    def _write(self, parts: list[bytes | memoryview], offset: int) -> None:
        if not parts:
            return
        self._sizes[self.current_id] = offset + pwritev_all(self._write_fd, parts, offset)
        self._dirty.add(self.current_id)

    def sync(self) -> None:
        """fsync everything appended so far (rolled logs are synced when they roll)."""
        if self.current_id in self._dirty:
            os.fdatasync(self._write_fd)
            self._dirty.discard(self.current_id)
            self._drop_synced()

    def _drop_synced(self) -> None:
        """With ``drop_page_cache``: drop the current log's synced bytes from the page cache."""
        if self.drop_page_cache:
            self._dropped = drop_clean_pages(self._write_fd, self._dropped, self._sizes[self.current_id])

    # --- reading -------------------------------------------------------------------------
    def _read_fd(self, log_id: int) -> int:
        fd = self._read_fds.get(log_id)
        if fd is None:
            fd = os.open(log_path(self.directory, log_id), os.O_RDONLY)
            self._read_fds[log_id] = fd
        return fd

    def read_raw(self, log_id: int, offset: int, size: int) -> bytes:
        try:
            data = os.pread(self._read_fd(log_id), size, offset)
        except FileNotFoundError:
            raise ChecksumError(f"entry log {log_path(self.directory, log_id)} is missing") from None
        return data

    def read(self, ledger_id: int, entry_id: int, log_id: int, offset: int, size: int) -> StoredEntry:
        """Read and verify one entry; ChecksumError names ledger, entry and file."""
        data = self.read_raw(log_id, offset, size)
        return self.decode(data, 0, ledger_id, entry_id, log_id, offset, size)

    def decode(self, data: bytes, pos: int, ledger_id: int, entry_id: int, log_id: int,
               offset: int, size: int) -> StoredEntry:
        parsed = parse_record(data, pos, min(len(data), pos + size))
        if isinstance(parsed, str) or parsed[1] != pos + size:
            why = parsed if isinstance(parsed, str) else "record size differs from the index"
            raise ChecksumError(
                f"corrupt entry ledger={ledger_id} entry={entry_id} "
                f"file={log_path(self.directory, log_id)} offset={offset}: {why}")
        rec = parsed[0]
        if rec.kind != ADD or rec.ledger_id != ledger_id or rec.entry_id != entry_id:
            raise ChecksumError(
                f"entry log record mismatch ledger={ledger_id} entry={entry_id} "
                f"file={log_path(self.directory, log_id)} offset={offset}: found "
                f"{KIND_NAMES.get(rec.kind)} ledger={rec.ledger_id} entry={rec.entry_id}")
        return record_to_entry(rec)

    # --- bookkeeping ---------------------------------------------------------------------
    def file_sizes(self) -> dict[int, int]:
        return dict(self._sizes)

    def remove(self, log_ids: Iterable[int]) -> int:
        """Delete whole log files (never the current one); returns the bytes freed."""
        freed = 0
        for log_id in log_ids:
            if log_id == self.current_id:
                raise InvariantViolation(f"cannot remove the current entry log {log_id}")
            fd = self._read_fds.pop(log_id, None)
            if fd is not None:
                os.close(fd)
            freed += self._sizes.pop(log_id, 0)
            try:
                os.unlink(log_path(self.directory, log_id))
            except FileNotFoundError:
                pass
            log.info("entry log removed log_id=%d", log_id)
        return freed

    def close(self) -> None:
        if self._write_fd >= 0:
            self.sync()
            os.close(self._write_fd)
            self._write_fd = -1
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

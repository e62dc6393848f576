"""[perf] Streaming offload (issue 29): the broker's offloader reads a closed ledger by windows
from the bookies into a bounded pipe (offload/pipe.py), a pool thread encodes row groups from it
and writes them to the object as it goes (``ObjectStore.open_writer``: S3 multipart, file://
temp file renamed at commit). Memory is bounded whatever the ledger's size; a failure anywhere
aborts the object (nothing under its key, no multipart upload left, no temp file); the objects
are byte for byte those the in-memory encoder made."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

import broker.offloader as offloader_module
import offload.tier as tier_module
from broker.config import OffloadConfig
from broker.offloader import TopicOffloader
from offload.core import ObjectStats
from offload.pipe import EntryPipe, PipeStoppedError
from offload.reader import encode_ledger
from offload.shell import OffloadError
import offload.store as store_module
from offload.store import FILE_SYNC_BYTES, FileObjectStore, ObjectStoreError, S3ObjectStore, S3Settings
from offload.tier import Tier, encode_and_upload, verify_object
from pulsarlite.errors import BookieUnavailableError
from pulsarlite.wire.entry import Message, build_entry

KEY = "public/default/t/ledger-7-0123456789abcdef.parquet"
MiB = 1024 * 1024


def random_entries(n: int, size: int) -> list[tuple[int, bytes]]:
    """Incompressible messages: the object's bytes follow the entries' bytes."""
    return [(i, build_entry(Message(os.urandom(size)), producer_name="p", sequence_id=i,
                            publish_time_ms=1_700_000_000_000 + i)) for i in range(n)]


def in_memory_object(ledger_id: int, entries, row_group_bytes: int) -> bytes:
    """What the encoder made before streaming (the object held whole, then put)."""
    return encode_ledger(ledger_id, entries, partition=-1, row_group_bytes=row_group_bytes,
                         metadata={"pulsarlite.ledger_id": str(ledger_id)}).data


# -- the encoder writes as it goes -----------------------------------------------------------------
def test_the_encoder_writes_row_groups_as_it_reads_and_the_object_is_unchanged(tmp_path, monkeypatch):
    """At every write to the object, the entries pulled from the source are at most a few row
    groups (and the writer thread's queue) ahead of the bytes written (before: the whole ledger
    was pulled, then one put); the object is byte for byte the in-memory encoder's."""
    monkeypatch.setattr(tier_module, "WRITE_QUEUE_BYTES", 10_000)
    entries = random_entries(300, 2_000)
    row_group_bytes = 20_000
    tier = Tier(f"file://{tmp_path}", None)
    pulled = [0]
    gaps: list[int] = []

    def source():
        for entry_id, entry in entries:
            pulled[0] += len(entry)
            yield entry_id, entry

    real_open = tier.store.open_writer

    def open_writer(key, **kwargs):
        w = real_open(key, **kwargs)
        real_write = w.write

        def write(data):
            real_write(data)
            gaps.append(pulled[0] - w.size_bytes)
        w.write = write
        return w
    tier.store.open_writer = open_writer

    stats = encode_and_upload(tier, KEY, 7, source(), partition=-1, row_group_bytes=row_group_bytes,
                              entries_expected=len(entries))
    total = sum(len(e) for _, e in entries)
    assert len(gaps) > 10 and max(gaps) < 3 * row_group_bytes + 10_000 + 2_100, (max(gaps), total)
    data = (tmp_path / KEY).read_bytes()
    assert data == in_memory_object(7, entries, row_group_bytes)
    verify_object(tier, KEY, stats, len(entries))
    assert stats.size_bytes == len(data) and stats.rows == 300


def test_fewer_entries_than_expected_commit_nothing(tmp_path):
    tier = Tier(f"file://{tmp_path}", None)
    with pytest.raises(OffloadError, match="9 entries encoded, 10 read"):
        encode_and_upload(tier, KEY, 7, iter(random_entries(9, 100)), partition=-1, row_group_bytes=1_000,
                          entries_expected=10)
    assert tier.store.head(KEY) is None and not tier.store.list_temp_files()


# -- the pipe ----------------------------------------------------------------------------------------
def test_the_pipe_holds_at_most_its_bound_and_the_reader_waits_for_the_encoder():
    got: list[int] = []
    release = threading.Event()

    async def main():
        pipe = EntryPipe(30_000)

        def consume():
            release.wait()
            for entry_id, _ in pipe:
                got.append(entry_id)
        consumer = asyncio.get_running_loop().run_in_executor(None, consume)
        puts = 0
        for b in range(20):
            put = asyncio.ensure_future(pipe.put([(b * 2 + i, b"x" * 5_000) for i in range(2)]))
            if b == 3:                      # 3 batches of 10 KB fill it: the 4th waits for the consumer
                await asyncio.sleep(0.05)
                assert not put.done() and pipe.bytes_held == 30_000
                release.set()
            await put
            puts += 1
        pipe.close()
        await consumer
        return pipe, puts

    pipe, puts = asyncio.run(main())
    assert got == list(range(40)) and puts == 20
    assert pipe.bytes_held_max <= 30_000


def test_either_side_of_the_pipe_stops_the_other():
    async def main():
        pipe = EntryPipe(1_000)
        await pipe.put([(0, b"a")])
        pipe.fail(BookieUnavailableError("bookies gone"))
        with pytest.raises(OffloadError, match="bookies gone"):
            await asyncio.get_running_loop().run_in_executor(None, lambda: list(pipe))
        pipe2 = EntryPipe(1_000)
        await pipe2.put([(0, b"a" * 1_000)])
        waiting = asyncio.ensure_future(pipe2.put([(1, b"b")]))
        await asyncio.sleep(0)
        pipe2.stop()                          # the encoder gave up: the reader's put fails
        with pytest.raises(PipeStoppedError):
            await waiting
    asyncio.run(main())


# -- object writers ------------------------------------------------------------------------------
def test_a_file_object_appears_only_at_commit_and_an_abort_leaves_nothing(tmp_path):
    store = FileObjectStore(tmp_path)
    w = store.open_writer("a/b.parquet")
    w.write(b"x" * 1000)
    assert store.head("a/b.parquet") is None and list(store.list()) == [] and len(store.list_temp_files()) == 1
    w.commit()
    assert store.get("a/b.parquet") == b"x" * 1000 and not store.list_temp_files()
    w2 = store.open_writer("a/c.parquet")
    w2.write(b"y")
    w2.abort()
    w2.abort()                                  # idempotent
    assert store.head("a/c.parquet") is None and not store.list_temp_files()


def test_a_file_object_is_synced_as_it_is_written_and_fsynced_at_commit(tmp_path, monkeypatch):
    """Every FILE_SYNC_BYTES written the writer flushes what it has (commit then has at most that
    much left to flush, not the whole object); commit still fsyncs the file and its directory."""
    synced: list[int] = []
    fsynced: list[int] = []
    real_fdatasync, real_fsync = os.fdatasync, os.fsync
    store = FileObjectStore(tmp_path)
    w = store.open_writer("t/big.parquet")
    monkeypatch.setattr(store_module.os, "fdatasync",
                        lambda fd: (synced.append(os.fstat(fd).st_size), real_fdatasync(fd))[1])
    monkeypatch.setattr(store_module.os, "fsync", lambda fd: (fsynced.append(fd), real_fsync(fd))[1])
    chunk = b"z" * (FILE_SYNC_BYTES // 4 + 1)
    for _ in range(9):
        w.write(chunk)
    assert synced == [4 * len(chunk), 8 * len(chunk)]        # each time FILE_SYNC_BYTES more were written
    assert w.synced_bytes == 8 * len(chunk) and fsynced == []
    w.commit()
    assert len(fsynced) == 2                                 # the file, then its directory
    assert store.get("t/big.parquet") == chunk * 9 and not store.list_temp_files()


def test_a_failed_sync_fails_the_write_and_abort_leaves_nothing(tmp_path, monkeypatch):
    store = FileObjectStore(tmp_path)
    w = store.open_writer("t/x.parquet")

    def failing(fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(store_module.os, "fdatasync", failing)
    with pytest.raises(ObjectStoreError, match="Input/output error"):
        w.write(b"q" * FILE_SYNC_BYTES)
    w.abort()
    assert store.head("t/x.parquet") is None and not store.list_temp_files()


class FakeS3:
    """The boto3 calls an S3 object writer makes; ``fail_part``: upload_part of that number fails."""

    def __init__(self, fail_part: int | None = None) -> None:
        self.calls: list[str] = []
        self.parts: dict[int, bytes] = {}
        self.objects: dict[str, bytes] = {}
        self.fail_part = fail_part

    def create_multipart_upload(self, **kw):
        self.calls.append("create")
        return {"UploadId": "u1"}

    def upload_part(self, *, PartNumber, Body, **kw):
        self.calls.append(f"part{PartNumber}")
        if PartNumber == self.fail_part:
            raise ConnectionError("connection reset")
        self.parts[PartNumber] = Body
        return {"ETag": f"e{PartNumber}"}

    def complete_multipart_upload(self, *, Key, MultipartUpload, **kw):
        self.calls.append("complete")
        assert [p["PartNumber"] for p in MultipartUpload["Parts"]] == sorted(self.parts)
        self.objects[Key] = b"".join(self.parts[n] for n in sorted(self.parts))

    def abort_multipart_upload(self, **kw):
        self.calls.append("abort")
        self.parts.clear()

    def put_object(self, *, Key, Body, **kw):
        self.calls.append("put")
        self.objects[Key] = Body


def s3_store(fake: FakeS3) -> S3ObjectStore:
    return S3ObjectStore("b", "tier", client=fake, settings=S3Settings(multipart_chunk_bytes=5 * MiB))


def test_s3_objects_of_one_part_are_one_put_bigger_ones_a_multipart_upload():
    fake = FakeS3()
    store = s3_store(fake)
    w = store.open_writer("small")
    w.write(b"s" * 1000)
    w.commit()
    assert fake.calls == ["put"] and fake.objects["tier/small"] == b"s" * 1000
    fake.calls.clear()
    w = store.open_writer("big")
    data = os.urandom(12 * MiB)
    for i in range(0, len(data), 1 << 20):
        w.write(data[i:i + (1 << 20)])
    assert fake.calls == ["create", "part1", "part2"]        # one part held at a time
    w.commit()
    assert fake.calls[-2:] == ["part3", "complete"] and fake.objects["tier/big"] == data
    assert [len(fake.parts[n]) for n in (1, 2, 3)] == [5 * MiB, 5 * MiB, 2 * MiB]


def test_a_failed_part_aborts_the_multipart_upload_and_records_nothing():
    fake = FakeS3(fail_part=2)
    tier = Tier("file:///unused", None)
    tier.store = s3_store(fake)
    entries = random_entries(120, 100_000)        # ~12 MB: 3 parts of 5 MiB
    with pytest.raises(ObjectStoreError, match="connection reset"):
        encode_and_upload(tier, KEY, 7, iter(entries), partition=-1, row_group_bytes=1 * MiB,
                          entries_expected=len(entries))
    assert fake.calls == ["create", "part1", "part2", "abort"] and not fake.objects


# -- the broker's write step (TopicOffloader.write_step over fakes) --------------------------------
class FakeReader:
    """A closed ledger's reader whose replies hold at most ``reply_bytes`` (as a bookie's
    ``read_bytes_max``); ``fail_at_read``: that read fails."""

    def __init__(self, entries, fail_at_read: int | None, reply_bytes: int = 16_000) -> None:
        self.entries = entries
        self.last_readable_entry_id = len(entries) - 1
        self.reads: list[tuple[int, int]] = []
        self.fail_at_read = fail_at_read
        self.reply_bytes = reply_bytes

    async def read_some(self, first: int, last: int):
        if len(self.reads) + 1 == self.fail_at_read:
            self.reads.append((first, first))
            raise BookieUnavailableError("no bookie answers")
        end, size = first, 0
        while end <= last and (end == first or size + len(self.entries[end][1]) <= self.reply_bytes):
            size += len(self.entries[end][1])
            end += 1
        self.reads.append((first, end - 1))
        return [SimpleNamespace(entry_id=i, payload=self.entries[i][1]) for i in range(first, end)]


def offloader(tier: Tier, reader: FakeReader, pool: ThreadPoolExecutor, *, read_ahead: int,
              row_group_bytes: int) -> TopicOffloader:
    async def open_ledger(ledger_id, *, recovery):
        return reader

    async def run(fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(pool, lambda: fn(*args, **kwargs))

    t = TopicOffloader.__new__(TopicOffloader)
    t.broker = SimpleNamespace(
        tier=tier, slots=asyncio.Semaphore(1), run=run, typed_counters={}, offloaded_bytes=0,
        ledger_client=SimpleNamespace(open_ledger=open_ledger),
        config=SimpleNamespace(message_bytes_max=5 * MiB, offload=OffloadConfig(
            read_ahead_bytes=read_ahead, row_group_bytes=row_group_bytes, typed_columns=False)))
    t.ml_name, t.partition = "public/default/persistent/t", -1
    return t


def info_of(entries) -> SimpleNamespace:
    return SimpleNamespace(ledger_id=7, entries=len(entries), size_bytes=sum(len(e) for _, e in entries))


def test_the_write_step_reads_reply_by_reply_through_a_bounded_pipe(tmp_path, monkeypatch):
    entries = random_entries(200, 2_000)
    tier = Tier(f"file://{tmp_path}", None)
    reader = FakeReader(entries, None)
    pipes: list[EntryPipe] = []

    class Recorded(EntryPipe):
        def __init__(self, bytes_max):
            super().__init__(bytes_max)
            pipes.append(self)
    monkeypatch.setattr(offloader_module, "EntryPipe", Recorded)

    async def main():
        with ThreadPoolExecutor(2) as pool:
            return await offloader(tier, reader, pool, read_ahead=32_000, row_group_bytes=20_000).write_step(
                info_of(entries), tier.uri_of(KEY))
    stats = asyncio.run(main())
    assert isinstance(stats, ObjectStats) and stats.rows == 200
    assert len(reader.reads) >= 20 and all(b - a + 1 <= 8 for a, b in reader.reads)    # 16 KB replies
    assert [a for a, _ in reader.reads] == [0] + [b + 1 for _, b in reader.reads[:-1]] and reader.reads[-1][1] == 199
    (pipe,) = pipes
    assert pipe.bytes_max == 32_000 and 0 < pipe.bytes_held_max <= 32_000
    assert (tmp_path / KEY).read_bytes() == in_memory_object(7, entries, 20_000)
    verify_object(tier, KEY, stats, 200)


def test_a_bookie_failure_mid_ledger_leaves_no_object_and_no_temp_file(tmp_path):
    entries = random_entries(200, 2_000)
    tier = Tier(f"file://{tmp_path}", None)
    reader = FakeReader(entries, fail_at_read=5)

    async def main():
        with ThreadPoolExecutor(2) as pool:
            await offloader(tier, reader, pool, read_ahead=32_000, row_group_bytes=20_000).write_step(
                info_of(entries), tier.uri_of(KEY))
    with pytest.raises(BookieUnavailableError):
        asyncio.run(main())
    assert tier.store.head(KEY) is None and not tier.store.list_temp_files() and len(reader.reads) == 5


def test_an_upload_failure_stops_the_reads_and_aborts_the_multipart_upload(tmp_path, monkeypatch):
    monkeypatch.setattr(tier_module, "WRITE_QUEUE_BYTES", 1 * MiB)
    entries = random_entries(300, 100_000)        # 30 MB, parts of 5 MiB: part 2 fails (~10 MB in)
    fake = FakeS3(fail_part=2)
    tier = Tier(f"file://{tmp_path}", None)
    tier.store = s3_store(fake)
    reader = FakeReader(entries, None, reply_bytes=1 * MiB)

    async def main():
        with ThreadPoolExecutor(2) as pool:
            await offloader(tier, reader, pool, read_ahead=2 * MiB, row_group_bytes=1 * MiB).write_step(
                info_of(entries), f"{tier.uri}/{KEY}")
    with pytest.raises(ObjectStoreError, match="connection reset"):
        asyncio.run(main())
    assert fake.calls[-1] == "abort" and "complete" not in fake.calls and not fake.objects
    # the reads stopped with the encoder: ~10 MB in, plus the pipe (2 MiB), the writer's queue
    # (1 MiB) and a table or two of the encoder's, far from the ledger's 30 MB
    assert reader.reads[-1][1] < 200


def test_the_background_writer_bounds_its_queue_and_reports_the_inner_error(tmp_path):
    from offload.store import BackgroundObjectWriter
    store = FileObjectStore(tmp_path)
    w = BackgroundObjectWriter(store.open_writer("a"), bytes_max=3_000)
    for i in range(50):
        w.write(bytes([i]) * 1_000)
        assert w.bytes_queued <= 3_000
    w.commit()
    assert store.get("a") == b"".join(bytes([i]) * 1_000 for i in range(50))

    fake = FakeS3(fail_part=1)
    w = BackgroundObjectWriter(s3_store(fake).open_writer("b"), bytes_max=6 * MiB)
    with pytest.raises(ObjectStoreError, match="connection reset"):
        for _ in range(20):
            w.write(b"z" * MiB)         # part 1 fails in the thread: a later write raises it
        w.commit()
    w.abort()
    assert fake.calls == ["create", "part1", "abort"] and not fake.objects


def test_typed_columns_that_fail_mid_stream_abort_the_object_for_a_read_without_them(tmp_path, monkeypatch):
    """A list is encoded again without typed columns (as before); a stream cannot be read again
    here: TypedColumnsFailedError, nothing under the key (the broker reads the ledger again)."""
    from offload.tier import TableTypedColumns, TypedColumnsFailedError
    from tests.unit.test_offload_typed_columns import VERSIONS, ledger_entries

    def broken(self, table):
        raise RuntimeError("a bug in the typed columns")
    monkeypatch.setattr(TableTypedColumns, "arrays", broken)
    tier = Tier(f"file://{tmp_path}", None)
    entries = ledger_entries()
    with pytest.raises(TypedColumnsFailedError):
        encode_and_upload(tier, KEY, 7, iter(entries), partition=-1, row_group_bytes=600, typed_versions=VERSIONS,
                          entries_expected=len(entries))
    assert tier.store.head(KEY) is None and not tier.store.list_temp_files()
    stats = encode_and_upload(tier, KEY, 7, entries, partition=-1, row_group_bytes=600, typed_versions=VERSIONS)
    assert stats.rows > 0 and (tmp_path / KEY).read_bytes() == in_memory_object(7, entries, 600)


def test_the_write_step_reads_the_ledger_again_without_typed_columns_when_they_fail(tmp_path, monkeypatch):
    from offload.tier import TableTypedColumns
    from tests.unit.test_offload_typed_columns import VERSIONS, ledger_entries

    def broken(self, table):
        raise RuntimeError("a bug in the typed columns")
    monkeypatch.setattr(TableTypedColumns, "arrays", broken)
    entries = ledger_entries()
    tier = Tier(f"file://{tmp_path}", None)
    reader = FakeReader(entries, None, reply_bytes=200)

    async def main():
        with ThreadPoolExecutor(2) as pool:
            t = offloader(tier, reader, pool, read_ahead=1_000, row_group_bytes=600)

            async def typed_versions(ledger_id):
                return VERSIONS
            t._typed_versions = typed_versions
            return await t.write_step(info_of(entries), tier.uri_of(KEY))
    stats = asyncio.run(main())
    assert [a for a, _ in reader.reads].count(0) == 2             # read twice from the first entry
    assert (tmp_path / KEY).read_bytes() == in_memory_object(7, entries, 600)     # raw columns
    verify_object(tier, KEY, stats, len(entries))

"""offload/store.py against a real S3 endpoint (moto's server) and a directory, including an
endpoint that answers errors."""

from __future__ import annotations

import http.client
import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from offload.store import (FileObjectStore, ObjectNotFoundError, ObjectStoreError, S3Settings,
                           crc32c_hex, open_input_file, open_object_store, open_object_uri)


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    if request.param == "file":
        return open_object_store((tmp_path / "tier").as_uri())
    s3 = request.getfixturevalue("s3_server")
    return open_object_store(s3.tier_uri(), s3_endpoint_url=s3.endpoint_url)


def test_put_get_head_list_delete(store):
    data = bytes(range(256)) * 100
    info = store.put("a/b/ledger-1.parquet", data, metadata={"crc32c": crc32c_hex(data)})
    assert info.size_bytes == len(data)
    store.put("a/c/other", b"x")
    store.put("z", b"")
    assert store.get("a/b/ledger-1.parquet") == data
    assert store.get_range("a/b/ledger-1.parquet", 10, 300) == data[10:310]
    head = store.head("a/b/ledger-1.parquet")
    assert head.size_bytes == len(data)
    assert head.modified_ms is not None and abs(head.modified_ms / 1000 - time.time()) < 3600
    assert all(i.modified_ms is not None for i in store.list())
    if store.uri.startswith("s3://"):
        assert head.metadata.get("crc32c") == crc32c_hex(data)
    assert store.head("a/b/missing") is None
    assert [i.key for i in store.list()] == ["a/b/ledger-1.parquet", "a/c/other", "z"]
    assert [i.key for i in store.list("a/b/")] == ["a/b/ledger-1.parquet"]
    assert store.get("z") == b""
    store.delete("a/b/ledger-1.parquet")
    store.delete("a/b/ledger-1.parquet")        # idempotent
    assert store.head("a/b/ledger-1.parquet") is None
    with pytest.raises(ObjectNotFoundError):
        store.get("a/b/ledger-1.parquet")
    with pytest.raises(ObjectNotFoundError):
        store.get_range("a/b/ledger-1.parquet", 0, 1)
    assert [i.key for i in store.list()] == ["a/c/other", "z"]
    assert store.object_uri("a/c/other") == store.uri.rstrip("/") + "/a/c/other"


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "a/", "./a", "a/.tmp-x"])
def test_bad_keys_are_refused(store, key):
    with pytest.raises(ObjectStoreError) as e:
        store.put(key, b"x")
    assert not e.value.retriable
    assert list(store.list()) == []


def test_pyarrow_reads_parquet_through_the_store(store):
    table = pa.table({"a": list(range(10_000)), "b": [b"v" * 50] * 10_000})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=1000)
    store.put("t/x.parquet", buf.getvalue())
    with store.open_input_file("t/x.parquet") as f:
        assert pq.read_table(f).equals(table)
    # by full URI, as metadata records it
    uri = store.object_uri("t/x.parquet")
    endpoint = getattr(store, "endpoint_url", None)
    with open_input_file(uri, s3_endpoint_url=endpoint) as f:
        pf = pq.ParquetFile(f)
        assert pf.read_row_group(3).column("a").to_pylist() == list(range(3000, 4000))
    s, key = open_object_uri(uri, s3_endpoint_url=endpoint)
    assert s.get(key) == buf.getvalue()


def test_file_store_put_is_atomic_and_leaves_no_temp_files(tmp_path):
    store = FileObjectStore(tmp_path / "t")
    for i in range(5):
        store.put("x/obj", bytes([i]) * 1000)
    assert store.get("x/obj") == bytes([4]) * 1000
    assert store.list_temp_files() == []
    assert [p.name for p in (tmp_path / "t" / "x").iterdir()] == ["obj"]
    # a missing directory is not created by readers opening an object URI
    s, key = open_object_uri((tmp_path / "nowhere" / "x.parquet").as_uri())
    assert not (tmp_path / "nowhere").exists()
    with pytest.raises(ObjectNotFoundError):
        s.get(key)


def test_bad_uris_are_refused():
    for uri in ["", "http://x/y", "s3://", "file://host/dir", "file:relative"]:
        with pytest.raises(ObjectStoreError) as e:
            open_object_store(uri)
        assert not e.value.retriable


def test_multipart_upload_for_big_objects(s3_server):
    settings = S3Settings(multipart_threshold_bytes=5 * 1024 * 1024,
                          multipart_chunk_bytes=5 * 1024 * 1024)
    store = open_object_store(s3_server.tier_uri(), s3_endpoint_url=s3_server.endpoint_url,
                              settings=settings)
    data = bytes(range(256)) * (12 * 4096)      # 12 MiB: three parts
    store.put("big", data, metadata={"crc32c": crc32c_hex(data)})
    head = store.head("big")
    assert head.size_bytes == len(data) and head.metadata["crc32c"] == crc32c_hex(data)
    assert store.get_range("big", 6 * 1024 * 1024 - 3, 10) == data[6 * 1024 * 1024 - 3:][:10]
    assert crc32c_hex(store.get("big")) == crc32c_hex(data)


def test_objects_written_in_pieces(store):
    """``open_writer``: nothing under the key before commit; on S3 an object over one part is a
    multipart upload (moto's), under one part a PUT; an aborted one leaves nothing."""
    if hasattr(store, "settings"):
        store = open_object_store(store.uri, s3_endpoint_url=store.endpoint_url,
                                  settings=S3Settings(multipart_chunk_bytes=5 * 1024 * 1024))
    data = bytes(range(256)) * (12 * 4096)      # 12 MiB: three parts on S3
    w = store.open_writer("w/big")
    for i in range(0, len(data), 1_000_000):
        w.write(data[i:i + 1_000_000])
    assert store.head("w/big") is None
    assert w.commit().size_bytes == len(data)
    assert store.head("w/big").size_bytes == len(data) and crc32c_hex(store.get("w/big")) == crc32c_hex(data)
    w = store.open_writer("w/small")
    w.write(b"small")
    w.commit()
    assert store.get("w/small") == b"small"
    w = store.open_writer("w/gone")
    w.write(data)
    w.abort()
    assert store.head("w/gone") is None and [i.key for i in store.list("w/")] == ["w/big", "w/small"]
    if hasattr(store, "_client"):
        uploads = store._client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
        assert not uploads, uploads               # the aborted upload is gone


def test_endpoint_from_environment(s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    store = open_object_store(s3_server.tier_uri())
    store.put("k", b"v")
    assert store.get("k") == b"v"


def test_missing_bucket_is_a_clear_error(s3_server):
    store = open_object_store("s3://no-such-bucket-here/p", s3_endpoint_url=s3_server.endpoint_url)
    for call in (lambda: store.put("k", b"v"), lambda: store.get("k"),
                 lambda: store.head("k"), lambda: list(store.list())):
        with pytest.raises(ObjectStoreError) as e:
            call()
        assert not e.value.retriable
        assert "no-such-bucket-here" in str(e.value)


# -- an endpoint that fails ---------------------------------------------------------------------

class FlakyProxy:
    """An HTTP proxy to the S3 endpoint that answers ``503 SlowDown`` to the first
    ``failures`` requests (all of them when failures < 0), then forwards."""

    def __init__(self, target_port: int, failures: int) -> None:
        self.failures = failures
        self.requests = 0
        self.refused = 0
        self.log: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy.lock:
                    proxy.requests += 1
                    proxy.log.append((self.command, self.path))
                    fail = proxy.failures < 0 or proxy.refused < proxy.failures
                    if fail:
                        proxy.refused += 1
                if fail:
                    payload = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown'
                               b'</Code><Message>Please reduce your request rate.</Message>'
                               b'</Error>')
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", target_port, timeout=30)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("connection",)}
                conn.request(self.command, self.path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                self.send_response(response.status)
                for k, v in response.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", response.getheader("Content-Length", "0")
                                 if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass          # clients closing kept-alive connections: not a test failure

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def flaky_proxy(s3_server):
    proxies = []

    def make(failures: int) -> FlakyProxy:
        port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
        proxies.append(FlakyProxy(port, failures))
        return proxies[-1]

    yield make
    for p in proxies:
        p.close()


def test_transient_errors_are_retried(s3_server, flaky_proxy):
    proxy = flaky_proxy(failures=3)
    store = open_object_store(s3_server.tier_uri(), s3_endpoint_url=proxy.url,
                              settings=S3Settings(attempts_max=6))
    store.put("obj", b"payload")
    assert proxy.refused == 3
    assert store.get("obj") == b"payload"
    proxy.failures = proxy.refused + 2
    assert store.get_range("obj", 3, 4) == b"load"
    assert proxy.refused == 5


def test_persistent_errors_give_up_after_bounded_attempts(s3_server, flaky_proxy):
    proxy = flaky_proxy(failures=-1)
    store = open_object_store(s3_server.tier_uri(), s3_endpoint_url=proxy.url,
                              settings=S3Settings(attempts_max=3))
    with pytest.raises(ObjectStoreError) as e:
        store.put("obj", b"payload")
    assert e.value.retriable
    assert proxy.requests == 3, proxy.log
    # nothing was written
    direct = open_object_store(store.uri, s3_endpoint_url=s3_server.endpoint_url)
    assert direct.head("obj") is None


# -- the tier object through S3 -----------------------------------------------------------------

def test_ledger_object_round_trip_through_s3(s3_server, flaky_proxy):
    import random

    from offload.reader import TierReader, verify_object, write_ledger_object
    from tests.unit.test_offload_format import assert_same_entries, make_entries

    entries = make_entries(random.Random(21), 800)
    store = open_object_store(s3_server.tier_uri(), s3_endpoint_url=s3_server.endpoint_url)
    key = "t/ns/topic/ledger-9-00000000000000aa.parquet"
    w = write_ledger_object(store, key, 9, entries, partition=-1, row_group_bytes=30_000)
    assert w.uri == f"{store.uri}/{key}"
    assert store.head(key).metadata["crc32c"] == w.stats.checksum
    verify_object(store, key, w.stats)
    reader = TierReader(w.uri, s3_endpoint_url=s3_server.endpoint_url,
                        size_bytes=w.stats.size_bytes, checksum=w.stats.checksum,
                        rows=w.stats.rows, part_bytes=16_384)
    assert reader.num_row_groups > 4
    assert_same_entries(entries[250:600], list(reader.read_entries(250, 599)))
    assert_same_entries(entries, list(reader.read_entries()))
    # and through an endpoint that throttles now and then
    proxy = flaky_proxy(failures=4)
    flaky = TierReader(w.uri, s3_endpoint_url=proxy.url, checksum=w.stats.checksum)
    assert_same_entries(entries[:300], list(flaky.read_entries(0, 299)))
    assert proxy.refused == 4
    # Spark-style: pyarrow on the object by URI
    from offload.format import read_parquet
    from offload.store import open_input_file
    with open_input_file(w.uri, s3_endpoint_url=s3_server.endpoint_url) as f:
        assert read_parquet(f).num_rows == w.stats.rows


# -- the offload state machine on a real store, with crashes ------------------------------------

class _Crash(BaseException):
    pass


class _Durable:
    """What survives a crash: the recorded offload metadata and the bookie copy (the object
    store is moto's server itself)."""

    def __init__(self, entries) -> None:
        from offload.core import OffloadRecord
        self.record = OffloadRecord()
        self.entries = entries
        self.bookies = True

    def cas_record(self, ledger_id, expected, new):
        if self.record == expected:
            self.record = new
        return self.record

    def read_entries(self, ledger_id):
        assert self.bookies, "reading a ledger that left the bookies"
        return iter(self.entries)

    def delete_from_bookies(self, ledger_id):
        assert self.record.state.value == "offloaded"
        self.bookies = False

    def partition(self, ledger_id):
        return -1


@pytest.mark.parametrize("seed", range(4))
def test_offload_machine_with_crashes_against_s3(s3_server, seed):
    import random

    from offload.core import LedgerOffload, OffloadState
    from tests.offload_executor import LedgerOffloadExecutor
    from offload.reader import TierReader
    from tests.unit.test_offload_format import assert_same_entries, make_entries

    rng = random.Random(seed)
    entries = make_entries(rng, 150)
    tier = s3_server.tier_uri()
    durable = _Durable(entries)
    listing = open_object_store(tier, s3_endpoint_url=s3_server.endpoint_url)

    class CrashingExecutor(LedgerOffloadExecutor):
        async def execute(self, action):
            if rng.random() < 0.25:
                raise _Crash()
            event = await super().execute(action)
            if rng.random() < 0.25:
                raise _Crash()
            return event

    def fresh():
        machine = LedgerOffload(5, durable.record, tier_uri=tier, tenant="t", namespace="ns",
                                topic="topic", deletion_lag_ms=0)
        return CrashingExecutor(machine, durable, s3_endpoint_url=s3_server.endpoint_url,
                                row_group_bytes=20_000)

    ex = fresh()
    now = 0
    crashes = 0
    for _ in range(400):
        if ex.machine.done:
            break
        now += 10
        try:
            if durable.record.state in (OffloadState.NONE, OffloadState.OFFLOADING):
                ex.offload(now, f"{rng.getrandbits(64):016x}")
            else:
                ex.tick(now)
        except _Crash:
            crashes += 1
            ex = fresh()
        # no orphan at any time: what the bucket holds is what the record names
        keys = {listing.object_uri(i.key) for i in listing.list()}
        assert keys <= ({durable.record.uri} if durable.record.uri else set())
        if not durable.bookies:
            assert durable.record.uri in keys
    assert ex.machine.done and crashes > 0
    assert durable.record.state is OffloadState.BOOKIE_DELETED and not durable.bookies
    assert [listing.object_uri(i.key) for i in listing.list()] == [durable.record.uri]
    stats = durable.record.stats
    reader = TierReader(durable.record.uri, s3_endpoint_url=s3_server.endpoint_url,
                        size_bytes=stats.size_bytes, checksum=stats.checksum, rows=stats.rows)
    assert_same_entries(entries, list(reader.read_entries()))
    # the ledger is deleted (retention / topic deletion): its object goes
    for _ in range(100):
        try:
            if fresh().remove()[-1].removed:
                break
        except _Crash:
            pass
    assert list(listing.list()) == []


def test_sweep_orphans_on_s3(s3_server):
    from offload.core import OffloadRecord, OffloadState, object_key
    from offload.shell import sweep_orphans
    store = open_object_store(s3_server.tier_uri(), s3_endpoint_url=s3_server.endpoint_url)
    named = object_key("t", "ns", "topic", 1, "aa" * 8)
    orphan = object_key("t", "ns", "topic", 2, "bb" * 8)
    for key in (named, orphan):
        store.put(key, b"x")
    records = [OffloadRecord(OffloadState.OFFLOADING, store.object_uri(named), "aa" * 8)]
    now_ms = int(time.time() * 1000)
    # within the grace period nothing goes (an attempt's CAS may be in flight)
    assert sweep_orphans(store, "t/ns/topic/", records, now_ms=now_ms, grace_ms=600_000) == []
    gone = sweep_orphans(store, "t/ns/topic/", records, now_ms=now_ms + 700_000,
                         grace_ms=600_000)
    assert gone == [store.object_uri(orphan)]
    assert [i.key for i in store.list()] == [named]

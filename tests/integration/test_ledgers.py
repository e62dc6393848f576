"""Ledgers on real bookie processes and a real ZooKeeper: durability under kill -9, ensemble
change, fencing, bad input, cookies, read-only mode, and the operator shell."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys

import pytest

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.bookie_client import parse_bookie_address
from bookie.client.ledger_client import LedgerClient
from bookie.client.metadata import LedgerState
from bookie.transport import HEADER, MESSAGE_TYPES, encode_frame, encode_message
from pulsarlite.checksum import entry_checksum
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import LedgerFencedError, NoSuchEntryError, NotEnoughBookiesError

pytestmark = pytest.mark.integration


def payload_for(i: int) -> bytes:
    return f"entry-{i:06d}-".encode() + bytes([i % 251]) * (i % 97)


async def start_cluster(cluster_factory, bookies: int, **kwargs):
    return await asyncio.to_thread(cluster_factory, bookies, **kwargs)


async def connect(cluster, **overrides) -> LedgerClient:
    config = LedgerClientConfig(zookeeper=cluster.zookeeper, **overrides)
    return await LedgerClient.connect(config)


def name_of(cluster, bookie_id: str) -> str:
    return next(n for n in cluster.bookie_names if cluster.records[n].bookie_id == bookie_id)


# request message class -> (request frame type, response frame type)
FRAME_TYPES = {
    pb.AddRequest: (pb.FRAME_ADD_REQUEST, pb.FRAME_ADD_RESPONSE),
    pb.ReadRequest: (pb.FRAME_READ_REQUEST, pb.FRAME_READ_RESPONSE),
    pb.ReadLacRequest: (pb.FRAME_READ_LAC_REQUEST, pb.FRAME_READ_LAC_RESPONSE),
    pb.DeleteLedgerRequest: (pb.FRAME_DELETE_LEDGER_REQUEST, pb.FRAME_DELETE_LEDGER_RESPONSE),
    pb.BookieInfoRequest: (pb.FRAME_BOOKIE_INFO_REQUEST, pb.FRAME_BOOKIE_INFO_RESPONSE),
}


class RawBookieConnection:
    """A bare connection speaking the bookie protocol one frame at a time (tests only: it can
    send what a real client never would)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._next_id = 1

    @classmethod
    async def open(cls, bookie_id: str) -> "RawBookieConnection":
        return cls(*await asyncio.open_connection(*parse_bookie_address(bookie_id)))

    async def __aenter__(self) -> "RawBookieConnection":
        return self

    async def __aexit__(self, *exc) -> None:
        self.writer.close()

    async def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)
        try:
            await self.writer.drain()
        except ConnectionError:  # the bookie may close before taking all of it
            pass

    async def read_frame(self, timeout_s: float = 10.0):
        """(frame_type, request_id, message), or None at end of stream."""
        try:
            header = await asyncio.wait_for(self.reader.readexactly(HEADER.size), timeout_s)
        except asyncio.IncompleteReadError as e:
            assert not e.partial, f"stream ended inside a frame header: {e.partial!r}"
            return None
        frame_bytes, frame_type, request_id = HEADER.unpack(header)
        body = await asyncio.wait_for(self.reader.readexactly(frame_bytes - 9), timeout_s)
        return frame_type, request_id, MESSAGE_TYPES[frame_type].FromString(body)

    async def call(self, request):
        """Send one request, return its response message (checks the type and request id)."""
        request_type, response_type = FRAME_TYPES[type(request)]
        request_id, self._next_id = self._next_id, self._next_id + 1
        await self.send_bytes(encode_message(request_type, request_id, request))
        frame = await self.read_frame()
        assert frame is not None, "the bookie closed the connection"
        frame_type, got_id, message = frame
        assert (frame_type, got_id) == (response_type, request_id), (frame_type, got_id, message)
        return message

    async def expect_error_then_close(self, code: int, request_id: int | None = None) -> pb.ErrorResponse:
        frame = await self.read_frame()
        assert frame is not None and frame[0] == pb.FRAME_ERROR_RESPONSE, frame
        assert frame[2].code == code and frame[2].message, frame
        assert request_id is None or frame[1] == request_id, frame
        assert await self.read_frame() is None, "the bookie kept the connection open"
        return frame[2]


async def write_stream(writer, count: int, acked: dict, *, window: int = 200, on_progress=None):
    """Add ``count`` entries with ``window`` in flight; record what was acknowledged."""
    inflight: list[tuple[int, asyncio.Future]] = []
    for i in range(count):
        inflight.append((i, writer.add_async(payload_for(i))))
        if len(inflight) >= window:
            j, fut = inflight.pop(0)
            acked[await fut] = payload_for(j)
            if on_progress:
                await on_progress(len(acked))
    for j, fut in inflight:
        acked[await fut] = payload_for(j)


async def read_all(client: LedgerClient, ledger_id: int, *, recovery: bool):
    reader = await client.open_ledger(ledger_id, recovery=recovery)
    entries = await reader.read(0, reader.last_readable_entry_id) if reader.last_readable_entry_id >= 0 else []
    return reader, {e.entry_id: e.payload for e in entries}


async def test_write_close_read_back(cluster_factory):
    cluster = await start_cluster(cluster_factory, 3)
    client = await connect(cluster)
    try:
        writer = await client.create_ledger(3, 3, 2)
        acked: dict[int, bytes] = {}
        await write_stream(writer, 1500, acked)
        md = await writer.close()
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 1499
        assert md.length == sum(len(p) for p in acked.values())
        reader, got = await read_all(client, writer.ledger_id, recovery=False)
        assert got == acked
    finally:
        await client.close()


async def test_striped_ledger_e3_qw2(cluster_factory):
    cluster = await start_cluster(cluster_factory, 3)
    client = await connect(cluster)
    try:
        writer = await client.create_ledger(3, 2, 2)
        acked: dict[int, bytes] = {}
        await write_stream(writer, 300, acked)
        await writer.close()
        _, got = await read_all(client, writer.ledger_id, recovery=False)
        assert got == acked
    finally:
        await client.close()


async def test_kill_one_bookie_during_adds_changes_ensemble(cluster_factory):
    """4 bookies, E3/Qw3/Qa2: kill -9 one of the ensemble mid-stream; the writer replaces it,
    the caller sees no error, and every acknowledged entry is readable afterwards."""
    cluster = await start_cluster(cluster_factory, 4)
    client = await connect(cluster)
    try:
        writer = await client.create_ledger(3, 3, 2)
        victim = writer.metadata.current_ensemble[1]
        killed = False

        async def maybe_kill(n: int) -> None:
            nonlocal killed
            if n >= 1000 and not killed:
                killed = True
                await asyncio.to_thread(cluster.kill, name_of(cluster, victim))

        acked: dict[int, bytes] = {}
        await write_stream(writer, 4000, acked, on_progress=maybe_kill)
        md = await writer.close()
        assert killed and len(acked) == 4000
        assert len(md.ensembles) >= 2, md.ensembles
        assert victim in md.ensembles[0][1] and victim not in md.current_ensemble
        _, got = await read_all(client, writer.ledger_id, recovery=False)
        assert got == acked
    finally:
        await client.close()


async def test_kill_one_of_three_bookies_records_under_replication(cluster_factory):
    """3 bookies, E3/Qw3/Qa2: no replacement exists; writes go on with Qa acks and the ledger
    records the lost bookie as under-replicated."""
    cluster = await start_cluster(cluster_factory, 3)
    client = await connect(cluster)
    try:
        writer = await client.create_ledger(3, 3, 2)
        victim = writer.metadata.current_ensemble[0]
        killed = False

        async def maybe_kill(n: int) -> None:
            nonlocal killed
            if n >= 500 and not killed:
                killed = True
                await asyncio.to_thread(cluster.kill, name_of(cluster, victim))

        acked: dict[int, bytes] = {}
        await write_stream(writer, 2000, acked, on_progress=maybe_kill)
        md = await writer.close()
        assert len(acked) == 2000
        assert victim in md.under_replicated_bookies
        _, got = await read_all(client, writer.ledger_id, recovery=False)
        assert got == acked
    finally:
        await client.close()


async def test_kill_all_bookies_then_restart_keeps_acknowledged(cluster_factory):
    cluster = await start_cluster(cluster_factory, 3)
    client = await connect(cluster, add_timeout_ms=2_000, rpc_timeout_ms=2_000, read_timeout_ms=5_000)
    acked: dict[int, bytes] = {}
    try:
        writer = await client.create_ledger(3, 3, 2)
        ledger_id = writer.ledger_id
        futures = []
        for i in range(3000):
            fut = writer.add_async(payload_for(i))
            fut.add_done_callback(lambda f, i=i: None if f.exception() else acked.__setitem__(f.result(), payload_for(i)))
            futures.append(fut)
            if i == 1500:
                # some adds must be acknowledged before the bookies die, else the test proves
                # nothing: wait (bounded) for the first acknowledgements, adds still in flight
                for _ in range(600):
                    if acked:
                        break
                    await asyncio.sleep(0.05)
                for name in cluster.bookie_names:  # as close together as we can
                    await asyncio.to_thread(cluster.kill, name)
            if i % 100 == 0:
                await asyncio.sleep(0)
        await asyncio.gather(*futures, return_exceptions=True)
    finally:
        await client.close()
    assert acked, "nothing was acknowledged before the bookies died"
    for name in cluster.bookie_names:
        await asyncio.to_thread(cluster.restart, name)
    client = await connect(cluster)
    try:
        reader, got = await read_all(client, ledger_id, recovery=True)
        assert reader.metadata.state is LedgerState.CLOSED
        for entry_id, payload in acked.items():
            assert got.get(entry_id) == payload, f"acknowledged entry {entry_id} lost"
        assert reader.metadata.last_entry_id >= max(acked)
    finally:
        await client.close()


async def test_second_writer_recovery_fences_the_first(cluster_factory):
    cluster = await start_cluster(cluster_factory, 3)
    first = await connect(cluster)
    second = await connect(cluster)
    try:
        writer = await first.create_ledger(3, 3, 2)
        acked: dict[int, bytes] = {}
        await write_stream(writer, 300, acked)
        reader, got = await read_all(second, writer.ledger_id, recovery=True)
        md = reader.metadata
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 299
        with pytest.raises(LedgerFencedError):
            await writer.add(b"after the fence")
        # every replica agrees on the closed ledger, byte for byte
        for bookie in md.current_ensemble:
            resp = await second.pool.get(bookie).read(writer.ledger_id, 0, md.last_entry_id)
            assert resp.code == pb.OK and resp.fenced
            assert {e.entry_id: e.payload for e in resp.entries} == acked
        # a bookie refuses a plain add to the fenced ledger, and accepts nothing past the end
        async with await RawBookieConnection.open(md.current_ensemble[0]) as conn:
            e = _entry(writer.ledger_id, 300, 299, b"late")
            r = await conn.call(pb.AddRequest(entries=[e]))
            assert r.results[0].code == pb.FENCED
        _, again = await read_all(first, writer.ledger_id, recovery=False)
        assert again == acked
    finally:
        await first.close()
        await second.close()


def _entry(ledger_id: int, entry_id: int, lac: int, payload: bytes, length: int = 0) -> pb.Entry:
    return pb.Entry(ledger_id=ledger_id, entry_id=entry_id, lac=lac, length=length, payload=payload,
                    checksum=entry_checksum(ledger_id, entry_id, lac, length, payload))


async def test_bad_input_gets_clear_errors_and_bookie_keeps_serving(cluster_factory):
    cluster = await start_cluster(cluster_factory, 3, bookie_overrides={"entry_bytes_max": 64 * 1024,
                                                                        "request_bytes_max": 1024 * 1024})
    bookie = cluster.bookie_ids[0]
    async with await RawBookieConnection.open(bookie) as conn:
        # unknown ledger
        r = await conn.call(pb.ReadRequest(ledger_id=987654, first_entry_id=0, last_entry_id=0))
        assert r.code == pb.NO_SUCH_LEDGER
        r = await conn.call(pb.ReadLacRequest(ledger_id=987654))
        assert r.code == pb.NO_SUCH_LEDGER
        # malformed ranges
        r = await conn.call(pb.ReadRequest(ledger_id=1, first_entry_id=-5, last_entry_id=0))
        assert r.code == pb.BAD_REQUEST
        r = await conn.call(pb.ReadRequest(ledger_id=1, first_entry_id=10, last_entry_id=2))
        assert r.code == pb.BAD_REQUEST
        # a good add, then a read past what is stored
        r = await conn.call(pb.AddRequest(entries=[_entry(77, 0, -1, b"ok")]))
        assert r.results[0].code == pb.OK
        r = await conn.call(pb.ReadRequest(ledger_id=77, first_entry_id=5, last_entry_id=5))
        assert r.code == pb.NO_SUCH_ENTRY
        # corrupted entry: bad checksum, nothing stored
        bad = _entry(77, 1, 0, b"payload")
        bad.payload = b"PAYLOAD"
        r = await conn.call(pb.AddRequest(entries=[bad]))
        assert r.results[0].code == pb.CHECKSUM_MISMATCH
        r = await conn.call(pb.ReadRequest(ledger_id=77, first_entry_id=1, last_entry_id=1))
        assert r.code == pb.NO_SUCH_ENTRY
        # an entry above entry_bytes_max
        r = await conn.call(pb.AddRequest(entries=[_entry(77, 1, 0, b"x" * (64 * 1024 + 1))]))
        assert r.results[0].code == pb.TOO_LARGE
        # several requests in one write: one answer each, matched by request id
        batch = b"".join(encode_message(pb.FRAME_READ_LAC_REQUEST, rid, pb.ReadLacRequest(ledger_id=77))
                         for rid in (101, 102, 103))
        await conn.send_bytes(batch)
        answers = [await conn.read_frame() for _ in range(3)]
        assert sorted(a[1] for a in answers) == [101, 102, 103]
        assert all(a[0] == pb.FRAME_READ_LAC_RESPONSE and a[2].code == pb.OK for a in answers)
    # a frame above request_bytes_max: TOO_LARGE, then the bookie closes that connection
    async with await RawBookieConnection.open(bookie) as conn:
        request = pb.AddRequest(entries=[_entry(77, 1, 0, b"x" * (2 * 1024 * 1024))])
        await conn.send_bytes(encode_message(pb.FRAME_ADD_REQUEST, 7, request))
        await conn.expect_error_then_close(pb.TOO_LARGE, request_id=7)
    # a body that is not a protobuf message at all: BAD_REQUEST, then closed
    async with await RawBookieConnection.open(bookie) as conn:
        await conn.send_bytes(encode_frame(pb.FRAME_READ_REQUEST, 8, b"\xff\xff\xff\xff\x0f not protobuf"))
        await conn.expect_error_then_close(pb.BAD_REQUEST, request_id=8)
    # an unknown frame type, and a response type sent as a request: BAD_REQUEST, then closed
    for frame_type in (200, pb.FRAME_ADD_RESPONSE):
        async with await RawBookieConnection.open(bookie) as conn:
            await conn.send_bytes(encode_frame(frame_type, 9, b""))
            await conn.expect_error_then_close(pb.BAD_REQUEST, request_id=9)
    # bytes of another protocol (their "length" is far above the limit)
    async with await RawBookieConnection.open(bookie) as conn:
        await conn.send_bytes(b"GET / HTTP/1.1\r\nHost: bookie\r\n\r\n")
        await conn.expect_error_then_close(pb.TOO_LARGE)
    # a fresh connection is served as before
    async with await RawBookieConnection.open(bookie) as conn:
        # fenced ledger: plain adds refused, recovery adds accepted
        r = await conn.call(pb.ReadLacRequest(ledger_id=77, fence=True))
        assert r.code == pb.OK and r.fenced and r.last_entry_id == 0
        r = await conn.call(pb.AddRequest(entries=[_entry(77, 1, 0, b"late")]))
        assert r.results[0].code == pb.FENCED
        r = await conn.call(pb.AddRequest(entries=[_entry(77, 1, 0, b"recovered")], recovery=True))
        assert r.results[0].code == pb.OK
        # ... and it still serves
        r = await conn.call(pb.ReadRequest(ledger_id=77, first_entry_id=0, last_entry_id=1))
        assert r.code == pb.OK and [e.payload for e in r.entries] == [b"ok", b"recovered"]
        info = await conn.call(pb.BookieInfoRequest())
        assert info.bookie_id == bookie and not info.read_only
    # the client refuses reads past the LAC of an open ledger
    client = await connect(cluster)
    try:
        writer = await client.create_ledger(3, 3, 2)
        await writer.add(b"one")
        reader = await client.open_ledger(writer.ledger_id, recovery=False)
        with pytest.raises(NoSuchEntryError):
            await reader.read(0, reader.last_readable_entry_id + 5)
    finally:
        await client.close()


def bookie_cmd(config_path) -> list[str]:
    return [sys.executable, "-m", "pulsarlite", "bookie", "--config", str(config_path)]


async def test_bookie_with_wiped_disk_refuses_to_start(cluster_factory):
    cluster = await start_cluster(cluster_factory, 3)
    name = cluster.bookie_names[0]
    await asyncio.to_thread(cluster.kill, name)
    from pulsarlite.config import BookieConfig, load_toml
    config = load_toml(BookieConfig, cluster.bookie_config_path(name))
    shutil.rmtree(config.journal_dir)
    os.makedirs(config.journal_dir)
    proc = await asyncio.to_thread(subprocess.run, bookie_cmd(cluster.bookie_config_path(name)),
                                   capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "wiped or swapped" in proc.stderr, proc.stderr[-2000:]


async def test_bad_config_file_is_refused_clearly(tmp_path):
    path = tmp_path / "bookie.toml"
    path.write_text('port = "not a number"\n')
    proc = await asyncio.to_thread(subprocess.run, bookie_cmd(path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "port must be int" in proc.stderr
    path.write_text('no_such_setting = 1\n')
    proc = await asyncio.to_thread(subprocess.run, bookie_cmd(path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown setting" in proc.stderr


async def test_a_local_clusters_bookies_write_on_a_shared_disk_99_percent_used(cluster_factory, tmp_path):
    """LocalCluster (tests, the standalone) shares the machine's disk: at 99.5% used its bookies stay
    writable; BookieConfig's own 0.95 (a disk of the bookie's own) makes the same bookie read-only.
    Session 16's CI run lost 150 tests to bookies registering read-only on a fuller shared disk."""
    sv = os.statvfs(tmp_path)
    free_bytes = int(sv.f_blocks * sv.f_frsize * 0.005)          # 99.5% of the disk used
    product = {"disk_usage_readonly_threshold": 0.95, "disk_usage_writable_threshold": 0.90}
    cluster = await start_cluster(cluster_factory, 3, bookie_overrides={
        "disk_free_bytes_override": free_bytes, "bookie-3": product})
    own_ratio_id = cluster.records["bookie-3"].bookie_id
    client = await connect(cluster)
    try:
        assert await client.ledger_manager.readonly_bookies() == [own_ratio_id]
        writer = await client.create_ledger(2, 2, 2)
        await writer.add(b"x")
        await writer.close()
    finally:
        await client.close()


async def test_full_disk_makes_bookie_read_only(cluster_factory):
    cluster = await start_cluster(cluster_factory, 3, bookie_overrides={"bookie-3": {"disk_free_bytes_override": 1}})
    readonly_id = cluster.records["bookie-3"].bookie_id
    client = await connect(cluster)
    try:
        assert await client.ledger_manager.readonly_bookies() == [readonly_id]
        assert readonly_id not in await client.ledger_manager.writable_bookies()
        with pytest.raises(NotEnoughBookiesError):
            await client.create_ledger(3, 3, 2)
        writer = await client.create_ledger(2, 2, 2)
        assert readonly_id not in writer.metadata.current_ensemble
        await writer.add(b"x")
        await writer.close()
        async with await RawBookieConnection.open(readonly_id) as conn:
            r = await conn.call(pb.AddRequest(entries=[_entry(5, 0, -1, b"refused")]))
            assert r.results[0].code == pb.READ_ONLY
            info = await conn.call(pb.BookieInfoRequest())
            assert info.read_only
            r = await conn.call(pb.ReadRequest(ledger_id=5, first_entry_id=0, last_entry_id=0))
            assert r.code == pb.NO_SUCH_LEDGER  # reads still served
    finally:
        await client.close()


async def test_operator_shell_simpletest_and_readledger(cluster_factory):
    cluster = await start_cluster(cluster_factory, 3)
    base = [sys.executable, "-m", "pulsarlite", "bookkeeper", "--zookeeper", cluster.zookeeper]

    def run(*args) -> str:
        proc = subprocess.run(base + list(args), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    out = json.loads(await asyncio.to_thread(run, "simpletest", "--ensemble", "3", "--write-quorum", "3",
                                             "--ack-quorum", "2", "--entries", "2500", "--json"))
    assert out["entries_acked"] == 2500
    ledger_id = out["ledger_id"]
    read = json.loads(await asyncio.to_thread(run, "readledger", str(ledger_id), "--json"))
    assert read["ledger_id"] == ledger_id and read["entries"] == 2500 and read["last_entry_id"] == 2499
    bookies = json.loads(await asyncio.to_thread(run, "listbookies", "--json"))
    assert sorted(bookies["writable"]) == sorted(cluster.bookie_ids)
    assert ledger_id in json.loads(await asyncio.to_thread(run, "listledgers", "--json"))
    md = json.loads(await asyncio.to_thread(run, "ledgermetadata", str(ledger_id)))
    assert md["state"] == "CLOSED" and md["last_entry_id"] == 2499
    await asyncio.to_thread(run, "deleteledger", str(ledger_id))
    assert ledger_id not in json.loads(await asyncio.to_thread(run, "listledgers", "--json"))
    proc = await asyncio.to_thread(subprocess.run, base + ["ledgermetadata", "424242"],
                                   capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "424242" in proc.stderr

"""Journal: record codec, group write + replay, zero-filled tail, torn records, rolling, removal."""

import os
import threading

import pytest

from bookie.storage.entry_log import (ADD, DELETE, FENCE, StoredEntry, encode_add, encode_control,
                                      parse_record)
from bookie.storage.group_commit import GroupCommitPolicy
from bookie.storage.journal import (DROP_PAGE_CACHE_STEP_BYTES, FILE_HEADER_BYTES, JournalItem, JournalPosition, JournalWriter,
                                    journal_path, list_journal_files, remove_journal_files_below,
                                    replay_journal)
from pulsarlite.checksum import entry_checksum
from pulsarlite.errors import BookieUnavailableError

POLICY = GroupCommitPolicy(1.0, 512 * 1024)


def entry(ledger: int, eid: int, payload: bytes = b"", lac: int = -1, length: int = 0) -> StoredEntry:
    payload = payload or f"payload-{ledger}-{eid}".encode()
    return StoredEntry(ledger, eid, lac, length, payload, entry_checksum(ledger, eid, lac, length, payload))


def add_record(e: StoredEntry) -> bytes:
    head, trailer = encode_add(e)
    return head + e.payload + trailer


def writer(tmp_path, **kw) -> JournalWriter:
    args = dict(file_bytes_max=1 << 20, preallocate_bytes=64 * 1024, policy=POLICY)
    args.update(kw)
    return JournalWriter(str(tmp_path / "journal"), **args)


def replayed(tmp_path, mark=JournalPosition(0, 0)):
    return [rec for rec, _ in replay_journal(str(tmp_path / "journal"), mark)]


def test_codec_round_trip():
    e = entry(7, 3, b"hello", lac=2, length=99)
    rec, end = parse_record(add_record(e), 0, 10**6)
    assert (rec.kind, rec.ledger_id, rec.entry_id, rec.lac, rec.length, rec.payload, rec.checksum) == \
        (ADD, 7, 3, 2, 99, b"hello", e.checksum)
    assert end == len(add_record(e))
    rec, _ = parse_record(encode_control(FENCE, 9), 0, 100)
    assert (rec.kind, rec.ledger_id) == (FENCE, 9)
    assert parse_record(bytes(64), 0, 64) == "end"


def test_codec_detects_corruption():
    data = bytearray(add_record(entry(1, 1, b"abcdef")))
    for i in range(8, len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x01
        assert isinstance(parse_record(bytes(bad), 0, len(bad)), str), i


def test_write_replay_round_trip(tmp_path):
    w = writer(tmp_path)
    entries = [entry(1, i) for i in range(5)]
    w.write_group([add_record(e) for e in entries[:3]])
    w.write_group([encode_control(FENCE, 1), add_record(entries[3])])
    pos = w.write_group([add_record(entries[4]), encode_control(DELETE, 2)])
    w.close_file()
    recs = replayed(tmp_path)
    assert [(r.kind, r.ledger_id, r.entry_id) for r in recs] == \
        [(ADD, 1, 0), (ADD, 1, 1), (ADD, 1, 2), (FENCE, 1, -1), (ADD, 1, 3), (ADD, 1, 4), (DELETE, 2, -1)]
    assert [r.payload for r in recs if r.kind == ADD] == [e.payload for e in entries]
    assert pos.file_id == w.file_id


def test_preallocated_zero_tail_stops_replay(tmp_path):
    w = writer(tmp_path, preallocate_bytes=256 * 1024)
    w.write_group([add_record(entry(1, i)) for i in range(10)])
    w.close_file()
    path = journal_path(str(tmp_path / "journal"), w.file_id)
    assert os.path.getsize(path) >= 256 * 1024          # zero-filled ahead of the writer
    assert len(replayed(tmp_path)) == 10


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage_length"])
def test_torn_last_record_stops_replay(tmp_path, damage):
    w = writer(tmp_path, preallocate_bytes=0 if damage == "truncate" else 64 * 1024)
    w.write_group([add_record(entry(1, i)) for i in range(5)])
    before_last = w.position.offset
    w.write_group([add_record(entry(1, 5, b"x" * 1000))])
    w.close_file()
    path = journal_path(str(tmp_path / "journal"), w.file_id)
    with open(path, "r+b") as f:
        if damage == "flip":
            f.seek(before_last + 500)
            b = f.read(1)
            f.seek(before_last + 500)
            f.write(bytes([b[0] ^ 0xFF]))
        elif damage == "truncate":
            f.truncate(before_last + 300)
        else:
            f.seek(before_last)
            f.write((10**8).to_bytes(4, "big"))
    recs = replayed(tmp_path)
    assert [r.entry_id for r in recs] == [0, 1, 2, 3, 4]


def test_replay_continues_into_files_after_a_torn_one(tmp_path):
    w = writer(tmp_path)
    w.write_group([add_record(entry(1, 0))])
    w.write_group([add_record(entry(1, 1))])
    w.close_file()
    path = journal_path(str(tmp_path / "journal"), w.file_id)
    with open(path, "r+b") as f:                       # tear the second record
        f.seek(w.position.offset - 3)
        f.write(b"\xff\xff\xff")
    w2 = writer(tmp_path)                              # a restart starts a new file
    assert w2.file_id == w.file_id + 1
    w2.write_group([add_record(entry(1, 2))])
    w2.close_file()
    assert [r.entry_id for r in replayed(tmp_path)] == [0, 2]


def test_rolling_and_replay_order(tmp_path):
    w = writer(tmp_path, file_bytes_max=4096, preallocate_bytes=1024)
    for i in range(100):
        w.write_group([add_record(entry(3, i, b"p" * 100))])
    w.close_file()
    files = list_journal_files(str(tmp_path / "journal"))
    assert len(files) > 3
    for fid in files:
        assert os.path.getsize(journal_path(str(tmp_path / "journal"), fid)) <= 4096 + 1024
    assert [r.entry_id for r in replayed(tmp_path)] == list(range(100))


def test_replay_from_mark_and_removal_below_mark(tmp_path):
    w = writer(tmp_path, file_bytes_max=2048, preallocate_bytes=0)
    marks = []
    for i in range(40):
        marks.append(w.write_group([add_record(entry(4, i, b"q" * 100))]))
    w.close_file()
    mark = marks[19]                                   # after entry 19
    assert [r.entry_id for r in replayed(tmp_path, mark)] == list(range(20, 40))
    d = str(tmp_path / "journal")
    removed = remove_journal_files_below(d, mark.file_id)
    assert removed and all(fid < mark.file_id for fid in removed)
    assert min(list_journal_files(d)) == mark.file_id
    assert [r.entry_id for r in replayed(tmp_path, mark)] == list(range(20, 40))


def test_file_header_and_new_file_per_open(tmp_path):
    w1 = writer(tmp_path)
    w1.close_file()
    w2 = writer(tmp_path)
    w2.close_file()
    assert w2.file_id == w1.file_id + 1
    assert w2.start_position == JournalPosition(w2.file_id, FILE_HEADER_BYTES)


def test_writer_thread_group_commit(tmp_path):
    w = writer(tmp_path)
    committed = []
    done = threading.Event()
    total = 50

    def on_commit(items, pos):
        committed.extend(item.context for item in items)
        if len(committed) == total:
            done.set()

    w.start(on_commit, lambda err, items: pytest.fail(f"journal error {err!r}"))
    for i in range(total):
        rec = add_record(entry(5, i))
        w.submit(JournalItem([rec], len(rec), 1, context=i))
    assert done.wait(30)
    w.stop()
    assert committed == list(range(total))              # commit order = submit order
    assert 1 <= w.groups_written <= total
    assert [r.entry_id for r in replayed(tmp_path)] == list(range(total))


def test_writer_thread_reports_io_errors(tmp_path):
    w = writer(tmp_path)
    failed = []
    done = threading.Event()
    w.close_file()                                      # writes now fail with EBADF

    def on_error(err, items):
        failed.append((err, [i.context for i in items]))
        done.set()

    w.start(lambda items, pos: None, on_error)
    w.submit(JournalItem([b"x" * 100], 100, 1, context="a"))
    assert done.wait(30)
    w.stop()
    assert isinstance(failed[0][0], OSError) and failed[0][1] == ["a"]


def test_write_group_now_writes_on_the_callers_thread_unless_the_thread_is_writing(tmp_path, monkeypatch):
    w = writer(tmp_path)
    committed = []
    entered, gate = threading.Event(), threading.Event()
    real = os.fdatasync

    def fdatasync(fd):
        if threading.current_thread() is not threading.main_thread():
            entered.set()
            assert gate.wait(30), "gate never opened"
        real(fd)

    monkeypatch.setattr("bookie.storage.journal.os.fdatasync", fdatasync)
    w.start(lambda items, pos: committed.extend(i.context for i in items),
            lambda err, items: pytest.fail(f"journal error {err!r}"))
    first = add_record(entry(5, 0))
    assert w.write_group_now([first]) == JournalPosition(w.file_id, FILE_HEADER_BYTES + len(first))
    second = add_record(entry(5, 1))
    w.submit(JournalItem([second], len(second), 1, context="thread"))
    assert entered.wait(30)                              # the thread is inside its write
    assert w.write_group_now([add_record(entry(5, 2))]) is None   # not written: submit it instead
    gate.set()
    w.stop()
    assert committed == ["thread"]
    assert [r.entry_id for r in replayed(tmp_path)] == [0, 1]
    assert w.write_group_now([add_record(entry(5, 3))]) is None   # stopped


def test_write_group_now_raises_and_stops_the_writer_on_io_error(tmp_path):
    w = writer(tmp_path)
    w.start(lambda items, pos: None, lambda err, items: None)
    w.close_file()                                      # writes now fail with EBADF
    with pytest.raises(OSError):
        w.write_group_now([b"x" * 100])
    assert isinstance(w.error, OSError)
    with pytest.raises(BookieUnavailableError):
        w.submit(JournalItem([b"y"], 1, 1))
    w.stop()


def test_preallocation_fills_one_step_on_the_write_path_and_the_rest_when_idle(tmp_path):
    """A group meets at most one step of zero-filling; the look-ahead grows while idle."""
    from bookie.storage.group_commit import GroupCommitPolicy
    from bookie.storage.journal import PREALLOCATE_STEP_BYTES, JournalWriter

    writer = JournalWriter(str(tmp_path), file_bytes_max=64 * PREALLOCATE_STEP_BYTES,
                           preallocate_bytes=8 * PREALLOCATE_STEP_BYTES,
                           policy=GroupCommitPolicy(group_wait_ms_max=1.0, bytes_buffered_max=1 << 20))
    try:
        assert writer._allocated - writer._offset <= PREALLOCATE_STEP_BYTES
        writer.write_group([b"x" * (3 * PREALLOCATE_STEP_BYTES)])
        assert writer._allocated - writer._offset <= PREALLOCATE_STEP_BYTES  # only one step ahead
        steps = 0
        while writer.preallocate_when_idle():
            steps += 1
            assert writer._allocated - writer._offset <= 8 * PREALLOCATE_STEP_BYTES + PREALLOCATE_STEP_BYTES
        assert steps >= 6
        assert writer._allocated - writer._offset >= 8 * PREALLOCATE_STEP_BYTES
        assert not writer.preallocate_when_idle()  # enough ahead: nothing more
    finally:
        writer.close_file()


@pytest.mark.parametrize("write_max", [None, 1, 7, 100])
def test_pwritev_all_writes_every_piece_in_order_through_short_writes(tmp_path, monkeypatch, write_max):
    """More pieces than one pwritev takes, empty ones, memoryviews: the file holds their join;
    a short pwritev (the kernel may write less) is finished, not lost or repeated."""
    from bookie.storage import entry_log
    pieces = [bytes([i % 251]) * (i % 13) for i in range(entry_log.IOV_MAX * 2 + 5)]
    pieces[3] = memoryview(b"view-piece")[2:]
    expected = b"".join(pieces)
    if write_max is not None:
        real = os.pwritev
        monkeypatch.setattr(entry_log.os, "pwritev",
                            lambda fd, bufs, off: real(fd, [b"".join(bufs)[:write_max]], off))
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, b"HEAD", 0)
        assert entry_log.pwritev_all(fd, pieces, 4) == len(expected)
        assert entry_log.pwritev_all(fd, [], 4 + len(expected)) == 0
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"HEAD" + expected


@pytest.mark.parametrize("drop", [False, True])
def test_journal_drops_synced_pages_from_the_page_cache_when_asked(tmp_path, monkeypatch, drop):
    from test_ledger_storage import PageCacheCalls
    calls = PageCacheCalls(monkeypatch)
    w = writer(tmp_path, file_bytes_max=64 << 20, drop_page_cache=drop)
    recs = [add_record(entry(5, i, payload=bytes([i % 256]) * 5000)) for i in range(600)]   # ~3 MiB
    for i in range(0, len(recs), 7):
        w.write_group(recs[i:i + 7])
    w.close_file()
    dropped = calls.check_drops_follow_syncs()
    path = journal_path(str(tmp_path / "journal"), w.file_id)
    if drop:
        # every whole synced page but those of the last MiB step
        assert w.position.offset - DROP_PAGE_CACHE_STEP_BYTES <= dropped[path] <= w.position.offset
    else:
        assert dropped == {}
    assert [r.entry_id for r in replayed(tmp_path)] == list(range(600))

"""Producer deduplication core (broker/dedup.py): duplicate detection, in-flight copies, failures,
bounds and the snapshot format."""

from __future__ import annotations

import random

import pytest

from broker.dedup import DedupState, DupStatus, entry_sequence
from pulsarlite.errors import ConfigError
from pulsarlite.wire import pb
from pulsarlite.wire.entry import peek_metadata


def test_new_in_flight_dup():
    s = DedupState()
    assert s.check("p", 0) is DupStatus.NEW
    s.on_pushed("p", 0)
    assert s.check("p", 0) is DupStatus.IN_FLIGHT
    s.on_persisted("p", 0)
    assert s.check("p", 0) is DupStatus.DUP
    assert s.check("p", 1) is DupStatus.NEW
    assert s.check("other", 0) is DupStatus.NEW
    assert s.last_sequence_id("p") == 0 and s.last_sequence_id("other") == -1


def test_failed_add_may_be_sent_again():
    s = DedupState()
    s.on_pushed("p", 0)
    s.on_persisted("p", 0)
    s.on_pushed("p", 3)           # 1..3 in flight
    s.on_failed("p")
    assert s.check("p", 2) is DupStatus.NEW and s.check("p", 0) is DupStatus.DUP


def test_bounded_producers():
    s = DedupState(producers_max=3)
    for i in range(5):
        s.on_pushed(f"p{i}", 1)
        s.on_persisted(f"p{i}", 1)
    assert len(s.persisted) == 3 and "p0" not in s.persisted and "p4" in s.persisted
    with pytest.raises(ConfigError):
        DedupState(producers_max=0)


def test_snapshot_roundtrip_and_malformed():
    rng = random.Random(7)
    s = DedupState()
    for _ in range(200):
        name, seq = f"p{rng.randrange(10)}", rng.randrange(1000)
        if s.check(name, seq) is DupStatus.NEW:
            s.on_pushed(name, seq)
            s.on_persisted(name, seq)
    data = s.snapshot((5, 42))
    t, position = DedupState.from_snapshot(data)
    assert position == (5, 42) and dict(t.persisted) == dict(s.persisted)
    for bad in (b"", b"[]", b'{"version": 9}', b'{"version": 1, "position": [1]}',
                b'{"version": 1, "position": [1, 2], "producers": {"a": "x"}}'):
        with pytest.raises(ValueError):
            DedupState.from_snapshot(bad)


def _meta(**kw) -> bytes:
    raw = pb.MessageMetadata(producer_name=kw.pop("producer_name", "p"), sequence_id=kw.pop("sequence_id", 0),
                             publish_time=1, **kw).SerializeToString()
    return len(raw).to_bytes(4, "big") + raw + b"x"


def test_entry_sequence_of_single_and_batch():
    assert entry_sequence(peek_metadata(_meta(sequence_id=7))) == ("p", 7, 7)
    assert entry_sequence(peek_metadata(_meta(sequence_id=7, num_messages_in_batch=5))) == ("p", 7, 11)
    assert entry_sequence(peek_metadata(_meta(sequence_id=7, num_messages_in_batch=5,
                                              highest_sequence_id=20))) == ("p", 7, 20)
    assert entry_sequence(peek_metadata(_meta(producer_name=""))) is None


# -- holes: an add failed while later ones were stored (found by the chaos suite) ------------------
def test_a_hole_below_stored_ids_is_never_answered_as_duplicate():
    s = DedupState()
    for seq in range(10):
        assert s.check("p", seq) is DupStatus.NEW
        s.on_pushed("p", seq)
    for seq in range(5):
        s.on_persisted("p", seq, seq)
    s.on_failed("p", 5)                  # 5 failed ...
    for seq in range(6, 10):
        s.on_persisted("p", seq, seq)    # ... while 6..9, already pushed, were stored
    assert s.last_sequence_id("p") == 4  # the client resends from 5
    assert s.check("p", 3) is DupStatus.DUP
    for seq in range(5, 10):             # the resends: 5 is stored, 6..9 stored again (duplicates, not loss)
        assert s.check("p", seq) is DupStatus.NEW
        s.on_pushed("p", seq)
        s.on_persisted("p", seq, seq)
    assert s.holes == {} and s.last_sequence_id("p") == 9
    assert s.check("p", 7) is DupStatus.DUP


def test_a_gap_found_while_replaying_the_log_is_a_hole_and_survives_snapshots():
    s = DedupState()
    for first, high in [(0, 4), (8, 9)]:        # 5..7 never reached the log
        s.replay("p", high, first)
    assert s.last_sequence_id("p") == 4 and s.check("p", 6) is DupStatus.NEW
    restored, position = DedupState.from_snapshot(s.snapshot((3, 7)))
    assert position == (3, 7) and restored.check("p", 6) is DupStatus.NEW
    assert restored.check("p", 4) is DupStatus.DUP and restored.last_sequence_id("p") == 4
    restored.replay("p", 9, 5)                  # the resends, one batch 5..9
    assert restored.holes == {} and restored.check("p", 9) is DupStatus.DUP


def _no_receipt_without_the_message_in_the_log(seed: int) -> None:
    rng = random.Random(seed)
    state = DedupState()
    log: list[tuple[int, int]] = []          # (first, high) of stored entries, in order
    stored: set[int] = set()
    skipped: set[int] = set()
    next_seq = 0
    snapshot_at = None
    for _ in range(rng.randint(5, 40)):
        if rng.random() < 0.1:               # failover: snapshot (maybe old) + replay
            if snapshot_at is None or rng.random() < 0.5:
                snapshot_at = (len(log), state.snapshot((0, len(log) - 1)))
            n, data = snapshot_at
            state, _ = DedupState.from_snapshot(data)
            for first, high in log[n:]:
                state.replay("p", high, first)
            state.on_nothing_in_flight()                  # a new owner has nothing in flight
            next_seq = state.last_sequence_id("p") + 1      # the client resumes there
            continue
        if rng.random() < 0.15:              # ids of sends that timed out in the client: never sent
            skipped.update(range(next_seq, next_seq + rng.randint(1, 3)))

        def batch(first: int) -> tuple[int, int]:
            while first in skipped:
                first += 1
            high = first
            for _ in range(rng.randint(0, 2)):
                if high + 1 in skipped:
                    break
                high += 1
            return first, high
        window = [batch(next_seq)]
        while len(window) < rng.randint(1, 5):
            window.append(batch(window[-1][1] + 1))
        outcomes = []
        for first, high in window:
            status = state.check("p", first)
            if status is DupStatus.DUP:
                assert all(x in stored for x in range(first, high + 1)), (seed, first, high, log)
                outcomes.append("dup")
                continue
            state.on_pushed("p", high)
            outcomes.append("pushed")
        failed_first = None
        # outcomes in any order (a queued add may fail before the ones in flight in the ledger
        # being closed), a snapshot possibly taken between them (adds still in flight)
        pushed = [w for w, outcome in zip(window, outcomes) if outcome == "pushed"]
        for first, high in (pushed if rng.random() < 0.5 else rng.sample(pushed, len(pushed))):
            if rng.random() < 0.1:
                snapshot_at = (len(log), state.snapshot((0, len(log) - 1)))
            if rng.random() < 0.2:
                state.on_failed("p", first)
                failed_first = first if failed_first is None else min(failed_first, first)
            else:
                state.on_persisted("p", high, first)
                log.append((first, high))
                stored.update(range(first, high + 1))
        state.on_nothing_in_flight()
        next_seq = failed_first if failed_first is not None else window[-1][1] + 1


def test_property_no_receipt_without_the_message_in_the_log():
    """Seeded schedules of one producer: sends pushed in order, each add stored or failed
    (later adds may be stored after an earlier one failed, as across a rollover, and the
    outcomes may come in any order), ids skipped by the client (sends that timed out before
    they were sent); failed sends and everything after them are resent in order, sometimes
    after a 'failover' that rebuilds the state from a snapshot (maybe taken while adds were in
    flight) plus a replay of the log. A DUP answer must name a sequence id that is in the log."""
    for seed in range(400):
        _no_receipt_without_the_message_in_the_log(seed)


def test_the_property_catches_a_hole_settled_from_a_snapshot(monkeypatch):
    """Planted defect: a hole loaded from a snapshot settled as if the writer had had nothing in
    flight (the snapshot may have been written while adds below the failed one were in flight,
    and they failed after it)."""
    from_snapshot = DedupState.from_snapshot.__func__

    def trusting(cls, data, **kwargs):
        state, position = from_snapshot(cls, data, **kwargs)
        for name, hole in __import__("json").loads(data).get("holes", {}).items():
            state.holes[name][0] = hole[0]
        return state, position
    monkeypatch.setattr(DedupState, "from_snapshot", classmethod(trusting))
    with pytest.raises(AssertionError):
        for seed in range(2000):
            _no_receipt_without_the_message_in_the_log(seed)


def test_a_hole_below_ids_never_sent_settles_once_nothing_is_in_flight():
    """A producer whose first ids timed out in its client (never sent) has 2..16 in flight in
    the ledger being closed when its queued send 17..19 fails: the hole's refill point is left
    at -1, below ids that will never come. Once nothing is in flight it moves up to 16 (found
    by the whole-path simulation, seed 6911: the producer was given last_sequence_id -1 for
    good, and a new owner decided everything from 0 on by content)."""
    s = DedupState()
    for first, high in [(2, 6), (7, 11), (12, 16), (17, 19)]:
        assert s.check("p", high, first_sequence_id=first) is DupStatus.NEW
        s.on_pushed("p", high)
    s.on_failed("p", 17)
    for first, high in [(2, 6), (7, 11), (12, 16)]:
        s.on_persisted("p", high, first, digest=100 + first)
    assert s.last_sequence_id("p") == -1          # 2..16 were in flight when 17 failed
    s.on_nothing_in_flight()
    assert s.last_sequence_id("p") == 16
    assert s.check("p", 11, first_sequence_id=7) is DupStatus.DUP
    assert s.check("p", 19, first_sequence_id=17) is DupStatus.NEW
    s.on_pushed("p", 19)
    s.on_persisted("p", 19, 17, digest=117)
    assert s.holes == {} and s.last_sequence_id("p") == 19


def test_a_snapshot_carries_the_digests_of_a_producer_with_a_hole():
    """A producer with a hole has stored entries above its refill point; a new owner opens a
    content range above that point (open_after_load), where a resend is a duplicate only if a
    stored entry has its bytes: the snapshot must carry them (CHAOS.md finding 8)."""
    s = DedupState()
    for seq in range(10):
        s.on_pushed("p", seq)
    for seq in range(5):
        s.on_persisted("p", seq, seq, digest=500 + seq)
    s.on_failed("p", 5)                            # 5 failed while 6..9 were stored
    for seq in range(6, 10):
        s.on_persisted("p", seq, seq, digest=500 + seq)
    assert s.reused == {} and s.last_sequence_id("p") == 4
    restored, _ = DedupState.from_snapshot(s.snapshot((3, 9)))
    restored.open_after_load({"p": restored.effective("p")})
    assert restored.check("p", 7, first_sequence_id=7, digest=507) is DupStatus.DUP    # stored byte for byte
    assert restored.check("p", 5, first_sequence_id=5, digest=505) is DupStatus.NEW    # the hole: resend stored


def test_a_resent_batch_straddling_the_stored_high_is_stored_not_answered():
    """The topic asks about the highest id a send covers: a batch 8..17 after 0..9 was stored
    is not a duplicate (10..17 are not in the log)."""
    s = DedupState()
    s.on_pushed("p", 9)
    s.on_persisted("p", 9, 0)
    assert s.check("p", 17) is DupStatus.NEW      # the batch 8..17, asked by its highest id
    assert s.check("p", 9) is DupStatus.DUP       # a batch 5..9: all stored


def test_reused_ids_are_decided_by_content_only_inside_the_reused_range():
    from broker.dedup import DigestWindow
    s = DedupState()
    for seq in range(10):
        s.on_pushed("p", seq)
        s.on_persisted("p", seq, seq, digest=1000 + seq)
    assert s.check("p", 3, first_sequence_id=3, digest=77) is DupStatus.DUP     # by id: no reuse seen
    s.mark_reused("p", 2, 9)
    assert s.check("p", 3, first_sequence_id=3, digest=77) is DupStatus.NEW     # other bytes
    assert s.check("p", 3, first_sequence_id=3, digest=1003) is DupStatus.DUP   # the stored bytes
    assert s.check("p", 1, first_sequence_id=1, digest=77) is DupStatus.DUP     # outside: by id
    assert s.check("p", 10, first_sequence_id=10, digest=77) is DupStatus.NEW
    # the window is a bounded ring
    w = DigestWindow(3)
    for i in range(5):
        w.append(i, i, i)
    assert len(w) == 3 and not w.contains(1, 1, 1) and w.contains(4, 4, 4)
    assert [r[0] for r in __import__("struct").iter_unpack(">qqI", w.packed())] == [2, 3, 4]


def test_ids_going_back_in_the_log_mark_a_reused_range_and_survive_a_snapshot():
    s = DedupState()
    for seq in range(6):
        s.replay("p", seq, seq, 500 + seq)
    s.replay("p", 1, 1, 900)                 # the log goes back: a client reset its counter
    assert s.reused == {"p": [1, 5]}
    assert s.check("p", 1, first_sequence_id=1, digest=900) is DupStatus.DUP
    assert s.check("p", 2, first_sequence_id=2, digest=901) is DupStatus.NEW
    restored, _ = DedupState.from_snapshot(s.snapshot((1, 2)))
    assert restored.reused == {"p": [1, 5]}
    assert restored.check("p", 1, first_sequence_id=1, digest=900) is DupStatus.DUP
    assert restored.check("p", 2, first_sequence_id=2, digest=502) is DupStatus.DUP
    assert restored.check("p", 2, first_sequence_id=2, digest=901) is DupStatus.NEW
    with pytest.raises(ValueError):
        DedupState.from_snapshot(b'{"version":1,"position":[1,2],"producers":{},"digests":{"p":"AAA"}}')


def test_a_hole_the_client_gave_up_on_closes_when_its_next_session_resumes_above_it():
    """All bookies down longer than the client's send timeout: 4..9 failed and the client gave
    up on them (their sends timed out: never sent again). Its next session starts at 10; the
    hole must not keep the producer's refill point at 3 for good (chaos seed 7003 under load:
    every later session was given last_sequence_id 3 and decided by content, and a resend older
    than the digest window was stored twice)."""
    s = DedupState()
    for seq in range(10):
        s.on_pushed("p", seq)
    for seq in range(4):
        s.on_persisted("p", seq, seq, digest=seq)
    for seq in range(4, 10):
        s.on_failed("p", seq)
    s.on_nothing_in_flight()
    assert s.holes == {"p": [4, 9, 3]}
    assert s.on_session_start("p", reconnect=True) == 3
    s.on_session_resumed("p", 10)
    assert s.holes == {}
    assert s.check("p", 10, first_sequence_id=10, digest=10) is DupStatus.NEW
    s.on_pushed("p", 10)
    s.on_persisted("p", 10, 10, digest=10)
    assert s.last_sequence_id("p") == 10
    # a resend of a failed id in the same client's content range is still decided by its bytes
    assert s.check("p", 5, first_sequence_id=5, digest=5) is DupStatus.NEW


def test_a_session_resuming_inside_its_hole_moves_nothing_it_will_resend():
    s = DedupState()
    for seq in range(10):
        s.on_pushed("p", seq)
    s.on_persisted("p", 3, 0, digest=1)
    s.on_failed("p", 4)
    s.on_session_resumed("p", 4)          # it resends 4.. in order
    assert s.holes == {"p": [4, 9, 3]} and s.check("p", 4) is DupStatus.NEW


def test_entry_sequence_names_a_chunked_message_by_its_last_chunk_only():
    """The chunks of a message share its sequence id: only the last one records it (replay,
    kept entries), else a replayed first chunk would make the last one a duplicate."""
    from pulsarlite.wire.entry import Message, build_chunk_entries
    chunks = build_chunk_entries(Message(bytes(range(256)) * 40), producer_name="p", sequence_id=7,
                                 publish_time_ms=0, entry_bytes_max=4096)
    assert len(chunks) == 3
    assert [entry_sequence(peek_metadata(e)) for e in chunks] == [None, None, ("p", 7, 7)]

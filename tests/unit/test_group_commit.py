"""Group-commit policy: a pure function of (now, oldest, bytes buffered, queue empty)."""

import pytest
from hypothesis import given, strategies as st

from bookie.storage.group_commit import GroupCommitPolicy, next_flush_delay_ms, should_flush
from pulsarlite.errors import ConfigError

P = GroupCommitPolicy(group_wait_ms_max=2.0, bytes_buffered_max=1000)
P_WAIT = GroupCommitPolicy(group_wait_ms_max=2.0, bytes_buffered_max=1000, flush_when_queue_empty=False)


@pytest.mark.parametrize("policy, now, oldest, nbytes, queue_empty, flush, delay", [
    # nothing buffered: never flush, sleep until a record arrives
    (P, 10.0, None, 0, True, False, None),
    (P, 10.0, None, 0, False, False, None),
    # queue empty: flush at once
    (P, 10.0, 10.0, 1, True, True, 0.0),
    # queue not empty, young, small: wait for the rest of the group window
    (P, 10.0, 9.5, 10, False, False, 1.5),
    # oldest reached the wait
    (P, 12.0, 10.0, 10, False, True, 0.0),
    (P, 13.0, 10.0, 10, False, True, 0.0),
    # bytes threshold
    (P, 10.0, 10.0, 1000, False, True, 0.0),
    (P, 10.0, 10.0, 5000, False, True, 0.0),
    (P, 10.0, 10.0, 999, False, False, 2.0),
    # without flush-when-queue-empty, an empty queue waits for the window
    (P_WAIT, 10.0, 10.0, 1, True, False, 2.0),
    (P_WAIT, 11.0, 10.0, 1, True, False, 1.0),
    (P_WAIT, 12.0, 10.0, 1, True, True, 0.0),
    (P_WAIT, 10.0, 10.0, 1000, True, True, 0.0),
])
def test_table(policy, now, oldest, nbytes, queue_empty, flush, delay):
    assert policy.should_flush(now_ms=now, oldest_ms=oldest, bytes_buffered=nbytes,
                               queue_empty=queue_empty) is flush
    assert policy.next_flush_delay_ms(now_ms=now, oldest_ms=oldest, bytes_buffered=nbytes,
                                      queue_empty=queue_empty) == delay


def test_functional_forms_agree():
    kw = dict(now_ms=5.0, oldest_ms=4.0, bytes_buffered=10, queue_empty=False,
              group_wait_ms_max=2.0, bytes_buffered_max=100)
    assert should_flush(**kw) is False
    assert next_flush_delay_ms(**kw) == 1.0


def test_bad_policy():
    with pytest.raises(ConfigError):
        GroupCommitPolicy(0, 10)
    with pytest.raises(ConfigError):
        GroupCommitPolicy(1.0, 0)


@given(wait=st.floats(0.01, 100), bmax=st.integers(1, 10**7), now=st.floats(0, 1e6),
       age=st.floats(0, 200), nbytes=st.integers(0, 2 * 10**7), queue_empty=st.booleans(),
       when_empty=st.booleans(), later=st.floats(0, 100), buffered=st.booleans())
def test_properties(wait, bmax, now, age, nbytes, queue_empty, when_empty, later, buffered):
    p = GroupCommitPolicy(wait, bmax, when_empty)
    oldest = now - age if buffered else None
    flush = p.should_flush(now_ms=now, oldest_ms=oldest, bytes_buffered=nbytes, queue_empty=queue_empty)
    delay = p.next_flush_delay_ms(now_ms=now, oldest_ms=oldest, bytes_buffered=nbytes,
                                  queue_empty=queue_empty)
    if oldest is None:
        assert not flush and delay is None
        return
    # delay is 0 exactly when a flush is due, and never longer than the group window
    assert (delay == 0.0) == flush
    assert 0.0 <= delay <= wait
    # a record never waits past the window
    assert p.should_flush(now_ms=max(now, oldest + wait) + 1e-3, oldest_ms=oldest,
                          bytes_buffered=nbytes, queue_empty=queue_empty)
    # once due, it stays due as time passes
    if flush:
        assert p.should_flush(now_ms=now + later, oldest_ms=oldest, bytes_buffered=nbytes,
                              queue_empty=queue_empty)
    # more bytes never cancel a flush
    if flush:
        assert p.should_flush(now_ms=now, oldest_ms=oldest, bytes_buffered=nbytes + 1,
                              queue_empty=queue_empty)

"""Group-commit policy of the journal: a pure function of (now, oldest waiting record, bytes
buffered, queue empty). No clock, no I/O; the journal thread feeds it times and obeys it.

A group of journal records is written and fdatasync'ed at once when any of these holds:

- buffered bytes reached ``bytes_buffered_max`` (``journal_bytes_buffered_max``);
- the queue of submitted records is empty and ``flush_when_queue_empty`` is on (nothing more
  is coming right now, so waiting only adds latency: BookKeeper's
  ``journalFlushWhenQueueEmpty``);
- the oldest buffered record has waited ``group_wait_ms_max``.

Nothing buffered means nothing to flush, whatever else holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from pulsarlite.errors import ConfigError


@dataclass(frozen=True)
class GroupCommitPolicy:
    group_wait_ms_max: float
    bytes_buffered_max: int
    flush_when_queue_empty: bool = True

    def __post_init__(self) -> None:
        if not self.group_wait_ms_max > 0:
            raise ConfigError(f"group_wait_ms_max must be > 0, got {self.group_wait_ms_max}")
        if self.bytes_buffered_max <= 0:
            raise ConfigError(f"bytes_buffered_max must be > 0, got {self.bytes_buffered_max}")

    def should_flush(self, *, now_ms: float, oldest_ms: float | None, bytes_buffered: int,
                     queue_empty: bool) -> bool:
        """True when the buffered group must be written and synced now.

        ``oldest_ms`` is when the oldest buffered record was submitted (None: nothing buffered).
        """
        if oldest_ms is None:
            return False
        if bytes_buffered >= self.bytes_buffered_max:
            return True
        if queue_empty and self.flush_when_queue_empty:
            return True
        return now_ms - oldest_ms >= self.group_wait_ms_max

    def next_flush_delay_ms(self, *, now_ms: float, oldest_ms: float | None,
                            bytes_buffered: int, queue_empty: bool) -> float | None:
        """How long the writer may sleep before it must flush: 0.0 = flush now, None = nothing
        buffered (sleep until a record arrives)."""
        if oldest_ms is None:
            return None
        if self.should_flush(now_ms=now_ms, oldest_ms=oldest_ms, bytes_buffered=bytes_buffered,
                             queue_empty=queue_empty):
            return 0.0
        # same expression as should_flush's test, so "delay 0" and "flush now" always agree
        # (wait - age > 0 exactly when age < wait, in floats too); an oldest time in the
        # future (age < 0) still waits at most one window
        return min(self.group_wait_ms_max, self.group_wait_ms_max - (now_ms - oldest_ms))


def should_flush(*, now_ms: float, oldest_ms: float | None, bytes_buffered: int,
                 queue_empty: bool, group_wait_ms_max: float, bytes_buffered_max: int,
                 flush_when_queue_empty: bool = True) -> bool:
    """Functional form of :meth:`GroupCommitPolicy.should_flush`."""
    return GroupCommitPolicy(group_wait_ms_max, bytes_buffered_max, flush_when_queue_empty) \
        .should_flush(now_ms=now_ms, oldest_ms=oldest_ms, bytes_buffered=bytes_buffered,
                      queue_empty=queue_empty)


def next_flush_delay_ms(*, now_ms: float, oldest_ms: float | None, bytes_buffered: int,
                        queue_empty: bool, group_wait_ms_max: float, bytes_buffered_max: int,
                        flush_when_queue_empty: bool = True) -> float | None:
    """Functional form of :meth:`GroupCommitPolicy.next_flush_delay_ms`."""
    return GroupCommitPolicy(group_wait_ms_max, bytes_buffered_max, flush_when_queue_empty) \
        .next_flush_delay_ms(now_ms=now_ms, oldest_ms=oldest_ms, bytes_buffered=bytes_buffered,
                             queue_empty=queue_empty)

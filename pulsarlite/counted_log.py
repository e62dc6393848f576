"""Log lines for causes a client can repeat at will (a bad ack, an unsupported command, a refused
connection): one line per cause at a bounded rate, with the count, so that a flood of bad input
costs a few lines, never one per input ([hardening])."""

from __future__ import annotations


class CountedCause:
    """Occurrences of one cause; :meth:`due` says whether this one should be logged: the 1st,
    2nd, 4th, 8th, ... (log2 of the count lines in all)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def due(self) -> bool:
        self.count += 1
        return self.count & (self.count - 1) == 0


__all__ = ["CountedCause"]

"""The Spark source's one error hierarchy: every error the source raises on purpose is a
:class:`SparkSourceError` (a :class:`pulsarlite.errors.PulsarliteError`). A leaf module (imports
only the base floor), so every module of the source takes its errors from here.

A class exists where a user (or the source itself) reacts differently:

- :class:`OptionError`: an option is missing, malformed or out of its bounds (fix the read);
- :class:`SchemaMismatchError`: a user-given schema is not a projection of the source's columns;
- :class:`TopicNotFound`: a topic with no managed ledger in ZooKeeper (never written);
- :class:`DataLossError`: data the read was planned over is gone (retention, a ledger deleted
  since planning) and ``failOnDataLoss`` is true; :class:`CompactedViewGone`: the planned
  compacted view was replaced (fails whatever ``failOnDataLoss`` says: plan again).

The bad-input errors stay ``ValueError``s, as they were (callers and users catch them so);
``DataLossError`` is both a ``ValueError`` (the planner's, before the fold) and a
``RuntimeError`` (the reader's ``DataLoss``, folded into it). None is retriable as such: the
same read fails the same way until the user changes it (a CompactedViewGone read, planned
again, reads the new view).
"""

from __future__ import annotations

from pulsarlite.errors import PulsarliteError

SCHEMA_MISMATCH_ERROR_CLASS = "PULSARLITE_SCHEMA_MISMATCH"


class SparkSourceError(PulsarliteError):
    """Base of every error the Spark source raises on purpose."""


class OptionError(SparkSourceError, ValueError):
    """An option is missing, malformed, out of its bounds, or contradicts another one."""


class SchemaMismatchError(SparkSourceError, ValueError):
    """A user-given schema that is not a projection of the source's columns."""

    def __init__(self, message: str) -> None:
        super().__init__(f"[{SCHEMA_MISMATCH_ERROR_CLASS}] {message}")


class TopicNotFound(SparkSourceError, ValueError):
    """A topic with no managed ledger in ZooKeeper (never written)."""


class DataLossError(SparkSourceError, ValueError, RuntimeError):
    """Data the read was planned over is no longer stored (a start position deleted by
    retention; a ledger gone from the bookies since planning and not offloaded; an offloaded
    ledger without a URI) and the read was told to fail on data loss."""


class CompactedViewGone(DataLossError):
    """The compacted ledger planned is gone (a newer compaction replaced the view and deleted it,
    or the topic was deleted) since planning: the read fails (whatever failOnDataLoss says)
    rather than mix two views; planning again reads the new view."""


__all__ = ["CompactedViewGone", "DataLossError", "OptionError", "SchemaMismatchError", "SparkSourceError",
           "TopicNotFound"]

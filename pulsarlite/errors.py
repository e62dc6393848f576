"""The two kinds of failure (docs/architecture.md#style).

Broken invariants raise :class:`InvariantViolation` at once. Operating errors form the small
hierarchy under :class:`PulsarliteError`; each carries a ``retriable`` flag, and a class exists
only where a caller reacts differently.
"""

from __future__ import annotations


class InvariantViolation(AssertionError):
    """A broken invariant: a bug, never an operating condition. Not to be caught and retried."""


def check(condition: bool, message: str) -> None:
    """Raise InvariantViolation unless ``condition`` holds (explicit, unlike bare assert)."""
    if not condition:
        raise InvariantViolation(message)


class PulsarliteError(Exception):
    """Base of every operating error. ``server_error``: the Pulsar ``ServerError`` a client is
    told, for the errors that name theirs (None: the broker maps the class,
    ``broker.errors.server_error_of``)."""

    retriable: bool = False
    server_error: int | None = None


class ConfigError(PulsarliteError):
    """A configuration value is missing, malformed or out of its bounds."""


class MetadataError(PulsarliteError):
    """ZooKeeper is unreachable or a metadata operation failed."""

    retriable = True


class MetadataNotFoundError(MetadataError):
    retriable = False


class MetadataVersionConflict(MetadataError):
    """A compare-and-set lost the race; re-read and re-apply the transform."""


class BookieError(PulsarliteError):
    """An error answered by, or about, a bookie."""


class BookieUnavailableError(BookieError):
    """The bookie cannot be reached or is shutting down."""

    retriable = True


class NotEnoughBookiesError(BookieError):
    """Fewer writable bookies than the ledger needs; may clear when bookies come back."""

    retriable = True


class ReadOnlyBookieError(BookieError):
    retriable = True


class LedgerFencedError(BookieError):
    """The ledger was fenced by a recovery: this writer may never append to it again."""


class LedgerClosedError(BookieError):
    """An add to a ledger that is already closed."""


class NoSuchLedgerError(BookieError):
    pass


class NoSuchEntryError(BookieError):
    pass


class ChecksumError(BookieError):
    """CRC32C mismatch on bytes read from disk, network or tier (invariant 8)."""


class BadRequestError(BookieError):
    """A malformed or oversized request; the bookie rejected it and changed nothing."""


class TimeoutError_(PulsarliteError):
    """A bounded wait ran out."""

    retriable = True

"""The offload component's one error hierarchy: every operating error of an offload module is a
:class:`TierError` (a :class:`pulsarlite.errors.PulsarliteError`). A leaf module: it imports only
the base floor.

The classes live beside the code that raises them, each deriving from TierError; a class exists
where a caller reacts differently, and ``retriable`` says whether the same step may succeed on
a later pass:

- ``offload.shell.OffloadError`` (retriable): a step failed (object store, bookies,
  verification); the machine goes idle and a later pass tries again.
  ``offload.shell.CorruptObjectError``: the object does not match its record (invariant 6).
- ``offload.store.ObjectStoreError`` (``retriable`` per failure: transient vs configuration),
  ``offload.store.ObjectNotFoundError`` (not retriable).
- ``offload.format.TierFormatError``: an object that does not decode as the tier format.
  ``offload.format.TierChecksumError``: a checksum that does not match; it is also a
  ``pulsarlite.errors.ChecksumError`` (readers treat every checksum mismatch alike, invariant 8).
- ``offload.lake.LakeError``: a table operation failed; retried on the next offloader pass.

Outside on purpose: ``offload.typed_columns.TypedColumnsError`` (a ``ValueError`` of a pure
schema translation; ``offload.tier`` degrades to an object without typed columns on it, and its
``except PulsarliteError: raise`` would make it fail the offload instead) and the private
``offload.format._InvalidText`` (control flow inside its module).
"""

from __future__ import annotations

from pulsarlite.errors import PulsarliteError


class TierError(PulsarliteError):
    """Base of every operating error of the offload component (the tier)."""


__all__ = ["TierError"]

"""The Pulsar binary protocol (floor 1, pure, no I/O).

- :mod:`pulsarlite.wire.frames`: framing, :class:`~pulsarlite.wire.frames.FrameDecoder`.
- :mod:`pulsarlite.wire.commands`: builders of every command we send, as encoded frames.
- :mod:`pulsarlite.wire.entry`: the ONE entry codec (metadata, batches, compression).
- :mod:`pulsarlite.wire.columnar`: its columnar half: batches of plain messages split into
  Arrow arrays (the tier format's rows); imports pyarrow, which the entry codec does not.
- :mod:`pulsarlite.wire.compacted`: the compacted-ledger entry codec.
- ``pb``: the generated protobuf module (pulsarlite/_proto/pulsar_api_pb2.py).
"""

from pulsarlite._proto import pulsar_api_pb2 as pb

__all__ = ["pb"]

"""The Pulsar binary protocol (floor 1, pure, no I/O).

- :mod:`pulsarlite.wire.frames`: framing, :class:`~pulsarlite.wire.frames.FrameDecoder`.
- :mod:`pulsarlite.wire.commands`: builders of every command we send, as encoded frames.
- :mod:`pulsarlite.wire.entry`: the ONE entry codec (metadata, batches, compression).
- ``pb``: the generated protobuf module (pulsarlite/_proto/pulsar_api_pb2.py).
"""

from pulsarlite._proto import pulsar_api_pb2 as pb

__all__ = ["pb"]

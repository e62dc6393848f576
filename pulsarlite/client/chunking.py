"""Chunked messages: the producer's split and the consumer's reassembly, pure (no I/O, no clock).

Protocol (Pulsar's, as the official producers write it): a producer with chunking on and
batching off splits a message whose (compressed) payload is larger than the broker's maximum
message size into ``num_chunks_from_msg`` chunks; each is one SEND, one entry, with its own
sequence id, and the same ``uuid`` (``<producer name>-<sequence id of the message>``),
``total_chunk_msg_size`` (the whole compressed payload) and every other metadata field of the
message; ``chunk_id`` counts 0, 1, ... The broker stores and dispatches chunks as ordinary
entries, so chunks of different producers, and plain messages, may lie between them.

The consumer (:class:`ChunkAssembler`) joins the chunks of one uuid in chunk order and hands
out one message whose id names every chunk entry (acking it acks them all). What it cannot
join it drops as Pulsar's consumer (Java ``ConsumerImpl.processMessageChunk``) does:

- a chunk that is not the next one expected (its first chunk was never seen, or one is
  missing): the partial message is dropped (its chunks left unacked: they come back on
  redelivery), and so is this chunk, acked instead when it is older than the expiry (published
  more than ``expire_incomplete_ms`` ago: it can never be completed);
- a chunk already held again (a producer's resend): acked, the partial message kept;
- a first chunk again for a uuid held (the producer resent the whole message): the older
  copy's chunks are acked (the new copy replaces them), the new copy starts;
- more than ``pending_messages_max`` partial messages: the oldest is dropped, acked if
  ``auto_ack_oldest_on_queue_full`` (lost for this subscription, as in Pulsar), else left
  unacked (redelivered later);
- a partial message whose first chunk arrived ``expire_incomplete_ms`` ago (0: never): dropped
  and acked (Java's ``removeExpireIncompleteChunkedMessages``);
- chunks that disagree with their first (sizes, counts) or overrun the declared total: the
  message is corrupt and acked away, as the client's other undecodable entries are.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

Position = tuple[int, int]     # (ledger id, entry id) of one chunk entry


@dataclass(frozen=True)
class ChunkingConfig:
    """The consumer's reassembly bounds (Pulsar's consumer options of the same meaning)."""

    pending_messages_max: int = 10            # max_pending_chunked_message (0: no bound)
    auto_ack_oldest_on_queue_full: bool = False
    expire_incomplete_ms: int = 60_000        # expire_time_of_incomplete_chunked_message_ms
    message_bytes_max: int = 512 * 1024 * 1024    # a whole reassembled message

    def __post_init__(self) -> None:
        if self.pending_messages_max < 0:
            raise ValueError("max_pending_chunked_message must be >= 0 (0: no bound)")
        if self.expire_incomplete_ms < 0:
            raise ValueError("expire_time_of_incomplete_chunked_message_ms must be >= 0 (0: never)")
        if self.message_bytes_max <= 0:
            raise ValueError("the reassembled message bound must be > 0")


@dataclass(frozen=True)
class Chunk:
    """One chunk entry as received (an event for :meth:`ChunkAssembler.on_chunk`).
    ``context`` is whatever the shell needs to build the message from its first chunk (the
    entry's metadata); the core never looks inside it."""

    uuid: str
    chunk_id: int
    chunks: int                   # num_chunks_from_msg
    total_bytes: int              # total_chunk_msg_size
    position: Position
    publish_time_ms: int
    payload: bytes
    context: Any = None


class Why(enum.Enum):
    """Why chunks are dropped (logged by the shell)."""

    OUT_OF_ORDER = "out_of_order"             # not the next chunk of a held message
    DUPLICATE = "duplicate"                   # a chunk already held, sent again
    SUPERSEDED = "superseded"                 # a new first chunk for a held uuid
    QUEUE_FULL = "queue_full"                 # pending_messages_max partial messages held
    EXPIRED = "expired"                       # incomplete for expire_incomplete_ms
    CORRUPT = "corrupt"                       # chunk fields disagree or overrun the total


@dataclass(frozen=True)
class Deliver:
    """Every chunk of a message arrived: hand out one message (``payload``: the chunks'
    payloads joined; still compressed if the message was) built from the first chunk's
    ``context``; ``positions`` are every chunk entry, in chunk order."""

    uuid: str
    positions: tuple[Position, ...]
    payload: bytes
    context: Any


@dataclass(frozen=True)
class Ack:
    """Drop these chunk entries and acknowledge them (they can never form a message)."""

    uuid: str
    positions: tuple[Position, ...]
    why: Why


@dataclass(frozen=True)
class Release:
    """Drop these chunk entries, unacknowledged: the broker redelivers them after a
    redelivery request or a reconnection."""

    uuid: str
    positions: tuple[Position, ...]
    why: Why


Action = Deliver | Ack | Release


@dataclass
class _Partial:
    first: Chunk
    received_ms: int
    positions: list[Position] = field(default_factory=list)
    parts: list[bytes] = field(default_factory=list)
    size: int = 0

    @property
    def last_chunk_id(self) -> int:
        return len(self.positions) - 1


class ChunkAssembler:
    """The consumer's reassembly of chunked messages (see the module docstring). Events:
    :meth:`on_chunk`, :meth:`on_time`, :meth:`clear`; each returns the actions to execute.
    Holds at most ``pending_messages_max`` partial messages (when > 0), each at most its
    declared total size."""

    def __init__(self, config: ChunkingConfig) -> None:
        self.config = config
        self._partials: OrderedDict[str, _Partial] = OrderedDict()   # oldest first

    def __len__(self) -> int:
        return len(self._partials)

    def held_positions(self) -> list[Position]:
        return [p for partial in self._partials.values() for p in partial.positions]

    def deadline_ms(self) -> int | None:
        """When :meth:`on_time` next has something to expire (None: nothing held or no expiry)."""
        if not self._partials or not self.config.expire_incomplete_ms:
            return None
        return min(p.received_ms for p in self._partials.values()) + self.config.expire_incomplete_ms

    def clear(self) -> list[Action]:
        """Forget every partial message, unacked (the consumer asked for redelivery of
        everything unacked, or reconnected: the broker sends these chunks again)."""
        out = [Release(uuid, tuple(p.positions), Why.OUT_OF_ORDER) for uuid, p in self._partials.items()]
        self._partials.clear()
        return out

    def on_time(self, now_ms: int) -> list[Action]:
        expire_ms = self.config.expire_incomplete_ms
        if not expire_ms:
            return []
        out: list[Action] = []
        for uuid in [u for u, p in self._partials.items() if now_ms >= p.received_ms + expire_ms]:
            out.append(Ack(uuid, tuple(self._partials.pop(uuid).positions), Why.EXPIRED))
        return out

    def on_chunk(self, chunk: Chunk, now_ms: int) -> list[Action]:
        out: list[Action] = []
        if not (chunk.uuid and 0 <= chunk.chunk_id < chunk.chunks and chunk.total_bytes >= 0):
            return [Ack(chunk.uuid, (chunk.position,), Why.CORRUPT)]
        partial = self._partials.get(chunk.uuid)
        if chunk.chunk_id == 0:
            if partial is not None:
                del self._partials[chunk.uuid]
                if chunk.position in partial.positions:    # the same entry again: keep it unacked
                    out.append(Release(chunk.uuid, tuple(partial.positions), Why.SUPERSEDED))
                else:
                    out.append(Ack(chunk.uuid, tuple(partial.positions), Why.SUPERSEDED))
            if chunk.total_bytes > self.config.message_bytes_max:
                out.append(Ack(chunk.uuid, (chunk.position,), Why.CORRUPT))
                return out
            bound = self.config.pending_messages_max
            while bound and len(self._partials) >= bound:
                uuid, oldest = self._partials.popitem(last=False)
                why = Why.QUEUE_FULL
                out.append(Ack(uuid, tuple(oldest.positions), why)
                           if self.config.auto_ack_oldest_on_queue_full
                           else Release(uuid, tuple(oldest.positions), why))
            partial = self._partials[chunk.uuid] = _Partial(chunk, now_ms)
        elif partial is None or chunk.chunk_id != partial.last_chunk_id + 1:
            if partial is not None and chunk.chunk_id <= partial.last_chunk_id:
                out.append(Ack(chunk.uuid, (chunk.position,), Why.DUPLICATE))
                return out
            if partial is not None:
                del self._partials[chunk.uuid]
                out.append(Release(chunk.uuid, tuple(partial.positions), Why.OUT_OF_ORDER))
            expire_ms = self.config.expire_incomplete_ms
            if expire_ms and now_ms > chunk.publish_time_ms + expire_ms:
                out.append(Ack(chunk.uuid, (chunk.position,), Why.OUT_OF_ORDER))
            else:
                out.append(Release(chunk.uuid, (chunk.position,), Why.OUT_OF_ORDER))
            return out
        first = partial.first
        size = partial.size + len(chunk.payload)
        if chunk.chunks != first.chunks or chunk.total_bytes != first.total_bytes \
                or size > first.total_bytes:
            del self._partials[chunk.uuid]
            out.append(Ack(chunk.uuid, (*partial.positions, chunk.position), Why.CORRUPT))
            return out
        partial.positions.append(chunk.position)
        partial.parts.append(chunk.payload)
        partial.size = size
        if chunk.chunk_id == chunk.chunks - 1:
            del self._partials[chunk.uuid]
            if size != first.total_bytes:
                out.append(Ack(chunk.uuid, tuple(partial.positions), Why.CORRUPT))
            else:
                out.append(Deliver(chunk.uuid, tuple(partial.positions), b"".join(partial.parts),
                                   first.context))
        return out


def split_payload(payload_bytes: int, chunk_bytes_max: int) -> list[tuple[int, int]]:
    """The producer's split: [start, end) byte ranges of each chunk of a payload of
    ``payload_bytes`` (at least one chunk, each at most ``chunk_bytes_max``)."""
    if chunk_bytes_max <= 0:
        raise ValueError("chunk size must be > 0")
    if payload_bytes <= chunk_bytes_max:
        return [(0, payload_bytes)]
    return [(start, min(start + chunk_bytes_max, payload_bytes))
            for start in range(0, payload_bytes, chunk_bytes_max)]

"""[hardening] Fuzzing the broker's binary port (Pulsar protocol) while the canary produces and
consumes: random bytes, truncated frames and wrong sizes, commands before CONNECT, CONNECT with
random fields, every command type with random field values (huge and "negative" uint64 ids,
empty names, names with newlines, very long strings), protobuf bytes mutated inside
well-sized frames, unsupported and unknown command types (past the per-connection limit),
producer sessions sending valid and corrupt SENDs (checksums, metadata, batches, compression),
consumer sessions with random flows, acks, seeks and redeliveries, pipelined frames, half
closes, and bursts of connections.

The fuzzer's own checks (findings): every request that carries a request id is answered (or
its connection closed) within ANSWER_TIMEOUT_S; a SEND is answered (receipt or error) or its
connection closed; a SEND whose checksum does not match is never acknowledged with a receipt;
a frame that is not CONNECT before CONNECT closes the connection; the broker never writes bytes
that do not decode as frames; an open connection answers PING after each session.

Replay: PULSARLITE_FUZZ_SEED=<seed> [PULSARLITE_FUZZ_CASES=<n>] pytest tests/fuzz/test_fuzz_broker_port.py
"""

from __future__ import annotations

import json
import random
import re
import struct
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

pulsar = pytest.importorskip("pulsar")

from pulsarlite.checksum import crc32c_of  # noqa: E402
from pulsarlite.wire import commands as c  # noqa: E402
from pulsarlite.wire.commands import signed64  # noqa: E402
from pulsarlite.wire import pb  # noqa: E402
from pulsarlite.wire.entry import (Compression, Message, build_batch_entry, build_entry, decompress,  # noqa: E402
                                   unpack_entry)
from pulsarlite.wire.frames import FrameDecoder, FrameError, decode_frame  # noqa: E402

from .conftest import BOOKIE_OVERRIDES, BROKER_OVERRIDES  # noqa: E402
from .harness import (KNOWN_PREFIX, Budget, Findings, FuzzChecks, FuzzResult, Journal, Sockets,  # noqa: E402
                      fuzz_timeout_s, i32, mutate_bytes, random_bytes, random_message, recv_available, run_fuzz,
                      send_quietly, u32, u64, weird_string)

pytestmark = [pytest.mark.integration, pytest.mark.fuzz, pytest.mark.timeout(fuzz_timeout_s())]

T = pb.BaseCommand
TARGET = "broker"
ANSWER_TIMEOUT_S = 10.0
CASE_SECONDS_MAX = 12.0          # a case stops waiting for answers after this long

READ_BACK_TOPICS_MAX = 12
READ_BACK_PARALLEL = 6
READ_BACK_S = 10.0            # per topic: a reader stuck behind a poison entry waits this long
READ_BACK_START_S = 20.0      # and its child process gets this much more to start (imports, connect) on a busy machine

# Defect poison-entry (fixed: check_sendable, tests/fuzz/NOTES.md; the two test_poison_entry_* tests pin it): on a SEND the
# broker checks only the MessageMetadata's three top-level required fields and a batch's declared
# count (pulsarlite/wire/entry.py _parse_metadata, check_sendable), and stores entries the official
# C++ client cannot read: a required field missing inside the metadata (e.g. a property without
# its value) makes every official consumer or reader of the topic fail "Error parsing message
# metadata", reconnect, get the same entry again, forever (10 reconnects a second; nothing after
# that entry is ever delivered); a batch whose inner framing is inconsistent (a
# SingleMessageMetadata without payload_size, a payload_size beyond the batch) makes the C++
# client read out of bounds: it hands the application bytes of its own heap, or crashes (SIGSEGV).
POISON_ENTRY = "poison-entry"

# poison-reader (closed; tests/fuzz/NOTES.md item 6): official readers that crashed, or handed out
# more bytes than an entry holds, on topics holding an entry pulsarlite's own codec refuses. Two
# classes were the broker's (compressed single messages that do not decompress to their declared
# size, lone chunks with impossible chunk fields: refused at the SEND since), the last one the
# fuzzer's (seed 1697072319: two pending SENDs of one sequence id, whose answers it swapped; see
# Conn.submit). A reader crash or an over-long message is a finding on any topic now.

# Defect poison-lz4 (fixed; tests/fuzz/NOTES.md; test_poison_lz4_single_message_is_refused):
# check_sendable did not decompress a compressed single (non-batched) message, and the official
# C++ reader sometimes crashed on an LZ4 one that does not decompress (SIGSEGV; seed 83386254,
# case 122: an LZ4 message declaring 127 bytes with 75 random ones). The broker now decompresses
# a single LZ4 message at the SEND (bounded) and refuses it.
POISON_LZ4 = "poison-lz4"


def lz4_single_poison(poison: bool, metadata: str) -> bool:
    """An acknowledged entry of defect POISON_LZ4 (by its ``metadata_fields`` description)."""
    names = metadata.split("|", 1)[0].split()
    return poison and "compression=LZ4" in metadata and "num_messages_in_batch" not in names

# the sub-message of BaseCommand for each command type (Pulsar keeps field number == type)
FIELD_OF_TYPE = {f.number: f.name for f in T.DESCRIPTOR.fields if f.message_type is not None}
ALL_TYPES = sorted(FIELD_OF_TYPE)
SERVICE_TYPES = [T.LOOKUP, T.PARTITIONED_METADATA, T.PRODUCER, T.SEND, T.CLOSE_PRODUCER, T.SUBSCRIBE,
                 T.FLOW, T.ACK, T.REDELIVER_UNACKNOWLEDGED_MESSAGES, T.UNSUBSCRIBE, T.CLOSE_CONSUMER,
                 T.SEEK, T.GET_LAST_MESSAGE_ID, T.GET_SCHEMA, T.GET_OR_CREATE_SCHEMA,
                 T.GET_TOPICS_OF_NAMESPACE, T.CONSUMER_STATS, T.PING]
UNSUPPORTED_TYPES = [T.AUTH_CHALLENGE, T.NEW_TXN, T.ADD_PARTITION_TO_TXN, T.ADD_SUBSCRIPTION_TO_TXN, T.END_TXN,
                     T.END_TXN_ON_PARTITION, T.END_TXN_ON_SUBSCRIPTION, T.TC_CLIENT_CONNECT_REQUEST,
                     T.WATCH_TOPIC_LIST, T.WATCH_TOPIC_LIST_CLOSE, T.TOPIC_MIGRATED, T.CONNECTED,
                     T.PRODUCER_SUCCESS, T.SEND_RECEIPT, T.SEND_ERROR, T.MESSAGE, T.LOOKUP_RESPONSE,
                     T.REACHED_END_OF_TOPIC, T.ACTIVE_CONSUMER_CHANGE]
# requests the broker must answer (with a response carrying the request id, or ERROR)
ANSWERED_TYPES = {T.LOOKUP, T.PARTITIONED_METADATA, T.PRODUCER, T.CLOSE_PRODUCER, T.SUBSCRIBE, T.UNSUBSCRIBE,
                  T.CLOSE_CONSUMER, T.SEEK, T.GET_LAST_MESSAGE_ID, T.GET_SCHEMA, T.GET_OR_CREATE_SCHEMA,
                  T.GET_TOPICS_OF_NAMESPACE, T.CONSUMER_STATS}


# -- names the fuzzer uses (never the canary's topic) -----------------------------------------------
class Pools:
    def __init__(self, seed: int) -> None:
        rng = random.Random(f"pools/{seed}")
        self.topics = ([f"persistent://public/default/fz-{k}" for k in range(4)]
                       + ["fz-short", "public/default/fz-2", "persistent://public/default/fz-p-partition-3",
                          "persistent://fz-tenant/fz-ns/t", "non-persistent://public/default/fz-np",
                          "persistent://public/default/" + "y" * 2000,
                          "persistent://public/default/fz-" + "\u00e9\U0001f642"]
                       + [weird_string(rng) for _ in range(8)])
        self.namespaces = ["public/default", "fz-tenant/fz-ns", "public", "", "a/b/c", "public/\n"] + [
            weird_string(rng) for _ in range(4)]
        self.subscriptions = ["fz-sub-0", "fz-sub-1", "fz-sub-2", "", " ", "a\nb", "x" * 1025, "\U0001f642",
                              "fz sub"] + [weird_string(rng) for _ in range(3)]
        self.names = ["fz-producer-0", "fz-producer-1", "", "a\nb", "n" * 5000] + [weird_string(rng)
                                                                                   for _ in range(3)]

    def string(self, rng: random.Random, f) -> str:
        name = f.name
        if name == "topic":
            return rng.choice(self.topics)
        if name == "namespace":
            return rng.choice(self.namespaces)
        if name == "subscription":
            return rng.choice(self.subscriptions)
        if name in ("producer_name", "consumer_name"):
            return rng.choice(self.names)
        return weird_string(rng)


# -- a minimal client of the binary protocol ----------------------------------------------------------
class Conn:
    def __init__(self, sockets: Sockets, port: int, findings: Findings, what: str, case_deadline: float) -> None:
        self.sock = sockets.connect(port)
        self.decoder = FrameDecoder()
        self.frames: list = []
        self.closed = False
        self.findings = findings
        self.what = what
        self.case_deadline = case_deadline
        self.cut_short = False          # a wait ended at the case's deadline, not its own timeout
        self.pending: list = []      # PendingSends written, their answers not waited for yet (submit, drain)
        self.receipts: list = []     # ((ledger, entry), StoredSend) of each SEND_RECEIPT waited for

    def send(self, data: bytes) -> bool:
        ok = send_quietly(self.sock, data)
        if not ok:
            self.closed = True
        return ok

    def pump(self, timeout_s: float) -> None:
        data, closed = recv_available(self.sock, timeout_s, return_on_data=True)
        if data and self.decoder is not None:
            try:
                self.frames += self.decoder.feed(data)
            except FrameError as e:
                self.findings.add("the broker wrote bytes that do not decode as frames", f"{self.what}: {e}")
                self.decoder = None
        self.closed |= closed

    def wait(self, match, timeout_s: float = ANSWER_TIMEOUT_S):
        """The first frame ``match`` accepts; None once closed, undecodable or out of time."""
        own = time.monotonic() + timeout_s
        deadline = min(own, self.case_deadline)
        while True:
            for i, frame in enumerate(self.frames):
                if match(frame):
                    return self.frames.pop(i)
            now = time.monotonic()
            left = deadline - now
            if self.closed or self.decoder is None or left <= 0:
                if left <= 0 and deadline < own:
                    self.cut_short = True
                return None
            self.pump(min(0.1, left))

    def silent(self) -> bool:
        """After a wait that returned None: the broker neither answered nor closed in time."""
        return not self.closed and self.decoder is not None and not self.cut_short

    def handshake(self, protocol_version: int = 21) -> bool:
        if not self.send(c.connect("fuzz-client", protocol_version)):
            return False
        got = self.wait(lambda f: f.type in (T.CONNECTED, T.ERROR))
        return got is not None and got.type == T.CONNECTED

    def expect_answer(self, request_id: int, what: str) -> object:
        """A response with this request id (or an ERROR), or the connection closed; else a finding."""
        got = self.wait(lambda f: request_id_of(f.command) == request_id)
        if got is None and self.silent():
            self.findings.add("a request was never answered", f"{self.what}: {what} (request id {request_id}) "
                              f"unanswered after {ANSWER_TIMEOUT_S:.0f}s")
        return got

    def expect_send_answer(self, send: "PendingSend") -> bool:
        """Waits for the SEND's answer (a finding if none comes); False if none came."""
        producer_id, sequence_id, what, bad_checksum = send.producer_id, send.sequence_id, send.what, send.bad
        def match(f) -> bool:
            if f.type == T.SEND_RECEIPT:
                return f.command.send_receipt.producer_id == producer_id and \
                    f.command.send_receipt.sequence_id == sequence_id
            if f.type == T.SEND_ERROR:
                return f.command.send_error.producer_id == producer_id and \
                    f.command.send_error.sequence_id == sequence_id
            return f.type == T.ERROR
        got = self.wait(match)
        if got is None:
            send.answer = "none"
            if self.silent():
                self.findings.add("a SEND was never answered", f"{self.what}: {what} unanswered after "
                                  f"{ANSWER_TIMEOUT_S:.0f}s")
            return False
        self.findings.note(f"send->{T.Type.Name(got.type)}")
        send.answer = T.Type.Name(got.type)
        if got.type == T.SEND_RECEIPT:
            mid = got.command.send_receipt.message_id
            send.answer += f" {signed64(mid.ledgerId)}:{signed64(mid.entryId)}"
            if mid.ledgerId < 2**63 and mid.entryId < 2**63:     # not a duplicate's -1:-1
                self.receipts.append(((mid.ledgerId, mid.entryId), send.stored()))
        if bad_checksum and got.type == T.SEND_RECEIPT:
            self.findings.add("a SEND with a wrong checksum was acknowledged (stored)", f"{self.what}: {what}")
        return True

    def submit(self, send: "PendingSend") -> bool:
        """Writes a SEND frame, pending until :meth:`drain` waits for its answer. An answer names
        its SEND by (producer id, sequence id) only, and the broker answers a SEND it refuses at
        the edge (a bad checksum, an unknown producer, an entry check_sendable refuses) at once,
        before the receipts of SENDs still being stored: with two SENDs of one id pending, whose
        answer is whose could not be told (seed 1697072319, case 77: a valid SEND and a refused
        "metadata size rewritten" one, both sequence id 2001, were swapped, and the refused
        bytes were taken for the stored entry: tests/fuzz/NOTES.md item 6). So no id is
        pending twice: the answers pending are waited for first (and before a bad checksum,
        answered at once too). False if one of them never came (nothing written then)."""
        ids = (send.producer_id, send.sequence_id)
        if send.bad or any((p.producer_id, p.sequence_id) == ids for p in self.pending):
            if not self.drain():
                return False
        self.send(send.frame)
        self.pending.append(send)
        return True

    def drain(self) -> bool:
        """Waits for the answers of the pending SENDs (each found by its ids, whatever their
        order); False if one never came (the others wait behind it: one finding is enough)."""
        while self.pending:
            send = self.pending.pop(0)
            if not self.expect_send_answer(send):
                self.pending.clear()
                return False
            if self.closed:
                self.pending.clear()
                break
        return True

    def ping_ok(self) -> None:
        """An open, connected connection answers PING."""
        if self.closed or self.decoder is None:
            return
        if not self.send(c.ping()):
            return
        got = self.wait(lambda f: f.type == T.PONG)
        if got is None and self.silent():
            self.findings.add("an open connection stopped answering PING", self.what)


@dataclass
class PendingSend:
    producer_id: int
    sequence_id: int
    what: str
    bad: bool                  # a wrong checksum: must not be acknowledged
    frame: bytes               # the SEND frame as written to the broker, length prefix included
    answer: str = "?"          # what the broker answered (for the journal)

    def stored(self) -> "StoredSend":
        """What the broker stores for this SEND once acknowledged: the entry its frame decoder
        cuts out of the frame (after any broker entry metadata and checksum), not the entry the
        fuzzer built (they differ when the frame's framing says otherwise)."""
        frame = decode_frame(self.frame)
        entry = bytes(frame.entry) if frame.entry is not None else b""
        return StoredSend(self.what, self.frame, entry, is_poison(entry), metadata_fields(entry))


@dataclass(frozen=True)
class StoredSend:
    """An entry the broker acknowledged to the fuzzer (dumped in hex when a reader fails on its topic)."""
    what: str
    frame: bytes               # the SEND frame as sent
    entry: bytes               # the entry the broker stored (decode_frame(frame).entry)
    poison: bool               # the official client cannot read it (see POISON_ENTRY, is_poison)
    metadata: str              # the MessageMetadata fields set (for reports)


def request_id_of(command) -> int | None:
    """The request id in the sub-message of the command's own type (a command may carry others)."""
    name = FIELD_OF_TYPE.get(command.type)
    if name is None or not command.HasField(name):
        return None
    body = getattr(command, name)
    if "request_id" in body.DESCRIPTOR.fields_by_name and body.HasField("request_id"):
        return body.request_id
    return None


def frame_of(command, entry: bytes | None = None, *, checksum: int | None = None,
             with_checksum: bool = True) -> bytes:
    """A frame around a possibly incomplete command (required fields may be missing)."""
    body = command.SerializePartialToString()
    extra = b""
    if entry is not None:
        if with_checksum:
            extra = struct.pack(">HI", 0x0E01, crc32c_of(entry) if checksum is None else checksum)
        extra += entry
    return struct.pack(">II", 4 + len(body) + len(extra), len(body)) + body + extra


def raw_frame(command_bytes: bytes, tail: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(command_bytes) + len(tail), len(command_bytes)) + command_bytes + tail


def random_command(rng: random.Random, pools: Pools, kind: int | None = None):
    kind = rng.choice(SERVICE_TYPES + ALL_TYPES) if kind is None else kind
    command = T(type=kind)
    if kind not in FIELD_OF_TYPE:      # types of newer protocols this codec has no message for
        return command
    body_class = getattr(command, FIELD_OF_TYPE[kind]).__class__
    body = random_message(rng, body_class, strings=pools.string)
    getattr(command, FIELD_OF_TYPE[kind]).CopyFrom(body)
    if rng.random() < 0.05:            # a second, unrelated sub-message
        other = rng.choice(ALL_TYPES)
        if other != kind:
            getattr(command, FIELD_OF_TYPE[other]).CopyFrom(
                random_message(rng, getattr(command, FIELD_OF_TYPE[other]).__class__, strings=pools.string))
    return command


# -- entries for SEND -----------------------------------------------------------------------------
def valid_entry(rng: random.Random, producer: str, seq: int) -> bytes:
    payload = random_bytes(rng, rng.choice((0, 1, 10, 100, 1000)))
    if rng.random() < 0.3:
        n = rng.randrange(1, 6)
        return build_batch_entry([random_bytes(rng, rng.randrange(0, 50)) for _ in range(n)], producer_name=producer,
                                 sequence_id=seq, publish_time_ms=int(time.time() * 1000),
                                 compression=rng.choice(list(Compression)))
    return build_entry(Message(payload=payload, key=rng.choice((None, "k", ""))), producer_name=producer,
                       sequence_id=seq, publish_time_ms=int(time.time() * 1000),
                       compression=rng.choice(list(Compression)))


def corrupt_entry(rng: random.Random, producer: str, seq: int, pools: Pools) -> tuple[str, bytes]:
    r = rng.randrange(8)
    if r == 0:
        n = rng.randrange(0, 200)
        return "random metadata bytes", struct.pack(">I", n) + random_bytes(rng, n) + random_bytes(rng, 10)
    if r == 1:
        good = valid_entry(rng, producer, seq)
        return "metadata size rewritten", struct.pack(">I", u32(rng)) + good[4:]
    if r == 2:
        good = valid_entry(rng, producer, seq)
        (size,) = struct.unpack_from(">I", good)
        meta = mutate_bytes(rng, good[4:4 + size])
        return "metadata bytes mutated", struct.pack(">I", len(meta)) + meta + good[4 + size:]
    if r == 3:
        meta = random_message(rng, pb.MessageMetadata, strings=pools.string, optional_p=0.4)
        raw = meta.SerializePartialToString()
        return "random MessageMetadata fields", struct.pack(">I", len(raw)) + raw + random_bytes(rng, rng.randrange(0, 300))
    if r == 4:
        meta = pb.MessageMetadata(producer_name=producer, sequence_id=seq, publish_time=1,
                                  compression=rng.choice((1, 2, 3, 4)),
                                  uncompressed_size=rng.choice((0, 1, 2**31 - 1, 2**32 - 1, 100)))
        raw = meta.SerializeToString()
        return "compressed garbage", struct.pack(">I", len(raw)) + raw + random_bytes(rng, rng.randrange(0, 200))
    if r == 5:
        meta = pb.MessageMetadata(producer_name=producer, sequence_id=seq, publish_time=1,
                                  num_messages_in_batch=rng.choice((0, 1, 2, 1000, 2**31 - 1)))
        raw = meta.SerializeToString()
        single = random_message(rng, pb.SingleMessageMetadata).SerializePartialToString()
        payload = struct.pack(">I", rng.choice((len(single), u32(rng)))) + single + random_bytes(rng, rng.randrange(0, 50))
        return "batch with a bad count or single metadata", struct.pack(">I", len(raw)) + raw + payload
    if r == 6:
        good = valid_entry(rng, producer, seq)
        return "entry mutated", mutate_bytes(rng, good)
    meta = pb.MessageMetadata(producer_name=producer, sequence_id=seq, publish_time=1)
    meta.encryption_keys.add(key="k", value=b"v")
    raw = meta.SerializeToString()
    return "encrypted entry", struct.pack(">I", len(raw)) + raw + b"x"


# -- the cases ------------------------------------------------------------------------------------
class BrokerFuzzer:
    def __init__(self, port: int, budget: Budget) -> None:
        self.port = port
        self.pools = Pools(budget.seed)
        # topic -> {(ledger, entry): StoredSend} of every entry acknowledged
        self.stored: dict[str, dict[tuple[int, int], StoredSend]] = {}
        self.kinds = [
            (self.random_bytes, 6), (self.before_connect, 6), (self.connect_fields, 4), (self.bad_sizes, 6),
            (self.truncated, 4), (self.random_commands, 14), (self.mutated_commands, 10),
            (self.unsupported, 4), (self.producer_session, 14), (self.consumer_session, 10),
            (self.names, 6), (self.pipeline, 3), (self.half_close, 3), (self.burst, 2),
        ]

    def __call__(self, rng: random.Random, index: int, findings: Findings, journal: Journal) -> None:
        kinds, weights = zip(*self.kinds)
        kind = rng.choices(kinds, weights)[0]
        self.case_deadline = time.monotonic() + CASE_SECONDS_MAX
        with Sockets() as sockets:
            try:
                what = kind(rng, sockets, findings, f"case {index} {kind.__name__}")
            except (ConnectionError, TimeoutError) as e:
                what = f"connection error {type(e).__name__}"
                findings.note(f"{kind.__name__}: connect failed")
            journal.case(index, f"{kind.__name__}: {what}")
            findings.note(kind.__name__)
            sockets.close_all(rng)

    def conn(self, sockets: Sockets, findings: Findings, what: str) -> Conn:
        return Conn(sockets, self.port, findings, what, self.case_deadline)

    # raw bytes -------------------------------------------------------------------------------
    def random_bytes(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        connected = rng.random() < 0.5 and conn.handshake()
        data = random_bytes(rng, rng.choice((1, 3, 4, 8, 9, 64, 1000, rng.randrange(1, 5000))))
        conn.send(data)
        conn.pump(0.05)
        return f"connected={connected} {len(data)} random bytes {data[:16].hex()}"

    def before_connect(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        command = random_command(rng, self.pools, rng.choice([t for t in ALL_TYPES if t != T.CONNECT]))
        frame = frame_of(command, random_bytes(rng, 20) if command.type == T.SEND else None)
        conn.send(frame)
        closed = conn.wait(lambda f: False, 3.0) is None and conn.closed
        if not closed:
            findings.add("a frame other than CONNECT before CONNECT did not close the connection",
                         f"{what}: {T.Type.Name(command.type)} ({len(frame)} bytes)")
        return f"{T.Type.Name(command.type)} before CONNECT, closed={closed}"

    def connect_fields(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        body = random_message(rng, pb.CommandConnect, strings=self.pools.string)
        body.protocol_version = rng.choice((i32(rng), 21, 0, -1, 6, 5, 999))
        conn.send(frame_of(T(type=T.CONNECT, connect=body)))
        got = conn.wait(lambda f: f.type in (T.CONNECTED, T.ERROR))
        if got is None and conn.silent():
            findings.add("a CONNECT was never answered", f"{what}: {str(body)[:300]!r}")
        if got is not None and got.type == T.CONNECTED:
            conn.ping_ok()
            if rng.random() < 0.3:   # a second CONNECT: refused and closed
                conn.send(c.connect("again", 21))
                conn.pump(0.2)
        return f"CONNECT protocol {body.protocol_version} -> {T.Type.Name(got.type) if got else 'closed/none'}"

    def bad_sizes(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        connected = rng.random() < 0.7 and conn.handshake()
        command = random_command(rng, self.pools, rng.choice(SERVICE_TYPES))
        body = command.SerializePartialToString() or b"\x08\x12"
        tail = random_bytes(rng, rng.randrange(0, 64)) if rng.random() < 0.4 else b""
        total = 4 + len(body) + len(tail)
        r = rng.randrange(6)
        if r == 0:
            total = rng.choice((0, 1, 3, 4, 5, 8))
        elif r == 1:
            total += rng.choice((-3, -1, 1, 2, 100))
        elif r == 2:
            total = u32(rng)
        cmd_size = len(body)
        if r in (3, 4):
            cmd_size = rng.choice((0, 1, len(body) - 1, len(body) + 1, total, total + 1, u32(rng))) & 0xFFFF_FFFF
        if r == 5:
            total, cmd_size = rng.choice(((2**32 - 1, 2**32 - 1), (9, 2**31), (5, 1)))
        frame = struct.pack(">II", total & 0xFFFF_FFFF, cmd_size) + body + tail
        conn.send(frame)
        conn.pump(0.1)
        if connected and not conn.closed:
            conn.ping_ok() if rng.random() < 0.2 else None
        return f"connected={connected} total={total} cmd_size={cmd_size} real={len(body)}+{len(tail)}"

    def truncated(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        connected = rng.random() < 0.7 and conn.handshake()
        command = random_command(rng, self.pools, rng.choice(SERVICE_TYPES))
        frame = frame_of(command, valid_entry(rng, "fz", 1) if command.type == T.SEND else None)
        cut = rng.randrange(1, len(frame))
        conn.send(frame[:cut])
        if rng.random() < 0.3:
            conn.pump(rng.choice((0.05, 0.5)))
        return f"connected={connected} {T.Type.Name(command.type)} cut at {cut}/{len(frame)}"

    # commands -------------------------------------------------------------------------------------
    def random_commands(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        if not conn.handshake():
            return "handshake failed"
        kinds = []
        for _ in range(rng.randrange(1, 6)):
            command = random_command(rng, self.pools)
            kinds.append(T.Type.Name(command.type))
            entry = None
            if command.type == T.SEND or rng.random() < 0.03:
                entry = valid_entry(rng, "fz", 1) if rng.random() < 0.5 else random_bytes(rng, rng.randrange(4, 100))
            frame = frame_of(command, entry)
            if not conn.send(frame):
                break
            rid = request_id_of(command)
            if command.type in ANSWERED_TYPES and command.IsInitialized() and rid is not None and entry is None:
                conn.expect_answer(rid, f"{T.Type.Name(command.type)} {str(command)[:300]!r}")
            else:
                conn.pump(0.02)
            if conn.closed:
                break
        if not conn.closed:
            conn.ping_ok()
        return " ".join(kinds) + f" closed={conn.closed}"

    def mutated_commands(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        if not conn.handshake():
            return "handshake failed"
        command = random_command(rng, self.pools, rng.choice(SERVICE_TYPES))
        body = mutate_bytes(rng, command.SerializePartialToString())
        if not body:
            body = b"\x00"
        tail = b""
        if command.type == T.SEND and rng.random() < 0.8:
            entry = valid_entry(rng, "fz", 1)
            tail = struct.pack(">HI", 0x0E01, crc32c_of(entry)) + entry
        conn.send(raw_frame(body, tail))
        conn.pump(0.05)
        if not conn.closed:
            conn.ping_ok()
        return f"{T.Type.Name(command.type)} mutated to {body[:32].hex()} closed={conn.closed}"

    def unsupported(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        if not conn.handshake():
            return "handshake failed"
        count = rng.choice((1, 5, 50, 1001, 1500))
        frames = []
        for _ in range(min(count, 60)):
            r = rng.random()
            if r < 0.15:     # a type number no protocol version has: BaseCommand{type: N}
                number = rng.choice((0, 1, 99, 1000, 2**31 - 1, rng.randrange(100, 100000)))
                frames.append(raw_frame(b"\x08" + _varint(number)))
            elif r < 0.3:    # a newer protocol's command, with its body as an unknown field
                number = rng.choice(UNSUPPORTED_TYPES)
                body = random_bytes(rng, rng.randrange(0, 40))
                frames.append(raw_frame(b"\x08" + _varint(number) + _varint((number << 3) | 2)
                                        + _varint(len(body)) + body))
            else:
                frames.append(frame_of(random_command(rng, self.pools, rng.choice(UNSUPPORTED_TYPES))))
        data = b"".join(frames[i % len(frames)] for i in range(count))
        conn.send(data)
        conn.pump(0.3 if count > 1000 else 0.05)
        if count <= 1000 and not conn.closed:
            conn.ping_ok()
        return f"{count} unsupported commands, closed={conn.closed}"

    # sessions -------------------------------------------------------------------------------------
    def producer_session(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        if not conn.handshake():
            return "handshake failed"
        pools = self.pools
        topic = rng.choice(pools.topics[:6]) if rng.random() < 0.8 else rng.choice(pools.topics)
        producer_id = rng.choice((0, 1, 7, u64(rng)))
        name = rng.choice(pools.names) if rng.random() < 0.5 else None
        body = pb.CommandProducer(topic=topic, producer_id=producer_id, request_id=1)
        if name is not None:
            body.producer_name = name
        if rng.random() < 0.3:
            body.MergeFrom(random_message(rng, pb.CommandProducer, strings=pools.string, optional_p=0.3,
                                          overrides={"topic": topic, "producer_id": producer_id,
                                                     "request_id": 1}))
        conn.send(frame_of(T(type=T.PRODUCER, producer=body)))
        got = conn.expect_answer(1, f"PRODUCER {str(body)[:300]!r}")
        if got is None or got.type != T.PRODUCER_SUCCESS:
            return f"PRODUCER {topic!r} -> {T.Type.Name(got.type) if got else 'none'}"
        pname = got.command.producer_success.producer_name
        key = (_full_topic(topic), pname)
        labels = []
        seq = rng.choice((0, 1, 1000, u64(rng)))
        for _ in range(rng.randrange(1, 12)):
            seq = (seq + rng.choice((1, 1, 1, 0, -1, 1000))) % 2**64
            r = rng.random()
            send = pb.CommandSend(producer_id=producer_id, sequence_id=seq)
            checksum, with_checksum, bad = None, True, False
            if r < 0.35:
                entry, label = valid_entry(rng, pname, seq), "valid"
            else:
                label, entry = corrupt_entry(rng, pname, seq, pools)
            x = rng.random()
            if x < 0.15:
                checksum, bad, label = (crc32c_of(entry) ^ (1 << rng.randrange(32))), True, label + "+bad checksum"
            elif x < 0.25:
                with_checksum, label = False, label + "+no checksum"
            elif x < 0.35:
                send.producer_id = u64(rng)
                label += "+other producer id"
            if rng.random() < 0.3:
                send.MergeFrom(random_message(rng, pb.CommandSend, optional_p=0.3,
                                              overrides={"producer_id": send.producer_id, "sequence_id": seq}))
                label += "+random SEND fields"
            if send.HasField("highest_sequence_id"):
                label += f" seq={send.sequence_id} highest={send.highest_sequence_id}"
            else:
                label += f" seq={send.sequence_id}"
            frame = frame_of(T(type=T.SEND, send=send), entry, checksum=checksum, with_checksum=with_checksum)
            pending = PendingSend(send.producer_id, send.sequence_id, f"SEND {label} to {topic!r}", bad, frame)
            if not conn.submit(pending):
                break              # an answer never came: the rest would wait behind it
            labels.append((label, pending))
            if bad or rng.random() < 0.5:
                if not conn.drain():
                    break          # the rest waits behind it: no need to wait again
            if conn.closed:
                break
        conn.drain()
        stored = self.stored.setdefault(key[0], {})
        for position, sent in conn.receipts:
            # a duplicate (deduplication) is answered with its first copy's position: keep the first
            stored.setdefault(position, sent)
        if rng.random() < 0.5 and not conn.closed:
            conn.send(c.close_producer(producer_id, 2))
            conn.expect_answer(2, "CLOSE_PRODUCER")
        conn.ping_ok()
        return (f"producer on {topic!r}: closed={conn.closed}; sends: "
                + "; ".join(f"{label} -> {pending.answer}" for label, pending in labels))

    def consumer_session(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        if not conn.handshake():
            return "handshake failed"
        pools = self.pools
        topic = rng.choice(pools.topics[:6]) if rng.random() < 0.8 else rng.choice(pools.topics)
        sub = rng.choice(pools.subscriptions[:3]) if rng.random() < 0.7 else rng.choice(pools.subscriptions)
        consumer_id = rng.choice((0, 1, u64(rng)))
        body = pb.CommandSubscribe(topic=topic, subscription=sub, subType=rng.choice((0, 1, 2, 3)),
                                   consumer_id=consumer_id, request_id=1,
                                   initialPosition=rng.choice((0, 1)), durable=rng.random() < 0.7)
        if rng.random() < 0.3:
            body.start_message_id.CopyFrom(random_message(rng, pb.MessageIdData))
        if rng.random() < 0.2:
            body.MergeFrom(random_message(rng, pb.CommandSubscribe, strings=pools.string, optional_p=0.3,
                                          overrides={"topic": topic, "subscription": sub, "request_id": 1,
                                                     "consumer_id": consumer_id}))
        conn.send(frame_of(T(type=T.SUBSCRIBE, subscribe=body)))
        got = conn.expect_answer(1, f"SUBSCRIBE {str(body)[:300]!r}")
        if got is None or got.type != T.SUCCESS:
            return f"SUBSCRIBE {topic!r}/{sub!r} -> {T.Type.Name(got.type) if got else 'none'}"
        ops = []
        request_id = 10
        for _ in range(rng.randrange(1, 10)):
            op = rng.randrange(9)
            request_id += 1
            if op == 0:
                conn.send(c.flow(consumer_id if rng.random() < 0.9 else u64(rng), u32(rng)))
                ops.append("flow")
            elif op in (1, 2):
                ack = random_message(rng, pb.CommandAck, optional_p=0.4,
                                     overrides={"consumer_id": consumer_id if rng.random() < 0.9 else u64}) \
                    if op == 1 else pb.CommandAck(consumer_id=consumer_id, ack_type=rng.choice((0, 1)),
                                                  message_id=[random_message(rng, pb.MessageIdData)
                                                              for _ in range(rng.randrange(1, 4))])
                has_rid = ack.HasField("request_id")
                if has_rid:
                    ack.request_id = request_id
                conn.send(frame_of(T(type=T.ACK, ack=ack)))
                if has_rid and ack.IsInitialized():
                    conn.expect_answer(request_id, f"ACK {str(ack)[:300]!r}")
                ops.append("ack")
            elif op == 3:
                redeliver = pb.CommandRedeliverUnacknowledgedMessages(
                    consumer_id=consumer_id, message_ids=[random_message(rng, pb.MessageIdData)
                                                          for _ in range(rng.randrange(0, 3))])
                conn.send(frame_of(T(type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
                                     redeliverUnacknowledgedMessages=redeliver)))
                ops.append("redeliver")
            elif op == 4:
                seek = pb.CommandSeek(consumer_id=consumer_id, request_id=request_id)
                if rng.random() < 0.5:
                    seek.message_id.CopyFrom(random_message(rng, pb.MessageIdData))
                elif rng.random() < 0.8:
                    seek.message_publish_time = u64(rng)
                conn.send(frame_of(T(type=T.SEEK, seek=seek)))
                conn.expect_answer(request_id, f"SEEK {str(seek)[:200]!r}")
                ops.append("seek")
            elif op == 5:
                conn.send(c.get_last_message_id(consumer_id, request_id))
                conn.expect_answer(request_id, "GET_LAST_MESSAGE_ID")
                ops.append("last")
            elif op == 6:
                conn.send(c.consumer_stats(request_id, consumer_id))
                conn.expect_answer(request_id, "CONSUMER_STATS")
                ops.append("stats")
            elif op == 7:
                conn.send(c.unsubscribe(consumer_id, request_id, force=rng.random() < 0.5))
                conn.expect_answer(request_id, "UNSUBSCRIBE")
                ops.append("unsubscribe")
            else:
                conn.pump(0.05)
                ops.append(f"drain({len(conn.frames)})")
            conn.frames = [f for f in conn.frames if f.type != T.MESSAGE][-100:]
            if conn.closed:
                break
        conn.ping_ok()
        return f"consumer {topic!r}/{sub!r}: {' '.join(ops)} closed={conn.closed}"

    def names(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        if not conn.handshake():
            return "handshake failed"
        done = []
        for request_id in range(1, rng.randrange(2, 6)):
            name = weird_string(rng) if rng.random() < 0.5 else rng.choice(self.pools.topics)
            op = rng.randrange(5)
            if op == 0:
                frame, label = c.lookup(name, request_id, authoritative=rng.random() < 0.3), "LOOKUP"
            elif op == 1:
                frame, label = c.partitioned_metadata(name, request_id), "PARTITIONED_METADATA"
            elif op == 2:
                frame, label = c.get_schema(request_id, name, schema_version=(random_bytes(rng, rng.choice((0, 1, 8, 9)))
                                                                              if rng.random() < 0.5 else None)), "GET_SCHEMA"
            elif op == 3:
                ns = rng.choice(self.pools.namespaces) if rng.random() < 0.5 else name
                frame, label = c.get_topics_of_namespace(request_id, ns, mode=rng.choice((0, 1, 2))), "GET_TOPICS"
            else:
                schema = random_message(rng, pb.Schema, strings=self.pools.string)
                body = pb.CommandGetOrCreateSchema(request_id=request_id, topic=name, schema=schema)
                frame, label = frame_of(T(type=T.GET_OR_CREATE_SCHEMA, getOrCreateSchema=body)), "GET_OR_CREATE_SCHEMA"
                if not body.IsInitialized():
                    conn.send(frame)
                    conn.pump(0.05)
                    done.append(label + "(incomplete)")
                    continue
            conn.send(frame)
            conn.expect_answer(request_id, f"{label} {name[:200]!r}")
            done.append(label)
            if conn.closed:
                break
        conn.ping_ok()
        return " ".join(done)

    # shapes of traffic --------------------------------------------------------------------------
    def pipeline(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        n = rng.choice((10, 100, 500))
        frames = [c.connect("fuzz-pipeline", 21)]
        for i in range(n):
            frames.append(c.ping() if rng.random() < 0.5 else c.lookup(rng.choice(self.pools.topics[:6]), i + 1))
        conn.send(b"".join(frames))
        lookups = sum(1 for f in frames[1:] if f != c.ping())
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        answered = 0
        while answered < n and time.monotonic() < deadline and not conn.closed and conn.decoder is not None:
            conn.pump(0.1)
            answered += sum(1 for f in conn.frames if f.type in (T.PONG, T.LOOKUP_RESPONSE, T.ERROR))
            conn.frames.clear()
        if answered < n and not conn.closed and conn.decoder is not None and time.monotonic() < self.case_deadline:
            findings.add("pipelined requests were not all answered", f"{what}: {answered}/{n} answered "
                         f"({lookups} lookups) after {ANSWER_TIMEOUT_S:.0f}s")
        return f"{n} pipelined PING/LOOKUP, {answered} answered"

    def half_close(self, rng, sockets, findings, what) -> str:
        conn = self.conn(sockets, findings, what)
        connected = rng.random() < 0.7 and conn.handshake()
        frame = frame_of(random_command(rng, self.pools, rng.choice(SERVICE_TYPES)))
        cut = rng.randrange(0, len(frame) + 1)
        conn.send(frame[:cut])
        try:
            conn.sock.shutdown(2 if rng.random() < 0.2 else 1)   # SHUT_WR (or both)
        except OSError:
            pass
        conn.pump(0.05)
        return f"connected={connected} sent {cut}/{len(frame)} bytes then shut down"

    def burst(self, rng, sockets, findings, what) -> str:
        n = rng.choice((10, 30, 60))
        conns = []
        for _ in range(n):
            try:
                conns.append(self.conn(sockets, findings, what))
            except OSError:
                break
        for conn in conns:
            r = rng.random()
            if r < 0.4:
                conn.send(c.connect("fuzz-burst", 21))
            elif r < 0.7:
                conn.send(random_bytes(rng, rng.randrange(1, 64)))
        time.sleep(0.05)
        for conn in conns:
            conn.pump(0.001)
        return f"burst of {len(conns)}/{n} connections"


# MessageMetadata fields with which the official client legitimately does not hand a message to
# the application: markers, chunks of a message never completed, transactions, encryption
NOT_DELIVERED_FIELDS = frozenset({"marker_type", "uuid", "chunk_id", "num_chunks_from_msg", "total_chunk_msg_size",
                                  "txnid_least_bits", "txnid_most_bits", "encryption_keys", "encryption_algo",
                                  "encryption_param"})


def metadata_fields(entry: bytes) -> str:
    """The names of the MessageMetadata fields set in an entry ("?" if it does not parse)."""
    try:
        (size,) = struct.unpack_from(">I", entry)
        meta = pb.MessageMetadata.FromString(entry[4:4 + size])
    except Exception:   # noqa: BLE001
        return "?"
    names = " ".join(f.name for f, _ in meta.ListFields())
    return (f"{names} | compression={pb.CompressionType.Name(meta.compression)} "
            f"uncompressed_size={meta.uncompressed_size} payload={len(entry) - 4 - size} bytes")


def is_poison(entry: bytes) -> bool:
    """An entry the official client cannot read (POISON_ENTRY): pulsarlite's own entry codec
    refuses it (inconsistent batch framing, compression, metadata), or a required field of its
    MessageMetadata or of a batched message's SingleMessageMetadata is missing, at any depth
    (the C++ client's protobuf parse checks them all)."""
    try:
        metadata, messages = unpack_entry(entry)
        if not metadata.raw.IsInitialized():
            return True
        raw = metadata.raw
        if raw.HasField("num_messages_in_batch"):
            (size,) = struct.unpack_from(">I", entry)
            data = bytes(decompress(entry[4 + size:], raw.compression, raw.uncompressed_size))
            pos = 0
            for _ in messages:
                (n,) = struct.unpack_from(">I", data, pos)
                single = pb.SingleMessageMetadata.FromString(data[pos + 4:pos + 4 + n])
                if not single.IsInitialized():
                    return True
                pos += 4 + n + single.payload_size
    except Exception:   # noqa: BLE001 - EntryFormatError, a decompressor's or protobuf's own error
        return True
    return False


# Reads a topic from the earliest message with the official client, in a child process (a
# client that crashes on what it reads must not take the test session with it). Prints a line
# per message as it goes ("S ledger entry", "O ledger entry message-bytes entry-bytes" for a
# message longer than its entry), then "END".
READER_SCRIPT = r"""
import json, os, sys, time
import pulsar
job = json.load(sys.stdin)
sizes = {(l, e): n for l, e, n in job["positions"]}
client = pulsar.Client(job["url"], operation_timeout_seconds=30,
                       logger=pulsar.FileLogger(pulsar.LoggerLevel.Info, job["log"]))
reader = client.create_reader(job["topic"], pulsar.MessageId.earliest)
seen = set()
deadline = time.monotonic() + job["seconds"]
while time.monotonic() < deadline and not set(sizes) <= seen:
    try:
        msg = reader.read_next(timeout_millis=1000)
    except Exception:
        try:
            if not reader.has_message_available():
                break       # the end of the topic (entries the client discards are never seen)
        except Exception:
            pass
        continue
    mid = msg.message_id()
    position = (mid.ledger_id(), mid.entry_id())
    seen.add(position)
    print("S", *position, len(msg.data()), flush=True)
    if position in sizes and len(msg.data()) > sizes[position]:
        print("O", *position, len(msg.data()), sizes[position], flush=True)
print("END", flush=True)
os._exit(0)     # no close: a client stuck reconnecting on an entry it cannot parse takes long to close
"""


def read_back(service_url: str, topic: str, sizes: dict, seconds: float, log_path) -> tuple[str, dict, str]:
    """Reads ``topic`` with an official reader in a child process for at most ``seconds``:
    (outcome, report, stderr tail). outcome: "ok", "stuck" (had to be killed: the client hung,
    e.g. while subscribing) or "crash: <exit code>"; report: ``seen`` positions, ``sizes``
    {position: message bytes handed out}, ``oversize`` [ledger, entry, message bytes, entry
    bytes], ``discarded`` positions (the client dropped them as corrupt, by its log)."""
    job = {"url": service_url, "topic": topic, "seconds": seconds, "log": str(log_path),
           "positions": [[l, e, n] for (l, e), n in sizes.items()]}
    child = subprocess.Popen([sys.executable, "-c", READER_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        out, err = child.communicate(json.dumps(job).encode(), timeout=seconds + READ_BACK_START_S)
        stuck = False
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        stuck = True
    out, err = out.decode(errors="replace"), err.decode(errors="replace")    # the client logs raw names
    if stuck:
        outcome = "stuck"
    else:
        outcome = "ok" if child.returncode == 0 and out.rstrip().endswith("END") else f"crash: {child.returncode}"
    report = {"seen": [], "oversize": [], "sizes": {}}
    for line in out.splitlines():
        parts = line.split()
        try:                 # the last line may be cut short by a crash
            if parts[0] == "S":
                position = (int(parts[1]), int(parts[2]))
                report["sizes"][position] = int(parts[3])
                report["seen"].append(position)
            elif parts[0] == "O":
                report["oversize"].append([int(parts[i]) for i in range(1, 5)])
        except (IndexError, ValueError):
            continue
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        text = ""
    report["discarded"] = sorted({(int(l), int(e)) for l, e in DISCARDED.findall(text)})
    return outcome, report, err[-800:]


# what the official C++ client logs when it drops a message it cannot decompress or parse
DISCARDED = re.compile(r"Discarding corrupted message at\s+(\d+):(\d+)")


def check_readable(fuzzer: "BrokerFuzzer", service_url: str, findings: Findings, directory) -> None:
    """After the fuzzing: every entry the broker acknowledged to the fuzzer on a topic is read
    by an official reader from the earliest message (the broker can dispatch what it accepted,
    and the official client can read it), without the reader crashing or handing out more bytes
    than the entry holds (on any topic: a finding); entries not read behind an entry
    pulsarlite's own codec refuses (poison) are the known defect POISON_ENTRY. When a reader
    crashes, hangs, hands out too many bytes or misses entries, every SEND frame acknowledged on
    its topic and the entry the broker stored of it are dumped in hex (``read-back-<i>.frames``,
    named in the finding) to replay them one by one."""
    # a non-persistent topic stores nothing: what it acknowledged went to the consumers connected
    # then, and a reader from the earliest message gets none of it (Pulsar's semantics)
    jobs = [(i, topic, stored) for i, (topic, stored) in enumerate(sorted(fuzzer.stored.items()))
            if stored and not topic.startswith("non-persistent://")]
    jobs = jobs[:READ_BACK_TOPICS_MAX]
    with ThreadPoolExecutor(READ_BACK_PARALLEL) as pool:     # the readers are child processes
        outcomes = list(pool.map(lambda job: read_back(
            service_url, job[1], {position: len(sent.entry) for position, sent in job[2].items()}, READ_BACK_S,
            directory / f"read-back-{job[0]}.log"), jobs))
    for (i, topic, stored), (outcome, report, stderr) in zip(jobs, outcomes):
        poisoned = any(sent.poison for sent in stored.values())
        findings.note(f"read back: {outcome}")
        poison_note = " (the topic holds an entry pulsarlite's codec refuses)" if poisoned else ""
        seen = {tuple(p) for p in report["seen"]} | set(report["discarded"])   # dispatched, at least
        missing = sorted(p for p, sent in stored.items()
                         if p not in seen and not sent.poison and not set(sent.metadata.split()) & NOT_DELIVERED_FIELDS)
        failed = outcome != "ok" or report["oversize"] or missing
        dump = f"; frames: {dump_frames(directory / f'read-back-{i}.frames', topic, stored, report)}" if failed else ""
        if outcome.startswith("crash"):
            findings.add("the official reader crashed reading a fuzzed topic",
                         f"{topic}: {outcome} ({len(stored)} acknowledged entries){poison_note}; "
                         f"stderr: {stderr!r}{dump}")
            continue
        if report["oversize"]:
            findings.add("the official reader returned more bytes than an entry holds",
                         f"{topic}: (ledger, entry, message bytes, entry bytes) {report['oversize'][:5]}"
                         f"{poison_note}{dump}")
        if missing:      # behind a poison entry the official reader is stuck: the known defect
            kind = (f"{KNOWN_PREFIX}{POISON_ENTRY}: entries not read back on a topic with a poison entry" if poisoned
                    else "an entry acknowledged to the fuzzer was not read back by an official reader")
            findings.add(kind, f"{topic}: {len(missing)} of {len(stored)} acknowledged entries not read in "
                         f"{READ_BACK_S:.0f}s, e.g. " + ", ".join(f"{p} (metadata: {stored[p].metadata})"
                                                                  for p in missing[:5]) + dump)


def dump_frames(path, topic: str, stored: dict, report: dict) -> str:
    """Writes every acknowledged SEND of ``topic`` (position, what, poison, SEND frame and stored
    entry in hex, what the reader handed out of it: ``read: n bytes``, ``OVERSIZE``, ``not
    read``) to ``path``, in the order of the topic; returns the path. It is printed too."""
    oversize = {(l, e): n for l, e, n, _ in report.get("oversize", [])}
    lines = [f"# {topic}: {len(stored)} acknowledged SENDs, the reader saw {len(report.get('seen', []))}"]
    for position in sorted(stored):
        sent = stored[position]
        read = report.get("sizes", {}).get(position)
        mark = (f" OVERSIZE: the reader returned {oversize[position]} bytes" if position in oversize
                else f" read: {read} bytes" if read is not None else " not read")
        lines += [f"{position[0]}:{position[1]} poison={sent.poison} entry={len(sent.entry)} bytes{mark}",
                  f"  what: {sent.what}", f"  metadata: {sent.metadata}",
                  f"  frame: {sent.frame.hex()}", f"  entry: {sent.entry.hex()}"]
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(text)
    print(f"  read-back of {topic} failed: frames in {path}\n" + text[:20_000], flush=True)
    return str(path)


def _full_topic(topic: str) -> str:
    if "://" in topic:
        return topic
    parts = topic.split("/")
    return "persistent://" + (topic if len(parts) == 3 else "public/default/" + topic)


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= 2**64 - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=1, bookie_overrides=BOOKIE_OVERRIDES,
                                  broker_overrides=BROKER_OVERRIDES)


@pytest.fixture(scope="module")
def result(cluster, fuzz_budget: Budget, fuzz_dir) -> FuzzResult:
    port = cluster.records[cluster.broker_names[0]].ports["pulsar"]
    fuzzer = BrokerFuzzer(port, fuzz_budget)
    outcome = run_fuzz(TARGET, cluster=cluster, budget=fuzz_budget, directory=fuzz_dir,
                       test_file="tests/fuzz/test_fuzz_broker_port.py", fuzz_case=fuzzer)
    before_read_back = list(outcome.findings.by_kind)
    if not outcome.dead:
        try:
            check_readable(fuzzer, cluster.service_url, outcome.findings, fuzz_dir)
        except Exception:   # noqa: BLE001 - a bug of the read-back: one finding, the other checks stand
            outcome.findings.add("the read-back after the fuzzing failed (a bug of the fuzz suite?)",
                                 traceback.format_exc()[-2000:])
        before = set(before_read_back)
        for line in outcome.findings.report([k for k in outcome.findings.by_kind if k not in before]):
            print("  finding (read-back): " + line, flush=True)
    return outcome


class TestBrokerPortFuzz(FuzzChecks):
    pass


# -- defects found by the fuzzing (fixed), each pinned by a deterministic test (same cluster) ------
def test_sends_with_sequence_ids_above_int64_max_are_answered(cluster) -> None:
    """The fuzz suite's first finding (fixed in 99cbf41): with deduplication on, a SEND with a
    sequence id >= 2**63 was stored but never answered (struct.error in broker/dedup.py), and the
    producer's later SENDs waited behind it for ever. Each is answered now, and the producer
    goes on."""
    port = cluster.records[cluster.broker_names[0]].ports["pulsar"]
    with Sockets() as sockets:
        conn = Conn(sockets, port, Findings(), "dedup-u64 regression", time.monotonic() + 90)
        assert conn.handshake(), "no CONNECTED"
        _probe_producer(conn, "persistent://public/default/fz-dedup-u64")
        for seq in (5, 2**63, 2**63 + 1, 2**64 - 1, 6):
            entry = build_entry(Message(payload=b"probe-%d" % seq), producer_name="probe", sequence_id=seq,
                                publish_time_ms=int(time.time() * 1000))
            conn.send(c.send(1, seq, entry))
            got = conn.wait(lambda f: f.type in (T.SEND_RECEIPT, T.SEND_ERROR, T.ERROR), 10)
            assert got is not None, f"SEND with sequence id {seq}: no answer within 10 s (connection closed: {conn.closed})"
            if seq in (5, 6):
                assert got.type == T.SEND_RECEIPT, f"SEND with sequence id {seq}: {got.command}"


def _probe_producer(conn: Conn, topic: str, timeout_s: float = 30.0) -> None:
    """PRODUCER on ``topic`` (id 1, name "probe"), asked again while the broker answers a
    retriable error (right after the cluster starts it may not know the bookies yet)."""
    deadline = time.monotonic() + timeout_s
    request_id = 1
    while True:
        conn.send(c.producer(topic, 1, request_id, producer_name="probe"))
        got = conn.wait(lambda f: request_id_of(f.command) == request_id)
        if got is not None and got.type == T.PRODUCER_SUCCESS:
            return
        assert got is not None and time.monotonic() < deadline, f"PRODUCER not accepted: {got}"
        time.sleep(0.5)
        request_id += 1


def _store_raw_entries(cluster, topic: str, entries: list[bytes], what: str) -> list:
    """SEND ``entries`` (sequence ids 0, 1, ...) as a new producer; the broker's answers (frames)."""
    port = cluster.records[cluster.broker_names[0]].ports["pulsar"]
    answers = []
    with Sockets() as sockets:
        conn = Conn(sockets, port, Findings(), what, time.monotonic() + 90)
        assert conn.handshake(), "no CONNECTED"
        _probe_producer(conn, topic)
        for seq, entry in enumerate(entries):
            conn.send(c.send(1, seq, entry, num_messages=1))
            got = conn.wait(lambda f: f.type in (T.SEND_RECEIPT, T.SEND_ERROR, T.ERROR))
            assert got is not None, f"SEND {seq} was not answered"
            answers.append(got)
    return answers


def _position(answer) -> tuple[int, int]:
    mid = answer.command.send_receipt.message_id
    return mid.ledgerId, mid.entryId


def test_poison_entry_inconsistent_batch_is_refused(cluster, fuzz_dir) -> None:
    """poison-entry (fixed): a batch whose payload_size passes its end is refused at the SEND."""
    topic = "persistent://public/default/fz-known-poison-batch"
    single = pb.SingleMessageMetadata(payload_size=1000).SerializeToString()    # 1000 bytes announced, 5 follow
    payload = struct.pack(">I", len(single)) + single + b"hello"
    meta = pb.MessageMetadata(producer_name="probe", sequence_id=0, publish_time=int(time.time() * 1000),
                              num_messages_in_batch=1).SerializeToString()
    entry = struct.pack(">I", len(meta)) + meta + payload
    assert is_poison(entry)
    (got,) = _store_raw_entries(cluster, topic, [entry], "poison-entry batch probe")
    assert got.type == T.SEND_ERROR, f"stored: {got.command}"
    if got.type != T.SEND_RECEIPT:
        return      # refused: nothing stored that a reader could trip on
    outcome, report, stderr = read_back(cluster.service_url, topic, {_position(got): len(entry)}, 20,
                                        fuzz_dir / "read-back-poison-batch-probe.log")
    assert not outcome.startswith("crash"), f"the official reader crashed ({outcome}), stderr {stderr!r}"
    assert not report["oversize"], (f"the official reader returned more bytes than the entry holds "
                                    f"(ledger, entry, message bytes, entry bytes): {report['oversize']}")


def test_poison_lz4_single_message_is_refused(cluster) -> None:
    """poison-lz4 (fixed, tests/fuzz/NOTES.md): a single (non-batched) LZ4 message whose payload
    does not decompress to its declared size is refused at the SEND (it was stored, and an
    official reader of the topic sometimes crashed on it: SIGSEGV)."""
    topic = "persistent://public/default/fz-known-poison-lz4"
    meta = pb.MessageMetadata(producer_name="probe", sequence_id=0, publish_time=int(time.time() * 1000),
                              compression=pb.LZ4, uncompressed_size=127)
    raw = meta.SerializeToString()
    entry = struct.pack(">I", len(raw)) + raw + random.Random("poison-lz4").randbytes(75)
    assert is_poison(entry) and lz4_single_poison(True, metadata_fields(entry))
    (got,) = _store_raw_entries(cluster, topic, [entry], "poison-lz4 probe")
    assert got.type == T.SEND_ERROR, f"stored: {got.command}"


def test_poison_entry_metadata_missing_a_required_field_is_refused(cluster, fuzz_dir) -> None:
    """poison-entry (fixed): a property without its value is refused at the SEND; the next one is stored."""
    topic = "persistent://public/default/fz-known-poison-metadata"
    meta = pb.MessageMetadata(producer_name="probe", sequence_id=0, publish_time=int(time.time() * 1000))
    meta.properties.add(key="k")                 # KeyValue.value is required
    raw = meta.SerializePartialToString()
    entry = struct.pack(">I", len(raw)) + raw + b"poison"
    assert is_poison(entry)
    after = build_entry(Message(payload=b"after the poison entry"), producer_name="probe", sequence_id=1,
                        publish_time_ms=int(time.time() * 1000))
    got, got_after = _store_raw_entries(cluster, topic, [entry, after], "poison-entry metadata probe")
    assert got_after.type == T.SEND_RECEIPT, f"the valid entry after it was not stored: {got_after.command}"
    assert got.type == T.SEND_ERROR, f"stored: {got.command}"
    sizes = {_position(got_after): len(after)}
    if got.type == T.SEND_RECEIPT:
        sizes[_position(got)] = len(entry)
    outcome, report, stderr = read_back(cluster.service_url, topic, sizes, 10,
                                        fuzz_dir / "read-back-poison-metadata-probe.log")
    assert not outcome.startswith("crash"), f"the official reader crashed ({outcome}), stderr {stderr!r}"
    assert _position(got_after) in report["seen"], \
        f"an official reader never got the message after the poison entry within 10 s (read {report['seen']})"


def test_answers_of_two_sends_of_one_sequence_id_are_not_swapped(cluster, fuzz_dir) -> None:
    """poison-reader's last case (tests/fuzz/NOTES.md item 6, seed 1697072319 case 77) was the
    fuzzer's: a valid SEND (1000-byte payload) and, pending behind it, a "metadata size
    rewritten" SEND of the same sequence id (a 1-byte metadata: 0x0a, a field tag without its
    length). The broker refuses the second at the edge and answers it at once, before the
    first's receipt; the fuzzer matched answers to SENDs in order by (producer id, sequence id),
    gave the receipt to the refused SEND, and took its 171 bytes for the stored entry, so the
    official reader's 1000-byte message looked longer than the entry. Conn.submit waits for the
    answers pending before a SEND of an id already pending: each answer goes to its own SEND,
    the receipt's entry is the valid one, and the official reader hands out exactly its payload."""
    topic = "persistent://public/default/fz-answers-of-one-sequence-id"
    port = cluster.records[cluster.broker_names[0]].ports["pulsar"]
    now_ms = int(time.time() * 1000)
    rng = random.Random("poison-reader")
    payload = rng.randbytes(1000)
    valid = build_entry(Message(payload=payload, key=""), producer_name="probe", sequence_id=2001,
                        publish_time_ms=now_ms)
    batch = build_batch_entry([rng.randbytes(n) for n in (17, 0, 31, 9)], producer_name="probe",
                              sequence_id=2001, publish_time_ms=now_ms, compression=Compression.SNAPPY)
    rewritten = struct.pack(">I", 1) + batch[4:]
    assert rewritten[4] == 0x0A and not is_poison(valid) and is_poison(rewritten)
    command = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=2001))
    sends = [PendingSend(1, 2001, what, False, frame_of(command, entry))
             for what, entry in (("valid", valid), ("metadata size rewritten", rewritten))]
    with Sockets() as sockets:
        conn = Conn(sockets, port, Findings(), "two SENDs of one sequence id", time.monotonic() + 90)
        assert conn.handshake(), "no CONNECTED"
        _probe_producer(conn, topic)
        assert all(conn.submit(send) for send in sends) and conn.drain(), "a SEND was not answered"
    assert [send.answer.split()[0] for send in sends] == ["SEND_RECEIPT", "SEND_ERROR"], \
        [(send.what, send.answer) for send in sends]
    ((position, stored),) = conn.receipts
    assert stored.entry == valid, f"the receipt was given to {stored.what!r}"
    outcome, report, stderr = read_back(cluster.service_url, topic, {position: len(valid)}, 10,
                                        fuzz_dir / "read-back-answers-of-one-sequence-id.log")
    assert outcome == "ok" and not report["oversize"], f"{outcome}: {report}, stderr {stderr!r}"
    assert report["sizes"] == {position: len(payload)}, report

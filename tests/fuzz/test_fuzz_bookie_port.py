"""[hardening] Fuzzing the bookies' port (pulsarlite's bookie protocol, proto/bookie_rpc.proto)
while the canary produces and consumes through them: random bytes, frames with wrong sizes,
unknown types and truncated bodies, bodies that do not parse or parse into random fields,
requests with random ids and ranges, adds with bad checksums and out-of-range ids, fenced and
deleted ledgers, recovery adds, pipelines past the in-flight limit, half closes and bursts of
connections.

Never touches the canary's data: every add, fence and delete names a ledger id >= 10**12
(``SAFE_LEDGER_MIN``; the canary's ledgers are checked to be far below it), and every byte
stream is first decoded here the way the bookie decodes it (``Guard``): a stream that would
make the bookie add to, fence or delete a lower ledger id is not sent. Reads and LAC reads
without fencing may name any ledger.

The fuzzer's own checks (findings): every request the bookie can parse is answered within
ANSWER_TIMEOUT_S (or its connection closed); responses decode; an add with a wrong checksum,
out-of-range ids, to a fenced ledger (not recovery) or to a deleted ledger is never OK; an
entry added OK reads back byte for byte.

Replay: PULSARLITE_FUZZ_SEED=<seed> [PULSARLITE_FUZZ_CASES=<n> | PULSARLITE_FUZZ_ONLY=<i,j>]
pytest tests/fuzz/test_fuzz_bookie_port.py
"""

from __future__ import annotations

import json
import random
import struct
import time
import urllib.request

import pytest

pytest.importorskip("pulsar")

from bookie._proto import bookie_rpc_pb2 as bpb  # noqa: E402
from bookie.transport import (MESSAGE_TYPES, REQUEST_TYPES, RESPONSE_TYPES, FrameDecoder, FrameError,  # noqa: E402
                              encode_frame, encode_message, parse_body)
from pulsarlite.checksum import entry_checksum  # noqa: E402
from pulsarlite.config import BookieConfig  # noqa: E402

from .conftest import BOOKIE_OVERRIDES, BROKER_OVERRIDES  # noqa: E402
from .harness import (Budget, Findings, FuzzChecks, FuzzResult, Journal, Sockets, fuzz_timeout_s, i64,  # noqa: E402
                      mutate_bytes, random_bytes, random_message, recv_available, run_fuzz, send_quietly, u32, u64)

pytestmark = [pytest.mark.integration, pytest.mark.fuzz, pytest.mark.timeout(fuzz_timeout_s())]

TARGET = "bookie"
ANSWER_TIMEOUT_S = 10.0
CASE_SECONDS_MAX = 12.0
SAFE_LEDGER_MIN = 10**12
REQUEST_BYTES_MAX = 16 * 1024 * 1024       # BookieConfig.request_bytes_max (default)
ENTRY_BYTES_MAX = BookieConfig().entry_bytes_max  # the default (the brokers' frame limit)
VALID_ADD_BYTES_MAX = 4 * 1024 * 1024      # stored by the fuzzer per run, at most (RSS stays comparable)
REQUEST_TYPE_LIST = sorted(REQUEST_TYPES)
ALL_FRAME_TYPES = [v.number for v in bpb.FrameType.DESCRIPTOR.values]


class Guard:
    """Decodes a connection's outgoing stream as the bookie will, and says whether a chunk
    would add to, fence or delete a ledger below SAFE_LEDGER_MIN (then it must not be sent)."""

    def __init__(self) -> None:
        self.decoder = FrameDecoder(REQUEST_BYTES_MAX, REQUEST_TYPES)
        self.broken = False          # the bookie stops reading this stream here

    def dangerous(self, data: bytes) -> str | None:
        if self.broken:
            return None
        shadow_parts = list(self.decoder._parts)     # to undo: the chunk may not be sent
        shadow_bytes, shadow_needed = self.decoder._parts_bytes, self.decoder._needed
        problem = None
        try:
            for frame_type, request_id, body in self.decoder.feed(data):
                try:
                    request = parse_body(frame_type, request_id, body)
                except FrameError:
                    self.broken = True
                    break
                problem = _danger(frame_type, request)
                if problem:
                    break
        except FrameError:
            self.broken = True
        if problem:
            self.decoder._parts, self.decoder._parts_bytes, self.decoder._needed = \
                shadow_parts, shadow_bytes, shadow_needed
            self.broken = False
        return problem


def _danger(frame_type: int, request) -> str | None:
    if frame_type == bpb.FRAME_ADD_REQUEST:
        low = [e.ledger_id for e in request.entries if e.ledger_id < SAFE_LEDGER_MIN]
        return f"add to ledger {low[0]}" if low else None
    if frame_type == bpb.FRAME_DELETE_LEDGER_REQUEST and request.ledger_id < SAFE_LEDGER_MIN:
        return f"delete of ledger {request.ledger_id}"
    if frame_type in (bpb.FRAME_READ_REQUEST, bpb.FRAME_READ_LAC_REQUEST) and request.fence \
            and request.ledger_id < SAFE_LEDGER_MIN:
        return f"fence of ledger {request.ledger_id}"
    return None


class BookieConn:
    def __init__(self, sockets: Sockets, port: int, findings: Findings, what: str, deadline: float) -> None:
        self.sock = sockets.connect(port)
        self.guard = Guard()
        self.decoder: FrameDecoder | None = FrameDecoder(REQUEST_BYTES_MAX + 1024, RESPONSE_TYPES)
        self.responses: list[tuple[int, int, object]] = []
        self.closed = False
        self.findings = findings
        self.what = what
        self.deadline = deadline
        self.cut_short = False
        self.guarded = 0

    def send(self, data: bytes) -> bool:
        problem = self.guard.dangerous(data)
        if problem:
            self.guarded += 1
            self.findings.note("guarded: not sent")
            return False
        ok = send_quietly(self.sock, data)
        self.closed |= not ok
        return ok

    def pump(self, timeout_s: float) -> None:
        data, closed = recv_available(self.sock, timeout_s, return_on_data=True)
        if data and self.decoder is not None:
            try:
                for frame_type, request_id, body in self.decoder.feed(data):
                    self.responses.append((frame_type, request_id, parse_body(frame_type, request_id, body)))
            except FrameError as e:
                self.findings.add("the bookie wrote bytes that do not decode as response frames", f"{self.what}: {e}")
                self.decoder = None
        self.closed |= closed

    def wait(self, request_id: int, timeout_s: float = ANSWER_TIMEOUT_S):
        own = time.monotonic() + timeout_s
        deadline = min(own, self.deadline)
        while True:
            for i, (frame_type, rid, message) in enumerate(self.responses):
                if rid == request_id:
                    del self.responses[i]
                    return frame_type, message
            left = deadline - time.monotonic()
            if self.closed or self.decoder is None or left <= 0:
                if left <= 0 and deadline < own:
                    self.cut_short = True
                return None
            self.pump(min(0.1, left))

    def request(self, frame_type: int, request_id: int, message, what: str):
        """Send a request that parses; its answer, or None (a finding if the bookie kept the
        connection open without answering)."""
        if not self.send(encode_message(frame_type, request_id, message)):
            return None
        got = self.wait(request_id)
        if got is None and not self.closed and self.decoder is not None and not self.cut_short:
            self.findings.add("a request was never answered",
                              f"{self.what}: {what} (request id {request_id}) unanswered after {ANSWER_TIMEOUT_S:.0f}s")
        return got


def entry(ledger_id: int, entry_id: int, payload: bytes, *, lac: int = -1, length: int | None = None,
          checksum: int | None = None) -> bpb.Entry:
    length = len(payload) if length is None else length
    if checksum is None:
        checksum = entry_checksum(ledger_id, entry_id, lac, length, payload)
    return bpb.Entry(ledger_id=ledger_id, entry_id=entry_id, lac=lac, length=length, payload=payload,
                     checksum=checksum)


class BookieFuzzer:
    def __init__(self, ports: list[int], budget: Budget) -> None:
        self.ports = ports
        base = SAFE_LEDGER_MIN + (budget.seed % 1_000_000) * 1_000
        self.ledgers = [base + k for k in range(8)] + [2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1, SAFE_LEDGER_MIN]
        self.valid_add_bytes = 0
        self.kinds = [(self.random_bytes, 6), (self.bad_frames, 8), (self.random_bodies, 12),
                      (self.random_requests, 14), (self.mutated_requests, 8), (self.ledger_semantics, 20),
                      (self.reads_anywhere, 8), (self.too_large, 3), (self.pipeline, 3), (self.half_close, 3),
                      (self.burst, 2)]

    def __call__(self, rng: random.Random, index: int, findings: Findings, journal: Journal) -> None:
        kinds, weights = zip(*self.kinds)
        kind = rng.choices(kinds, weights)[0]
        self.deadline = time.monotonic() + CASE_SECONDS_MAX
        port = rng.choice(self.ports)
        with Sockets() as sockets:
            try:
                what = kind(rng, lambda: BookieConn(sockets, port, findings, f"case {index} {kind.__name__} port {port}",
                                                    self.deadline), findings)
            except (ConnectionError, TimeoutError) as e:
                what = f"connection error {type(e).__name__}"
            journal.case(index, f"{kind.__name__} port {port}: {what}")
            findings.note(kind.__name__)
            sockets.close_all(rng)

    def ledger(self, rng: random.Random) -> int:
        return rng.choice(self.ledgers)

    # raw ------------------------------------------------------------------------------------------
    def random_bytes(self, rng, connect, findings) -> str:
        conn = connect()
        data = random_bytes(rng, rng.choice((1, 4, 12, 13, 14, 100, 1000, rng.randrange(1, 5000))))
        sent = conn.send(data)
        conn.pump(0.05)
        return f"{len(data)} random bytes {data[:16].hex()} sent={sent}"

    def bad_frames(self, rng, connect, findings) -> str:
        conn = connect()
        frame_type = rng.choice(ALL_FRAME_TYPES + [0, 12, 99, 255])
        body = random_message(rng, bpb.ReadLacRequest, overrides={"ledger_id": self.ledger(rng)}).SerializeToString()
        size = 9 + len(body)
        r = rng.randrange(4)
        if r == 0:
            size = rng.choice((0, 1, 8))
        elif r == 1:
            size = rng.choice((size - 1, size + 1, size + 100))
        elif r == 2:
            size = u32(rng)
        request_id = u64(rng)
        data = struct.pack(">IBQ", size & 0xFFFF_FFFF, frame_type, request_id) + body
        sent = conn.send(data)
        got = conn.wait(request_id, 2.0) if sent else None
        if got is None and conn.responses:
            got = conn.responses[0][0], conn.responses[0][2]
        answer = f"{bpb.FrameType.Name(got[0])} {str(got[1])[:80]!r}" if got else "nothing"
        return f"type {frame_type} size {size} for {len(body)} body bytes -> {answer}"

    def random_bodies(self, rng, connect, findings) -> str:
        conn = connect()
        frame_type = rng.choice(REQUEST_TYPE_LIST)
        r = rng.random()
        if r < 0.5:
            body = random_bytes(rng, rng.choice((0, 1, 5, 50, rng.randrange(0, 500))))
        else:      # a message of another type in the body
            other = rng.choice(ALL_FRAME_TYPES[1:])
            body = random_message(rng, MESSAGE_TYPES[other]).SerializeToString()
        request_id = u64(rng)
        data = encode_frame(frame_type, request_id, body)
        if not conn.send(data):
            return f"{bpb.FrameType.Name(frame_type)} with {len(body)} random body bytes: guarded or refused"
        got = conn.wait(request_id)
        if got is None and not conn.closed and not conn.cut_short and conn.decoder is not None:
            findings.add("a request was never answered", f"{conn.what}: {bpb.FrameType.Name(frame_type)} "
                         f"body {body[:64].hex()} (request id {request_id})")
        return f"{bpb.FrameType.Name(frame_type)} body {body[:48].hex()} -> " + (
            f"{bpb.FrameType.Name(got[0])} {str(got[1])[:100]!r}" if got else f"closed={conn.closed}")

    def random_request(self, rng) -> tuple[int, object]:
        frame_type = rng.choice(REQUEST_TYPE_LIST)
        if frame_type == bpb.FRAME_ADD_REQUEST:
            request = bpb.AddRequest(recovery=rng.random() < 0.2)
            for _ in range(rng.choice((0, 1, 1, 2, 5, 50))):
                request.entries.append(random_message(rng, bpb.Entry, optional_p=0.8,
                                                      overrides={"ledger_id": self.ledger(rng)}))
        elif frame_type == bpb.FRAME_READ_REQUEST:
            request = random_message(rng, bpb.ReadRequest, optional_p=0.7, overrides={"ledger_id": self.ledger(rng)})
        elif frame_type == bpb.FRAME_READ_LAC_REQUEST:
            request = random_message(rng, bpb.ReadLacRequest, optional_p=0.7,
                                     overrides={"ledger_id": self.ledger(rng)})
        elif frame_type == bpb.FRAME_DELETE_LEDGER_REQUEST:
            request = bpb.DeleteLedgerRequest(ledger_id=self.ledger(rng))
        else:
            request = bpb.BookieInfoRequest()
        return frame_type, request

    def random_requests(self, rng, connect, findings) -> str:
        conn = connect()
        done = []
        for _ in range(rng.randrange(1, 6)):
            frame_type, request = self.random_request(rng)
            request_id = u64(rng)
            got = conn.request(frame_type, request_id, request, f"{bpb.FrameType.Name(frame_type)} {str(request)[:300]!r}")
            if got is not None and got[0] == bpb.FRAME_ADD_RESPONSE:
                self.check_add_results(findings, conn.what, request, got[1])
            done.append(f"{bpb.FrameType.Name(frame_type)}->{bpb.FrameType.Name(got[0]) if got else None}")
            if conn.closed:
                break
        return " ".join(done)

    def check_add_results(self, findings: Findings, what: str, request, response) -> None:
        """Adds that must not be OK: a wrong checksum or ids out of range."""
        if response is None or not hasattr(response, "results"):
            return
        for e, result in zip(request.entries, response.results):
            if result.code != bpb.OK:
                continue
            if e.entry_id < 0 or e.lac < -1 or e.length < 0:
                findings.add("an add with out-of-range ids was OK", f"{what}: {str(e)[:200]!r}")
            elif e.checksum != entry_checksum(e.ledger_id, e.entry_id, e.lac, e.length, e.payload):
                findings.add("an add with a wrong checksum was OK", f"{what}: ledger {e.ledger_id} entry {e.entry_id}")

    def mutated_requests(self, rng, connect, findings) -> str:
        conn = connect()
        frame_type, request = self.random_request(rng)
        body = mutate_bytes(rng, request.SerializeToString())
        request_id = u64(rng)
        if not conn.send(encode_frame(frame_type, request_id, body)):
            return "guarded"
        got = conn.wait(request_id)
        if got is None and not conn.closed and not conn.cut_short and conn.decoder is not None:
            findings.add("a request was never answered", f"{conn.what}: mutated {bpb.FrameType.Name(frame_type)} "
                         f"body {body[:64].hex()} (request id {request_id})")
        return f"mutated {bpb.FrameType.Name(frame_type)} {body[:48].hex()} -> " + (
            bpb.FrameType.Name(got[0]) if got else f"closed={conn.closed}")

    # semantics on the fuzzer's own ledgers ---------------------------------------------------------
    def ledger_semantics(self, rng, connect, findings) -> str:
        """Adds (valid, wrong checksum, ids out of range, recovery), fences, deletes and reads on
        one of the fuzzer's ledgers; what must hold is checked."""
        conn = connect()
        ledger_id = rng.choice(self.ledgers[:8]) if rng.random() < 0.8 else self.ledger(rng)
        steps = []
        rid = rng.randrange(1, 2**40)
        stored: dict[int, bytes] = {}
        for _ in range(rng.randrange(2, 8)):
            rid += 1
            op = rng.randrange(8)
            if op <= 2 and self.valid_add_bytes < VALID_ADD_BYTES_MAX:
                first = rng.choice((0, 1, 5, rng.randrange(0, 1000), 2**63 - 1))
                entries = []
                for k in range(rng.choice((1, 1, 3, 10))):
                    payload = random_bytes(rng, rng.choice((0, 1, 100, 4096)))
                    self.valid_add_bytes += len(payload)
                    eid = min(first + k, 2**63 - 1)
                    entries.append(entry(ledger_id, eid, payload, lac=rng.choice((-1, max(-1, eid - 1))),
                                         length=rng.randrange(0, 2**40)))
                request = bpb.AddRequest(entries=entries, recovery=rng.random() < 0.2, request_id=rid)
                got = conn.request(bpb.FRAME_ADD_REQUEST, rid, request, f"valid add to ledger {ledger_id}")
                if got and got[0] == bpb.FRAME_ADD_RESPONSE:
                    for e, result in zip(entries, got[1].results):
                        if result.code == bpb.OK:
                            stored[e.entry_id] = e.payload
                steps.append(f"add{len(entries)}@{first}->" + (",".join(bpb.StatusCode.Name(r.code)
                                                                       for r in got[1].results[:3])
                                                              if got and got[0] == bpb.FRAME_ADD_RESPONSE else "?"))
            elif op == 3:
                payload = random_bytes(rng, rng.choice((1, 50)))
                eid = rng.randrange(0, 100)
                bad = rng.randrange(3)
                if bad == 0:
                    good = entry_checksum(ledger_id, eid, -1, len(payload), payload)
                    e = entry(ledger_id, eid, payload, checksum=good ^ (1 << rng.randrange(32)))
                elif bad == 1:
                    e = entry(ledger_id, rng.choice((-1, -2**63)), payload)
                else:
                    e = entry(ledger_id, eid, payload, lac=rng.choice((-2, -2**63)), length=rng.choice((0, -1)))
                request = bpb.AddRequest(entries=[e], recovery=rng.random() < 0.5)
                got = conn.request(bpb.FRAME_ADD_REQUEST, rid, request, f"bad add to ledger {ledger_id}")
                if got and got[0] == bpb.FRAME_ADD_RESPONSE:
                    self.check_add_results(findings, conn.what, request, got[1])
                    steps.append(f"badadd->{','.join(bpb.StatusCode.Name(r.code) for r in got[1].results)}")
            elif op == 4:
                fence_via_read = rng.random() < 0.5
                if fence_via_read:
                    got = conn.request(bpb.FRAME_READ_REQUEST, rid, bpb.ReadRequest(
                        ledger_id=ledger_id, first_entry_id=0, last_entry_id=0, fence=True), f"fence read {ledger_id}")
                else:
                    got = conn.request(bpb.FRAME_READ_LAC_REQUEST, rid, bpb.ReadLacRequest(ledger_id=ledger_id, fence=True),
                                       f"fence lac {ledger_id}")
                steps.append("fence")
                rid += 1
                payload = b"after-fence"
                e = entry(ledger_id, rng.randrange(1000, 2000), payload)
                got = conn.request(bpb.FRAME_ADD_REQUEST, rid, bpb.AddRequest(entries=[e]), f"add after fence {ledger_id}")
                if got and got[0] == bpb.FRAME_ADD_RESPONSE and got[1].results and got[1].results[0].code == bpb.OK:
                    findings.add("an add to a fenced ledger was OK", f"{conn.what}: ledger {ledger_id}")
            elif op == 5:
                got = conn.request(bpb.FRAME_DELETE_LEDGER_REQUEST, rid, bpb.DeleteLedgerRequest(ledger_id=ledger_id),
                                   f"delete {ledger_id}")
                steps.append("delete")
                stored.clear()
                if got and got[0] == bpb.FRAME_DELETE_LEDGER_RESPONSE and got[1].code == bpb.OK:
                    rid += 1
                    e = entry(ledger_id, 0, b"after-delete")
                    got = conn.request(bpb.FRAME_ADD_REQUEST, rid, bpb.AddRequest(entries=[e], recovery=True),
                                       f"add after delete {ledger_id}")
                    if got and got[0] == bpb.FRAME_ADD_RESPONSE and got[1].results and got[1].results[0].code == bpb.OK:
                        findings.add("an add to a deleted ledger was OK", f"{conn.what}: ledger {ledger_id}")
            elif op == 6:
                got = conn.request(bpb.FRAME_READ_LAC_REQUEST, rid, bpb.ReadLacRequest(ledger_id=ledger_id), "lac")
                steps.append("lac")
            else:
                first = rng.choice((0, 1, -1, 2**63 - 1, rng.randrange(0, 20)))
                last = min(2**63 - 1, rng.choice((first, first + 10, first - 1, 2**63 - 1, -2**63)))
                got = conn.request(bpb.FRAME_READ_REQUEST, rid, bpb.ReadRequest(
                    ledger_id=ledger_id, first_entry_id=first, last_entry_id=last,
                    max_bytes=rng.choice((0, 1, 100, 2**32 - 1))), f"read {ledger_id} {first}..{last}")
                steps.append("read")
            if conn.closed:
                break
        # what was added OK reads back byte for byte (unless the fuzz deleted it since)
        for eid, payload in list(stored.items())[:5]:
            rid += 1
            got = conn.request(bpb.FRAME_READ_REQUEST, rid, bpb.ReadRequest(ledger_id=ledger_id, first_entry_id=eid,
                                                                         last_entry_id=eid), f"read back {ledger_id}:{eid}")
            if got is None or got[0] != bpb.FRAME_READ_RESPONSE:
                continue
            response = got[1]
            if response.code == bpb.NO_SUCH_LEDGER:
                continue           # another case deleted the ledger meanwhile
            if response.code != bpb.OK or not response.entries or response.entries[0].payload != payload:
                findings.add("an entry added OK did not read back the same",
                             f"{conn.what}: ledger {ledger_id} entry {eid}: {bpb.StatusCode.Name(response.code)} "
                             f"{[len(e.payload) for e in response.entries][:3]} vs {len(payload)} bytes")
        return f"ledger {ledger_id}: {' '.join(steps)}"

    def reads_anywhere(self, rng, connect, findings) -> str:
        """Reads and LAC reads, never fencing, on any ledger id (the canary's too)."""
        conn = connect()
        done = []
        for _ in range(rng.randrange(1, 5)):
            ledger_id = rng.choice((0, 1, 2, 3, 4, 5, u64(rng)))
            request_id = u64(rng)
            if rng.random() < 0.5:
                request = bpb.ReadRequest(ledger_id=ledger_id, first_entry_id=i64(rng), last_entry_id=i64(rng),
                                          max_bytes=u32(rng))
                if rng.random() < 0.5:
                    request.first_entry_id = rng.randrange(0, 50)
                    request.last_entry_id = request.first_entry_id + rng.choice((0, 10, 1000, 2**62))
                got = conn.request(bpb.FRAME_READ_REQUEST, request_id, request, f"read {str(request)[:200]!r}")
            else:
                got = conn.request(bpb.FRAME_READ_LAC_REQUEST, request_id, bpb.ReadLacRequest(ledger_id=ledger_id),
                                   f"lac {ledger_id}")
            done.append(f"{ledger_id}->{bpb.FrameType.Name(got[0]) if got else None}")
            if conn.closed:
                break
        return " ".join(done)

    def too_large(self, rng, connect, findings) -> str:
        conn = connect()
        r = rng.randrange(3)
        request_id = u64(rng)
        if r == 0:     # a frame announced above the limit: refused before its body arrives
            size = rng.choice((REQUEST_BYTES_MAX + 1, 2**32 - 1))
            conn.send(struct.pack(">IBQ", size, bpb.FRAME_ADD_REQUEST, request_id) + b"\0" * 100)
        elif r == 1:   # an entry above entry_bytes_max inside a frame the bookie accepts
            payload = b"\0" * (ENTRY_BYTES_MAX + 1)
            e = entry(self.ledgers[0], 0, payload)
            got = conn.request(bpb.FRAME_ADD_REQUEST, request_id, bpb.AddRequest(entries=[e]), "add of 5 MiB + 1")
            code = got[1].results[0].code if got and got[0] == bpb.FRAME_ADD_RESPONSE and got[1].results else None
            if code == bpb.OK:
                findings.add("an entry above entry_bytes_max was stored", conn.what)
            return f"entry of {len(payload)} bytes -> {bpb.StatusCode.Name(code) if code is not None else got}"
        else:          # a frame announced big, then only part of it, then we go away
            size = rng.choice((1024 * 1024, REQUEST_BYTES_MAX))
            conn.send(struct.pack(">IBQ", size, bpb.FRAME_READ_REQUEST, request_id) + random_bytes(rng, 1000))
        conn.pump(0.2)
        return f"variant {r}: closed={conn.closed} answers={[bpb.FrameType.Name(t) for t, _, _ in conn.responses]}"

    def pipeline(self, rng, connect, findings) -> str:
        conn = connect()
        n = rng.choice((10, 100, 300))
        ids = list(range(1, n + 1))
        frames = []
        for request_id in ids:
            if rng.random() < 0.5:
                frames.append(encode_message(bpb.FRAME_BOOKIE_INFO_REQUEST, request_id, bpb.BookieInfoRequest()))
            else:
                frames.append(encode_message(bpb.FRAME_READ_LAC_REQUEST, request_id,
                                             bpb.ReadLacRequest(ledger_id=rng.choice(self.ledgers))))
        conn.send(b"".join(frames))
        deadline = min(time.monotonic() + ANSWER_TIMEOUT_S, self.deadline)
        answered: set[int] = set()
        while len(answered) < n and time.monotonic() < deadline and not conn.closed and conn.decoder is not None:
            conn.pump(0.1)
            answered.update(rid for _, rid, _ in conn.responses)
            conn.responses.clear()
        if len(answered) < n and not conn.closed and time.monotonic() < self.deadline:
            findings.add("pipelined requests were not all answered", f"{conn.what}: {len(answered)}/{n}")
        return f"{n} pipelined requests, {len(answered)} answered"

    def half_close(self, rng, connect, findings) -> str:
        conn = connect()
        frame_type, request = self.random_request(rng)
        data = encode_message(frame_type, u64(rng), request)
        cut = rng.randrange(0, len(data) + 1)
        sent = conn.send(data[:cut])
        try:
            conn.sock.shutdown(1)
        except OSError:
            pass
        conn.pump(0.1)
        return f"{bpb.FrameType.Name(frame_type)} cut at {cut}/{len(data)} then SHUT_WR, sent={sent}"

    def burst(self, rng, connect, findings) -> str:
        conns = []
        for _ in range(rng.choice((10, 30, 60))):
            try:
                conns.append(connect())
            except OSError:
                break
        for conn in conns:
            if rng.random() < 0.5:
                frame_type, request = self.random_request(rng)
                data = encode_message(frame_type, u64(rng), request)
                conn.send(data[:rng.randrange(0, len(data) + 1)])
        time.sleep(0.05)
        for conn in conns:
            conn.pump(0.001)
        return f"burst of {len(conns)} connections"


def canary_ledgers(cluster, topic: str) -> list[int]:
    path = topic.split("://", 1)[1]
    with urllib.request.urlopen(f"{cluster.admin_url}/admin/v2/persistent/{path}/internalStats", timeout=10) as r:
        stats = json.loads(r.read())
    return [int(info["ledgerId"]) for info in stats["ledgers"]]


@pytest.fixture(scope="module")
def result(module_cluster_factory, fuzz_budget: Budget, fuzz_dir) -> FuzzResult:
    cluster = module_cluster_factory(3, brokers=1, bookie_overrides=BOOKIE_OVERRIDES,
                                     broker_overrides=BROKER_OVERRIDES)
    ports = [cluster.records[name].ports["bookie"] for name in cluster.bookie_names]
    topic = f"persistent://public/default/canary-{TARGET}-{fuzz_budget.seed}"

    def setup() -> None:
        ledgers = canary_ledgers(cluster, topic)
        assert ledgers and max(ledgers) < SAFE_LEDGER_MIN, f"the canary's ledgers {ledgers} are not below the fuzz range"

    outcome = run_fuzz(TARGET, cluster=cluster, budget=fuzz_budget, directory=fuzz_dir,
                       test_file="tests/fuzz/test_fuzz_bookie_port.py", fuzz_case=BookieFuzzer(ports, fuzz_budget),
                       setup=setup)
    return outcome


class TestBookiePortFuzz(FuzzChecks):
    pass

"""A seeded simulation of the broker's publish path with deduplication on: producers that behave
as the official C++ client does (pulsar-client 3.x / C++ 4.x, read from its source: docs/decisions.md
"The official producer's sequence ids"), the real :class:`broker.topic.PersistentTopic` and
:class:`broker.dedup.DedupState`, and a simulated managed ledger whose log survives broker crashes.

What the C++ producer does, and is modelled here:

- the application gets the producer once it is registered (epoch 0) and sends from then on;
- a sequence id is assigned when the application sends, from a counter; a batch's id is its first
  message's, ``highest_sequence_id`` is never set, each message of a batch carries its own id;
- every reconnect attempt counts up CommandProducer.epoch;
- on every (re)connect before any receipt reached it, the counter is reset to PRODUCER_SUCCESS's
  ``last_sequence_id + 1``, while sends with higher ids are still pending or in the open batch,
  so one batch may hold old ids followed by smaller new ones;
- on reconnect it resends its pending sends in order, unchanged;
- a receipt for the head of its queue completes it; a receipt above the head closes the
  connection; a SEND_ERROR closes the connection; a send timeout fails everything pending and
  keeps the counter.

Faults: adds that fail (with every add after them; the recovery of the failed ledger may keep
some of them in the log), adds confirmed late, connections
cut (frames in flight lost), the topic losing ownership for a while (writes refused), send
timeouts, and broker crashes: the a prefix of the adds in flight is stored (recovery), every connection
is cut, and a new topic instance rebuilds its dedup state from the snapshot and the log, as a
new owner does.

Checked on every seed, from what the clients were told and what the log holds:
- no acknowledged message lost (a receipt means the message is in the log);
- with dedup on, no message stored twice;
- per producer, first occurrences in the log follow the send order;
- a receipt's position holds the message it acknowledges.

    .venv/bin/python -m tests.sim.publish_sim --seeds 0-999          # a range of seeds
    .venv/bin/python -m tests.sim.publish_sim --seed 17 --trace       # replay one, with its trace
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import sys
from collections import deque
from dataclasses import dataclass, field

from broker.config import BrokerConfig
from broker.managed_ledger import ManagedLedgerState, Position
from broker.topic import EntryCache, PersistentTopic, PublishBuffer
from pulsarlite.errors import PulsarliteError
from pulsarlite.topic_name import TopicName
from pulsarlite.wire.entry import Message, build_batch_entry, build_entry, unpack_entry

TOPIC = TopicName.parse("persistent://public/default/sim")
LEDGER_ID = 5


class SimAddError(PulsarliteError):
    """A simulated add failure (bookies gone, ledger fenced ...)."""

    retriable = True


class SimulationViolation(AssertionError):
    pass


# -- the managed ledger and the metadata store ------------------------------------------------

class SimLog:
    """What survives a broker crash: the stored entries (in order) and the dedup snapshot."""

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.snapshot: bytes | None = None
        self.snapshot_version = -1


class SimStore:
    """The metadata store, as far as the dedup snapshot uses it."""

    def __init__(self, log: SimLog) -> None:
        self.log = log

    async def get_or_none(self, path):
        if self.log.snapshot is None:
            return None
        return self.log.snapshot, self.log.snapshot_version

    async def create(self, path, data, make_parents=False):
        from pulsarlite.metadata import MetadataExistsError
        if self.log.snapshot is not None:
            raise MetadataExistsError(path)
        self.log.snapshot, self.log.snapshot_version = data, 0

    async def set(self, path, data, version):
        from pulsarlite.errors import MetadataVersionConflict
        if version != self.log.snapshot_version:
            raise MetadataVersionConflict(path)
        self.log.snapshot = data
        self.log.snapshot_version += 1
        return self.log.snapshot_version

    async def delete(self, path, version):
        self.log.snapshot = None


@dataclass
class _Add:
    data: bytes
    done: object
    outcome: str | None = None     # decided by the simulation: "ok" | "fail"


class SimManagedLedger:
    """Adds complete in order (the simulation decides when). A failed add fails every add after
    it (the ledger's error is sticky, as in ours) and starts a rollover: the recovery that closes
    the failed ledger may keep some of the failed adds (in the log although failed back), and
    reports them to the kept-entries listeners when the rollover ends; adds queue meanwhile."""

    def __init__(self, log: SimLog, trace: list[str]) -> None:
        self.log = log
        self.trace = trace
        self.pending: deque[_Add] = deque()
        self.state = ManagedLedgerState.READY
        self.kept_listeners: list = []
        self.kept_unread_listeners: list = []
        self.rollover_listeners: list = []
        self._kept: list[tuple[Position, bytes]] = []

    @property
    def pending_count(self) -> int:
        return len(self.pending)

    @property
    def current_ledger_id(self) -> int:
        return LEDGER_ID

    @property
    def last_confirmed_position(self) -> Position:
        return Position(LEDGER_ID, len(self.log.entries) - 1)

    def ledgers(self):
        from broker.managed_ledger.core import LedgerInfo
        return [LedgerInfo(LEDGER_ID, entries=len(self.log.entries), size_bytes=0)]

    def add_entries(self, datas, publish_times, done, context) -> None:
        """The managed ledger's one add path; each entry completes on its own (a range of one)."""
        for offset, data in enumerate(datas):
            self.pending.append(_Add(data, lambda position, error, offset=offset: done(context, offset, offset,
                                                                                       position, error)))

    def complete_head(self, stored: bool, kept_max: int = 0) -> None:
        """Confirm the oldest add, or fail it and every add after it, keeping up to
        ``kept_max`` of the failed ones in the log (written to a quorum before the error)."""
        if self.state is not ManagedLedgerState.READY:
            return
        if stored:
            add = self.pending.popleft()
            self.trace.append(f"add stored: {messages_of(add.data)}")
            self.log.entries.append(add.data)
            add.done(Position(LEDGER_ID, len(self.log.entries) - 1), None)
            return
        failed, self.pending = list(self.pending), deque()
        for add in failed[:kept_max]:
            self.log.entries.append(add.data)
            self._kept.append((Position(LEDGER_ID, len(self.log.entries) - 1), add.data))
        self.trace.append(f"adds failed: {[messages_of(a.data) for a in failed]}, {min(kept_max, len(failed))} kept")
        self.state = ManagedLedgerState.ROLLING_OVER
        for add in failed:
            add.done(None, SimAddError("simulated add failure"))

    def finish_rollover(self) -> None:
        if self.state is not ManagedLedgerState.ROLLING_OVER:
            return
        kept, self._kept = self._kept, []
        if kept:
            for listener in list(self.kept_listeners):
                listener(kept)
        self.state = ManagedLedgerState.READY
        self.trace.append(f"rolled over ({len(kept)} failed adds kept)")
        for listener in list(self.rollover_listeners):
            listener(LEDGER_ID)

    async def read_entries(self, position: Position, count: int):
        start = position.entry_id
        return [(Position(LEDGER_ID, i), self.log.entries[i])
                for i in range(start, min(len(self.log.entries), start + count))]

    async def close(self) -> None:
        pass


class SimService:
    def __init__(self, log: SimLog, config: BrokerConfig) -> None:
        self.config = config
        self.entry_cache = EntryCache(1 << 20)
        self.publish_buffer = PublishBuffer(1 << 30)
        self.owned = True
        self.store = SimStore(log)
        self.unloads = 0
        outer = self

        class _Ownership:
            def write_guard(self, name):
                return lambda: outer.owned
        self.ownership = _Ownership()

    def on_add_error(self, error) -> None:
        pass

    async def unload_topic(self, key) -> None:
        self.unloads += 1


# -- the official producer ----------------------------------------------------------------------

@dataclass
class _Op:
    """One CommandSend the client keeps until its receipt: a batch or a single message."""

    first: int                         # CommandSend.sequence_id (the first message's)
    count: int
    messages: list[tuple[int, int]]    # (sequence id, message number)
    data: bytes


class SimConnection:
    """One session of one producer: frames from the broker are queued and delivered later, in
    order; a cut connection delivers nothing more."""

    def __init__(self, client: "CppProducer", producer_id: int) -> None:
        self.client = client
        self.producer_id = producer_id
        self.inbox: deque[tuple] = deque()
        self.sent: deque[_Op] = deque()   # ops the topic took, answered in this order
        self.cut = False
        self.producer = None           # the topic's Producer of this session

    # ProducerHandle (called by the topic)
    def send_receipts(self, receipts) -> None:
        for sequence_id, highest_sequence_id, position in receipts:
            self.send_receipt(sequence_id, highest_sequence_id, position)

    def send_receipt(self, sequence_id, highest_sequence_id, position) -> None:
        op = self.sent.popleft()
        if op.first != sequence_id:
            raise SimulationViolation(f"receipt {sequence_id} answers the send {op.first}+{op.count}")
        if not self.cut:
            self.inbox.append(("receipt", sequence_id, highest_sequence_id, position, op))

    def send_error(self, sequence_id, error) -> None:
        op = self.sent.popleft()
        if not self.cut:
            self.inbox.append(("error", sequence_id))

    def close_by_broker(self) -> None:
        if not self.cut:
            self.inbox.append(("close",))


class CppProducer:
    def __init__(self, sim: "PublishSimulation", name: str, batching: bool, batch_max: int) -> None:
        self.sim = sim
        self.name = name
        self.batching = batching
        self.batch_max = batch_max
        self.generator = 0
        self.last_published = -1           # lastSequenceIdPublished_
        self.pending: deque[_Op] = deque()
        self.container: list[tuple[int, int]] = []    # the open batch
        self.connection: SimConnection | None = None
        self.next_message = 0
        self.acked: dict[int, Position] = {}          # message number -> receipt position
        self.failed: set[int] = set()
        self.misattributed: set[int] = set()   # completed by a receipt meant for another send
        self.sessions = 0
        self.attempts = 0                       # connect attempts (CommandProducer.epoch)

    # the application
    def send(self) -> None:
        if not self.sessions:
            return       # create_producer returns once the producer is registered: no send before
        number = self.next_message
        self.next_message += 1
        sequence_id = self.generator
        self.generator += 1
        self.container.append((sequence_id, number))
        if not self.batching or len(self.container) >= self.batch_max:
            self.seal()

    def seal(self) -> None:
        if not self.container:
            return
        messages, self.container = self.container, []
        first = messages[0][0]
        if self.batching:
            data = build_batch_entry([Message(payload(self.name, n), sequence_id=s) for s, n in messages],
                                     producer_name=self.name, sequence_id=first, publish_time_ms=1,
                                     sequence_ids=[s for s, _ in messages])
        else:
            data = build_entry(Message(payload(self.name, messages[0][1])), producer_name=self.name,
                               sequence_id=first, publish_time_ms=1)
        op = _Op(first, len(messages), messages, data)
        self.pending.append(op)
        if self.connection is not None:
            self._send_op(op)

    def _send_op(self, op: _Op) -> None:
        conn = self.connection
        self.sim.trace.append(f"{self.name} send {op.first}+{op.count} {[n for _, n in op.messages]}")
        # CommandSend: sequence_id = first; highest_sequence_id unset (0: the connection passes
        # the sequence id)
        conn.sent.append(op)
        refused = self.sim.topic.publish(conn.producer, [(op.first, op.first, op.data)])
        if refused:
            conn.sent.remove(op)      # refused at once: the connection answers SEND_ERROR
            conn.inbox.append(("error", op.first))
            self.sim.trace.append(f"{self.name} send refused: {refused[0][1]!r}")

    def timeout(self) -> None:
        """The send timeout: every pending send and the open batch fail; the counter stays."""
        for op in self.pending:
            for _, n in op.messages:
                self.failed.add(n)
        for _, n in self.container:
            self.failed.add(n)
        self.pending.clear()
        self.container = []
        self.sim.trace.append(f"{self.name} send timeout")

    # the connection
    def connect(self) -> None:
        topic = self.sim.topic
        conn = SimConnection(self, self.sessions)
        epoch = self.attempts              # the C++ client counts every reconnect attempt
        self.attempts += 1
        try:
            producer = topic.add_producer(conn, self.name, None)
        except Exception as e:
            self.sim.trace.append(f"{self.name} connect refused: {e!r}")
            return
        self.sessions += 1
        conn.producer = producer
        # as broker/connection.py does for PRODUCER_SUCCESS
        given = topic.start_producer_session(producer, epoch)
        self.connection = conn
        self.sim.trace.append(f"{self.name} connected given={given} last_published={self.last_published}")
        if self.last_published == -1:     # no receipt yet: the C++ client's reset
            self.last_published = given
            self.generator = given + 1
        for op in list(self.pending):
            if self.connection is not conn:
                break
            self._send_op(op)

    def disconnect(self, why: str) -> None:
        conn = self.connection
        if conn is None:
            return
        conn.cut = True
        conn.inbox.clear()
        self.connection = None
        if conn.producer is not None and self.sim.topic is not None:
            self.sim.topic.remove_producer(conn.producer)   # as the connection does when it closes
        self.sim.trace.append(f"{self.name} disconnected ({why})")

    def deliver_one(self) -> bool:
        conn = self.connection
        if conn is None or not conn.inbox:
            return False
        frame = conn.inbox.popleft()
        kind = frame[0]
        if kind == "close":
            self.disconnect("closed by the broker")
        elif kind == "error":
            self.disconnect(f"SEND_ERROR {frame[1]}")
        else:
            _, sequence_id, highest, position, answered = frame
            if not self.pending:
                return True
            head = self.pending[0]
            last = head.first + head.count - 1
            if sequence_id > last:
                self.disconnect(f"receipt {sequence_id} above the head {head.first}..{last}")
            elif sequence_id < head.first:
                pass                       # a timed-out send's receipt: ignored
            else:
                self.pending.popleft()
                self.last_published = last
                if answered is not head:
                    # the client matches receipts by sequence id: a late receipt of a send that
                    # timed out completes a newer send that reuses its id (a client defect: the
                    # broker answered another send). Counted, not taken as the broker's word.
                    self.misattributed.update(n for _, n in head.messages)
                else:
                    for _, n in head.messages:
                        self.acked[n] = position
                self.sim.trace.append(f"{self.name} receipt {sequence_id} at {tuple(position)} "
                                      f"for {[n for _, n in head.messages]}")
        return True


def messages_of(data: bytes) -> list[str]:
    return [bytes(m.payload).decode() for m in unpack_entry(data)[1]]


def payload(name: str, number: int) -> bytes:
    return f"{name}|{number}".encode()


# -- the simulation -------------------------------------------------------------------------------

@dataclass
class SimResult:
    seed: int
    steps: int
    acked: int
    stored: int
    crashes: int
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


class PublishSimulation:
    def __init__(self, seed: int, *, steps: int = 400, producers: int = 2, kept_failed: bool = True) -> None:
        self.seed = seed
        self.kept_failed = kept_failed
        self.rng = random.Random(seed)
        self.steps = steps
        self.log = SimLog()
        self.config = dataclasses.replace(BrokerConfig(), dedup_snapshot_interval_entries=self.rng.choice([5, 50, 1000]))
        self.trace: list[str] = []
        self.crashes = 0
        self.service: SimService | None = None
        self.topic: PersistentTopic | None = None
        self.ml: SimManagedLedger | None = None
        self.clients = [CppProducer(self, f"p{i}", batching=self.rng.random() < 0.6,
                                    batch_max=self.rng.choice([2, 3, 5])) for i in range(producers)]

    async def load_topic(self) -> None:
        self.service = SimService(self.log, self.config)
        self.ml = SimManagedLedger(self.log, self.trace)
        self.topic = PersistentTopic(self.service, TOPIC, self.ml)
        self.topic.dedup = await self.topic._load_dedup()
        self.trace.append(f"topic loaded: {len(self.log.entries)} entries in the log")

    async def crash(self) -> None:
        """The broker dies: a prefix of the adds in flight is stored (recovery decides); every
        connection is cut; a new owner loads the topic."""
        self.crashes += 1
        # recovery closes the ledger somewhere among the adds in flight: a prefix of them is stored
        writing = [] if self.ml.state is ManagedLedgerState.ROLLING_OVER else list(self.ml.pending)  # else queued
        for add in writing[:self.rng.randint(0, len(writing))]:
            self.log.entries.append(add.data)
        self.ml.pending.clear()
        for client in self.clients:
            conn = client.connection
            if conn is not None:
                conn.cut = True
                conn.inbox.clear()
                client.connection = None
        self.trace.append("broker crash")
        await self.load_topic()

    async def run(self) -> SimResult:
        await self.load_topic()
        rng = self.rng
        p_fail = rng.choice([0.0, 0.05, 0.2])
        for step in range(self.steps):
            r = rng.random()
            client = rng.choice(self.clients)
            if r < 0.30:
                if client.connection is None and rng.random() < 0.5:
                    client.connect()
                else:
                    for _ in range(rng.randint(1, 4)):
                        client.send()
            elif r < 0.38:
                client.seal()              # the batch timer
            elif r < 0.62:
                if self.ml.state is ManagedLedgerState.ROLLING_OVER:
                    if rng.random() < 0.5:
                        self.ml.finish_rollover()
                    continue
                for _ in range(rng.randint(1, 4)):
                    if self.ml.pending:
                        stored = rng.random() >= p_fail
                        self.ml.complete_head(stored, kept_max=rng.choice([0, 0, 1, 2]) if self.kept_failed else 0)
            elif r < 0.86:
                for _ in range(rng.randint(1, 6)):
                    client.deliver_one()
            elif r < 0.90:
                client.disconnect("connection cut")
            elif r < 0.93:
                self.service.owned = not self.service.owned
                self.trace.append(f"owned={self.service.owned}")
            elif r < 0.95:
                client.timeout()
            elif r < 0.96:
                await self.crash()
            else:
                await asyncio.sleep(0)       # spawned tasks (snapshots) run
        await self.heal()
        return self.check()

    async def heal(self) -> None:
        """Everything completes: ownership back, adds confirmed, clients reconnected until each
        has an answer for every send (bounded)."""
        self.service.owned = True
        for _ in range(200):
            for client in self.clients:
                client.seal()
                if client.connection is None:
                    client.connect()
            self.ml.finish_rollover()
            while self.ml.pending:
                self.ml.complete_head(True)
            progressed = True
            while progressed:
                progressed = False
                for client in self.clients:
                    while client.deliver_one():
                        progressed = True
                self.ml.finish_rollover()
                while self.ml.pending:
                    self.ml.complete_head(True)
                    progressed = True
            await asyncio.sleep(0)
            if all(not c.pending and not c.container for c in self.clients):
                return
        for client in self.clients:
            if client.pending:
                self.trace.append(f"{client.name}: {len(client.pending)} sends unanswered after healing")

    def check(self) -> SimResult:
        stored: dict[str, list[int]] = {c.name: [] for c in self.clients}
        where: dict[tuple[str, int], list[int]] = {}
        for index, data in enumerate(self.log.entries):
            _, messages = unpack_entry(data)
            for m in messages:
                name, number = bytes(m.payload).decode().split("|")
                stored[name].append(int(number))
                where.setdefault((name, int(number)), []).append(index)
        for index, data in enumerate(self.log.entries):
            self.trace.append(f"log {index}: {[bytes(m.payload).decode() for m in unpack_entry(data)[1]]}")
        violations = []
        for client in self.clients:
            seen = stored[client.name]
            present = set(seen)
            lost = sorted(n for n in client.acked if n not in present)
            if lost:
                violations.append(f"{client.name}: {len(lost)} acknowledged messages lost: {lost[:20]}")
            twice = sorted({n for n in seen if seen.count(n) > 1})
            if twice:
                violations.append(f"{client.name}: {len(twice)} messages stored twice with dedup on: {twice[:20]}")
            first_seen: list[int] = []
            done: set[int] = set()
            for n in seen:
                if n not in done:
                    done.add(n)
                    first_seen.append(n)
            out_of_order = [(a, b) for a, b in zip(first_seen, first_seen[1:]) if b < a]
            if out_of_order:
                violations.append(f"{client.name}: first occurrences out of order: {out_of_order[:10]}")
            for n, position in client.acked.items():
                if position.ledger_id < 0:
                    continue      # a duplicate's receipt (-1, -1)
                if position.entry_id not in where.get((client.name, n), []):
                    violations.append(f"{client.name}: message {n} acknowledged at {tuple(position)}, "
                                      f"which does not hold it")
                    break
            if client.pending:
                violations.append(f"{client.name}: {len(client.pending)} sends never answered")
        acked = sum(len(c.acked) for c in self.clients)
        return SimResult(self.seed, self.steps, acked, len(self.log.entries), self.crashes, violations, self.trace)


_QUIET = ("pulsarlite.broker", "pulsarlite.broker.dedup")


def run_seed(seed: int, **kwargs) -> SimResult:
    """One seed; the topic's own warnings (fenced writes, reused ids) are the faults we cause,
    and are kept out of the output (the trace tells the story)."""
    import logging
    levels = {name: logging.getLogger(name).level for name in _QUIET}
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        return asyncio.run(PublishSimulation(seed, **kwargs).run())
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def replay_command(seed: int) -> str:
    return f".venv/bin/python -m tests.sim.publish_sim --seed {seed} --trace"


def check_seed(seed: int, **kwargs) -> SimResult:
    result = run_seed(seed, **kwargs)
    if not result.ok:
        raise SimulationViolation(f"seed {seed}: {'; '.join(result.violations)}\nreplay: {replay_command(seed)}")
    return result


SWEEP_CHUNKS = 10
SWEEP_CONFIGS = tuple(f"chunk{i}" for i in range(SWEEP_CHUNKS))    # one configuration, in 10 chunks


def sweep_units(config: str, seeds: int) -> range:
    """The seeds of one chunk of the sweep (tests/sim/background_sweep.py)."""
    size = -(-seeds // SWEEP_CHUNKS)
    chunk = SWEEP_CONFIGS.index(config)
    return range(chunk * size, min(seeds, (chunk + 1) * size))


def sweep_seed(seed: int, config: str = "chunk0") -> tuple[list[str], dict[str, int], str]:
    """One unit of the suite's sweep (tests/sim/background_sweep.py): violations, counters and
    the replay command of one seed."""
    result = run_seed(seed)
    stats = {"acked": result.acked, "stored": result.stored, "crashes": result.crashes}
    return result.violations, stats, replay_command(seed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.publish_sim", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int)
    p.add_argument("--seeds", default="0-999", help="a range A-B (inclusive)")
    p.add_argument("--trace", action="store_true")
    args = p.parse_args(argv)
    import logging
    logging.basicConfig(level=logging.ERROR)
    if args.seed is not None:
        seeds = [args.seed]
    else:
        a, b = (int(x) for x in args.seeds.split("-"))
        seeds = range(a, b + 1)
    failed = 0
    for done, seed in enumerate(seeds, 1):
        result = run_seed(seed)
        if done % 1000 == 0:
            print(f"progress: {done}/{len(seeds)} seeds, {failed} failed", flush=True)
        if args.trace:
            print("\n".join(result.trace))
        if not result.ok:
            failed += 1
            print(f"seed {seed}: FAILED: {'; '.join(result.violations)}  replay: {replay_command(seed)}", flush=True)
    print(f"{len(seeds) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Dispatch and cursor benchmark (SUBS-DISPATCH).

    .venv/bin/python bench/bench_dispatch.py [--messages N] [--e2e-messages N] [--no-e2e] [--dir D]

Phases (figures printed as markdown on stdout, progress on stderr; no assertions):

  core        the pure DispatcherCore alone: Shared and Key_Shared (1,000 keys), 4 consumers,
              one message per entry, FLOW in grants of 500, every delivery acked: msg/s of
              offer + dispatch + ack (the broker's per-message dispatch logic, no I/O)
  e2e         a fresh local cluster (3 bookies, 1 broker): N messages published first (batched;
              Key_Shared with key-based batching, 1,000 keys), then 4 consumers of the official
              client (one thread each, same process) drain the subscription with acks: msg/s
              from the first to the last message received
  cursor      a durable cursor with 10,000 acked holes (every other entry of 20,000 acked):
              the cost of one persist: serialise (CursorState.to_bytes) and the ZooKeeper write
              (ManagedCursor.flush against a real ZooKeeper server), size of the znode
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import drain_consumers, work_dir  # noqa: E402
from broker.cursor import CursorState, ManagedCursor  # noqa: E402
from broker.dispatch import DispatcherCore, SubType  # noqa: E402
from broker.key_shared import sticky_key_hash  # noqa: E402
from broker.managed_ledger.core import Position  # noqa: E402


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


# -- core ----------------------------------------------------------------------------------------
def bench_core(sub_type: SubType, messages: int) -> float:
    rng = random.Random(1)
    slots = [sticky_key_hash(f"key-{k}") for k in range(1000)]
    core = DispatcherCore(sub_type, pending_entries_max=1000)
    consumers = [f"c{i}" for i in range(4)]
    for c in consumers:
        core.add_consumer(c)
        core.flow(c, 1000)
    received = dict.fromkeys(consumers, 0)
    next_pos = 0
    done = 0
    t0 = time.perf_counter()
    while done < messages:
        want = core.read_wanted()
        if want and next_pos < messages:
            n = min(want, messages - next_pos)
            if sub_type is SubType.KEY_SHARED:
                core.offer([(p, 1, rng.choice(slots)) for p in range(next_pos, next_pos + n)])
            else:
                core.offer([(p, 1) for p in range(next_pos, next_pos + n)])
            next_pos += n
        deliveries = core.dispatch()
        core.ack([d.position for d in deliveries])
        done += len(deliveries)
        for d in deliveries:
            received[d.consumer] += 1
            if received[d.consumer] % 500 == 0:    # the client refills at half its queue
                core.flow(d.consumer, 500)
    elapsed = time.perf_counter() - t0
    say(f"core {sub_type.value}: {messages} in {elapsed:.2f}s; per consumer {received}")
    return messages / elapsed


# -- end to end ----------------------------------------------------------------------------------
def bench_e2e(service_url: str, sub_type_name: str, messages: int, *,
              key_batching: bool | None = None) -> tuple[float, dict]:
    import pulsar
    client = pulsar.Client(service_url, operation_timeout_seconds=60,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    topic = f"persistent://public/default/bench-dispatch-{sub_type_name.lower()}-{int(time.time())}"
    ctype = getattr(pulsar.ConsumerType, sub_type_name)
    consumers = [client.subscribe(topic, "bench", consumer_type=ctype, receiver_queue_size=1000,
                                  initial_position=pulsar.InitialPosition.Earliest) for _ in range(4)]
    if key_batching is None:
        key_batching = sub_type_name == "KeyShared"
    kwargs = {"batching_type": pulsar.BatchingType.KeyBased} if key_batching else {}
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=10,
                                      block_if_queue_full=True, max_pending_messages=20000, **kwargs)
    # published first with everyone connected but not receiving yet (their queues fill to 1,000
    # each), then drained: the rate is the dispatch path (read, dispatch, MESSAGE, ACK)
    payload = b"x" * 100
    for i in range(messages):
        producer.send_async(payload, None, partition_key=f"key-{i % 1000}")
    producer.flush()
    say(f"e2e {sub_type_name}: {messages} published")
    counts, rate = drain_consumers(consumers)
    total = sum(counts)
    say(f"e2e {sub_type_name}: {total} received, per consumer {counts}, {rate:,.0f} msg/s")
    producer.close()
    for c in consumers:
        c.close()
    client.close()
    return rate, {"received": total, "per_consumer": counts}


# -- cursor --------------------------------------------------------------------------------------
async def bench_cursor(zk_hosts: str) -> dict:
    from pulsarlite.metadata import MetadataStore
    entries = 20_000
    state = CursorState(Position(1, -1), ledgers=[(1, entries)])
    for e in range(1, entries, 2):
        state.ack_individual(Position(1, e))
    assert state.range_count == 10_000, state.range_count
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        data = state.to_bytes()
        times.append(time.perf_counter() - t0)
    serialise_ms = statistics.median(times) * 1000
    store = await MetadataStore.connect(zk_hosts)
    try:
        await store.create("/managed-ledgers/public/default/persistent/bench-t", b"{}", make_parents=True)
        cursor = await ManagedCursor.open(store, "public/default/persistent/bench-t", "sub", initial=Position(1, -1),
                                          ledgers=lambda: [(1, entries)])
        for e in range(1, entries, 2):
            cursor.ack_individual(Position(1, e))
        await cursor.flush()
        writes = []
        for i in range(20):
            # one more acked hole (a real change), then a persist of the whole state
            cursor.ack_individual(Position(1, entries + 2 * i + 1))
            t0 = time.perf_counter()
            await cursor.flush()
            writes.append(time.perf_counter() - t0)
        assert cursor.core.range_count >= 10_000
        await cursor.close()
    finally:
        await store.close()
    return {"serialise_ms": serialise_ms, "bytes": len(data),
            "persist_ms_p50": statistics.median(writes) * 1000,
            "persist_ms_max": max(writes) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--e2e-messages", type=int, default=50_000)
    ap.add_argument("--no-e2e", action="store_true")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    rows = []
    for st in (SubType.SHARED, SubType.KEY_SHARED):
        rate = bench_core(st, args.messages)
        rows.append((f"dispatcher core, {st.value}, 4 consumers", f"{rate:,.0f} msg/s"))
    with work_dir(args.dir, "bench-dispatch-") as base:
        from pulsarlite.zk_server import ZooKeeperServer
        if not args.no_e2e:
            from faces.cluster import LocalCluster
            cluster = LocalCluster(base / "cluster")
            try:
                cluster.start_processes(bookies=3, brokers=1)
                for name in ("Shared", "KeyShared"):
                    rate, info = bench_e2e(cluster.service_url, name, args.e2e_messages)
                    rows.append((f"end to end, {name}, 4 consumers (official client, 1 process), "
                                 f"{args.e2e_messages} msgs", f"{rate:,.0f} msg/s (per consumer {info['per_consumer']})"))
            finally:
                cluster.stop()
        zk = ZooKeeperServer(base / "zk")
        zk.start(timeout_s=60)
        try:
            res = asyncio.run(bench_cursor(zk.connect_string))
        finally:
            zk.stop()
        rows.append(("cursor with 10,000 acked holes: serialise (to_bytes)", f"{res['serialise_ms']:.1f} ms"))
        rows.append(("cursor with 10,000 acked holes: persist (serialise + ZooKeeper CAS write)",
                     f"p50 {res['persist_ms_p50']:.1f} ms, max {res['persist_ms_max']:.1f} ms, "
                     f"znode {res['bytes']:,} bytes"))
        print("| figure | value |\n|---|---|")
        for k, v in rows:
            print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()

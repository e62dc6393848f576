"""The fault schedule: pure, seeded. ``make_schedule(seed, ...)`` -> the same list of
(time offset, fault) for the same arguments, so a failed run can be replayed exactly.

Faults (what the runner does):

    kill_bookie B        kill -9 bookie B; restart it after down_s
    bookie_readonly B    B's disk "fills" (restart with disk_free_bytes_override=1: it registers
                         read-only); after down_s its disk "frees" (restart with the override off)
    kill_all_bookies     kill -9 every bookie at once; restart them all after down_s
    kill_broker R        kill -9 broker R; restart it after down_s (its topics move to another)
    sigstop_broker R     SIGSTOP broker R for longer than its ZooKeeper session: its ownership
                         expires, another broker takes its topics and R must stop serving them;
                         then SIGCONT
    restart_zookeeper    kill -9 the cluster's ZooKeeper; start it again after down_s
    lose_bookie B        B is lost for good: kill -9, its disks wiped, and after down_s a fresh
                         bookie (new id, empty disks) takes its place; the ledgers that named B
                         keep their other replicas (autorecovery, where the build has it,
                         re-replicates them)

Faults run one after another (never two at once), so at most one bookie is unavailable at a
time (E - Qa = 1 for the default E3/Qw3/Qa2) except during ``kill_all_bookies``, which takes
them all down and restarts them (acknowledged entries are fsynced in the journals). A run
loses at most one bookie for good (``lose_bookie`` is never planned twice: two permanent losses
are more than Qa - 1 = 1 for ledgers written before the first one was repaired).
Every kind appears once (in a seeded order) before any kind repeats.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KILL_BOOKIE = "kill_bookie"
BOOKIE_READONLY = "bookie_readonly"
KILL_ALL_BOOKIES = "kill_all_bookies"
KILL_BROKER = "kill_broker"
SIGSTOP_BROKER = "sigstop_broker"
RESTART_ZOOKEEPER = "restart_zookeeper"
LOSE_BOOKIE = "lose_bookie"
FAULT_KINDS = (KILL_BOOKIE, BOOKIE_READONLY, KILL_ALL_BOOKIES, KILL_BROKER, SIGSTOP_BROKER, RESTART_ZOOKEEPER,
               LOSE_BOOKIE)
BROKER_FAULTS = (KILL_BROKER, SIGSTOP_BROKER)

# what a fault usually costs beyond down_s on this machine (restarts wait for stale sessions)
EXPECTED_RECOVERY_S = {KILL_BOOKIE: 6.0, BOOKIE_READONLY: 12.0, KILL_ALL_BOOKIES: 12.0,
                       KILL_BROKER: 6.0, SIGSTOP_BROKER: 10.0, RESTART_ZOOKEEPER: 3.0,
                       LOSE_BOOKIE: 6.0}


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str | None      # "bookie-2", "broker-1"; None for all bookies / ZooKeeper
    down_s: float

    def describe(self) -> str:
        return f"{self.kind}({self.target or '-'}, down {self.down_s:.1f}s)"


@dataclass(frozen=True)
class ScheduledFault:
    offset_s: float
    fault: Fault


def make_schedule(seed: int, duration_s: float, *, bookies: int, brokers: int, session_timeout_s: float,
                  kinds: tuple[str, ...] = FAULT_KINDS, gap_s: tuple[float, float] = (1.0, 4.0),
                  first_offset_s: float = 3.0) -> tuple[ScheduledFault, ...]:
    """Faults planned to start within ``[0, duration_s)``; the runner starts each one no earlier
    than its offset and never before the previous one has recovered."""
    if duration_s <= 0 or bookies < 1 or session_timeout_s <= 0:
        raise ValueError("need duration_s > 0, bookies >= 1, session_timeout_s > 0")
    unknown = set(kinds) - set(FAULT_KINDS)
    if unknown or not kinds:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}")
    if brokers < 2:  # a broker fault with no other broker to take over is an outage, not a failover test
        kinds = tuple(k for k in kinds if k not in BROKER_FAULTS)
    rng = random.Random(seed)
    bookie_names = [f"bookie-{i}" for i in range(1, bookies + 1)]
    broker_names = [f"broker-{i}" for i in range(1, brokers + 1)]
    schedule: list[ScheduledFault] = []
    t = first_offset_s
    order: list[str] = []
    while t < duration_s:
        if not order:
            order = list(kinds)
            rng.shuffle(order)
        kind = order.pop(0)
        if kind == LOSE_BOOKIE and any(p.fault.kind == LOSE_BOOKIE for p in schedule):
            if set(kinds) == {LOSE_BOOKIE}:
                break
            continue
        if kind in (KILL_BOOKIE, BOOKIE_READONLY, LOSE_BOOKIE):
            fault = Fault(kind, rng.choice(bookie_names), round(rng.uniform(1.0, 5.0), 1))
        elif kind == KILL_ALL_BOOKIES:
            fault = Fault(kind, None, round(rng.uniform(0.5, 2.0), 1))
        elif kind == KILL_BROKER:
            fault = Fault(kind, rng.choice(broker_names), round(rng.uniform(1.0, 4.0), 1))
        elif kind == SIGSTOP_BROKER:
            fault = Fault(kind, rng.choice(broker_names),
                          round(session_timeout_s * 1.5 + rng.uniform(1.0, 3.0), 1))
        else:
            fault = Fault(kind, None, round(rng.uniform(0.5, 2.0), 1))
        schedule.append(ScheduledFault(round(t, 1), fault))
        t += fault.down_s + EXPECTED_RECOVERY_S[kind] + rng.uniform(*gap_s)
    return tuple(schedule)


__all__ = ["Fault", "ScheduledFault", "make_schedule", "FAULT_KINDS", "KILL_BOOKIE", "BOOKIE_READONLY",
           "KILL_ALL_BOOKIES", "KILL_BROKER", "SIGSTOP_BROKER", "RESTART_ZOOKEEPER", "LOSE_BOOKIE"]

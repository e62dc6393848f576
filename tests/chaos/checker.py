"""The checker: pure. From what each producer was told (acknowledged / failed sequence numbers)
and what was read back from each topic (payloads in topic order, per read path), it proves:

- every acknowledged message is present (in every read path): ``lost`` must be empty;
- duplicates (a payload seen more than once in a read path) are counted, reported apart;
- order per producer: the first occurrences of a producer's messages follow its sequence.

Payloads are ``b"<producer>|<seq>"``; anything else read back is reported as ``foreign``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def payload(producer: str, seq: int) -> bytes:
    return f"{producer}|{seq}".encode()


def parse_payload(data: bytes) -> tuple[str, int] | None:
    try:
        producer, seq = data.decode().rsplit("|", 1)
        return producer, int(seq)
    except (UnicodeDecodeError, ValueError):
        return None


@dataclass(frozen=True)
class ProducerLog:
    topic: str
    producer: str
    acked: frozenset[int]
    failed: frozenset[int] = frozenset()
    client: str = "official"      # "official" | "pulsarlite"


@dataclass
class PathResult:
    path: str                      # e.g. "reader", "consumer"
    redelivery: bool = False       # a subscription: repeats are redeliveries (at-least-once), not stored duplicates
    read: int = 0
    lost: list[tuple[str, int]] = field(default_factory=list)
    duplicated: int = 0
    order_violations: list[str] = field(default_factory=list)
    unacked_present: int = 0
    foreign: int = 0
    lost_after_last_read: int = 0  # lost messages beyond the producer's last one read (a read cut short?)


@dataclass
class Verdict:
    acknowledged: int
    failed_sends: int
    paths: list[PathResult]

    @property
    def lost(self) -> int:
        return max((len(p.lost) for p in self.paths), default=0)

    @property
    def duplicated(self) -> int:
        """Messages stored more than once (seen by the storage read paths, e.g. a reader)."""
        return max((p.duplicated for p in self.paths if not p.redelivery), default=0)

    @property
    def redelivered(self) -> int:
        return max((p.duplicated for p in self.paths if p.redelivery), default=0)

    @property
    def ok(self) -> bool:
        return all(not p.lost and not p.order_violations for p in self.paths)

    def summary(self) -> str:
        parts = [f"acknowledged={self.acknowledged} failed_sends={self.failed_sends}"]
        for p in self.paths:
            repeats = "redelivered" if p.redelivery else "duplicated"
            tail = f" (of which {p.lost_after_last_read} after the last read)" if p.lost_after_last_read else ""
            parts.append(f"{p.path}: read={p.read} lost={len(p.lost)}{tail} {repeats}={p.duplicated} "
                         f"order_violations={len(p.order_violations)} unacked_present={p.unacked_present}"
                         + (f" foreign={p.foreign}" if p.foreign else ""))
        return "; ".join(parts)


def check_path(path: str, producers: list[ProducerLog], read_back: dict[str, list[bytes]],
               redelivery: bool = False) -> PathResult:
    result = PathResult(path, redelivery)
    by_topic: dict[str, list[ProducerLog]] = {}
    for log in producers:
        by_topic.setdefault(log.topic, []).append(log)
    for topic, logs in by_topic.items():
        known = {log.producer: log for log in logs}
        seen: dict[str, set[int]] = {name: set() for name in known}
        last: dict[str, int] = {}
        for data in read_back.get(topic, []):
            result.read += 1
            parsed = parse_payload(data)
            if parsed is None or parsed[0] not in known:
                result.foreign += 1
                continue
            name, seq = parsed
            if seq in seen[name]:
                result.duplicated += 1
                continue
            seen[name].add(seq)
            if name in last and seq <= last[name]:
                result.order_violations.append(f"{topic} {name}: {seq} after {last[name]}")
            last[name] = max(seq, last.get(name, seq))
        for name, log in known.items():
            missing = sorted(log.acked - seen[name])
            result.lost.extend((name, seq) for seq in missing)
            last_read = max(seen[name], default=-1)
            result.lost_after_last_read += sum(1 for seq in missing if seq > last_read)
            result.unacked_present += len(seen[name] - log.acked)
    return result


def check(producers: list[ProducerLog], read_paths: dict[str, dict[str, list[bytes]]],
          redelivery_paths: frozenset[str] = frozenset({"consumer"})) -> Verdict:
    """``read_paths``: {path name: {topic: payloads in read order}}; repeats in the paths named
    in ``redelivery_paths`` (subscriptions) count as redeliveries, elsewhere as duplicates."""
    return Verdict(acknowledged=sum(len(p.acked) for p in producers),
                   failed_sends=sum(len(p.failed) for p in producers),
                   paths=[check_path(name, producers, back, name in redelivery_paths)
                          for name, back in read_paths.items()])


__all__ = ["ProducerLog", "PathResult", "Verdict", "check", "check_path", "payload", "parse_payload"]

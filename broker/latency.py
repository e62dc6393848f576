"""Publish latency counted per bucket (pure; no I/O, no clock).

A topic adds one latency per confirmed SEND (a run of SENDs confirmed together adds the run's
latency once per SEND); the broker folds each topic's counts into its metrics at every stats
tick and the Prometheus histogram ``pulsarlite_publish_latency_seconds`` exports the totals.
Every SEND is counted (one bisect), so the histogram is not a sample of the start of each
interval.
"""

from __future__ import annotations

from bisect import bisect_left

# fine between 1 and 10 ms, where a healthy publish lands (the p99 goal is 5 ms)
PUBLISH_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05,
                             0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LatencyBuckets:
    """Counts per bucket of ``PUBLISH_LATENCY_BUCKETS_S`` (a latency goes to the first bound
    >= it; the last slot is +Inf) and the sum of the latencies."""

    __slots__ = ("counts", "sum_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(PUBLISH_LATENCY_BUCKETS_S) + 1)
        self.sum_s = 0.0

    def add(self, latency_s: float, n: int = 1) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not latency_s >= 0.0:            # NaN or negative: a bug in the caller's clock use
            raise ValueError(f"latency must be >= 0 s, got {latency_s!r}")
        self.counts[bisect_left(PUBLISH_LATENCY_BUCKETS_S, latency_s)] += n
        self.sum_s += latency_s * n

    def merge(self, other: "LatencyBuckets") -> None:
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.sum_s += other.sum_s

    @property
    def total(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, count of latencies <= it) for every bound, then (inf, total)."""
        out = []
        running = 0
        for bound, n in zip(PUBLISH_LATENCY_BUCKETS_S + (float("inf"),), self.counts):
            running += n
            out.append((bound, running))
        return out

"""bench/suite.py's table: medians over rounds, ratios taken pair by pair within a round, and
each goal row's verdict computed from the figures (not a test of performance: of the arithmetic
that turns the scripts' JSON into BENCHMARKS.md's table)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def suite():
    spec = importlib.util.spec_from_file_location("bench_suite", ROOT / "bench" / "suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def broker_round(suite, batched, unbatched, perf, p99, nats_durable, nats_default, nats_p99,
                 batched_p99=None, page_cache_new=500.0, floor_p99=None, ceiling=240_000.0,
                 perf_ceiling=700_000.0):
    r = suite.Round()
    r.limits = {"disk_fsync_seq_mb_s": 400.0, "disk_append_fdatasync_ops_s": 5000.0, "loopback_mb_s": 3000.0,
                "page_cache_write_mb_per_cpu_s": {"new": page_cache_new, "cached": 8000.0}}
    r.broker = {"results": {"batched": {"msg_s": batched}, "ceiling batched": {"msg_s": ceiling},
                            "ceiling perf": {"msg_s": perf_ceiling, "client_cpu_us": 1.0},
                            "unbatched": {"msg_s": unbatched}, "perf": {"msg_s": perf, "client_cpu_us": 3.0},
                            "paced": {"p50_ms": 2.0, "p99_ms": p99, "broker_p50_ms": 1.0, "broker_p99_ms": p99 - 1},
                            "paced-batched": {"p50_ms": 1.5, "p99_ms": batched_p99 or p99,
                                              "broker_p50_ms": 0.5, "broker_p99_ms": 2.0}},
                "cpu_us": {"unbatched": {"broker-1": 50.0, "bookie-1": 8.0}}}
    r.nats = {"durable": {"msg_s": nats_durable}, "default": {"msg_s": nats_default},
              "paced": {"p50_ms": 0.5, "p99_ms": 1.0}, "paced-durable": {"p50_ms": 1.0, "p99_ms": nats_p99}}
    if floor_p99 is not None:
        r.floor = {"results": [
            {"target": "floor", "mode": "unbatched", "p50_ms": 0.9, "p99_ms": floor_p99, "machine_busy_pct": 150.0},
            {"target": "floor", "mode": "batched-1ms", "p50_ms": 1.2, "p99_ms": floor_p99 / 2,
             "machine_busy_pct": 80.0}]}
    return r


def row(rows, prefix):
    found = [r for r in rows if r[0].startswith(prefix)]
    assert len(found) == 1, (prefix, [r[0] for r in rows])
    return found[0]


def test_ratios_are_taken_within_a_round_then_the_median(suite):
    # round 1: ours 21k vs peer 10k (2.1x); round 2: 19k vs 5k (3.8x); round 3: 30k vs 7k (4.3x)
    rounds = [broker_round(suite, 210_000, 21_000, 600_000, 4.0, 10_000, 50_000, 3.0, 6.0, 400.0,
                           ceiling=200_000, perf_ceiling=700_000),
              broker_round(suite, 190_000, 19_000, 400_000, 6.0, 5_000, 100_000, 3.0, 5.5, 4000.0,
                           ceiling=240_000, perf_ceiling=420_000),
              broker_round(suite, 230_000, 30_000, 550_000, 4.5, 7_000, 40_000, 3.0, 4.0, 800.0,
                           ceiling=250_000, perf_ceiling=560_000)]
    rows = suite.table(rounds)
    unbatched = row(rows, "produce, unbatched")
    assert unbatched[1] == "21,000 msg/s"          # median of 21k, 19k, 30k
    assert unbatched[3] == "3.80"                  # median of 2.1, 3.8, 4.3 (medians' ratio: 21k / 7k = 3.0)
    assert unbatched[5] == "met"                   # >= 20k and >= 3x
    official = row(rows, "produce, batched, official")
    # over its ceiling per round: 1.05, 0.79, 0.92 -> 0.92 (the medians' ratio 210k / 240k = 0.875)
    assert official[3] == "0.92" and official[4] == ">= 0.9 of its ceiling" and official[5] == "met"
    assert official[2] == "its ceiling against a null broker 240,000 msg/s; old goal >= 200k msg/s (met)"
    perf = row(rows, "produce, batched, `pulsarlite perf")
    # over the same command against the null broker: 0.857, 0.952, 0.982 -> 0.95 (medians' 0.98)
    assert perf[3] == "0.95" and perf[5] == "met"
    assert perf[2].startswith("the same command against a null broker 560,000 msg/s; its CPU 3.0 us/msg "
                              "(against the null broker 1.0 us/msg); old goal >= 500k msg/s (met)")
    best = row(rows, "produce, batched, best")
    # best of (official, perf) per round over the peer's default: 12.0, 4.0, 13.75 -> 12.0
    assert best[3] == "12.00" and best[5] == "met"
    latency = row(rows, "publish latency at 5k msg/s, unbatched")
    assert latency[3] == "n/a" and latency[5] == "n/a"   # no floor measured: no verdict
    assert latency[2].endswith("old goal p99 <= 5 ms (met)")      # median p99 4.5 ms
    batched = row(rows, "publish latency at 5k msg/s, client batching")
    assert batched[1] == "1.5 ms / 5.5 ms"          # median of 6, 5.5, 4
    assert batched[2].endswith("old goal p99 <= 5 ms (**missed**)")
    assert row(rows, "the same inside the broker (SEND read to entry confirmed), batched-1ms")[1] == \
        "<= 0.5 ms / <= 2.0 ms"
    assert row(rows, "JetStream paced")[1] == "0.5 ms / 1.0 ms"
    assert row(rows, "CPU per message, unbatched")[1] == "50.0 us / 8.0 us"
    page_cache = row(rows, "machine: page-cache writes")
    assert page_cache[1] == "800 MB" and page_cache[2] == "over cached pages 8,000 MB"
    assert page_cache[3] == "0.10"                   # median of 0.05, 0.5, 0.1
    # median of 3, 5, 3.5
    assert row(rows, "the same inside the broker (SEND read to entry confirmed), unbatched")[1] == \
        "<= 1.0 ms / <= 3.5 ms"


def test_the_publish_tail_goals_are_our_p99_over_the_floors_of_the_same_round(suite):
    # ours unbatched p99 4 / 6 / 4.5 over the floor's 2 / 4 / 1.5: 2.0, 1.5, 3.0 -> 2.0 (the
    # medians' ratio would be 4.5 / 2 = 2.25); batched 6 / 5.5 / 4 over 1 / 2 / 0.75
    rounds = [broker_round(suite, 210_000, 21_000, 600_000, 4.0, 10_000, 50_000, 3.0, 6.0, floor_p99=2.0),
              broker_round(suite, 190_000, 19_000, 400_000, 6.0, 5_000, 100_000, 3.0, 5.5, floor_p99=4.0),
              broker_round(suite, 230_000, 30_000, 550_000, 4.5, 7_000, 40_000, 3.0, 4.0, floor_p99=1.5)]
    rows = suite.table(rounds)
    unbatched = row(rows, "publish latency at 5k msg/s, unbatched")
    assert unbatched[2].startswith("the floor 0.9 ms / 2.0 ms;")
    assert unbatched[3] == "2.00" and unbatched[4] == "p99 <= 2x the floor's" and unbatched[5] == "met"
    batched = row(rows, "publish latency at 5k msg/s, client batching")
    assert batched[2].startswith("the floor 1.2 ms / 1.0 ms;")
    assert batched[3] == "5.33"                      # median of 6/1, 5.5/2, 4/0.75
    assert batched[4] == "p99 <= 1.5x the floor's" and batched[5] == "**missed**"
    floor = row(rows, "the floor at 5k msg/s, unbatched")
    assert floor[1] == "0.9 ms / 2.0 ms" and floor[2] == "the machine busy 150 % (of 200%) under the floor"
    assert row(rows, "the floor at 5k msg/s, client batching")[1] == "1.2 ms / 1.0 ms"
    # a round without the floor (an older saved run) gives n/a, not an error
    rows = suite.table([broker_round(suite, 210_000, 21_000, 600_000, 4.0, 10_000, 50_000, 3.0)])
    assert row(rows, "the floor at 5k msg/s, unbatched")[1] == "n/a / n/a"
    assert row(rows, "publish latency at 5k msg/s, unbatched")[3:] == ("n/a", "p99 <= 2x the floor's", "n/a")


def test_tls_rows_judge_batched_produce_by_the_pair_by_pair_ratio(suite):
    rounds = [broker_round(suite, 210_000, 21_000, 600_000, 4.0, 10_000, 50_000, 3.0)]
    phase = lambda plain, tls, ratio: {"plain_msg_s": plain, "tls_msg_s": tls, "tls_over_plain": ratio,  # noqa: E731
                                       "plain_broker_cpu_us_per_msg": 3.0, "tls_broker_cpu_us_per_msg": 4.5,
                                       "cpu_tls_over_plain": 1.5}
    rounds[0].extra["bench_tls.py"] = {
        "produce_batched": phase(30_000.0, 21_000.0, 0.81), "consume": phase(200_000.0, 100_000.0, 0.5),
        "produce_unbatched": phase(700.0, 400.0, 0.57),
        "settings": {"client": "official", "size": 1024, "rounds": 5, "messages": 50_000,
                     "unbatched_messages": 1000}}
    rows = suite.table(rounds)
    produce = row(rows, "produce with TLS on, batched")
    # the verdict is the median of per-round ratios (0.81), not the medians' (0.70)
    assert produce[0] == ("produce with TLS on, batched (official client, 1024 B, 5 rounds alternated); "
                          "broker CPU 3.0 -> 4.5 us/msg")
    assert produce[1:] == ("21,000 msg/s", "TLS off, same broker 30,000 msg/s; median of per-round ratios",
                           "0.81", ">= 0.8", "met")
    assert row(rows, "produce with TLS on, unbatched")[3:] == ("0.57", "", "")      # context, no goal
    assert row(rows, "consume with TLS on")[3] == "0.50"
    rounds[0].extra["bench_tls.py"]["produce_batched"]["tls_over_plain"] = 0.79
    assert row(suite.table(rounds), "produce with TLS on, batched")[5] == "**missed**"


def test_bucket_quantile_is_the_bound_of_the_bucket_holding_it():
    """bench_broker's broker-side latency: the histogram's increments between two scrapes."""
    spec = importlib.util.spec_from_file_location("bench_broker_q", ROOT / "bench" / "bench_broker.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    q = module.bucket_quantile_ms
    inf = float("inf")
    before = {0.001: 10.0, 0.002: 10.0, 0.005: 10.0, inf: 10.0}
    # 100 new: 50 <= 1 ms, 49 in (1, 2] ms, 1 in (2, 5] ms
    after = {0.001: 60.0, 0.002: 109.0, 0.005: 110.0, inf: 110.0}
    assert q(before, after, 0.50) == 1.0
    assert q(before, after, 0.99) == 2.0
    assert q(before, after, 0.999) == 5.0
    assert q(before, {0.001: 10.0, inf: 11.0}, 0.99) == inf      # beyond the last finite bound
    assert q(before, before, 0.5) is None                          # nothing observed


def test_a_missed_goal_and_a_missing_figure_are_said_so(suite):
    rounds = [broker_round(suite, 150_000, 25_000, 60_000, 30.0, 10_000, 50_000, 3.0)]
    rounds[0].extra["bench_spark.py"] = {
        "messages": 1000, "seconds": {"local[2] tier (pulsarlite source)": 2.0,
                                      "local[2] tier (pulsarlite source), .schema(value binary)": 1.2,
                                      "local[2] spark.read.parquet, same files": 1.0},
        "tier_over_parquet": {"local[2], value only": 2.0},
        "interleaved_value_only_over_parquet": {"local[2]": {"tier": 2.5, "tier_schema": 1.25}}}
    rounds[0].extra["bench_idle_topics.py"] = {"rss_mb": 80.0}
    rows = suite.table(rounds)
    assert row(rows, "produce, batched, official")[5] == "**missed**"     # 150k / 240k = 0.625
    assert row(rows, "produce, batched, `pulsarlite perf")[5] == "**missed**"   # 60k / 700k
    assert row(rows, "produce, unbatched")[5] == "**missed**"      # 20k met, but only 2.5x the peer
    rounds[0].floor = {"results": [{"target": "floor", "mode": "unbatched", "p99_ms": 14.0},
                                   {"target": "floor", "mode": "batched-1ms", "p99_ms": 20.0}]}
    rows = suite.table(rounds)
    assert row(rows, "publish latency at 5k msg/s, unbatched")[5] == "**missed**"        # 30 / 14 > 2
    assert row(rows, "publish latency at 5k msg/s, client batching")[5] == "met"         # 30 / 20 <= 1.5
    rounds[0].broker["results"]["ceiling perf"] = {}           # an older run: no reference, no verdict
    assert row(suite.table(rounds), "produce, batched, `pulsarlite perf")[3:] == ("n/a", ">= 0.8 of its ceiling",
                                                                                  "n/a")
    spark = row(rows, "Spark scan of offloaded segments (1,000 msgs, local[2]): count + sum(length(value)), the")
    # the verdict takes the pair-by-pair ratio when the script measured one
    assert spark[1] == "2.00 s" and spark[3] == "2.50" and spark[5] == "**missed**"
    assert spark[2].endswith("pair by pair 2.50 (medians 2.00)")
    narrowed = row(rows, "Spark scan of offloaded segments (1,000 msgs, local[2]): count + sum(length(value)), .schema")
    assert narrowed[3] == "1.25" and narrowed[5] == "met"
    assert not [r for r in rows if "hash of every" in r[0]]      # not measured: no row
    assert row(rows, "broker RSS")[5] == "met"
    rounds[0].nats = None                                           # the peer did not run
    assert row(suite.table(rounds), "produce, unbatched")[5] == "n/a"


def test_spark_rows_judge_by_the_pair_by_pair_ratio_when_there_is_one(suite):
    rounds = [broker_round(suite, 210_000, 21_000, 600_000, 4.0, 10_000, 50_000, 3.0)]
    rounds[0].extra["bench_spark.py"] = {
        "messages": 1000, "seconds": {"local[2] tier (pulsarlite source), full-row hash": 1.5,
                                      "local[2] spark.read.parquet, same files, full-row hash": 1.0},
        "interleaved_over_parquet": {"local[2]": {"full_hash": 1.2}}}
    hashed = row(suite.table(rounds), "Spark scan of offloaded segments (1,000 msgs, local[2]): hash")
    assert hashed[1] == "1.50 s" and hashed[3] == "1.20" and hashed[5] == "met"   # pair by pair
    assert hashed[2] == "spark.read.parquet, same files 1.00 s; pair by pair 1.20 (medians 1.50)"
    del rounds[0].extra["bench_spark.py"]["interleaved_over_parquet"]          # an older script's output
    hashed = row(suite.table(rounds), "Spark scan of offloaded segments (1,000 msgs, local[2]): hash")
    assert hashed[2] == "spark.read.parquet, same files 1.00 s" and hashed[3] == "1.50" and hashed[5] == "**missed**"


def test_the_block_replaces_only_its_own_part_of_benchmarks_md(suite, tmp_path, monkeypatch):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nhand-written\n")
    monkeypatch.setattr(suite, "ROOT", tmp_path)
    rows = suite.table([broker_round(suite, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)])
    suite.write_benchmarks(suite.render(rows, "make bench", 1))
    first = doc.read_text()
    assert first.startswith("# Benchmarks\n\nhand-written\n") and first.count(suite.BEGIN) == 1
    suite.write_benchmarks(suite.render(rows, "make bench", 1).replace("make bench", "again"))
    second = doc.read_text()
    assert second.count(suite.BEGIN) == 1 and "Command: `again`" in second and "hand-written" in second

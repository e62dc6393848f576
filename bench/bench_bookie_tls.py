"""Bookie port with TLS vs without: ledger adds (E3/Qw3/Qa2, fsync on) through one ledger client.

    .venv/bin/python bench/bench_bookie_tls.py [--seconds S]

One run, one cluster of 3 bookies at a time, in the order plain, TLS, plain (the two plain runs
bracket the TLS one: the machine's drift shows as their difference). Each: 100 B adds pipelined
(window 5000) and 64 KiB adds pipelined (window 64). Prints a table with TLS / plain ratios
(plain = the mean of the two plain runs). Certificates from trustme. Not a test: figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench_ledger import pipelined  # noqa: E402 - bench/ is on sys.path
from bookie.client.ledger_client import LedgerClient  # noqa: E402
from bench.common import work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402
from pulsarlite.config import LedgerClientConfig  # noqa: E402


async def measure(zk: str, seconds: float, client_settings: dict) -> dict:
    client = await LedgerClient.connect(LedgerClientConfig(zookeeper=zk, **client_settings))
    try:
        await pipelined(client, 100, min(2.0, seconds), 2000, "warmup")
        return {"small": await pipelined(client, 100, seconds, 5000, "100B"),
                "large": await pipelined(client, 64 * 1024, seconds, 64, "64KiB")}
    finally:
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--dir", default=None, help="directory of the run, kept (default: a temporary one, removed)")
    args = parser.parse_args()
    import trustme
    import uvloop
    uvloop.install()
    with work_dir(args.dir, "pulsarlite-bench-tls-") as base:
        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        ca.cert_pem.write_to_path(str(base / "ca.pem"))
        leaf.cert_chain_pems[0].write_to_path(str(base / "cert.pem"))
        leaf.private_key_pem.write_to_path(str(base / "key.pem"))
        tls_bookie = {"bookie_tls_certificate_file_path": str(base / "cert.pem"),
                      "bookie_tls_key_file_path": str(base / "key.pem")}
        tls_client = {"bookie_tls_enabled": True, "bookie_tls_trust_certs_file_path": str(base / "ca.pem")}
        results = {}
        for label, bookie, client in (("plain-1", {}, {}), ("tls", tls_bookie, tls_client), ("plain-2", {}, {})):
            print(f"== {label}", file=sys.stderr)
            with LocalCluster.start(base / label, bookies=3, bookie_overrides=bookie) as cluster:
                results[label] = asyncio.run(measure(cluster.zookeeper, args.seconds, client))
        print("\n| figure | plain (run 1 / run 2) | TLS | TLS / plain |")
        print("|---|---|---|---|")
        for kind, unit, key in (("small", "adds/s", "adds_per_s"), ("large", "MB/s", "mb_per_s")):
            p1, p2, t = results["plain-1"][kind], results["plain-2"][kind], results["tls"][kind]
            plain = (p1[key] + p2[key]) / 2
            name = "100 B adds, pipelined" if kind == "small" else "64 KiB adds, pipelined"
            print(f"| {name} | {p1[key]:.0f} / {p2[key]:.0f} {unit} (p99 {p1['p99_ms']:.1f} / {p2['p99_ms']:.1f} ms) "
                  f"| {t[key]:.0f} {unit} (p99 {t['p99_ms']:.1f} ms) | {t[key] / plain:.2f} |")
        return 0


if __name__ == "__main__":
    sys.exit(main())

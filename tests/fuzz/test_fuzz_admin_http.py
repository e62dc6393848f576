"""[hardening] Fuzzing the broker's admin HTTP API (raw HTTP/1.1 over sockets) while the canary
produces and consumes: random paths under /admin/v2/... (every route's shape, with names that
are empty, too long, percent-encoded, unicode, dot segments, path traversal), random methods,
bodies that are random JSON (wrong types, huge and negative numbers, NaN, lone surrogates, deep
nesting), malformed JSON, random bytes, bad charsets, broken Content-Encoding, wrong
Content-Length and chunking, huge and many headers, odd request lines, and bursts of
connections left half-sent.

Writes only touch names the fuzzer owns: a request that is not GET/HEAD and names ``public``
or ``standalone`` anywhere (after percent-decoding) is sent as GET instead, so the canary's
namespace and the cluster stay as they are.

The fuzzer's own checks (findings): no 500 (or any 5xx but 503); no traceback in a response;
every complete request is answered within ANSWER_TIMEOUT_S; after the fuzzing the canary's
namespace and topic still answer 200.

Replay: PULSARLITE_FUZZ_SEED=<seed> [PULSARLITE_FUZZ_CASES=<n> | PULSARLITE_FUZZ_ONLY=<i,j>]
pytest tests/fuzz/test_fuzz_admin_http.py
"""

from __future__ import annotations

import gzip
import json
import random
import re
import time
import zlib
from dataclasses import dataclass
from urllib.parse import quote, unquote

import pytest

pytest.importorskip("pulsar")

from .conftest import BOOKIE_OVERRIDES, BROKER_OVERRIDES  # noqa: E402
from .harness import (Budget, Findings, FuzzChecks, FuzzResult, Journal, LogScan, Sockets,  # noqa: E402
                      fuzz_timeout_s, i64, random_bytes, recv_available, rss_bytes, run_fuzz, send_quietly, u64,
                      weird_string)

pytestmark = [pytest.mark.integration, pytest.mark.fuzz, pytest.mark.timeout(fuzz_timeout_s())]

TARGET = "admin"
ANSWER_TIMEOUT_S = 10.0
BODY_BYTES_MAX = 1024 * 1024        # broker/admin/http.py BODY_BYTES_MAX

# Defects found here, fixed (tests/fuzz/NOTES.md; each pinned by a deterministic test at the end of this module):
# - aiohttp-error-log: every malformed HTTP request (a bad header, a duplicate Content-Length, a
#   bad Content-Encoding...) is logged by aiohttp.server at ERROR with a full traceback and
#   excerpts of the request, at no bounded rate (broker/main.py runs the admin app with aiohttp's
#   default server logger).
# - aborted-body-memory: an admin request that announced a body and was cut off (the client went
#   away) keeps the part of the body received (up to BODY_BYTES_MAX) in reference cycles until
#   the cyclic GC runs a full collection: ~1 MiB of broker RSS per such request; 1500 of them in
#   10 s took the broker from 57 MiB to 1.4 GiB. Bodies above the limit answered before they are
#   read (400, 404, 405, 413) do the same, less (~0.5-2 MiB each). While it is open, the fuzzer
#   cuts bodies of at most ABORTED_BODY_BYTES_MAX and sends bodies above the limit in only
#   BIG_BODY_SHARE of the requests that would have one, so that the memory check keeps its
#   meaning for everything else.
AIOHTTP_ERROR_LOG = "aiohttp-error-log"
ABORTED_BODY_MEMORY = "aborted-body-memory"
ABORTED_BODY_BYTES_MAX = 64 * 1024
BIG_BODY_SHARE = 0.1
KNOWN_TRACEBACKS = ((AIOHTTP_ERROR_LOG, (r"ERROR aiohttp\.server (Error handling request|Unhandled exception)",
                                         r"aiohttp\.http_exceptions|RequestPayloadError|zlib\.error")),)

POLICIES = ("retention", "deduplication", "messageTTL", "offloadThreshold", "offloadThresholdInSeconds",
            "offloadDeletionLagMs", "autoTopicCreation", "rollover", "schemaCompatibilityStrategy",
            "isAllowAutoUpdateSchema", "backlogQuotaMap", "backlogQuota")
TOPIC_SUFFIXES = ("", "/partitions", "/stats", "/internalStats", "/partitioned-stats", "/unload", "/subscriptions",
                  "/subscription/{s}", "/subscription/{s}/resetcursor/{k}", "/subscription/{s}/skip/{k}",
                  "/subscription/{s}/skip_all", "/clearBacklog", "/lastMessageId", "/offload", "/offloadPolicies",
                  "/schema", "/schema/{k}", "/schemas", "/compatibility", "/{x}")
TEMPLATES = (
    "/admin/v2/clusters", "/admin/v2/clusters/{c}", "/admin/v2/tenants", "/admin/v2/tenants/{t}",
    "/admin/v2/namespaces/{t}", "/admin/v2/namespaces/{t}/{n}",
    *(f"/admin/v2/namespaces/{{t}}/{{n}}/{p}" for p in POLICIES),
    "/admin/v2/persistent/{t}/{n}", "/admin/v2/persistent/{t}/{n}/partitioned",
    *(f"/admin/v2/persistent/{{t}}/{{n}}/{{topic}}{s}" for s in TOPIC_SUFFIXES),
    *(f"/admin/v2/persistent/{{t}}/{{n}}/{{topic}}{s}" for s in TOPIC_SUFFIXES),   # topics: twice the weight
    "/admin/v2/non-persistent/{t}/{n}/{topic}", "/lookup/v2/topic/persistent/{t}/{n}/{topic}", "/metrics",
    "/admin/v2/{x}", "/admin/v2/{x}/{x}/{x}", "/{x}", "/admin/v2/../../../etc/passwd", "/admin/v2/%2e%2e/%2e%2e/etc/passwd",
    "/admin/v2/tenants/..%2f..%2f..%2fetc%2fpasswd", "//admin//v2//tenants", "/admin/v2/tenants/", "/admin/v3/tenants",
    "/ADMIN/V2/TENANTS", "/admin/v2/tenants/{t}/../../clusters",
)
JSON_KEYS = ("allowedClusters", "adminRoles", "serviceUrl", "serviceUrlTls", "brokerServiceUrl", "brokerServiceUrlTls",
             "retentionTimeInMinutes", "retentionSizeInMB", "limitSize", "limitTime", "policy", "ledgerId",
             "entryId", "partitionIndex", "batchIndex", "type", "schema", "properties", "allowAutoTopicCreation",
             "topicType", "defaultNumPartitions", "maxEntriesPerLedger", "maxLedgerAgeMs", "maxLedgerBytes",
             "deduplicationEnabled", "message_ttl_in_seconds", "offloadThresholdInBytes", "managedLedgerOffloadDriver",
             "offloadThresholdInSeconds", "offloadDeletionLagInMillis", "replication_clusters", "bundles",
             "schema_compatibility_strategy", "is_allow_auto_update_schema", "backlog_quota_map",
             "retention_policies", "autoTopicCreationOverride", "", "__proto__", "constructor")
METHODS = ("GET",) * 7 + ("PUT",) * 4 + ("POST",) * 4 + ("DELETE",) * 3 + ("HEAD", "OPTIONS", "PATCH", "TRACE",
                                                                           "CONNECT", "get", "BREW", "PUT ")


# -- raw HTTP ---------------------------------------------------------------------------------------
@dataclass
class Answer:
    status: int | None
    head: bytes
    body: bytes
    closed: bool
    seconds: float


def exchange(sockets: Sockets, port: int, request: bytes, timeout_s: float) -> Answer:
    started = time.monotonic()
    sock = sockets.connect(port)
    send_quietly(sock, request)
    data, closed = recv_available(sock, timeout_s)
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/\d\.\d (\d{3})", head)
    return Answer(int(m.group(1)) if m else None, head, body, closed, time.monotonic() - started)


def build(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
          version: bytes = b"HTTP/1.1") -> bytes:
    lines = [method + b" " + target + b" " + version]
    lines += [k + b": " + v for k, v in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def protected(method: str, target: str) -> bool:
    """A write naming the canary's tenant or the cluster (after decoding, however encoded)."""
    if method.strip().upper() in ("GET", "HEAD", "OPTIONS", "TRACE"):
        return False
    text = target
    for _ in range(4):
        text = unquote(text)
    lowered = text.lower()
    return "public" in lowered or "standalone" in lowered


# -- random values ----------------------------------------------------------------------------------
def json_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 3 or r < 0.35:
        return rng.choice((
            lambda: u64(rng), lambda: i64(rng), lambda: -1, lambda: 0, lambda: 10**30, lambda: rng.random() * 1e6,
            lambda: 1.5, lambda: True, lambda: False, lambda: None, lambda: weird_string(rng), lambda: "",
            lambda: "standalone-no", lambda: "consumer_backlog_eviction", lambda: "producer_request_hold",
            lambda: "AVRO", lambda: "BACKWARD", lambda: "partitioned", lambda: "non-partitioned",
            lambda: "earliest", lambda: "latest", lambda: str(u64(rng)),
        ))()
    if r < 0.7:
        return {rng.choice(JSON_KEYS) if rng.random() < 0.8 else weird_string(rng): json_value(rng, depth + 1)
                for _ in range(rng.randrange(0, 6))}
    return [json_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]


def json_text(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.6:
        try:
            return json.dumps(json_value(rng), allow_nan=True)
        except ValueError:
            return "{}"
    return rng.choice((
        "{", "[1,2", "}", "{'a': 1}", "NaN", "-Infinity", "1e99999", "9" * 5000, "[" * 50_000 + "]" * 50_000,
        "{\"a\":" * 20_000 + "1" + "}" * 20_000, '"\\ud800"', '{"allowedClusters": ["\\udfff"]}',
        '{"retentionTimeInMinutes": "\\u0000"}', "\x00", "true false", "0x10", "01", "+1", ".5", "-",
        '{"a": 1, "a": 2}', "[]", "{}", "null", '""', "\ufeff{}", " " * 1000, "\n",
        '{"ledgerId": 9223372036854775808, "entryId": -9223372036854775809}',
        '{"ledgerId": 1e308, "entryId": 1.5}', '{"limitSize": 1e400}', "100000000000000000000000000",
        "4097", "4096", "0", "-1", "2.5", '"5"',
    ))


def segment(rng: random.Random, kind: str, pools: "Pools") -> str:
    r = rng.random()
    if r < 0.6:
        return quote(rng.choice(getattr(pools, kind)), safe="")
    if r < 0.7:
        return quote(quote(weird_string(rng), safe=""), safe="")     # double-encoded
    if r < 0.8:
        raw = weird_string(rng)
        if re.fullmatch(r"[!-~]*", raw) and "?" not in raw and "#" not in raw:
            return raw      # unencoded (printable ASCII without spaces only)
    return quote(weird_string(rng), safe=rng.choice(("", "/", ":@=")))


class Pools:
    def __init__(self, seed: int) -> None:
        self.tenant = f"fz-t{seed % 100_000}"
        self.c = ["fz-cluster", "fz-cluster-2", "standalone", "", "x" * 300]
        self.t = [self.tenant] * 6 + [f"fz-t{seed % 100_000}-b", "public", "x" * 300, "..", ".", "a b"]
        self.n = ["ns0"] * 4 + ["ns1", "ns1", "default", "ns-missing", "x" * 300, ".."]
        self.topic = ["t0", "t0", "t1", "t2", "p0", "p0-partition-0", "t0-partition-99999999999", "x" * 2100,
                      "t%0A", "\U0001f642"]
        self.s = ["s0", "s0", "s1", "", "x" * 1100, "a\nb"]
        self.k = ["0", "1", "-1", "abc", "", str(2**63), str(2**64), "1e3", "99999999999999999999999", " 5 ", "0x10"]
        self.x = ["", "x", "..", "%00", "tenants", "metrics"]


# -- the cases ------------------------------------------------------------------------------------
class AdminFuzzer:
    def __init__(self, port: int, budget: Budget) -> None:
        self.port = port
        self.pools = Pools(budget.seed)
        self.host = f"127.0.0.1:{port}".encode()

    def setup_requests(self) -> list[tuple[str, str, bytes]]:
        t = self.pools.tenant
        return [("PUT", f"/admin/v2/tenants/{t}", b'{"allowedClusters": ["standalone"]}'),
                ("PUT", f"/admin/v2/namespaces/{t}/ns0", b""), ("PUT", f"/admin/v2/namespaces/{t}/ns1", b""),
                ("PUT", f"/admin/v2/persistent/{t}/ns0/t0", b""),
                ("PUT", f"/admin/v2/persistent/{t}/ns0/p0/partitions", b"2")]

    def setup(self) -> None:
        for method, path, body in self.setup_requests():
            with Sockets() as sockets:
                headers = [(b"Host", self.host), (b"Connection", b"close"), (b"Content-Type", b"application/json"),
                           (b"Content-Length", str(len(body)).encode())]
                exchange(sockets, self.port, build(method.encode(), path.encode(), headers, body), ANSWER_TIMEOUT_S)

    def __call__(self, rng: random.Random, index: int, findings: Findings, journal: Journal) -> None:
        r = rng.random()
        with Sockets() as sockets:
            if r < 0.03:
                what = self.burst(rng, sockets, findings, index)
            elif r < 0.06:     # the fuzzer's names come back now and then (the fuzz deletes them too)
                method, path, body = rng.choice(self.setup_requests())
                what = self.one(rng, sockets, findings, index, method, path, body, plain=True)
            else:      # a third well-formed (the right headers), to reach the handlers more often
                what = self.one(rng, sockets, findings, index, plain=rng.random() < 0.35)
            journal.case(index, what)
            sockets.close_all(rng)

    def request(self, rng: random.Random, method: str | None = None, path: str | None = None,
                body: bytes | None = None, plain: bool = False):
        """(bytes to send, description, complete: an answer is due)."""
        pools = self.pools
        if path is None:
            template = rng.choice(TEMPLATES)
            path = re.sub(r"\{(\w+)\}", lambda m: segment(rng, m.group(1), pools), template)
            if rng.random() < 0.3:
                params = []
                for _ in range(rng.randrange(1, 4)):
                    key = rng.choice(("force", "authoritative", "perPartition", "backlogQuotaType", "x", ""))
                    value = rng.choice(("true", "false", "1", "0", "", "yes", "destination_storage",
                                        "message_age", quote(weird_string(rng), safe="")))
                    params.append(f"{key}={value}")
                path += "?" + "&".join(params)
            if rng.random() < 0.03:
                path += "#frag"
        if method is None:
            method = rng.choice(METHODS)
        if protected(method, path):
            method = "GET"
        if body is None:
            r = rng.random()
            if r < 0.25:
                body = b""
            elif r < 0.75:
                body = json_text(rng).encode("utf-8", "surrogatepass")
            elif r < 0.85:
                body = random_bytes(rng, rng.randrange(1, 500))
            elif r < 0.9:
                body = json_text(rng).encode("utf-16")
            elif r < 0.95:
                body = json_text(rng).encode("latin-1", "replace") + b"\xe9\xff"
            else:
                # above the body limit (see ABORTED_BODY_MEMORY)
                body = b"[" + b"0," * (BODY_BYTES_MAX // 2) + b"0]" if rng.random() < BIG_BODY_SHARE else b"[]"
        headers = [(b"Host", self.host), (b"Connection", b"close")]
        complete = True
        labels = []
        if not plain:
            r = rng.random()
            if r < 0.6:
                ctype = b"application/json"
                if rng.random() < 0.3:
                    ctype += b"; charset=" + rng.choice((b"utf-8", b"utf-16", b"latin-1", b"bogus-charset", b"",
                                                         b"utf-32", b"ascii", b"\"utf-8\"", b"x" * 300))
                headers.append((b"Content-Type", ctype))
            elif r < 0.7:
                headers.append((b"Content-Type", rng.choice((b"text/plain", b"application/x-www-form-urlencoded",
                                                             b"multipart/form-data; boundary=x", b"*/*", b"",
                                                             b"application/json; charset"))))
            if rng.random() < 0.08:
                encoding = rng.choice((b"gzip", b"deflate", b"br", b"identity", b"bogus", b"gzip, gzip"))
                if rng.random() < 0.5 and encoding in (b"gzip", b"deflate"):
                    body = gzip.compress(body) if encoding == b"gzip" else zlib.compress(body)
                    labels.append(f"{encoding.decode()}(valid)")
                else:
                    labels.append(f"{encoding.decode()}(garbage)")
                headers.append((b"Content-Encoding", encoding))
            if rng.random() < 0.05:
                size = rng.choice((4 * 1024, 8 * 1024, 9 * 1024, 16 * 1024, 64 * 1024))
                headers.append((b"X-Fuzz-Huge", b"a" * size))
                labels.append(f"header of {size} bytes")
            if rng.random() < 0.03:
                count = rng.choice((50, 101, 200))
                headers += [(f"X-F{i}".encode(), b"v") for i in range(count)]
                labels.append(f"{count} headers")
            if rng.random() < 0.03:
                headers.append((b"X-Fuzz", rng.choice((b"\xff\xfe", b"a\x00b", "é".encode(), b"\x7f"))))
            if rng.random() < 0.03:
                headers.append((b"Accept", rng.choice((b"application/openmetrics-text; version=1.0.0",
                                                       b"text/plain;version=0.0.4", b"*/*;q=x", b"\xff"))))
        r = rng.random()
        if plain or r < 0.8:
            headers.append((b"Content-Length", str(len(body)).encode()))
        elif r < 0.85:
            labels.append("no Content-Length")     # a body, if any, reads as a next request
        elif r < 0.9:
            declared = rng.choice((len(body) + rng.randrange(1, 100), 2**63, 2**64 + 5, -1, "12a", ""))
            headers.append((b"Content-Length", str(declared).encode()))
            labels.append(f"Content-Length {declared!r} for {len(body)} bytes")
            # more than is sent: the server may wait for the rest (no answer due); malformed: 400
            complete = not isinstance(declared, int) or declared < 0
        elif r < 0.95:
            chunks = b""
            rest = body
            while rest:
                n = rng.randrange(1, 100)
                chunks += f"{n if rng.random() < 0.9 else rng.randrange(0, 200):x}".encode() + b"\r\n" + rest[:n] + b"\r\n"
                rest = rest[n:]
            if rng.random() < 0.8:
                chunks += b"0\r\n\r\n"
            else:
                complete = False
            headers.append((b"Transfer-Encoding", rng.choice((b"chunked", b"chunked", b"gzip, chunked", b"bogus"))))
            labels.append("chunked")
            body = chunks
            complete = False       # a malformed chunking may leave the server waiting: nothing is due
        else:
            headers.append((b"Content-Length", str(len(body)).encode()))
            headers.append((b"Content-Length", str(len(body) + 1).encode()))
            labels.append("two Content-Lengths")
        if not complete and len(body) > ABORTED_BODY_BYTES_MAX:     # see ABORTED_BODY_MEMORY
            body = body[:ABORTED_BODY_BYTES_MAX]
        version = b"HTTP/1.1"
        target = path.encode("utf-8", "surrogatepass")
        m = method.encode()
        if not plain and rng.random() < 0.05:
            x = rng.randrange(5)
            if x == 0:
                version = rng.choice((b"HTTP/1.0", b"HTTP/2.0", b"HTTP/9.9", b"HTTP/1.1 extra", b"HTTX/1.1", b""))
            elif x == 1:
                target = self.host.join((b"http://", target))
            elif x == 2:
                target = rng.choice((b"*", b"admin/v2/tenants", b"", b"/admin/v2/ten ants", b"/\x00"))
            elif x == 3:
                m = rng.choice((b"", b"G\x00T", b"\xff", b"GET GET"))
            else:
                target = target + b"%"
            labels.append(f"request line {m[:10]!r} {target[:60]!r} {version!r}")
            if version == b"HTTP/1.0":
                headers = [h for h in headers if h[0] != b"Connection"]
        if not plain and rng.random() < 0.02:
            headers = [h for h in headers if h[0] != b"Host"]
            labels.append("no Host")
        description = f"{method} {path[:300]} body={body[:120]!r}{'...' if len(body) > 120 else ''} ({len(body)} bytes)"
        if labels:
            description += " [" + ", ".join(labels) + "]"
        return build(m, target, headers, body, version), description, complete

    def one(self, rng, sockets, findings, index, method=None, path=None, body=None, plain=False) -> str:
        data, description, complete = self.request(rng, method, path, body, plain)
        answer = exchange(sockets, self.port, data, ANSWER_TIMEOUT_S if complete else 0.3)
        self.judge(answer, description, complete, findings, index)
        return f"{answer.status} {description}"

    def judge(self, answer: Answer, description: str, complete: bool, findings: Findings, index: int) -> None:
        status = answer.status
        findings.note(f"status {status}")
        reason = answer.body[:300].decode(errors="replace")
        if status is None:
            if complete and not answer.closed:
                findings.add("a complete request was never answered",
                             f"case {index}: {description} (nothing after {answer.seconds:.1f}s)")
            return
        if status == 500:
            findings.add("the admin API answered 500 to bad input", f"case {index}: {description} -> {reason}")
        elif status >= 500 and status != 503:
            findings.add(f"the admin API answered {status}", f"case {index}: {description} -> {reason}")
        if b"Traceback" in answer.body:
            findings.add("a traceback in an admin response", f"case {index}: {description} -> {reason}")

    def burst(self, rng, sockets, findings, index) -> str:
        n = rng.choice((10, 30, 60))
        socks = []
        for _ in range(n):
            try:
                sock = sockets.connect(self.port)
            except OSError:
                break
            socks.append(sock)
            data, _, _ = self.request(rng)
            head = data.find(b"\r\n\r\n") + 4
            cut = rng.randrange(0, min(len(data), head + ABORTED_BODY_BYTES_MAX) + 1)
            send_quietly(sock, data[:cut])       # most requests half-sent
        time.sleep(0.05)
        for sock in socks:
            recv_available(sock, 0.001)
        return f"burst of {len(socks)}/{n} connections, requests cut anywhere"

    def final_check(self, findings: Findings, canary_topic: str) -> None:
        """The canary's namespace and topic still answer (after the fuzzing)."""
        local = canary_topic.split("://", 1)[1]
        for path in ("/admin/v2/namespaces/public/default", f"/admin/v2/persistent/{local}/stats",
                     "/admin/v2/tenants/public", "/admin/v2/clusters/standalone"):
            with Sockets() as sockets:
                answer = exchange(sockets, self.port, build(b"GET", path.encode(), [(b"Host", self.host),
                                                                                    (b"Connection", b"close")], b""),
                                  ANSWER_TIMEOUT_S)
            if answer.status != 200:
                findings.add("after the fuzzing, a read of the canary's state failed",
                             f"GET {path} -> {answer.status} {answer.body[:300]!r}")


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=1, bookie_overrides=BOOKIE_OVERRIDES,
                                  broker_overrides=BROKER_OVERRIDES)


@pytest.fixture(scope="module")
def result(cluster, fuzz_budget: Budget, fuzz_dir) -> FuzzResult:
    port = cluster.records[cluster.broker_names[0]].ports["http"]
    fuzzer = AdminFuzzer(port, fuzz_budget)
    outcome = run_fuzz(TARGET, cluster=cluster, budget=fuzz_budget, directory=fuzz_dir,
                       test_file="tests/fuzz/test_fuzz_admin_http.py", fuzz_case=fuzzer, setup=fuzzer.setup)
    if not outcome.dead:
        fuzzer.final_check(outcome.findings, f"persistent://public/default/canary-{TARGET}-{fuzz_budget.seed}")
    return outcome


class TestAdminHttpFuzz(FuzzChecks):
    known_tracebacks = KNOWN_TRACEBACKS


# -- defects found by the fuzzing (fixed), each pinned by a deterministic test (same cluster) ------
def _http(port: int, request: bytes) -> Answer:
    with Sockets() as sockets:
        return exchange(sockets, port, request, ANSWER_TIMEOUT_S)


def test_malformed_http_is_logged_without_a_traceback(cluster) -> None:
    """aiohttp-error-log (fixed: broker/admin/serving.py)."""
    name = cluster.broker_names[0]
    port = cluster.records[name].ports["http"]
    scan = LogScan(cluster, [name])
    scan.mark()
    host = f"127.0.0.1:{port}".encode()
    bad = [b"GET /admin/v2/tenants HTTP/1.1\r\nHost: " + host + b"\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
           b"GET /admin/v2/tenants HTTP/1.1\r\nHost: " + host + b"\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
           b"PUT /admin/v2/tenants/fz-probe HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n"
           b"Content-Encoding: gzip\r\nContent-Length: 10\r\n\r\nnot-gzip!!"]
    statuses = [_http(port, request).status for request in bad]
    assert all(s == 400 for s in statuses), f"malformed requests not answered 400: {statuses}"
    time.sleep(1.0)
    records = scan.tracebacks().get(name, [])
    assert not records, f"{len(records)} log records with a traceback for 3 malformed requests, first:\n{records[0]}"


def test_aborted_admin_requests_do_not_hold_their_bodies(cluster) -> None:
    """aborted-body-memory (fixed: broker/admin/serving.py release_request_body)."""
    record = cluster.records[cluster.broker_names[0]]
    port = record.ports["http"]
    body = b"[" + b"0," * (BODY_BYTES_MAX // 2 - 2) + b"0]"
    head = (b"PUT /admin/v2/tenants/fz-probe HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    request = head + body[:600_000]            # announced ~1 MiB, 600 KB sent, then the client goes away
    baseline = peak = rss_bytes(record.pid)
    for _ in range(200):
        with Sockets() as sockets:
            send_quietly(sockets.connect(port), request)
        peak = max(peak, rss_bytes(record.pid))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        peak = max(peak, rss_bytes(record.pid))
        time.sleep(0.1)
    grown = (peak - baseline) / 2**20
    assert grown < 64, f"broker RSS grew by {grown:.0f} MiB (peak) for 200 aborted requests of 600 KB"

"""`pulsarlite admin ...`: the broker's HTTP admin (Pulsar v2 paths) from the command line,
shaped like pulsar-admin.

    pulsarlite admin [--admin-url URL] [--output json|table] GROUP COMMAND ARGS
    groups: clusters, tenants, namespaces, topics, subscriptions

Most commands are one row of ``COMMANDS`` (an HTTP method, a path template, a body builder);
the few with logic of their own (tenants create, offload by size, offload-status -w,
reset-cursor) have a ``run`` function. Output: lists print one item a line and objects as JSON
(as pulsar-admin) unless ``--output json|table``. An HTTP error prints the broker's reason on
one line and exits 1; bad arguments exit 2. 307 redirects are followed (same method and body).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from pulsarlite.client_config import add_connection_flags, resolve_connection
from pulsarlite.errors import ConfigError, PulsarliteError
from pulsarlite.topic_name import InvalidTopicNameError, NamespaceName, TopicName

REQUEST_TIMEOUT_S = 30.0
REDIRECTS_MAX = 5
RESPONSE_BYTES_MAX = 64 * 1024 * 1024
OFFLOAD_WAIT_S_DEFAULT = 600.0
OFFLOAD_POLL_INTERVAL_S = 1.0
_NAME = re.compile(r"[-=:.A-Za-z0-9_]+")


# -- argument values ---------------------------------------------------------------------------
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4}
_TIME_UNITS_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_size_bytes(text: str) -> int:
    """pulsar-admin sizes: ``4096``, ``10k``, ``10M``, ``16G``, ``3T`` (1024-based), ``-1``
    (unlimited)."""
    value = text.strip()
    if value == "-1":
        return -1
    m = re.fullmatch(r"(\d+)([kKmMgGtT]?)", value)
    if not m:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: a number of bytes with an optional k/M/G/T suffix, or -1")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]


def parse_time_s(text: str) -> int:
    """pulsar-admin relative times: ``30`` (seconds), ``30s``, ``10m``, ``3h``, ``2d``, ``1w``,
    ``1y``, ``-1`` (unlimited)."""
    value = text.strip()
    if value == "-1":
        return -1
    m = re.fullmatch(r"(\d+)([smhdwy]?)", value)
    if not m:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: a number with an optional s/m/h/d/w/y suffix (seconds when none), or -1")
    return int(m.group(1)) * _TIME_UNITS_S[m.group(2)]


def parse_message_id(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid message id {text!r}: expected LEDGER:ENTRY")
    return int(m.group(1)), int(m.group(2))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class UsageError(PulsarliteError):
    """A bad argument found after parsing (a malformed topic or namespace name): exit 2."""


def _check_name(what: str, value: str) -> str:
    if not _NAME.fullmatch(value or ""):
        raise UsageError(f"invalid {what} name {value!r}")
    return value


def _namespace_path(value: str) -> str:
    try:
        return str(NamespaceName.parse(value))
    except InvalidTopicNameError as e:
        raise UsageError(str(e)) from None


def _topic_path(value: str) -> str:
    """``tenant/ns/encoded-local-name`` of a persistent topic given in any of Pulsar's forms."""
    try:
        name = TopicName.parse(value)
    except InvalidTopicNameError as e:
        raise UsageError(str(e)) from None
    if not name.is_persistent:
        raise UsageError(f"{value!r}: only persistent topics are supported")
    return f"{name.tenant}/{name.namespace_local_name}/{urllib.parse.quote(name.local_name, safe='')}"


# -- HTTP --------------------------------------------------------------------------------------
class _NoContent:
    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NO_CONTENT"


NO_CONTENT = _NoContent()  # a 204 (or empty) answer, unlike a JSON null


class AdminHttpError(PulsarliteError):
    """The admin service answered an HTTP error (or too many redirects, a response too large): exit 1."""

    def __init__(self, status: int, reason: str, method: str, url: str) -> None:
        super().__init__(f"HTTP {status}: {reason}")
        self.status, self.reason, self.method, self.url = status, reason, method, url


class AdminUnreachableError(PulsarliteError):
    """The admin service cannot be reached: exit 1."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D401 - urllib API
        return None  # we follow redirects ourselves, keeping method and body


_OPENER = urllib.request.build_opener(_NoRedirect)


class AdminClient:
    """A small blocking client of the HTTP admin: JSON in, JSON out."""

    def __init__(self, admin_url: str, *, timeout_s: float = REQUEST_TIMEOUT_S, authorization: str | None = None,
                 ssl_context=None) -> None:
        """``authorization``: the Authorization header ([security]: Bearer or Basic), never printed;
        ``ssl_context``: for https:// (ClientConfig.http_ssl_context)."""
        self.admin_url = admin_url.rstrip("/")
        self.timeout_s = timeout_s
        self._authorization = authorization
        self._opener = (urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=ssl_context))
                        if ssl_context is not None else _OPENER)

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, str] | None = None) -> Any:
        status, _, raw = self.exchange(method, path, body, query=query)
        if status == 204 or not raw.strip():
            return NO_CONTENT
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def exchange(self, method: str, path: str, body: Any = None, *,
                 query: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One call, redirects followed: (status, response headers, body bytes); errors raise."""
        url = self.admin_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        for _ in range(REDIRECTS_MAX + 1):
            req = urllib.request.Request(url, data=data, method=method)
            req.add_header("Accept", "application/json")
            if self._authorization:
                req.add_header("Authorization", self._authorization)
            if data is not None:
                req.add_header("Content-Type", "application/json")
            try:
                with self._opener.open(req, timeout=self.timeout_s) as resp:
                    raw = resp.read(RESPONSE_BYTES_MAX + 1)
                    status = resp.status
                    headers = dict(resp.headers.items())
            except urllib.error.HTTPError as e:
                if e.code in (301, 302, 303, 307, 308) and e.headers.get("Location"):
                    url = urllib.parse.urljoin(url, e.headers["Location"])
                    e.close()
                    continue
                raise AdminHttpError(e.code, _reason(e), method, url) from None
            except (urllib.error.URLError, OSError) as e:
                why = getattr(e, "reason", e)
                raise AdminUnreachableError(f"cannot reach the admin service at {self.admin_url}: {why}") from None
            if len(raw) > RESPONSE_BYTES_MAX:
                raise AdminHttpError(status, f"response larger than {RESPONSE_BYTES_MAX} bytes", method, url)
            return status, headers, raw
        raise AdminHttpError(307, f"more than {REDIRECTS_MAX} redirects", method, url)

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)


def _reason(e: urllib.error.HTTPError) -> str:
    try:
        text = e.read(64 * 1024).decode("utf-8", "replace")
    except OSError:
        text = ""
    finally:
        e.close()
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict) and parsed.get("reason"):
            return str(parsed["reason"])
    except ValueError:
        pass
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first or (e.reason if isinstance(e.reason, str) else str(e.reason)) or "error"


# -- output ------------------------------------------------------------------------------------
def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        out: list[tuple[str, Any]] = []
        for k, v in value.items():
            out.extend(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
        out = []
        for i, v in enumerate(value):
            out.extend(_flatten(v, f"{prefix}.{i}" if prefix else str(i)))
        return out
    return [(prefix, value)]


def _cell(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def format_table(value: Any, header: str = "NAME") -> str:
    if isinstance(value, list) and all(isinstance(v, dict) for v in value) and value:
        columns: list[str] = []
        for row in value:
            columns.extend(k for k in row if k not in columns)
        rows = [[_cell(row.get(c, "")) for c in columns] for row in value]
        return _render([c.upper() for c in columns], rows)
    if isinstance(value, list):
        return _render([header], [[_cell(v)] for v in value])
    if isinstance(value, dict):
        return _render(["KEY", "VALUE"], [[k, _cell(v)] for k, v in _flatten(value)])
    return _cell(value)


def _render(header: list[str], rows: list[list[str]]) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def emit(value: Any, output: str | None, *, header: str = "NAME") -> None:
    """pulsar-admin style by default: nothing for no content (NO_CONTENT), one item a line for a list of
    names, JSON for objects; ``json`` and ``table`` on request."""
    if value is NO_CONTENT:
        return
    if output == "json":
        text = json.dumps(value, indent=2)
    elif output == "table":
        text = format_table(value, header)
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        text = "\n".join(value)
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, indent=2)
    else:
        text = value if isinstance(value, str) else json.dumps(value)
    if text:
        print(text)


# -- the command table -------------------------------------------------------------------------
@dataclass(frozen=True)
class Arg:
    flags: tuple[str, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


def A(*flags: str, **kwargs: Any) -> Arg:
    return Arg(flags, kwargs)


TOPIC = A("topic", help="topic: persistent://tenant/ns/topic, tenant/ns/topic or topic (public/default)")
NAMESPACE = A("namespace", help="tenant/namespace")
TENANT = A("tenant")
SUB = A("-s", "--subscription", required=True, help="subscription name")
FORCE = A("-f", "--force", action="store_true", help="also when producers/consumers are connected")
RESET_CURSOR_ARGS = (TOPIC, SUB, A("-t", "--time", type=parse_time_s, help="this long ago, e.g. 1h"),
                     A("--timestamp-ms", type=int, help="absolute publish time (ms since the epoch)"),
                     A("-m", "--messageId", dest="message_id", type=parse_message_id,
                       help="deliver this message next: LEDGER:ENTRY"),
                     A("-e", "--exclude-reset-position", dest="exclude", action="store_true",
                       help="with -m: deliver the message after it next"))


@dataclass(frozen=True)
class Op:
    group: str
    name: str
    help: str
    method: str = "GET"
    path: str = ""                           # template: {cluster} {tenant} {namespace} {topic} {sub}
    args: tuple[Arg, ...] = ()
    body: Callable[[argparse.Namespace], Any] | None = None
    query: Callable[[argparse.Namespace], dict[str, str]] | None = None
    run: Callable[[AdminClient, argparse.Namespace], Any] | None = None  # custom: returns the output value
    aliases: tuple[tuple[str, str], ...] = ()  # more (group, name) pairs for the same command
    header: str = "NAME"


def _path_values(args: argparse.Namespace) -> dict[str, str]:
    values: dict[str, str] = {}
    if getattr(args, "cluster", None) is not None:
        values["cluster"] = _check_name("cluster", args.cluster)
    if getattr(args, "tenant", None) is not None:
        values["tenant"] = _check_name("tenant", args.tenant)
    if getattr(args, "namespace", None) is not None:
        values["namespace"] = _namespace_path(args.namespace)
    if getattr(args, "topic", None) is not None:
        values["topic"] = _topic_path(args.topic)
    if getattr(args, "role", None) is not None:
        if not args.role or "/" in args.role or any(ch.isspace() for ch in args.role):
            raise UsageError(f"invalid role {args.role!r}")
        values["role"] = urllib.parse.quote(args.role, safe="")
    if getattr(args, "subscription", None) is not None:
        if not args.subscription or any(ch.isspace() for ch in args.subscription):
            raise UsageError(f"invalid subscription name {args.subscription!r}")
        values["sub"] = urllib.parse.quote(args.subscription, safe="")
    return values


NS = "/admin/v2/namespaces/{namespace}"
TP = "/admin/v2/persistent/{topic}"


ROLE = A("--role", required=True, help="the role (a token's subject, a certificate's CN, a basic user)")
ACTIONS = A("--actions", required=True, help="comma-separated: produce, consume, functions, sources, sinks, packages")
PERMISSION_ACTIONS = ("produce", "consume", "functions", "sources", "sinks", "packages")


def _actions_body(args: argparse.Namespace) -> list[str]:
    actions = [a.strip() for a in args.actions.split(",") if a.strip()]
    unknown = [a for a in actions if a not in PERMISSION_ACTIONS]
    if not actions or unknown:
        raise UsageError(f"--actions: one or more of {', '.join(PERMISSION_ACTIONS)} (got {args.actions!r})")
    return actions


def _retention_body(args: argparse.Namespace) -> dict[str, int]:
    time_s, size = args.time, args.size
    return {"retentionTimeInMinutes": -1 if time_s == -1 else time_s // 60,
            "retentionSizeInMB": -1 if size == -1 else size // (1024 * 1024)}


def _backlog_quota_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"policy": args.policy}
    if args.limit is not None:
        body["limitSize"] = args.limit
    if args.limitTime is not None:
        body["limitTime"] = args.limitTime
    return body


def _dedup_body(args: argparse.Namespace) -> bool:
    if args.enable == args.disable:
        raise UsageError("give exactly one of --enable or --disable")
    return bool(args.enable)


def _position_body(args: argparse.Namespace) -> Any:
    pos = args.messageId
    if pos in ("earliest", "latest"):
        return pos
    try:
        ledger_id, entry_id = parse_message_id(pos)
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"{e} (or earliest / latest)") from None
    return {"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": -1}


def _run_tenant_create(client: AdminClient, args: argparse.Namespace) -> Any:
    """pulsar-admin: no --allowed-clusters means every cluster."""
    tenant = _check_name("tenant", args.tenant)
    clusters = _csv(args.allowed_clusters) or client.get("/admin/v2/clusters") or []
    body = {"adminRoles": _csv(args.admin_roles), "allowedClusters": clusters}
    return client.request("PUT" if args.command_name == "create" else "POST", f"/admin/v2/tenants/{tenant}", body)


def _csv(text: str | None) -> list[str]:
    return [s.strip() for s in (text or "").split(",") if s.strip()]


def first_kept_ledger(ledgers: list[dict[str, Any]], size_threshold_bytes: int,
                      current_ledger_bytes: int | None = None) -> int | None:
    """pulsar-admin's findFirstLedgerWithinThreshold: count ledger sizes from the newest back;
    when the suffix exceeds the threshold, the ledger after the one that tipped it is the first
    to keep on the bookies (offload everything before ``(ledger, 0)``). None: nothing to do."""
    if not ledgers:
        return None
    sizes = [int(l.get("size") or 0) for l in ledgers]
    if current_ledger_bytes is not None:
        sizes[-1] = current_ledger_bytes  # the open ledger's size is only in currentLedgerSize
    suffix_bytes = 0
    previous = int(ledgers[-1]["ledgerId"])
    for ledger, size in zip(reversed(ledgers), reversed(sizes)):
        suffix_bytes += size
        if suffix_bytes > size_threshold_bytes:
            return previous
        previous = int(ledger["ledgerId"])
    return None


def _payload_json(payload: bytes) -> dict[str, str]:
    try:
        return {"payload": payload.decode("utf-8")}
    except UnicodeDecodeError:
        return {"payloadBase64": base64.b64encode(payload).decode()}


def _run_get_message_by_id(client: AdminClient, args: argparse.Namespace) -> Any:
    """pulsar-admin's ``topics get-message-by-id``: the message(s) of one entry as JSON, from
    the broker's getMessageById answer (payload + X-Pulsar-* headers); a batch's messages each."""
    path = TP.format(topic=_topic_path(args.topic)) + f"/ledger/{args.ledger_id}/entry/{args.entry_id}"
    _, headers, body = client.exchange("GET", path)
    emit(_entry_info(headers, body), args.output)
    return None


def _entry_info(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """An entry as the broker answers it (getMessageById, peek, examine: payload + X-Pulsar-*
    headers) as JSON: its message, or a batch's messages each."""
    from pulsarlite.wire import pb
    from pulsarlite.wire.entry import unpack_entry
    h = {k.lower(): v for k, v in headers.items()}
    info: dict[str, Any] = {"messageId": h.get("x-pulsar-message-id"), "publishTime": h.get("x-pulsar-publish-time"),
                            "producerName": h.get("x-pulsar-producer-name"),
                            "sequenceId": int(h["x-pulsar-sequence-id"]) if "x-pulsar-sequence-id" in h else None,
                            "properties": json.loads(h.get("x-pulsar-property") or "{}")}
    for header, key in (("x-pulsar-partition-key", "key"), ("x-pulsar-event-time", "eventTime")):
        if header in h:
            info[key] = h[header]
    count = h.get("x-pulsar-num-batch-message")
    if count is None or h.get("x-pulsar-is-encrypted") == "true":
        info |= _payload_json(body)
    else:      # a batch: its framed messages, split by the entry codec under a minimal metadata
        meta = pb.MessageMetadata(producer_name="-", sequence_id=0, publish_time=0,
                                  num_messages_in_batch=int(count)).SerializeToString()
        _, messages = unpack_entry(len(meta).to_bytes(4, "big") + meta + body)
        info["messages"] = [{"batchIndex": i, "key": m.key, "properties": dict(m.properties)}
                            | _payload_json(bytes(m.payload)) for i, m in enumerate(messages)]
    return info


def _run_peek_messages(client: AdminClient, args: argparse.Namespace) -> Any:
    """pulsar-admin's ``topics peek-messages -s SUB -n N``: the subscription's next N
    unacknowledged entries (Pulsar's GET .../position/{i} for i = 1..N), fewer when the backlog
    is shorter; the cursor does not move."""
    path = (TP + "/subscription/{sub}/position/").format(**_path_values(args))
    found = []
    for i in range(1, args.count + 1):
        try:
            _, headers, body = client.exchange("GET", path + str(i))
        except AdminHttpError as e:
            if e.status == 404 and e.reason == "Message not found":
                break
            raise
        found.append(_entry_info(headers, body))
    emit(found, args.output)
    return None


def _run_examine_message(client: AdminClient, args: argparse.Namespace) -> Any:
    """pulsar-admin's ``topics examine-message -i earliest|latest -m N``: the topic's N-th entry
    from that end."""
    path = TP.format(topic=_topic_path(args.topic)) + "/examinemessage"
    _, headers, body = client.exchange("GET", path, query={"initialPosition": args.initial_position,
                                                           "messagePosition": str(args.message_position)})
    emit(_entry_info(headers, body), args.output)
    return None


def _run_offload(client: AdminClient, args: argparse.Namespace) -> Any:
    path = TP.format(topic=_topic_path(args.topic))
    stats = client.get(path + "/internalStats")
    ledgers = (stats or {}).get("ledgers") or []
    if not ledgers:
        raise AdminCommandError("topic has no data")
    current = stats.get("currentLedgerSize")
    ledger_id = first_kept_ledger(ledgers, args.size_threshold, None if current is None else int(current))
    if ledger_id is None:
        print("Nothing to offload")
        return None
    client.request("PUT", path + "/offload", {"ledgerId": ledger_id, "entryId": 0, "partitionIndex": -1})
    print(f"Offload triggered for {args.topic} for messages before {ledger_id}:0:-1")
    return None


_OFFLOAD_STATUS_TEXT = {"NOT_RUN": "Offload has not been run for {topic} since broker startup",
                        "RUNNING": "Offload is currently running",
                        "SUCCESS": "Offload was a success",
                        "ERROR": "Error in offload"}


def _run_offload_status(client: AdminClient, args: argparse.Namespace) -> Any:
    """Pulsar's offload-status: the LongRunningProcessStatus, -w waits while RUNNING (progress
    on stderr)."""
    return _long_running_status(client, args, "offload", "offload", _OFFLOAD_STATUS_TEXT, "Offload status: {status}",
                                "Error offloading", show_progress=True)


def _long_running_status(client: AdminClient, args: argparse.Namespace, suffix: str, what: str,
                         texts: dict[str, str], other_text: str, error_prefix: str, *, show_progress: bool) -> Any:
    """GET ``<topic>/<suffix>`` (a LongRunningProcessStatus); with ``--wait`` poll while RUNNING
    (AdminCommandError after ``--timeout``); print it (``texts`` by status, else ``other_text``)
    or emit it as ``--output``; AdminCommandError ``error_prefix: lastError`` on ERROR."""
    path = TP.format(topic=_topic_path(args.topic)) + "/" + suffix
    status = client.get(path) or {}
    deadline = time.monotonic() + args.timeout
    while args.wait and status.get("status") == "RUNNING":
        if time.monotonic() >= deadline:
            raise AdminCommandError(f"{what} of {args.topic} still running after {args.timeout:g}s")
        if show_progress:
            progress = {k: v for k, v in status.items() if k not in ("status", "lastError")}
            print(f"running {json.dumps(progress)}" if progress else ".", file=sys.stderr, flush=True)
        time.sleep(OFFLOAD_POLL_INTERVAL_S)
        status = client.get(path) or {}
    if args.output:
        emit(status, args.output)
    else:
        print(texts.get(status.get("status"), other_text).format(topic=args.topic, status=json.dumps(status)))
    if status.get("status") == "ERROR":
        raise AdminCommandError(f"{error_prefix}: {status.get('lastError') or 'unknown error'}")
    return None


_COMPACTION_STATUS_TEXT = {"NOT_RUN": "Compaction has not been run for {topic} since broker startup",
                           "RUNNING": "Compaction is currently running",
                           "SUCCESS": "Compaction was a success",
                           "ERROR": "Error in compaction"}


def _run_compact(client: AdminClient, args: argparse.Namespace) -> Any:
    client.request("PUT", TP.format(topic=_topic_path(args.topic)) + "/compaction")
    print(f"Topic compaction requested for {args.topic}")
    return None


def _run_compaction_status(client: AdminClient, args: argparse.Namespace) -> Any:
    """Pulsar's compaction-status: the LongRunningProcessStatus, -w waits while RUNNING."""
    return _long_running_status(client, args, "compaction", "compaction", _COMPACTION_STATUS_TEXT,
                                "Compaction status: {status}", "Error in compaction", show_progress=False)


def _run_reset_cursor(client: AdminClient, args: argparse.Namespace) -> Any:
    given = [v for v in (args.time, args.timestamp_ms, args.message_id) if v is not None]
    if len(given) != 1:
        raise UsageError("give exactly one of -t/--time (relative, e.g. 1h), --timestamp-ms or "
                         "-m/--messageId LEDGER:ENTRY")
    if args.exclude and args.message_id is None:
        raise UsageError("-e/--exclude-reset-position goes with -m/--messageId")
    if args.message_id is not None:     # Pulsar's resetCursorOnPosition: a ResetCursorData body
        ledger_id, entry_id = args.message_id
        path = (TP + "/subscription/{sub}/resetcursor").format(**_path_values(args))
        return client.request("POST", path, {"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": -1,
                                             "isExcluded": bool(args.exclude), "batchIndex": -1})
    timestamp_ms = args.timestamp_ms if args.time is None else int(time.time() * 1000) - max(args.time, 0) * 1000
    path = (TP + "/subscription/{sub}/resetcursor/{ts}").format(ts=timestamp_ms, **_path_values(args))
    return client.request("POST", path)


class AdminCommandError(PulsarliteError):
    """A command-level failure (not HTTP): exit 1."""


# -- schemas -----------------------------------------------------------------------------------
SCHEMA_FILE_BYTES_MAX = 1024 * 1024
SCHEMA_TYPES = ("AVRO", "JSON", "STRING", "BOOLEAN", "INT8", "INT16", "INT32", "INT64", "FLOAT",
                "DOUBLE", "KEY_VALUE", "PROTOBUF")
SCHEMAS = "/admin/v2/schemas/{topic}"


def _schema_payload(args: argparse.Namespace) -> dict[str, Any]:
    """pulsar-admin's schema file (``{"type": "AVRO", "schema": "<definition>", "properties":
    {}}``), or a bare Avro definition (``{"type": "record", ...}``) sent as ``--type``."""
    if not args.file:
        raise UsageError("give the schema with -f/--file")
    try:
        with open(args.file, "rb") as f:
            raw = f.read(SCHEMA_FILE_BYTES_MAX + 1)
    except OSError as e:
        raise UsageError(f"cannot read {args.file}: {e.strerror}") from None
    if len(raw) > SCHEMA_FILE_BYTES_MAX:
        raise UsageError(f"{args.file} is larger than {SCHEMA_FILE_BYTES_MAX} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{args.file} is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{args.file}: expected a JSON object (a schema payload or an Avro record)")
    if "schema" in doc:
        kind, definition, props = doc.get("type"), doc["schema"], doc.get("properties") or {}
        if isinstance(definition, (dict, list)):
            definition = json.dumps(definition)
        if not isinstance(kind, str) or not isinstance(definition, str) or not isinstance(props, dict):
            raise UsageError(f"{args.file}: type and schema must be strings, properties an object")
        if args.type and args.type != kind.upper():
            raise UsageError(f"{args.file} says type {kind}, --type says {args.type}")
        return {"type": kind.upper(), "schema": definition, "properties": props}
    if doc.get("type") == "record":
        return {"type": args.type or "AVRO", "schema": json.dumps(doc), "properties": {}}
    raise UsageError(f"{args.file}: neither a schema payload (with \"schema\") nor an Avro record definition")


def _pretty_schema(value: Any) -> Any:
    """The definition of AVRO/JSON versions as JSON, not as a string of JSON."""
    if isinstance(value, dict) and value.get("type") in ("AVRO", "JSON") and isinstance(value.get("data"), str):
        try:
            return {**value, "data": json.loads(value["data"])}
        except ValueError:
            return value
    return value


def _run_schema_get(client: AdminClient, args: argparse.Namespace) -> Any:
    path = SCHEMAS.format(topic=_topic_path(args.topic)) + "/schema"
    if args.version is not None:
        path += f"/{args.version}"
    value = client.get(path)
    if args.output == "table":
        emit({k: v for k, v in value.items() if k != "data"} | {"data": value.get("data")}, "table")
    else:
        emit(_pretty_schema(value), "json")
    return None


def _run_schema_versions(client: AdminClient, args: argparse.Namespace) -> Any:
    got = client.get(SCHEMAS.format(topic=_topic_path(args.topic)) + "/schemas") or {}
    versions = got.get("getSchemaResponses", [])
    if args.output == "table":
        rows = [{"version": v.get("version"), "type": v.get("type"), "timestamp": v.get("timestamp"),
                 "properties": v.get("properties") or {}} for v in versions]
        print(format_table(rows, "VERSION") if rows else "VERSION")
    else:
        emit([_pretty_schema(v) for v in versions], "json")
    return None


def _run_schema_upload(client: AdminClient, args: argparse.Namespace) -> Any:
    payload = _schema_payload(args)
    got = client.request("POST", SCHEMAS.format(topic=_topic_path(args.topic)) + "/schema", payload)
    if args.output:
        emit(got, args.output)
    else:
        print(f"Uploaded schema of {args.topic}: version {got.get('version') if isinstance(got, dict) else got}")
    return None


def _run_schema_delete(client: AdminClient, args: argparse.Namespace) -> Any:
    got = client.request("DELETE", SCHEMAS.format(topic=_topic_path(args.topic)) + "/schema")
    if args.output:
        emit(got, args.output)
    else:
        print(f"Deleted the schema of {args.topic}")
    return None


def _run_schema_compatibility(client: AdminClient, args: argparse.Namespace) -> Any:
    payload = _schema_payload(args)
    got = client.request("POST", SCHEMAS.format(topic=_topic_path(args.topic)) + "/compatibility", payload)
    emit(got, args.output or "json")
    if isinstance(got, dict) and got.get("isCompatible") is False:
        raise AdminCommandError(f"not compatible under {got.get('schemaCompatibilityStrategy')}: "
                                f"{got.get('reason') or 'no reason given'}")
    return None


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


SCHEMA_FILE = A("-f", "--file", help="pulsar-admin's schema file ({\"type\": \"AVRO\", \"schema\": \"...\", "
                                     "\"properties\": {}}) or an Avro record definition")
SCHEMA_TYPE = A("--type", type=str.upper, choices=SCHEMA_TYPES,
                help="type for a bare Avro definition (default AVRO)")


SIZE_HELP = "size with optional k/M/G/T suffix, -1 unlimited"
TIME_HELP = "time with optional s/m/h/d/w/y suffix (seconds when none), -1 unlimited"

COMMANDS: tuple[Op, ...] = (
    # clusters
    Op("clusters", "list", "list clusters", path="/admin/v2/clusters"),
    Op("clusters", "get", "cluster data", path="/admin/v2/clusters/{cluster}", args=(A("cluster"),)),
    # tenants
    Op("tenants", "list", "list tenants", path="/admin/v2/tenants"),
    Op("tenants", "get", "tenant info", path="/admin/v2/tenants/{tenant}", args=(TENANT,)),
    Op("tenants", "create", "create a tenant", run=_run_tenant_create,
       args=(TENANT, A("-r", "--admin-roles", help="comma-separated admin roles"),
             A("-c", "--allowed-clusters", help="comma-separated clusters (default: all)"))),
    Op("tenants", "update", "update a tenant", run=_run_tenant_create,
       args=(TENANT, A("-r", "--admin-roles", help="comma-separated admin roles"),
             A("-c", "--allowed-clusters", help="comma-separated clusters (default: all)"))),
    Op("tenants", "delete", "delete a tenant (must have no namespaces)", "DELETE",
       "/admin/v2/tenants/{tenant}", args=(TENANT,)),
    # namespaces
    Op("namespaces", "list", "list the namespaces of a tenant", path="/admin/v2/namespaces/{tenant}",
       args=(TENANT,)),
    Op("namespaces", "topics", "list the topics of a namespace", path="/admin/v2/persistent/{namespace}",
       args=(NAMESPACE,)),
    Op("namespaces", "create", "create a namespace", "PUT", NS, args=(NAMESPACE,)),
    Op("namespaces", "delete", "delete a namespace (must have no topics)", "DELETE", NS, args=(NAMESPACE,)),
    Op("namespaces", "policies", "the namespace's policies", path=NS, args=(NAMESPACE,)),
    Op("namespaces", "set-retention", "set the retention policy", "POST", NS + "/retention",
       args=(NAMESPACE, A("--size", type=parse_size_bytes, required=True, help=SIZE_HELP),
             A("--time", type=parse_time_s, required=True, help=TIME_HELP)),
       body=_retention_body),
    # [security] permissions (pulsar-admin's grant-permission / revoke-permission / permissions)
    Op("namespaces", "permissions", "the roles with permissions on a namespace and their actions",
       path=NS + "/permissions", args=(NAMESPACE,)),
    Op("namespaces", "grant-permission", "grant a role actions on a namespace", "POST", NS + "/permissions/{role}",
       args=(NAMESPACE, ROLE, ACTIONS), body=_actions_body),
    Op("namespaces", "revoke-permission", "revoke a role's permissions on a namespace", "DELETE",
       NS + "/permissions/{role}", args=(NAMESPACE, ROLE)),
    Op("topics", "permissions", "the roles with permissions on a topic (the namespace's included)",
       path=TP + "/permissions", args=(TOPIC,)),
    Op("topics", "grant-permission", "grant a role actions on a topic", "POST", TP + "/permissions/{role}",
       args=(TOPIC, ROLE, ACTIONS), body=_actions_body),
    Op("topics", "revoke-permission", "revoke a role's permissions on a topic", "DELETE",
       TP + "/permissions/{role}", args=(TOPIC, ROLE)),
    Op("namespaces", "get-retention", "the retention policy", path=NS + "/retention", args=(NAMESPACE,)),
    Op("namespaces", "remove-retention", "back to the broker's default retention", "DELETE",
       NS + "/retention", args=(NAMESPACE,)),
    Op("namespaces", "set-message-ttl", "set the message TTL", "POST", NS + "/messageTTL",
       args=(NAMESPACE, A("-ttl", "--messageTTL", dest="ttl", type=parse_time_s, required=True,
                          help="TTL with optional s/m/h/d/w/y suffix")),
       body=lambda a: _nonnegative("message TTL", a.ttl)),
    Op("namespaces", "get-message-ttl", "the message TTL (seconds)", path=NS + "/messageTTL", args=(NAMESPACE,)),
    Op("namespaces", "remove-message-ttl", "remove the message TTL", "DELETE", NS + "/messageTTL",
       args=(NAMESPACE,)),
    Op("namespaces", "set-backlog-quota", "set a backlog quota", "POST", NS + "/backlogQuota",
       args=(NAMESPACE, A("-l", "--limit", type=parse_size_bytes, help="size limit: " + SIZE_HELP),
             A("-lt", "--limitTime", type=parse_time_s, help="age limit: " + TIME_HELP),
             A("-p", "--policy", required=True,
               choices=("producer_request_hold", "producer_exception", "consumer_backlog_eviction")),
             A("-t", "--type", dest="quota_type", default="destination_storage",
               choices=("destination_storage", "message_age"))),
       body=_backlog_quota_body, query=lambda a: {"backlogQuotaType": a.quota_type}),
    Op("namespaces", "get-backlog-quotas", "the backlog quotas", path=NS + "/backlogQuotaMap", args=(NAMESPACE,)),
    Op("namespaces", "remove-backlog-quota", "remove a backlog quota", "DELETE", NS + "/backlogQuota",
       args=(NAMESPACE, A("-t", "--type", dest="quota_type", default="destination_storage",
                          choices=("destination_storage", "message_age"))),
       query=lambda a: {"backlogQuotaType": a.quota_type}),
    Op("namespaces", "set-offload-threshold", "offload when a topic holds more than SIZE on the bookies",
       "PUT", NS + "/offloadThreshold",
       args=(NAMESPACE, A("-s", "--size", type=parse_size_bytes, required=True, help=SIZE_HELP + " (disables)")),
       body=lambda a: a.size),
    Op("namespaces", "get-offload-threshold", "the offload threshold (bytes, -1 disabled)",
       path=NS + "/offloadThreshold", args=(NAMESPACE,)),
    Op("namespaces", "set-offload-deletion-lag", "how long offloaded ledgers stay on the bookies", "PUT",
       NS + "/offloadDeletionLagMs",
       args=(NAMESPACE, A("-l", "--lag", type=parse_time_s, required=True, help="e.g. 4h; 0 deletes at once")),
       body=lambda a: _nonnegative("offload deletion lag", a.lag) * 1000),
    Op("namespaces", "get-offload-deletion-lag", "the offload deletion lag (ms; null: broker default)",
       path=NS + "/offloadDeletionLagMs", args=(NAMESPACE,)),
    Op("namespaces", "clear-offload-deletion-lag", "back to the broker's default lag", "DELETE",
       NS + "/offloadDeletionLagMs", args=(NAMESPACE,)),
    Op("namespaces", "set-compaction-threshold",
       "compact a topic automatically when its backlog after the compaction horizon exceeds SIZE", "PUT",
       NS + "/compactionThreshold",
       args=(NAMESPACE, A("-t", "--threshold", type=parse_size_bytes, required=True, help=SIZE_HELP + " (0 disables)")),
       body=lambda a: _nonnegative("compaction threshold", a.threshold)),
    Op("namespaces", "get-compaction-threshold", "the compaction threshold (bytes; null: not set)",
       path=NS + "/compactionThreshold", args=(NAMESPACE,)),
    Op("namespaces", "remove-compaction-threshold", "remove the compaction threshold (no automatic compaction)",
       "DELETE", NS + "/compactionThreshold", args=(NAMESPACE,)),
    Op("namespaces", "set-deduplication", "enable or disable deduplication", "POST", NS + "/deduplication",
       args=(NAMESPACE, A("-e", "--enable", action="store_true"), A("-d", "--disable", action="store_true")),
       body=_dedup_body),
    Op("namespaces", "get-deduplication", "deduplication (null: broker default)", path=NS + "/deduplication",
       args=(NAMESPACE,)),
    # topics
    Op("topics", "list", "list the topics of a namespace, persistent and non-persistent (partitions included)",
       path="/admin/v2/namespaces/{namespace}/topics", args=(NAMESPACE,), query=lambda a: {"mode": "ALL"}),
    Op("topics", "list-partitioned-topics", "list the partitioned topics of a namespace",
       path="/admin/v2/persistent/{namespace}/partitioned", args=(NAMESPACE,)),
    Op("topics", "create", "create a non-partitioned topic", "PUT", TP, args=(TOPIC,)),
    Op("topics", "create-partitioned-topic", "create a partitioned topic", "PUT", TP + "/partitions",
       args=(TOPIC, A("-p", "--partitions", type=_positive_int, required=True)), body=lambda a: a.partitions),
    Op("topics", "update-partitioned-topic", "grow a partitioned topic", "POST", TP + "/partitions",
       args=(TOPIC, A("-p", "--partitions", type=_positive_int, required=True)), body=lambda a: a.partitions),
    Op("topics", "get-partitioned-topic-metadata", "the number of partitions", path=TP + "/partitions",
       args=(TOPIC,)),
    Op("topics", "delete", "delete a topic", "DELETE", TP, args=(TOPIC, FORCE),
       query=lambda a: {"force": "true"} if a.force else {}),
    Op("topics", "delete-partitioned-topic", "delete a partitioned topic and its partitions", "DELETE",
       TP + "/partitions", args=(TOPIC, FORCE), query=lambda a: {"force": "true"} if a.force else {}),
    Op("topics", "stats", "topic stats", path=TP + "/stats", args=(TOPIC,)),
    Op("topics", "stats-internal", "managed ledger and cursor stats", path=TP + "/internalStats", args=(TOPIC,)),
    Op("topics", "partitioned-stats", "stats of a partitioned topic", path=TP + "/partitioned-stats",
       args=(TOPIC, A("--per-partition", action="store_true")),
       query=lambda a: {"perPartition": "true" if a.per_partition else "false"}),
    Op("topics", "lookup", "the broker serving a topic", path="/lookup/v2/topic/persistent/{topic}", args=(TOPIC,)),
    Op("topics", "unload", "unload a topic from its broker", "PUT", TP + "/unload", args=(TOPIC,)),
    Op("topics", "last-message-id", "the last message id", path=TP + "/lastMessageId", args=(TOPIC,)),
    Op("topics", "terminate", "terminate a topic: no more messages, for good (prints the last message id)",
       "POST", TP + "/terminate", args=(TOPIC,)),
    Op("topics", "get-message-by-id", "the message(s) of one entry", run=_run_get_message_by_id,
       args=(TOPIC, A("-l", "--ledger-id", dest="ledger_id", type=_nonnegative_int, required=True),
             A("-e", "--entry-id", dest="entry_id", type=_nonnegative_int, required=True))),
    Op("topics", "offload", "offload all but the newest SIZE bytes to the tier", run=_run_offload,
       args=(A("-s", "--size-threshold", type=parse_size_bytes, required=True,
               help="bytes to keep on the bookies: " + SIZE_HELP), TOPIC)),
    Op("topics", "offload-status", "the status of the last offload", run=_run_offload_status,
       args=(TOPIC, A("-w", "--wait-complete", dest="wait", action="store_true", help="wait until not RUNNING"),
             A("--timeout", type=float, default=OFFLOAD_WAIT_S_DEFAULT, help="seconds to wait at most"))),
    Op("topics", "lake", "the topic's Iceberg table: catalog, table, metadata_location ([lakehouse])",
       path=TP + "/lake", args=(TOPIC,)),
    Op("topics", "compact", "start a compaction of a topic (every partition of a partitioned one)",
       run=_run_compact, args=(TOPIC,)),
    Op("topics", "compaction-status", "the status of the last compaction", run=_run_compaction_status,
       args=(TOPIC, A("-w", "--wait-complete", dest="wait", action="store_true", help="wait until not RUNNING"),
             A("--timeout", type=float, default=OFFLOAD_WAIT_S_DEFAULT, help="seconds to wait at most"))),
    Op("topics", "reset-cursor", "move a subscription to a time or a message id", run=_run_reset_cursor,
       args=RESET_CURSOR_ARGS),
    Op("topics", "expire-messages", "acknowledge a subscription's messages older than a time", "POST",
       TP + "/subscription/{sub}/expireMessages/{expire_s}",
       args=(TOPIC, SUB, A("-t", "--expireTime", dest="expire_s", type=parse_time_s, required=True,
                           help="older than this, e.g. 1h (seconds when no unit)"))),
    Op("topics", "expire-messages-all-subscriptions", "expire-messages on every subscription", "POST",
       TP + "/all_subscription/expireMessages/{expire_s}",
       args=(TOPIC, A("-t", "--expireTime", dest="expire_s", type=parse_time_s, required=True,
                      help="older than this, e.g. 1h (seconds when no unit)"))),
    Op("topics", "peek-messages", "the next N unacknowledged messages of a subscription (nothing moves)",
       run=_run_peek_messages,
       args=(TOPIC, SUB, A("-n", "--count", type=_positive_int, default=1, help="how many (default 1)"))),
    Op("topics", "examine-message", "the N-th message from the earliest or latest end of a topic",
       run=_run_examine_message,
       args=(TOPIC, A("-i", "--initialPosition", dest="initial_position", choices=("latest", "earliest"),
                      default="latest"),
             A("-m", "--messagePosition", dest="message_position", type=_positive_int, default=1,
               help="the N-th from that end (default 1)"))),
    # subscriptions (also under topics, with pulsar-admin's names)
    Op("subscriptions", "list", "list the subscriptions of a topic", path=TP + "/subscriptions", args=(TOPIC,),
       aliases=(("topics", "subscriptions"),)),
    Op("subscriptions", "create", "create a durable subscription", "PUT", TP + "/subscription/{sub}",
       args=(TOPIC, SUB, A("-m", "--messageId", default="latest", help="earliest, latest or LEDGER:ENTRY")),
       body=_position_body, aliases=(("topics", "create-subscription"),)),
    Op("subscriptions", "delete", "delete a subscription", "DELETE", TP + "/subscription/{sub}",
       args=(TOPIC, SUB, FORCE), query=lambda a: {"force": "true"} if a.force else {},
       aliases=(("topics", "unsubscribe"),)),
    Op("subscriptions", "skip", "skip N messages of a subscription", "POST",
       TP + "/subscription/{sub}/skip/{count}",
       args=(TOPIC, SUB, A("-n", "--count", type=_positive_int, required=True)), aliases=(("topics", "skip"),)),
    Op("subscriptions", "clear-backlog", "skip every message of a subscription", "POST",
       TP + "/subscription/{sub}/skip_all", args=(TOPIC, SUB), aliases=(("topics", "clear-backlog"),)),
    Op("subscriptions", "reset-cursor", "move a subscription to a time or a message id", run=_run_reset_cursor,
       args=RESET_CURSOR_ARGS),
    # schemas
    Op("schemas", "get", "the topic's latest schema (or --version N)", run=_run_schema_get,
       args=(TOPIC, A("--version", type=_nonnegative_int, help="a version instead of the latest"))),
    Op("schemas", "versions", "every live schema version of the topic", run=_run_schema_versions, args=(TOPIC,)),
    Op("schemas", "upload", "add a schema version (checked against the namespace's compatibility strategy)",
       run=_run_schema_upload, args=(TOPIC, SCHEMA_FILE, SCHEMA_TYPE)),
    Op("schemas", "delete", "delete every schema version of the topic", run=_run_schema_delete, args=(TOPIC,)),
    Op("schemas", "compatibility", "test a schema against the topic's versions (exit 1 if incompatible)",
       run=_run_schema_compatibility, args=(TOPIC, SCHEMA_FILE, SCHEMA_TYPE)),
)

GROUP_HELP = {"clusters": "clusters", "tenants": "tenants", "namespaces": "namespaces and their policies",
              "topics": "persistent topics", "subscriptions": "subscriptions of a topic",
              "schemas": "schemas of a topic"}


def _nonnegative(what: str, value: int) -> int:
    if value < 0:
        raise UsageError(f"{what} must be >= 0")
    return value


# -- the parser --------------------------------------------------------------------------------
def _add_common(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """--output and the connection flags; on the leaves with SUPPRESS defaults so they may come
    before or after the command without one hiding the other."""
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("-o", "--output", choices=("json", "table"), default=default,
                        help="output format (default: as pulsar-admin: lists a line each, objects as JSON)")
    if suppress:
        g = parser.add_argument_group("connection")
        for flag in ("--service-url", "--admin-url", "--client-conf", "--auth-plugin", "--auth-params",
                     "--tls-trust-certs-file-path"):
            g.add_argument(flag, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        for flag in ("--tls-allow-insecure-connection", "--tls-enable-hostname-verification"):
            g.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    else:
        add_connection_flags(parser)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("admin", help="administer tenants, namespaces, topics over the HTTP admin",
                              description="The broker's HTTP admin (Pulsar v2 paths), shaped like pulsar-admin.")
    _add_common(p, suppress=False)
    groups = p.add_subparsers(dest="admin_group", required=True, metavar="GROUP")
    group_parsers: dict[str, Any] = {}

    def group(name: str):
        if name not in group_parsers:
            gp = groups.add_parser(name, help=GROUP_HELP.get(name, name))
            group_parsers[name] = gp.add_subparsers(dest="command_name", required=True, metavar="COMMAND")
        return group_parsers[name]

    for op in COMMANDS:
        for gname, cname in ((op.group, op.name), *op.aliases):
            leaf = group(gname).add_parser(cname, help=op.help, description=op.help)
            for arg in op.args:
                leaf.add_argument(*arg.flags, **arg.kwargs)
            _add_common(leaf, suppress=True)
            leaf.set_defaults(func=_run, admin_op=op)


def _run(args: argparse.Namespace) -> int:
    op: Op = args.admin_op
    try:
        conn = resolve_connection(args)
    except ConfigError as e:
        return _fail(str(e), 2)
    try:
        client = AdminClient(conn.admin_url, authorization=conn.http_authorization(),
                             ssl_context=conn.http_ssl_context())
    except PulsarliteError as e:
        return _fail(str(e), 2)
    try:
        if op.run is not None:
            value = op.run(client, args)
        else:
            values = _path_values(args)
            if "{count}" in op.path:
                values["count"] = str(args.count)
            if "{expire_s}" in op.path:
                values["expire_s"] = str(_nonnegative("expire time", args.expire_s))
            body = op.body(args) if op.body else None
            query = op.query(args) if op.query else None
            value = client.request(op.method, op.path.format(**values), body, query=query)
    except UsageError as e:
        return _fail(str(e), 2)
    except AdminHttpError as e:
        hint = ""
        if e.reason in ("Not Found", "Method Not Allowed"):  # aiohttp's answer for an unknown route
            hint = ": this broker has no such admin endpoint"
        return _fail(f"{e.reason}{hint} (HTTP {e.status}, {e.method} {urllib.parse.urlsplit(e.url).path})", 1)
    except (AdminUnreachableError, AdminCommandError) as e:
        return _fail(str(e), 1)
    if op.run is None:
        emit(value, args.output, header=op.header)
    return 0


def _fail(message: str, code: int) -> int:
    print(f"pulsarlite admin: {message}", file=sys.stderr)
    return code

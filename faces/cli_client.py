"""`pulsarlite produce` and `pulsarlite consume`, like pulsar-client's, on pulsarlite's own client.

    pulsarlite produce TOPIC -m MSG [-m MSG ...] [-n N] [-k KEY] [-p key=value ...]
    pulsarlite consume TOPIC -s SUB [-n N] [-t exclusive|shared|failover|key_shared]
                       [-p earliest|latest] [--timeout S] [--json]

Connection: ``--service-url`` / ``--client-conf`` (see pulsarlite.client_config). Exit codes:
0 success, 1 an operating error (printed to stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import sys
import time

CONSUMER_TYPES = {"exclusive": "Exclusive", "shared": "Shared", "failover": "Failover",
                  "key_shared": "KeyShared"}
COMPRESSIONS = {"none": "NONE", "lz4": "LZ4", "zlib": "ZLib", "zstd": "ZSTD", "snappy": "SNAPPY"}


def _properties(values: list[str] | None) -> dict[str, str]:
    out = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"property {item!r} is not key=value")
        out[key] = value
    return out


def add_parser(subparsers) -> None:
    from pulsarlite.client_config import add_connection_flags

    if "produce" in subparsers.choices:   # listed twice in SUBCOMMANDS (produce, consume)
        return
    p = subparsers.add_parser("produce", help="produce messages to a topic",
                              description="Produce messages to a topic (like pulsar-client "
                                          "produce).")
    p.add_argument("topic")
    p.add_argument("-m", "--messages", action="append", required=True, metavar="MSG",
                   help="a message to send (repeatable)")
    p.add_argument("-n", "--num-produce", type=int, default=1, metavar="N",
                   help="send the messages N times (default 1)")
    p.add_argument("-k", "--key", default=None, help="partition key of every message")
    p.add_argument("-p", "--property", action="append", metavar="KEY=VALUE",
                   help="a message property (repeatable)")
    p.add_argument("-r", "--rate", type=float, default=0,
                   help="messages per second (default 0: as fast as possible)")
    p.add_argument("-z", "--compression", choices=sorted(COMPRESSIONS), default="none")
    p.add_argument("--no-batching", action="store_true", help="send one message per entry")
    add_connection_flags(p)
    p.set_defaults(func=run_produce)

    c = subparsers.add_parser("consume", help="consume messages from a topic",
                              description="Consume messages from a topic, acknowledging each "
                                          "(like pulsar-client consume).")
    c.add_argument("topic")
    c.add_argument("-s", "--subscription-name", required=True)
    c.add_argument("-n", "--num-messages", type=int, default=1, metavar="N",
                   help="messages to consume (default 1; 0: until interrupted)")
    c.add_argument("-t", "--subscription-type", choices=sorted(CONSUMER_TYPES),
                   default="exclusive")
    c.add_argument("-p", "--subscription-position", choices=("earliest", "latest"),
                   default="latest")
    c.add_argument("--timeout", type=float, default=0, metavar="S",
                   help="give up after S seconds without a message (default 0: wait forever)")
    c.add_argument("--json", action="store_true", help="one JSON object per message")
    c.add_argument("--hex", action="store_true", help="print payloads as hex")
    add_connection_flags(c)
    c.set_defaults(func=run_consume)


def _client(args):
    from pulsarlite.client import Client
    from pulsarlite.client_config import resolve_connection
    conf = resolve_connection(args)
    return Client(conf.service_url, operation_timeout_seconds=30, **conf.client_kwargs())


def run_produce(args) -> int:
    from pulsarlite.errors import PulsarliteError
    import pulsarlite.client as pl

    if args.num_produce < 1:
        print("error: -n must be >= 1", file=sys.stderr)
        return 2
    try:
        props = _properties(args.property)
    except argparse.ArgumentTypeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    payloads = [m.encode() for m in args.messages]
    sent = 0
    try:
        client = _client(args)
    except PulsarliteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        producer = client.create_producer(
            args.topic, batching_enabled=not args.no_batching,
            compression_type=getattr(pl.CompressionType, COMPRESSIONS[args.compression]),
            block_if_queue_full=True)
        failures = []
        interval = 1 / args.rate if args.rate > 0 else 0
        next_at = time.monotonic()
        for _ in range(args.num_produce):
            for payload in payloads:
                if interval:
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    next_at += interval
                producer.send_async(payload, lambda res, mid: failures.append(res)
                                    if res != pl.Result.Ok else None,
                                    properties=props or None, partition_key=args.key)
                sent += 1
        producer.flush()
        producer.close()
        if failures:
            print(f"error: {len(failures)} of {sent} messages failed ({failures[0].name})",
                  file=sys.stderr)
            return 1
        print(f"{sent} messages successfully produced")
        return 0
    except (PulsarliteError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


def _format(msg, as_json: bool, as_hex: bool) -> str:
    data = msg.data()
    if as_hex:
        content = data.hex()
    else:
        try:
            content = data.decode()
        except UnicodeDecodeError:
            content = "base64:" + base64.b64encode(data).decode()
    mid = msg.message_id()
    if as_json:
        return json.dumps({
            "message_id": [mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index()],
            "key": msg.key(), "properties": dict(msg.properties()), "content": content,
            "publish_time_ms": msg.publish_timestamp(), "event_time_ms": msg.event_timestamp(),
            "redelivery_count": msg.redelivery_count(), "topic": msg.topic_name()})
    return (f"----- got message -----\nkey:[{msg.key() or 'null'}], "
            f"properties:[{', '.join(f'{k}={v}' for k, v in msg.properties().items())}], "
            f"content:{content}")


def run_consume(args) -> int:
    if args.num_messages < 0 or args.timeout < 0:
        print("error: -n and --timeout must be >= 0", file=sys.stderr)
        return 2
    stop = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        return _consume(args, stop)
    finally:
        signal.signal(signal.SIGTERM, previous)     # (also called in-process, e.g. by tests)


def _consume(args, stop: list) -> int:
    from pulsarlite.errors import PulsarliteError
    import pulsarlite.client as pl

    try:
        client = _client(args)
    except PulsarliteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    received = 0
    try:
        consumer = client.subscribe(
            args.topic, args.subscription_name,
            consumer_type=getattr(pl.ConsumerType, CONSUMER_TYPES[args.subscription_type]),
            initial_position=(pl.InitialPosition.Earliest
                              if args.subscription_position == "earliest"
                              else pl.InitialPosition.Latest))
        while not stop and (args.num_messages == 0 or received < args.num_messages):
            try:
                msg = consumer.receive(timeout_millis=int(args.timeout * 1000)
                                       if args.timeout else 1000)
            except pl.Timeout:
                if args.timeout:
                    print(f"error: no message within {args.timeout:g}s "
                          f"({received} consumed)", file=sys.stderr)
                    return 1
                continue
            print(_format(msg, args.json, args.hex), flush=True)
            consumer.acknowledge(msg)
            received += 1
        consumer.close()
        print(f"{received} messages successfully consumed", file=sys.stderr)
        return 0
    except KeyboardInterrupt:
        print(f"{received} messages successfully consumed", file=sys.stderr)
        return 0
    except PulsarliteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()

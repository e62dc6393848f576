"""Writing DataFrames to topics (batch and streaming sinks) with the project's own client
(``pulsarlite.Client``, the official client's API).

Rows: ``value`` (binary or string, required); optional ``key`` (string), ``properties``
(map<string,string>), ``event_time`` (timestamp), ``topic`` (string: the row's topic, else the
``topic`` option). Batch writes name each task's producer after the write and the Spark
partition and number its rows, so with deduplication enabled on the namespace a retried task's
repeats are dropped (effectively once); streaming writes are at-least-once (docs/spark.md).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Iterator

from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage)

from pulsarlite.topic_name import TopicName
from spark_source.options import OptionError

log = logging.getLogger("pulsarlite.spark")

_ALLOWED = {"value", "key", "properties", "event_time", "topic"}


@dataclass
class SendCommit(WriterCommitMessage):
    messages: int
    topics: tuple[str, ...]


@dataclass(frozen=True)
class WriteOptions:
    service_url: str
    topic: str | None
    batching: bool
    send_timeout_ms: int
    producer_name_prefix: str | None
    # [security] client.conf's names: authPlugin, authParams, tlsTrustCertsFilePath,
    # tlsAllowInsecureConnection, tlsEnableHostnameVerification (the Authentication object is made
    # on the executor from these strings; auth_params is kept out of repr: it may hold a secret)
    auth_plugin: str = ""
    auth_params: str = field(default="", repr=False)
    tls_trust_certs_file_path: str = ""
    tls_allow_insecure_connection: bool = False
    tls_validate_hostname: bool = False

    def client_kwargs(self) -> dict:
        """pulsarlite.Client keyword arguments for the security options."""
        from pulsarlite.client.auth import authentication_from_plugin
        kwargs: dict = {"authentication": authentication_from_plugin(self.auth_plugin, self.auth_params)}
        if self.tls_trust_certs_file_path:
            kwargs["tls_trust_certs_file_path"] = self.tls_trust_certs_file_path
        if self.tls_allow_insecure_connection:
            kwargs["tls_allow_insecure_connection"] = True
        if self.tls_validate_hostname:
            kwargs["tls_validate_hostname"] = True
        return kwargs


def parse_write_options(options, schema) -> WriteOptions:
    o = {str(k).lower(): v for k, v in options.items()}
    service_url = (o.get("service_url") or o.get("serviceurl") or "").strip()
    if not service_url:
        raise OptionError("option service_url is required to write (e.g. pulsar://127.0.0.1:6650)")
    topic = (o.get("topic") or "").strip() or None
    names = [f.name for f in schema.fields]
    if "value" not in names:
        raise OptionError(f"writing needs a value column; the DataFrame has {names}")
    extra = [n for n in names if n not in _ALLOWED]
    if extra:
        raise OptionError(f"columns {extra} cannot be written: allowed are {sorted(_ALLOWED)} "
                          "(select or drop the others first)")
    if topic is None and "topic" not in names:
        raise OptionError("option topic (or a topic column) is required to write")
    if topic is not None:
        try:
            topic = str(TopicName.parse(topic))
        except ValueError as e:
            raise OptionError(f"option topic: {e}") from None
    batching = str(o.get("batchingenabled", "true")).strip().lower() != "false"
    try:
        send_timeout_ms = int(o.get("sendtimeoutms", "30000"))
    except ValueError:
        raise OptionError("option sendTimeoutMs: expected an integer") from None
    flags = {}
    for option, name in (("tlsallowinsecureconnection", "tls_allow_insecure_connection"),
                         ("tlsenablehostnameverification", "tls_validate_hostname")):
        value = str(o.get(option, "false")).strip().lower()
        if value not in ("true", "false"):
            raise OptionError(f"option {option}: expected true or false")
        flags[name] = value == "true"
    opts = WriteOptions(service_url, topic, batching, send_timeout_ms, (o.get("producername") or None),
                        auth_plugin=str(o.get("authplugin") or "").strip(), auth_params=str(o.get("authparams") or ""),
                        tls_trust_certs_file_path=str(o.get("tlstrustcertsfilepath") or "").strip(), **flags)
    try:
        opts.client_kwargs()             # a bad plugin or parameters: refused on the driver
    except ValueError as e:
        raise OptionError(f"option authPlugin/authParams: {e}") from None
    return opts


def _to_bytes(v) -> bytes:
    if v is None:
        return b""
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def send_batches(opts: WriteOptions, batches: Iterator, *, producer_name: str | None = None) -> SendCommit:
    """Send every row of the Arrow batches; returns once all are acknowledged (raises on the
    first failed send). With ``producer_name``, rows get sequence ids 0, 1, 2, ... per topic, so
    a retry of the same task (same name, same rows) is dropped by a broker with deduplication."""
    import pulsarlite

    client = pulsarlite.Client(opts.service_url, operation_timeout_seconds=max(30, opts.send_timeout_ms // 1000),
                               **opts.client_kwargs())
    producers: dict[str, object] = {}
    failures: list[str] = []
    lock = threading.Lock()
    sent = 0
    next_sequence: dict[str, int] = {}

    def done(result, msg_id):
        if result != pulsarlite.Result.Ok:
            with lock:
                failures.append(str(result))

    try:
        for batch in batches:
            cols = {name: batch.column(name).to_pylist() for name in batch.schema.names}
            values = cols["value"]
            keys = cols.get("key")
            props = cols.get("properties")
            times = cols.get("event_time")
            topics = cols.get("topic")
            for i, value in enumerate(values):
                topic = (topics[i] if topics is not None and topics[i] else None) or opts.topic
                if topic is None:
                    raise OptionError(f"row {i}: no topic (null topic column and no topic option)")
                producer = producers.get(topic)
                if producer is None:
                    producer = client.create_producer(topic, producer_name=producer_name,
                                                      batching_enabled=opts.batching,
                                                      batching_max_publish_delay_ms=5,
                                                      block_if_queue_full=True,
                                                      send_timeout_millis=opts.send_timeout_ms)
                    producers[topic] = producer
                kwargs = {}
                if keys is not None and keys[i] is not None:
                    kwargs["partition_key"] = str(keys[i])
                if props is not None and props[i]:
                    p = props[i]
                    kwargs["properties"] = {str(k): str(v) for k, v in (p.items() if isinstance(p, dict) else p)}
                if times is not None and times[i] is not None:
                    kwargs["event_timestamp"] = int(times[i].timestamp() * 1000)
                if producer_name is not None:
                    kwargs["sequence_id"] = next_sequence.get(topic, 0)
                    next_sequence[topic] = kwargs["sequence_id"] + 1
                producer.send_async(_to_bytes(value), done, **kwargs)
                sent += 1
            if failures:
                break
        for producer in producers.values():
            producer.flush()
        if failures:
            raise RuntimeError(f"{len(failures)} sends failed (first: {failures[0]}); "
                               f"{sent} messages were attempted")
        log.info("rows written messages=%d topics=%s", sent, ",".join(producers))
        return SendCommit(sent, tuple(producers))
    finally:
        for producer in producers.values():
            try:
                producer.close()
            except Exception as e:  # closing must not hide the real error
                log.warning("producer close failed: %s", e)
        client.close()


class PulsarliteWriter(DataSourceArrowWriter):
    """Batch writes. Each task's producer is named ``spark-<write id>-<partition id>`` and numbers
    its rows from 0: a retried task attempt re-sends the same (name, sequence id) pairs, which a
    topic with deduplication enabled drops (effectively once); without it, at-least-once."""

    def __init__(self, options, schema) -> None:
        import uuid
        self.opts = parse_write_options(options, schema)
        self.write_id = uuid.uuid4().hex[:16]

    def write(self, iterator) -> SendCommit:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        name = f"{self.opts.producer_name_prefix or 'spark'}-{self.write_id}-{ctx.partitionId() if ctx else 0}"
        return send_batches(self.opts, iterator, producer_name=name)

    def commit(self, messages) -> None:
        total = sum(m.messages for m in messages if m is not None)
        log.info("batch write committed messages=%d tasks=%d", total, len(messages))

    def abort(self, messages) -> None:
        log.warning("batch write aborted: messages already sent stay in the topic (at-least-once)")


class PulsarliteStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options, schema) -> None:
        self.opts = parse_write_options(options, schema)

    def write(self, iterator) -> SendCommit:
        return send_batches(self.opts, iterator)

    def commit(self, messages, batchId: int) -> None:
        total = sum(m.messages for m in messages if m is not None)
        log.info("micro-batch written batch_id=%d messages=%d", batchId, total)

    def abort(self, messages, batchId: int) -> None:
        log.warning("micro-batch %d aborted: messages already sent stay in the topic (at-least-once)", batchId)


__all__ = ["PulsarliteStreamWriter", "PulsarliteWriter", "SendCommit", "WriteOptions", "parse_write_options"]

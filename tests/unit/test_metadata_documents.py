"""The codecs of pulsarlite/metadata_documents.py: each round-trips, reads the documents the
writers before it wrote, and refuses a malformed document with a ValueError naming it."""

from __future__ import annotations

import ast
import base64
import json
import pathlib

import pytest

from pulsarlite.metadata_documents import (BrokerRecord, PartitionedTopicMetadata, SchemaHistory, SchemaRecord,
                                           bookie_registration_data, bookie_registration_metrics_address,
                                           decode_broker_record, decode_partitioned_metadata, decode_schema_history,
                                           encode_broker_record, encode_partitioned_metadata, encode_schema_history)

ROOT = pathlib.Path(__file__).resolve().parents[2]


# -- partitioned-topic metadata ----------------------------------------------------------------
@pytest.mark.parametrize("metadata", [PartitionedTopicMetadata(4), PartitionedTopicMetadata(1, {"k": "v", "ü": ""})])
def test_partitioned_metadata_round_trip(metadata):
    assert decode_partitioned_metadata(encode_partitioned_metadata(metadata)) == metadata


def test_partitioned_metadata_reads_what_the_admin_api_wrote():
    assert decode_partitioned_metadata(b'{"partitions": 3}') == PartitionedTopicMetadata(3)
    assert decode_partitioned_metadata(b'{"partitions": 2, "properties": {"a": "b"}}').properties == {"a": "b"}
    assert decode_partitioned_metadata(b'{"partitions": 2, "properties": null}').properties == {}
    assert json.loads(encode_partitioned_metadata(PartitionedTopicMetadata(5))) == {"partitions": 5}


@pytest.mark.parametrize("data, problem", [
    (b"not json", "malformed partitioned-topic metadata"),
    (b"[3]", "a JSON object expected"),
    (b"{}", "missing key 'partitions'"),
    (b'{"partitions": -1}', "partitions must be an integer >= 0"),
    (b'{"partitions": "3"}', "partitions must be an integer >= 0"),
    (b'{"partitions": true}', "partitions must be an integer >= 0"),
    (b'{"partitions": 3, "properties": [1]}', "properties must be an object"),
    (b'{"partitions": 3, "properties": {"a": 1}}', "must be a string"),
])
def test_partitioned_metadata_refuses_malformed(data, problem):
    with pytest.raises(ValueError, match="malformed partitioned-topic metadata") as e:
        decode_partitioned_metadata(data)
    assert problem in str(e.value)


# -- schema registry ---------------------------------------------------------------------------
def history() -> SchemaHistory:
    avro = SchemaRecord("s", 4, b'{"type": "record"}', (("a", "1"),), 1700, False)
    return SchemaHistory((avro, SchemaRecord.tombstone(1800), SchemaRecord("", 2, b"{}", (), 1900)))


def test_schema_history_round_trip_and_live_versions():
    h = history()
    assert decode_schema_history(encode_schema_history(h)) == h
    assert [v for v, _ in h.live()] == [2]
    assert SchemaHistory().live() == [] and decode_schema_history(b"{}") == SchemaHistory()
    grown = h.appended(SchemaRecord("t", 4, b"x", (), 2000))
    assert [v for v, _ in grown.live()] == [2, 3] and len(h.versions) == 3


def test_schema_history_reads_what_the_registry_wrote():
    data = json.dumps({"versions": [
        {"name": "n", "type": 4, "data": base64.b64encode(b"def").decode(), "properties": {"b": "2", "a": "1"},
         "timestamp": 5, "deleted": False},
        {"name": "", "type": 0, "data": "", "properties": {}, "timestamp": 6, "deleted": True}]}).encode()
    h = decode_schema_history(data)
    assert h.versions[0] == SchemaRecord("n", 4, b"def", (("a", "1"), ("b", "2")), 5, False)
    assert h.versions[1].deleted and h.live() == []
    assert json.loads(encode_schema_history(h)) == json.loads(data)


@pytest.mark.parametrize("data, problem", [
    (b"\xff", "malformed schema registry document"),
    (b'{"versions": {}}', "versions must be a list"),
    (b'{"versions": [1]}', "a version must be an object"),
    (b'{"versions": [{"type": "AVRO"}]}', "type must be an integer"),
    (b'{"versions": [{"type": 4, "data": "!!not base64"}]}', "malformed schema registry document"),
    (b'{"versions": [{"type": 4, "deleted": "no"}]}', "deleted must be a boolean"),
    (b'{"versions": [{"type": 4, "timestamp": -3}]}', "timestamp must be an integer >= 0"),
])
def test_schema_history_refuses_malformed(data, problem):
    with pytest.raises(ValueError, match="malformed schema registry document") as e:
        decode_schema_history(data)
    assert problem in str(e.value)


# -- broker records ----------------------------------------------------------------------------
@pytest.mark.parametrize("record", [
    BrokerRecord("b1", "pulsar://h:6650", "http://h:8080"),
    BrokerRecord("b1", "pulsar://h:6650", "http://h:8080", "pulsar+ssl://h:6651", "https://h:8443",
                 (("internal", "pulsar://i:6650", ""), ("external", "pulsar://e:6650", "pulsar+ssl://e:6651")),
                 load_bundles=3, load_topics=12),
    BrokerRecord("b1", "pulsar://h:6650", "http://h:8080", load_bundles=0, load_topics=0),
])
def test_broker_record_round_trip(record):
    assert decode_broker_record(encode_broker_record(record)) == record


def test_broker_record_reads_what_ownership_wrote():
    owner = {"broker_id": "b", "pulsar_url": "pulsar://h:1", "http_url": "http://h:2"}
    assert decode_broker_record(json.dumps(owner).encode()) == BrokerRecord("b", "pulsar://h:1", "http://h:2")
    registration = {**owner, "listeners": {"x": {"pulsar_url": "pulsar://x:1", "pulsar_url_tls": ""}},
                    "load": {"bundles": 2, "topics": 7}}
    got = decode_broker_record(json.dumps(registration).encode())
    assert got.listeners == (("x", "pulsar://x:1", ""),) and (got.load_bundles, got.load_topics) == (2, 7)
    assert json.loads(encode_broker_record(got)) == registration


@pytest.mark.parametrize("data, problem", [
    (b"nope", "malformed broker record"),
    (b'{"pulsar_url": "p", "http_url": "h"}', "missing key 'broker_id'"),
    (b'{"broker_id": "b", "pulsar_url": 7, "http_url": "h"}', "pulsar_url must be a string"),
    (b'{"broker_id": "b", "pulsar_url": "p", "http_url": "h", "listeners": []}', "listeners must be an object"),
    (b'{"broker_id": "b", "pulsar_url": "p", "http_url": "h", "load": {"bundles": -1}}', "load.bundles"),
])
def test_broker_record_refuses_malformed(data, problem):
    with pytest.raises(ValueError, match="malformed broker record") as e:
        decode_broker_record(data)
    assert problem in str(e.value)


# -- bookie registrations ----------------------------------------------------------------------
def test_bookie_registration_round_trip_and_lenient_read():
    assert bookie_registration_metrics_address(bookie_registration_data("b:3181", "b:8000")) == "b:8000"
    assert bookie_registration_metrics_address(bookie_registration_data("b:3181")) is None
    for bad in (b"b:3181", b"\xff", b'{"metrics": "no-port"}', b'{"metrics": "h:0"}', b"[]"):
        assert bookie_registration_metrics_address(bad) is None


# -- guard: the readers and writers use the codecs ------------------------------------------
# modules that read or write these documents and have no other use for JSON: a json import
# here means a document is parsed beside its codec again
NO_JSON = ("broker/service.py", "broker/schemas.py", "broker/ownership/shell.py", "broker/admin/console.py",
           "bookie/client/ledger_manager.py", "broker/retention.py", "broker/cursor/shell.py")


@pytest.mark.parametrize("path", NO_JSON)
def test_document_readers_do_not_parse_json_themselves(path):
    tree = ast.parse((ROOT / path).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert "json" not in imported, f"{path} imports json: decode its documents with pulsarlite/metadata_documents.py"


def test_retention_does_not_touch_cursor_znodes():
    """Retention moves cursors through broker.cursor (stored_mark_delete, advance_stored_cursor)."""
    source = (ROOT / "broker/retention.py").read_text()
    assert "cursor_path" not in source and "CursorState" not in source


def test_only_the_cursor_code_decodes_a_cursor_znode():
    offenders = [str(path.relative_to(ROOT)) for package in ("broker", "spark_source", "pulsarlite", "offload")
                 for path in (ROOT / package).rglob("*.py")
                 if "CursorState.from_bytes" in path.read_text() and path.parent.name != "cursor"]
    assert offenders == []


# -- the documents whose codec stays beside its type in one component ------------------------
LEDGER_MD = {"ledger_id": 1, "ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2, "state": "CLOSED",
             "last_entry_id": 9, "length": 100, "ensembles": [[0, ["a:1", "b:1", "c:1"]], [5, ["a:1", "d:1", "c:1"]]]}


def test_ledger_metadata_codec_round_trip_and_refusals():
    from bookie.client.metadata import LedgerMetadata
    md = LedgerMetadata.from_json(json.dumps(LEDGER_MD).encode())
    assert LedgerMetadata.from_json(md.to_json()) == md and md.ensembles[1] == (5, ("a:1", "d:1", "c:1"))
    for bad in (b"x", b"[]", json.dumps({**LEDGER_MD, "state": "WEIRD"}).encode(),
                json.dumps({**LEDGER_MD, "write_quorum": 5}).encode(),
                json.dumps({k: v for k, v in LEDGER_MD.items() if k != "ensembles"}).encode()):
        with pytest.raises(ValueError, match="malformed ledger metadata"):
            LedgerMetadata.from_json(bad)


def test_cursor_codec_round_trip_and_refusals():
    from broker.cursor import CursorState
    from broker.managed_ledger import Position
    ledgers = [(3, 10)]
    state = CursorState(Position(3, 1), ledgers=lambda: ledgers)
    state.ack_individual(Position(3, 5))
    state.ack_individual(Position(3, 7), batch_index=1, batch_size=4)
    again = CursorState.from_bytes(state.to_bytes(), ledgers=lambda: ledgers)
    assert again.to_json() == state.to_json() and again.is_acked(Position(3, 5))
    for bad in (b"x", b"[]", b"{}", b'{"mark_delete": [1]}'):
        with pytest.raises(ValueError, match="malformed cursor state"):
            CursorState.from_bytes(bad)

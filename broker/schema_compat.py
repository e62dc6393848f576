"""Schema compatibility, as Pulsar's schema registry decides it: pure functions, no I/O.

A topic's schemas form a list of versions. A new schema is checked against the latest version
(BACKWARD, FORWARD, FULL) or against every version (the ``_TRANSITIVE`` forms):

- BACKWARD: consumers using the new schema can read data written with the old one.
- FORWARD: consumers using the old schema can read data written with the new one.
- FULL: both.

AVRO and JSON schemas (Pulsar's JSON schema is an Avro record definition) are checked with
Avro's schema-resolution rules (https://avro.apache.org/docs/current/specification/#schema-resolution)
as Pulsar applies them (Avro's SchemaValidator, whose resolving grammar does not compare record
names, over definitions parsed without validating defaults):
fields matched by name (or reader alias), reader fields missing from the writer need a default
(any default, ``null`` included), numeric promotions int -> long -> float -> double,
string <-> bytes, unions branch by branch, enum names and symbols, fixed names and sizes. A
record may change its name (the official Python client names it after the class). KEY_VALUE
schemas check their key and value parts. PROTOBUF_NATIVE schemas, as Pulsar's
ProtobufNativeSchemaCompatibilityCheck, under every strategy that checks: the root message's
full name must not change (the descriptor set is built, not compared byte for byte: the Go
client orders its files differently per process). Any other type is compatible only with the
same type and the same definition bytes; primitive types (STRING, INT64, ...) carry no definition: the
same type is the same schema, as in Pulsar.

Everything here is synchronous and deterministic; the registry (broker/schemas.py) calls it.
"""

from __future__ import annotations

import base64
import enum
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from broker.errors import BrokerError
from pulsarlite.keyvalue import split_pair
from pulsarlite.wire import pb

# -- strategies -------------------------------------------------------------------------------


class CompatibilityStrategy(enum.Enum):
    """Pulsar's SchemaCompatibilityStrategy names (UNDEFINED means: the broker's default)."""
    UNDEFINED = "UNDEFINED"
    ALWAYS_COMPATIBLE = "ALWAYS_COMPATIBLE"
    ALWAYS_INCOMPATIBLE = "ALWAYS_INCOMPATIBLE"
    BACKWARD = "BACKWARD"
    FORWARD = "FORWARD"
    FULL = "FULL"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"

    @classmethod
    def parse(cls, value: object) -> "CompatibilityStrategy":
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().upper())
        except ValueError:
            raise ValueError(f"unknown schema compatibility strategy {value!r}: one of "
                             f"{', '.join(s.value for s in cls)}") from None

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_TRANSITIVE")

    @property
    def checks_backward(self) -> bool:
        return self in (CompatibilityStrategy.BACKWARD, CompatibilityStrategy.FULL,
                        CompatibilityStrategy.BACKWARD_TRANSITIVE, CompatibilityStrategy.FULL_TRANSITIVE)

    @property
    def checks_forward(self) -> bool:
        return self in (CompatibilityStrategy.FORWARD, CompatibilityStrategy.FULL,
                        CompatibilityStrategy.FORWARD_TRANSITIVE, CompatibilityStrategy.FULL_TRANSITIVE)


DEFAULT_STRATEGY = CompatibilityStrategy.FULL       # Pulsar's broker default


class IncompatibleSchemaError(BrokerError):
    """A schema the topic's compatibility strategy refuses; nothing was stored."""
    retriable = False
    server_error = pb.IncompatibleSchema


class InvalidSchemaError(BrokerError):
    """A schema definition that cannot be parsed (bad JSON, not an Avro schema, ...)."""
    retriable = False
    server_error = pb.IncompatibleSchema


# -- schema types -----------------------------------------------------------------------------

# Pulsar's admin names for the wire enum (SchemaType in the REST API)
TYPE_NAMES: dict[int, str] = {
    pb.Schema.Type.Value("None"): "BYTES",
    pb.Schema.String: "STRING", pb.Schema.Json: "JSON", pb.Schema.Protobuf: "PROTOBUF",
    pb.Schema.Avro: "AVRO", pb.Schema.Bool: "BOOLEAN", pb.Schema.Int8: "INT8", pb.Schema.Int16: "INT16",
    pb.Schema.Int32: "INT32", pb.Schema.Int64: "INT64", pb.Schema.Float: "FLOAT", pb.Schema.Double: "DOUBLE",
    pb.Schema.Date: "DATE", pb.Schema.Time: "TIME", pb.Schema.Timestamp: "TIMESTAMP",
    pb.Schema.KeyValue: "KEY_VALUE", pb.Schema.Instant: "INSTANT", pb.Schema.LocalDate: "LOCAL_DATE",
    pb.Schema.LocalTime: "LOCAL_TIME", pb.Schema.LocalDateTime: "LOCAL_DATE_TIME",
    pb.Schema.ProtobufNative: "PROTOBUF_NATIVE", pb.Schema.AutoConsume: "AUTO_CONSUME",
    pb.Schema.External: "EXTERNAL",
}
TYPE_CODES: dict[str, int] = {name: code for code, name in TYPE_NAMES.items()}
STRUCT_TYPES = frozenset({"AVRO", "JSON"})
# types whose definition carries nothing (clients send it empty, or "null" as the official
# Python client does for STRING): one type, one schema, as Pulsar treats them
PRIMITIVE_TYPES = frozenset({"BYTES", "STRING", "BOOLEAN", "INT8", "INT16", "INT32", "INT64", "FLOAT",
                             "DOUBLE", "DATE", "TIME", "TIMESTAMP", "INSTANT", "LOCAL_DATE", "LOCAL_TIME",
                             "LOCAL_DATE_TIME"})


def type_name(code: int) -> str:
    try:
        return TYPE_NAMES[code]
    except KeyError:
        raise InvalidSchemaError(f"unknown schema type code {code}") from None


def type_code(name: str) -> int:
    try:
        return TYPE_CODES[name.strip().upper()]
    except (KeyError, AttributeError):
        raise InvalidSchemaError(f"unknown schema type {name!r}: one of {', '.join(sorted(TYPE_CODES))}") from None


@dataclass(frozen=True)
class SchemaDef:
    """One schema version's content: Pulsar's SchemaInfo without the name."""
    type: str                              # TYPE_NAMES value, e.g. "AVRO"
    data: bytes                            # the definition (Avro JSON for AVRO/JSON)
    properties: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.type not in TYPE_CODES:
            raise InvalidSchemaError(f"unknown schema type {self.type!r}")

    def same_as(self, other: "SchemaDef") -> bool:
        """Same type, definition and properties: a producer re-declaring a known version."""
        if self.type != other.type or dict(self.properties) != dict(other.properties):
            return False
        if self.data == other.data or self.type in PRIMITIVE_TYPES:
            return True
        if self.type in STRUCT_TYPES:           # equal JSON, different spacing or key order
            try:
                return _canonical_json(self.data) == _canonical_json(other.data)
            except InvalidSchemaError:
                return False
        return False


def _canonical_json(data: bytes) -> str:
    try:
        return json.dumps(json.loads(data), sort_keys=True, separators=(",", ":"))
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidSchemaError(f"schema definition is not valid JSON: {e}") from None


# -- KeyValue encoding (Pulsar's KeyValueSchemaInfo) -------------------------------------------



def split_key_value(schema: SchemaDef) -> tuple[SchemaDef, SchemaDef]:
    """The key and value schemas of a KEY_VALUE schema: data is
    ``[i32 n][key schema][i32 m][value schema]``, their types in properties
    ``key.schema.type`` / ``value.schema.type``."""
    try:
        key, value = split_pair(schema.data)
    except ValueError as e:
        raise InvalidSchemaError(f"KEY_VALUE schema data {e}") from None
    parts = [key or b"", value or b""]          # Pulsar writes -1 for an absent part (BYTES)
    props = dict(schema.properties)
    key_type = props.get("key.schema.type", "BYTES")
    value_type = props.get("value.schema.type", "BYTES")
    return SchemaDef(key_type, parts[0]), SchemaDef(value_type, parts[1])


# -- Avro ------------------------------------------------------------------------------------

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
_DEPTH_MAX = 64


def parse_avro(data: bytes) -> Any:
    """The Avro definition as JSON, validated by fastavro (clear error when it is not one).

    Field defaults are not validated, as Pulsar parses with ``setValidateDefaults(false)``: the
    official Python client writes ``"default": null`` for a required field declared with
    ``required_default=True`` and no default, which Pulsar stores and resolves."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidSchemaError(f"schema definition is not valid JSON: {e}") from None
    try:
        import fastavro
        fastavro.parse_schema(_without_defaults(raw, 0))
    except InvalidSchemaError:
        raise
    except Exception as e:     # fastavro raises several kinds (SchemaParseException, KeyError, ...)
        raise InvalidSchemaError(f"not a valid Avro schema: {e}") from None
    return raw


def _without_defaults(node: Any, depth: int) -> Any:
    """A copy of a parsed Avro schema without the fields' defaults (for validation only)."""
    if depth > _DEPTH_MAX:
        raise InvalidSchemaError(f"Avro schema nested deeper than {_DEPTH_MAX}")
    if isinstance(node, list):
        return [_without_defaults(n, depth + 1) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _without_defaults(v, depth + 1) for k, v in node.items() if k != "fields"}
    if isinstance(node.get("fields"), list):
        out["fields"] = [{k: _without_defaults(v, depth + 1) for k, v in f.items() if k != "default"}
                         if isinstance(f, dict) else f for f in node["fields"]]
    elif "fields" in node:
        out["fields"] = node["fields"]
    return out


class _Names:
    """Named types (record, enum, fixed) of one schema, by full and short name."""

    def __init__(self, root: Any) -> None:
        self.by_name: dict[str, dict] = {}
        self._collect(root, "")

    def _collect(self, node: Any, namespace: str) -> None:
        if isinstance(node, list):
            for branch in node:
                self._collect(branch, namespace)
            return
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            name = str(node["name"])
            ns = node.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
            full = name if "." in name else (f"{ns}.{name}" if ns else name)
            self.by_name[full] = node
            self.by_name.setdefault(full.rsplit(".", 1)[-1], node)
            if kind in ("record", "error"):
                for f in node.get("fields", []):
                    self._collect(f.get("type"), ns or "")
        elif kind == "array":
            self._collect(node.get("items"), namespace)
        elif kind == "map":
            self._collect(node.get("values"), namespace)
        elif isinstance(kind, (dict, list)):
            self._collect(kind, namespace)

    def resolve(self, node: Any) -> Any:
        """A type reference by name becomes its definition; ``{"type": "int"}`` becomes ``"int"``."""
        if isinstance(node, str) and node not in _PRIMITIVES:
            found = self.by_name.get(node) or self.by_name.get(node.rsplit(".", 1)[-1])
            if found is None:
                raise InvalidSchemaError(f"unknown Avro type {node!r}")
            return found
        if isinstance(node, dict) and isinstance(node.get("type"), str) and node["type"] in _PRIMITIVES:
            return node["type"]        # logical types resolve as their underlying type
        if isinstance(node, dict) and isinstance(node.get("type"), (dict, list)):
            return self.resolve(node["type"])
        return node


def _kind(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return "union"
    kind = node.get("type")
    return "record" if kind == "error" else str(kind)


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def avro_read_problems(reader: Any, writer: Any) -> list[str]:
    """Why a reader with schema ``reader`` cannot read every datum written with ``writer``
    (empty list: it can). Both are parsed Avro JSON."""
    problems: list[str] = []
    _check(_Names(reader), reader, _Names(writer), writer, "", problems, set(), 0)
    return problems


def _check(rn: _Names, r: Any, wn: _Names, w: Any, path: str, out: list[str],
           seen: set[tuple[int, int]], depth: int) -> None:
    if depth > _DEPTH_MAX:
        out.append(f"{path or '/'}: schema nested deeper than {_DEPTH_MAX}")
        return
    r = rn.resolve(r)
    w = wn.resolve(w)
    rk, wk = _kind(r), _kind(w)
    where = path or "/"
    if wk == "union":                     # every writer branch must be readable
        for i, branch in enumerate(w):
            _check(rn, r, wn, branch, f"{path}[{i}]", out, seen, depth + 1)
        return
    if rk == "union":                     # some reader branch must read the writer's type
        for branch in r:
            trial: list[str] = []
            _check(rn, branch, wn, w, path, trial, set(seen), depth + 1)
            if not trial:
                return
        out.append(f"{where}: writer type {wk} matches no branch of the reader's union")
        return
    if rk in _PRIMITIVES or wk in _PRIMITIVES:
        if rk == wk or rk in _PROMOTIONS.get(wk, ()):
            return
        out.append(f"{where}: reader type {rk} cannot read writer type {wk}")
        return
    if rk != wk:
        out.append(f"{where}: reader type {rk} cannot read writer type {wk}")
        return
    if rk in ("enum", "fixed"):          # records resolve by fields, whatever their names
        r_name, w_name = _short(str(r["name"])), _short(str(w["name"]))
        aliases = {_short(str(a)) for a in r.get("aliases", [])}
        if r_name != w_name and w_name not in aliases:
            out.append(f"{where}: reader {rk} {r_name} cannot read writer {rk} {w_name}")
            return
    if rk == "record":
        key = (id(r), id(w))
        if key in seen:                   # recursive type already under check
            return
        seen = seen | {key}
        w_fields = {str(f["name"]): f for f in w.get("fields", [])}
        for f in r.get("fields", []):
            name = str(f["name"])
            match = w_fields.get(name)
            if match is None:
                for alias in f.get("aliases", []):
                    match = w_fields.get(str(alias))
                    if match is not None:
                        break
            if match is None:
                if "default" not in f:
                    out.append(f"{path}/{name}: reader field {name} has no default and the writer lacks it")
                continue
            _check(rn, f["type"], wn, match["type"], f"{path}/{name}", out, seen, depth + 1)
    elif rk == "enum":
        missing = [s for s in w.get("symbols", []) if s not in set(r.get("symbols", []))]
        if missing and "default" not in r:
            out.append(f"{where}: reader enum lacks writer symbols {missing}")
    elif rk == "fixed":
        if int(r.get("size", -1)) != int(w.get("size", -2)):
            out.append(f"{where}: fixed sizes differ ({r.get('size')} vs {w.get('size')})")
    elif rk == "array":
        _check(rn, r["items"], wn, w["items"], f"{path}[]", out, seen, depth + 1)
    elif rk == "map":
        _check(rn, r["values"], wn, w["values"], f"{path}{{}}", out, seen, depth + 1)
    else:
        out.append(f"{where}: unsupported Avro type {rk}")


# -- PROTOBUF_NATIVE -----------------------------------------------------------------------------

PROTOBUF_FILES_MAX = 256       # files in one descriptor set


def protobuf_native_root(data: bytes) -> str:
    """The full name of the root message of a PROTOBUF_NATIVE definition (Pulsar's
    ProtobufNativeSchemaData: JSON ``{"fileDescriptorSet": base64 FileDescriptorSet,
    "rootMessageTypeName": "pkg.Msg", "rootFileDescriptorName": "x.proto"}``), after building
    the descriptors as Pulsar's deserializer does: every dependency in the set, whatever the
    order of its files, and the root message in the root file (InvalidSchemaError otherwise)."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidSchemaError(f"PROTOBUF_NATIVE definition is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidSchemaError("PROTOBUF_NATIVE definition must be a JSON object")
    encoded, root, root_file = (doc.get("fileDescriptorSet"), doc.get("rootMessageTypeName"),
                                doc.get("rootFileDescriptorName"))
    if not all(isinstance(v, str) and v for v in (encoded, root, root_file)):
        raise InvalidSchemaError("PROTOBUF_NATIVE definition needs fileDescriptorSet, rootMessageTypeName "
                                 "and rootFileDescriptorName as non-empty strings")
    from google.protobuf import descriptor_pb2, descriptor_pool
    try:
        files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(encoded, validate=True)).file
    except Exception as e:          # binascii.Error, protobuf's DecodeError
        raise InvalidSchemaError(f"PROTOBUF_NATIVE fileDescriptorSet does not decode: {e}") from None
    if len(files) > PROTOBUF_FILES_MAX:
        raise InvalidSchemaError(f"PROTOBUF_NATIVE fileDescriptorSet has {len(files)} files, more than "
                                 f"{PROTOBUF_FILES_MAX}")
    pool = descriptor_pool.DescriptorPool()
    pending = list(files)
    added: set[str] = set()
    while pending:                  # dependencies first, in whatever order the set lists them
        ready = [f for f in pending if all(d in added for d in f.dependency)]
        if not ready:
            raise InvalidSchemaError(f"PROTOBUF_NATIVE fileDescriptorSet lacks dependencies of "
                                     f"{sorted(f.name for f in pending)}")
        for f in ready:
            try:
                pool.Add(f)
            except Exception as e:  # TypeError, duplicate symbols, unresolved types
                raise InvalidSchemaError(f"PROTOBUF_NATIVE file {f.name} does not build: {e}") from None
            added.add(f.name)
        pending = [f for f in pending if f.name not in added]
    try:
        message = pool.FindMessageTypeByName(root)
    except KeyError:
        raise InvalidSchemaError(f"PROTOBUF_NATIVE root message {root} is not in the descriptor set") from None
    if message.file.name != root_file:
        raise InvalidSchemaError(f"PROTOBUF_NATIVE root message {root} is in {message.file.name}, "
                                 f"not in {root_file}")
    return message.full_name


# -- the decision -----------------------------------------------------------------------------

def validate(schema: SchemaDef) -> None:
    """InvalidSchemaError when the definition cannot be used at all."""
    if schema.type in STRUCT_TYPES:
        parse_avro(schema.data)
    elif schema.type == "PROTOBUF_NATIVE":
        protobuf_native_root(schema.data)
    elif schema.type == "KEY_VALUE":
        for part in split_key_value(schema):
            validate(part)


def pair_problems(new: SchemaDef, old: SchemaDef, strategy: CompatibilityStrategy) -> list[str]:
    """Why ``new`` may not follow ``old`` under ``strategy`` (empty: it may)."""
    if new.type != old.type:
        return [f"schema type {new.type} differs from the existing {old.type}"]
    if new.type == "KEY_VALUE":
        (nk, nv), (ok, ov) = split_key_value(new), split_key_value(old)
        return ([f"key: {p}" for p in pair_problems(nk, ok, strategy)]
                + [f"value: {p}" for p in pair_problems(nv, ov, strategy)])
    if new.type in STRUCT_TYPES:
        new_avro, old_avro = parse_avro(new.data), parse_avro(old.data)
        problems = []
        if strategy.checks_backward:
            problems += [f"backward: {p}" for p in avro_read_problems(new_avro, old_avro)]
        if strategy.checks_forward:
            problems += [f"forward: {p}" for p in avro_read_problems(old_avro, new_avro)]
        return problems
    if new.type in PRIMITIVE_TYPES:
        return []
    if new.type == "PROTOBUF_NATIVE":   # Pulsar compares the root message's full name only
        new_root, old_root = protobuf_native_root(new.data), protobuf_native_root(old.data)
        if new_root != old_root:
            return [f"the root message changes from {old_root} to {new_root}"]
        return []
    if new.data != old.data:        # other types (PROTOBUF, ...): the definition must not change
        return [f"{new.type} schema definition differs from the existing one"]
    return []


def check_compatible(new: SchemaDef, existing: Sequence[SchemaDef],
                     strategy: CompatibilityStrategy) -> None:
    """Raise IncompatibleSchemaError if ``new`` may not be added after ``existing`` (oldest
    first; only live versions since the last delete). An empty history accepts anything valid."""
    validate(new)
    if strategy is CompatibilityStrategy.UNDEFINED:
        strategy = DEFAULT_STRATEGY
    if not existing or strategy is CompatibilityStrategy.ALWAYS_COMPATIBLE:
        return
    if strategy is CompatibilityStrategy.ALWAYS_INCOMPATIBLE:
        raise IncompatibleSchemaError("the topic's schema compatibility strategy is ALWAYS_INCOMPATIBLE")
    against: Iterable[tuple[int, SchemaDef]] = (
        enumerate(existing) if strategy.transitive else [(len(existing) - 1, existing[-1])])
    for index, old in against:
        problems = pair_problems(new, old, strategy)
        if problems:
            shown = "; ".join(problems[:5]) + (f"; ... {len(problems) - 5} more" if len(problems) > 5 else "")
            raise IncompatibleSchemaError(
                f"schema is incompatible with version {index} under {strategy.value}: {shown}")


__all__ = ["CompatibilityStrategy", "DEFAULT_STRATEGY", "IncompatibleSchemaError", "InvalidSchemaError",
           "SchemaDef", "TYPE_CODES", "TYPE_NAMES", "avro_read_problems", "check_compatible", "pair_problems",
           "parse_avro", "protobuf_native_root", "split_key_value", "type_code", "type_name", "validate"]

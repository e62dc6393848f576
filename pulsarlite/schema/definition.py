"""Record classes with field descriptors, shaped like the official ``pulsar.schema`` ones so
code ports by changing the import, and producing the same Avro definition (same fields, same
order, same ``null`` unions and defaults), so that both clients register the same schema
version for the same class::

    class User(Record):
        name = String(required=True)
        age = Integer()
        tags = Array(String())

A field is optional unless ``required=True`` (its Avro type is then ``["null", T]``);
``required_default=True`` writes its ``default`` into the definition (what Avro needs for a
field a newer reader adds). ``_sorted_fields = True`` orders the fields by name,
``_avro_namespace`` sets the record's namespace.

Plain dataclasses work too (:func:`dataclass_avro_schema`): ``str`` -> string, ``int`` ->
long, ``float`` -> double, ``bool`` -> boolean, ``bytes`` -> bytes, ``list[T]`` -> array,
``dict[str, T]`` -> map, a nested dataclass -> record, ``Optional[T]`` -> ``["null", T]``;
a field's default goes into the definition.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import types
import typing
from collections import OrderedDict
from typing import Any

__all__ = ["Record", "Field", "Null", "Boolean", "Integer", "Long", "Float", "Double", "Bytes",
           "String", "Array", "Map", "CustomEnum", "dataclass_avro_schema", "to_avro_datum",
           "from_avro_datum"]

_RESERVED = ("_default", "_required", "_required_default")


def _name_of(x) -> str:
    return getattr(x, "__name__", str(x))


class Field:
    """Base of the field descriptors. ``default`` is checked against the field's type."""

    avro_type = ""
    python_types: tuple = ()
    implicit_default: Any = None

    def __init__(self, default=None, required: bool = False, required_default: bool = False):
        if default is not None:
            default = self.validate_type("default", default)
        self._default = default
        self._required = required
        self._required_default = required_default

    def type(self) -> str:
        return self.avro_type

    def python_type(self):
        return self.python_types

    def default(self):
        return self.implicit_default if self._default is None else self._default

    def required_default(self) -> bool:
        return self._required_default

    def validate_type(self, name: str, val):
        if val is None and not self._required:
            return self.default()
        if not isinstance(val, self.python_types):
            raise TypeError(f"Invalid type '{type(val)}' for field '{name}'. Expected: "
                            f"{', '.join(_name_of(t) for t in self.python_types)}")
        return val

    def schema(self):
        return self.schema_info(set())

    def schema_info(self, defined_names: set):
        return self.type()


class Null(Field):
    avro_type = "null"
    python_types = (type(None),)

    def validate_type(self, name, val):
        if val is not None:
            raise TypeError(f"Field {name} is set to be None")
        return val


class Boolean(Field):
    avro_type = "boolean"
    python_types = (bool,)
    implicit_default = False


class Integer(Field):
    avro_type = "int"
    python_types = (int,)


class Long(Field):
    avro_type = "long"
    python_types = (int,)


class Float(Field):
    avro_type = "float"
    python_types = (float, int)


class Double(Field):
    avro_type = "double"
    python_types = (float, int)


class Bytes(Field):
    avro_type = "bytes"
    python_types = (bytes, str)

    def validate_type(self, name, val):
        return val.encode() if isinstance(val, str) else val


class String(Field):
    avro_type = "string"
    python_types = (str, bytes)

    def validate_type(self, name, val):
        if val is None and not self._required:
            return self.default()
        if not isinstance(val, (str, bytes)):
            raise TypeError(f"Invalid type '{type(val)}' for field '{name}'. Expected a string")
        return val.decode() if isinstance(val, bytes) else val


class CustomEnum(Field):
    """An ``enum.Enum`` field (an Enum class as a Record attribute becomes one)."""

    avro_type = "enum"

    def __init__(self, enum_type, default=None, required=False, required_default=False):
        if not (isinstance(enum_type, type) and issubclass(enum_type, enum.Enum)):
            raise TypeError(f"{_name_of(enum_type)} is not a valid Enum type")
        self.enum_type = enum_type
        self.values = {m.value: m for m in enum_type.__members__.values()}
        self.python_types = (enum_type,)
        super().__init__(default, required, required_default)

    def validate_type(self, name, val):
        if val is None:
            return None
        if type(val) is str:
            if val in self.enum_type.__members__:
                return self.enum_type.__members__[val]
            raise TypeError(f"Invalid enum value '{val}' for field '{name}'. Expected: "
                            f"{list(self.enum_type.__members__)}")
        if type(val) is int:
            if val in self.values:
                return self.values[val]
            raise TypeError(f"Invalid enum value '{val}' for field '{name}'. Expected: "
                            f"{list(self.values)}")
        if not isinstance(val, self.enum_type):
            raise TypeError(f"Invalid type '{type(val)}' for field '{name}'. Expected: "
                            f"{_name_of(self.enum_type)}")
        return val

    def schema_info(self, defined_names: set):
        name = self.enum_type.__name__
        if name in defined_names:
            return name
        defined_names.add(name)
        return {"type": "enum", "name": name, "symbols": [m.name for m in self.enum_type]}


def _check_item_type(x) -> None:
    if not isinstance(x, (Field, Record)):
        raise TypeError(f"Argument {_name_of(x)} is not a Record or a Field")


def _item_schema(item, defined_names: set):
    return item.schema_info(defined_names) if isinstance(item, (Array, Map, Record)) \
        else item.type()


class Array(Field):
    avro_type = "array"
    python_types = (list,)

    def __init__(self, array_type, default=None, required=False, required_default=False):
        _check_item_type(array_type)
        self.array_type = array_type
        super().__init__(default=default, required=required, required_default=required_default)

    def validate_type(self, name, val):
        if val is None:
            return None
        super().validate_type(name, val)
        for x in val:
            if not isinstance(x, self.array_type.python_type()):
                raise TypeError(f"Array field {name} items should all be of type "
                                f"{self.array_type.type()}")
        return val

    def schema_info(self, defined_names: set):
        return {"type": "array", "items": _item_schema(self.array_type, defined_names)}


class Map(Field):
    avro_type = "map"
    python_types = (dict,)

    def __init__(self, value_type, default=None, required=False, required_default=False):
        _check_item_type(value_type)
        self.value_type = value_type
        super().__init__(default=default, required=required, required_default=required_default)

    def validate_type(self, name, val):
        if val is None:
            return None
        super().validate_type(name, val)
        for key, v in val.items():
            if not isinstance(key, str):
                raise TypeError(f"Map keys for field {name} should all be strings")
            if not isinstance(v, self.value_type.python_type()):
                raise TypeError(f"Map values for field {name} should all be of type "
                                f"{_name_of(self.value_type.python_type())}")
        return val

    def schema_info(self, defined_names: set):
        return {"type": "map", "values": _item_schema(self.value_type, defined_names)}


class RecordMeta(type):
    def __new__(mcs, name, bases, dct):
        if name != "Record" or bases:
            fields = OrderedDict()
            for key, value in dct.items():
                if isinstance(value, enum.EnumMeta):
                    value = CustomEnum(value)
                elif isinstance(value, RecordMeta):
                    value = value()            # a nested record class: an instance describes it
                if isinstance(value, (Field, Record)):
                    fields[key] = value
            dct["_fields"] = fields
            dct["_required"] = False
        return super().__new__(mcs, name, bases, dct)


class Record(metaclass=RecordMeta):
    """Base of typed records; subclasses declare fields as class attributes."""

    _avro_namespace: str | None = None
    _sorted_fields = False
    _fields: "OrderedDict[str, Any]" = OrderedDict()

    def __init__(self, default=None, required_default=False, required=False, *args, **kwargs):
        self._required_default = required_default
        self._default = default
        self._required = required
        for key, spec in self._fields.items():
            if key in kwargs:
                value = kwargs[key]
                if isinstance(spec, Record) and isinstance(value, dict):
                    value = _record_from_dict(spec, value)
                elif (isinstance(spec, Array) and isinstance(value, list) and value
                      and isinstance(spec.array_type, Record) and isinstance(value[0], dict)):
                    value = [_record_from_dict(spec.array_type, v) for v in value]
                elif (isinstance(spec, Map) and isinstance(value, dict) and value
                      and isinstance(spec.value_type, Record)
                      and isinstance(next(iter(value.values())), dict)):
                    value = {k: _record_from_dict(spec.value_type, v) for k, v in value.items()}
                setattr(self, key, value)
            elif isinstance(spec, Record):
                setattr(self, key, spec)
            else:
                object.__setattr__(self, key, spec.default())

    @classmethod
    def schema(cls) -> dict:
        """The Avro definition (a dict), as the official client builds it."""
        return cls.schema_info(set())

    @classmethod
    def schema_info(cls, defined_names: set):
        full_name = (cls._avro_namespace + "." if cls._avro_namespace is not None else "") \
            + cls.__name__
        if full_name in defined_names:
            return full_name
        defined_names.add(full_name)
        schema: dict = {"type": "record", "name": str(cls.__name__)}
        if cls._avro_namespace is not None:
            schema["namespace"] = cls._avro_namespace
        schema["fields"] = []
        names = sorted(cls._fields) if cls._sorted_fields else list(cls._fields)
        for name in names:
            spec = cls._fields[name]
            inner = spec.schema_info(defined_names)
            field_type = inner if spec._required else ["null", inner]
            if spec.required_default():
                default = spec.default()
                if isinstance(default, enum.Enum):
                    default = default.name
                schema["fields"].append({"name": name, "default": default, "type": field_type})
            else:
                schema["fields"].append({"name": name, "type": field_type})
        return schema

    def __setattr__(self, key, value):
        if key in _RESERVED:
            object.__setattr__(self, key, value)
            return
        if key not in self._fields:
            raise AttributeError(f"Cannot set undeclared field {key} on record")
        object.__setattr__(self, key, self._fields[key].validate_type(key, value))

    def __eq__(self, other):
        if not isinstance(other, Record):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f, None) for f in self._fields)

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None  # type: ignore[assignment]

    def __str__(self):
        return str(self.__dict__)

    def __repr__(self):
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"

    def type(self) -> str:
        return type(self).__name__

    def python_type(self):
        return type(self)

    def validate_type(self, name, val):
        if val is None and not self._required:
            return self.default()
        if not isinstance(val, type(self)):
            raise TypeError(f"Invalid type '{type(val)}' for sub-record field '{name}'. "
                            f"Expected: {type(self).__name__}")
        return val

    def default(self):
        return self._default

    def required_default(self) -> bool:
        return self._required_default


def _record_from_dict(spec: Record, values: dict) -> Record:
    copied = copy.copy(spec)
    copied.__init__(**values)
    return copied


def record_fields(obj: Record) -> dict:
    """The record's field values (no reserved attributes), in declaration order."""
    return {k: v for k, v in obj.__dict__.items() if k not in _RESERVED}


# -- conversions to and from what fastavro reads and writes ----------------------------------

def to_avro_datum(x):
    """A Record, dataclass, Enum, list or dict as plain Avro data (enums by name)."""
    if isinstance(x, enum.Enum):
        return x.name
    if isinstance(x, Record):
        return {k: to_avro_datum(v) for k, v in record_fields(x).items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: to_avro_datum(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, list):
        return [to_avro_datum(i) for i in x]
    if isinstance(x, dict):
        return {k: to_avro_datum(v) for k, v in x.items()}
    return x


def from_avro_datum(cls, data):
    """Avro data (dicts) back into ``cls``: a Record class, a dataclass, or None (dicts)."""
    if cls is None:
        return data
    if isinstance(cls, type) and issubclass(cls, Record):
        return cls(**data)
    if dataclasses.is_dataclass(cls):
        return _dataclass_from(cls, data)
    return data


# -- dataclasses -----------------------------------------------------------------------------

_PY_AVRO = {str: "string", int: "long", float: "double", bool: "boolean", bytes: "bytes"}


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _optional_inner(tp):
    """T for Optional[T] / T | None, else None."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
        raise TypeError(f"unions other than Optional[T] are not supported: {tp}")
    return None


def _dc_type(tp, defined: set):
    inner = _optional_inner(tp)
    if inner is not None:
        return ["null", _dc_type(inner, defined)]
    if tp in _PY_AVRO:
        return _PY_AVRO[tp]
    origin = typing.get_origin(tp)
    if origin in (list, typing.List):
        (item,) = typing.get_args(tp) or (None,)
        if item is None:
            raise TypeError("list fields need an item type: list[T]")
        return {"type": "array", "items": _dc_type(item, defined)}
    if origin in (dict, typing.Dict):
        args = typing.get_args(tp)
        if len(args) != 2 or args[0] is not str:
            raise TypeError("dict fields need str keys: dict[str, T]")
        return {"type": "map", "values": _dc_type(args[1], defined)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if tp.__name__ in defined:
            return tp.__name__
        defined.add(tp.__name__)
        return {"type": "enum", "name": tp.__name__, "symbols": [m.name for m in tp]}
    if dataclasses.is_dataclass(tp):
        return _dc_record(tp, defined)
    raise TypeError(f"no Avro type for the Python type {tp!r}")


def _dc_record(cls, defined: set):
    if cls.__name__ in defined:
        return cls.__name__
    defined.add(cls.__name__)
    hints = _hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        entry: dict = {"name": f.name, "type": _dc_type(hints[f.name], defined)}
        if f.default is not dataclasses.MISSING:
            default = f.default
            entry["default"] = default.name if isinstance(default, enum.Enum) else default
        fields.append(entry)
    return {"type": "record", "name": cls.__name__, "fields": fields}


def dataclass_avro_schema(cls) -> dict:
    """The Avro definition of a dataclass (see the module docstring for the type mapping)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a dataclass")
    return _dc_record(cls, set())


def _dc_value(tp, value):
    if value is None:
        return None
    inner = _optional_inner(tp)
    if inner is not None:
        return _dc_value(inner, value)
    origin = typing.get_origin(tp)
    if origin in (list, typing.List):
        (item,) = typing.get_args(tp)
        return [_dc_value(item, v) for v in value]
    if origin in (dict, typing.Dict):
        item = typing.get_args(tp)[1]
        return {k: _dc_value(item, v) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp[value] if isinstance(value, str) else tp(value)
    if dataclasses.is_dataclass(tp):
        return _dataclass_from(tp, value)
    if tp is bytes and isinstance(value, str):      # JSON carries bytes as text
        return value.encode()
    return value


def _dataclass_from(cls, data: dict):
    hints = _hints(cls)
    kwargs = {f.name: _dc_value(hints[f.name], data[f.name])
              for f in dataclasses.fields(cls) if f.init and f.name in data}
    return cls(**kwargs)

"""One error hierarchy per component (issue 25; docs/decisions.md "One error hierarchy per
component"): every exception class a module of the base floor (pulsarlite/), the offload
component, the Spark source, the bookie or the faces defines is an operating error under its
component's base, except the few listed here with the reason. The broker's is
tests/unit/test_broker_errors.py.

Each walk imports every module of its package, so a class added outside the hierarchy fails the
test; the tables below pin what callers rely on (the public names users catch, ``retriable``,
the built-in bases that ``except ValueError`` / ``except RuntimeError`` callers catch)."""

from __future__ import annotations

import importlib
import inspect
import pathlib

import pytest

import pulsarlite.client as client_api
from bookie.autorecovery.replication_core import RepairConflict
from bookie.cookie import CookieError
from bookie.transport import FrameError as BookieFrameError
from offload.errors import TierError
from offload.format import TierChecksumError, TierFormatError
from offload.lake import LakeError
from offload.shell import CorruptObjectError, OffloadError
from offload.store import ObjectNotFoundError, ObjectStoreError
from pulsarlite.client.core import AuthenticationRefused, ProtocolError
from pulsarlite.client.errors import ClientError
from pulsarlite.errors import (BookieError, ChecksumError, InvariantViolation, MetadataError, MetadataVersionConflict,
                               PulsarliteError)
from spark_source.errors import (CompactedViewGone, DataLossError, OptionError, SchemaMismatchError, SparkSourceError,
                                 TopicNotFound)

ROOT = pathlib.Path(__file__).resolve().parents[2]

# component -> (its bases, classes outside on purpose: name -> why)
COMPONENTS = {
    "pulsarlite": ((PulsarliteError, InvariantViolation), {}),
    "offload": ((TierError,), {
        # a ValueError of a pure schema translation: offload.tier degrades to an object without
        # typed columns on it; as a PulsarliteError, tier.py's `except PulsarliteError: raise`
        # would fail the offload instead
        "TypedColumnsError": "ValueError caught apart by offload.tier",
    }),
    "spark_source": ((SparkSourceError,), {}),
    # the bookie's errors are the base floor's BookieError family (shared with the ledger client);
    # RepairConflict is a metadata CAS lost (the worker re-plans, as for any version conflict)
    "bookie": ((BookieError, MetadataError), {}),
    # the faces (CLI, launcher, standalone, lake view) raise base-floor errors of their own;
    # standalone's _StopRequested (a BaseException, control flow) is private
    "faces": ((PulsarliteError,), {}),
}


def exception_classes(package: str) -> list[type]:
    """Every exception class (warnings aside) defined by a module of ``package`` (generated
    protobuf modules aside)."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "_proto" in parts or parts[-1] == "__main__":
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if (inspect.isclass(cls) and issubclass(cls, BaseException) and not issubclass(cls, Warning)
                    and cls.__module__ == name):
                found.append(cls)
    return found


@pytest.mark.parametrize("package", sorted(COMPONENTS))
def test_every_error_of_a_component_is_under_its_base(package):
    bases, outside = COMPONENTS[package]
    classes = exception_classes(package)
    assert len(classes) >= 3                     # the walk found the modules
    stray = sorted(f"{c.__module__}.{c.__qualname__}" for c in classes
                   if not issubclass(c, bases) and c.__name__ not in outside and not c.__name__.startswith("_"))
    assert stray == []
    for cls in classes:
        if cls.__name__ in outside:
            assert not issubclass(cls, PulsarliteError), f"{cls.__name__} is in the hierarchy now: drop it from the list"


def test_every_client_error_is_a_client_error():
    """The client's errors (pulsarlite/client/) are ClientErrors, so ``except ClientError``
    catches whatever the client raises on purpose (InvalidTopicNameError aside: the base floor's,
    a ValueError, re-exported by the client as pulsar-client does)."""
    classes = [c for c in exception_classes("pulsarlite") if c.__module__.startswith("pulsarlite.client")]
    assert ProtocolError in classes and AuthenticationRefused in classes
    assert [c.__qualname__ for c in classes if not issubclass(c, ClientError)] == []


# the names users catch, as with pulsar-client (`except pulsarlite.client.Timeout`): public API
CLIENT_PUBLIC = {"ClientError": False, "InvalidConfiguration": False, "AlreadyClosed": False, "Timeout": True,
                 "MessageTooBig": False, "ProducerQueueIsFull": True, "ConnectError": True, "NotConnected": True,
                 "AuthenticationError": False, "LookupError_": True, "TopicNotFound": None, "ConsumerBusy": None,
                 "ProducerBusy": None, "IncompatibleSchema": None, "BrokerError": None}


@pytest.mark.parametrize("name, retriable", sorted(CLIENT_PUBLIC.items()))
def test_the_client_keeps_its_public_error_names(name, retriable):
    cls = getattr(client_api, name)
    assert issubclass(cls, ClientError) and issubclass(cls, PulsarliteError)
    if retriable is not None:                    # BrokerError's follows the broker's ServerError
        assert cls.retriable is retriable


# (error, retriable, built-in bases callers catch): as before the hierarchy was folded
TOLD = [
    (OffloadError("x"), True, ()),
    (CorruptObjectError("x"), True, ()),
    (ObjectStoreError("x"), True, ()),
    (ObjectStoreError("x", retriable=False), False, ()),
    (ObjectNotFoundError("x"), False, ()),
    (TierFormatError("x"), False, ()),
    (TierChecksumError("x"), False, (ChecksumError,)),      # readers treat every CRC mismatch alike
    (LakeError("x"), True, ()),
    (OptionError("x"), False, (ValueError,)),
    (SchemaMismatchError("x"), False, (ValueError,)),
    (TopicNotFound("x"), False, (ValueError,)),
    (DataLossError("x"), False, (ValueError, RuntimeError)),  # the planner's (ValueError) and the reader's DataLoss
    (CompactedViewGone("x"), False, (ValueError, RuntimeError)),
    (CookieError("x"), False, ()),
    (BookieFrameError(1, "x"), False, ()),
    (RepairConflict("x"), True, (MetadataVersionConflict,)),  # the worker re-plans on any CAS lost
    (ProtocolError("x"), False, ()),
    (AuthenticationRefused("x"), False, (ProtocolError,)),
]


@pytest.mark.parametrize("error, retriable, caught_as", TOLD, ids=lambda v: type(v).__name__)
def test_what_callers_catch_is_unchanged(error, retriable, caught_as):
    assert isinstance(error, PulsarliteError)
    assert error.retriable is retriable
    for base in caught_as:
        assert isinstance(error, base)


def test_schema_mismatch_keeps_its_error_class():
    """Spark shows the ``[PULSARLITE_SCHEMA_MISMATCH]`` prefix (docs/spark.md)."""
    assert str(SchemaMismatchError("no column x")) == "[PULSARLITE_SCHEMA_MISMATCH] no column x"


@pytest.mark.parametrize("module", ["offload/errors.py", "spark_source/errors.py"])
def test_component_errors_are_leaves(module):
    """A component's errors module imports only the base floor, so every module of the component
    can take its errors from it."""
    source = (ROOT / module).read_text()
    imports = [line for line in source.splitlines() if line.startswith(("from ", "import "))]
    assert imports and all(line.startswith(("from __future__", "from pulsarlite.errors")) for line in imports)


def test_the_readers_data_loss_is_the_planners():
    """The reader's data loss (an offloaded ledger without a URI, here) raises the folded
    DataLossError (before: scan.DataLoss, a RuntimeError apart from the planner's ValueError)."""
    from spark_source.plan import Location, Position, SegmentScan
    from spark_source.scan import ReadSettings, _read_tier

    scan = SegmentScan(topic="persistent://t/ns/x", partition=-1, ledger_id=7, first_entry_id=0, last_entry_id=9,
                       location=Location.TIER, uri=None, start=Position(7, 0), end=None, publish_time_min_ms=None,
                       publish_time_max_ms=None, size_bytes_estimate=0)
    settings = ReadSettings(zookeeper="127.0.0.1:1", s3_endpoint_url=None, metrics_dir=None)
    with pytest.raises(DataLossError, match="ledger 7 is offloaded without a URI") as caught:
        next(_read_tier(scan, settings))
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, SparkSourceError)

"""[compat] issue 32 item 3, the pure parts: the size limits of brokers and bookies agree (the
defaults, the check the launcher runs), and a bookie's TOO_LARGE is a refusal by design, not a
failed bookie (the write core: no ensemble change, the add fails, not retriable)."""

from __future__ import annotations

import random

import pytest

from bookie.client.actions import AddOutcome, FailAdds, WriteMetadata
from bookie.client.metadata import LedgerMetadata
from bookie.client.write_core import LedgerWriteCore
from broker.config import BrokerConfig
from faces.cluster import ZOOKEEPER, LocalCluster, ProcessRecord
from pulsarlite.config import BookieConfig
from pulsarlite.errors import BadRequestError, ConfigError

WRITABLE = ("b0", "b1", "b2", "b3")


def write_core() -> LedgerWriteCore:
    md = LedgerMetadata(ledger_id=7, ensemble_size=3, write_quorum=3, ack_quorum=2,
                        ensembles=((0, ("b0", "b1", "b2")),))
    return LedgerWriteCore(md, add_timeout_ms=1000, ensemble_change_attempts_max=3)


def test_default_bookie_stores_every_entry_the_default_broker_takes():
    broker = BrokerConfig()
    assert BookieConfig().entry_bytes_max >= broker.bookie_entry_bytes_min == broker.frame_bytes_max
    broker.check_bookie_entry_bytes(BookieConfig().entry_bytes_max, "bookie-1")


def test_a_bookie_below_the_broker_maximum_is_refused_naming_both_keys():
    broker = BrokerConfig(message_bytes_max=8 * 1024 * 1024)
    with pytest.raises(ConfigError, match=r"BookieConfig.entry_bytes_max of bookie-2 .*BrokerConfig.message_bytes_max"):
        broker.check_bookie_entry_bytes(BookieConfig().entry_bytes_max, "bookie-2")


def test_launcher_refuses_a_broker_whose_messages_the_bookies_cannot_store(tmp_path):
    """Configs only (nothing is started): the launcher checks a broker against the bookies
    defined, and a bookie against the brokers defined."""
    cluster = LocalCluster(tmp_path / "c")
    cluster.records[ZOOKEEPER] = ProcessRecord(name=ZOOKEEPER, role=ZOOKEEPER, argv=[], ports={"client": 2181},
                                               config="", log="")
    cluster._define_bookie("bookie-1", {})
    with pytest.raises(ConfigError, match="entry_bytes_max"):
        cluster._define_broker("broker-1", {"message_bytes_max": 6 * 1024 * 1024})
    assert "broker-1" not in cluster.records
    cluster._define_broker("broker-1", {"message_bytes_max": 1024 * 1024})
    with pytest.raises(ConfigError, match="entry_bytes_max"):     # a bookie added later: the same check
        cluster._define_bookie("bookie-2", {"entry_bytes_max": 512 * 1024})


def test_too_large_fails_the_add_without_an_ensemble_change():
    core = write_core()
    first, _ = core.add([b"a", b"b" * 100, b"c"], 0)
    assert first == 0
    assert core.on_add_acks("b0", [0]) == [] and core.on_add_acks("b1", [0])   # entry 0 confirmed
    actions = core.on_add_result("b1", 1, AddOutcome.TOO_LARGE, 0, WRITABLE, random.Random(0))
    assert not any(isinstance(a, WriteMetadata) for a in actions)        # no bookie replaced
    [fail] = actions
    assert isinstance(fail, FailAdds) and fail.first_entry_id == 1
    assert isinstance(fail.error, BadRequestError) and not fail.error.retriable
    assert "entry 1 of 100 bytes" in str(fail.error) and "b1" in str(fail.error)
    assert core.metadata.current_ensemble == ("b0", "b1", "b2")
    assert not core.metadata.under_replicated_bookies
    # the other bookies' answers change nothing; the ledger takes no more adds (sticky)
    assert core.on_add_result("b0", 1, AddOutcome.TOO_LARGE, 0, WRITABLE, random.Random(0)) == []
    assert core.on_tick(10_000, WRITABLE, random.Random(0)) == []
    with pytest.raises(BadRequestError):
        core.add([b"d"], 0)


def test_error_still_replaces_the_bookie():
    """The contrast: an ERROR answer is a failed bookie (ensemble change)."""
    core = write_core()
    core.add([b"a"], 0)
    actions = core.on_add_result("b1", 0, AddOutcome.ERROR, 0, WRITABLE, random.Random(0))
    assert [type(a) for a in actions] == [WriteMetadata]

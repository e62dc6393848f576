"""BrokerConfig.message_uncompressed_bytes_max: what a compressed SEND may declare (docs/decisions.md
"[compat] A compressed message above the maximum whose compressed size fits")."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from pulsarlite.errors import ConfigError


def test_the_default_bound_is_above_the_frame():
    config = BrokerConfig().validate()
    assert config.message_uncompressed_bytes_max > config.frame_bytes_max


@pytest.mark.parametrize("value", [0, -1, 1024, 2**31, True, "64"])
def test_a_bound_below_the_frame_or_beyond_int32_or_not_an_int_is_refused(value):
    with pytest.raises(ConfigError, match="message_uncompressed_bytes_max"):
        BrokerConfig(message_uncompressed_bytes_max=value).validate()


def test_a_bound_equal_to_the_frame_is_taken():
    frame = BrokerConfig().frame_bytes_max
    assert BrokerConfig(message_uncompressed_bytes_max=frame).validate().message_uncompressed_bytes_max == frame



def test_pending_adds_max_has_one_default():
    """One default (pulsarlite.config.PENDING_ADDS_MAX_DEFAULT) for the ledger client, the managed
    ledger and the broker (before: 10_000 spelled in two places, 50_000 in the ledger client)."""
    from broker.managed_ledger.config import ManagedLedgerConfig
    from pulsarlite.config import PENDING_ADDS_MAX_DEFAULT, LedgerClientConfig
    defaults = BrokerConfig()
    assert (defaults.managed_ledger.pending_adds_max == ManagedLedgerConfig().pending_adds_max == LedgerClientConfig().pending_adds_max
            == defaults.managed_ledger_config().pending_adds_max == defaults.ledger_client_config().pending_adds_max
            == PENDING_ADDS_MAX_DEFAULT)


def test_the_pending_adds_max_toml_key_reaches_every_layer(tmp_path):
    """The broker's TOML key ``pending_adds_max`` sets its managed ledgers' limit and its ledger
    client's (before, the broker never set the ledger client's: it stayed 50_000)."""
    from pulsarlite.config import load_toml
    path = tmp_path / "broker.toml"
    path.write_text("pending_adds_max = 123\n")
    config = load_toml(BrokerConfig, path)
    assert config.managed_ledger.pending_adds_max == 123
    assert config.managed_ledger_config().pending_adds_max == 123
    assert config.ledger_client_config().pending_adds_max == 123
    path.write_text("pending_adds_max = 0\n")
    with pytest.raises(ConfigError, match="pending_adds_max"):
        load_toml(BrokerConfig, path)

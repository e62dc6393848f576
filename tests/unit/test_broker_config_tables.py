"""BrokerConfig's sub-tables ([managed_ledger], [ledger_client], [offload], [dispatch]): TOML
round trips, the old flat keys mapped with one warning line naming the new keys, and errors that
name the key (docs/decisions.md "Nested broker config")."""

from __future__ import annotations

import dataclasses
import logging
import pathlib

import pytest

from broker.config import BrokerConfig, DispatchConfig, OffloadConfig
from broker.managed_ledger.config import ManagedLedgerConfig
from pulsarlite.config import LedgerClientConfig, apply_settings, from_mapping, load_toml, to_toml
from pulsarlite.errors import ConfigError

DEPLOY = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "conf"


def custom() -> BrokerConfig:
    """A config with a setting off its default in every table and at the top."""
    return BrokerConfig(
        port=7650, zookeeper="zk:2181", zk_session_timeout_ms=7_000, zookeeper_auth_digest="u:p",
        managed_ledger=ManagedLedgerConfig(ensemble_size=2, write_quorum=2, ack_quorum=1, pending_adds_max=321,
                                           rollover_entries_max=77, read_entries_max=55),
        ledger_client=LedgerClientConfig(add_flush_interval_ms=0.5, add_flush_on_idle_adds_max=7,
                                         add_timeout_ms=12_345, bookie_auth_token_file="/t",
                                         bookie_tls_enabled=True),
        offload=OffloadConfig(tier_uri="file:///tier", concurrent_max=5, typed_columns=False, lake_enabled=True,
                              lake_partition="day", deletion_lag_ms=0),
        dispatch=DispatchConfig(entry_cache_bytes_max=1 << 20, read_ahead_entries_max=9,
                                connection_write_high_water_bytes=1 << 19)).validate()


def test_defaults_are_the_flat_config_defaults():
    """The sub-tables keep the defaults the flat fields had (behaviour unchanged)."""
    c = BrokerConfig().validate()
    assert (c.managed_ledger.ensemble_size, c.managed_ledger.write_quorum, c.managed_ledger.ack_quorum) == (3, 3, 2)
    assert c.ledger_client.add_flush_interval_ms == 3.0 and c.ledger_client.add_flush_on_idle_adds_max == 2
    assert c.offload == OffloadConfig() and c.offload.concurrent_max == 2 and c.offload.lake_partition == "day"
    assert c.dispatch.entry_cache_bytes_max == 64 << 20 and c.dispatch.read_ahead_entries_max == 100


def test_toml_round_trip(tmp_path):
    config = custom()
    path = tmp_path / "broker.toml"
    path.write_text(to_toml(config))
    assert load_toml(BrokerConfig, path) == config
    assert load_toml(BrokerConfig, path).ledger_client.bookie_tls_enabled
    text = path.read_text()
    for table in ("[managed_ledger]", "[ledger_client]", "[offload]", "[dispatch]"):
        assert text.count(table) == 1
    # the derived keys are not written (the loader refuses them in the tables)
    ledger_client = text.split("[ledger_client]")[1].split("[offload]")[0]
    assert "zookeeper" not in ledger_client and "pending_adds_max" not in ledger_client
    assert "rollover_publish_period_ms" not in text


def test_the_ledger_client_takes_the_brokers_zookeeper_and_pending_adds_max():
    config = custom()
    lc = config.ledger_client_config()
    assert (lc.zookeeper, lc.zk_session_timeout_ms, lc.zookeeper_auth_digest) == ("zk:2181", 7_000, "u:p")
    assert lc.pending_adds_max == config.managed_ledger.pending_adds_max == 321
    assert lc.add_timeout_ms == 12_345 and lc.bookie_auth_token_file == "/t"
    moved = dataclasses.replace(config, zookeeper="other:2181")
    assert moved.ledger_client.zookeeper == "other:2181"
    # lake day partitions roll the managed ledgers at UTC midnight
    assert config.managed_ledger_config().rollover_publish_period_ms == 86_400_000


OLD_FLAT = {
    "ensemble_size": 2, "write_quorum": 2, "ack_quorum": 1, "pending_adds_max": 321, "rollover_entries_max": 77,
    "bookie_add_flush_interval_ms": 0.5, "bookie_add_flush_on_idle_adds_max": 7,
    "bookie_auth_token_file": "/t", "bookie_tls_enabled": True,
    "tier_uri": "file:///tier", "offload_concurrent_max": 5, "offload_typed_columns": False, "lake_enabled": True,
    "offload_deletion_lag_ms": 0,
    "entry_cache_bytes_max": 1 << 20, "read_ahead_entries_max": 9, "connection_write_high_water_bytes": 1 << 19,
}


def test_old_flat_keys_are_read_with_one_warning_line_naming_the_new_keys(tmp_path, caplog):
    """A TOML file of the flat era loads to the same config as its tables, and says (once) where
    each old key now lives."""
    path = tmp_path / "old.toml"
    lines = ['port = 7650', 'zookeeper = "zk:2181"', 'zk_session_timeout_ms = 7000', 'zookeeper_auth_digest = "u:p"']
    for key, value in OLD_FLAT.items():
        rendered = ("true" if value else "false") if isinstance(value, bool) else \
            (f'"{value}"' if isinstance(value, str) else repr(value))
        lines.append(f"{key} = {rendered}")
    lines += ["[managed_ledger]", "read_entries_max = 55", "[ledger_client]", "add_timeout_ms = 12345"]
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="pulsarlite.config"):
        config = load_toml(BrokerConfig, path)
    assert config == custom()
    moved = [r for r in caplog.records if "config keys moved" in r.getMessage()]
    assert len(moved) == 1
    message = moved[0].getMessage()
    assert str(path) in message
    for old, new in (("offload_concurrent_max", "[offload] concurrent_max"),
                     ("bookie_add_flush_interval_ms", "[ledger_client] add_flush_interval_ms"),
                     ("pending_adds_max", "[managed_ledger] pending_adds_max"),
                     ("entry_cache_bytes_max", "[dispatch] entry_cache_bytes_max")):
        assert f"{old} -> {new}" in message


def test_every_old_key_has_a_place_that_exists():
    hints = {f.name: f for f in dataclasses.fields(BrokerConfig)}
    for old, new in BrokerConfig.TOML_MOVED.items():
        table, key = new.split(".")
        assert old not in hints, old
        sub = type(getattr(BrokerConfig(), table))
        assert key in {f.name for f in dataclasses.fields(sub)}, new


def test_the_deploy_configs_use_the_tables(caplog):
    with caplog.at_level(logging.WARNING, logger="pulsarlite.config"):
        for path in sorted(DEPLOY.glob("**/broker-*.toml")):
            config = load_toml(BrokerConfig, path)
            assert config.offload.tier_uri == "s3://pulsarlite/offload", path
            assert config.ledger_client.bookie_auth_token_file == "/var/lib/pulsarlite-auth/broker.token", path
    assert not [r for r in caplog.records if "config keys moved" in r.getMessage()]


@pytest.mark.parametrize("values, words", [
    ({"tier_uri": "file:///a", "offload": {"tier_uri": "file:///b"}}, ["tier_uri", "[offload] tier_uri"]),
    ({"no_such_key": 1}, ["unknown setting 'no_such_key'"]),
    ({"offload": {"no_such_key": 1}}, ["unknown setting 'no_such_key' in [offload]"]),
    ({"offload": 3}, ["offload must be a table"]),
    ({"offload": {"concurrent_max": "2"}}, ["[offload] concurrent_max must be int"]),
    ({"offload_concurrent_max": "2"}, ["[offload] concurrent_max must be int"]),
    ({"offload": {"concurrent_max": 0}}, ["[offload]", "concurrent_max must be an int > 0"]),
    ({"dispatch": {"read_ahead_entries_max": -1}}, ["[dispatch]", "read_ahead_entries_max"]),
    ({"managed_ledger": {"ack_quorum": 4}}, ["[managed_ledger]", "ack_quorum"]),
    ({"ledger_client": {"add_flush_interval_ms": 2000.0}}, ["[ledger_client]", "add_flush_interval_ms"]),
    ({"ledger_client": {"zookeeper": "x:1"}}, ["[ledger_client] zookeeper is not set here", "zookeeper"]),
    ({"ledger_client": {"pending_adds_max": 5}}, ["[ledger_client] pending_adds_max", "[managed_ledger] pending_adds_max"]),
    ({"managed_ledger": {"rollover_publish_period_ms": 5}}, ["rollover_publish_period_ms", "[offload] lake_partition"]),
    ({"offload": {"lake_enabled": True}}, ["[offload]", "needs a tier"]),
    ({"dispatch": {"connection_write_high_water_bytes": 64 << 20}}, ["connection_write_high_water_bytes"]),
])
def test_bad_settings_are_refused_naming_the_key(values, words):
    with pytest.raises(ConfigError) as e:
        from_mapping(BrokerConfig, values, source="broker.toml")
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_a_sub_config_of_the_wrong_type_is_refused():
    with pytest.raises(ConfigError, match="offload must be a OffloadConfig"):
        BrokerConfig(offload=DispatchConfig()).validate()  # type: ignore[arg-type]


def test_settings_apply_in_order_dotted_keys_win_over_a_table_given_before():
    """The launcher's --tier flag (a dotted key) wins over the [offload] table of --broker-config."""
    config = apply_settings(BrokerConfig(), {"offload": {"tier_uri": "file:///file", "concurrent_max": 3},
                                             "offload.tier_uri": "file:///flag"})
    assert config.offload.tier_uri == "file:///flag" and config.offload.concurrent_max == 3
    # a table sets only the keys it names: the others keep their values
    again = apply_settings(config, {"offload": {"concurrent_max": 4}})
    assert again.offload.tier_uri == "file:///flag" and again.offload.concurrent_max == 4
    assert again.ledger_client.add_flush_interval_ms == 3.0


def test_a_refused_file_changes_nothing(tmp_path):
    """Bad input gets an error; the config in hand is unchanged (frozen: apply_settings returns a new one)."""
    config = BrokerConfig()
    with pytest.raises(ConfigError):
        apply_settings(config, {"offload": {"tier_uri": "file:///x", "bogus": 1}}).validate()
    assert config == BrokerConfig() and config.offload.tier_uri == ""

"""Configuration of managed ledgers: a frozen dataclass validated at start (docs/architecture.md#style).

Kept here rather than in :mod:`pulsarlite.config` so the broker's storage knobs live with the
code that uses them; the broker's own config can embed it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bookie.client.metadata import validate_quorum
from pulsarlite.config import PENDING_ADDS_MAX_DEFAULT
from pulsarlite.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class ManagedLedgerConfig:
    # replication of every ledger of the managed ledger
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    # rollover of the current ledger: whichever limit is reached first (Pulsar's defaults:
    # 50k entries per ledger, 2 GiB, 4 h); the age limit applies only to a non-empty ledger
    rollover_entries_max: int = 50_000
    rollover_bytes_max: int = 2048 * MiB
    rollover_age_ms_max: int = 4 * 3600 * 1000
    # [lakehouse] > 0: also roll over when an add's publish time enters a later period
    # (86_400_000: UTC day, set by BrokerConfig for lake_partition "day"); 0: off
    rollover_publish_period_ms: int = 0
    # adds not yet confirmed (in flight on the current ledger + queued during a rollover);
    # add() waits beyond it, add_async() fails at once (retriable)
    pending_adds_max: int = PENDING_ADDS_MAX_DEFAULT
    # entries returned by one read_entries call at most
    read_entries_max: int = 1_000
    # closed-ledger readers kept open for reads
    readers_cached_max: int = 16
    # retries of ZooKeeper writes (connection loss) and of ledger creation (not enough bookies)
    metadata_attempts_max: int = 10
    ledger_create_attempts_max: int = 5
    retry_backoff_ms_max: int = 2_000
    # how often the age limit is checked
    tick_interval_ms: int = 1_000

    def validate(self) -> "ManagedLedgerConfig":
        for name in ("rollover_entries_max", "rollover_bytes_max", "rollover_age_ms_max", "pending_adds_max",
                     "read_entries_max", "readers_cached_max", "metadata_attempts_max",
                     "ledger_create_attempts_max", "retry_backoff_ms_max", "tick_interval_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"ManagedLedgerConfig.{name} must be an int > 0, got {value!r}")
        if not isinstance(self.rollover_publish_period_ms, int) or isinstance(self.rollover_publish_period_ms, bool) \
                or self.rollover_publish_period_ms < 0:
            raise ConfigError(f"ManagedLedgerConfig.rollover_publish_period_ms must be an int >= 0, "
                              f"got {self.rollover_publish_period_ms!r}")
        try:
            validate_quorum(self.ensemble_size, self.write_quorum, self.ack_quorum)
        except ValueError as e:
            raise ConfigError(f"ManagedLedgerConfig: {e}") from None
        return self


__all__ = ["ManagedLedgerConfig"]

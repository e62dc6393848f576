"""The managed ledger: a topic's storage as an ordered list of ledgers (docs/protocol.md#managed-ledger).

- :mod:`.core`: the pure core (positions, rollover policy, states, stats, next metadata);
- :mod:`.store`: names, ZooKeeper paths and the JSON codec of the ledger list;
- :mod:`.shell`: :class:`ManagedLedger`, the asyncio shell over the ledger client;
- :mod:`.config`: :class:`ManagedLedgerConfig`.
"""

from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.core import (LedgerInfo, LedgerInfoState, ManagedLedgerClosedError, ManagedLedgerError,
                                        ManagedLedgerFencedError, ManagedLedgerMetadata, ManagedLedgerState,
                                        OffloadInfo, OffloadState, Position, RolloverPolicy, iter_positions,
                                        next_position)
from broker.managed_ledger.shell import ManagedLedger
from broker.managed_ledger.store import ManagedLedgerStore, managed_ledger_name, managed_ledger_path

__all__ = [
    "LedgerInfo", "LedgerInfoState", "ManagedLedger", "ManagedLedgerClosedError", "ManagedLedgerConfig",
    "ManagedLedgerError", "ManagedLedgerFencedError", "ManagedLedgerMetadata", "ManagedLedgerState",
    "ManagedLedgerStore", "OffloadInfo", "OffloadState", "Position", "RolloverPolicy", "iter_positions",
    "managed_ledger_name", "managed_ledger_path", "next_position",
]

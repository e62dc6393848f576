"""The managed ledger: a topic's storage as an ordered list of ledgers (docs/protocol.md#managed-ledger).

- :mod:`.core`: the pure core (positions, rollover policy, states, stats, next metadata);
- :mod:`.store`: compare-and-set access to the ledger list (its paths: pulsarlite/metadata_layout.py;
  its document and codec: pulsarlite/ledger_list.py);
- :mod:`.shell`: :class:`ManagedLedger`, the asyncio shell over the ledger client;
- :mod:`.config`: :class:`ManagedLedgerConfig`.
"""

from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.core import (LedgerInfo, LedgerInfoState, ManagedLedgerClosedError, ManagedLedgerError,
                                        ManagedLedgerFencedError, ManagedLedgerMetadata, ManagedLedgerState,
                                        OffloadRecord, OffloadState, Position, RolloverPolicy, iter_positions,
                                        next_position)
from broker.managed_ledger.shell import ManagedLedger
from broker.managed_ledger.store import ManagedLedgerStore

__all__ = [
    "LedgerInfo", "LedgerInfoState", "ManagedLedger", "ManagedLedgerClosedError", "ManagedLedgerConfig",
    "ManagedLedgerError", "ManagedLedgerFencedError", "ManagedLedgerMetadata", "ManagedLedgerState",
    "ManagedLedgerStore", "OffloadRecord", "OffloadState", "Position", "RolloverPolicy", "iter_positions",
    "next_position",
]

"""Bundle ownership and LOOKUP (docs/protocol.md#zookeeper-layout: /namespace/<tenant>/<ns>/<bundle>
ephemeral owner, /loadbalance/brokers/<broker-id> live brokers and loads).

- :mod:`.core`: the pure core: bundles (hash ranges), broker choice, the per-bundle ownership
  state table, the LOOKUP decision;
- :mod:`.shell`: :class:`OwnershipManager`, the asyncio shell over the metadata store.
"""

from broker.ownership.core import (AcquireSelf, BrokerLoad, BundleState, Connect, Fail, OwnershipError,
                                   OwnershipTable, Redirect, bundle_key, bundle_of, bundle_ranges,
                                   choose_broker, decide_lookup, parse_bundle_key)
from broker.ownership.shell import BrokerInfo, LookupResult, OwnershipManager

__all__ = [
    "AcquireSelf", "BrokerInfo", "BrokerLoad", "BundleState", "Connect", "Fail", "LookupResult",
    "OwnershipError", "OwnershipManager", "OwnershipTable", "Redirect", "bundle_key", "bundle_of",
    "bundle_ranges", "choose_broker", "decide_lookup", "parse_bundle_key",
]

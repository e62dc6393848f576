"""The broker: managed ledgers (a topic's storage), dispatch, ownership, protocol connections
and admin (docs/architecture.md#processes; floor 4 of #floors)."""

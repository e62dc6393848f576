"""The broker: managed ledgers (a topic's storage), dispatch, ownership, protocol connections
and admin (DESIGN.md §1, §5 floor 4)."""

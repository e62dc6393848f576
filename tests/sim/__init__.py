"""Seeded discrete-event simulations of the replication cores (docs/architecture.md#tests)."""

"""Seeded discrete-event simulations of the replication cores (DESIGN.md §6)."""

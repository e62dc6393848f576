"""Seeded, time-bounded fuzzing of the broker's binary port, the admin HTTP API and the bookie
port against a real local cluster, with a canary producer and consumer running throughout
(see tests/fuzz/harness.py)."""

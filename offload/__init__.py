"""Tiered storage: closed ledgers as Parquet in an object store (s3:// or file://), the offload
state machine and the tier reader (DESIGN.md §5 floor 3)."""

"""Tiered storage: closed ledgers as Parquet in an object store (s3:// or file://), the offload
state machine and the tier reader (docs/architecture.md#floors, floor 3).

- :mod:`offload.format`   entries <-> Arrow rows (ROW_SCHEMA) <-> Parquet (page checksums)
- :mod:`offload.store`    object stores: ``open_object_store(uri)``, ``open_object_uri(uri)``,
                          ``open_input_file(uri)`` (pyarrow-readable)
- :mod:`offload.core`     the pure per-ledger offload state machine and the offload policy
- :mod:`offload.reader`   ``write_ledger_object``, ``verify_object``, ``TierReader`` (parallel
                          ranged GETs, read-ahead)
- :mod:`offload.executor` a blocking shell running the state machine's actions
- :mod:`offload.local_s3` moto's S3 server as a child process (tests, benchmarks)
"""

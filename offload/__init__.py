"""Tiered storage: closed ledgers as Parquet in an object store (s3:// or file://), the offload
state machine and the tier reader (docs/architecture.md#floors, floor 3).

- :mod:`offload.format`   entries <-> Arrow rows (ROW_SCHEMA) <-> Parquet (page checksums)
- :mod:`offload.store`    object stores: ``open_object_store(uri)``, ``open_object_uri(uri)``,
                          ``open_input_file(uri)`` (pyarrow-readable)
- :mod:`offload.core`     the pure per-ledger offload state machine and the offload policy
- :mod:`offload.reader`   ``write_ledger_object``, ``verify_object``, ``TierReader`` (parallel
                          ranged GETs, read-ahead)
- :mod:`offload.shell`    the one shell: runs the machine's actions through ``OffloadSteps``
                          (the broker's offloader implements them; tests/offload_executor.py
                          is a blocking facade for tests)
"""

"""Autorecovery ([autorecovery], issue 23): the auditor that marks the ledgers of lost or
decommissioning bookies under-replicated, and the replication workers that copy their missing
fragments to other bookies and record the new ensembles.

- ``layout``: the ZooKeeper paths under /ledgers/underreplication and the mark codec.
- ``auditor_core``: pure; which ledgers to mark, and when.
- ``replication_core``: pure; the copy plan of one ledger and the metadata transform.
- ``auditor`` / ``worker``: the asyncio shells (election, scans, locks, copies).
"""

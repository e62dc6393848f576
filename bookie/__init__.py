"""Bookies (the storage servers) and, beside them, the ledger client library."""
